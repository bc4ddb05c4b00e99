/*
 * engine.c - the copy engine: submission of stores and restores, the three
 * ways of moving the bytes, completion, and registered host memory.
 *
 * Streams.  Each direction has a lane of its own streams (engine.h:
 * struct gpu_lane), so a restore's host-to-device copies run beside a
 * store's device-to-host ones on the full-duplex link; before lanes, a store
 * and a restore submitted together ran one after the other (0.53x of two
 * pinned copies run together on an H200).  Within a lane, kstream carries
 * kernels and the DMA method's copies, tstream a restore's block-table
 * upload (kstream waits for it);
 * cstream[0..copy_streams) carry the staged method's
 * copy-engine transfers, so that the gather of group g+1 overlaps the DMA of
 * group g (the DMAs of one group may be spread over several streams; on an
 * H200 one was best, see docs/gpu-copy-engine.md); zstream carries the
 * zero-copy kernel of a staged transfer with kernel_share_pct > 0, which
 * runs beside the pipeline.  All are non-blocking, lowest-priority streams
 * of the engine's own.  A caller's wait_event is waited for on kstream, the
 * stream that touches GPU blocks first in every method (zstream waits for
 * kstream's table_ready, recorded after that wait and after the table
 * upload on tstream; the upload touches only the engine's own memory).
 *
 * Staging.  One device buffer, half for each lane (stores, restores), of
 * GPU_STAGING_SLOTS slots each.  Each slot has a "filled" and a "free"
 * event; whoever fills a slot waits for its "free" event and records
 * "filled", whoever drains it waits for "filled" and records "free".  A
 * lane's slots rotate across its transfers (lane->next_slot), and everything is issued under eng->lock, so each wait sees the record it
 * needs (a stream waits for the last record made before the wait call).  Groups ramp up
 * (1/8, 1/4, 1/2 of a slot, then whole slots) so the first DMA starts soon,
 * and down (halves of the last slot's worth) so the last scatter ends soon;
 * without UMBP_GPU_RAMP_OVERLAPPED (on in the engine's default configuration, off
 * in the runtime's), not up while the lane's
 * previous staged transfer still copies (lane last_end), nor down when the
 * caller says another follows
 * (UMBP_KV_XFER_FOLLOWED: the runtime's store slices), where other copies
 * overlap that end and each extra group is one more copy.
 *
 * Completion.  Each transfer owns an event recorded after its last device
 * work; umbp_gpu_xfer_test queries it without locks or blocking.  Transfers
 * come from a fixed pool (cfg.max_inflight) whose block tables (pinned host
 * and device) grow on demand and are kept, so steady state allocates nothing.
 * A transfer released before it completes is parked on the orphan list and
 * recycled once its event has fired.
 *
 * Locking: eng->lock guards submission, the pools and the region list; it is
 * never held while waiting for the device, except in destroy and
 * umbp_gpu_engine_sms_used and umbp_gpu_engine_warm, which exist to wait, and when a submission fails
 * after queueing work (its streams are drained before its tables are reused).
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

#define DEFAULT_CTAS 32
#define DEFAULT_THREADS 128
#define DEFAULT_VEC 8
#define DEFAULT_STAGING ((uint64_t)256 << 20)
#define DEFAULT_INFLIGHT 64
#define DEFAULT_COPY_STREAMS 1
#define DMA_BATCH_MAX 8192 /* copies per batched call */
#define KNOWN_FLAGS                                                                        \
    (UMBP_GPU_RECORD_SMS | UMBP_GPU_NO_BATCH_MEMCPY | UMBP_GPU_SORT_BY_HOST |             \
     UMBP_GPU_L2_DISCARD_STAGING | UMBP_GPU_EVICT_FIRST_RESTORE | UMBP_GPU_RAMP_OVERLAPPED)
/* AUTO stores zero-copy when the DMAs of the staged method would average
 * less than this (objects' selected bytes, adjacent ones merged). */
#define STAGED_STORE_MIN_BYTES ((uint64_t)512 << 10)

void umbp_gpu_config_default(umbp_gpu_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->backend = UMBP_GPU_BACKEND_AUTO;
    cfg->store_method = UMBP_GPU_METHOD_AUTO;
    cfg->restore_method = UMBP_GPU_METHOD_AUTO;
    cfg->max_ctas = DEFAULT_CTAS;
    cfg->threads_per_cta = DEFAULT_THREADS;
    cfg->vec_per_lane = DEFAULT_VEC;
    cfg->staging_bytes = DEFAULT_STAGING;
    cfg->max_inflight = DEFAULT_INFLIGHT;
    cfg->copy_streams = DEFAULT_COPY_STREAMS;
    cfg->flags = UMBP_GPU_L2_DISCARD_STAGING | UMBP_GPU_EVICT_FIRST_RESTORE |
                 UMBP_GPU_RAMP_OVERLAPPED;
}

/* ---- configuration ---------------------------------------------------- */

static int check_config(umbp_gpu_config_t *c)
{
    if (c->max_ctas == 0)
        c->max_ctas = DEFAULT_CTAS;
    if (c->threads_per_cta == 0)
        c->threads_per_cta = DEFAULT_THREADS;
    if (c->vec_per_lane == 0)
        c->vec_per_lane = DEFAULT_VEC;
    if (c->staging_bytes == 0)
        c->staging_bytes = DEFAULT_STAGING;
    if (c->max_inflight == 0)
        c->max_inflight = DEFAULT_INFLIGHT;
    if (c->copy_streams == 0)
        c->copy_streams = DEFAULT_COPY_STREAMS;

    if ((unsigned)c->backend > UMBP_GPU_BACKEND_HIP) {
        gpu_set_error("backend %d: must be AUTO, HOST, CUDA or HIP", (int)c->backend);
        return -EINVAL;
    }
    if (c->device < 0) {
        gpu_set_error("device %d: must be >= 0", c->device);
        return -EINVAL;
    }
    if ((unsigned)c->store_method > UMBP_GPU_METHOD_DMA ||
        (unsigned)c->restore_method > UMBP_GPU_METHOD_DMA) {
        gpu_set_error("store_method/restore_method: must be AUTO, KERNEL, STAGED or DMA");
        return -EINVAL;
    }
    if (c->max_ctas > 1024) {
        gpu_set_error("max_ctas %u: must be 1..1024", c->max_ctas);
        return -EINVAL;
    }
    if (c->threads_per_cta % 32 != 0 || c->threads_per_cta > 512) {
        gpu_set_error("threads_per_cta %u: must be a multiple of 32 in 32..512",
                      c->threads_per_cta);
        return -EINVAL;
    }
    if (c->vec_per_lane != 4 && c->vec_per_lane != 8 && c->vec_per_lane != 16) {
        gpu_set_error("vec_per_lane %u: must be 4, 8 or 16", c->vec_per_lane);
        return -EINVAL;
    }
    if (c->staging_bytes < ((uint64_t)64 << 10) || c->staging_bytes > ((uint64_t)1 << 40)) {
        gpu_set_error("staging_bytes %llu: must be 64 KiB..1 TiB",
                      (unsigned long long)c->staging_bytes);
        return -EINVAL;
    }
    if (c->max_inflight > 65536) {
        gpu_set_error("max_inflight %u: must be 1..65536", c->max_inflight);
        return -EINVAL;
    }
    if (c->kernel_share_pct > 90) {
        gpu_set_error("kernel_share_pct %u: must be 0..90", c->kernel_share_pct);
        return -EINVAL;
    }
    if (c->copy_streams > GPU_COPY_STREAMS_MAX) {
        gpu_set_error("copy_streams %u: must be 1..%d", c->copy_streams, GPU_COPY_STREAMS_MAX);
        return -EINVAL;
    }
    if (c->flags & ~(uint32_t)KNOWN_FLAGS) {
        gpu_set_error("flags 0x%x: unknown bits 0x%x", c->flags, c->flags & ~(uint32_t)KNOWN_FLAGS);
        return -EINVAL;
    }
    return 0;
}

