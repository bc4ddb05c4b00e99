/*
 * store_ops.c - srv_dram_store_ops: the server's store-ops table
 * (store_ops.h) over the shared pool's store (store/store.h), one line
 * each.  Loop thread only, like the store.
 */
#include "store.h"
#include "store_ops.h"

static struct srv_region region_of(const struct dram_store_region *d)
{
    return (struct srv_region){.offset = d->offset, .size = d->size, .token = d->token};
}

static bool dram_lookup(void *ctx, const umbp_key_t *key, bool touch)
{
    return dram_store_lookup(ctx, key, touch);
}

static int dram_reserve(void *ctx, const umbp_key_t *key, uint64_t size, unsigned ns,
                        uint64_t until_ns, bool ahead, struct srv_region *r)
{
    struct dram_store_region d;
    int rc = dram_store_reserve_until(ctx, key, size, ns, until_ns, ahead, &d);
    if (rc == 0)
        *r = region_of(&d);
    return rc;
}

static int dram_publish(void *ctx, const umbp_key_t *key, uint64_t token)
{
    return dram_store_publish(ctx, key, token);
}

static int dram_publish_as(void *ctx, const umbp_key_t *from, uint64_t token,
                           const umbp_key_t *key)
{
    return dram_store_publish_as(ctx, from, token, key);
}

static void dram_abort(void *ctx, const umbp_key_t *key, uint64_t token)
{
    dram_store_abort(ctx, key, token);
}

static void dram_orphan(void *ctx, const umbp_key_t *key, uint64_t token, uint64_t now_ns)
{
    dram_store_orphan(ctx, key, token, now_ns);
}

static int dram_acquire(void *ctx, const umbp_key_t *key, uint64_t now_ns, uint64_t ttl_ns,
                        struct srv_region *r)
{
    struct dram_store_region d;
    int rc = dram_store_acquire(ctx, key, now_ns, ttl_ns, &d);
    if (rc == 0)
        *r = region_of(&d);
    return rc;
}

static int dram_release(void *ctx, uint64_t token)
{
    uint64_t freed = 0;
    return dram_store_release(ctx, token, &freed);
}

static uint64_t dram_evict(void *ctx, uint64_t target_bytes, uint64_t want_free_run,
                           size_t max)
{
    return dram_store_evict(ctx, target_bytes, want_free_run, max, NULL);
}

static void dram_clear(void *ctx) { dram_store_clear(ctx); }

static void dram_usage(void *ctx, struct umbp_tier_usage *u) { dram_store_usage(ctx, u); }

static void dram_writer_counts(void *ctx, uint64_t *held, uint64_t *reservations_expired)
{
    dram_store_writer_counts(ctx, held, reservations_expired);
}

const struct srv_store_ops srv_dram_store_ops = {
    .lookup = dram_lookup,
    .reserve = dram_reserve,
    .publish = dram_publish,
    .publish_as = dram_publish_as,
    .abort = dram_abort,
    .orphan = dram_orphan,
    .acquire = dram_acquire,
    .release = dram_release,
    .evict = dram_evict,
    .clear = dram_clear,
    .usage = dram_usage,
    .writer_counts = dram_writer_counts,
};
