/*
 * dram_tier.c - the dram tier: objects in this process's host memory.
 *
 * The tier vtable over one object store (store.c: pool, allocator, index
 * with LRU, leases and the object life cycle, shared with umbp-server).
 * This file owns the dram_* options and turns store offsets into addresses.
 * Every member runs on the runtime's loop thread (create/destroy on the
 * creating thread while the loop is not running), so nothing is locked;
 * every member completes inline and never blocks.
 *
 * A request's status is an input of publish and release: only requests
 * whose status is 0 (what reserve or acquire returned) are acted on, the
 * others keep their status, so a failed key's result is never overwritten
 * and a stale token is never used.  abort acts on every request whose token
 * still names a pending reservation of its key, whatever its status, since
 * it exists to drop failed puts.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "umbp/tier.h"
#include "dram_config.h"
#include "dram_options.h"
#include "store.h"

/* also declared by the generated registry (tier_registry.c) */
extern const struct umbp_tier_ops umbp_tier_dram_ops;

struct dram_tier {
    struct umbp_tier base;
    struct dram_config cfg;
    struct dram_store *store;
    char *base_addr; /* the pool mapping */
};

static struct dram_tier *to_dram_tier(struct umbp_tier *t)
{
    return umbp_container_of(t, struct dram_tier, base);
}

static void store_emit(void *ctx, umbp_event_type_t type, const umbp_key_t *key,
                       uint64_t size)
{
    (void)size;
    struct dram_tier *dt = ctx;
    if (dt->base.env.emit_event)
        dt->base.env.emit_event(dt->base.env.ctx, type, key);
}

static void store_space_freed(void *ctx)
{
    struct dram_tier *dt = ctx;
    if (dt->base.env.space_freed)
        dt->base.env.space_freed(dt->base.env.ctx);
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* ---- configuration and lifetime --------------------------------------- */

static int dram_validate_config(const void *cfg,
                                const struct umbp_core_config *core,
                                char *err, size_t errlen)
{
    (void)core; /* every check here is the tier's own */
    return umbp_dram_validate_config(cfg, err, errlen);
}

static void dram_destroy(struct umbp_tier *t)
{
    if (!t)
        return;
    struct dram_tier *dt = to_dram_tier(t);
    dram_store_destroy(dt->store);
    free(dt);
}

static int dram_create(const struct umbp_tier_env *env, const void *cfg,
                       struct umbp_tier **out, char *err, size_t errlen)
{
    int rc = dram_validate_config(cfg, env->core, err, errlen);
    if (rc < 0)
        return rc;
    if (env->capacity_bytes == 0) {
        snprintf(err, errlen, "capacity_bytes is 0: the dram tier needs a "
                 "pool; set capacity_bytes or total_capacity_bytes");
        return -EINVAL;
    }
    struct dram_tier *dt = calloc(1, sizeof(*dt));
    if (!dt) {
        snprintf(err, errlen, "dram tier: out of memory for its metadata");
        return -ENOMEM;
    }
    dt->base.ops = &umbp_tier_dram_ops;
    dt->base.env = *env;
    dt->cfg = *(const struct dram_config *)cfg;
    struct dram_store_params p;
    umbp_dram_store_params(cfg, env->capacity_bytes, &p);
    p.emit_event = store_emit;
    p.space_freed = store_space_freed;
    p.ctx = dt;
    rc = dram_store_create(&p, &dt->store, err, errlen);
    if (rc < 0) {
        free(dt);
        return rc;
    }
    dt->base_addr = dram_store_pool(dt->store)->base;
    *out = &dt->base;
    return 0;
}

static struct umbp_region to_region(const struct dram_tier *dt,
                                    const struct dram_store_region *r)
{
    return (struct umbp_region){
        .addr = dt->base_addr + r->offset,
        .size = r->size,
        .token = r->token,
    };
}

/* ---- lookup, reserve, publish, abort ---------------------------------- */

static void dram_lookup(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                        size_t n, uint8_t *present, bool touch,
                        umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);

    for (size_t i = 0; i < n; i++)
        present[i] = dram_store_lookup(dt->store, &reqs[i]->key, touch);
    done(arg, 0);
}

