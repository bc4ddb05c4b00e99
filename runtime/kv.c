/*
 * kv.c - the GPU KV path: registering the engine's KV tensors, and moving
 * whole blocks between GPU memory and pool objects with the GPU copy engine.
 *
 * The GPU engine is created, and the tier's pool pinned and mapped for it
 * (slow: it pins every page), on the first umbp_kv_register, on the caller's
 * thread: registration happens when the engine starts up, off the critical
 * path.  A mutex guards creation and the layout table.
 *
 * Transfers reuse the store and load actors unchanged: a store reserves
 * regions, then, instead of queueing memcpy jobs, gpu_dispatch() submits one
 * GPU transfer of every reserved key (block -> region) on the loop thread
 * (submission does not block) and hands the op to the waiter thread; the
 * waiter waits for the transfer and posts the op back (PUT_COPIED), after
 * which the keys are published.  The op completes only after the transfer, so
 * the engine never gets its GPU blocks back while they are still being read.
 * Loads acquire leases, restore region -> block, then release and validate.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "rt.h"
#include "tier_call.h"

/* blocks per transfer table that gpu_warm_transfers allocates: the engine's
 * first size, up to what a 64 Ki-token prefix of 16-token blocks needs */
#define WARM_BLOCKS_MIN 1024
#define WARM_BLOCKS_MAX 4096

/* ---- waiter thread -------------------------------------------------------- */

/* Posts op back to the loop with the transfer's result. */
static void kv_transfer_finished(struct umbp_runtime *rt, struct umbp_op *op, int rc)
{
    op->gpu_rc = rc;
    op->kv_done_ns = umbp_now_ns();
    umbp_gpu_xfer_release(op->xfer);
    op->xfer = NULL;
    rt_post(rt, &op->hdr); /* cannot fail: see rt.h */
}

/*
 * The waiter watches every transfer in flight, not only the oldest: a
 * restore submitted behind a store (or beside a store gated on the engine's
 * forward by its wait_event) finishes on its own lane while the store still
 * runs, and its op must complete then, not when the store does (a FIFO wait
 * reported a restore 4.6 ms late beside a 10,000-token store on an H200
 * host).  It tests each transfer without blocking, yield-spins through the
 * first 100 ms without progress (transfers of a prefix take 1-30 ms; a
 * sleep would add its timer slack to each), then naps 50 us at a time, and
 * sleeps on the queue's condition when nothing is in flight.
 */
