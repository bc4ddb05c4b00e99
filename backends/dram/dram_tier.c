/*
 * dram_tier.c - the dram tier: objects in this process's host memory.
 *
 * Owns one pool (pool.c), the allocator over its bytes (alloc.c), the index
 * of objects with their LRU list (index.c) and the read leases (lease.c).
 * Every member runs on the runtime's loop thread (create/destroy on the
 * creating thread while the loop is not running), so nothing is locked;
 * every member completes inline and never blocks.
 *
 * An object's life: reserve makes it PENDING (invisible, never evicted);
 * publish makes it PUBLISHED (visible, on the LRU list); eviction or clear
 * frees it, unless readers hold it: eviction then skips it and clear makes
 * it DOOMED (invisible, freed when its last lease ends or expires).
 * Invariants: readers == number of ACTIVE leases on the object; an object is
 * on the LRU list iff PUBLISHED; used bytes == the allocator's used bytes.
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
#include "alloc.h"
#include "dram.h"
#include "index.h"
#include "lease.h"
#include "pool.h"

#define HUGE_2M (2ull << 20)
#define HUGE_1G (1ull << 30)

struct dram_config {
    bool use_shared_memory;
    char shm_name[DRAM_SHM_NAME_MAX];
    bool use_hugepages;
    uint64_t hugepage_size;
    int64_t numa_node;
    bool prefault;
    double high_watermark;
    double low_watermark;
};

#define CFG(field) offsetof(struct dram_config, field)

static const struct umbp_option dram_options[] = {
    { .name = "dram_use_shared_memory", .type = UMBP_OPT_BOOL,
      .offset = CFG(use_shared_memory), .def = "false",
      .help = "back the pool with a memfd (or dram_shm_name) instead of "
              "anonymous memory" },
    { .name = "dram_shm_name", .type = UMBP_OPT_STRING,
      .offset = CFG(shm_name), .def = "", .str_cap = DRAM_SHM_NAME_MAX,
      .help = "with dram_use_shared_memory: create /dev/shm/<name> "
              "(exclusively) instead of an unnamed memfd" },
    { .name = "dram_use_hugepages", .type = UMBP_OPT_BOOL,
      .offset = CFG(use_hugepages), .def = "false",
      .help = "map the pool with huge pages; falls back to 4 KiB pages "
              "with a warning" },
    { .name = "dram_hugepage_size", .type = UMBP_OPT_SIZE,
      .offset = CFG(hugepage_size), .def = "2MiB",
      .min = (double)HUGE_2M, .max = (double)HUGE_1G,
      .help = "huge page size: 2MiB or 1GiB" },
    { .name = "dram_numa_node", .type = UMBP_OPT_INT,
      .offset = CFG(numa_node), .def = "-1", .min = -1, .max = 1023,
      .help = "NUMA node to allocate the pool on; -1 for no binding" },
    { .name = "dram_prefault", .type = UMBP_OPT_BOOL,
      .offset = CFG(prefault), .def = "false",
      .help = "touch every page of the pool at creation" },
    { .name = "dram_high_watermark", .type = UMBP_OPT_DOUBLE,
      .offset = CFG(high_watermark), .def = "0.9", .min = 0.01, .max = 1.0,
      .help = "fraction of capacity above which the evictor starts" },
    { .name = "dram_low_watermark", .type = UMBP_OPT_DOUBLE,
      .offset = CFG(low_watermark), .def = "0.7", .min = 0.0, .max = 0.99,
      .help = "fraction of capacity the evictor frees down to" },
    { .name = NULL },
};

struct dram_tier {
    struct umbp_tier base;
    struct dram_config cfg;
    struct dram_pool *pool;
    struct dram_alloc *alloc;
    struct dram_index *index;
    struct dram_leases *leases;
    uint64_t next_oid;
    uint64_t num_objects, num_pending, num_leased;
    uint64_t evictions, evicted_bytes, leases_expired;
};

static struct dram_tier *to_dram_tier(struct umbp_tier *t)
{
    return umbp_container_of(t, struct dram_tier, base);
}

static void emit(struct dram_tier *dt, umbp_event_type_t type,
                 const umbp_key_t *key)
{
    if (dt->base.env.emit_event)
        dt->base.env.emit_event(dt->base.env.ctx, type, key);
}

static void space_freed(struct dram_tier *dt)
{
    if (dt->base.env.space_freed)
        dt->base.env.space_freed(dt->base.env.ctx);
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* ---- configuration and lifetime --------------------------------------- */