static void dram_reserve(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                         size_t n, umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);

    for (size_t i = 0; i < n; i++) {
        struct dram_store_region r;
        reqs[i]->status = dram_store_reserve(dt->store, &reqs[i]->key,
                                             reqs[i]->size, &r);
        if (reqs[i]->status == 0)
            reqs[i]->region = to_region(dt, &r);
    }
    done(arg, 0);
}

static void dram_publish(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                         size_t n, umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);

    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == 0)   /* else not reserved: never made visible */
            reqs[i]->status = dram_store_publish(dt->store, &reqs[i]->key,
                                                 reqs[i]->region.token);
    done(arg, 0);
}

static void dram_abort(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                       size_t n)
{
    struct dram_tier *dt = to_dram_tier(t);

    for (size_t i = 0; i < n; i++)
        dram_store_abort(dt->store, &reqs[i]->key, reqs[i]->region.token);
}

/* ---- leases ----------------------------------------------------------- */

static void dram_acquire(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                         size_t n, uint64_t lease_ttl_ms,
                         umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);
    uint64_t now = umbp_now_ns(), ttl_ns = mul_sat(lease_ttl_ms, 1000000);

    for (size_t i = 0; i < n; i++) {
        struct dram_store_region r;
        reqs[i]->status = dram_store_acquire(dt->store, &reqs[i]->key, now,
                                             ttl_ns, &r);
        if (reqs[i]->status == 0)
            reqs[i]->region = to_region(dt, &r);
    }
    done(arg, 0);
}

static void dram_release(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                         size_t n, umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);
    uint64_t freed = 0;

    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == 0)   /* else acquire failed: no lease */
            reqs[i]->status = dram_store_release(dt->store,
                                                 reqs[i]->region.token, &freed);
    if (freed)
        store_space_freed(dt);
    done(arg, 0);
}

static void dram_expire_leases(struct umbp_tier *t, uint64_t now_ns)
{
    dram_store_expire_leases(to_dram_tier(t)->store, now_ns);
}

/* ---- eviction, clear, usage ------------------------------------------- */

static uint64_t dram_evict(struct umbp_tier *t, uint64_t target_bytes,
                           uint64_t want_free_run, size_t max_objects,
                           bool *more)
{
    return dram_store_evict(to_dram_tier(t)->store, target_bytes,
                            want_free_run, max_objects, more);
}

static void dram_clear(struct umbp_tier *t, umbp_tier_done_fn done, void *arg)
{
    dram_store_clear(to_dram_tier(t)->store);
    done(arg, 0);
}

static void dram_usage(struct umbp_tier *t, struct umbp_tier_usage *out)
{
    dram_store_usage(to_dram_tier(t)->store, out);
}

/* ---- the vtable ------------------------------------------------------- */

/* Caller's thread: the pool mapping never changes after create. */
static int dram_mapped_memory(struct umbp_tier *t, void **addr, size_t *len)
{
    const struct dram_pool *pool = dram_store_pool(to_dram_tier(t)->store);
    *addr = pool->base;
    *len = (size_t)pool->size;
    return 0;
}

static const char *const dram_modes[] = {"embedded", NULL};

const struct umbp_tier_ops umbp_tier_dram_ops = {
    .name = "dram",
    .caps = UMBP_TIER_CAP_MAPPED | UMBP_TIER_CAP_EVICTS_LOCALLY |
            UMBP_TIER_CAP_EXPIRES_LEASES,
    .modes = dram_modes,
    .options = dram_options,
    .config_size = sizeof(struct dram_config),
    .validate_config = dram_validate_config,
    .create = dram_create,
    .destroy = dram_destroy,
    .lookup = dram_lookup,
    .reserve = dram_reserve,
    .publish = dram_publish,
    .abort = dram_abort,
    .acquire = dram_acquire,
    .release = dram_release,
    .clear = dram_clear,
    .evict = dram_evict,
    .usage = dram_usage,
    .expire_leases = dram_expire_leases,
    .mapped_memory = dram_mapped_memory,
    /* stop, health, read, write: the runtime's defaults (nothing
     * outstanding, always healthy, regions always mapped) */
};
