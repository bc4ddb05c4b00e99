/*
 * loopback_tier.c - the loopback tier: objects in this process's private
 * memory that the runtime cannot address.  Regions have addr == NULL and the
 * tier moves the bytes itself (read/write), as a tier over a peer's memory
 * must; it is the tier to copy for one (docs/architecture.md, "Adding a
 * tier"), and the one that runs the runtime's MOVER_TIER path through the
 * conformance suite.
 *
 * The object life cycle (allocation, index, LRU eviction, leases) is the
 * object store of store/, as in the dram tier; this file turns store offsets
 * into region tokens (region.aux[0] holds the offset) and copies between
 * caller memory and its private pool.  loopback_map_one_in maps some
 * regions anyway (those of keys whose hash is a multiple of n), so one batch
 * mixes mapped and unmapped regions; with n = 1 every region is mapped and
 * create extends this instance's caps with UMBP_TIER_CAP_MAPPED.
 *
 * Threads.  Every member runs on the runtime's loop thread (create and
 * destroy on the creating thread while the loop is not running) and never
 * blocks.  All but read/write complete inline.  read/write complete later,
 * as a remote tier's do: the loop queues the move for the tier's mover
 * threads (as many as the runtime's copy_threads, so one slow move does not
 * hold up the others, as the runtime's copy workers do not), one of which
 * copies and hands it back through an ev_async on env->loop, whose handler
 * calls done on the loop thread.  A mover touches only its move (its ranges
 * and the pool bytes of its region, which the runtime holds reserved or
 * leased until done); the queues between the threads are under `lock`.
 * stop completes the moves not yet started with UMBP_E_NOT_ATTEMPTED and
 * waits for those being copied (each ends: one memcpy per range), so no
 * done comes after it.  Failures: the store's codes;
 * read/write refuse a mapped region or a range past the region (-EINVAL).
 */
#include <errno.h>
#include <ev.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "umbp/tier.h"
#include "store.h"

/* also declared by the generated registry (tier_registry.c) */
extern const struct umbp_tier_ops umbp_tier_loopback_ops;

struct loopback_config {
    int64_t map_one_in;
};

#define CFG(field) offsetof(struct loopback_config, field)

static const struct umbp_option loopback_options[] = {
    { .name = "loopback_map_one_in", .type = UMBP_OPT_INT, .offset = CFG(map_one_in),
      .def = "0", .min = 0, .max = 1024,
      .help = "loopback tier (tests): 0 maps no region, so every byte moves through the "
              "tier's read/write; n maps the regions of keys whose hash is a multiple of n "
              "(1: all)" },
    { .name = NULL },
};

/* One read or write, from the loop to the mover thread and back. */
struct loopback_move {
    struct loopback_move *next;
    char *obj;                 /* the region's bytes in the pool */
    const umbp_range_t *ranges;
    size_t n;
    bool to_object;            /* write */
    int rc;
    umbp_tier_done_fn done;
    void *arg;
};

struct loopback_tier {
    struct umbp_tier base;
    struct loopback_config cfg;
    struct dram_store *store;
    char *pool; /* private: never handed out unless a key is mapped */

    /* the mover threads and their queues (under lock) */
    pthread_t *movers;
    int nmovers;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct loopback_move *todo, *todo_tail; /* loop -> mover, in order */
    struct loopback_move *moved;            /* mover -> loop */
    unsigned busy;                          /* moves being copied */
    bool quit;
    ev_async moved_w;                       /* the mover rings the loop */

    /* memory the engine registered (mem_register, the caller's thread;
     * read by usage on the loop thread) */
    _Atomic uint64_t reg_bytes, reg_regions;
};

/* One registered region: what a NIC tier would keep (its memory key). */
struct loopback_reg {
    void *addr;
    size_t len;
};

static struct loopback_tier *to_loopback(struct umbp_tier *t)
{
    return umbp_container_of(t, struct loopback_tier, base);
}

static void store_emit(void *ctx, umbp_event_type_t type, const umbp_key_t *key,
                       uint64_t size)
{
    (void)size;
    struct loopback_tier *lt = ctx;
    if (lt->base.env.emit_event)
        lt->base.env.emit_event(lt->base.env.ctx, type, key);
}

static void store_space_freed(void *ctx)
{
    struct loopback_tier *lt = ctx;
    if (lt->base.env.space_freed)
        lt->base.env.space_freed(lt->base.env.ctx);
}

/* ---- the mover thread ------------------------------------------------- */