static int check_shm_name(const struct dram_config *c, char *err,
                          size_t errlen)
{
    if (!c->shm_name[0])
        return 0;
    if (!c->use_shared_memory) {
        snprintf(err, errlen, "dram_shm_name=%s needs "
                 "dram_use_shared_memory=true; set it, or leave dram_shm_name "
                 "empty", c->shm_name);
        return -EINVAL;
    }
    if (strchr(c->shm_name, '/') || !strcmp(c->shm_name, ".") ||
        !strcmp(c->shm_name, "..")) {
        snprintf(err, errlen, "dram_shm_name=%s: must be a plain file name "
                 "without '/' (it becomes /dev/shm/<name>), e.g. umbp-rank0",
                 c->shm_name);
        return -EINVAL;
    }
    return 0;
}

static int dram_validate_config(const void *cfg,
                                const struct umbp_core_config *core,
                                char *err, size_t errlen)
{
    const struct dram_config *c = cfg;

    (void)core; /* every check here is the tier's own */
    if (c->hugepage_size != HUGE_2M && c->hugepage_size != HUGE_1G) {
        snprintf(err, errlen, "dram_hugepage_size=%llu: must be 2MiB "
                 "(2097152) or 1GiB (1073741824)",
                 (unsigned long long)c->hugepage_size);
        return -EINVAL;
    }
    if (c->numa_node < -1 || c->numa_node > 1023) {
        snprintf(err, errlen, "dram_numa_node=%lld: must be -1 (no binding) "
                 "or a node number 0..1023", (long long)c->numa_node);
        return -EINVAL;
    }
    if (!(c->low_watermark < c->high_watermark)) {
        snprintf(err, errlen, "dram_low_watermark=%g must be below "
                 "dram_high_watermark=%g; lower dram_low_watermark or raise "
                 "dram_high_watermark", c->low_watermark, c->high_watermark);
        return -EINVAL;
    }
    return check_shm_name(c, err, errlen);
}

static void dram_destroy(struct umbp_tier *t)
{
    struct dram_tier *dt;

    if (!t)
        return;
    dt = to_dram_tier(t);
    dram_leases_destroy(dt->leases);
    dram_index_destroy(dt->index);
    dram_alloc_destroy(dt->alloc);
    dram_pool_destroy(dt->pool);
    free(dt);
}

static int dram_make_pool(struct dram_tier *dt, uint64_t capacity, char *err,
                          size_t errlen)
{
    const struct dram_config *c = &dt->cfg;
    struct dram_pool_params p = {
        .capacity = capacity,
        .shared = c->use_shared_memory,
        .shm_name = c->shm_name,
        .hugepages = c->use_hugepages,
        .hugepage_size = c->hugepage_size,
        .numa_node = (int)c->numa_node,
        .prefault = c->prefault,
    };

    return dram_pool_create(&p, &dt->pool, err, errlen);
}

static int dram_create(const struct umbp_tier_env *env, const void *cfg,
                       struct umbp_tier **out, char *err, size_t errlen)
{
    struct dram_tier *dt;
    int rc;

