/*
 * bench_gpu_copy.c - store and restore of a 10,000-token prefix (625 blocks
 * of 16 tokens) through the GPU copy engine, for three KV geometries
 * (FlashAttention layout, bf16, 16 tokens a block):
 *
 *   32 layers x 32 KiB chunks (8 KV heads x 128)   1.31 GB a prefix
 *   24 layers x 16 KiB chunks (4 KV heads x 128)   0.49 GB
 *   32 layers x  4 KiB chunks (1 KV head  x 128)   0.16 GB
 *
 * A chunk is one of K or V of one block of one layer.  The 625 blocks are
 * picked at random among 2,500 GPU blocks, and their host objects sit in a
 * pinned pool of 1,250 object slots, in shuffled order with a free slot
 * between any two, so neither side is contiguous and no two objects are
 * adjacent (the worst case for merging DMAs).  Rows marked "packed" put the
 * objects in 625 adjacent slots, still in shuffled order; "in order" puts
 * them back to back in request order (what a fresh pool hands out).
 *
 * Every row is measured in the same run as its baseline, a contiguous pinned
 * memcpy of the same bytes in the same direction, run alternately with the
 * row's transfers (so drift of the link hits both), and printed with both
 * medians and the ratio:
 *   contiguous memcpy         one cudaMemcpyAsync of all the bytes
 *   memcpy per chunk          one cudaMemcpyAsync per chunk
 *   batched memcpy per chunk  cudaMemcpyBatchAsync over all chunks
 *   kernel / staged / auto    the engine's methods and SM counts
 * SMs = distinct multiprocessors the copy kernels ran on (recorded by the
 * kernels themselves), 0 for copy-engine-only rows.  Time is wall clock from
 * submission to observed completion, median of --reps runs.
 *   gather/scatter alone      the staged method's kernel by itself, GPU
 *                             tensors <-> a contiguous device buffer, timed
 *                             with device events: its ratio says how many
 *                             times faster than the link it is, i.e. the
 *                             staged method keeps its SMs busy ~1/ratio of
 *                             the transfer
 *
 *   bench_gpu_copy [--reps N]    default 20 (3 for the per-chunk baselines)
 *   bench_gpu_copy --both        only the contiguous and both-ways rows
 *   bench_gpu_copy --host        the host backend with 700 GPU blocks: checks
 *                                the program itself where there is no GPU
 *
 * Prints "SKIP: ..." and exits 0 without a GPU.
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h" /* private: the layout's device table, for kernel-only timing */
#include "gpu.h"    /* private: device memory and streams for the baselines */
#include "umbp/gpu.h"

#define NUM_BLOCKS 625
#define MAX_LAYERS 32
#define MAX_ROWS 256

struct geometry {
    const char *name;
    uint32_t layers;
    uint32_t heads; /* chunk = 16 tokens * heads * 128 * 2 bytes */
};

static const struct geometry geos[] = {
    {"32L x 32KiB", 32, 8},
    {"24L x 16KiB", 24, 4},
    {"32L x 4KiB", 32, 1},
};

struct variant {
    const char *name;
    umbp_gpu_method_t method; /* AUTO with ctas 0: the engine's defaults */
    uint32_t ctas, threads, vec, copy_streams, flags;
    int few_reps; /* the slow per-chunk baselines */
    int placement; /* 0 gapped, 1 packed (adjacent, shuffled), 2 in request order */
    uint32_t share; /* kernel_share_pct */
};