static void *mover_main(void *arg)
{
    struct loopback_tier *lt = arg;
    pthread_mutex_lock(&lt->lock);
    for (;;) {
        while (!lt->todo && !lt->quit)
            pthread_cond_wait(&lt->wake, &lt->lock);
        if (lt->quit)
            break; /* stop completes what is still queued */
        struct loopback_move *m = lt->todo;
        lt->todo = m->next;
        if (!lt->todo)
            lt->todo_tail = NULL;
        lt->busy++;
        pthread_mutex_unlock(&lt->lock);
        for (size_t i = 0; i < m->n; i++) {
            const umbp_range_t *rg = &m->ranges[i];
            if (m->to_object)
                memcpy(m->obj + rg->offset, rg->ptr, rg->len);
            else
                memcpy(rg->ptr, m->obj + rg->offset, rg->len);
        }
        pthread_mutex_lock(&lt->lock);
        lt->busy--;
        m->next = lt->moved;
        lt->moved = m;
        pthread_cond_broadcast(&lt->wake); /* stop may wait for busy */
        ev_async_send(lt->base.env.loop, &lt->moved_w);
    }
    pthread_mutex_unlock(&lt->lock);
    return NULL;
}

/* Loop thread: done for every move the mover finished. */
static void on_moved(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)loop, (void)revents;
    struct loopback_tier *lt = w->data;
    pthread_mutex_lock(&lt->lock);
    struct loopback_move *m = lt->moved;
    lt->moved = NULL;
    pthread_mutex_unlock(&lt->lock);
    while (m) {
        struct loopback_move *next = m->next;
        m->done(m->arg, m->rc);
        free(m);
        m = next;
    }
}

/* Loop thread (or destroy's, with the loop stopped): the moves not started
 * fail, the one being copied ends, then every finished one completes. */
static void loopback_stop(struct umbp_tier *t)
{
    struct loopback_tier *lt = to_loopback(t);
    if (!lt->nmovers)
        return;
    pthread_mutex_lock(&lt->lock);
    lt->quit = true;
    pthread_cond_broadcast(&lt->wake);
    struct loopback_move *todo = lt->todo;
    lt->todo = lt->todo_tail = NULL;
    while (lt->busy)
        pthread_cond_wait(&lt->wake, &lt->lock);
    pthread_mutex_unlock(&lt->lock);
    for (int i = 0; i < lt->nmovers; i++)
        pthread_join(lt->movers[i], NULL);
    lt->nmovers = 0;
    while (todo) {
        struct loopback_move *next = todo->next;
        todo->done(todo->arg, UMBP_E_NOT_ATTEMPTED);
        free(todo);
        todo = next;
    }
    on_moved(lt->base.env.loop, &lt->moved_w, 0);
    ev_async_stop(lt->base.env.loop, &lt->moved_w);
}

/* ---- configuration and lifetime --------------------------------------- */

static void loopback_destroy(struct umbp_tier *t)
{
    if (!t)
        return;
    struct loopback_tier *lt = to_loopback(t);
    loopback_stop(t);
    pthread_cond_destroy(&lt->wake);
    pthread_mutex_destroy(&lt->lock);
    free(lt->movers);
    dram_store_destroy(lt->store);
    free(lt);
}

static int loopback_create(const struct umbp_tier_env *env, const void *cfg,
                           struct umbp_tier **out, char *err, size_t errlen)
{
    if (env->capacity_bytes == 0) {
        snprintf(err, errlen, "capacity_bytes is 0: the loopback tier needs a pool; set "
                 "capacity_bytes or total_capacity_bytes");
        return -EINVAL;
    }
    struct loopback_tier *lt = calloc(1, sizeof(*lt));
    if (!lt) {
        snprintf(err, errlen, "loopback tier: out of memory for its metadata");
        return -ENOMEM;
    }
    lt->base.ops = &umbp_tier_loopback_ops;
    lt->base.env = *env;
    lt->cfg = *(const struct loopback_config *)cfg;
    if (lt->cfg.map_one_in == 1) /* every region mapped: the memcpy mover */
        umbp_tier_set_caps(&lt->base, umbp_tier_loopback_ops.caps | UMBP_TIER_CAP_MAPPED);
    /* the documented default watermarks (the dram tier's options) */
    struct dram_store_params p = {
        .pool = {.capacity = env->capacity_bytes, .numa_node = -1},
        .capacity = env->capacity_bytes,
        .high_watermark = 0.9,
        .low_watermark = 0.7,
        .emit_event = store_emit,
        .space_freed = store_space_freed,
        .ctx = lt,
    };
    int rc = dram_store_create(&p, &lt->store, err, errlen);
    if (rc < 0) {
        free(lt);
        return rc;
    }
    lt->pool = dram_store_pool(lt->store)->base;
    pthread_mutex_init(&lt->lock, NULL);
    pthread_cond_init(&lt->wake, NULL);
    ev_async_init(&lt->moved_w, on_moved);
    lt->moved_w.data = lt;
    ev_async_start(env->loop, &lt->moved_w);
    int want = env->core->copy_threads > 0 ? (int)env->core->copy_threads : 1;
    if (!(lt->movers = calloc((size_t)want, sizeof(*lt->movers))))
        rc = -ENOMEM;
    for (int i = 0; rc == 0 && i < want; i++)
        if ((rc = -pthread_create(&lt->movers[i], NULL, mover_main, lt)) == 0)
            lt->nmovers++;
    if (rc < 0) {
        snprintf(err, errlen, "loopback tier: cannot start %d mover threads (copy_threads): "
                 "%s", want, strerror(-rc));
        loopback_stop(&lt->base); /* joins those that started */
        ev_async_stop(env->loop, &lt->moved_w);
        loopback_destroy(&lt->base);
        return rc;
    }
    *out = &lt->base;
    return 0;
}