static void *kv_waiter(void *arg)
{
    struct umbp_runtime *rt = arg;
    struct kv_state *kv = &rt->kv;
    struct umbp_op *head = NULL, **tail = &head; /* in flight, oldest first */
    uint64_t idle_since = 0;                     /* last progress */
    bool warned = false;
    for (;;) {
        pthread_mutex_lock(&kv->qlock);
        while (!head && !kv->qhead && !kv->quit)
            pthread_cond_wait(&kv->qcond, &kv->qlock);
        if (!head && !kv->qhead) { /* quit with nothing left */
            pthread_mutex_unlock(&kv->qlock);
            break;
        }
        if (kv->qhead) { /* take every newly submitted transfer */
            if (!head)
                idle_since = umbp_now_ns();
            *tail = kv->qhead;
            tail = &kv->qtail->gnext;
            kv->qhead = kv->qtail = NULL;
        }
        pthread_mutex_unlock(&kv->qlock);

        bool progress = false;
        for (struct umbp_op **pp = &head; *pp;) {
            struct umbp_op *op = *pp;
            int rc = umbp_gpu_xfer_test(op->xfer);
            if (rc == UMBP_E_INPROGRESS) {
                pp = &op->gnext;
                continue;
            }
            *pp = op->gnext;
            if (tail == &op->gnext)
                tail = pp;
            kv_transfer_finished(rt, op, rc);
            progress = true;
        }
        uint64_t now = umbp_now_ns();
        if (progress || !head) {
            idle_since = now;
            warned = false;
            continue;
        }
        /* Transfers finish in bounded time unless the device is wedged: log
         * once per stretch without progress longer than timeout_ms. */
        if (!warned && now - idle_since > ms_to_ns(rt->core->timeout_ms)) {
            umbp_log(UMBP_LOG_WARN, "GPU transfer running for over timeout_ms; still "
                     "waiting (the device may be wedged)");
            warned = true;
        }
        if (now - idle_since < ms_to_ns(100)) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static void kv_on_poll(struct ev_loop *loop, ev_idle *w, int revents) {}

void kv_transfer_done(struct umbp_runtime *rt)
{
    if (rt->kv.inflight && --rt->kv.inflight == 0)
        ev_idle_stop(rt->loop, &rt->kv.poll);
}

void kv_init(struct umbp_runtime *rt)
{
    struct kv_state *kv = &rt->kv;
    ev_idle_init(&kv->poll, kv_on_poll);
    pthread_mutex_init(&kv->lock, NULL);
    pthread_mutex_init(&kv->qlock, NULL);
    pthread_cond_init(&kv->qcond, NULL);
    kv->warm_store_rc = 1;
}

void kv_fini(struct umbp_runtime *rt)
{
    struct kv_state *kv = &rt->kv;
    if (kv->thread_started) {
        pthread_mutex_lock(&kv->qlock);
        kv->quit = true;
        pthread_cond_signal(&kv->qcond);
        pthread_mutex_unlock(&kv->qlock);
        pthread_join(kv->thread, NULL);
    }
    if (kv->warm_op) /* the loop is gone: the drain ended it, or nothing will */
        umbp_op_release(kv->warm_op);
    for (size_t i = 0; i < kv->n; i++)
        umbp_kv_layout_destroy(kv->v[i].layout);
    free(kv->v);
    if (kv->engine) {
        if (kv->pool_addr)
            umbp_gpu_host_unregister(kv->engine, kv->pool_addr);
        for (size_t i = 0; i < kv->nmore; i++)
            umbp_gpu_host_unregister(kv->engine, kv->more_pools[i]);
        umbp_gpu_engine_destroy(kv->engine);
    }
    pthread_mutex_destroy(&kv->lock);
    pthread_mutex_destroy(&kv->qlock);
    pthread_cond_destroy(&kv->qcond);
    memset(kv, 0, sizeof(*kv));
}

/* ---- engine ------------------------------------------------------------------ */

static int pick_backend(const char *name, umbp_gpu_backend_t *out)
{
    static const struct { const char *name; umbp_gpu_backend_t b; } fixed[] = {
        {"cuda", UMBP_GPU_BACKEND_CUDA}, {"hip", UMBP_GPU_BACKEND_HIP}, {"host", UMBP_GPU_BACKEND_HOST}};
    for (size_t i = 0; i < 3; i++)
        if (strcmp(name, fixed[i].name) == 0) {
            *out = fixed[i].b;
            return 0;
        }
    /* auto never falls back to "host": device pointers are not host memory */
    int n;
    if (umbp_gpu_backend_probe(UMBP_GPU_BACKEND_CUDA, &n) == 0) {
        *out = UMBP_GPU_BACKEND_CUDA;
        return 0;
    }
    if (umbp_gpu_backend_probe(UMBP_GPU_BACKEND_HIP, &n) == 0) {
        *out = UMBP_GPU_BACKEND_HIP;
        return 0;
    }
    umbp_set_error("gpu_backend: auto found no CUDA or HIP device (%s); "
                   "set gpu_backend to \"host\" only for tests without a GPU",
                   umbp_gpu_last_error());
    return -ENODEV;
}

/* gpu_store_method / gpu_restore_method: names the option table allows */
static umbp_gpu_method_t gpu_method(const char *name)
{
    if (strcmp(name, "kernel") == 0)
        return UMBP_GPU_METHOD_KERNEL;
    if (strcmp(name, "staged") == 0)
        return UMBP_GPU_METHOD_STAGED;
    if (strcmp(name, "dma") == 0)
        return UMBP_GPU_METHOD_DMA;
    return UMBP_GPU_METHOD_AUTO;
}

/* Caller's thread, kv->lock held. */
static int engine_start(struct umbp_runtime *rt)
{
    struct kv_state *kv = &rt->kv;
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    int rc = pick_backend(rt->core->gpu_backend, &cfg.backend);
    if (rc < 0)
        return rc;
    cfg.device = (int)rt->core->gpu_device;
    cfg.max_ctas = (uint32_t)rt->core->gpu_max_ctas;
    cfg.threads_per_cta = (uint32_t)rt->core->gpu_threads_per_cta;
    cfg.staging_bytes = rt->core->gpu_staging_bytes;
    cfg.store_method = gpu_method(rt->core->gpu_store_method);
    cfg.restore_method = gpu_method(rt->core->gpu_restore_method);
    if (!rt->core->gpu_l2_discard_staging)
        cfg.flags &= ~(uint32_t)UMBP_GPU_L2_DISCARD_STAGING;
    if (!rt->core->gpu_evict_first_restore)
        cfg.flags &= ~(uint32_t)UMBP_GPU_EVICT_FIRST_RESTORE;
    if (!rt->core->gpu_ramp_overlapped)
        cfg.flags &= ~(uint32_t)UMBP_GPU_RAMP_OVERLAPPED;
    if ((rc = umbp_gpu_engine_create(&cfg, &kv->engine)) < 0) {
        umbp_set_error("gpu_device %lld (%s): %s", (long long)rt->core->gpu_device,
                       umbp_gpu_backend_name(cfg.backend), umbp_gpu_last_error());
        return rc;
    }
    void *addr;
    size_t len;
    if ((rc = tier_mapped_memory(rt->tier, &addr, &len)) < 0) {
        umbp_set_error("tier %s cannot expose its pool to the GPU copy engine", rt->tier_name);
        goto fail;
    }
    if ((rc = umbp_gpu_host_register(kv->engine, addr, len)) < 0) {
        umbp_set_error("cannot register the %zu-byte pool with the GPU runtime: %s", len,
                       umbp_gpu_last_error());
        goto fail;
    }
    kv->pool_addr = addr;
    if ((rc = -pthread_create(&kv->thread, NULL, kv_waiter, rt)) < 0) {
        umbp_set_error("cannot start the GPU waiter thread: %s", umbp_strerror(rc));
        goto fail;
    }
    kv->thread_started = true;
    char name[64];
    umbp_gpu_engine_device_name(kv->engine, name, sizeof(name));
    umbp_log(UMBP_LOG_INFO, "GPU copy engine on %s (%s device %lld), pool of %zu bytes pinned",
             name, umbp_gpu_backend_name(cfg.backend), (long long)rt->core->gpu_device, len);
    return 0;
fail:
    if (kv->pool_addr)
        umbp_gpu_host_unregister(kv->engine, kv->pool_addr);
    kv->pool_addr = NULL;
    umbp_gpu_engine_destroy(kv->engine);
    kv->engine = NULL;
    return rc;
}

/* ---- registration ------------------------------------------------------------ */

static int kv_submit(umbp_runtime_t *rt, umbp_kv_handle_t h, const umbp_kv_block_t *blocks,
                     size_t n, bool store, const umbp_kv_xfer_opts_t *opts, bool warm,
                     umbp_op_t **out);

/* gpu_warm_store: the whole store path once per object size
 * (warm_store_due), off the critical path.  Even with every table, op and
 * kernel warmed (gpu_warm_transfers) and the server's session made ready
 * at HELLO, a process's first store of a
 * 328 MB prefix ran 1-1.5 points of the pinned copy's speed below the
 * later ones on an H200 host; one real one-block store before it removed
 * that (docs/benchmarks.md).  This one stores block 0 of the new cache (the
 * GPU's bytes are only read) under a random key and drops the reservation
 * instead of publishing it: no object appears, so no lookup finds it and no
 * event or eviction follows; it counts nothing, never waits for space nor
 * evicts for it in this runtime (a server makes room for a reservation as
 * for any other, at most one object), and a failure is logged, not
 * returned: the first real store then pays what this would have. */
#define WARM_STORE_WAIT_MS 1000

/* Waits for the warm-up store registration left running, if any (of handle
 * h; 0: of any), and releases it: true when none is left.  Caller's thread,
 * kv->lock not held: the op completes through the loop and the waiter
 * thread.  It ends by its deadline (timeout_ms) plus the GPU's copy of one
 * block; wait false looks only, and a wait past twice that keeps it (and
 * its layout: never freed under it). */
static bool kv_warm_reap(struct umbp_runtime *rt, umbp_kv_handle_t h, bool wait)
{
    struct kv_state *kv = &rt->kv;
    pthread_mutex_lock(&kv->lock);
    umbp_op_t *op = kv->warm_op;
    if (op && h && kv->warm_handle != h)
        op = NULL;
    if (op)
        kv->warm_op = NULL;
    pthread_mutex_unlock(&kv->lock);
    if (!op)
        return true;
    int64_t bound = wait ? 2 * rt->core->timeout_ms + WARM_STORE_WAIT_MS : 0;
    if (umbp_op_wait(op, bound > INT32_MAX ? INT32_MAX : (int)bound) != 0) {
        if (wait)
            umbp_log(UMBP_LOG_WARN, "gpu_warm_store: the warm-up store still runs after %lld "
                     "ms; its cache's layout is kept", (long long)bound);
        pthread_mutex_lock(&kv->lock);
        kv->warm_op = op;
        kv->warm_handle = h ? h : kv->warm_handle;
        pthread_mutex_unlock(&kv->lock);
        return false;
    }
    umbp_op_release(op);
    return true;
}

static void kv_warm_store(struct umbp_runtime *rt, umbp_kv_handle_t h)
{
    umbp_kv_block_t b = {.block = 0};
    if (getrandom(&b.key, sizeof(b.key), GRND_NONBLOCK) != (ssize_t)sizeof(b.key))
        return;
    if (!kv_warm_reap(rt, 0, false))
        return; /* the last one still runs (a stalled server): this one would too */
    umbp_op_t *op;
    int rc = kv_submit(rt, h, &b, 1, true, NULL, true, &op);
    if (rc == 0) {
        /* a server stopped just now holds registration up a second at most;
         * the op then runs on (by its own deadline), kept until reaped */
        if ((rc = umbp_op_wait(op, WARM_STORE_WAIT_MS)) == 0) {
            rc = umbp_op_key_status(op, 0);
            umbp_op_release(op);
        } else {
            pthread_mutex_lock(&rt->kv.lock);
            rt->kv.warm_op = op;
            rt->kv.warm_handle = h;
            pthread_mutex_unlock(&rt->kv.lock);
        }
    }
    rt->kv.warm_store_rc = rc;
    if (rc < 0)
        umbp_log(UMBP_LOG_INFO, "gpu_warm_store: the warm-up store did not run (%s); the "
                 "first store pays its first-time costs", umbp_strerror(rc));
}

/* Caller's thread, kv->lock held.  The warm-up store runs once per object
 * size: a hybrid model registers a cache per group (attention groups, Mamba
 * state), and each size's warm-up names it to a tier that reserves ahead
 * (reserve_ahead), which then holds spares of that size before its first
 * store instead of from it on.  A second cache of a known size warms
 * nothing new. */
static bool warm_store_due(struct kv_state *kv, const umbp_kv_layout_t *layout)
{
    uint64_t size = umbp_kv_layout_object_size(layout);
    size_t cap = sizeof(kv->warm_sizes) / sizeof(kv->warm_sizes[0]);
    for (size_t i = 0; i < kv->nwarm; i++)
        if (kv->warm_sizes[i] == size)
            return false;
    if (kv->nwarm == cap)
        return false;
    kv->warm_sizes[kv->nwarm++] = size;
    return true;
}

int umbp_kv_register(umbp_runtime_t *rt, const struct umbp_kv_tensor *tensors, uint32_t n,
                     umbp_kv_handle_t *out)
{
    if (!rt || !tensors || !n || !out)
        return -EINVAL;
    struct kv_state *kv = &rt->kv;
    int rc = 0;
    pthread_mutex_lock(&kv->lock);
    if (!kv->engine && (rc = engine_start(rt)) < 0)
        goto out;
    if (kv->n == kv->cap) {
        size_t cap = kv->cap ? kv->cap * 2 : 4;
        struct kv_entry *v = realloc(kv->v, cap * sizeof(*v));
        if (!v) {
            rc = -ENOMEM;
            goto out;
        }
        kv->v = v;
        kv->cap = cap;
    }
    umbp_kv_layout_t *layout;
    if ((rc = umbp_kv_layout_create(kv->engine, tensors, n, &layout)) < 0) {
        umbp_set_error("umbp_kv_register: %s", umbp_gpu_last_error());
        goto out;
    }
    if (!kv->warmed && rt->core->gpu_warm_transfers > 0) {
        /* off the critical path: the first store and restore of the process
         * would otherwise allocate these tables and load the kernel */
        uint64_t nb = umbp_kv_layout_num_blocks(layout);
        size_t blocks = nb < WARM_BLOCKS_MIN ? WARM_BLOCKS_MIN
                        : nb > WARM_BLOCKS_MAX ? WARM_BLOCKS_MAX : (size_t)nb;
        if (umbp_gpu_engine_warm(kv->engine, blocks, (unsigned)rt->core->gpu_warm_transfers) < 0)
            umbp_log(UMBP_LOG_WARN, "gpu_warm_transfers: warming the GPU copy engine failed "
                     "(%s); its first transfers allocate instead", umbp_gpu_last_error());
        /* and the ops those transfers' batches take first: on first use a
         * 600-key op grew a dozen arrays and faulted their pages in */
        if (op_pool_warm(rt, (size_t)rt->core->gpu_warm_transfers, blocks) < 0)
            umbp_log(UMBP_LOG_WARN, "gpu_warm_transfers: no memory to size the first ops "
                     "for %zu keys; their first batches allocate instead", blocks);
        kv->warmed = true;
    }
    bool warm_store = rt->core->gpu_warm_store && warm_store_due(kv, layout);
    kv->v[kv->n] = (struct kv_entry){++kv->next_handle, layout, 0};
    *out = kv->v[kv->n].handle;
    kv->n++;
    pthread_mutex_unlock(&kv->lock);
    if (warm_store)
        kv_warm_store(rt, *out);
    return 0;
out:
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

/* h's layout; busy: counted busy until kv_unbusy (a transfer's). */
static umbp_kv_layout_t *find_layout_busy(struct umbp_runtime *rt, umbp_kv_handle_t h, bool busy)
{
    umbp_kv_layout_t *l = NULL;
    pthread_mutex_lock(&rt->kv.lock);
    for (size_t i = 0; i < rt->kv.n; i++)
        if (rt->kv.v[i].handle == h) {
            l = rt->kv.v[i].layout;
            rt->kv.v[i].busy += busy;
        }
    pthread_mutex_unlock(&rt->kv.lock);
    return l;
}

static umbp_kv_layout_t *find_layout(struct umbp_runtime *rt, umbp_kv_handle_t h)
{
    return find_layout_busy(rt, h, false);
}

void kv_unbusy(struct umbp_runtime *rt, umbp_kv_layout_t *l)
{
    pthread_mutex_lock(&rt->kv.lock);
    for (size_t i = 0; i < rt->kv.n; i++)
        if (rt->kv.v[i].layout == l && rt->kv.v[i].busy)
            rt->kv.v[i].busy--;
    pthread_mutex_unlock(&rt->kv.lock);
}

int umbp_kv_deregister(umbp_runtime_t *rt, umbp_kv_handle_t h)
{
    if (!rt)
        return -EINVAL;
    struct kv_state *kv = &rt->kv;
    int rc = -ENOENT;
    bool keep = h && !kv_warm_reap(rt, h, true); /* the warm-up reads the layout */
    pthread_mutex_lock(&kv->lock);
    for (size_t i = 0; i < kv->n; i++) {
        if (kv->v[i].handle != h)
            continue;
        if (kv->v[i].busy) {
            umbp_set_answer("umbp_kv_deregister: %u transfers on this KV cache are in flight "
                           "(waited for or not, released or not); wait for their ops to "
                           "complete first", kv->v[i].busy);
            rc = -EBUSY;
            break;
        }
        if (!keep)
            umbp_kv_layout_destroy(kv->v[i].layout);
        kv->v[i] = kv->v[--kv->n];
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

uint64_t umbp_kv_object_size(umbp_runtime_t *rt, umbp_kv_handle_t h)
{
    umbp_kv_layout_t *l = rt ? find_layout(rt, h) : NULL;
    return l ? umbp_kv_layout_object_size(l) : 0;
}

/* ---- a new pool ------------------------------------------------------------ */

void tier_mapping_changed(void *ctx)
{
    struct umbp_runtime *rt = ctx;
    atomic_store(&rt->kv.remap, true);
}

/* A registration of a new pool that failed is tried again this long after
 * (each try pins, slow; transfers into that pool fail meanwhile). */
#define REMAP_RETRY_NS 1000000000ull

/* Caller's thread, before a KV transfer: the tier now hands out regions of
 * another mapping (a restarted server's new pool).  Registers it with the
 * GPU runtime (slow: it pins every page, once per new pool); the old one
 * stays registered, since transfers may still be using it.  A registration
 * that fails (pinned memory short while the old pool is still pinned) is
 * tried again at a later transfer, a second after, not never. */
static void kv_remap(struct umbp_runtime *rt)
{
    struct kv_state *kv = &rt->kv;
    if (!atomic_load(&kv->remap) || !atomic_exchange(&kv->remap, false))
        return;
    pthread_mutex_lock(&kv->lock);
    uint64_t now = umbp_now_ns();
    if (now < kv->remap_retry_ns) { /* not yet: the flag stays up */
        atomic_store(&kv->remap, true);
        pthread_mutex_unlock(&kv->lock);
        return;
    }
    void *addr;
    size_t len;
    bool known = false;
    if (kv->engine && tier_mapped_memory(rt->tier, &addr, &len) == 0) {
        known = addr == kv->pool_addr;
        for (size_t i = 0; i < kv->nmore; i++)
            known = known || addr == kv->more_pools[i];
        if (!known && kv->nmore == sizeof(kv->more_pools) / sizeof(kv->more_pools[0]))
            umbp_log(UMBP_LOG_WARN, "the pool changed more than %zu times; its newest mapping "
                     "is not registered with the GPU (KV transfers fail until restart)",
                     kv->nmore);
        else if (!known && umbp_gpu_host_register(kv->engine, addr, len) < 0) {
            umbp_log(UMBP_LOG_WARN, "cannot register the new %zu-byte pool with the GPU "
                     "runtime: %s; KV transfers into it fail (their blocks recomputed) and "
                     "it is tried again in %llu ms", len, umbp_gpu_last_error(),
                     (unsigned long long)(REMAP_RETRY_NS / 1000000));
            kv->remap_retry_ns = now + REMAP_RETRY_NS;
            atomic_store(&kv->remap, true);
        } else if (!known) {
            kv->more_pools[kv->nmore++] = addr;
            umbp_log(UMBP_LOG_INFO, "registered the new %zu-byte pool with the GPU", len);
        }
    }
    pthread_mutex_unlock(&kv->lock);
}

/* ---- transfers ------------------------------------------------------------ */

/* Fills op (already sized for n keys) with blocks[0, n). */
static void kv_fill(struct umbp_op *op, umbp_kv_layout_t *l, const umbp_kv_block_t *blocks,
                    size_t n, uint32_t first, uint32_t count, void *wait_event)
{
    uint64_t size = umbp_kv_layout_object_size(l);
    for (size_t k = 0; k < n; k++) {
        memset(&op->reqs[k], 0, sizeof(op->reqs[k]));
        op->reqs[k].key = blocks[k].key;
        op->reqs[k].size = size;
        op->kv_block[k] = blocks[k].block;
        op->state[k] = KEY_TODO;
        op->status[k] = UMBP_E_INPROGRESS;
        op->range_first[k] = 0;
    }
    op->range_first[n] = 0;
    op->kv_layout = l;
    op->kv_first_layer = first;
    op->kv_num_layers = count;
    op->kv_wait_event = wait_event;
}

static int kv_check(umbp_kv_layout_t *l, const umbp_kv_block_t *blocks, size_t n, bool store,
                    uint32_t first, uint32_t count)
{
    uint64_t span_off, span_len;
    if (store && (first || (count && count != umbp_kv_layout_num_layers(l))))
        return UMBP_E_SHAPE; /* an object is written whole */
    if (umbp_kv_layout_layer_span(l, first, count, &span_off, &span_len) < 0)
        return UMBP_E_SHAPE;
    uint64_t nblocks = umbp_kv_layout_num_blocks(l);
    for (size_t k = 0; k < n; k++)
        if (blocks[k].block >= nblocks)
            return UMBP_E_SHAPE;
    return 0;
}

static int kv_submit(umbp_runtime_t *rt, umbp_kv_handle_t h, const umbp_kv_block_t *blocks,
                     size_t n, bool store, const umbp_kv_xfer_opts_t *opts, bool warm,
                     umbp_op_t **out)
{
    if (!rt || !blocks || !n || !out || n > (1u << 24))
        return -EINVAL;
    /* busy from here: a deregistration meanwhile is refused, not freeing
     * the layout under this transfer; the caller's warm-up loads count too
     * (a binding may stop waiting for one), the registration's warm-up store
     * is kept apart (kv_warm_reap) */
    bool busy = !(warm && store);
    umbp_kv_layout_t *l = find_layout_busy(rt, h, busy);
    if (!l)
        return -ENOENT;
    uint32_t first = opts ? opts->first_layer : 0, count = opts ? opts->num_layers : 0;
    void *ev = opts ? opts->wait_event : NULL;
    int rc = kv_check(l, blocks, n, store, first, count);
    if (rc == 0 && atomic_load(&rt->closing))
        rc = UMBP_E_NOT_ATTEMPTED;
    if (rc < 0) {
        if (busy)
            kv_unbusy(rt, l);
        return rc;
    }
    kv_remap(rt);
    enum op_kind kind = store ? OP_PUT : OP_GET;
    /* Stores are sliced: reserving and publishing one slice overlaps the
     * copy of another.  A load from a remote tier (the server's acquire is
     * a round trip) of at least 8 heads that finds nothing else in flight
     * starts with a head of gpu_load_head_blocks keys: its copy starts as
     * soon as the head's leases are granted and overlaps the acquire of the
     * rest, the second and last child.  The second transfer costs a
     * pipeline fill and drain (about 40 us on an H200 host), which the
     * acquire of fewer keys does not win back, and with other work in flight
     * the GPU is busy anyway; more load slices would each pay one
     * (docs/benchmarks.md).
     *
     * A store's first slice is half a slice (`lead`): its reservation and
     * launch, which nothing overlaps, take half as long, and in standalone
     * mode a first store's first two transfers (the binding's head of 32
     * and this one) fit the spares a worker holds (256 objects of 512 KiB
     * by default), where a whole slice of 256 would wait for a round trip. */
    size_t slice = store ? (size_t)rt->core->gpu_store_slice_blocks : 0;
    size_t lead = (slice + 1) / 2;
    size_t nchild = slice && n > slice ? 1 + (n - lead + slice - 1) / slice : 0;
    size_t head = 0;
    if (!store && (tier_caps(rt->tier) & UMBP_TIER_CAP_REMOTE) &&
        atomic_load_explicit(&rt->inflight, memory_order_relaxed) == 0)
        head = (size_t)rt->core->gpu_load_head_blocks;
    /* At most a quarter of the op pool (and 64) as children, so a parent and
     * its children always fit a pool that is not busy; the slice grows to
     * match.  Fewer than two children is no split at all. */
    size_t max_children = (size_t)rt->core->max_inflight_ops / 4;
    if (max_children > 64)
        max_children = 64;
    if (nchild > max_children) { /* whole slices only, grown to fit */
        slice = max_children ? (n + max_children - 1) / max_children : n;
        lead = slice;
        nchild = (n + slice - 1) / slice;
    }
    if (head && n >= 8 * head && max_children >= 2) {
        nchild = 2;
        slice = lead = head; /* child 0: [0, head), child 1: [head, n) */
    }
    if (nchild < 2)
        nchild = 0;
    struct umbp_op *op = op_get(rt, kind), *child[64];
    size_t got = 0;
    if (!op) {
        if (busy)
            kv_unbusy(rt, l);
        return -EAGAIN;
    }
    op->kv_xfer = true;
    op->warm = warm;
    op->kv_busy = busy ? l : NULL;
    if (op_reserve_keys(op, n, 0) < 0) {
        rc = -ENOMEM;
        goto fail;
    }
    /* a parent split into children only collects their statuses: its keys
     * are checked for duplicates where the caller holds them, not copied */
    if (!nchild)
        kv_fill(op, l, blocks, n, first, count, ev);
    if ((rc = umbp_keys_check_duplicates(op, &blocks[0].key, sizeof(*blocks), n)) < 0)
        goto fail;
    for (; got < nchild; got++) {
        size_t base = got ? lead + (got - 1) * slice : 0, want = got ? slice : lead;
        size_t m = n - base < want ? n - base : want;
        if (head && got + 1 == nchild)
            m = n - base; /* a load's tail: everything after the head */
        if (!(child[got] = op_get(rt, kind))) {
            rc = -EAGAIN;
            goto fail;
        }
        if (op_reserve_keys(child[got], m, 0) < 0) {
            got++;
            rc = -ENOMEM;
            goto fail;
        }
        kv_fill(child[got], l, blocks + base, m, first, count, ev);
        child[got]->kv_xfer = true; /* they reserve: the hint goes with them */
        child[got]->warm = warm;
        child[got]->parent = op;
        child[got]->parent_base = base;
    }
    atomic_store(&op->children_left, (uint32_t)nchild);
    /* The mailbox has room for every op of the pool, so posting the
     * children (or the op itself) cannot fail once they are taken. */
    struct msg_hdr *msgs[64];
    for (size_t c = 0; c < nchild; c++) {
        child[c]->hdr.type = store ? MSG_PUT_SUBMIT : MSG_GET_SUBMIT;
        msgs[c] = &child[c]->hdr;
    }
    rt_post_many(rt, msgs, nchild);
    if (!nchild) {
        op->hdr.type = store ? MSG_PUT_SUBMIT : MSG_GET_SUBMIT;
        rt_post(rt, &op->hdr);
    }
    *out = op;
    return 0;
fail:
    for (size_t c = 0; c < got; c++)
        op_abandon(child[c]);
    if (op->kv_busy)
        kv_unbusy(rt, op->kv_busy);
    op->kv_busy = NULL;
    op_abandon(op);
    return rc;
}

int umbp_kv_store(umbp_runtime_t *rt, umbp_kv_handle_t kv, const umbp_kv_block_t *blocks,
                  size_t n, const umbp_kv_xfer_opts_t *opts, umbp_op_t **op)
{
    return kv_submit(rt, kv, blocks, n, true, opts, false, op);
}

int umbp_kv_load(umbp_runtime_t *rt, umbp_kv_handle_t kv, const umbp_kv_block_t *blocks,
                 size_t n, const umbp_kv_xfer_opts_t *opts, umbp_op_t **op)
{
    return kv_submit(rt, kv, blocks, n, false, opts, false, op);
}

int umbp_kv_warm_load(umbp_runtime_t *rt, umbp_kv_handle_t kv, const umbp_kv_block_t *blocks,
                      size_t n, const umbp_kv_xfer_opts_t *opts, umbp_op_t **op)
{
    return kv_submit(rt, kv, blocks, n, false, opts, true, op);
}

/* The desc flags of op's transfer: UMBP_KV_XFER_FOLLOWED for a slice of a
 * store with more slices after it, which kv_submit posts right behind it.
 * Not for a load's head: the rest of the load waits for its leases (a round
 * trip), so the head's end overlaps nothing and keeps its ramp-down. */
uint32_t kv_xfer_flags(const struct umbp_op *op)
{
    return op->kind == OP_PUT && op->parent && op->parent_base + op->n < op->parent->n
               ? UMBP_KV_XFER_FOLLOWED
               : 0;
}

void gpu_dispatch(struct umbp_op *op, enum msg_type then)
{
    struct umbp_runtime *rt = op->rt;
    size_t m = 0;
    for (size_t k = 0; k < op->n; k++)
        if (op->state[k] == KEY_COPYING)
            op->kv_io[m++] = (umbp_kv_block_io_t){op->kv_block[k], op->reqs[k].region.addr};
    umbp_kv_xfer_desc_t d = {
        .layout = op->kv_layout,
        .blocks = op->kv_io,
        .num_blocks = m,
        .first_layer = op->kv_first_layer,
        .num_layers = op->kv_num_layers,
        .wait_event = op->kv_wait_event,
        .flags = kv_xfer_flags(op),
    };
    op->hdr.type = (uint16_t)then;
    if (rt->kv.inflight++ == 0 && rt->may_spin)
        ev_idle_start(rt->loop, &rt->kv.poll);
    uint64_t t0 = umbp_now_ns();
    op->gpu_rc = op->kind == OP_PUT ? umbp_gpu_store(rt->kv.engine, &d, &op->xfer)
                                    : umbp_gpu_restore(rt->kv.engine, &d, &op->xfer);
    if (!op->kv_launch_ns) {
        op->kv_launch_ns = t0;
        op->kv_launched_ns = umbp_now_ns();
    }
    if (op->gpu_rc == -EAGAIN)
        op->gpu_rc = UMBP_E_NOT_ATTEMPTED; /* engine saturated: nothing moved */
    if (op->gpu_rc < 0) {
        umbp_log(UMBP_LOG_WARN, "GPU %s of %zu blocks not submitted: %s",
                 op->kind == OP_PUT ? "store" : "restore", m, umbp_gpu_last_error());
        rt_post(rt, &op->hdr);
        return;
    }
    struct kv_state *kv = &rt->kv;
    op->gnext = NULL;
    pthread_mutex_lock(&kv->qlock);
    if (kv->qtail)
        kv->qtail->gnext = op;
    else
        kv->qhead = op;
    kv->qtail = op;
    pthread_cond_signal(&kv->qcond);
    pthread_mutex_unlock(&kv->qlock);
}