static const struct variant variants[] = {
    /* name, method, ctas, threads, vec, copy streams, flags, few reps, placement, share */
    {"memcpy per chunk", UMBP_GPU_METHOD_DMA, 0, 0, 0, 0, UMBP_GPU_NO_BATCH_MEMCPY, 1, 0, 0},
    {"batched memcpy per chunk", UMBP_GPU_METHOD_DMA, 0, 0, 0, 0, 0, 1, 0, 0},
    {"kernel  1 CTA", UMBP_GPU_METHOD_KERNEL, 1, 512, 8, 0, 0, 0, 0, 0},
    {"kernel  2 CTAs", UMBP_GPU_METHOD_KERNEL, 2, 512, 8, 0, 0, 0, 0, 0},
    {"kernel  4 CTAs", UMBP_GPU_METHOD_KERNEL, 4, 512, 8, 0, 0, 0, 0, 0},
    {"kernel  8 CTAs", UMBP_GPU_METHOD_KERNEL, 8, 512, 8, 0, 0, 0, 0, 0},
    {"kernel 32 CTAs", UMBP_GPU_METHOD_KERNEL, 32, 512, 8, 0, 0, 0, 0, 0},
    {"kernel  8 CTAs vec16", UMBP_GPU_METHOD_KERNEL, 8, 512, 16, 0, 0, 0, 0, 0},
    {"kernel 32 x 128", UMBP_GPU_METHOD_KERNEL, 32, 128, 8, 0, 0, 0, 0, 0},
    {"kernel  8 x 128", UMBP_GPU_METHOD_KERNEL, 8, 128, 8, 0, 0, 0, 0, 0},
    {"staged  1 CTA", UMBP_GPU_METHOD_STAGED, 1, 512, 8, 1, 0, 0, 0, 0},
    {"staged  2 CTAs", UMBP_GPU_METHOD_STAGED, 2, 512, 8, 1, 0, 0, 0, 0},
    {"staged  4 CTAs", UMBP_GPU_METHOD_STAGED, 4, 512, 8, 1, 0, 0, 0, 0},
    {"staged  8 CTAs", UMBP_GPU_METHOD_STAGED, 8, 512, 8, 1, 0, 0, 0, 0},
    {"staged 32 x 128", UMBP_GPU_METHOD_STAGED, 32, 128, 8, 1, 0, 0, 0, 0},
    {"staged  8 CTAs sorted", UMBP_GPU_METHOD_STAGED, 8, 512, 8, 1, UMBP_GPU_SORT_BY_HOST, 0, 0, 0},
    {"staged  8 CTAs 2 copy streams", UMBP_GPU_METHOD_STAGED, 8, 512, 8, 2, 0, 0, 0, 0},
    {"staged+kernel 4+4 CTAs 30%", UMBP_GPU_METHOD_STAGED, 4, 512, 8, 1, 0, 0, 0, 30},
    {"auto (defaults)", UMBP_GPU_METHOD_AUTO, 0, 0, 0, 0, 0, 0, 0, 0},
    {"auto (defaults), packed", UMBP_GPU_METHOD_AUTO, 0, 0, 0, 0, 0, 0, 1, 0},
    {"staged  8 CTAs sorted, packed", UMBP_GPU_METHOD_STAGED, 8, 512, 8, 1, UMBP_GPU_SORT_BY_HOST,
     0, 1, 0},
    {"auto (defaults), in order", UMBP_GPU_METHOD_AUTO, 0, 0, 0, 0, 0, 0, 2, 0},
    {"kernel  8 CTAs, in order", UMBP_GPU_METHOD_KERNEL, 8, 512, 8, 0, 0, 0, 2, 0},
};

struct row {
    const char *geo, *name, *dir;
    double gbps, ratio, spread, base_gbps;
    int sms;
    const char *method;
    int ok;
};

static struct row rows[MAX_ROWS];
static int nrows;
static int reps = 20;
static int both_only; /* --both: only the contiguous and both-ways rows */
static uint64_t gpu_blocks = 2500; /* GPU blocks the 625 are picked from */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng = 88172645463325252ULL;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static const char *method_name(umbp_gpu_method_t m)
{
    switch (m) {
    case UMBP_GPU_METHOD_KERNEL:
        return "kernel";
    case UMBP_GPU_METHOD_STAGED:
        return "staged";
    case UMBP_GPU_METHOD_DMA:
        return "dma";
    default:
        return "auto";
    }
}