/* A region: the pool offset in aux[0]; an address only for mapped keys. */
static struct umbp_region to_region(const struct loopback_tier *lt, const umbp_key_t *key,
                                    const struct dram_store_region *r)
{
    int64_t n = lt->cfg.map_one_in;
    bool mapped = n > 0 && umbp_key_hash(key) % (uint64_t)n == 0;
    return (struct umbp_region){
        .addr = mapped ? lt->pool + r->offset : NULL,
        .size = r->size,
        .token = r->token,
        .aux = {r->offset, 0},
    };
}

/* ---- lookup, reserve, publish, abort ---------------------------------- */

static void loopback_lookup(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                            uint8_t *present, bool touch, umbp_tier_done_fn done, void *arg)
{
    struct loopback_tier *lt = to_loopback(t);
    for (size_t i = 0; i < n; i++)
        present[i] = dram_store_lookup(lt->store, &reqs[i]->key, touch);
    done(arg, 0);
}

static void loopback_reserve(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                             umbp_tier_done_fn done, void *arg)
{
    struct loopback_tier *lt = to_loopback(t);
    for (size_t i = 0; i < n; i++) {
        struct dram_store_region r;
        reqs[i]->status = dram_store_reserve(lt->store, &reqs[i]->key, reqs[i]->size, &r);
        if (reqs[i]->status == 0)
            reqs[i]->region = to_region(lt, &reqs[i]->key, &r);
    }
    done(arg, 0);
}

static void loopback_publish(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                             umbp_tier_done_fn done, void *arg)
{
    struct loopback_tier *lt = to_loopback(t);
    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == 0) /* else not reserved: never made visible */
            reqs[i]->status =
                dram_store_publish(lt->store, &reqs[i]->key, reqs[i]->region.token);
    done(arg, 0);
}

static void loopback_abort(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n)
{
    struct loopback_tier *lt = to_loopback(t);
    for (size_t i = 0; i < n; i++)
        dram_store_abort(lt->store, &reqs[i]->key, reqs[i]->region.token);
}

/* ---- leases ----------------------------------------------------------- */

static void loopback_acquire(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                             uint64_t lease_ttl_ms, umbp_tier_done_fn done, void *arg)
{
    struct loopback_tier *lt = to_loopback(t);
    uint64_t now = umbp_now_ns();
    uint64_t ttl_ns = lease_ttl_ms > UINT64_MAX / 1000000 ? UINT64_MAX : lease_ttl_ms * 1000000;
    for (size_t i = 0; i < n; i++) {
        struct dram_store_region r;
        reqs[i]->status = dram_store_acquire(lt->store, &reqs[i]->key, now, ttl_ns, &r);
        if (reqs[i]->status == 0)
            reqs[i]->region = to_region(lt, &reqs[i]->key, &r);
    }
    done(arg, 0);
}

static void loopback_release(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                             umbp_tier_done_fn done, void *arg)
{
    struct loopback_tier *lt = to_loopback(t);
    uint64_t freed = 0;
    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == 0) /* else acquire failed: no lease */
            reqs[i]->status = dram_store_release(lt->store, reqs[i]->region.token, &freed);
    if (freed)
        store_space_freed(lt);
    done(arg, 0);
}

static void loopback_expire_leases(struct umbp_tier *t, uint64_t now_ns)
{
    dram_store_expire_leases(to_loopback(t)->store, now_ns);
}

/* ---- moving the bytes (regions with addr == NULL) ---------------------- */

/* The pool bytes of ranges of region r, or -EINVAL: r is mapped (the
 * runtime copies those itself) or a range leaves the region. */
static int check_ranges(const struct umbp_region *r, const umbp_range_t *rg, size_t n)
{
    if (r->addr)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (rg[i].offset > r->size || rg[i].len > r->size - rg[i].offset)
            return -EINVAL;
    return 0;
}