/* AUTO, resolved.  The measurements behind it are in docs/gpu-copy-engine.md
 * (H200, PCIe Gen5 x16).  Restores: staging (the copy engine brings each
 * object into device memory, 8 SMs scatter it) beats zero-copy reads for
 * every size.  Stores: staging wins once its DMAs are large (0.98 of a
 * contiguous copy at 2 MiB, 0.96 at 768 KiB), but the copy engine loses
 * about half a microsecond per copy, so 256 KiB objects scattered in host
 * memory go faster through the zero-copy kernel (0.95 against 0.93).
 * Objects larger than a staging slot fall back to the kernel
 * (resolve_method). */
static umbp_gpu_method_t auto_method(const struct umbp_gpu_engine *eng, int restore,
                                     uint64_t dma_bytes)
{
    if (eng->ops->synchronous)
        return UMBP_GPU_METHOD_KERNEL; /* a memcpy either way; staging adds one */
    if (!restore && dma_bytes < STAGED_STORE_MIN_BYTES)
        return UMBP_GPU_METHOD_KERNEL;
    return UMBP_GPU_METHOD_STAGED;
}

/* dma_bytes: the average DMA of the staged method (objects adjacent in
 * request order merged). */
static umbp_gpu_method_t resolve_method(const struct umbp_gpu_engine *eng, int restore,
                                        uint64_t sel_bytes, uint64_t dma_bytes)
{
    umbp_gpu_method_t m = restore ? eng->cfg.restore_method : eng->cfg.store_method;
    if (m == UMBP_GPU_METHOD_AUTO)
        m = auto_method(eng, restore, dma_bytes);
    /* An object that does not fit a staging slot goes zero-copy. */
    if (m == UMBP_GPU_METHOD_STAGED && (eng->staging == NULL || sel_bytes > eng->slot_bytes))
        m = UMBP_GPU_METHOD_KERNEL;
    return m;
}

umbp_gpu_method_t umbp_gpu_engine_method(const umbp_gpu_engine_t *eng, int restore,
                                         uint64_t object_bytes)
{
    return resolve_method(eng, restore, object_bytes, object_bytes);
}

/* ---- engine life ------------------------------------------------------ */

static int pick_backend(umbp_gpu_config_t *c, const struct gpu_ops **ops, int *ndev)
{
    if (c->backend != UMBP_GPU_BACKEND_AUTO) {
        int rc = umbp_gpu_backend_probe(c->backend, ndev);
        if (rc < 0)
            return rc == -ENOTSUP ? -ENODEV : rc;
        *ops = gpu_backend_ops(c->backend);
        return 0;
    }
    const umbp_gpu_backend_t order[] = {UMBP_GPU_BACKEND_CUDA, UMBP_GPU_BACKEND_HIP};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        if (umbp_gpu_backend_probe(order[i], ndev) == 0) {
            *ops = gpu_backend_ops(order[i]);
            return 0;
        }
    }
    *ops = gpu_backend_ops(UMBP_GPU_BACKEND_HOST);
    *ndev = 1;
    return 0;
}

/* Device resources; the caller has entered the device.  Undone by
 * release_device_state, which tolerates a partial setup. */
static int create_device_state(struct umbp_gpu_engine *eng)
{
    const struct gpu_ops *o = eng->ops;
    int rc = gpu_num_sms(o, eng->device, &eng->num_sms);
    for (int d = 0; d < 2; d++) {
        struct gpu_lane *L = &eng->lane[d];
        if (rc == 0)
            rc = gpu_stream_create(o, &L->kstream);
        for (int c = 0; rc == 0 && c < GPU_COPY_STREAMS_MAX; c++)
            rc = gpu_stream_create(o, &L->cstream[c]);
        if (rc == 0)
            rc = gpu_stream_create(o, &L->zstream);
        if (rc == 0)
            rc = gpu_stream_create(o, &L->tstream);
        if (rc == 0)
            rc = gpu_event_create(o, &L->table_up);
        if (rc == 0)
            rc = gpu_event_create(o, &L->table_ready);
        if (rc == 0)
            rc = gpu_event_create(o, &L->zero_copy_done);
        if (rc == 0)
            rc = gpu_event_create(o, &L->last_end);
    }
    for (int d = 0; d < 2; d++)
        for (int s = 0; rc == 0 && s < GPU_STAGING_SLOTS; s++) {
            struct gpu_lane *L = &eng->lane[d];
            rc = gpu_event_create(o, &L->slot_filled[s]);
            if (rc == 0)
                rc = gpu_event_create(o, &L->slot_free[s]);
            for (int c = 1; rc == 0 && c < GPU_COPY_STREAMS_MAX; c++)
                rc = gpu_event_create(o, &L->slot_join[s][c]);
        }
    bool may_stage = eng->cfg.store_method == UMBP_GPU_METHOD_AUTO ||
                     eng->cfg.store_method == UMBP_GPU_METHOD_STAGED ||
                     eng->cfg.restore_method == UMBP_GPU_METHOD_AUTO ||
                     eng->cfg.restore_method == UMBP_GPU_METHOD_STAGED;
    if (rc == 0 && may_stage) {
        eng->slot_bytes = (eng->cfg.staging_bytes / (2 * GPU_STAGING_SLOTS)) & ~(uint64_t)4095;
        void *p = NULL;
        rc = gpu_dev_alloc(o, eng->slot_bytes * 2 * GPU_STAGING_SLOTS, &p);
        if (rc < 0) {
            char why[160];
            snprintf(why, sizeof(why), "%s", umbp_gpu_last_error());
            gpu_set_error("staging_bytes %llu: the device cannot allocate the staging buffer "
                          "(%s); give a smaller one (the runtime's gpu_staging_bytes)",
                          (unsigned long long)eng->cfg.staging_bytes, why);
        }
        eng->staging = p;
        for (int d = 0; rc == 0 && d < 2; d++)
            eng->lane[d].staging = eng->staging + (size_t)d * GPU_STAGING_SLOTS * eng->slot_bytes;
    }
    if (rc == 0 && (eng->cfg.flags & UMBP_GPU_RECORD_SMS)) {
        void *p = NULL;
        rc = gpu_dev_alloc(o, GPU_SM_MASK_WORDS * sizeof(uint32_t), &p);
        eng->sm_mask = p;
        if (rc == 0)
            rc = gpu_memset_sync(o, p, 0, GPU_SM_MASK_WORDS * sizeof(uint32_t));
    }
    for (uint32_t i = 0; rc == 0 && i < eng->cfg.max_inflight; i++) {
        struct umbp_gpu_xfer *x = &eng->xfers[i];
        x->eng = eng;
        x->state = XFER_FREE;
        rc = gpu_event_create(o, &x->done);
        x->next = eng->free_list;
        eng->free_list = x;
    }
    return rc;
}