#define DIE_IF(cond, ...)                                                                     \
    do {                                                                                      \
        if (cond) {                                                                           \
            fprintf(stderr, "bench_gpu_copy: " __VA_ARGS__);                                  \
            fprintf(stderr, " [%s]\n", umbp_gpu_last_error());                                \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* Everything one geometry needs. */
struct setup {
    const struct geometry *g;
    umbp_gpu_engine_t *eng;
    const struct gpu_ops *o;
    umbp_kv_layout_t *lay;
    void *tensors[MAX_LAYERS];
    uint64_t chunk, tensor_bytes, obj_size, total;
    uint8_t *pool;     /* pinned, NUM_BLOCKS objects in shuffled slots */
    void *dev_contig;  /* device side of the contiguous baseline */
    gpu_stream_t stream;
    gpu_event_t done; /* end of a baseline copy */
    umbp_kv_block_io_t *io; /* io_gapped or io_packed */
    umbp_kv_block_io_t io_gapped[NUM_BLOCKS], io_packed[NUM_BLOCKS], io_inorder[NUM_BLOCKS];
};

static uint64_t chunk_off(const struct setup *s, uint64_t block, uint32_t kv)
{
    /* FlashAttention (2, nb, 16, H, 128): K of all blocks, then V. */
    return ((uint64_t)kv * gpu_blocks + block) * s->chunk;
}

static void setup_geometry(struct setup *s, const struct geometry *g, umbp_gpu_engine_t *eng)
{
    memset(s, 0, sizeof(*s));
    s->g = g;
    s->eng = eng;
    s->o = gpu_backend_ops(umbp_gpu_engine_backend(eng));
    s->chunk = (uint64_t)16 * g->heads * 128 * 2;
    s->tensor_bytes = 2 * gpu_blocks * s->chunk;
    s->obj_size = (uint64_t)g->layers * 2 * s->chunk;
    s->total = NUM_BLOCKS * s->obj_size;

    /* Random contents, different in every layer. */
    uint8_t *rbuf = malloc(s->tensor_bytes + 65536);
    DIE_IF(rbuf == NULL, "out of host memory");
    for (uint64_t i = 0; i < (s->tensor_bytes + 65536) / 8; i++) {
        uint64_t v = rnd();
        memcpy(rbuf + i * 8, &v, 8);
    }
    umbp_kv_tensor_t t[MAX_LAYERS];
    for (uint32_t l = 0; l < g->layers; l++) {
        int rc = gpu_dev_alloc(s->o, s->tensor_bytes, &s->tensors[l]);
        DIE_IF(rc < 0, "device memory for layer %u", l);
        rc = gpu_memcpy_sync(s->o, s->tensors[l], rbuf + l * 2048, s->tensor_bytes);
        DIE_IF(rc < 0, "upload");
        t[l] = (umbp_kv_tensor_t){.base = s->tensors[l], .ndim = 5,
                                  .shape = {2, gpu_blocks, 16, g->heads, 128}, .elem_size = 2,
                                  .block_dim = 1, .kv_dim = 0, .layer_dim = -1};
        umbp_kv_tensor_set_contiguous(&t[l]);
    }
    free(rbuf);
    int rc = umbp_kv_layout_create(eng, t, g->layers, &s->lay);
    DIE_IF(rc < 0, "layout: %s", umbp_gpu_strerror(rc));
    rc = umbp_gpu_host_alloc(eng, 2 * s->total, (void **)&s->pool);
    DIE_IF(rc < 0, "pinned pool of %" PRIu64 " bytes", 2 * s->total);
    memset(s->pool, 0xA5, 2 * s->total);
    rc = gpu_dev_alloc(s->o, s->total, &s->dev_contig);
    DIE_IF(rc < 0, "device buffer for the contiguous baseline");
    rc = gpu_stream_create(s->o, &s->stream);
    if (rc == 0)
        rc = gpu_event_create(s->o, &s->done);
    DIE_IF(rc < 0, "stream");

    /* 625 distinct random blocks; objects in shuffled pool slots. */
    uint8_t *used = calloc(gpu_blocks, 1);
    DIE_IF(used == NULL, "out of host memory");
    uint32_t slot[NUM_BLOCKS];
    for (uint32_t i = 0; i < NUM_BLOCKS; i++)
        slot[i] = i;
    for (uint32_t i = NUM_BLOCKS - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rnd() % (i + 1)), tmp = slot[i];
        slot[i] = slot[j];
        slot[j] = tmp;
    }
    for (uint32_t i = 0; i < NUM_BLOCKS; i++) {
        uint64_t b;
        do
            b = rnd() % gpu_blocks;
        while (used[b]);
        used[b] = 1;
        s->io_gapped[i] = (umbp_kv_block_io_t){
            .block = b, .host = s->pool + 2 * (uint64_t)slot[i] * s->obj_size};
        s->io_packed[i] = (umbp_kv_block_io_t){
            .block = b, .host = s->pool + (uint64_t)slot[i] * s->obj_size};
        s->io_inorder[i] = (umbp_kv_block_io_t){.block = b,
                                                .host = s->pool + (uint64_t)i * s->obj_size};
    }
    s->io = s->io_gapped;
    free(used);
}

static void teardown_geometry(struct setup *s)
{
    gpu_event_destroy(s->o, s->done);
    gpu_stream_destroy(s->o, s->stream);
    gpu_dev_free(s->o, s->dev_contig);
    umbp_gpu_host_free(s->eng, s->pool);
    umbp_kv_layout_destroy(s->lay);
    for (uint32_t l = 0; l < s->g->layers; l++)
        gpu_dev_free(s->o, s->tensors[l]);
}

/* Sample blocks checked after each variant: objects vs. GPU chunks. */
#define NSAMPLE 8

static int check_sample(struct setup *s, const char *what)
{
    uint8_t *tmp = malloc(s->chunk);
    int bad = 0;
    for (uint32_t k = 0; k < NSAMPLE && !bad; k++) {
        const umbp_kv_block_io_t *b = &s->io[k * (NUM_BLOCKS / NSAMPLE)];
        for (uint32_t l = 0; l < s->g->layers && !bad; l++)
            for (uint32_t kv = 0; kv < 2 && !bad; kv++) {
                const uint8_t *src = (const uint8_t *)s->tensors[l] + chunk_off(s, b->block, kv);
                if (gpu_memcpy_sync(s->o, tmp, src, s->chunk) < 0 ||
                    memcmp(tmp, (const uint8_t *)b->host + ((uint64_t)l * 2 + kv) * s->chunk,
                           s->chunk) != 0) {
                    fprintf(stderr, "  %s: block %" PRIu64 " layer %u kv %u differs\n", what,
                            b->block, l, kv);
                    bad = 1;
                }
            }
    }
    free(tmp);
    return !bad;
}

/* Poisons the sample's destination: host objects before a store, GPU
 * chunks before a restore, so a transfer that writes nothing is caught. */
static void poison_sample(struct setup *s, int restore)
{
    for (uint32_t k = 0; k < NSAMPLE; k++) {
        const umbp_kv_block_io_t *b = &s->io[k * (NUM_BLOCKS / NSAMPLE)];
        if (!restore) {
            memset(b->host, 0xA5, s->obj_size);
            continue;
        }
        for (uint32_t l = 0; l < s->g->layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++)
                gpu_memset_sync(s->o, (uint8_t *)s->tensors[l] + chunk_off(s, b->block, kv), 0x5A,
                                s->chunk);
    }
}

/* Waits for an event as umbp_gpu_xfer_wait waits for a transfer (query and
 * yield), so that baseline and engine rows pay the same for noticing the end. */
static int poll_event(struct setup *s, gpu_event_t e)
{
    int rc;
    while ((rc = gpu_event_query(s->o, e)) == UMBP_E_INPROGRESS)
        sched_yield();
    return rc;
}

/* Seconds of one contiguous pinned memcpy of all the bytes. */
static double one_contiguous(struct setup *s, int restore)
{
    double t0 = now_s();
    int rc = restore ? gpu_memcpy_async(s->o, s->dev_contig, s->pool, s->total, s->stream)
                     : gpu_memcpy_async(s->o, s->pool, s->dev_contig, s->total, s->stream);
    if (rc == 0)
        rc = gpu_event_record(s->o, s->done, s->stream);
    if (rc == 0)
        rc = poll_event(s, s->done);
    double t1 = now_s();
    DIE_IF(rc < 0, "contiguous memcpy");
    return t1 - t0;
}

/* Seconds of one transfer of the prefix through the engine. */
static double one_engine(struct setup *s, int restore, umbp_gpu_method_t *used)
{
    umbp_kv_xfer_desc_t d = {.layout = s->lay, .blocks = s->io, .num_blocks = NUM_BLOCKS};
    umbp_gpu_xfer_t *x = NULL;
    double t0 = now_s();
    int rc = restore ? umbp_gpu_restore(s->eng, &d, &x) : umbp_gpu_store(s->eng, &d, &x);
    DIE_IF(rc < 0, "%s: %s", restore ? "restore" : "store", umbp_gpu_strerror(rc));
    rc = umbp_gpu_xfer_wait(x, -1);
    double t1 = now_s();
    DIE_IF(rc < 0, "transfer failed: %s", umbp_gpu_strerror(rc));
    *used = umbp_gpu_xfer_method(x);
    umbp_gpu_xfer_release(x);
    return t1 - t0;
}

static double median(double *t, int n, double *spread)
{
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    if (spread != NULL)
        *spread = (t[n - 1] - t[0]) / t[n / 2];
    return t[n / 2];
}

/* n runs of one direction through the engine, each right after a run of the
 * contiguous baseline, so that both see the same state of the link: median
 * seconds of each. */
static double time_engine(struct setup *s, int restore, int n, double *spread,
                          umbp_gpu_method_t *used, double *base)
{
    double t[64], b[64];
    for (int i = -1; i < n; i++) { /* i = -1: warm-up */
        double tb = one_contiguous(s, restore);
        double te = one_engine(s, restore, used);
        if (i >= 0)
            t[i] = te, b[i] = tb;
    }
    *base = median(b, n, NULL);
    return median(t, n, spread);
}

static double time_contiguous(struct setup *s, int restore, double *spread)
{
    double t[64];
    for (int i = -1; i < reps; i++) {
        double ti = one_contiguous(s, restore);
        if (i >= 0)
            t[i] = ti;
    }
    return median(t, reps, spread);
}

/* Median GPU seconds of the copy kernel alone between the tensors and the
 * contiguous device buffer (objects back to back): the staged method's SM
 * work for a whole prefix, without the copy engine. */
static double time_kernel_only(struct setup *s, int restore, unsigned ctas, double *spread)
{
    struct gpu_copy_block *tab = malloc(NUM_BLOCKS * sizeof(*tab));
    DIE_IF(tab == NULL, "out of host memory");
    for (uint32_t i = 0; i < NUM_BLOCKS; i++)
        tab[i] = (struct gpu_copy_block){
            .gpu_block = s->io[i].block,
            .obj = (uint64_t)(uintptr_t)s->dev_contig + (uint64_t)i * s->obj_size};
    void *dtab = NULL;
    gpu_event_t e0 = NULL, e1 = NULL;
    int rc = gpu_dev_alloc(s->o, NUM_BLOCKS * sizeof(*tab), &dtab);
    if (rc == 0)
        rc = gpu_memcpy_sync(s->o, dtab, tab, NUM_BLOCKS * sizeof(*tab));
    if (rc == 0)
        rc = gpu_event_create_timed(s->o, &e0);
    if (rc == 0)
        rc = gpu_event_create_timed(s->o, &e1);
    DIE_IF(rc < 0, "kernel-only setup");
    struct gpu_copy_args a = {.layers = s->lay->dlayers, .blocks = dtab, .sm_mask = NULL,
                              .num_blocks = NUM_BLOCKS, .first_layer = 0,
                              .num_layers = s->g->layers, .nkv = 2, .to_gpu = (uint32_t)restore};
    double t[64];
    for (int i = -1; i < reps; i++) {
        float ms = 0;
        rc = gpu_event_record(s->o, e0, s->stream);
        if (rc == 0)
            rc = gpu_launch_copy(s->o, &a, ctas, 512, 8, s->stream);
        if (rc == 0)
            rc = gpu_event_record(s->o, e1, s->stream);
        if (rc == 0)
            rc = gpu_event_sync(s->o, e1);
        if (rc == 0)
            rc = gpu_event_elapsed_ms(s->o, &ms, e0, e1);
        DIE_IF(rc < 0, "kernel-only run");
        if (i >= 0)
            t[i] = ms / 1e3;
    }
    gpu_event_destroy(s->o, e0);
    gpu_event_destroy(s->o, e1);
    gpu_dev_free(s->o, dtab);
    free(tab);
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    *spread = (t[reps - 1] - t[0]) / t[reps / 2];
    return t[reps / 2];
}

/* Both directions at once: a store of the gapped objects and a restore of
 * the packed ones submitted together (they share GPU blocks and pool slots,
 * so this is timing only: test_gpu_copy's "both ways" cases check the bytes
 * of concurrent transfers), against a host-to-device and a device-to-host
 * contiguous memcpy of the same bytes on two streams, run alternately.
 * Median seconds of each for 2 * total bytes. */
static double time_both(struct setup *s, int restore_first, double *spread, double *base)
{
    gpu_stream_t s2 = NULL;
    gpu_event_t d2 = NULL;
    int rc = gpu_stream_create(s->o, &s2);
    if (rc == 0)
        rc = gpu_event_create(s->o, &d2);
    DIE_IF(rc < 0, "both ways: second stream");
    double t[64], b[64];
    for (int i = -1; i < reps; i++) {
        double t0 = now_s();
        rc = gpu_memcpy_async(s->o, s->dev_contig, s->pool, s->total, s->stream);
        if (rc == 0)
            rc = gpu_memcpy_async(s->o, s->pool + s->total, s->dev_contig, s->total, s2);
        if (rc == 0)
            rc = gpu_event_record(s->o, s->done, s->stream);
        if (rc == 0)
            rc = gpu_event_record(s->o, d2, s2);
        if (rc == 0)
            rc = poll_event(s, s->done);
        if (rc == 0)
            rc = poll_event(s, d2);
        double t1 = now_s();
        DIE_IF(rc < 0, "both ways: contiguous memcpys");
        umbp_kv_xfer_desc_t ds = {.layout = s->lay, .blocks = s->io_gapped, .num_blocks = NUM_BLOCKS};
        umbp_kv_xfer_desc_t dr = {.layout = s->lay, .blocks = s->io_packed, .num_blocks = NUM_BLOCKS};
        umbp_gpu_xfer_t *xs = NULL, *xr = NULL;
        double t2 = now_s();
        rc = restore_first ? umbp_gpu_restore(s->eng, &dr, &xr) : umbp_gpu_store(s->eng, &ds, &xs);
        if (rc == 0)
            rc = restore_first ? umbp_gpu_store(s->eng, &ds, &xs) : umbp_gpu_restore(s->eng, &dr, &xr);
        if (rc == 0)
            rc = umbp_gpu_xfer_wait(xs, -1);
        if (rc == 0)
            rc = umbp_gpu_xfer_wait(xr, -1);
        double t3 = now_s();
        DIE_IF(rc < 0, "both ways: %s", umbp_gpu_strerror(rc));
        umbp_gpu_xfer_release(xs);
        umbp_gpu_xfer_release(xr);
        if (i >= 0)
            b[i] = t1 - t0, t[i] = t3 - t2;
    }
    gpu_event_destroy(s->o, d2);
    gpu_stream_destroy(s->o, s2);
    *base = median(b, reps, NULL);
    return median(t, reps, spread);
}

static void add_row(const struct setup *s, const char *name, const char *dir, double secs,
                    double base_secs, double spread, int sms, const char *method, int ok)
{
    if (nrows == MAX_ROWS)
        return;
    struct row *r = &rows[nrows++];
    *r = (struct row){.geo = s->g->name, .name = name, .dir = dir,
                      .gbps = (double)s->total / secs / 1e9, .ratio = base_secs / secs,
                      .spread = spread, .sms = sms, .method = method, .ok = ok,
                      .base_gbps = (double)s->total / base_secs / 1e9};
    printf("RESULT,%s,%s,%s,%.2f,%.3f,%d,%s,%.3f,%s,%.2f\n", r->geo, dir, name, r->gbps, r->ratio,
           sms, method, spread, ok < 0 ? "timing" : ok ? "ok" : "WRONG", r->base_gbps);
    fflush(stdout);
}

static void run_geometry(umbp_gpu_engine_t *eng, const struct geometry *g)
{
    struct setup s;
    double t0 = now_s();
    setup_geometry(&s, g, eng);
    printf("# %s: %u layers, chunk %" PRIu64 " B, object %" PRIu64 " B, %d blocks = %" PRIu64
           " bytes (setup %.1f s)\n", g->name, g->layers, s.chunk, s.obj_size, NUM_BLOCKS,
           s.total, now_s() - t0);
    double base[2], spread;
    for (int dir = 0; dir < 2; dir++) {
        base[dir] = time_contiguous(&s, dir, &spread);
        add_row(&s, "contiguous memcpy", dir ? "restore" : "store", base[dir], base[dir], spread,
                0, "dma", 1);
    }
    if (both_only)
        goto both;
    static const char *const kname[2][3] = {
        {"gather alone  2 CTAs (D2D)", "gather alone  4 CTAs (D2D)", "gather alone  8 CTAs (D2D)"},
        {"scatter alone 2 CTAs (D2D)", "scatter alone 4 CTAs (D2D)", "scatter alone 8 CTAs (D2D)"}};
    for (int dir = 0; dir < 2; dir++)
        for (int k = 0; k < 3; k++) {
            unsigned ctas = 2u << k;
            double secs = time_kernel_only(&s, dir, ctas, &spread);
            add_row(&s, kname[dir][k], dir ? "restore" : "store", secs, base[dir], spread,
                    (int)ctas, "kernel", 1);
        }
    umbp_gpu_config_t def;
    umbp_gpu_engine_get_config(eng, &def);
    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
        const struct variant *va = &variants[v];
        umbp_gpu_config_t c = def;
        if (va->method != UMBP_GPU_METHOD_AUTO || va->ctas != 0) {
            c.store_method = c.restore_method = va->method;
            c.max_ctas = va->ctas;
            c.threads_per_cta = va->threads;
            c.vec_per_lane = va->vec;
            c.copy_streams = va->copy_streams;
            c.kernel_share_pct = va->share;
            /* The row's flags on top of the engine's defaults (L2 hints). */
            c.flags = (def.flags & (UMBP_GPU_RECORD_SMS | UMBP_GPU_L2_DISCARD_STAGING |
                                    UMBP_GPU_EVICT_FIRST_RESTORE)) |
                      va->flags;
        }
        int rc = umbp_gpu_engine_set_tuning(eng, &c);
        DIE_IF(rc < 0, "set_tuning %s", va->name);
        int n = va->few_reps ? (reps < 3 ? reps : 3) : reps;
        s.io = va->placement == 2 ? s.io_inorder : va->placement ? s.io_packed : s.io_gapped;
        for (int dir = 0; dir < 2; dir++) {
            umbp_gpu_method_t used = UMBP_GPU_METHOD_AUTO;
            poison_sample(&s, dir);
            (void)umbp_gpu_engine_sms_used(eng); /* reset */
            double pair_base = 0;
            double secs = time_engine(&s, dir, n, &spread, &used, &pair_base);
            int sms = umbp_gpu_engine_sms_used(eng);
            int ok = check_sample(&s, va->name);
            add_row(&s, va->name, dir ? "restore" : "store", secs, pair_base, spread,
                    used == UMBP_GPU_METHOD_DMA ? 0 : sms, method_name(used), ok);
        }
    }
    umbp_gpu_engine_set_tuning(eng, &def);
both:;
    /* rows of 2 * total bytes: add_row counts total, so halve the times */
    for (int rf = 0; rf < 2; rf++) {
        double bb, tb = time_both(&s, rf, &spread, &bb);
        add_row(&s, rf ? "restore + store together (auto)" : "store + restore together (auto)",
                "both", tb / 2, bb / 2, spread, 0, "auto", -1); /* bytes: test_gpu_copy */
    }
    teardown_geometry(&s);
}

