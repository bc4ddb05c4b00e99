/*
 * track.c - the tokens one session holds (its reservations, its leases), so
 * that a session can only publish, abort or release what it was given, and
 * so that everything it still holds ends when it disconnects.
 *
 * An open-addressed hash table (linear probing, at most half full) from
 * token to the reservation's key, owned by the loop thread.  Removal shifts
 * the following entries of the cluster back instead of leaving tombstones,
 * so a session that reserves and publishes millions of objects keeps short
 * probes (a table with tombstones, which never shrinks them away, made
 * every lookup walk them: 90 % of the server's time on 625-key batches).
 * Token 0 marks an empty slot: the store never hands it out (oids start at
 * 1; lease tokens carry a nonzero generation), and a client that sends one
 * simply holds nothing by it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "srv.h"

#define TRACK_MIN_CAP 64

static size_t slot_of(const struct srv_track *t, uint64_t token)
{
    uint64_t x = token + 0x9e3779b97f4a7c15ull; /* splitmix64's finaliser */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (size_t)(x ^ (x >> 31)) & (t->cap - 1);
}

int track_init(struct srv_track *t, bool keep_keys)
{
    memset(t, 0, sizeof(*t));
    t->keep_keys = keep_keys;
    t->cap = TRACK_MIN_CAP;
    t->slots = calloc(t->cap, sizeof(*t->slots));
    return t->slots ? 0 : -ENOMEM;
}

void track_fini(struct srv_track *t)
{
    free(t->slots);
    t->slots = NULL;
    t->cap = t->n = 0;
}

static void place(struct srv_track *t, const struct srv_track_slot *e)
{
    size_t i = slot_of(t, e->token);
    while (t->slots[i].token)
        i = (i + 1) & (t->cap - 1);
    t->slots[i] = *e;
}

/* A table of cap slots (a power of two over the old one), its pages
 * touched before any entry moves in. */
static int resize(struct srv_track *t, size_t cap)
{
    struct srv_track_slot *old = t->slots;
    size_t old_cap = t->cap;
    struct srv_track_slot *s = calloc(cap, sizeof(*s));
    if (!s)
        return -ENOMEM;
    umbp_touch_pages(s, cap * sizeof(*s));
    t->slots = s;
    t->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].token)
            place(t, &old[i]);
    free(old);
    return 0;
}

int track_presize(struct srv_track *t, size_t tokens)
{
    size_t cap = t->cap;
    while (tokens * 2 > cap) /* at most half full, as track_add keeps it */
        cap *= 2;
    return cap > t->cap ? resize(t, cap) : 0;
}

int track_add(struct srv_track *t, uint64_t token, const umbp_key_t *key)
{
    if (token == 0)
        return -EINVAL;
    if ((t->n + 1) * 2 > t->cap && resize(t, t->cap * 2) < 0)
        return -ENOMEM;
    struct srv_track_slot e = {.token = token};
    if (t->keep_keys)
        e.key = *key;
    place(t, &e);
    t->n++;
    return 0;
}

/* Empties slot i and moves later entries of its cluster back into the hole
 * where their probe sequence allows (no tombstones). */
static void remove_at(struct srv_track *t, size_t i)
{
    size_t mask = t->cap - 1, j = i;
    t->slots[i].token = 0;
    for (;;) {
        j = (j + 1) & mask;
        if (!t->slots[j].token)
            return;
        size_t home = slot_of(t, t->slots[j].token);
        /* j's entry may fill the hole at i unless its home lies in (i, j] */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        t->slots[i] = t->slots[j];
        t->slots[j].token = 0;
        i = j;
    }
}

bool track_take(struct srv_track *t, uint64_t token, const umbp_key_t *key)
{
    if (token == 0 || !t->slots)
        return false;
    for (size_t i = slot_of(t, token);; i = (i + 1) & (t->cap - 1)) {
        if (!t->slots[i].token)
            return false;
        if (t->slots[i].token != token)
            continue;
        if (t->keep_keys && memcmp(t->slots[i].key.bytes, key->bytes, UMBP_KEY_SIZE) != 0)
            return false; /* another key's token: not this request's to end */
        remove_at(t, i);
        t->n--;
        return true;
    }
}

void track_drain(struct srv_track *t, void (*fn)(void *arg, uint64_t token,
                                                 const umbp_key_t *key), void *arg)
{
    for (size_t i = 0; t->slots && i < t->cap; i++)
        if (t->slots[i].token) {
            if (fn)
                fn(arg, t->slots[i].token, t->keep_keys ? &t->slots[i].key : NULL);
            t->slots[i].token = 0;
        }
    t->n = 0;
}
