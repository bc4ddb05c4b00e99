/*
 * tier_call.h - how the runtime calls a tier: small wrappers, never
 * t->ops->fn() at call sites.  Optional members that a tier leaves NULL get
 * the defaults here (not supported / nothing / healthy), so no NULL slot is
 * ever called.  All wrappers run on the loop thread.
 */
#ifndef UMBP_TIER_CALL_H
#define UMBP_TIER_CALL_H

#include <errno.h>
#include <string.h>

#include "umbp/tier.h"

/* After a successful create (caller's thread, before the loop runs): the
 * instance's ops and env, and its capabilities unless create set them. */
static inline void tier_instance_init(struct umbp_tier *t, const struct umbp_tier_ops *ops,
                                      const struct umbp_tier_env *env)
{
    t->ops = ops;
    t->env = *env;
    if (!t->caps_set)
        t->caps = ops->caps;
}

/* This instance's capabilities (enum umbp_tier_cap): any thread once the
 * tier is created (they never change). */
static inline uint32_t tier_caps(const struct umbp_tier *t)
{
    return t->caps;
}

static inline void tier_lookup(struct umbp_tier *t, struct umbp_tier_req *const *r, size_t n,
                               uint8_t *present, bool touch, umbp_tier_done_fn done, void *arg)
{
    t->ops->lookup(t, r, n, present, touch, done, arg);
}

static inline void tier_reserve(struct umbp_tier *t, struct umbp_tier_req *const *r, size_t n,
                                umbp_tier_done_fn done, void *arg)
{
    t->ops->reserve(t, r, n, done, arg);
}

static inline void tier_reserve_ahead(struct umbp_tier *t, uint64_t size)
{
    if (t->ops->reserve_ahead)
        t->ops->reserve_ahead(t, size);
}

static inline void tier_publish(struct umbp_tier *t, struct umbp_tier_req *const *r, size_t n,
                                umbp_tier_done_fn done, void *arg)
{
    t->ops->publish(t, r, n, done, arg);
}

static inline void tier_abort(struct umbp_tier *t, struct umbp_tier_req *const *r, size_t n)
{
    t->ops->abort(t, r, n);
}

static inline void tier_acquire(struct umbp_tier *t, struct umbp_tier_req *const *r, size_t n,
                                uint64_t ttl_ms, umbp_tier_done_fn done, void *arg)
{
    t->ops->acquire(t, r, n, ttl_ms, done, arg);
}

static inline void tier_release(struct umbp_tier *t, struct umbp_tier_req *const *r, size_t n,
                                umbp_tier_done_fn done, void *arg)
{
    t->ops->release(t, r, n, done, arg);
}

static inline void tier_clear(struct umbp_tier *t, umbp_tier_done_fn done, void *arg)
{
    t->ops->clear(t, done, arg);
}

static inline void tier_stop(struct umbp_tier *t)
{
    if (t->ops->stop)
        t->ops->stop(t);
}

static inline bool tier_drain(struct umbp_tier *t)
{
    return t->ops->drain ? t->ops->drain(t) : false;
}

static inline uint64_t tier_evict(struct umbp_tier *t, uint64_t target, uint64_t want_free_run,
                                  size_t max_objects, bool *more)
{
    if (!t->ops->evict) {
        *more = false;
        return 0;
    }
    return t->ops->evict(t, target, want_free_run, max_objects, more);
}

static inline void tier_usage(struct umbp_tier *t, struct umbp_tier_usage *out)
{
    memset(out, 0, sizeof(*out));
    if (t->ops->usage)
        t->ops->usage(t, out);
}

static inline void tier_refresh_usage(struct umbp_tier *t, umbp_tier_done_fn done, void *arg)
{
    if (t->ops->refresh_usage)
        t->ops->refresh_usage(t, done, arg);
    else
        done(arg, 0);
}

static inline void tier_expire_leases(struct umbp_tier *t, uint64_t now_ns)
{
    if (t->ops->expire_leases)
        t->ops->expire_leases(t, now_ns);
}

static inline int tier_health(struct umbp_tier *t)
{
    return t->ops->health ? t->ops->health(t) : 0;
}

static inline int tier_mapped_memory(struct umbp_tier *t, void **addr, size_t *len)
{
    return t->ops->mapped_memory ? t->ops->mapped_memory(t, addr, len) : -ENOTSUP;
}

static inline void tier_read(struct umbp_tier *t, const struct umbp_region *r,
                             const umbp_range_t *ranges, size_t n, umbp_tier_done_fn done,
                             void *arg)
{
    if (!t->ops->read) {
        done(arg, -ENOTSUP);
        return;
    }
    t->ops->read(t, r, ranges, n, done, arg);
}

static inline void tier_write(struct umbp_tier *t, const struct umbp_region *r,
                              const umbp_range_t *ranges, size_t n, umbp_tier_done_fn done,
                              void *arg)
{
    if (!t->ops->write) {
        done(arg, -ENOTSUP);
        return;
    }
    t->ops->write(t, r, ranges, n, done, arg);
}

/* Caller's thread, serialized by the runtime's memory registry. */
static inline int tier_mem_register(struct umbp_tier *t, void *addr, size_t len,
                                    umbp_mem_kind_t kind, int device, void **handle)
{
    *handle = NULL;
    return t->ops->mem_register ? t->ops->mem_register(t, addr, len, kind, device, handle)
                                : -ENOTSUP;
}

static inline void tier_mem_deregister(struct umbp_tier *t, void *handle)
{
    if (t->ops->mem_deregister)
        t->ops->mem_deregister(t, handle);
}

#endif
