/*
 * store.h - the object store: one pool, its allocator, the index with its
 * LRU list and the read leases, and the life cycle of objects over them.
 *
 * Shared by the dram tier (embedded mode, behind the tier vtable) and by
 * umbp-server (standalone mode, behind the wire protocol), so both keep one
 * implementation of the contracts of include/umbp/tier.h: reserve makes an
 * object PENDING (invisible, never evicted); publish makes it PUBLISHED
 * (visible, on the LRU list); evict or clear frees it unless readers hold
 * it, in which case eviction skips it and clear makes it DOOMED (invisible,
 * freed when its last lease ends or expires).  A region is named by its
 * offset in the pool; the caller turns it into an address in its mapping.
 *
 * Invariants: readers == number of ACTIVE leases on the object; an object is
 * on the LRU list iff PUBLISHED; used bytes == the allocator's used bytes.
 *
 * Single-threaded: whoever owns the store (the runtime's loop thread, the
 * server's loop thread) calls every function; create and destroy may block.
 */
#ifndef UMBP_DRAM_STORE_H
#define UMBP_DRAM_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "umbp/tier.h"

struct dram_store;

struct dram_store_params {
    struct dram_pool_params pool;
    uint64_t capacity;          /* bytes objects may use (<= the pool) */
    double high_watermark, low_watermark; /* fractions, reported by usage */
    /* With pool.persistent (a named pool): keep object records in
     * /dev/shm/<name>.meta and adopt the pool and its published objects if
     * they exist (a restarted server).  journal_slots: records (0 = one per
     * 64 KiB of capacity, at least 4096); objects past it are not kept
     * across restarts. */
    uint32_t journal_slots;
    /* Adopting: how long to keep a dead owner's pending region whose
     * record has no hold time (a table of an older release). */
    uint64_t adopt_grace_ms;
    /* Called when a key becomes visible (STORED) or goes away (REMOVED). */
    void (*emit_event)(void *ctx, umbp_event_type_t type, const umbp_key_t *key,
                       uint64_t size);
    /* Called when space was freed (eviction, abort, a lease ending, clear). */
    void (*space_freed)(void *ctx);
    /* Namespaces of a named pool (both NULL: every object is recorded in
     * the default namespace, and adopted into it).  ns_name: the name of
     * namespace ns ("" or NULL: none), read when ns first reserves, so the
     * journal records its objects by name.  ns_of_name: the owner's
     * namespace for a name the journal gives adopted objects, called during
     * create (0: the default; it may number the name anew). */
    const char *(*ns_name)(void *ctx, unsigned ns);
    unsigned (*ns_of_name)(void *ctx, const char *name);
    void *ctx;
};

/* A reserved or leased region. */
struct dram_store_region {
    uint64_t offset, size, token;
};

int dram_store_create(const struct dram_store_params *p, struct dram_store **out, char *err,
                      size_t errlen);
void dram_store_destroy(struct dram_store *s);
const struct dram_pool *dram_store_pool(const struct dram_store *s);
/* The pool's id: kept in the journal of a persistent pool (so a restarted
 * server hands the same id to clients that still map it), else random. */
uint64_t dram_store_pool_id(const struct dram_store *s);

/* What adoption found at create (all 0 for a new pool). */
struct dram_store_adoption {
    bool adopted;             /* an existing pool and journal were opened */
    uint64_t objects, bytes;  /* published objects adopted */
    uint64_t held_pending;    /* regions of the dead server's reservations,
                                 HELD until their writers' deadlines */
    uint64_t dropped;         /* records that were invalid (logged) */
    uint64_t unnamed;         /* adopted objects (and held regions) whose
                                 namespace the journal cannot name: counted
                                 in the default namespace (logged) */
};
void dram_store_adoption(const struct dram_store *s, struct dram_store_adoption *out);
/* Frees every HELD region now, whatever its deadline (tests and tools that
 * know no writer is left). */
void dram_store_adopt_finish(struct dram_store *s);

/* true if key is PUBLISHED; touch refreshes its LRU position. */
bool dram_store_lookup(struct dram_store *s, const umbp_key_t *key, bool touch);
/* 0 and *r: a PENDING object of size bytes; UMBP_TIER_EXISTS; -EINVAL (size
 * 0), -EFBIG (larger than the pool), -ENOSPC (no room now), -ENOMEM. */
int dram_store_reserve(struct dram_store *s, const umbp_key_t *key, uint64_t size,
                       struct dram_store_region *r);
/* The same for a writer in another process that stops writing into the
 * region by until_ns (CLOCK_MONOTONIC; 0: no deadline).  The region is
 * never handed out again before the writer is done: publish or abort by
 * the writer, or until_ns has passed (dram_store_orphan,
 * dram_store_expire_writers).  Kept in the journal as the record's hold
 * time, so a restarted owner honours it too.  -ENOSPC also while an adopted
 * pool may still be written by a writer the dead owner did not record. */
