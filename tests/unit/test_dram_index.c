/*
 * test_dram_index.c - the dram object index: hash table and LRU list.
 *
 * Random keys far past the initial table size force growth; random removals
 * exercise the backward-shift deletion; a shadow array says which keys must
 * be found.  DOOMED duplicates and the LRU order are checked directly.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"

static uint64_t rng_state;

static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static umbp_key_t random_key(void)
{
    umbp_key_t k;

    for (int i = 0; i < UMBP_KEY_SIZE; i += 8) {
        uint64_t r = rng();
        memcpy(k.bytes + i, &r, 8);
    }
    return k;
}

static struct dram_obj *new_obj(const umbp_key_t *key, uint64_t oid,
                                enum dram_obj_state state)
{
    struct dram_obj *o = calloc(1, sizeof(*o));

    cr_assert_not_null(o);
    o->key = *key;
    o->oid = oid;
    o->state = state;
    return o;
}

#define N_KEYS 100000

/* Made for `expect` objects, the table holds them without growing; made
 * for none, it starts at its minimum and grows. */
Test(dram_index, presized_table_holds_what_it_expects)
{
    enum { N = 10000 };
    struct dram_index *ix, *small;
    static struct dram_obj *objs[N];

    rng_state = 11;
    cr_assert_eq(dram_index_create(&ix, N), 0);
    cr_assert_eq(dram_index_create(&small, 0), 0);
    size_t slots = dram_index_slots(ix);
    cr_assert_geq(slots * 7, (size_t)N * 10, "%zu slots for %d objects", slots, N);
    cr_assert_eq(dram_index_slots(small), 64);
    for (size_t i = 0; i < N; i++) {
        umbp_key_t k = random_key();
        objs[i] = new_obj(&k, i + 1, DRAM_OBJ_PUBLISHED);
        cr_assert_eq(dram_index_insert(ix, objs[i]), 0);
        struct dram_obj *o = new_obj(&k, i + 1, DRAM_OBJ_PUBLISHED);
        cr_assert_eq(dram_index_insert(small, o), 0);
    }
    cr_assert_eq(dram_index_slots(ix), slots, "grew from %zu to %zu slots", slots,
                 dram_index_slots(ix));
    cr_assert_gt(dram_index_slots(small), 64);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(dram_index_find(ix, &objs[i]->key), objs[i]);
    dram_index_destroy(ix);
    dram_index_destroy(small);
}

Test(dram_index, insert_find_remove_with_growth, .timeout = 60)
{
    struct dram_index *ix;
    umbp_key_t *keys = calloc(N_KEYS, sizeof(*keys));
    struct dram_obj **objs = calloc(N_KEYS, sizeof(*objs));
    bool *gone = calloc(N_KEYS, sizeof(*gone));
    size_t left = N_KEYS;

    cr_assert(keys && objs && gone);
    rng_state = 7;
    cr_assert_eq(dram_index_create(&ix, 0), 0);
    for (size_t i = 0; i < N_KEYS; i++) {
        keys[i] = random_key();
        objs[i] = new_obj(&keys[i], i + 1, DRAM_OBJ_PUBLISHED);
        cr_assert_eq(dram_index_insert(ix, objs[i]), 0);
    }
    cr_assert_eq(dram_index_count(ix), N_KEYS);
    for (size_t i = 0; i < N_KEYS; i++)
        cr_assert_eq(dram_index_find(ix, &keys[i]), objs[i], "key %zu lost", i);
    for (int i = 0; i < 1000; i++) {
        umbp_key_t k = random_key();
        cr_assert_null(dram_index_find(ix, &k));
    }
    /* Remove two thirds in random order, checking everything on the way. */
    for (size_t r = 0; r < 2 * N_KEYS / 3; r++) {
        size_t i = rng() % N_KEYS;

        if (gone[i])
            continue;
        dram_index_remove(ix, objs[i]);
        free(objs[i]);
        gone[i] = true;
        left--;
    }
    cr_assert_eq(dram_index_count(ix), left);
    for (size_t i = 0; i < N_KEYS; i++) {
        struct dram_obj *o = dram_index_find(ix, &keys[i]);

        if (gone[i])
            cr_assert_null(o, "removed key %zu still found", i);
        else
            cr_assert_eq(o, objs[i], "key %zu lost after removals", i);
    }
    /* Put the removed ones back: the table is still consistent. */
    for (size_t i = 0; i < N_KEYS; i++) {
        if (!gone[i])
            continue;
        objs[i] = new_obj(&keys[i], i + 1, DRAM_OBJ_PENDING);
        cr_assert_eq(dram_index_insert(ix, objs[i]), 0);
    }
    for (size_t i = 0; i < N_KEYS; i++)
        cr_assert_eq(dram_index_find_oid(ix, &keys[i], i + 1), objs[i]);
    dram_index_destroy(ix); /* frees the objects still in it */
    free(keys);
    free(objs);
    free(gone);
}

