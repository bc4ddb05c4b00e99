/*
 * track.c - the tokens one session holds (its reservations, its leases), so
 * that a session can only publish, abort or release what it was given, and
 * so that everything it still holds ends when it disconnects.
 *
 * A Concurrency Kit hash table in direct mode (token -> value), used from
 * the loop thread only (ck_ht's single-writer functions; no reader runs
 * concurrently, so its fences merely cost a little).  A reservation's value
 * is a malloc'd copy of its key (abort needs it); a lease's value is 1.
 * Tokens 0 and ~0 are ck_ht's empty and tombstone keys: the store never
 * hands them out (oids start at 1; lease tokens carry a nonzero
 * generation), and a client that sends one simply holds nothing by it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "srv.h"

static void *ht_malloc(size_t n) { return malloc(n); }

static void *ht_realloc(void *p, size_t old, size_t n, bool defer)
{
    (void)old;
    (void)defer;
    return realloc(p, n);
}

static void ht_free(void *p, size_t n, bool defer)
{
    (void)n;
    (void)defer; /* no concurrent reader: freeing at once is safe */
    free(p);
}

static struct ck_malloc ht_allocator = {
    .malloc = ht_malloc, .realloc = ht_realloc, .free = ht_free,
};

static bool token_storable(uint64_t token)
{
    return token != CK_HT_KEY_EMPTY && token != CK_HT_KEY_TOMBSTONE;
}

int track_init(struct srv_track *t, bool keep_keys)
{
    memset(t, 0, sizeof(*t));
    t->keep_keys = keep_keys;
    return ck_ht_init(&t->ht, CK_HT_MODE_DIRECT, NULL, &ht_allocator, 16, 0x756d6270) ? 0
                                                                                     : -ENOMEM;
}

void track_fini(struct srv_track *t)
{
    if (!t->ht.map)
        return; /* never initialised (track_init failed or was not reached) */
    track_drain(t, NULL, NULL);
    ck_ht_destroy(&t->ht);
}

int track_add(struct srv_track *t, uint64_t token, const umbp_key_t *key)
{
    if (!token_storable(token))
        return -EINVAL;
    umbp_key_t *copy = NULL;
    if (t->keep_keys) {
        if (!(copy = malloc(sizeof(*copy))))
            return -ENOMEM;
        *copy = *key;
    }
    ck_ht_hash_t h;
    ck_ht_entry_t e;
    ck_ht_hash_direct(&h, &t->ht, (uintptr_t)token);
    ck_ht_entry_set_direct(&e, h, (uintptr_t)token, copy ? (uintptr_t)copy : 1);
    /* false: out of memory (a token is never tracked twice) */
    if (!ck_ht_put_spmc(&t->ht, h, &e)) {
        free(copy);
        return -ENOMEM;
    }
    t->n++;
    return 0;
}

bool track_take(struct srv_track *t, uint64_t token, const umbp_key_t *key)
{
    if (!token_storable(token))
        return false;
    ck_ht_hash_t h;
    ck_ht_entry_t e;
    ck_ht_hash_direct(&h, &t->ht, (uintptr_t)token);
    ck_ht_entry_key_set_direct(&e, (uintptr_t)token);
    if (!ck_ht_get_spmc(&t->ht, h, &e))
        return false;
    umbp_key_t *kept = t->keep_keys ? (umbp_key_t *)ck_ht_entry_value_direct(&e) : NULL;
    if (kept && memcmp(kept->bytes, key->bytes, UMBP_KEY_SIZE) != 0)
        return false; /* another key's token: not this request's to end */
    ck_ht_entry_key_set_direct(&e, (uintptr_t)token);
    ck_ht_remove_spmc(&t->ht, h, &e);
    free(kept);
    t->n--;
    return true;
}

void track_drain(struct srv_track *t, void (*fn)(void *arg, uint64_t token,
                                                 const umbp_key_t *key), void *arg)
{
    ck_ht_iterator_t it = CK_HT_ITERATOR_INITIALIZER;
    ck_ht_entry_t *e;
    while (ck_ht_next(&t->ht, &it, &e)) {
        umbp_key_t *kept = t->keep_keys ? (umbp_key_t *)ck_ht_entry_value_direct(e) : NULL;
        if (fn)
            fn(arg, (uint64_t)ck_ht_entry_key_direct(e), kept);
        free(kept);
    }
    ck_ht_reset_spmc(&t->ht);
    t->n = 0;
}
