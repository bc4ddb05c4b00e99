/*
 * index.c - open-addressing hash table of dram objects, and their LRU list.
 *
 * Linear probing over a power-of-two array of (hash, object) slots; the
 * cached hash lets a probe skip non-matching slots without touching the
 * object.  Deletion shifts the rest of the probe run back, so there are no
 * tombstones and a probe stops at the first empty slot.  The table doubles
 * when it would exceed 70% full; it starts large enough for the number of
 * objects its owner expects, with its pages touched, so that neither a
 * rehash (about 0.1 us an entry) nor a page fault per first touch lands on
 * a store's critical path while the pool fills.  Objects never move, so
 * the LRU list and the tier's leases can point at them.
 * Single-threaded: the tier's loop thread owns it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "umbp/tier.h"
#include "index.h"

#define INDEX_MIN_SLOTS 64
/* dram_index_create sizes for at most this many slots (128 MiB); a larger
 * population grows the table as it comes */
#define INDEX_MAX_PRESIZE ((size_t)1 << 23)

struct dram_slot {
    uint64_t hash;
    struct dram_obj *obj; /* NULL: empty */
};

struct dram_index {
    struct dram_slot *slots;
    size_t mask;  /* slots - 1 */
    size_t count;
    struct dram_obj *lru_head, *lru_tail;
};

int dram_index_create(struct dram_index **out, size_t expect)
{
    struct dram_index *ix = calloc(1, sizeof(*ix));
    size_t n = INDEX_MIN_SLOTS;

    if (!ix)
        return -ENOMEM;
    while (n < INDEX_MAX_PRESIZE && expect * 10 > n * 7)
        n *= 2;
    ix->slots = calloc(n, sizeof(*ix->slots));
    if (!ix->slots) {
        free(ix);
        return -ENOMEM;
    }
    umbp_touch_pages(ix->slots, n * sizeof(*ix->slots)); /* no fault under a request */
    ix->mask = n - 1;
    *out = ix;
    return 0;
}

void dram_index_destroy(struct dram_index *ix)
{
    if (!ix)
        return;
    for (size_t i = 0; i <= ix->mask; i++)
        free(ix->slots[i].obj);
    free(ix->slots);
    free(ix);
}

void dram_index_destroy_table(struct dram_index *ix)
{
    if (!ix)
        return;
    free(ix->slots);
    free(ix);
}

static void slot_place(struct dram_slot *slots, size_t mask, uint64_t hash,
                       struct dram_obj *obj)
{
    size_t i = hash & mask;

    while (slots[i].obj)
        i = (i + 1) & mask;
    slots[i].hash = hash;
    slots[i].obj = obj;
}

static int index_grow(struct dram_index *ix)
{
    size_t n = (ix->mask + 1) * 2;
    struct dram_slot *slots = calloc(n, sizeof(*slots));

    if (!slots)
        return -ENOMEM;
    for (size_t i = 0; i <= ix->mask; i++)
        if (ix->slots[i].obj)
            slot_place(slots, n - 1, ix->slots[i].hash, ix->slots[i].obj);
    free(ix->slots);
    ix->slots = slots;
    ix->mask = n - 1;
    return 0;
}

int dram_index_insert(struct dram_index *ix, struct dram_obj *obj)
{
    if ((ix->count + 1) * 10 > (ix->mask + 1) * 7 && index_grow(ix) < 0)
        return -ENOMEM;
    obj->hash = umbp_key_hash(&obj->key);
    slot_place(ix->slots, ix->mask, obj->hash, obj);
    ix->count++;
    return 0;
}

/* Empties slot i and moves later entries of the probe run back into the
 * hole when their home slot allows it. */
static void slot_delete(struct dram_index *ix, size_t hole)
{
    size_t mask = ix->mask, j = hole;

    for (;;) {
        j = (j + 1) & mask;
        if (!ix->slots[j].obj)
            break;
        size_t home = ix->slots[j].hash & mask;
        /* The entry at j may fill the hole only if the hole lies between
         * its home and j (cyclically), i.e. it would still be found. */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            ix->slots[hole] = ix->slots[j];
            hole = j;
        }
    }
    ix->slots[hole].obj = NULL;
}

void dram_index_remove(struct dram_index *ix, struct dram_obj *obj)
{
    size_t i = obj->hash & ix->mask;

    while (ix->slots[i].obj && ix->slots[i].obj != obj)
        i = (i + 1) & ix->mask;
    if (!ix->slots[i].obj)
        return; /* not in the table */
    slot_delete(ix, i);
    ix->count--;
}

static int key_eq(const umbp_key_t *a, const umbp_key_t *b)
{
    return memcmp(a->bytes, b->bytes, UMBP_KEY_SIZE) == 0;
}

struct dram_obj *dram_index_find(const struct dram_index *ix,
                                 const umbp_key_t *key)
{
    uint64_t h = umbp_key_hash(key);

    for (size_t i = h & ix->mask; ix->slots[i].obj; i = (i + 1) & ix->mask) {
        struct dram_obj *o = ix->slots[i].obj;

        if (ix->slots[i].hash == h && o->state != DRAM_OBJ_DOOMED &&
            key_eq(&o->key, key))
            return o;
    }
    return NULL;
}

struct dram_obj *dram_index_find_oid(const struct dram_index *ix,
                                     const umbp_key_t *key, uint64_t oid)
{
    uint64_t h = umbp_key_hash(key);

    for (size_t i = h & ix->mask; ix->slots[i].obj; i = (i + 1) & ix->mask) {
        struct dram_obj *o = ix->slots[i].obj;

        if (ix->slots[i].hash == h && o->oid == oid && key_eq(&o->key, key))
            return o;
    }
    return NULL;
}

size_t dram_index_count(const struct dram_index *ix)
{
    return ix->count;
}

size_t dram_index_slots(const struct dram_index *ix) { return ix->mask + 1; }

/* ---- LRU -------------------------------------------------------------- */

void dram_lru_push_head(struct dram_index *ix, struct dram_obj *obj)
{
    obj->lru_prev = NULL;
    obj->lru_next = ix->lru_head;
    if (ix->lru_head)
        ix->lru_head->lru_prev = obj;
    else
        ix->lru_tail = obj;
    ix->lru_head = obj;
}

void dram_lru_unlink(struct dram_index *ix, struct dram_obj *obj)
{
    if (obj->lru_prev)
        obj->lru_prev->lru_next = obj->lru_next;
    else
        ix->lru_head = obj->lru_next;
    if (obj->lru_next)
        obj->lru_next->lru_prev = obj->lru_prev;
    else
        ix->lru_tail = obj->lru_prev;
    obj->lru_prev = obj->lru_next = NULL;
}

void dram_lru_touch(struct dram_index *ix, struct dram_obj *obj)
{
    if (ix->lru_head == obj)
        return;
    dram_lru_unlink(ix, obj);
    dram_lru_push_head(ix, obj);
}

struct dram_obj *dram_lru_head(const struct dram_index *ix)
{
    return ix->lru_head;
}

struct dram_obj *dram_lru_tail(const struct dram_index *ix)
{
    return ix->lru_tail;
}