    rc = dram_validate_config(cfg, env->core, err, errlen);
    if (rc < 0)
        return rc;
    if (env->capacity_bytes == 0) {
        snprintf(err, errlen, "capacity_bytes is 0: the dram tier needs a "
                 "pool; set capacity_bytes or total_capacity_bytes");
        return -EINVAL;
    }
    dt = calloc(1, sizeof(*dt));
    if (!dt)
        goto nomem;
    dt->base.ops = &umbp_tier_dram_ops;
    dt->base.env = *env;
    dt->cfg = *(const struct dram_config *)cfg;
    dt->next_oid = 1;
    rc = dram_make_pool(dt, env->capacity_bytes, err, errlen);
    if (rc < 0) {
        dram_destroy(&dt->base);
        return rc;
    }
    /* The pool is mapped in whole pages; objects get capacity_bytes of it
     * (in allocation units), so capacity stays an upper bound. */
    uint64_t usable = env->capacity_bytes & ~(uint64_t)255;
    if (usable > dt->pool->size)
        usable = dt->pool->size;
    if (dram_alloc_create(usable, &dt->alloc) < 0 ||
        dram_index_create(&dt->index) < 0 ||
        dram_leases_create(&dt->leases) < 0)
        goto nomem;
    *out = &dt->base;
    return 0;
nomem:
    snprintf(err, errlen, "dram tier: out of memory for its metadata");
    if (dt)
        dram_destroy(&dt->base);
    return -ENOMEM;
}

/* ---- objects ---------------------------------------------------------- */

/* Returns the pool bytes freed. */
static uint64_t obj_free(struct dram_tier *dt, struct dram_obj *obj)
{
    uint64_t bytes = dram_alloc_round(obj->size);

    dram_alloc_put(dt->alloc, obj->off);
    dram_index_remove(dt->index, obj);
    free(obj);
    return bytes;
}

/* Takes a PUBLISHED object out of sight: freed now, or DOOMED while read. */
static uint64_t obj_remove(struct dram_tier *dt, struct dram_obj *obj)
{
    dram_lru_unlink(dt->index, obj);
    dt->num_objects--;
    emit(dt, UMBP_EVENT_REMOVED, &obj->key);
    if (obj->readers) {
        obj->state = DRAM_OBJ_DOOMED;
        return 0;
    }
    return obj_free(dt, obj);
}

/* Ends one reader; returns the bytes freed if it was a DOOMED object's last. */
static uint64_t obj_drop_reader(struct dram_tier *dt, struct dram_obj *obj)
{
    if (--obj->readers > 0)
        return 0;
    dt->num_leased--;
    return obj->state == DRAM_OBJ_DOOMED ? obj_free(dt, obj) : 0;
}

static struct umbp_region obj_region(const struct dram_tier *dt,
                                     const struct dram_obj *obj,
                                     uint64_t token)
{
    return (struct umbp_region){
        .addr = (char *)dt->pool->base + obj->off,
        .size = obj->size,
        .token = token,
    };
}

/* ---- lookup, reserve, publish, abort ---------------------------------- */

static void dram_lookup(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                        size_t n, uint8_t *present, bool touch,
                        umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);

    for (size_t i = 0; i < n; i++) {
        struct dram_obj *obj = dram_index_find(dt->index, &reqs[i]->key);
        bool hit = obj && obj->state == DRAM_OBJ_PUBLISHED;

        present[i] = hit;
        if (hit && touch)
            dram_lru_touch(dt->index, obj);
    }
    done(arg, 0);
}

static int reserve_one(struct dram_tier *dt, struct umbp_tier_req *req)
{
    struct dram_obj *obj;
    int rc;

    if (req->size == 0)
        return -EINVAL;
    if (dram_index_find(dt->index, &req->key))
        return UMBP_TIER_EXISTS;
    if (req->size > dram_alloc_capacity(dt->alloc))
        return -EFBIG;
    obj = calloc(1, sizeof(*obj));
    if (!obj)
        return -ENOMEM;
    rc = dram_alloc_get(dt->alloc, req->size, &obj->off);
    if (rc < 0) {
        free(obj);
        return rc;
    }
    obj->key = req->key;
    obj->size = req->size;
    obj->oid = dt->next_oid++;
    obj->state = DRAM_OBJ_PENDING;
    if (dram_index_insert(dt->index, obj) < 0) {
        dram_alloc_put(dt->alloc, obj->off);
        free(obj);
        return -ENOMEM;
    }
    dt->num_pending++;
    req->region = obj_region(dt, obj, obj->oid);
    return 0;
}

