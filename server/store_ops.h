/*
 * store_ops.h - what the server's request handlers (requests.c) and the end
 * of a session (session.c) may ask of the store, as a small ops table the
 * server is handed: struct srv_store, an ops pointer and its context.
 *
 * Today the one implementation is srv_dram_store_ops (store_ops.c) over the
 * shared pool's store (store/); a peer service over TCP will serve the same
 * handlers over another store (regions that name a node and a registered
 * pool instead of an offset in the shared mapping).  The store's owner
 * (server.c: create, housekeeping, quotas) and /metrics (its namespace
 * rows) still use store/ directly: they run the local pool, not requests.
 *
 * Every member is required; callers go through the static inline wrappers
 * below, never ops->fn.  Threads: the server's loop thread.
 */
#ifndef UMBP_SERVER_STORE_OPS_H
#define UMBP_SERVER_STORE_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/tier.h"

/* Where an object's bytes are, and the token that names the reservation
 * or lease. */
struct srv_region {
    uint64_t offset, size, token;
};

struct srv_store_ops {
    /* The key is published (touch: an LRU hit). */
    bool (*lookup)(void *ctx, const umbp_key_t *key, bool touch);
    /* 0 and *r: a pending object of size bytes in namespace ns whose writer
     * is done by until_ns; UMBP_TIER_EXISTS, -EFBIG, -ENOSPC (no room now),
     * -EDQUOT, -ENOMEM.  ahead: made ahead of its key (a client's spare;
     * store.h: at most a share of a namespace's quota). */
    int (*reserve)(void *ctx, const umbp_key_t *key, uint64_t size, unsigned ns,
                   uint64_t until_ns, bool ahead, struct srv_region *r);
    /* 0, or -ENOENT when token is not a pending reservation of key. */
    int (*publish)(void *ctx, const umbp_key_t *key, uint64_t token);
    /* The pending reservation of `from` becomes the object of key: 0,
     * UMBP_TIER_EXISTS (key present or pending: the reservation is
     * dropped), -ENOENT. */
    int (*publish_as)(void *ctx, const umbp_key_t *from, uint64_t token, const umbp_key_t *key);
    /* Drops the pending reservation, if it is one. */
    void (*abort)(void *ctx, const umbp_key_t *key, uint64_t token);
    /* The writer's session ended without publishing: the key is free now,
     * the region at the writer's deadline. */
    void (*orphan)(void *ctx, const umbp_key_t *key, uint64_t token, uint64_t now_ns);
    /* 0 and *r under a lease ending at now + ttl; -ENOENT; -ENOMEM. */
    int (*acquire)(void *ctx, const umbp_key_t *key, uint64_t now_ns, uint64_t ttl_ns,
                   struct srv_region *r);
    /* 0 if the bytes read under the lease are the object's, UMBP_E_STALE. */
    int (*release)(void *ctx, uint64_t token);
    /* Evicts unheld objects, least recently used first, until used bytes are
     * at most target and a free run of want bytes exists, at most max of
     * them; returns how many. */
    uint64_t (*evict)(void *ctx, uint64_t target_bytes, uint64_t want_free_run, size_t max);
    void (*clear)(void *ctx);
    void (*usage)(void *ctx, struct umbp_tier_usage *u);
    /* Regions held for a gone writer, reservations reclaimed at a deadline. */
    void (*writer_counts)(void *ctx, uint64_t *held, uint64_t *reservations_expired);
};

struct srv_store {
    const struct srv_store_ops *ops;
    void *ctx;
};

/* The shared pool's store (store/store.h); ctx is a struct dram_store. */
extern const struct srv_store_ops srv_dram_store_ops;

static inline bool srv_store_lookup(const struct srv_store *st, const umbp_key_t *key,
                                    bool touch)
{
    return st->ops->lookup(st->ctx, key, touch);
}

static inline int srv_store_reserve(const struct srv_store *st, const umbp_key_t *key,
                                    uint64_t size, unsigned ns, uint64_t until_ns, bool ahead,
                                    struct srv_region *r)
{
    return st->ops->reserve(st->ctx, key, size, ns, until_ns, ahead, r);
}

static inline int srv_store_publish_as(const struct srv_store *st, const umbp_key_t *from,
                                       uint64_t token, const umbp_key_t *key)
{
    return st->ops->publish_as(st->ctx, from, token, key);
}

static inline int srv_store_publish(const struct srv_store *st, const umbp_key_t *key,
                                    uint64_t token)
{
    return st->ops->publish(st->ctx, key, token);
}

static inline void srv_store_abort(const struct srv_store *st, const umbp_key_t *key,
                                   uint64_t token)
{
    st->ops->abort(st->ctx, key, token);
}

static inline void srv_store_orphan(const struct srv_store *st, const umbp_key_t *key,
                                    uint64_t token, uint64_t now_ns)
{
    st->ops->orphan(st->ctx, key, token, now_ns);
}

static inline int srv_store_acquire(const struct srv_store *st, const umbp_key_t *key,
                                    uint64_t now_ns, uint64_t ttl_ns, struct srv_region *r)
{
    return st->ops->acquire(st->ctx, key, now_ns, ttl_ns, r);
}

static inline int srv_store_release(const struct srv_store *st, uint64_t token)
{
    return st->ops->release(st->ctx, token);
}

static inline uint64_t srv_store_evict(const struct srv_store *st, uint64_t target_bytes,
                                       uint64_t want_free_run, size_t max)
{
    return st->ops->evict(st->ctx, target_bytes, want_free_run, max);
}

static inline void srv_store_clear(const struct srv_store *st) { st->ops->clear(st->ctx); }

static inline void srv_store_usage(const struct srv_store *st, struct umbp_tier_usage *u)
{
    st->ops->usage(st->ctx, u);
}

static inline void srv_store_writer_counts(const struct srv_store *st, uint64_t *held,
                                           uint64_t *reservations_expired)
{
    st->ops->writer_counts(st->ctx, held, reservations_expired);
}

#endif /* UMBP_SERVER_STORE_OPS_H */
