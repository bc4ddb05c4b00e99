/*
 * index.h - the dram tier's objects: a hash table keyed by umbp_key_t plus
 * an intrusive LRU list of published objects.
 *
 * The table may hold several entries with one key: at most one PENDING or
 * PUBLISHED ("live") entry, and any number of DOOMED ones (cleared while
 * read, kept until their last reader goes, invisible to dram_index_find).
 * Single-threaded: the tier's loop thread owns it.
 */
#ifndef UMBP_DRAM_INDEX_H
#define UMBP_DRAM_INDEX_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "umbp/umbp.h"

enum dram_obj_state {
    DRAM_OBJ_PENDING,   /* reserved, being written; invisible, not evictable */
    DRAM_OBJ_PUBLISHED, /* visible; on the LRU list */
    DRAM_OBJ_DOOMED,    /* cleared while read; freed when readers reach 0 */
    DRAM_OBJ_HELD,      /* a reservation whose session ended before it was
                           published or aborted: out of the table, its
                           region kept until its writer's deadline (store.c) */
};

struct dram_obj {
    umbp_key_t key;
    uint64_t hash;                /* umbp_key_hash(&key), set by insert */
    uint64_t oid;                 /* unique per reservation, never reused */
    uint64_t off, size;           /* pool offset and object size */
    uint32_t readers;             /* active leases */
    uint32_t slot;                /* journal slot, or DRAM_JOURNAL_NONE */
    uint16_t ns;                  /* tenant namespace (store.c), 0 = default */
    bool ahead;                   /* reserved ahead of its key, not published yet */
    bool unrecorded;              /* PENDING / HELD without a journal record,
                                     with a writer deadline (store.c) */
    struct dram_obj *ns_prev, *ns_next; /* the namespace's LRU list */
    enum dram_obj_state state;
    struct dram_obj *lru_prev, *lru_next; /* PUBLISHED only; head = newest */
    uint64_t until_ns;            /* PENDING / HELD: its writer stops writing
                                     by then (0: no deadline, in-process) */
    uint32_t heap_pos;            /* in the store's writer-deadline heap */
};

struct dram_index;

/* A table that holds `expect` objects without growing (0: the smallest;
 * at most 2^23 slots, 128 MiB, are made up front), its pages touched. */
int dram_index_create(struct dram_index **out, size_t expect);
/* Frees the table and every object still in it (free()). */
void dram_index_destroy(struct dram_index *ix);
/* Frees the table only: its objects are the caller's (the store's come
 * from records.h). */
void dram_index_destroy_table(struct dram_index *ix);

/* Holds obj (dram_index_destroy frees it with free()) and sets obj->hash.
 * The caller checks first that no live entry has the key.  -ENOMEM if the
 * table cannot grow. */
int dram_index_insert(struct dram_index *ix, struct dram_obj *obj);
/* Drops obj from the table (not from the LRU list); ownership returns to
 * the caller. */
void dram_index_remove(struct dram_index *ix, struct dram_obj *obj);
/* The live (PENDING or PUBLISHED) entry of key, or NULL. */
struct dram_obj *dram_index_find(const struct dram_index *ix,
                                 const umbp_key_t *key);
/* The entry of key with this oid in any state, or NULL: "is it resident". */
struct dram_obj *dram_index_find_oid(const struct dram_index *ix,
                                     const umbp_key_t *key, uint64_t oid);
size_t dram_index_count(const struct dram_index *ix);
/* Slots of the table (a power of two; grows when 70% full). */
size_t dram_index_slots(const struct dram_index *ix);

/* LRU list: push at the head (most recent), evict from the tail. */
void dram_lru_push_head(struct dram_index *ix, struct dram_obj *obj);
void dram_lru_unlink(struct dram_index *ix, struct dram_obj *obj);
void dram_lru_touch(struct dram_index *ix, struct dram_obj *obj);
struct dram_obj *dram_lru_head(const struct dram_index *ix);
struct dram_obj *dram_lru_tail(const struct dram_index *ix);

#endif /* UMBP_DRAM_INDEX_H */