static void dram_reserve(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                         size_t n, umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);

    for (size_t i = 0; i < n; i++)
        reqs[i]->status = reserve_one(dt, reqs[i]);
    done(arg, 0);
}

/* The PENDING object a reservation token names, or NULL. */
static struct dram_obj *find_pending(struct dram_tier *dt,
                                     const struct umbp_tier_req *req)
{
    struct dram_obj *obj = dram_index_find(dt->index, &req->key);

    if (!obj || obj->state != DRAM_OBJ_PENDING || obj->oid != req->region.token)
        return NULL;
    return obj;
}

static void dram_publish(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                         size_t n, umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);

    for (size_t i = 0; i < n; i++) {
        struct dram_obj *obj;

        if (reqs[i]->status != 0)
            continue;   /* not reserved, or failed: never made visible */
        obj = find_pending(dt, reqs[i]);
        if (!obj) {
            reqs[i]->status = -ENOENT;
            continue;
        }
        obj->state = DRAM_OBJ_PUBLISHED;
        dt->num_pending--;
        dt->num_objects++;
        dram_lru_push_head(dt->index, obj);
        emit(dt, UMBP_EVENT_STORED, &obj->key);
        reqs[i]->status = 0;
    }
    done(arg, 0);
}

static void dram_abort(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                       size_t n)
{
    struct dram_tier *dt = to_dram_tier(t);
    uint64_t freed = 0;

    for (size_t i = 0; i < n; i++) {
        struct dram_obj *obj = find_pending(dt, reqs[i]);

        if (obj) {
            dt->num_pending--;
            freed += obj_free(dt, obj);
        }
    }
    if (freed)
        space_freed(dt);
}

/* ---- leases ----------------------------------------------------------- */

static int acquire_one(struct dram_tier *dt, struct umbp_tier_req *req,
                       uint64_t now_ns, uint64_t ttl_ns)
{
    struct dram_obj *obj = dram_index_find(dt->index, &req->key);
    uint64_t token;
    int rc;

    if (!obj || obj->state != DRAM_OBJ_PUBLISHED)
        return -ENOENT;
    rc = dram_lease_open(dt->leases, obj, add_sat(now_ns, ttl_ns), ttl_ns,
                         &token);
    if (rc < 0)
        return rc;
    if (obj->readers++ == 0)
        dt->num_leased++;
    dram_lru_touch(dt->index, obj);
    req->region = obj_region(dt, obj, token);
    return 0;
}

static void dram_acquire(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                         size_t n, uint64_t lease_ttl_ms,
                         umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);
    uint64_t now = umbp_now_ns(), ttl_ns = mul_sat(lease_ttl_ms, 1000000);

    for (size_t i = 0; i < n; i++)
        reqs[i]->status = acquire_one(dt, reqs[i], now, ttl_ns);
    done(arg, 0);
}

/* 0 if the bytes read under the lease are still the object's. */
static int release_one(struct dram_tier *dt, const struct umbp_tier_req *req,
                       uint64_t *freed)
{
    struct dram_lease_info l = dram_lease_end(dt->leases, req->region.token);

    switch (l.state) {
    case DRAM_LEASE_ACTIVE:
        *freed += obj_drop_reader(dt, l.obj);
        return 0;
    case DRAM_LEASE_EXPIRED:
        /* The lease no longer pinned it: valid only if never freed. */
        return dram_index_find_oid(dt->index, &l.key, l.oid) ? 0 : UMBP_E_STALE;
    default:
        return UMBP_E_STALE;
    }
}