/* Waits for every stream of the engine; the first error. */
static int sync_lanes(struct umbp_gpu_engine *eng)
{
    int rc = 0;
    for (int d = 0; d < 2; d++) {
        const struct gpu_lane *L = &eng->lane[d];
        int r = gpu_stream_sync(eng->ops, L->kstream);
        rc = rc ? rc : r;
        for (int c = 0; c < GPU_COPY_STREAMS_MAX; c++) {
            r = gpu_stream_sync(eng->ops, L->cstream[c]);
            rc = rc ? rc : r;
        }
        r = gpu_stream_sync(eng->ops, L->zstream);
        rc = rc ? rc : r;
        r = gpu_stream_sync(eng->ops, L->tstream);
        rc = rc ? rc : r;
    }
    return rc;
}

static void release_device_state(struct umbp_gpu_engine *eng)
{
    const struct gpu_ops *o = eng->ops;
    for (uint32_t i = 0; eng->xfers != NULL && i < eng->cfg.max_inflight; i++) {
        struct umbp_gpu_xfer *x = &eng->xfers[i];
        gpu_event_destroy(o, x->done);
        gpu_host_free(o, x->htab);
        gpu_dev_free(o, x->dtab);
        free(x->hsel);
        free(x->sorted);
    }
    for (size_t i = 0; i < eng->nregions; i++) {
        struct gpu_region *r = &eng->regions[i];
        if (r->owned)
            gpu_host_free(o, (void *)r->addr);
        else
            (void)gpu_host_unregister(o, (void *)r->addr);
    }
    gpu_dev_free(o, eng->sm_mask);
    gpu_dev_free(o, eng->staging);
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < GPU_STAGING_SLOTS; s++) {
            struct gpu_lane *L = &eng->lane[d];
            gpu_event_destroy(o, L->slot_filled[s]);
            gpu_event_destroy(o, L->slot_free[s]);
            for (int c = 1; c < GPU_COPY_STREAMS_MAX; c++)
                gpu_event_destroy(o, L->slot_join[s][c]);
        }
    for (int d = 0; d < 2; d++) {
        struct gpu_lane *L = &eng->lane[d];
        gpu_event_destroy(o, L->table_ready);
        gpu_event_destroy(o, L->table_up);
        gpu_event_destroy(o, L->zero_copy_done);
        gpu_event_destroy(o, L->last_end);
        gpu_stream_destroy(o, L->tstream);
        gpu_stream_destroy(o, L->zstream);
        for (int c = 0; c < GPU_COPY_STREAMS_MAX; c++)
            gpu_stream_destroy(o, L->cstream[c]);
        gpu_stream_destroy(o, L->kstream);
    }
}

int umbp_gpu_engine_create(const umbp_gpu_config_t *cfg, umbp_gpu_engine_t **out)
{
    if (out == NULL)
        return -EINVAL;
    struct umbp_gpu_engine *eng = calloc(1, sizeof(*eng));
    if (eng == NULL)
        return -ENOMEM;
    if (cfg != NULL)
        eng->cfg = *cfg;
    else
        umbp_gpu_config_default(&eng->cfg);
    int ndev = 0, prev = 0, rc = check_config(&eng->cfg);
    if (rc == 0)
        rc = pick_backend(&eng->cfg, &eng->ops, &ndev);
    if (rc < 0)
        goto fail_free;
    eng->cfg.backend = eng->ops->kind;
    eng->device = eng->cfg.device;
    if (eng->device >= ndev) {
        gpu_set_error("device %d: the %s backend has %d device(s)", eng->device, eng->ops->name,
                      ndev);
        rc = -ENODEV;
        goto fail_free;
    }
    eng->xfers = calloc(eng->cfg.max_inflight, sizeof(*eng->xfers));
    if (eng->xfers == NULL) {
        rc = -ENOMEM;
        goto fail_free;
    }
    pthread_mutex_init(&eng->lock, NULL);
    rc = gpu_device_enter(eng->ops, eng->device, &prev);
    if (rc < 0)
        goto fail_lock;
    rc = create_device_state(eng);
    if (rc < 0) {
        release_device_state(eng);
        gpu_device_leave(eng->ops, eng->device, prev);
        goto fail_lock;
    }
    gpu_device_leave(eng->ops, eng->device, prev);
    *out = eng;
    return 0;
fail_lock:
    pthread_mutex_destroy(&eng->lock);
fail_free:
    free(eng->xfers);
    free(eng);
    return rc;
}

void umbp_gpu_engine_destroy(umbp_gpu_engine_t *eng)
{
    if (eng == NULL)
        return;
    if (atomic_load(&eng->num_layouts) != 0)
        fprintf(stderr, "umbp gpu: engine destroyed with %d KV layout(s) still registered; "
                "destroy them first\n", atomic_load(&eng->num_layouts));
    int prev;
    if (gpu_device_enter(eng->ops, eng->device, &prev) == 0) {
        /* Let in-flight device work finish before its memory goes. */
        (void)sync_lanes(eng);
        release_device_state(eng);
        gpu_device_leave(eng->ops, eng->device, prev);
    }
    pthread_mutex_destroy(&eng->lock);
    free(eng->dma_dst);
    free(eng->dma_src);
    free(eng->dma_len);
    free(eng->regions);
    free(eng->xfers);
    free(eng);
}

umbp_gpu_backend_t umbp_gpu_engine_backend(const umbp_gpu_engine_t *eng) { return eng->ops->kind; }
int umbp_gpu_engine_device(const umbp_gpu_engine_t *eng) { return eng->device; }
int umbp_gpu_engine_num_sms(const umbp_gpu_engine_t *eng) { return eng->num_sms; }

void umbp_gpu_engine_device_name(const umbp_gpu_engine_t *eng, char *buf, size_t len)
{
    if (len == 0)
        return;
    if (gpu_device_name(eng->ops, eng->device, buf, len) < 0)
        snprintf(buf, len, "%s device %d", eng->ops->name, eng->device);
}

void umbp_gpu_engine_get_config(const umbp_gpu_engine_t *eng, umbp_gpu_config_t *cfg)
{
    *cfg = eng->cfg;
}

int umbp_gpu_engine_set_tuning(umbp_gpu_engine_t *eng, const umbp_gpu_config_t *cfg)
{
    if (eng == NULL || cfg == NULL)
        return -EINVAL;
    umbp_gpu_config_t c = *cfg;
    int rc = check_config(&c);
    if (rc < 0)
        return rc;
    if (c.backend != eng->cfg.backend || c.device != eng->cfg.device ||
        c.staging_bytes != eng->cfg.staging_bytes || c.max_inflight != eng->cfg.max_inflight ||
        (c.flags & UMBP_GPU_RECORD_SMS) != (eng->cfg.flags & UMBP_GPU_RECORD_SMS)) {
        gpu_set_error("set_tuning: backend, device, staging_bytes, max_inflight and "
                      "UMBP_GPU_RECORD_SMS are fixed at creation; start from "
                      "umbp_gpu_engine_get_config");
        return -EINVAL;
    }
    pthread_mutex_lock(&eng->lock);
    eng->cfg = c;
    pthread_mutex_unlock(&eng->lock);
    return 0;
}

int umbp_gpu_engine_sms_used(umbp_gpu_engine_t *eng)
{
    if (eng->sm_mask == NULL)
        return -ENOTSUP;
    uint32_t mask[GPU_SM_MASK_WORDS];
    int prev, rc, n = 0;
    pthread_mutex_lock(&eng->lock);
    rc = gpu_device_enter(eng->ops, eng->device, &prev);
    if (rc == 0) {
        rc = sync_lanes(eng);
        if (rc == 0)
            rc = gpu_memcpy_sync(eng->ops, mask, eng->sm_mask, sizeof(mask));
        if (rc == 0)
            rc = gpu_memset_sync(eng->ops, eng->sm_mask, 0, sizeof(mask));
        gpu_device_leave(eng->ops, eng->device, prev);
    }
    pthread_mutex_unlock(&eng->lock);
    if (rc < 0)
        return rc;
    for (int i = 0; i < GPU_SM_MASK_WORDS; i++)
        n += __builtin_popcount(mask[i]);
    return n;
}