int main(int argc, char **argv)
{
    umbp_gpu_backend_t b = UMBP_GPU_BACKEND_AUTO;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > 64)
                reps = 20;
        } else if (strcmp(argv[i], "--both") == 0) {
            both_only = 1;
        } else if (strcmp(argv[i], "--host") == 0) {
            b = UMBP_GPU_BACKEND_HOST;
            gpu_blocks = 700;
        } else {
            fprintf(stderr, "usage: %s [--reps N] [--both] [--host]\n", argv[0]);
            return 2;
        }
    }
    int n = 0;
    if (b == UMBP_GPU_BACKEND_HOST)
        ;
    else if (umbp_gpu_backend_probe(UMBP_GPU_BACKEND_CUDA, &n) == 0)
        b = UMBP_GPU_BACKEND_CUDA;
    else if (umbp_gpu_backend_probe(UMBP_GPU_BACKEND_HIP, &n) == 0)
        b = UMBP_GPU_BACKEND_HIP;
    if (b == UMBP_GPU_BACKEND_AUTO) {
        printf("SKIP: no GPU device: %s\n", umbp_gpu_last_error());
        return 0;
    }
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = b;
    cfg.flags |= UMBP_GPU_RECORD_SMS;
    umbp_gpu_engine_t *eng = NULL;
    int rc = umbp_gpu_engine_create(&cfg, &eng);
    DIE_IF(rc < 0, "engine: %s", umbp_gpu_strerror(rc));
    char name[256];
    umbp_gpu_engine_device_name(eng, name, sizeof(name));
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("# device: %s (%s backend), %d SMs; %s; reps %d; defaults: %u CTAs x %u threads, "
           "vec %u, staging %" PRIu64 " MiB\n", name, umbp_gpu_backend_name(b),
           umbp_gpu_engine_num_sms(eng), date, reps, cfg.max_ctas, cfg.threads_per_cta,
           cfg.vec_per_lane, cfg.staging_bytes >> 20);
    printf("RESULT,geometry,dir,variant,GB/s,ratio,SMs,method,spread,check,baseline GB/s\n");

    int gpu_dev = umbp_gpu_engine_device(eng), prev;
    const struct gpu_ops *o = gpu_backend_ops(b);
    gpu_device_enter(o, gpu_dev, &prev);
    for (size_t g = 0; g < sizeof(geos) / sizeof(geos[0]); g++)
        run_geometry(eng, &geos[g]);
    gpu_device_leave(o, gpu_dev, prev);

    /* The summary table last, where a tail of the output shows it. */
    printf("\n%-12s %-7s %-30s %6s %6s %5s %4s %-6s %s\n", "geometry", "dir", "variant", "GB/s",
           "base", "ratio", "SMs", "method", "check");
    int wrong = 0;
    for (int i = 0; i < nrows; i++) {
        const struct row *r = &rows[i];
        printf("%-12s %-7s %-30s %6.2f %6.2f %5.3f %4d %-6s %s\n", r->geo, r->dir, r->name,
               r->gbps, r->base_gbps, r->ratio, r->sms, r->method,
               r->ok < 0 ? "timing" : r->ok ? "ok" : "WRONG");
        wrong += !r->ok;
    }
    umbp_gpu_engine_destroy(eng);
    return wrong ? 1 : 0;
}