static void dram_release(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                         size_t n, umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);
    uint64_t freed = 0;

    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == 0)   /* else acquire failed: no lease */
            reqs[i]->status = release_one(dt, reqs[i], &freed);
    if (freed)
        space_freed(dt);
    done(arg, 0);
}

static void dram_expire_leases(struct umbp_tier *t, uint64_t now_ns)
{
    struct dram_tier *dt = to_dram_tier(t);
    struct dram_obj *obj;
    uint64_t freed = 0;

    while ((obj = dram_lease_expire_next(dt->leases, now_ns))) {
        dt->leases_expired++;
        freed += obj_drop_reader(dt, obj);
    }
    dram_lease_forget(dt->leases, now_ns);
    if (freed)
        space_freed(dt);
}

/* ---- eviction, clear, usage ------------------------------------------- */

static uint64_t dram_evict(struct umbp_tier *t, uint64_t target_bytes,
                           size_t max_objects, bool *more)
{
    struct dram_tier *dt = to_dram_tier(t);
    struct dram_obj *obj = dram_lru_tail(dt->index), *prev;
    uint64_t freed = 0;
    size_t count = 0;
    bool hit_max = false;

    for (; obj && dram_alloc_used(dt->alloc) > target_bytes; obj = prev) {
        prev = obj->lru_prev;
        if (obj->readers)
            continue;   /* leased: never evicted */
        if (count == max_objects) {
            hit_max = true;
            break;
        }
        freed += obj_remove(dt, obj);
        count++;
    }
    dt->evictions += count;
    dt->evicted_bytes += freed;
    if (more)
        *more = hit_max;
    if (freed)
        space_freed(dt);
    return freed;
}

static void dram_clear(struct umbp_tier *t, umbp_tier_done_fn done, void *arg)
{
    struct dram_tier *dt = to_dram_tier(t);
    struct dram_obj *obj = dram_lru_tail(dt->index), *prev;
    uint64_t freed = 0;

    for (; obj; obj = prev) {
        prev = obj->lru_prev;
        freed += obj_remove(dt, obj);
    }
    if (freed)
        space_freed(dt);
    done(arg, 0);
}

static void dram_usage(struct umbp_tier *t, struct umbp_tier_usage *out)
{
    struct dram_tier *dt = to_dram_tier(t);
    uint64_t cap = dram_alloc_capacity(dt->alloc);

    *out = (struct umbp_tier_usage){
        .capacity_bytes = cap,
        .used_bytes = dram_alloc_used(dt->alloc),
        /* the evictor works between these; nonzero: this tier needs it */
        .high_watermark_bytes = (uint64_t)((double)cap * dt->cfg.high_watermark),
        .low_watermark_bytes = (uint64_t)((double)cap * dt->cfg.low_watermark),
        .num_objects = dt->num_objects,
        .num_pending = dt->num_pending,
        .num_leased = dt->num_leased,
        .evictions = dt->evictions,
        .evicted_bytes = dt->evicted_bytes,
        .leases_expired = dt->leases_expired,
    };
}

/* ---- the vtable and the evictor's accessors --------------------------- */

/* Caller's thread: the pool mapping never changes after create. */
static int dram_mapped_memory(struct umbp_tier *t, void **addr, size_t *len)
{
    struct dram_tier *dt = to_dram_tier(t);
    *addr = dt->pool->base;
    *len = (size_t)dt->pool->size;
    return 0;
}

const struct umbp_tier_ops umbp_tier_dram_ops = {
    .name = "dram",
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
    /* health, read, write: the runtime's defaults (always healthy; regions
     * are always mapped, so no tier-side copies) */
};

double umbp_dram_high_watermark(struct umbp_tier *t)
{
    if (!t || t->ops != &umbp_tier_dram_ops)
        return -1.0;
    return to_dram_tier(t)->cfg.high_watermark;
}

double umbp_dram_low_watermark(struct umbp_tier *t)
{
    if (!t || t->ops != &umbp_tier_dram_ops)
        return -1.0;
    return to_dram_tier(t)->cfg.low_watermark;
}