/* ---- registered host memory ------------------------------------------- */

/* Index of the first region whose end is above addr. */
static size_t region_lower_bound(const struct umbp_gpu_engine *eng, uintptr_t addr)
{
    size_t lo = 0, hi = eng->nregions;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct gpu_region *r = &eng->regions[mid];
        if (r->addr + r->len <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Finds the region holding [p, p + len); caller holds the lock. */
static const struct gpu_region *region_find(struct umbp_gpu_engine *eng, uintptr_t p, uint64_t len)
{
    if (eng->last_region < eng->nregions) {
        const struct gpu_region *r = &eng->regions[eng->last_region];
        if (p >= r->addr && len <= r->len && p - r->addr <= r->len - len)
            return r;
    }
    size_t i = region_lower_bound(eng, p);
    if (i == eng->nregions)
        return NULL;
    const struct gpu_region *r = &eng->regions[i];
    if (p < r->addr || len > r->len || p - r->addr > r->len - len)
        return NULL;
    eng->last_region = i;
    return r;
}

static int region_insert(struct umbp_gpu_engine *eng, uintptr_t addr, size_t len, bool owned)
{
    size_t i = region_lower_bound(eng, addr);
    if (i < eng->nregions && eng->regions[i].addr < addr + len) {
        gpu_set_error("host memory [%p, +%zu) overlaps registered [%p, +%zu)", (void *)addr, len,
                      (void *)eng->regions[i].addr, eng->regions[i].len);
        return -EEXIST;
    }
    if (eng->nregions == eng->regions_cap) {
        size_t cap = eng->regions_cap ? eng->regions_cap * 2 : 8;
        struct gpu_region *r = realloc(eng->regions, cap * sizeof(*r));
        if (r == NULL)
            return -ENOMEM;
        eng->regions = r;
        eng->regions_cap = cap;
    }
    memmove(&eng->regions[i + 1], &eng->regions[i], (eng->nregions - i) * sizeof(*eng->regions));
    eng->regions[i] = (struct gpu_region){.addr = addr, .len = len, .dev = 0, .owned = owned};
    eng->nregions++;
    return (int)i;
}

static void region_remove(struct umbp_gpu_engine *eng, size_t i)
{
    memmove(&eng->regions[i], &eng->regions[i + 1],
            (eng->nregions - i - 1) * sizeof(*eng->regions));
    eng->nregions--;
    eng->last_region = 0;
}

/* [addr, +len) overlaps a recorded region (eng->lock held): -EEXIST, named. */
static int region_overlap(struct umbp_gpu_engine *eng, void *addr, size_t len)
{
    size_t i = region_lower_bound(eng, (uintptr_t)addr);
    if (i < eng->nregions && eng->regions[i].addr < (uintptr_t)addr + len) {
        gpu_set_error("host memory [%p, +%zu) overlaps a registered region", addr, len);
        return -EEXIST;
    }
    return 0;
}

/* Registers (or allocates, when *addr is NULL) and records a region.  The
 * pinning itself runs outside eng->lock: it touches every page (seconds for
 * a pool of hundreds of GiB: a restarted server's new pool is registered
 * while transfers run), and submissions and releases take that lock on the
 * runtime's loop thread and its waiter.  The overlap check is made again
 * when the region is recorded. */
static int host_add(struct umbp_gpu_engine *eng, void **addr, size_t len)
{
    const struct gpu_ops *o = eng->ops;
    bool owned = *addr == NULL;
    int prev, rc;
    if (len == 0) {
        gpu_set_error("host memory of 0 bytes");
        return -EINVAL;
    }
    rc = gpu_device_enter(o, eng->device, &prev);
    if (rc < 0)
        return rc;
    if (!owned) {
        pthread_mutex_lock(&eng->lock);
        rc = region_overlap(eng, *addr, len);
        pthread_mutex_unlock(&eng->lock);
        if (rc < 0)
            goto out_leave;
        rc = gpu_host_register(o, *addr, len);
    } else {
        rc = gpu_host_alloc(o, len, addr);
    }
    if (rc < 0)
        goto out_leave;
    void *dev = NULL;
    rc = gpu_host_dev_ptr(o, *addr, &dev);
    pthread_mutex_lock(&eng->lock);
    if (rc >= 0 && !owned)
        rc = region_overlap(eng, *addr, len); /* registered meanwhile by another thread */
    if (rc >= 0)
        rc = region_insert(eng, (uintptr_t)*addr, len, owned);
    if (rc >= 0) {
        eng->regions[rc].dev = (uintptr_t)dev;
        rc = 0;
    }
    pthread_mutex_unlock(&eng->lock);
    if (rc < 0) {
        if (owned)
            gpu_host_free(o, *addr);
        else
            (void)gpu_host_unregister(o, *addr);
    }
out_leave:
    gpu_device_leave(o, eng->device, prev);
    return rc;
}

int umbp_gpu_host_register(umbp_gpu_engine_t *eng, void *addr, size_t len)
{
    if (eng == NULL || addr == NULL)
        return -EINVAL;
    return host_add(eng, &addr, len);
}

int umbp_gpu_host_alloc(umbp_gpu_engine_t *eng, size_t len, void **out)
{
    if (eng == NULL || out == NULL)
        return -EINVAL;
    void *p = NULL;
    int rc = host_add(eng, &p, len);
    if (rc == 0)
        *out = p;
    return rc;
}

/* Forgets the region starting at addr if its ownership matches. */
static int host_remove(struct umbp_gpu_engine *eng, void *addr, bool owned)
{
    int prev, rc = -ENOENT;
    pthread_mutex_lock(&eng->lock);
    size_t i = region_lower_bound(eng, (uintptr_t)addr);
    if (i < eng->nregions && eng->regions[i].addr == (uintptr_t)addr &&
        eng->regions[i].owned == owned) {
        region_remove(eng, i);
        rc = gpu_device_enter(eng->ops, eng->device, &prev);
        if (rc == 0) {
            if (owned)
                gpu_host_free(eng->ops, addr);
            else
                rc = gpu_host_unregister(eng->ops, addr);
            gpu_device_leave(eng->ops, eng->device, prev);
        }
    } else {
        gpu_set_error("%p is not the start of host memory %s with this engine", addr,
                      owned ? "allocated" : "registered");
    }
    pthread_mutex_unlock(&eng->lock);
    return rc;
}

int umbp_gpu_host_unregister(umbp_gpu_engine_t *eng, void *addr)
{
    if (eng == NULL || addr == NULL)
        return -EINVAL;
    return host_remove(eng, addr, false);
}

void umbp_gpu_host_free(umbp_gpu_engine_t *eng, void *p)
{
    if (eng != NULL && p != NULL)
        (void)host_remove(eng, p, true);
}

/* ---- transfer pool ---------------------------------------------------- */

/* Recycles orphans whose device work has ended; caller holds the lock. */
static void reap_orphans(struct umbp_gpu_engine *eng)
{
    struct umbp_gpu_xfer **pp = &eng->orphans;
    while (*pp != NULL) {
        struct umbp_gpu_xfer *x = *pp;
        if (gpu_event_query(eng->ops, x->done) == UMBP_E_INPROGRESS) {
            pp = &x->next;
            continue;
        }
        *pp = x->next;
        x->state = XFER_FREE;
        x->next = eng->free_list;
        eng->free_list = x;
    }
}

/* Makes x's tables hold n entries; caller holds the lock and is on the
 * device.  Grows by doubling, so this allocates a few times per pool entry
 * in a process's life. */
static int xfer_reserve(struct umbp_gpu_xfer *x, size_t n)
{
    if (n <= x->cap)
        return 0;
    const struct gpu_ops *o = x->eng->ops;
    size_t cap = x->cap ? x->cap : 1024;
    while (cap < n)
        cap *= 2;
    void *h = NULL, *d = NULL;
    uintptr_t *s = malloc(cap * sizeof(*s));
    umbp_kv_block_io_t *so = malloc(cap * sizeof(*so));
    void *hd = NULL;
    int rc = s == NULL || so == NULL ? -ENOMEM : gpu_host_alloc(o, cap * sizeof(*x->htab), &h);
    if (rc == 0)
        rc = gpu_host_dev_ptr(o, h, &hd);
    if (rc == 0)
        rc = gpu_dev_alloc(o, cap * sizeof(*x->dtab), &d);
    if (rc < 0) {
        gpu_host_free(o, h);
        free(s);
        free(so);
        return rc;
    }
    gpu_host_free(o, x->htab);
    gpu_dev_free(o, x->dtab);
    free(x->hsel);
    free(x->sorted);
    x->htab = h;
    x->htab_dev = hd;
    x->dtab = d;
    x->hsel = s;
    x->sorted = so;
    x->cap = cap;
    return 0;
}

static int dma_reserve(struct umbp_gpu_engine *eng, size_t n)
{
    if (n <= eng->dma_cap)
        return 0;
    size_t cap = eng->dma_cap ? eng->dma_cap : 1024;
    while (cap < n)
        cap *= 2;
    void **d = realloc(eng->dma_dst, cap * sizeof(*d));
    if (d != NULL)
        eng->dma_dst = d;
    const void **s = realloc(eng->dma_src, cap * sizeof(*s));
    if (s != NULL)
        eng->dma_src = s;
    size_t *l = realloc(eng->dma_len, cap * sizeof(*l));
    if (l != NULL)
        eng->dma_len = l;
    if (d == NULL || s == NULL || l == NULL)
        return -ENOMEM;
    eng->dma_cap = cap;
    return 0;
}

/* Issues entries [lo, hi) of the engine's DMA list in batches;
 * NO_BATCH_MEMCPY: one call each. */
static int dma_issue(struct umbp_gpu_engine *eng, size_t lo, size_t hi, gpu_stream_t s)
{
    const struct gpu_ops *o = eng->ops;
    for (size_t i = lo; i < hi; i += DMA_BATCH_MAX) {
        size_t n = hi - i < DMA_BATCH_MAX ? hi - i : DMA_BATCH_MAX;
        int rc;
        if (eng->cfg.flags & UMBP_GPU_NO_BATCH_MEMCPY) {
            rc = 0;
            for (size_t k = i; rc == 0 && k < i + n; k++)
                rc = gpu_memcpy_async(o, eng->dma_dst[k], eng->dma_src[k], eng->dma_len[k], s);
        } else {
            rc = gpu_memcpy_batch_async(o, eng->dma_dst + i, eng->dma_src + i, eng->dma_len + i,
                                        n, s);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- warming ------------------------------------------------------------ */

int umbp_gpu_engine_warm(umbp_gpu_engine_t *eng, size_t blocks, unsigned xfers)
{
    if (eng == NULL)
        return -EINVAL;
    if (blocks == 0 || xfers == 0)
        return 0;
    const struct gpu_ops *o = eng->ops;
    int prev, rc;
    pthread_mutex_lock(&eng->lock);
    rc = gpu_device_enter(o, eng->device, &prev);
    if (rc < 0)
        goto out;
    /* The tables of the transfers taken first (the free list is LIFO, so
     * these are the ones a process keeps reusing), and the DMA lists. */
    struct umbp_gpu_xfer *x = eng->free_list;
    for (unsigned i = 0; rc == 0 && x != NULL && i < xfers; i++, x = x->next)
        rc = xfer_reserve(x, blocks);
    if (rc == 0)
        rc = dma_reserve(eng, blocks < 1024 ? 1024 : blocks);
    /* Lazy module loading loads a kernel at its first launch: launch the
     * configured variant once, with no work (num_blocks 0), on each stream
     * that launches it. */
    struct gpu_copy_args a = {.sm_mask = eng->sm_mask, .num_blocks = 0, .nkv = 1};
    x = eng->free_list;
    for (int d = 0; rc == 0 && d < 2; d++) {
        const struct gpu_lane *L = &eng->lane[d];
        rc = gpu_launch_copy(o, &a, 1, eng->cfg.threads_per_cta, eng->cfg.vec_per_lane,
                             L->kstream);
        if (rc == 0)
            rc = gpu_launch_copy(o, &a, 1, eng->cfg.threads_per_cta, eng->cfg.vec_per_lane,
                                 L->zstream);
        /* The first copy of each kind a stream makes (pinned host to
         * device; batched, device to device) sets up driver state. */
        if (rc == 0 && x != NULL && x->cap > 0)
            rc = gpu_memcpy_async(o, x->dtab, x->htab, sizeof(*x->htab), L->tstream);
        if (rc == 0 && L->staging != NULL && eng->slot_bytes >= 3 * 4096) {
            void *dst[2] = {L->staging + 4096, L->staging + 8192};
            const void *src[2] = {L->staging, L->staging + 64};
            size_t len[2] = {64, 64}; /* two: a batch of one is a plain copy */
            for (int c = 0; rc == 0 && c < GPU_COPY_STREAMS_MAX; c++)
                if (!(eng->cfg.flags & UMBP_GPU_NO_BATCH_MEMCPY))
                    rc = gpu_memcpy_batch_async(o, dst, src, len, 2, L->cstream[c]);
                else
                    rc = gpu_memcpy_async(o, dst[0], src[0], len[0], L->cstream[c]);
        }
    }
    if (rc == 0)
        rc = sync_lanes(eng);
    gpu_device_leave(o, eng->device, prev);
out:
    pthread_mutex_unlock(&eng->lock);
    return rc;
}

/* ---- the three methods ------------------------------------------------ */

/* What a submission has worked out before issuing anything. */
struct plan {
    const struct umbp_kv_layout *lay;
    int restore;
    uint32_t first, count; /* selected layers */
    uint64_t sel_off;      /* where they start in an object */
    uint64_t sel_bytes;    /* and how long they are */
    uint32_t n;            /* blocks */
    uint32_t flags;        /* UMBP_KV_XFER_* */
};

static struct gpu_copy_args kernel_args(const struct umbp_gpu_engine *eng, const struct plan *p,
                                        const struct gpu_copy_block *dtab, uint32_t n)
{
    return (struct gpu_copy_args){
        .layers = p->lay->dlayers,
        .blocks = dtab,
        .sm_mask = eng->sm_mask,
        .num_blocks = n,
        .first_layer = p->first,
        .num_layers = p->count,
        .nkv = p->lay->nkv,
        .to_gpu = (uint32_t)p->restore,
        .hints = p->restore && (eng->cfg.flags & UMBP_GPU_EVICT_FIRST_RESTORE)
                     ? GPU_HINT_EVICT_FIRST_GPU
                     : 0,
    };
}

/* hints: GPU_HINT_DISCARD_OBJ only where the objects are a staging slot
 * (run_staged's restore groups), never the pool's objects. */
static int launch_on(struct umbp_gpu_engine *eng, const struct plan *p,
                     const struct gpu_copy_block *dtab, uint32_t n, gpu_stream_t s,
                     uint32_t hints)
{
    if (n == 0)
        return 0;
    struct gpu_copy_args a = kernel_args(eng, p, dtab, n);
    a.hints |= hints;
    uint64_t warps = eng->cfg.threads_per_cta / 32;
    uint64_t chunks = (uint64_t)n * p->count * p->lay->nkv;
    uint64_t ctas = (chunks + warps - 1) / warps;
    if (ctas > eng->cfg.max_ctas)
        ctas = eng->cfg.max_ctas;
    return gpu_launch_copy(eng->ops, &a, (unsigned)ctas, eng->cfg.threads_per_cta,
                           eng->cfg.vec_per_lane, s);
}

static struct gpu_lane *lane_of(struct umbp_gpu_engine *eng, const struct plan *p)
{
    return &eng->lane[p->restore ? LANE_RESTORE : LANE_STORE];
}

static int launch(struct umbp_gpu_engine *eng, const struct plan *p,
                  const struct gpu_copy_block *dtab, uint32_t n)
{
    return launch_on(eng, p, dtab, n, lane_of(eng, p)->kstream, 0);
}

/*
 * The block table a transfer's kernels read.  A restore's is uploaded to
 * the device on its lane's tstream, which is idle when the upload is
 * issued, so the upload reaches the copy engine before the transfer's DMAs
 * (issued after it); kstream waits for it.  Uploaded on kstream, it was
 * queued when kstream got to it, behind the previous transfer's scatters,
 * and by then the DMAs of this transfer's first groups were ahead of it:
 * on an H200 host the tail of a 10,000-token restore started scattering
 * 1.1 ms after its first DMA, and its fifth group's DMA waited 27 us for a
 * slot (the DMAs' idle gaps: 51 us a restore, now 26).  A store's is read
 * in place, from the pinned and mapped host table (one 16-byte read per warp and chunk): an
 * upload is a host-to-device copy, and the copy engine runs those in the
 * order they were queued, so a store's upload queued after a restore's DMAs
 * waited for all of them.  On an H200 host a 10,000-token store sliced
 * into 5 transfers beside a restore ended at 11.2 ms instead of 6.5 ms (the
 * first slice overlapped, the others waited for the restore's last DMA).
 */
static const struct gpu_copy_block *table_of(const struct umbp_gpu_xfer *x, const struct plan *p)
{
    return p->restore ? x->dtab : x->htab_dev;
}

static int upload_table(struct umbp_gpu_engine *eng, const struct plan *p,
                        struct umbp_gpu_xfer *x, uint32_t n)
{
    if (n == 0 || !p->restore)
        return 0;
    const struct gpu_lane *L = lane_of(eng, p);
    int rc = gpu_memcpy_async(eng->ops, x->dtab, x->htab, (size_t)n * sizeof(*x->htab),
                              L->tstream);
    if (rc == 0)
        rc = gpu_event_record(eng->ops, L->table_up, L->tstream);
    if (rc == 0)
        rc = gpu_stream_wait_event(eng->ops, L->kstream, L->table_up);
    return rc;
}

/* Zero-copy: the kernel reads or writes the mapped host objects itself. */
static int run_kernel(struct umbp_gpu_engine *eng, struct umbp_gpu_xfer *x, const struct plan *p)
{
    int rc = upload_table(eng, p, x, p->n);
    if (rc == 0)
        rc = launch(eng, p, table_of(x, p), p->n);
    if (rc == 0)
        rc = gpu_event_record(eng->ops, x->done, lane_of(eng, p)->kstream);
    return rc;
}

/* The copy phase of one group: one DMA per object between the slot and the
 * host (objects adjacent in host memory merged), spread over the copy
 * streams.  Every copy stream first waits for `go`; `done` is recorded on
 * cstream[0] once all of them have finished. */
static int stage_dma(struct umbp_gpu_engine *eng, const struct umbp_gpu_xfer *x,
                     const struct plan *p, uint32_t g0, uint32_t cnt, unsigned s,
                     gpu_event_t go, gpu_event_t done)
{
    const struct gpu_ops *o = eng->ops;
    const struct gpu_lane *L = lane_of(eng, p);
    char *slot = L->staging + s * eng->slot_bytes;
    size_t m = 0;
    for (uint32_t k = 0; k < cnt; k++) {
        char *h = (char *)x->hsel[g0 + k];
        char *d = slot + (uint64_t)k * p->sel_bytes;
        if (m != 0) {
            const char *prev = p->restore ? eng->dma_src[m - 1] : eng->dma_dst[m - 1];
            if (h == prev + eng->dma_len[m - 1]) {
                eng->dma_len[m - 1] += p->sel_bytes;
                continue;
            }
        }
        eng->dma_dst[m] = p->restore ? (void *)d : (void *)h;
        eng->dma_src[m] = p->restore ? (const void *)h : (const void *)d;
        eng->dma_len[m] = p->sel_bytes;
        m++;
    }
    size_t nc = eng->cfg.copy_streams < m ? eng->cfg.copy_streams : m;
    int rc = 0;
    for (size_t c = 0; rc == 0 && c < nc; c++) {
        size_t lo = m * c / nc, hi = m * (c + 1) / nc;
        rc = gpu_stream_wait_event(o, L->cstream[c], go);
        if (rc == 0)
            rc = dma_issue(eng, lo, hi, L->cstream[c]);
    }
    for (size_t c = 1; rc == 0 && c < nc; c++) {
        rc = gpu_event_record(o, L->slot_join[s][c], L->cstream[c]);
        if (rc == 0)
            rc = gpu_stream_wait_event(o, L->cstream[0], L->slot_join[s][c]);
    }
    if (rc == 0)
        rc = gpu_event_record(o, done, L->cstream[0]);
    return rc;
}

/* Group sizes: 1/8, 1/4, 1/2 of a slot's worth, then whole slots, and the
 * last slot's worth in halves down to 1/8: the first group's DMA (restore)
 * or gather (store) and the last group's scatter or DMA overlap nothing, so
 * both ends are kept short.  Each group is one more copy (about 2.4 us of
 * link time and 1.5 us idle before it on an H100 host), so without
 * UMBP_GPU_RAMP_OVERLAPPED an end that other work overlaps is not ramped: no
 * ramp-up while the lane's copy engine still has a transfer queued (*ramp
 * starts at per), no ramp-down (ramp_down false) when another transfer
 * follows this one. */
static uint32_t next_group(uint32_t *ramp, uint32_t per, uint32_t left, bool ramp_down)
{
    uint32_t tail = per / 8 ? per / 8 : 1;
    uint32_t cnt = *ramp < left ? *ramp : left;
    *ramp = *ramp * 2 < per ? *ramp * 2 : per;
    if (ramp_down && left <= per && left > tail) {
        uint32_t half = (left + 1) / 2;
        cnt = cnt < half ? cnt : half > tail ? half : tail;
    }
    return cnt;
}

/* Staged: a few SMs gather into (or scatter from) a device slot, the copy
 * engine moves the slot's objects; slots pipeline the two.  With
 * kernel_share_pct, the first objects go zero-copy on zstream meanwhile. */
static int run_staged(struct umbp_gpu_engine *eng, struct umbp_gpu_xfer *x, const struct plan *p)
{
    const struct gpu_ops *o = eng->ops;
    struct gpu_lane *L = lane_of(eng, p);
    uint32_t per = (uint32_t)(eng->slot_bytes / p->sel_bytes);
    uint32_t first = per / 8 ? per / 8 : 1;
    uint32_t nz = (uint32_t)((uint64_t)p->n * eng->cfg.kernel_share_pct / 100);
    bool skip_overlapped = !(eng->cfg.flags & UMBP_GPU_RAMP_OVERLAPPED);
    bool ramp_down = !(skip_overlapped && (p->flags & UMBP_KV_XFER_FOLLOWED));
    if (per == 0)
        return -EINVAL; /* resolve_method sends objects larger than a slot elsewhere */
    if (skip_overlapped && gpu_event_query(o, L->last_end) == UMBP_E_INPROGRESS)
        first = per; /* the lane's copies run: the first gather overlaps them */
    int rc = dma_reserve(eng, per);
    if (rc < 0)
        return rc;

    /* The slots each group will use, so the table can be uploaded at once
     * (entries below nz keep the mapped host addresses fill_blocks set). */
    uint32_t ramp = first;
    for (uint32_t g0 = nz, s = L->next_slot; g0 < p->n; s = (s + 1) % GPU_STAGING_SLOTS) {
        uint64_t slot = (uint64_t)(uintptr_t)L->staging + s * eng->slot_bytes;
        uint32_t cnt = next_group(&ramp, per, p->n - g0, ramp_down);
        for (uint32_t k = 0; k < cnt; k++)
            x->htab[g0 + k].obj = slot + (uint64_t)k * p->sel_bytes - p->sel_off;
        g0 += cnt;
    }
    rc = upload_table(eng, p, x, p->n);
    if (rc == 0 && nz > 0) {
        rc = gpu_event_record(o, L->table_ready, L->kstream);
        if (rc == 0)
            rc = gpu_stream_wait_event(o, L->zstream, L->table_ready);
        if (rc == 0)
            rc = launch_on(eng, p, table_of(x, p), nz, L->zstream, 0);
        if (rc == 0)
            rc = gpu_event_record(o, L->zero_copy_done, L->zstream);
    }

    /* A restore group's slot is read once, by its scatter, before the
     * next DMA into it (which waits for slot_free). */
    uint32_t discard = (eng->cfg.flags & UMBP_GPU_L2_DISCARD_STAGING) ? GPU_HINT_DISCARD_OBJ : 0;
    ramp = first;
    for (uint32_t g0 = nz; rc == 0 && g0 < p->n; x->groups++) {
        uint32_t cnt = next_group(&ramp, per, p->n - g0, ramp_down);
        unsigned s = L->next_slot;
        L->next_slot = (s + 1) % GPU_STAGING_SLOTS;
        if (!p->restore) {
            rc = gpu_stream_wait_event(o, L->kstream, L->slot_free[s]);
            if (rc == 0)
                rc = launch(eng, p, table_of(x, p) + g0, cnt);
            if (rc == 0)
                rc = gpu_event_record(o, L->slot_filled[s], L->kstream);
            if (rc == 0)
                rc = stage_dma(eng, x, p, g0, cnt, s, L->slot_filled[s], L->slot_free[s]);
        } else {
            rc = stage_dma(eng, x, p, g0, cnt, s, L->slot_free[s], L->slot_filled[s]);
            if (rc == 0)
                rc = gpu_stream_wait_event(o, L->kstream, L->slot_filled[s]);
            if (rc == 0)
                rc = launch_on(eng, p, table_of(x, p) + g0, cnt, L->kstream, discard);
            if (rc == 0)
                rc = gpu_event_record(o, L->slot_free[s], L->kstream);
        }
        g0 += cnt;
    }
    /* cstream[0] joined every copy stream at the end of each group. */
    gpu_stream_t last = p->restore ? L->kstream : L->cstream[0];
    if (rc == 0 && nz > 0)
        rc = gpu_stream_wait_event(o, last, L->zero_copy_done);
    if (rc == 0)
        rc = gpu_event_record(o, x->done, last);
    if (rc == 0 && skip_overlapped) /* with the default ramps nothing reads it */
        rc = gpu_event_record(o, L->last_end, last);
    return rc;
}

/* DMA: the copy engine moves every chunk (the baseline the others beat). */
static int run_dma(struct umbp_gpu_engine *eng, struct umbp_gpu_xfer *x, const struct plan *p)
{
    const struct umbp_kv_layout *lay = p->lay;
    size_t total = (size_t)p->n * p->count * lay->nkv;
    int rc = dma_reserve(eng, total);
    if (rc < 0)
        return rc;
    size_t m = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        uint64_t obj = x->hsel[i] - p->sel_off;
        for (uint32_t l = p->first; l < p->first + p->count; l++) {
            const struct gpu_copy_layer *L = &lay->layers[l];
            for (uint32_t kv = 0; kv < lay->nkv; kv++, m++) {
                void *g = (void *)(uintptr_t)(L->base + x->htab[i].gpu_block * L->block_stride +
                                              kv * L->kv_stride);
                void *h = (void *)(uintptr_t)(obj + L->obj_off + kv * L->chunk_bytes);
                eng->dma_dst[m] = p->restore ? g : h;
                eng->dma_src[m] = p->restore ? h : g;
                eng->dma_len[m] = L->chunk_bytes;
            }
        }
    }
    rc = dma_issue(eng, 0, m, lane_of(eng, p)->kstream);
    if (rc == 0)
        rc = gpu_event_record(eng->ops, x->done, lane_of(eng, p)->kstream);
    return rc;
}

/* ---- submission ------------------------------------------------------- */

static int make_plan(const struct umbp_gpu_engine *eng, const umbp_kv_xfer_desc_t *d, int restore,
                     struct plan *p)
{
    if (d == NULL || d->layout == NULL || (d->num_blocks != 0 && d->blocks == NULL)) {
        gpu_set_error("transfer: desc, desc->layout and desc->blocks are required");
        return -EINVAL;
    }
    const struct umbp_kv_layout *lay = d->layout;
    if (lay->eng != eng) {
        gpu_set_error("transfer: the layout was registered with another engine");
        return -EINVAL;
    }
    if (d->num_blocks > UINT32_MAX) {
        gpu_set_error("transfer: %zu blocks; at most 2^32 - 1 per call", d->num_blocks);
        return -EINVAL;
    }
    if (d->flags & ~UMBP_KV_XFER_FOLLOWED) {
        gpu_set_error("transfer: flags 0x%x: unknown bits 0x%x (known: UMBP_KV_XFER_FOLLOWED)",
                      d->flags, d->flags & ~UMBP_KV_XFER_FOLLOWED);
        return -EINVAL;
    }
    int rc = umbp_kv_layout_layer_span(lay, d->first_layer, d->num_layers, &p->sel_off,
                                       &p->sel_bytes);
    if (rc < 0)
        return rc;
    p->lay = lay;
    p->restore = restore;
    p->first = d->first_layer;
    p->count = d->num_layers ? d->num_layers : lay->num_layers - d->first_layer;
    p->n = (uint32_t)d->num_blocks;
    p->flags = d->flags;
    return 0;
}

/* Fills the block table (with the objects' device addresses, which the
 * kernel method uses and the staged method overwrites) and the host
 * addresses, checking every block; caller holds the lock. */
static int fill_blocks(struct umbp_gpu_engine *eng, struct umbp_gpu_xfer *x, const struct plan *p,
                       const umbp_kv_block_io_t *blocks)
{
    for (uint32_t i = 0; i < p->n; i++) {
        if (blocks[i].block >= p->lay->num_blocks) {
            gpu_set_error("transfer: block %llu (entry %u) is outside the layout's %llu blocks",
                          (unsigned long long)blocks[i].block, i,
                          (unsigned long long)p->lay->num_blocks);
            return UMBP_E_KV_RANGE;
        }
        uintptr_t h = (uintptr_t)blocks[i].host;
        const struct gpu_region *r = region_find(eng, h + p->sel_off, p->sel_bytes);
        if (h == 0 || r == NULL) {
            gpu_set_error("transfer: host object %p (entry %u) is not inside host memory "
                          "registered with the engine (umbp_gpu_host_register)",
                          blocks[i].host, i);
            return UMBP_E_GPU_UNREGISTERED;
        }
        x->htab[i].gpu_block = blocks[i].block;
        x->hsel[i] = h + p->sel_off;
        x->htab[i].obj = r->dev + (h - r->addr);
    }
    return 0;
}

/* Average bytes of the runs of objects adjacent in host memory in request
 * order: what one DMA of the staged method moves. */
static uint64_t avg_run_bytes(const umbp_kv_xfer_desc_t *d, const struct plan *p)
{
    if (p->n == 0)
        return p->sel_bytes;
    uint64_t runs = 1;
    for (uint32_t i = 1; i < p->n; i++)
        runs += (const char *)d->blocks[i].host !=
                (const char *)d->blocks[i - 1].host + p->lay->object_size ||
                p->sel_bytes != p->lay->object_size;
    return p->sel_bytes * p->n / runs;
}

static int cmp_host(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const umbp_kv_block_io_t *)a)->host;
    uintptr_t y = (uintptr_t)((const umbp_kv_block_io_t *)b)->host;
    return (x > y) - (x < y);
}

static int submit(umbp_gpu_engine_t *eng, const umbp_kv_xfer_desc_t *d, int restore,
                  umbp_gpu_xfer_t **out)
{
    if (eng == NULL || out == NULL)
        return -EINVAL;
    struct plan p;
    int rc = make_plan(eng, d, restore, &p);
    if (rc < 0)
        return rc;
    const struct gpu_ops *o = eng->ops;
    int prev;
    bool issued = false;

    pthread_mutex_lock(&eng->lock);
    reap_orphans(eng);
    struct umbp_gpu_xfer *x = eng->free_list;
    if (x == NULL) {
        gpu_set_error("transfer: %u transfers in flight (max_inflight); release some and retry",
                      eng->cfg.max_inflight);
        pthread_mutex_unlock(&eng->lock);
        return -EAGAIN;
    }
    eng->free_list = x->next;
    rc = gpu_device_enter(o, eng->device, &prev);
    if (rc < 0)
        goto fail_unlock;
    x->method = resolve_method(eng, restore, p.sel_bytes, avg_run_bytes(d, &p));
    const umbp_kv_block_io_t *blocks = d->blocks;
    rc = xfer_reserve(x, p.n);
    if (rc == 0 && x->method == UMBP_GPU_METHOD_STAGED && p.n > 1 &&
        (eng->cfg.flags & UMBP_GPU_SORT_BY_HOST)) {
        /* By host address: objects adjacent in host memory land adjacent in
         * a slot, and their DMAs merge.  Opt-in: on an H200 the sort cost
         * more than it gained when objects were not adjacent (4 KiB chunks:
         * 0.91 against 0.93 of a contiguous copy). */
        memcpy(x->sorted, blocks, p.n * sizeof(*blocks));
        qsort(x->sorted, p.n, sizeof(*blocks), cmp_host);
        blocks = x->sorted;
    }
    if (rc == 0)
        rc = fill_blocks(eng, x, &p, blocks);
    if (rc < 0)
        goto fail_leave;

    x->bytes = p.sel_bytes * p.n;
    x->groups = 0;
    atomic_store(&x->status, UMBP_E_INPROGRESS);
    if (d->wait_event != NULL && !o->synchronous)
        rc = gpu_stream_wait_event(o, lane_of(eng, &p)->kstream, d->wait_event);
    issued = true;
    if (rc == 0) {
        switch (x->method) {
        case UMBP_GPU_METHOD_STAGED:
            rc = run_staged(eng, x, &p);
            break;
        case UMBP_GPU_METHOD_DMA:
            rc = run_dma(eng, x, &p);
            break;
        default:
            rc = run_kernel(eng, x, &p);
            break;
        }
    }
    if (rc < 0)
        goto fail_leave;
    gpu_device_leave(o, eng->device, prev);
    x->state = XFER_BUSY;
    pthread_mutex_unlock(&eng->lock);
    *out = x;
    return 0;

fail_leave:
    if (issued) {
        /* Some device work may be queued and reading x's tables: let it
         * drain before x is reused (an error path; blocking is fine). */
        (void)sync_lanes(eng);
    }
    gpu_device_leave(o, eng->device, prev);
fail_unlock:
    if (x != NULL) {
        x->next = eng->free_list;
        eng->free_list = x;
    }
    pthread_mutex_unlock(&eng->lock);
    return rc;
}

int umbp_gpu_store(umbp_gpu_engine_t *eng, const umbp_kv_xfer_desc_t *desc, umbp_gpu_xfer_t **out)
{
    return submit(eng, desc, 0, out);
}

int umbp_gpu_restore(umbp_gpu_engine_t *eng, const umbp_kv_xfer_desc_t *desc,
                     umbp_gpu_xfer_t **out)
{
    return submit(eng, desc, 1, out);
}

/* ---- completion ------------------------------------------------------- */

int umbp_gpu_xfer_test(umbp_gpu_xfer_t *x)
{
    if (x == NULL)
        return -EINVAL;
    int st = atomic_load_explicit(&x->status, memory_order_acquire);
    if (st != UMBP_E_INPROGRESS)
        return st;
    st = gpu_event_query(x->eng->ops, x->done);
    if (st != UMBP_E_INPROGRESS)
        atomic_store_explicit(&x->status, st, memory_order_release);
    return st;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int umbp_gpu_xfer_wait(umbp_gpu_xfer_t *x, int timeout_ms)
{
    double start = now_ms();
    for (;;) {
        int rc = umbp_gpu_xfer_test(x);
        if (rc != UMBP_E_INPROGRESS)
            return rc;
        double waited = now_ms() - start;
        if (timeout_ms >= 0 && waited >= timeout_ms)
            return UMBP_E_TIMEOUT;
        /* Yield-spin through the first 100 ms (transfers of a prefix take
         * 1-30 ms; a sleep would add its timer slack, ~50 us, to each), then
         * back off so a long wait does not burn a core. */
        if (waited < 100) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

void *umbp_gpu_xfer_event(umbp_gpu_xfer_t *x)
{
    if (x == NULL || x->eng->ops->synchronous)
        return NULL;
    return x->done;
}

uint64_t umbp_gpu_xfer_bytes(const umbp_gpu_xfer_t *x) { return x->bytes; }
umbp_gpu_method_t umbp_gpu_xfer_method(const umbp_gpu_xfer_t *x) { return x->method; }

void umbp_gpu_xfer_release(umbp_gpu_xfer_t *x)
{
    if (x == NULL)
        return;
    struct umbp_gpu_engine *eng = x->eng;
    pthread_mutex_lock(&eng->lock);
    if (umbp_gpu_xfer_test(x) == UMBP_E_INPROGRESS) {
        x->state = XFER_ORPHAN;
        x->next = eng->orphans;
        eng->orphans = x;
    } else {
        x->state = XFER_FREE;
        x->next = eng->free_list;
        eng->free_list = x;
    }
    pthread_mutex_unlock(&eng->lock);
}