/* Queues a move for the mover thread; done comes later, from on_moved. */
static void move_queue(struct loopback_tier *lt, const struct umbp_region *r,
                       const umbp_range_t *rg, size_t n, bool to_object,
                       umbp_tier_done_fn done, void *arg)
{
    int rc = check_ranges(r, rg, n);
    struct loopback_move *m = rc == 0 && !lt->quit ? malloc(sizeof(*m)) : NULL;
    if (!m) {
        done(arg, rc < 0 ? rc : lt->quit ? UMBP_E_NOT_ATTEMPTED : -ENOMEM);
        return;
    }
    *m = (struct loopback_move){.obj = lt->pool + r->aux[0], .ranges = rg, .n = n,
                                .to_object = to_object, .done = done, .arg = arg};
    pthread_mutex_lock(&lt->lock);
    if (lt->todo_tail)
        lt->todo_tail->next = m;
    else
        lt->todo = m;
    lt->todo_tail = m;
    pthread_cond_signal(&lt->wake);
    pthread_mutex_unlock(&lt->lock);
}

static void loopback_read(struct umbp_tier *t, const struct umbp_region *r,
                          const umbp_range_t *rg, size_t n, umbp_tier_done_fn done, void *arg)
{
    move_queue(to_loopback(t), r, rg, n, false, done, arg);
}

static void loopback_write(struct umbp_tier *t, const struct umbp_region *r,
                           const umbp_range_t *rg, size_t n, umbp_tier_done_fn done, void *arg)
{
    move_queue(to_loopback(t), r, rg, n, true, done, arg);
}

/* ---- eviction, clear, usage ------------------------------------------- */

static uint64_t loopback_evict(struct umbp_tier *t, uint64_t target_bytes, uint64_t want_free_run,
                               size_t max_objects, bool *more)
{
    return dram_store_evict(to_loopback(t)->store, target_bytes, want_free_run, max_objects,
                            more);
}

static void loopback_clear(struct umbp_tier *t, umbp_tier_done_fn done, void *arg)
{
    dram_store_clear(to_loopback(t)->store);
    done(arg, 0);
}

static void loopback_usage(struct umbp_tier *t, struct umbp_tier_usage *out)
{
    struct loopback_tier *lt = to_loopback(t);
    dram_store_usage(lt->store, out);
    out->mem_registered_bytes = atomic_load_explicit(&lt->reg_bytes, memory_order_relaxed);
    out->mem_registered_regions = atomic_load_explicit(&lt->reg_regions, memory_order_relaxed);
}

/* ---- registered memory (the caller's thread) ----------------------------- */

/* A NIC tier registers the region here (ibv_reg_mr) and keeps its key; this
 * one records it, so the conformance suite sees the runtime's calls in
 * usage. */
static int loopback_mem_register(struct umbp_tier *t, void *addr, size_t len,
                                 umbp_mem_kind_t kind, int device, void **handle)
{
    (void)kind, (void)device; /* host memory: the runtime refuses the rest */
    struct loopback_tier *lt = to_loopback(t);
    struct loopback_reg *g = malloc(sizeof(*g));
    if (!g)
        return -ENOMEM;
    *g = (struct loopback_reg){addr, len};
    atomic_fetch_add_explicit(&lt->reg_bytes, len, memory_order_relaxed);
    atomic_fetch_add_explicit(&lt->reg_regions, 1, memory_order_relaxed);
    *handle = g;
    return 0;
}

static void loopback_mem_deregister(struct umbp_tier *t, void *handle)
{
    struct loopback_tier *lt = to_loopback(t);
    struct loopback_reg *g = handle;
    atomic_fetch_sub_explicit(&lt->reg_bytes, g->len, memory_order_relaxed);
    atomic_fetch_sub_explicit(&lt->reg_regions, 1, memory_order_relaxed);
    free(g);
}

/* ---- the vtable ------------------------------------------------------- */

const struct umbp_tier_ops umbp_tier_loopback_ops = {
    .name = "loopback",
    /* no UMBP_TIER_CAP_MAPPED: regions are not mapped (unless
     * loopback_map_one_in = 1, see create) */
    .caps = UMBP_TIER_CAP_EVICTS_LOCALLY | UMBP_TIER_CAP_EXPIRES_LEASES,
    .options = loopback_options,
    .config_size = sizeof(struct loopback_config),
    .create = loopback_create,
    .destroy = loopback_destroy,
    .stop = loopback_stop,
    .lookup = loopback_lookup,
    .reserve = loopback_reserve,
    .publish = loopback_publish,
    .abort = loopback_abort,
    .acquire = loopback_acquire,
    .release = loopback_release,
    .clear = loopback_clear,
    .evict = loopback_evict,
    .usage = loopback_usage,
    .expire_leases = loopback_expire_leases,
    .read = loopback_read,
    .write = loopback_write,
    .mem_register = loopback_mem_register,
    .mem_deregister = loopback_mem_deregister,
    /* health, mapped_memory: the runtime's defaults (always healthy, no
     * pool for the GPU: its regions are not mapped) */
};