/* ahead: a reservation made ahead of its key (a client's spare): in a
 * namespace with a quota, such reservations hold at most 1/8 of it
 * (DRAM_STORE_AHEAD_QUOTA_SHARE; -EDQUOT beyond, before evicting). */
#define DRAM_STORE_AHEAD_QUOTA_SHARE 8
int dram_store_reserve_until(struct dram_store *s, const umbp_key_t *key, uint64_t size,
                             unsigned ns, uint64_t until_ns, bool ahead,
                             struct dram_store_region *r);
/* The writer's session ended without publishing or aborting: the key is
 * free again at once, the region only at its deadline (HELD), or now when
 * it has none or it passed.  Returns the pool bytes freed now. */
uint64_t dram_store_orphan(struct dram_store *s, const umbp_key_t *key, uint64_t token,
                           uint64_t now_ns);
/* Frees HELD regions and reclaims PENDING reservations whose writer
 * deadline has passed (a later publish of one is -ENOENT); returns how
 * many.  dram_store_next_writer_deadline: the earliest, 0 for none. */
uint64_t dram_store_expire_writers(struct dram_store *s, uint64_t now_ns);
uint64_t dram_store_next_writer_deadline(const struct dram_store *s);
/* HELD regions now, and pending reservations reclaimed at their deadline. */
void dram_store_writer_counts(const struct dram_store *s, uint64_t *held,
                              uint64_t *reservations_expired);
/* 0, or -ENOENT when token is not a pending reservation of key. */
int dram_store_publish(struct dram_store *s, const umbp_key_t *key, uint64_t token);
/* Publishes the pending reservation of `from` named by token as the object
 * of `key` (from == key: dram_store_publish).  0; UMBP_TIER_EXISTS when key
 * is already present or pending (the reservation is dropped: first writer
 * wins); -ENOENT when token is not a pending reservation of from. */
int dram_store_publish_as(struct dram_store *s, const umbp_key_t *from, uint64_t token,
                          const umbp_key_t *key);
/* Drops the pending reservation of key named by token, if it is one;
 * returns the pool bytes freed. */
uint64_t dram_store_abort(struct dram_store *s, const umbp_key_t *key, uint64_t token);
/* 0 and *r under a lease ending at now + ttl; -ENOENT; -ENOMEM. */
int dram_store_acquire(struct dram_store *s, const umbp_key_t *key, uint64_t now_ns,
                       uint64_t ttl_ns, struct dram_store_region *r);
/* Ends the lease of token: 0 if the bytes read under it are the object's
 * (still resident), UMBP_E_STALE otherwise.  *freed += pool bytes freed. */
int dram_store_release(struct dram_store *s, uint64_t token, uint64_t *freed);
/* Expires leases past their deadline; returns how many. */
uint64_t dram_store_expire_leases(struct dram_store *s, uint64_t now_ns);
/* Evicts least recently used objects that are neither leased nor pending,
 * at most max_objects, while used bytes > target_bytes or (want_free_run
 * and no free run of want_free_run bytes exists).  Returns bytes freed;
 * *more when it stopped on max_objects. */
uint64_t dram_store_evict(struct dram_store *s, uint64_t target_bytes, uint64_t want_free_run,
                          size_t max_objects, bool *more);
/* Namespaces (tenants): every object belongs to one, 0 being the default.
 * A namespace with a quota never holds more than quota bytes: a reserve
 * that would pass it first evicts that namespace's own least recently used
 * objects, and fails with -EDQUOT when they are leased or pending.  When
 * the pool itself is full, namespaces over their quota are evicted first, so
 * one tenant's writes do not flush another's cache. */
#define DRAM_STORE_MAX_NS 256
/* 0 = no quota.  -EINVAL for ns out of range. */
int dram_store_set_quota(struct dram_store *s, unsigned ns, uint64_t bytes);
int dram_store_reserve_ns(struct dram_store *s, const umbp_key_t *key, uint64_t size,
                          unsigned ns, struct dram_store_region *r);
struct dram_store_ns_usage {
    uint64_t quota, used_bytes, objects, evictions;
};
void dram_store_ns_usage(const struct dram_store *s, unsigned ns, struct dram_store_ns_usage *out);

/* Removes every published object (held ones become DOOMED). */
void dram_store_clear(struct dram_store *s);
/* Calls fn for every published object (key, size), newest first; fn must
 * not call the store. */
void dram_store_for_each_published(const struct dram_store *s,
                                   void (*fn)(void *ctx, const umbp_key_t *key, uint64_t size),
                                   void *ctx);
void dram_store_usage(const struct dram_store *s, struct umbp_tier_usage *out);
uint64_t dram_store_largest_free(const struct dram_store *s);
/* The sizes of the store's tables now (tests: they are made at the size a
 * full pool of KV objects needs, store.c): slots of the index and of the
 * lease table, object and allocator-block records made. */
struct dram_store_tables {
    size_t index_slots, lease_slots, object_records, block_records;
};
void dram_store_tables(const struct dram_store *s, struct dram_store_tables *out);

#endif /* UMBP_DRAM_STORE_H */