Test(dram_index, find_skips_doomed_and_find_oid_sees_all)
{
    struct dram_index *ix;
    umbp_key_t k = random_key(), other = random_key();
    struct dram_obj *a = new_obj(&k, 1, DRAM_OBJ_PUBLISHED), *b, *c;

    cr_assert_eq(dram_index_create(&ix, 0), 0);
    cr_assert_eq(dram_index_insert(ix, a), 0);
    cr_assert_eq(dram_index_find(ix, &k), a);
    a->state = DRAM_OBJ_DOOMED;
    cr_assert_null(dram_index_find(ix, &k), "doomed objects are invisible");
    cr_assert_eq(dram_index_find_oid(ix, &k, 1), a, "but still resident");
    b = new_obj(&k, 2, DRAM_OBJ_PUBLISHED);
    cr_assert_eq(dram_index_insert(ix, b), 0);
    b->state = DRAM_OBJ_DOOMED;
    c = new_obj(&k, 3, DRAM_OBJ_PENDING);
    cr_assert_eq(dram_index_insert(ix, c), 0);
    cr_assert_eq(dram_index_find(ix, &k), c);
    cr_assert_eq(dram_index_find_oid(ix, &k, 1), a);
    cr_assert_eq(dram_index_find_oid(ix, &k, 2), b);
    cr_assert_eq(dram_index_find_oid(ix, &k, 3), c);
    cr_assert_null(dram_index_find_oid(ix, &k, 4));
    cr_assert_null(dram_index_find_oid(ix, &other, 1), "oid of another key");
    dram_index_remove(ix, a);
    free(a);
    cr_assert_null(dram_index_find_oid(ix, &k, 1));
    cr_assert_eq(dram_index_find_oid(ix, &k, 2), b);
    cr_assert_eq(dram_index_find(ix, &k), c);
    cr_assert_eq(dram_index_count(ix), 2);
    dram_index_destroy(ix);
}

static void assert_lru(struct dram_index *ix, struct dram_obj **want, size_t n)
{
    struct dram_obj *o = dram_lru_head(ix), *prev = NULL;

    for (size_t i = 0; i < n; i++, prev = o, o = o->lru_next) {
        cr_assert_eq(o, want[i], "LRU position %zu: oid %llu, want %llu", i,
                     o ? (unsigned long long)o->oid : 0ull,
                     (unsigned long long)want[i]->oid);
        cr_assert_eq(o->lru_prev, prev);
    }
    cr_assert_null(o, "LRU list longer than %zu", n);
    cr_assert_eq(dram_lru_tail(ix), n ? want[n - 1] : NULL);
}

Test(dram_index, lru_order)
{
    struct dram_index *ix;
    struct dram_obj *o[4];

    cr_assert_eq(dram_index_create(&ix, 0), 0);
    assert_lru(ix, NULL, 0);
    for (int i = 0; i < 4; i++) {
        umbp_key_t k = random_key();
        o[i] = new_obj(&k, i + 1, DRAM_OBJ_PUBLISHED);
        cr_assert_eq(dram_index_insert(ix, o[i]), 0);
        dram_lru_push_head(ix, o[i]);
    }
    assert_lru(ix, (struct dram_obj *[]){ o[3], o[2], o[1], o[0] }, 4);
    dram_lru_touch(ix, o[0]);
    assert_lru(ix, (struct dram_obj *[]){ o[0], o[3], o[2], o[1] }, 4);
    dram_lru_touch(ix, o[0]); /* already the head */
    assert_lru(ix, (struct dram_obj *[]){ o[0], o[3], o[2], o[1] }, 4);
    dram_lru_touch(ix, o[2]);
    assert_lru(ix, (struct dram_obj *[]){ o[2], o[0], o[3], o[1] }, 4);
    dram_lru_unlink(ix, o[1]); /* the tail */
    assert_lru(ix, (struct dram_obj *[]){ o[2], o[0], o[3] }, 3);
    dram_lru_unlink(ix, o[2]); /* the head */
    assert_lru(ix, (struct dram_obj *[]){ o[0], o[3] }, 2);
    dram_lru_unlink(ix, o[0]);
    dram_lru_unlink(ix, o[3]);
    assert_lru(ix, NULL, 0);
    dram_lru_push_head(ix, o[1]);
    assert_lru(ix, (struct dram_obj *[]){ o[1] }, 1);
    dram_index_destroy(ix);
}

/* Many keys that share their home slot's neighbourhood: remove from the
 * middle of long probe runs, then find everything left. */
Test(dram_index, churn_keeps_probe_runs_intact, .timeout = 60)
{
    struct dram_index *ix;
    enum { N = 4096 };
    umbp_key_t keys[N];
    struct dram_obj *objs[N];

    rng_state = 99;
    cr_assert_eq(dram_index_create(&ix, 0), 0);
    for (int i = 0; i < N; i++) {
        keys[i] = random_key();
        objs[i] = new_obj(&keys[i], i + 1, DRAM_OBJ_PUBLISHED);
        cr_assert_eq(dram_index_insert(ix, objs[i]), 0);
    }
    for (int round = 0; round < 50000; round++) {
        int i = rng() % N;

        dram_index_remove(ix, objs[i]);
        cr_assert_null(dram_index_find(ix, &keys[i]));
        keys[i] = random_key();
        objs[i]->key = keys[i];
        cr_assert_eq(dram_index_insert(ix, objs[i]), 0);
        if (round % 5000 == 0)
            for (int j = 0; j < N; j++)
                cr_assert_eq(dram_index_find(ix, &keys[j]), objs[j]);
    }
    for (int j = 0; j < N; j++)
        cr_assert_eq(dram_index_find(ix, &keys[j]), objs[j]);
    cr_assert_eq(dram_index_count(ix), N);
    dram_index_destroy(ix);
}
