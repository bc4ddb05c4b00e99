/*
 * test_gpu_copy.c - byte-exact store/restore through the GPU copy engine.
 *
 * For every layout (FlashAttention, FlashInfer, FlashInfer with padded block
 * stride, MLA, cross-layer, and the benchmark's three geometries), every
 * method (kernel, staged, DMA) and several ranges (all layers and blocks, a
 * layer subset of a block subset, one layer): random data in, poisoned
 * destinations, then every byte of the destination compared with what an
 * independent model of the layout says (the model below spells out each
 * layout's offsets by hand rather than from strides).  Plus the error cases
 * of layout registration and transfers, and the caller-event hand-off.
 *
 *   test_gpu_copy --backend host     host-only backend (CI, no GPU)
 *   test_gpu_copy --backend device   CUDA or HIP; one "SKIP:" line and exit 0
 *                                    when no device is present
 *   --seed N                         repeat a run (the seed is printed)
 *   --small                          device sizes as small as the host's (for
 *                                    compute-sanitizer runs)
 *
 * Plain C (Criterion is not on the GPU machine); ends with
 * "N passed, N failed" and exits 1 if any failed.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h" /* private: the transfers' tables, for the warm-up test */
#include "gpu.h"    /* private: device allocation and copies for the test */
#include "umbp/gpu.h"

static int n_passed, n_failed;
static uint64_t rng_state;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (cond) {                                                                           \
            n_passed++;                                                                       \
        } else {                                                                              \
            n_failed++;                                                                       \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                       \
            printf(__VA_ARGS__);                                                              \
            printf(" [%s]\n", umbp_gpu_last_error());                                         \
        }                                                                                     \
    } while (0)

static uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static void fill_random(uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rnd();
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)rnd();
}

/* ---- layouts, modelled by hand ------------------------------------------ */

enum kind { FA, FA_HND, FI, FI_PADDED, MLA, XL };
/* FA_HND: vLLM's HND stride order: shape (2, nb, bs, H, D) as a view of
 * memory laid out (2, nb, H, bs, D); a chunk is still contiguous. */

struct spec {
    const char *name;
    enum kind kind;
    uint32_t layers;
    uint32_t bs, heads, dim; /* chunk = bs * heads * dim * 2 bytes (bf16) */
};

static const struct spec specs[] = {
    {"flash-attn 4L", FA, 4, 16, 2, 64},
    {"flash-attn HND 4L", FA_HND, 4, 16, 4, 64},
    {"flashinfer 3L", FI, 3, 16, 2, 64},
    {"flashinfer padded 3L", FI_PADDED, 3, 8, 1, 128},
    {"mla 5L", MLA, 5, 16, 1, 576},
    {"cross-layer 4L", XL, 4, 16, 2, 32},
    {"bench 32L x 32KiB", FA, 32, 16, 8, 128},
    {"bench 24L x 16KiB", FA, 24, 16, 4, 128},
    {"bench 32L x 4KiB", FA, 32, 16, 1, 128},
};

#define PAD_BYTES 4096 /* FI_PADDED: extra bytes between blocks */

struct model {
    const struct spec *s;
    uint64_t nb;         /* GPU blocks */
    uint32_t nkv;
    uint64_t chunk;      /* bytes */
    uint32_t ntensors;
    uint64_t tensor_bytes;
    uint64_t obj_size;
    void *dev[64];       /* device tensors */
    uint8_t *mirror[64]; /* what each tensor should hold */
    umbp_kv_tensor_t t[64];
};

/* Where (tensor, byte offset) the chunk of (layer, block, kv) lives. */
static void model_chunk(const struct model *m, uint32_t l, uint64_t b, uint32_t kv,
                        uint32_t *tensor, uint64_t *off)
{
    uint64_t c = m->chunk;
    *tensor = m->s->kind == XL ? 0 : l;
    switch (m->s->kind) {
    case FA:
    case FA_HND:
        *off = ((uint64_t)kv * m->nb + b) * c;
        break;
    case FI:
        *off = (b * 2 + kv) * c;
        break;
    case FI_PADDED:
        *off = b * (2 * c + PAD_BYTES) + kv * c;
        break;
    case MLA:
        *off = b * c;
        break;
    case XL:
        *off = ((b * m->s->layers + l) * 2 + kv) * c;
        break;
    }
}

static uint64_t model_obj_off(const struct model *m, uint32_t l, uint32_t kv)
{
    return ((uint64_t)l * m->nkv + kv) * m->chunk;
}

/* Describes the tensors as an engine would (torch shapes and strides). */
static void model_describe(struct model *m)
{
    const struct spec *s = m->s;
    int64_t nb = (int64_t)m->nb, bs = s->bs, h = s->heads, d = s->dim;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        umbp_kv_tensor_t *t = &m->t[i];
        memset(t, 0, sizeof(*t));
        t->base = m->dev[i];
        t->elem_size = 2;
        t->layer_dim = -1;
        switch (s->kind) {
        case FA:
        case FA_HND:
            t->ndim = 5;
            memcpy(t->shape, (int64_t[]){2, nb, bs, h, d}, 5 * sizeof(int64_t));
            t->block_dim = 1;
            t->kv_dim = 0;
            break;
        case FI:
        case FI_PADDED:
            t->ndim = 5;
            memcpy(t->shape, (int64_t[]){nb, 2, bs, h, d}, 5 * sizeof(int64_t));
            t->block_dim = 0;
            t->kv_dim = 1;
            break;
        case MLA:
            t->ndim = 3;
            memcpy(t->shape, (int64_t[]){nb, bs, d}, 3 * sizeof(int64_t));
            t->block_dim = 0;
            t->kv_dim = -1;
            break;
        case XL:
            t->ndim = 6;
            memcpy(t->shape, (int64_t[]){nb, s->layers, 2, bs, h, d}, 6 * sizeof(int64_t));
            t->block_dim = 0;
            t->layer_dim = 1;
            t->kv_dim = 2;
            break;
        }
        umbp_kv_tensor_set_contiguous(t);
        if (s->kind == FA_HND) { /* (2, nb, bs, H, D) over memory (2, nb, H, bs, D) */
            t->stride[4] = 1;
            t->stride[2] = d;
            t->stride[3] = bs * d;
        }
        if (s->kind == FI_PADDED)
            t->stride[0] += PAD_BYTES / 2;
    }
}

static int model_init(struct model *m, const struct spec *s, uint64_t nb,
                      const struct gpu_ops *o)
{
    memset(m, 0, sizeof(*m));
    m->s = s;
    m->nb = nb;
    m->nkv = s->kind == MLA ? 1 : 2;
    m->chunk = (uint64_t)s->bs * s->heads * s->dim * 2;
    m->ntensors = s->kind == XL ? 1 : s->layers;
    uint64_t per_layer = nb * m->nkv * m->chunk + (s->kind == FI_PADDED ? nb * PAD_BYTES : 0);
    m->tensor_bytes = s->kind == XL ? per_layer * s->layers : per_layer;
    m->obj_size = (uint64_t)s->layers * m->nkv * m->chunk;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (gpu_dev_alloc(o, m->tensor_bytes, &m->dev[i]) < 0)
            return -ENOMEM;
        m->mirror[i] = malloc(m->tensor_bytes);
        if (m->mirror[i] == NULL)
            return -ENOMEM;
    }
    model_describe(m);
    return 0;
}

static void model_free(struct model *m, const struct gpu_ops *o)
{
    for (uint32_t i = 0; i < m->ntensors; i++) {
        gpu_dev_free(o, m->dev[i]);
        free(m->mirror[i]);
    }
}

/* Copies the mirrors to the device. */
static int model_upload(struct model *m, const struct gpu_ops *o)
{
    for (uint32_t i = 0; i < m->ntensors; i++) {
        int rc = gpu_memcpy_sync(o, m->dev[i], m->mirror[i], m->tensor_bytes);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Compares every byte of the device tensors with the mirrors. */
static int model_check_device(struct model *m, const struct gpu_ops *o, const char *what)
{
    uint8_t *buf = malloc(m->tensor_bytes);
    int bad = 0;
    for (uint32_t i = 0; buf != NULL && i < m->ntensors && !bad; i++) {
        if (gpu_memcpy_sync(o, buf, m->dev[i], m->tensor_bytes) < 0) {
            bad = 1;
            break;
        }
        if (memcmp(buf, m->mirror[i], m->tensor_bytes) != 0) {
            uint64_t k = 0;
            while (buf[k] == m->mirror[i][k])
                k++;
            printf("  %s: tensor %u differs at byte %" PRIu64 " (chunk %" PRIu64 "+%" PRIu64
                   "): got 0x%02x, want 0x%02x\n", what, i, k, k / m->chunk, k % m->chunk,
                   buf[k], m->mirror[i][k]);
            bad = 1;
        }
    }
    free(buf);
    return buf == NULL ? 1 : bad;
}

/* ---- one transfer case -------------------------------------------------- */

struct env {
    umbp_gpu_engine_t *eng;
    const struct gpu_ops *o;
    umbp_kv_layout_t *lay;
    uint8_t *pool;      /* registered host memory: nslots objects */
    uint8_t *expect;    /* what the pool should hold */
    uint64_t nslots;
    struct model m;
};

/* Layers [first, last) of each (block, slot) pair between the mirror of the
 * GPU tensors and the pool: what a store leaves in e->expect (to_mirror
 * false: mirror -> expect), or what a restore leaves in the mirror (true:
 * pool -> mirror). */
static void move_pairs(struct env *e, const uint64_t *blocks, const uint64_t *slots, size_t n,
                       uint32_t first, uint32_t last, bool to_mirror)
{
    struct model *m = &e->m;
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = first; l < last; l++)
            for (uint32_t kv = 0; kv < m->nkv; kv++) {
                uint32_t t = 0;
                uint64_t off = 0;
                model_chunk(m, l, blocks[i], kv, &t, &off);
                uint64_t at = slots[i] * m->obj_size + model_obj_off(m, l, kv);
                if (to_mirror)
                    memcpy(m->mirror[t] + off, e->pool + at, m->chunk);
                else
                    memcpy(e->expect + at, m->mirror[t] + off, m->chunk);
            }
}

static void expect_stored(struct env *e, const uint64_t *blocks, const uint64_t *slots, size_t n,
                          uint32_t first, uint32_t last)
{
    move_pairs(e, blocks, slots, n, first, last, false);
}

static void mirror_restored(struct env *e, const uint64_t *blocks, const uint64_t *slots, size_t n,
                            uint32_t first, uint32_t last)
{
    move_pairs(e, blocks, slots, n, first, last, true);
}

/* Random distinct values in [0, n). */
static void pick_distinct(uint64_t *out, size_t k, uint64_t n)
{
    for (size_t i = 0; i < k; i++) {
        uint64_t v;
        size_t j;
        do {
            v = rnd() % n;
            for (j = 0; j < i && out[j] != v; j++)
                ;
        } while (j < i);
        out[i] = v;
    }
}

static void run_case(struct env *e, umbp_gpu_method_t method, size_t nsel, uint32_t first,
                     uint32_t count, const char *label)
{
    struct model *m = &e->m;
    const struct gpu_ops *o = e->o;
    uint64_t blocks[256], slots[256];
    umbp_kv_block_io_t io[256];
    pick_distinct(blocks, nsel, m->nb);
    pick_distinct(slots, nsel, e->nslots);
    for (size_t i = 0; i < nsel; i++) {
        io[i].block = blocks[i];
        io[i].host = e->pool + slots[i] * m->obj_size;
    }
    uint32_t last = first + (count ? count : m->s->layers - first);
    umbp_kv_xfer_desc_t d = {.layout = e->lay, .blocks = io, .num_blocks = nsel,
                             .first_layer = first, .num_layers = count};
    size_t pool_bytes = e->nslots * m->obj_size;

    /* Store: random GPU tensors, poisoned pool. */
    for (uint32_t i = 0; i < m->ntensors; i++)
        fill_random(m->mirror[i], m->tensor_bytes);
    int rc = model_upload(m, o);
    memset(e->pool, 0xA5, pool_bytes);
    memset(e->expect, 0xA5, pool_bytes);
    expect_stored(e, blocks, slots, nsel, first, last);
    umbp_gpu_xfer_t *x = NULL;
    if (rc == 0)
        rc = umbp_gpu_store(e->eng, &d, &x);
    if (rc == 0) {
        rc = umbp_gpu_xfer_wait(x, 30000);
        CHECK(umbp_gpu_xfer_method(x) == method, "%s store: method %d, wanted %d", label,
              umbp_gpu_xfer_method(x), method);
        CHECK(umbp_gpu_xfer_bytes(x) == nsel * (uint64_t)(last - first) * m->nkv * m->chunk,
              "%s store: %" PRIu64 " bytes", label, umbp_gpu_xfer_bytes(x));
        umbp_gpu_xfer_release(x);
    }
    CHECK(rc == 0, "%s store: %s", label, umbp_gpu_strerror(rc));
    int same = memcmp(e->pool, e->expect, pool_bytes) == 0;
    if (!same) {
        size_t k = 0;
        while (e->pool[k] == e->expect[k])
            k++;
        printf("  pool differs at byte %zu (object slot %zu, +%zu): got 0x%02x want 0x%02x\n", k,
               k / m->obj_size, k % m->obj_size, e->pool[k], e->expect[k]);
    }
    CHECK(same, "%s store: every byte of the pool as expected", label);
    CHECK(model_check_device(m, o, "after store") == 0, "%s store left the GPU tensors alone",
          label);

    /* Restore: random objects, poisoned GPU tensors. */
    fill_random(e->pool, pool_bytes);
    for (uint32_t i = 0; i < m->ntensors; i++)
        memset(m->mirror[i], 0x5A, m->tensor_bytes);
    rc = model_upload(m, o);
    mirror_restored(e, blocks, slots, nsel, first, last);
    if (rc == 0)
        rc = umbp_gpu_restore(e->eng, &d, &x);
    if (rc == 0) {
        rc = umbp_gpu_xfer_wait(x, 30000);
        CHECK(umbp_gpu_xfer_method(x) == method, "%s restore: method %d, wanted %d", label,
              umbp_gpu_xfer_method(x), method);
        umbp_gpu_xfer_release(x);
    }
    CHECK(rc == 0, "%s restore: %s", label, umbp_gpu_strerror(rc));
    CHECK(model_check_device(m, o, "after restore") == 0,
          "%s restore: every byte of the GPU tensors as expected", label);
}

/* A store and a restore in flight together (one lane of streams and
 * staging slots each): a store from GPU blocks S into pool slots P1 and a
 * restore from slots P2 into blocks R, submitted in either order; every
 * byte of the pool and of the GPU tensors must come out as if they had run
 * one after the other. */
static void run_both_ways(struct env *e, size_t nsel, int restore_first, const char *label)
{
    struct model *m = &e->m;
    const struct gpu_ops *o = e->o;
    uint64_t blocks[512], slots[512];
    umbp_kv_block_io_t st[256], rs[256];
    pick_distinct(blocks, 2 * nsel, m->nb);
    pick_distinct(slots, 2 * nsel, e->nslots);
    for (size_t i = 0; i < nsel; i++) {
        st[i] = (umbp_kv_block_io_t){.block = blocks[i], .host = e->pool + slots[i] * m->obj_size};
        rs[i] = (umbp_kv_block_io_t){.block = blocks[nsel + i],
                                     .host = e->pool + slots[nsel + i] * m->obj_size};
    }
    umbp_kv_xfer_desc_t ds = {.layout = e->lay, .blocks = st, .num_blocks = nsel};
    umbp_kv_xfer_desc_t dr = {.layout = e->lay, .blocks = rs, .num_blocks = nsel};
    size_t pool_bytes = e->nslots * m->obj_size;

    for (uint32_t i = 0; i < m->ntensors; i++)
        fill_random(m->mirror[i], m->tensor_bytes);
    int rc = model_upload(m, o);
    fill_random(e->pool, pool_bytes);
    memcpy(e->expect, e->pool, pool_bytes);
    expect_stored(e, blocks, slots, nsel, 0, m->s->layers);                    /* S -> P1 */
    mirror_restored(e, blocks + nsel, slots + nsel, nsel, 0, m->s->layers);    /* P2 -> R */
    umbp_gpu_xfer_t *xs = NULL, *xr = NULL;
    if (rc == 0 && restore_first)
        rc = umbp_gpu_restore(e->eng, &dr, &xr);
    if (rc == 0)
        rc = umbp_gpu_store(e->eng, &ds, &xs);
    if (rc == 0 && !restore_first)
        rc = umbp_gpu_restore(e->eng, &dr, &xr);
    int rs_rc = xr != NULL ? umbp_gpu_xfer_wait(xr, 30000) : rc;
    int st_rc = xs != NULL ? umbp_gpu_xfer_wait(xs, 30000) : rc;
    umbp_gpu_xfer_release(xr);
    umbp_gpu_xfer_release(xs);
    CHECK(rc == 0 && st_rc == 0 && rs_rc == 0, "%s both ways (%s first): %s / %s / %s", label,
          restore_first ? "restore" : "store", umbp_gpu_strerror(rc), umbp_gpu_strerror(st_rc),
          umbp_gpu_strerror(rs_rc));
    CHECK(memcmp(e->pool, e->expect, pool_bytes) == 0,
          "%s both ways (%s first): every byte of the pool as expected", label,
          restore_first ? "restore" : "store");
    CHECK(model_check_device(m, o, "both ways") == 0,
          "%s both ways (%s first): every byte of the GPU tensors as expected", label,
          restore_first ? "restore" : "store");
}

/* A sliced store and restore as the runtime submits them: three transfers
 * of one batch submitted back to back before any is waited for, the first
 * two flagged UMBP_KV_XFER_FOLLOWED.  Run with the engine's
 * UMBP_GPU_RAMP_OVERLAPPED (every end ramped) and without it (the flagged
 * ones end without a ramp-down, the later ones start without a ramp-up
 * where they find the lane's copies still queued).
 * Group sizes change no byte: the pool after the stores, and the GPU
 * tensors after the restores into poisoned blocks, are compared whole. */
static uint32_t run_slices(struct env *e, size_t nsel, const char *label)
{
    struct model *m = &e->m;
    const struct gpu_ops *o = e->o;
    uint64_t blocks[256], slots[256];
    umbp_kv_block_io_t io[256];
    uint32_t groups = 0; /* copy groups of the flagged transfers, both ways */
    if (nsel < 3)
        return 0;
    pick_distinct(blocks, nsel, m->nb);
    pick_distinct(slots, nsel, e->nslots);
    for (size_t i = 0; i < nsel; i++)
        io[i] = (umbp_kv_block_io_t){.block = blocks[i], .host = e->pool + slots[i] * m->obj_size};
    size_t cut[4] = {0, nsel / 4, nsel / 4 + nsel / 2, nsel}; /* a half slice first, as kv.c */
    umbp_kv_xfer_desc_t d[3];
    for (int c = 0; c < 3; c++)
        d[c] = (umbp_kv_xfer_desc_t){.layout = e->lay, .blocks = io + cut[c],
                                     .num_blocks = cut[c + 1] - cut[c],
                                     .flags = c < 2 ? UMBP_KV_XFER_FOLLOWED : 0};
    size_t pool_bytes = e->nslots * m->obj_size;
    for (uint32_t i = 0; i < m->ntensors; i++)
        fill_random(m->mirror[i], m->tensor_bytes);
    int rc = model_upload(m, o);
    memset(e->pool, 0xA5, pool_bytes);
    memset(e->expect, 0xA5, pool_bytes);
    expect_stored(e, blocks, slots, nsel, 0, m->s->layers);
    for (int dir = 0; dir < 2 && rc == 0; dir++) {
        if (dir == 1) { /* restores: random objects into poisoned tensors */
            fill_random(e->pool, pool_bytes);
            for (uint32_t i = 0; i < m->ntensors; i++)
                memset(m->mirror[i], 0x5A, m->tensor_bytes);
            rc = model_upload(m, o);
            mirror_restored(e, blocks, slots, nsel, 0, m->s->layers);
        }
        umbp_gpu_xfer_t *x[3] = {NULL, NULL, NULL};
        for (int c = 0; c < 3 && rc == 0; c++)
            rc = dir ? umbp_gpu_restore(e->eng, &d[c], &x[c]) : umbp_gpu_store(e->eng, &d[c], &x[c]);
        for (int c = 0; c < 3; c++) {
            int wrc = x[c] ? umbp_gpu_xfer_wait(x[c], 30000) : 0;
            if (rc == 0)
                rc = wrc;
            if (x[c] && c < 2)
                groups += x[c]->groups;
            umbp_gpu_xfer_release(x[c]);
        }
        CHECK(rc == 0, "%s slices (%s): %s", label, dir ? "restores" : "stores",
              umbp_gpu_strerror(rc));
        if (dir == 0) {
            CHECK(rc == 0 && memcmp(e->pool, e->expect, pool_bytes) == 0,
                  "%s slices: every byte of the pool as expected after the stores", label);
            CHECK(model_check_device(m, o, "after sliced stores") == 0,
                  "%s slices: the stores left the GPU tensors alone", label);
        }
    }
    CHECK(rc == 0 && model_check_device(m, o, "slices") == 0,
          "%s slices: every byte of the GPU tensors as expected after the restores", label);
    return groups;
}

static const char *method_name(umbp_gpu_method_t m)
{
    return m == UMBP_GPU_METHOD_KERNEL ? "kernel" : m == UMBP_GPU_METHOD_STAGED ? "staged" : "dma";
}

/* Kernel shapes other than the defaults (CTAs, threads, 16-byte loads in
 * flight per lane); zeros = defaults. */
struct tuning {
    uint32_t ctas, threads, vec, copy_streams, share, flags;
};

/* All cases of one layout and method on one backend. */
static void run_layout(umbp_gpu_backend_t b, const struct spec *s, umbp_gpu_method_t method,
                       int big, struct tuning tu)
{
    struct env e;
    memset(&e, 0, sizeof(e));
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = b;
    cfg.store_method = cfg.restore_method = method;
    cfg.max_ctas = tu.ctas ? tu.ctas : 4; /* fewer CTAs than chunks: the loop strides */
    cfg.threads_per_cta = tu.threads;
    cfg.vec_per_lane = tu.vec;
    cfg.copy_streams = tu.copy_streams;
    cfg.kernel_share_pct = tu.share;
    cfg.flags = tu.flags;
    uint64_t nb = s->layers >= 24 ? (big ? 128 : 24) : (big ? 256 : 40);
    size_t nsel = s->layers >= 24 ? (big ? 40 : 10) : (big ? 100 : 16);
    uint64_t obj = (uint64_t)s->layers * (s->kind == MLA ? 1 : 2) * s->bs * s->heads * s->dim * 2;
    /* Slots of two objects each: transfers take several groups and rotate
     * through the slots more than once. */
    uint64_t slot = (2 * obj + 4095) & ~(uint64_t)4095;
    cfg.staging_bytes = 8 * slot < (64u << 10) ? (64u << 10) : 8 * slot; /* 2 lanes x 4 */
    char label[128];
    snprintf(label, sizeof(label), "%s/%s/%s/%u,%u,%u,%u,%u%%", umbp_gpu_backend_name(b),
             s->name, method_name(method), cfg.max_ctas, tu.threads, tu.vec, tu.copy_streams,
             tu.share);

    int rc = umbp_gpu_engine_create(&cfg, &e.eng);
    CHECK(rc == 0, "%s: engine: %s", label, umbp_gpu_strerror(rc));
    if (rc < 0)
        return;
    e.o = gpu_backend_ops(umbp_gpu_engine_backend(e.eng));
    int prev;
    gpu_device_enter(e.o, umbp_gpu_engine_device(e.eng), &prev);
    rc = model_init(&e.m, s, nb, e.o);
    CHECK(rc == 0, "%s: device memory: %s", label, umbp_gpu_strerror(rc));
    if (rc == 0) {
        rc = umbp_kv_layout_create(e.eng, e.m.t, e.m.ntensors, &e.lay);
        CHECK(rc == 0, "%s: layout: %s", label, umbp_gpu_strerror(rc));
    }
    if (rc == 0) {
        CHECK(umbp_kv_layout_object_size(e.lay) == e.m.obj_size, "%s: object size %" PRIu64,
              label, umbp_kv_layout_object_size(e.lay));
        CHECK(umbp_kv_layout_num_blocks(e.lay) == nb && umbp_kv_layout_num_layers(e.lay) ==
              s->layers, "%s: layout counts", label);
        e.nslots = 2 * nsel + 5; /* run_both_ways uses 2 * nsel */
        size_t pool_bytes = e.nslots * e.m.obj_size;
        /* The kernel method allocates its pool, the others register one. */
        if (method == UMBP_GPU_METHOD_KERNEL) {
            rc = umbp_gpu_host_alloc(e.eng, pool_bytes, (void **)&e.pool);
        } else {
            e.pool = aligned_alloc(4096, (pool_bytes + 4095) & ~(size_t)4095);
            rc = e.pool == NULL ? -ENOMEM : umbp_gpu_host_register(e.eng, e.pool, pool_bytes);
        }
        CHECK(rc == 0, "%s: host pool: %s", label, umbp_gpu_strerror(rc));
        e.expect = malloc(pool_bytes);
    }
    if (rc == 0 && e.expect != NULL) {
        uint32_t L = s->layers;
        run_case(&e, method, nsel, 0, 0, label);
        run_case(&e, method, nsel / 2 + 1, 1, L / 2, label);      /* layer and block subset */
        run_case(&e, method, 3, L - 1, 1, label);                 /* the last layer only */
        run_case(&e, method, 1, 0, 1, label);                     /* one chunk pair */
        run_both_ways(&e, nsel, 0, label);
        run_both_ways(&e, nsel, 1, label);
        /* the tuning's flags may lack UMBP_GPU_RAMP_OVERLAPPED: set it for
         * the ramped run, or both runs would depend on the lane's timing */
        umbp_gpu_config_t c;
        umbp_gpu_engine_get_config(e.eng, &c);
        uint32_t flags = c.flags;
        c.flags = flags | UMBP_GPU_RAMP_OVERLAPPED;
        rc = umbp_gpu_engine_set_tuning(e.eng, &c);
        CHECK(rc == 0, "%s: tuning with UMBP_GPU_RAMP_OVERLAPPED: %s", label, umbp_gpu_strerror(rc));
        uint32_t ramped = run_slices(&e, nsel, label); /* ramps at every end */
        c.flags = flags & ~(uint32_t)UMBP_GPU_RAMP_OVERLAPPED;
        rc = umbp_gpu_engine_set_tuning(e.eng, &c);
        CHECK(rc == 0, "%s: tuning without UMBP_GPU_RAMP_OVERLAPPED: %s", label,
              umbp_gpu_strerror(rc));
        uint32_t whole = run_slices(&e, nsel, label); /* whole groups where they overlap */
        CHECK(whole <= ramped, "%s slices: %u copy groups without UMBP_GPU_RAMP_OVERLAPPED, "
              "%u with it", label, whole, ramped);
        c.flags = flags;
        CHECK(umbp_gpu_engine_set_tuning(e.eng, &c) == 0, "%s: the tuning's flags back", label);
    }
    if (e.pool != NULL) {
        if (method == UMBP_GPU_METHOD_KERNEL) {
            umbp_gpu_host_free(e.eng, e.pool);
        } else {
            CHECK(umbp_gpu_host_unregister(e.eng, e.pool) == 0, "%s: unregister", label);
            free(e.pool);
        }
    }
    free(e.expect);
    umbp_kv_layout_destroy(e.lay);
    model_free(&e.m, e.o);
    gpu_device_leave(e.o, umbp_gpu_engine_device(e.eng), prev);
    umbp_gpu_engine_destroy(e.eng);
}

/* The host backend's engine for the ramp tests: staged, slots of 16
 * objects, 128 blocks, a pool of 100 objects.  0: ready. */
static int ramp_env_open(struct env *e, uint32_t flags, const char *label)
{
    const struct spec *s = &specs[0];
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = UMBP_GPU_BACKEND_HOST;
    cfg.store_method = cfg.restore_method = UMBP_GPU_METHOD_STAGED;
    cfg.flags = flags;
    uint64_t obj = (uint64_t)s->layers * 2 * s->bs * s->heads * s->dim * 2;
    cfg.staging_bytes = 2 * GPU_STAGING_SLOTS * 16 * obj; /* 16 objects a slot */
    memset(e, 0, sizeof(*e));
    int rc = umbp_gpu_engine_create(&cfg, &e->eng);
    CHECK(rc == 0, "%s: engine: %s", label, umbp_gpu_strerror(rc));
    if (rc < 0)
        return rc;
    e->o = gpu_backend_ops(UMBP_GPU_BACKEND_HOST);
    rc = model_init(&e->m, s, 128, e->o);
    if (rc == 0)
        rc = umbp_kv_layout_create(e->eng, e->m.t, e->m.ntensors, &e->lay);
    e->nslots = 100;
    if (rc == 0)
        rc = umbp_gpu_host_alloc(e->eng, e->nslots * e->m.obj_size, (void **)&e->pool);
    e->expect = malloc(e->nslots * e->m.obj_size);
    CHECK(rc == 0 && e->expect && e->m.obj_size == obj, "%s: setup: %s", label,
          umbp_gpu_strerror(rc));
    return rc == 0 && e->expect ? 0 : -1;
}

static void ramp_env_close(struct env *e)
{
    if (!e->eng)
        return;
    if (e->pool)
        umbp_gpu_host_free(e->eng, e->pool);
    free(e->expect);
    umbp_kv_layout_destroy(e->lay);
    model_free(&e->m, e->o);
    umbp_gpu_engine_destroy(e->eng);
}

/* Without UMBP_GPU_RAMP_OVERLAPPED the flagged slices end in whole groups:
 * fewer copies, the same bytes.  Slots of 16 objects and slices of 24, 48
 * and 24 blocks (run_slices), so each flagged slice's last slot's worth is
 * one that a ramp-down splits; stored and restored with and without the
 * flag, every byte compared, the groups counted per transfer by the engine
 * (umbp_gpu_xfer.groups).  The shapes above use slots of two objects, where
 * a ramp hardly exists, so there the count may only not grow. */
static void test_ramp_overlapped(void)
{
    const char *label = "ramp";
    struct env e;
    umbp_gpu_config_t c;
    umbp_gpu_config_default(&c);
    if (ramp_env_open(&e, c.flags | UMBP_GPU_RAMP_OVERLAPPED, label) == 0) {
        uint32_t ramped = run_slices(&e, 96, label);
        umbp_gpu_engine_get_config(e.eng, &c);
        c.flags &= ~(uint32_t)UMBP_GPU_RAMP_OVERLAPPED;
        CHECK(umbp_gpu_engine_set_tuning(e.eng, &c) == 0, "%s: tuning", label);
        uint32_t whole = run_slices(&e, 96, "ramp, whole groups");
        /* only the order is asserted, not the engine's group arithmetic */
        CHECK(whole < ramped, "%s: %u copy groups in the flagged slices without "
              "UMBP_GPU_RAMP_OVERLAPPED, %u with it: fewer, larger copies", label, whole, ramped);
    }
    ramp_env_close(&e);
}

/* Without UMBP_GPU_RAMP_OVERLAPPED a staged transfer that finds its lane's
 * previous one still copying starts with whole slots.  The host-async
 * backend's device thread is held while two transfers of 48 blocks (slots
 * of 16, both flagged UMBP_KV_XFER_FOLLOWED, so neither ramps down) are
 * submitted: the second finds the first queued and takes fewer groups than
 * when it is submitted after the first finished.  Stores, then restores
 * into poisoned tensors, every byte compared each time. */
static uint32_t two_transfers(struct env *e, bool restore, bool hold, const char *label)
{
    struct model *m = &e->m;
    uint64_t blocks[96], slots[96];
    umbp_kv_block_io_t io[96];
    pick_distinct(blocks, 96, m->nb);
    pick_distinct(slots, 96, e->nslots);
    for (size_t i = 0; i < 96; i++)
        io[i] = (umbp_kv_block_io_t){.block = blocks[i], .host = e->pool + slots[i] * m->obj_size};
    size_t pool_bytes = e->nslots * m->obj_size;
    for (uint32_t i = 0; i < m->ntensors; i++)
        fill_random(m->mirror[i], m->tensor_bytes);
    fill_random(e->pool, pool_bytes);
    memcpy(e->expect, e->pool, pool_bytes);
    if (restore) {
        for (uint32_t i = 0; i < m->ntensors; i++)
            memset(m->mirror[i], 0x5A, m->tensor_bytes);
        mirror_restored(e, blocks, slots, 96, 0, m->s->layers);
    } else {
        expect_stored(e, blocks, slots, 96, 0, m->s->layers);
    }
    int rc = model_upload(m, e->o);
    umbp_gpu_xfer_t *x[2] = {NULL, NULL};
    uint32_t second = 0;
    if (hold)
        gpu_host_async_hold(true);
    for (int c = 0; c < 2 && rc == 0; c++) {
        umbp_kv_xfer_desc_t d = {.layout = e->lay, .blocks = io + 48 * c, .num_blocks = 48,
                                 .flags = UMBP_KV_XFER_FOLLOWED};
        rc = restore ? umbp_gpu_restore(e->eng, &d, &x[c]) : umbp_gpu_store(e->eng, &d, &x[c]);
        if (rc == 0 && !hold && c == 0) { /* the lane's copies done, its last_end too */
            rc = umbp_gpu_xfer_wait(x[0], 30000);
            if (rc == 0)
                rc = gpu_event_sync(e->o,
                                    e->eng->lane[restore ? LANE_RESTORE : LANE_STORE].last_end);
        }
    }
    if (x[1])
        second = x[1]->groups;
    if (hold)
        gpu_host_async_hold(false);
    for (int c = 0; c < 2; c++) {
        int wrc = x[c] ? umbp_gpu_xfer_wait(x[c], 30000) : 0;
        if (rc == 0)
            rc = wrc;
        umbp_gpu_xfer_release(x[c]);
    }
    CHECK(rc == 0, "%s: %s: %s", label, restore ? "restores" : "stores", umbp_gpu_strerror(rc));
    if (restore)
        CHECK(rc == 0 && model_check_device(m, e->o, "two restores") == 0,
              "%s: every byte of the GPU tensors after the restores", label);
    else
        CHECK(rc == 0 && memcmp(e->pool, e->expect, pool_bytes) == 0,
              "%s: every byte of the pool after the stores", label);
    return second;
}

static void test_ramp_up_skipped(void)
{
    const char *a = getenv("UMBP_GPU_HOST_ASYNC");
    if (!a || strcmp(a, "1") != 0)
        return; /* the synchronous host backend has no copy in progress */
    const char *label = "ramp-up";
    struct env e;
    umbp_gpu_config_t c;
    umbp_gpu_config_default(&c);
    if (ramp_env_open(&e, c.flags & ~(uint32_t)UMBP_GPU_RAMP_OVERLAPPED, label) == 0)
        for (int restore = 0; restore < 2; restore++) {
            uint32_t after = two_transfers(&e, restore, false, label);
            uint32_t behind = two_transfers(&e, restore, true, label);
            CHECK(behind < after, "%s: a %s behind one still queued took %u copy groups, "
                  "one after it finished %u: whole slots from the start", label,
                  restore ? "restore" : "store", behind, after);
        }
    ramp_env_close(&e);
}

/* ---- the caller's events ------------------------------------------------ */

/* A store waits for the caller's event; a restore's event lets a caller's
 * stream wait for it. */
static void test_events(umbp_gpu_backend_t b)
{
    const struct spec *s = &specs[0];
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = b;
    umbp_gpu_engine_t *eng = NULL;
    int rc = umbp_gpu_engine_create(&cfg, &eng);
    CHECK(rc == 0, "events: engine: %s", umbp_gpu_strerror(rc));
    if (rc < 0)
        return;
    const struct gpu_ops *o = gpu_backend_ops(umbp_gpu_engine_backend(eng));
    int prev;
    gpu_device_enter(o, 0, &prev);
    struct model m;
    umbp_kv_layout_t *lay = NULL;
    uint8_t *pool = NULL, *fresh = NULL;
    gpu_stream_t us = NULL;
    gpu_event_t ev = NULL;
    size_t nsel = 32;
    rc = model_init(&m, s, 64, o);
    if (rc == 0)
        rc = umbp_kv_layout_create(eng, m.t, m.ntensors, &lay);
    if (rc == 0)
        rc = umbp_gpu_host_alloc(eng, nsel * m.obj_size + m.tensor_bytes * m.ntensors, (void **)&pool);
    if (rc == 0)
        rc = gpu_stream_create(o, &us);
    if (rc == 0)
        rc = gpu_event_create(o, &ev);
    CHECK(rc == 0, "events: setup: %s", umbp_gpu_strerror(rc));
    if (rc < 0)
        goto out;
    fresh = pool + nsel * m.obj_size; /* pinned: the copies below are async */

    umbp_kv_block_io_t io[32];
    for (size_t i = 0; i < nsel; i++)
        io[i] = (umbp_kv_block_io_t){.block = i * 2, .host = pool + i * m.obj_size};
    umbp_kv_xfer_desc_t d = {.layout = lay, .blocks = io, .num_blocks = nsel};

    /* Old contents on the device, new contents queued on the caller's
     * stream, the store submitted right after with the stream's event. */
    for (uint32_t i = 0; i < m.ntensors; i++) {
        memset(m.mirror[i], 0x11, m.tensor_bytes);
        fill_random(fresh + i * m.tensor_bytes, m.tensor_bytes);
    }
    rc = model_upload(&m, o);
    for (uint32_t i = 0; rc == 0 && i < m.ntensors; i++)
        rc = gpu_memcpy_async(o, m.dev[i], fresh + i * m.tensor_bytes, m.tensor_bytes, us);
    if (rc == 0)
        rc = gpu_event_record(o, ev, us);
    d.wait_event = ev;
    umbp_gpu_xfer_t *x = NULL;
    if (rc == 0)
        rc = umbp_gpu_store(eng, &d, &x);
    if (rc == 0) {
        rc = umbp_gpu_xfer_wait(x, 30000);
        /* 32 objects of 32 KiB back to back in request order: one 1 MiB
         * DMA, so AUTO stages them on a device. */
        CHECK(umbp_gpu_xfer_method(x) ==
              (o->synchronous ? UMBP_GPU_METHOD_KERNEL : UMBP_GPU_METHOD_STAGED),
              "events: auto method of adjacent objects: %d", umbp_gpu_xfer_method(x));
        umbp_gpu_xfer_release(x);
    }
    CHECK(rc == 0, "events: store after caller event: %s", umbp_gpu_strerror(rc));
    int ok = 1;
    for (size_t i = 0; i < nsel && ok; i++)
        for (uint32_t l = 0; l < s->layers && ok; l++)
            for (uint32_t kv = 0; kv < 2 && ok; kv++) {
                uint32_t t = 0;
                uint64_t off = 0;
                model_chunk(&m, l, io[i].block, kv, &t, &off);
                ok = memcmp(pool + i * m.obj_size + model_obj_off(&m, l, kv),
                            fresh + t * m.tensor_bytes + off, m.chunk) == 0;
            }
    CHECK(ok, "events: the store saw the writes its wait_event covers");

    /* Restore, then the caller's stream waits for the transfer's event and
     * reads the tensors back. */
    fill_random(pool, nsel * m.obj_size);
    d.wait_event = NULL;
    rc = umbp_gpu_restore(eng, &d, &x);
    if (rc == 0) {
        void *done = umbp_gpu_xfer_event(x);
        CHECK((done != NULL) == !o->synchronous, "events: xfer event present");
        if (done != NULL)
            rc = gpu_stream_wait_event(o, us, done);
        for (uint32_t i = 0; rc == 0 && i < m.ntensors; i++)
            rc = gpu_memcpy_async(o, fresh + i * m.tensor_bytes, m.dev[i], m.tensor_bytes, us);
        if (rc == 0)
            rc = gpu_stream_sync(o, us);
        CHECK(umbp_gpu_xfer_test(x) == 0, "events: restore complete once the stream was");
        umbp_gpu_xfer_release(x);
    }
    CHECK(rc == 0, "events: restore + stream wait: %s", umbp_gpu_strerror(rc));
    ok = 1;
    for (size_t i = 0; i < nsel && ok; i++)
        for (uint32_t l = 0; l < s->layers && ok; l++)
            for (uint32_t kv = 0; kv < 2 && ok; kv++) {
                uint32_t t = 0;
                uint64_t off = 0;
                model_chunk(&m, l, io[i].block, kv, &t, &off);
                ok = memcmp(pool + i * m.obj_size + model_obj_off(&m, l, kv),
                            fresh + t * m.tensor_bytes + off, m.chunk) == 0;
            }
    CHECK(ok, "events: a stream waiting on the restore's event sees restored bytes");
out:
    if (ev != NULL)
        gpu_event_destroy(o, ev);
    if (us != NULL)
        gpu_stream_destroy(o, us);
    umbp_gpu_host_free(eng, pool);
    umbp_kv_layout_destroy(lay);
    model_free(&m, o);
    gpu_device_leave(o, 0, prev);
    umbp_gpu_engine_destroy(eng);
}

/* What the hint tests run on: a host-backend engine with one copy method for
 * both directions and the given flags, the first spec's model (16 blocks,
 * 4 KiB chunks: whole lines), its layout and RIG_OBJS pool objects. */
enum { RIG_OBJS = 4 };

struct rig {
    const struct gpu_ops *o;
    umbp_gpu_engine_t *eng;
    struct model m;
    umbp_kv_layout_t *lay;
    uint8_t *pool;
    umbp_kv_block_io_t io[RIG_OBJS];
    umbp_kv_xfer_desc_t d;
};

static int rig_open(struct rig *r, umbp_gpu_method_t method, uint32_t flags, const char *what)
{
    memset(r, 0, sizeof(*r));
    r->o = gpu_backend_ops(UMBP_GPU_BACKEND_HOST);
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = UMBP_GPU_BACKEND_HOST;
    cfg.store_method = cfg.restore_method = method;
    cfg.staging_bytes = 1 << 20;
    cfg.flags = flags;
    int rc = umbp_gpu_engine_create(&cfg, &r->eng);
    CHECK(rc == 0, "%s: engine: %s", what, umbp_gpu_strerror(rc));
    if (rc < 0)
        return rc;
    rc = model_init(&r->m, &specs[0], 16, r->o);
    if (rc == 0)
        rc = umbp_kv_layout_create(r->eng, r->m.t, r->m.ntensors, &r->lay);
    if (rc == 0)
        rc = umbp_gpu_host_alloc(r->eng, RIG_OBJS * r->m.obj_size, (void **)&r->pool);
    CHECK(rc == 0, "%s: setup: %s", what, umbp_gpu_strerror(rc));
    for (size_t i = 0; rc == 0 && i < RIG_OBJS; i++)
        r->io[i] = (umbp_kv_block_io_t){.block = 3 + i * 2, .host = r->pool + i * r->m.obj_size};
    r->d = (umbp_kv_xfer_desc_t){.layout = r->lay, .blocks = r->io, .num_blocks = RIG_OBJS};
    return rc;
}

/* One store (dir 0) or restore (dir 1) of the rig's objects, waited for. */
static int rig_run(struct rig *r, int dir, umbp_gpu_method_t method, const char *what)
{
    umbp_gpu_xfer_t *x = NULL;
    int rc = dir ? umbp_gpu_restore(r->eng, &r->d, &x) : umbp_gpu_store(r->eng, &r->d, &x);
    if (rc == 0) {
        CHECK(umbp_gpu_xfer_method(x) == method, "%s: method %d", what, (int)method);
        rc = umbp_gpu_xfer_wait(x, 30000);
        umbp_gpu_xfer_release(x);
    }
    CHECK(rc == 0, "%s: %s: %s", what, dir ? "restore" : "store", umbp_gpu_strerror(rc));
    return rc;
}

static void rig_close(struct rig *r)
{
    if (!r->eng)
        return;
    umbp_gpu_host_free(r->eng, r->pool);
    umbp_kv_layout_destroy(r->lay);
    model_free(&r->m, r->o);
    umbp_gpu_engine_destroy(r->eng);
}

/* The discard hint reaches a staged restore's scatter, and only it: on the
 * host backend a discarded line is poisoned (0xD5), so with
 * UMBP_GPU_L2_DISCARD_STAGING the restore slot's first object reads 0xD5
 * afterwards and without it the object's bytes; a store's slot never is.
 * Either way the blocks restored hold the objects' bytes. */
static void test_discard_reaches_the_slot(int on)
{
    char what[32];
    snprintf(what, sizeof(what), "discard %d", on);
    struct rig r;
    uint8_t *back = NULL;
    int rc = rig_open(&r, UMBP_GPU_METHOD_STAGED, on ? UMBP_GPU_L2_DISCARD_STAGING : 0, what);
    if (rc == 0 && (back = malloc(r.m.tensor_bytes * r.m.ntensors)) == NULL)
        rc = -ENOMEM;
    if (rc < 0)
        goto out;
    const uint8_t *slot[2] = {(uint8_t *)r.eng->lane[LANE_STORE].staging,
                              (uint8_t *)r.eng->lane[LANE_RESTORE].staging};
    size_t poisoned[2] = {0, 0};
    for (int dir = 0; rc == 0 && dir < 2; dir++) {
        fill_random(r.pool, RIG_OBJS * r.m.obj_size);
        rc = rig_run(&r, dir, UMBP_GPU_METHOD_STAGED, what);
        for (size_t k = 0; k < r.m.obj_size; k++)
            poisoned[dir] += slot[dir][k] == 0xD5;
    }
    CHECK(poisoned[0] != r.m.obj_size, "%s: a store's slot keeps its bytes", what);
    CHECK(poisoned[1] == (on ? r.m.obj_size : 0) || (!on && poisoned[1] < r.m.obj_size / 64),
          "%s: the restore slot's first object: %zu of %zu bytes poisoned", what, poisoned[1],
          (size_t)r.m.obj_size);
    for (uint32_t i = 0; rc == 0 && i < r.m.ntensors; i++)
        rc = gpu_memcpy_sync(r.o, back + i * r.m.tensor_bytes, r.m.dev[i], r.m.tensor_bytes);
    int ok = rc == 0;
    for (size_t i = 0; i < RIG_OBJS && ok; i++)
        for (uint32_t l = 0; l < specs[0].layers && ok; l++)
            for (uint32_t kv = 0; kv < 2 && ok; kv++) {
                uint32_t t = 0;
                uint64_t off = 0;
                model_chunk(&r.m, l, r.io[i].block, kv, &t, &off);
                ok = memcmp(r.pool + i * r.m.obj_size + model_obj_off(&r.m, l, kv),
                            back + t * r.m.tensor_bytes + off, r.m.chunk) == 0;
            }
    CHECK(ok, "%s: every restored byte is the object's", what);
out:
    free(back);
    rig_close(&r);
}

/* The streaming-store hint (UMBP_GPU_EVICT_FIRST_RESTORE) reaches every
 * restore kernel, zero-copy and staged, and never a store's: the host
 * backend cannot act on it, so it records the hints its kernels were given. */
static void test_evict_first_reaches_restores(int on)
{
    const umbp_gpu_method_t methods[] = {UMBP_GPU_METHOD_KERNEL, UMBP_GPU_METHOD_STAGED};
    for (size_t mi = 0; mi < 2; mi++) {
        char what[48];
        snprintf(what, sizeof(what), "evict-first %d, method %d", on, (int)methods[mi]);
        struct rig r;
        int rc = rig_open(&r, methods[mi], on ? UMBP_GPU_EVICT_FIRST_RESTORE : 0, what);
        for (int dir = 0; rc == 0 && dir < 2; dir++) {
            atomic_store(&gpu_host_hints_seen, 0);
            rc = rig_run(&r, dir, methods[mi], what);
            uint32_t seen = atomic_load(&gpu_host_hints_seen);
            CHECK(!!(seen & GPU_HINT_EVICT_FIRST_GPU) == (on && dir),
                  "%s: a %s's kernels got hints %#x", what, dir ? "restore" : "store", seen);
        }
        rig_close(&r);
    }
}

/* ---- errors ------------------------------------------------------------- */

static umbp_kv_tensor_t fa_tensor(void *base, int64_t nb)
{
    umbp_kv_tensor_t t = {.base = base, .ndim = 5, .shape = {2, nb, 16, 2, 64},
                          .elem_size = 2, .block_dim = 1, .kv_dim = 0, .layer_dim = -1};
    umbp_kv_tensor_set_contiguous(&t);
    return t;
}

static void expect_layout_error(umbp_gpu_engine_t *eng, const umbp_kv_tensor_t *t, uint32_t n,
                                int want, const char *what)
{
    umbp_kv_layout_t *lay = NULL;
    int rc = umbp_kv_layout_create(eng, t, n, &lay);
    CHECK(rc == want, "layout error '%s': got %d (%s), want %d (%s)", what, rc,
          umbp_gpu_strerror(rc), want, umbp_gpu_strerror(want));
    CHECK(rc == 0 || umbp_gpu_last_error()[0] != '\0', "layout error '%s' has a message", what);
    if (rc == 0)
        umbp_kv_layout_destroy(lay);
}

static void test_errors(void)
{
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = UMBP_GPU_BACKEND_HOST;
    cfg.max_inflight = 1;
    umbp_gpu_engine_t *eng = NULL;
    int rc = umbp_gpu_engine_create(&cfg, &eng);
    CHECK(rc == 0, "errors: engine: %s", umbp_gpu_strerror(rc));
    if (rc < 0)
        return;
    static uint8_t fake[2 * 8 * 16 * 2 * 64 * 2 * 2] __attribute__((aligned(64)));
    umbp_kv_tensor_t t[2], u;

    t[0] = fa_tensor(fake, 8);
    expect_layout_error(eng, t, 1, 0, "a good FlashAttention tensor");
    u = t[0], u.ndim = 1;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_NDIM, "ndim 1");
    u = t[0], u.ndim = 9;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_NDIM, "ndim 9");
    u = t[0], u.block_dim = 5;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_ROLE, "block_dim out of range");
    u = t[0], u.kv_dim = 1;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_ROLE, "kv_dim == block_dim");
    t[1] = t[0], t[1].layer_dim = 2;
    expect_layout_error(eng, t, 2, UMBP_E_KV_ROLE, "layer_dim on a per-layer tensor");
    u = t[0], u.shape[0] = 3;
    umbp_kv_tensor_set_contiguous(&u);
    expect_layout_error(eng, &u, 1, UMBP_E_KV_SHAPE, "kv dim of size 3");
    u = t[0], u.shape[3] = 0;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_SHAPE, "a dim of size 0");
    u = t[0], u.elem_size = 0;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_SHAPE, "elem_size 0");
    u = t[0], u.stride[3] = 128;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_STRIDE, "heads not dense");
    /* dense in another order (HND: heads outermost) is one chunk too */
    u = t[0], u.stride[2] = 64, u.stride[3] = 16 * 64;
    expect_layout_error(eng, &u, 1, 0, "a chunk dense in HND order");
    u = t[0], u.stride[2] = 64, u.stride[3] = 16 * 64 + 8;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_STRIDE, "HND order with a gap between heads");
    /* (H, nb, 2, bs, D): a role dim splits the chunk. */
    u = (umbp_kv_tensor_t){.base = fake, .ndim = 5, .shape = {2, 8, 2, 16, 64}, .elem_size = 2,
                           .block_dim = 1, .kv_dim = 2, .layer_dim = -1};
    umbp_kv_tensor_set_contiguous(&u);
    expect_layout_error(eng, &u, 1, UMBP_E_KV_STRIDE, "chunk split by the block dim");
    u = t[0], u.stride[1] = 64;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_STRIDE, "block stride below one chunk");
    u = t[0], u.stride[0] = -u.stride[0];
    expect_layout_error(eng, &u, 1, UMBP_E_KV_STRIDE, "negative kv stride");
    t[1] = fa_tensor(fake, 7);
    expect_layout_error(eng, t, 2, UMBP_E_KV_MISMATCH, "layers with different block counts");
    t[1] = (umbp_kv_tensor_t){.base = fake, .ndim = 3, .shape = {8, 16, 128}, .elem_size = 2,
                              .block_dim = 0, .kv_dim = -1, .layer_dim = -1};
    umbp_kv_tensor_set_contiguous(&t[1]);
    expect_layout_error(eng, t, 2, UMBP_E_KV_MISMATCH, "one layer with K/V, one without");
    u = t[0], u.base = NULL;
    expect_layout_error(eng, &u, 1, -EINVAL, "NULL base");
    /* strides whose bytes wrap 64 bits (a fabricated descriptor: no real
     * tensor has them) are refused, not taken modulo 2^64 */
    u = (umbp_kv_tensor_t){.base = fake, .ndim = 2, .shape = {4, 4}, .elem_size = 64,
                           .block_dim = 0, .kv_dim = -1, .layer_dim = -1};
    u.stride[0] = ((int64_t)1 << 58) + 4, u.stride[1] = 1;
    expect_layout_error(eng, &u, 1, UMBP_E_KV_SHAPE, "a block stride whose bytes wrap");
    /* an object over 2^62 bytes from layers each under it (2^60 each) */
    umbp_kv_tensor_t big[5];
    for (int i = 0; i < 5; i++) {
        big[i] = (umbp_kv_tensor_t){.base = fake, .ndim = 3, .shape = {2, 2, (int64_t)1 << 53},
                                    .elem_size = 64, .block_dim = 1, .kv_dim = 0,
                                    .layer_dim = -1};
        umbp_kv_tensor_set_contiguous(&big[i]);
    }
    expect_layout_error(eng, big, 4, 0, "an object of 2^62 bytes");
    expect_layout_error(eng, big, 5, UMBP_E_KV_SHAPE, "an object over 2^62 bytes");

    /* Transfers. */
    umbp_kv_layout_t *lay = NULL;
    t[1] = fa_tensor(fake, 8);
    rc = umbp_kv_layout_create(eng, t, 2, &lay);
    CHECK(rc == 0, "errors: 2-layer layout: %s", umbp_gpu_strerror(rc));
    if (rc < 0)
        goto out;
    uint64_t off = 0, len = 0;
    CHECK(umbp_kv_layout_layer_span(lay, 1, 1, &off, &len) == 0 && off == 8192 && len == 8192,
          "layer span of layer 1: %" PRIu64 "+%" PRIu64, off, len);
    CHECK(umbp_kv_layout_layer_span(lay, 2, 0, &off, &len) == UMBP_E_KV_RANGE, "span past end");
    uint64_t osz = umbp_kv_layout_object_size(lay);
    uint8_t *pool = aligned_alloc(4096, 4 * osz);
    umbp_kv_block_io_t io[2] = {{.block = 1, .host = pool}, {.block = 2, .host = pool + osz}};
    umbp_kv_xfer_desc_t d = {.layout = lay, .blocks = io, .num_blocks = 2};
    umbp_gpu_xfer_t *x = NULL, *y = NULL;
    rc = umbp_gpu_store(eng, &d, &x);
    CHECK(rc == UMBP_E_GPU_UNREGISTERED, "store into unregistered memory: %d", rc);
    CHECK(umbp_gpu_host_register(eng, pool, 4 * osz) == 0, "register pool");
    CHECK(umbp_gpu_host_register(eng, pool + osz, osz) == -EEXIST, "overlapping register");
    CHECK(umbp_gpu_host_unregister(eng, pool + 1) == -ENOENT, "unregister of no region");
    io[1].host = pool + 3 * osz + 1; /* runs past the region's end */
    CHECK(umbp_gpu_store(eng, &d, &x) == UMBP_E_GPU_UNREGISTERED, "object past the region");
    io[1].host = pool + osz;
    io[1].block = 8;
    CHECK(umbp_gpu_store(eng, &d, &x) == UMBP_E_KV_RANGE, "block 8 of 8");
    io[1].block = 2;
    d.first_layer = 1, d.num_layers = 2;
    CHECK(umbp_gpu_store(eng, &d, &x) == UMBP_E_KV_RANGE, "layers [1, 3) of 2");
    d.first_layer = 2, d.num_layers = 0;
    CHECK(umbp_gpu_store(eng, &d, &x) == UMBP_E_KV_RANGE, "first_layer 2 of 2");
    d.first_layer = 0;
    CHECK(umbp_gpu_store(eng, NULL, &x) == -EINVAL, "NULL desc");
    d.flags = UMBP_KV_XFER_FOLLOWED | 4;
    CHECK(umbp_gpu_store(eng, &d, &x) == -EINVAL && strstr(umbp_gpu_last_error(), "flags 0x5") &&
              strstr(umbp_gpu_last_error(), "unknown bits 0x4"),
          "unknown transfer flags refused, named: %s", umbp_gpu_last_error());
    d.flags = UMBP_KV_XFER_FOLLOWED; /* a hint: a lone transfer flagged so still runs */
    rc = umbp_gpu_store(eng, &d, &x);
    CHECK(rc == 0, "a good store: %s", umbp_gpu_strerror(rc));
    if (rc == 0) {
        CHECK(umbp_gpu_restore(eng, &d, &y) == -EAGAIN, "max_inflight 1: second transfer");
        CHECK(umbp_gpu_xfer_wait(x, 1000) == 0, "wait");
        umbp_gpu_xfer_release(x);
        rc = umbp_gpu_restore(eng, &d, &y);
        CHECK(rc == 0, "a transfer after release: %s", umbp_gpu_strerror(rc));
        if (rc == 0) { /* done before its slot is free for the next */
            CHECK(umbp_gpu_xfer_wait(y, 1000) == 0, "wait");
            umbp_gpu_xfer_release(y);
        }
    }
    d.num_blocks = 0;
    rc = umbp_gpu_store(eng, &d, &x);
    CHECK(rc == 0 && umbp_gpu_xfer_wait(x, 1000) == 0, "an empty store completes");
    if (rc == 0)
        umbp_gpu_xfer_release(x);
    CHECK(umbp_gpu_host_unregister(eng, pool) == 0, "unregister pool");
    free(pool);
    umbp_kv_layout_destroy(lay);
out:
    umbp_gpu_engine_destroy(eng);

    /* Options. */
    umbp_gpu_config_default(&cfg);
    cfg.threads_per_cta = 33;
    CHECK(umbp_gpu_engine_create(&cfg, &eng) == -EINVAL, "threads_per_cta 33 refused");
    CHECK(strstr(umbp_gpu_last_error(), "threads_per_cta") != NULL, "message names the option");
    umbp_gpu_config_default(&cfg);
    cfg.vec_per_lane = 3;
    CHECK(umbp_gpu_engine_create(&cfg, &eng) == -EINVAL, "vec_per_lane 3 refused");
    umbp_gpu_config_default(&cfg);
    cfg.backend = UMBP_GPU_BACKEND_HOST;
    cfg.device = 1;
    CHECK(umbp_gpu_engine_create(&cfg, &eng) == -ENODEV, "host device 1 does not exist");
    CHECK(strcmp(umbp_gpu_strerror(UMBP_E_KV_STRIDE), "unknown error") != 0, "strerror names codes");
    CHECK(umbp_gpu_backends_built() & (1u << UMBP_GPU_BACKEND_HOST), "host backend built");
}

/* ---- main --------------------------------------------------------------- */

/* umbp_gpu_engine_warm sizes the tables of the transfers taken first (the
 * head of the free list) and no others; 0 blocks or transfers does nothing;
 * on a device it also launches the kernel and the first copies, which must
 * succeed. */
static void test_warm(umbp_gpu_backend_t b)
{
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = b;
    umbp_gpu_engine_t *eng = NULL;
    int rc = umbp_gpu_engine_create(&cfg, &eng);
    CHECK(rc == 0, "warm: engine: %s", umbp_gpu_strerror(rc));
    if (rc < 0)
        return;
    CHECK(umbp_gpu_engine_warm(NULL, 1, 1) == -EINVAL, "warm: NULL engine");
    CHECK(umbp_gpu_engine_warm(eng, 0, 4) == 0 && eng->free_list->cap == 0,
          "warm: 0 blocks allocates nothing");
    CHECK(umbp_gpu_engine_warm(eng, 3000, 0) == 0 && eng->free_list->cap == 0,
          "warm: 0 transfers allocates nothing");
    rc = umbp_gpu_engine_warm(eng, 3000, 4);
    CHECK(rc == 0, "warm: %s", umbp_gpu_strerror(rc));
    unsigned i = 0, sized = 0;
    for (struct umbp_gpu_xfer *x = eng->free_list; x != NULL; x = x->next, i++)
        sized += i < 4 ? x->cap >= 3000 && x->htab != NULL && x->dtab != NULL : x->cap != 0;
    CHECK(sized == 4 && i == cfg.max_inflight,
          "warm: the first 4 of %u transfers sized for 3000 blocks, no other (%u)", i, sized);
    umbp_gpu_engine_destroy(eng);
}

/* A staging buffer the device cannot hold fails the creation with an error
 * that names the option to lower (on the host backend 1 TiB is refused by
 * the allocator unless the kernel overcommits; sanitizers' allocators abort
 * on it instead, so those builds skip). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ALLOCATOR_ABORTS_ON_HUGE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ALLOCATOR_ABORTS_ON_HUGE 1
#endif
#endif
static void test_staging_too_large(umbp_gpu_backend_t b)
{
#ifdef ALLOCATOR_ABORTS_ON_HUGE
    if (b == UMBP_GPU_BACKEND_HOST) {
        printf("skip: a 1 TiB staging buffer on the host backend (sanitizer allocator)\n");
        return;
    }
#endif
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = b;
    cfg.staging_bytes = (uint64_t)1 << 40;
    umbp_gpu_engine_t *eng = NULL;
    int rc = umbp_gpu_engine_create(&cfg, &eng);
    if (rc == 0) {
        printf("skip: this machine allocated a 1 TiB staging buffer (overcommit)\n");
        umbp_gpu_engine_destroy(eng);
        return;
    }
    CHECK(rc == -ENOMEM && strstr(umbp_gpu_last_error(), "staging_bytes 1099511627776") &&
              strstr(umbp_gpu_last_error(), "gpu_staging_bytes"),
          "staging: 1 TiB refused with -ENOMEM naming the option (%d)", rc);
}

static void run_backend(umbp_gpu_backend_t b, int big)
{
    const umbp_gpu_method_t methods[] = {UMBP_GPU_METHOD_KERNEL, UMBP_GPU_METHOD_STAGED,
                                         UMBP_GPU_METHOD_DMA};
    const struct tuning defaults = {0, 0, 0, 0, 0, 0};
    /* The L2 hints change no byte: every layout again with both (on the host
     * backend a discarded line is poisoned, so a hint on bytes read again
     * fails the comparison). */
    const struct tuning hints = {0, 0, 0, 0, 0,
                                 UMBP_GPU_L2_DISCARD_STAGING | UMBP_GPU_EVICT_FIRST_RESTORE};
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++) {
        for (size_t k = 0; k < 3; k++)
            run_layout(b, &specs[s], methods[k], big, defaults);
        run_layout(b, &specs[s], UMBP_GPU_METHOD_STAGED, big, hints);
        run_layout(b, &specs[s], UMBP_GPU_METHOD_KERNEL, big, hints);
    }
    const struct tuning shapes[] = {{1, 32, 4, 1, 0, 0}, {3, 96, 16, 3, 25, UMBP_GPU_L2_DISCARD_STAGING},
                                    {64, 256, 8, 4, 50, UMBP_GPU_SORT_BY_HOST},
                                    {7, 512, 16, 2, 90, UMBP_GPU_L2_DISCARD_STAGING},
                                    {2, 512, 4, 1, 10, UMBP_GPU_SORT_BY_HOST}};
    for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
        run_layout(b, &specs[0], UMBP_GPU_METHOD_KERNEL, big, shapes[t]);
        run_layout(b, &specs[3], UMBP_GPU_METHOD_KERNEL, big, shapes[t]);
        run_layout(b, &specs[4], UMBP_GPU_METHOD_STAGED, big, shapes[t]);
        run_layout(b, &specs[2], UMBP_GPU_METHOD_STAGED, big, shapes[t]);
        run_layout(b, &specs[7], UMBP_GPU_METHOD_KERNEL, big, shapes[t]);
    }
    test_events(b);
    test_warm(b);
    test_staging_too_large(b);

    /* AUTO: small stores zero-copy, the rest staged (host: always the
     * kernel, a memcpy). */
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = b;
    umbp_gpu_engine_t *eng = NULL;
    if (umbp_gpu_engine_create(&cfg, &eng) == 0) {
        int dev = !gpu_backend_ops(b)->synchronous; /* AUTO stages where streams are real */
        CHECK(umbp_gpu_engine_method(eng, 0, 256 << 10) == UMBP_GPU_METHOD_KERNEL,
              "auto: 256 KiB store zero-copy");
        CHECK(umbp_gpu_engine_method(eng, 0, 2 << 20) ==
              (dev ? UMBP_GPU_METHOD_STAGED : UMBP_GPU_METHOD_KERNEL), "auto: 2 MiB store");
        CHECK(umbp_gpu_engine_method(eng, 1, 256 << 10) ==
              (dev ? UMBP_GPU_METHOD_STAGED : UMBP_GPU_METHOD_KERNEL), "auto: 256 KiB restore");
        CHECK(umbp_gpu_engine_method(eng, 1, (uint64_t)1 << 30) == UMBP_GPU_METHOD_KERNEL,
              "auto: an object larger than a staging slot goes zero-copy");
        umbp_gpu_engine_destroy(eng);
    }
}

/* The asynchronous host backend keeps an event's records apart: a stream
 * waiting for record 1 (on stream a, behind a copy) is not released by
 * record 2 of the same event on stream b, which may run first.  With a
 * model that counted "the latest record that ran", c's copy read x before
 * a wrote it in about half the rounds. */
static void test_host_async_event_records(void)
{
    const struct gpu_ops *o = &gpu_host_async_ops;
    enum { N = 256 << 10, ROUNDS = 64 };
    gpu_stream_t a = NULL, b = NULL, c = NULL;
    gpu_event_t e = NULL;
    uint8_t *src = malloc(N), *x = malloc(N), *y = malloc(N);
    int rc = src && x && y ? 0 : -ENOMEM;
    if (rc == 0)
        rc = gpu_stream_create(o, &a);
    if (rc == 0)
        rc = gpu_stream_create(o, &b);
    if (rc == 0)
        rc = gpu_stream_create(o, &c);
    if (rc == 0)
        rc = gpu_event_create(o, &e);
    int bad = 0;
    for (int r = 0; rc == 0 && r < ROUNDS; r++) {
        fill_random(src, N);
        memset(x, 0x11, N);
        memset(y, 0x22, N);
        rc = gpu_memcpy_async(o, x, src, N, a);
        if (rc == 0)
            rc = gpu_event_record(o, e, a);       /* record 1 */
        if (rc == 0)
            rc = gpu_stream_wait_event(o, c, e);  /* waits for record 1 */
        if (rc == 0)
            rc = gpu_memcpy_async(o, y, x, N, c);
        if (rc == 0)
            rc = gpu_event_record(o, e, b);       /* record 2, free to run first */
        if (rc == 0)
            rc = gpu_stream_sync(o, c);
        if (rc == 0)
            rc = gpu_stream_sync(o, a);
        if (rc == 0)
            rc = gpu_stream_sync(o, b);
        bad += rc == 0 && memcmp(y, src, N) != 0;
        CHECK(rc != 0 || gpu_event_query(o, e) == 0, "host-async: both records complete");
    }
    CHECK(rc == 0, "host-async: event rounds: %d", rc);
    CHECK(bad == 0, "host-async: a wait for record 1 released before it ran (%d of %d rounds)",
          bad, ROUNDS);
    if (e)
        gpu_event_destroy(o, e);
    if (c)
        gpu_stream_destroy(o, c);
    if (b)
        gpu_stream_destroy(o, b);
    if (a)
        gpu_stream_destroy(o, a);
    free(src), free(x), free(y);
}

/* A registration pins every page (seconds for a large pool: a restarted
 * server's new pool is registered while the runtime's loop submits
 * transfers into the old one) and must not hold those transfers up.  The
 * host backend pins for UMBP_GPU_HOST_PIN_MS here (2 s): a store into
 * memory registered before is submitted, done and released while another
 * thread is still inside its registration.  When the pinning held the
 * engine's lock, the store's submit waited for it. */
struct pin_arg {
    umbp_gpu_engine_t *eng;
    void *p;
    size_t n;
    atomic_int state; /* 1: registering, 2: returned */
    int rc;
};

static void *pin_thread(void *a)
{
    struct pin_arg *arg = a;
    atomic_store(&arg->state, 1);
    arg->rc = umbp_gpu_host_register(arg->eng, arg->p, arg->n);
    atomic_store(&arg->state, 2);
    return NULL;
}

static void test_pinning_holds_up_no_transfer(void)
{
    umbp_gpu_config_t cfg;
    umbp_gpu_config_default(&cfg);
    cfg.backend = UMBP_GPU_BACKEND_HOST;
    umbp_gpu_engine_t *eng = NULL;
    int rc = umbp_gpu_engine_create(&cfg, &eng);
    CHECK(rc == 0, "pinning: engine: %s", umbp_gpu_strerror(rc));
    if (rc < 0)
        return;
    static uint8_t dev[2 * 8 * 16 * 2 * 64 * 2] __attribute__((aligned(64)));
    umbp_kv_tensor_t t = fa_tensor(dev, 8);
    umbp_kv_layout_t *lay = NULL;
    CHECK(umbp_kv_layout_create(eng, &t, 1, &lay) == 0, "pinning: layout");
    uint64_t osz = lay ? umbp_kv_layout_object_size(lay) : 4096;
    uint8_t *pool = aligned_alloc(4096, 2 * osz), *later = aligned_alloc(4096, 4096);
    CHECK(umbp_gpu_host_register(eng, pool, 2 * osz) == 0, "pinning: the first pool");
    setenv("UMBP_GPU_HOST_PIN_MS", "2000", 1);
    struct pin_arg arg = {.eng = eng, .p = later, .n = 4096};
    atomic_init(&arg.state, 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, pin_thread, &arg) == 0, "pinning: thread");
    while (atomic_load(&arg.state) == 0)
        usleep(1000);
    usleep(100000); /* inside the registration by now */
    umbp_kv_block_io_t io[1] = {{.block = 1, .host = pool}};
    umbp_kv_xfer_desc_t d = {.layout = lay, .blocks = io, .num_blocks = 1};
    umbp_gpu_xfer_t *x = NULL;
    rc = lay ? umbp_gpu_store(eng, &d, &x) : -EINVAL;
    CHECK(rc == 0, "pinning: a store beside the registration: %s", umbp_gpu_strerror(rc));
    if (rc == 0) {
        CHECK(umbp_gpu_xfer_wait(x, 10000) == 0, "pinning: wait");
        umbp_gpu_xfer_release(x);
    }
    CHECK(atomic_load(&arg.state) == 1,
          "pinning: the store waited for another thread's registration to end");
    pthread_join(th, NULL);
    unsetenv("UMBP_GPU_HOST_PIN_MS");
    CHECK(arg.rc == 0, "pinning: the second registration: %s", umbp_gpu_strerror(arg.rc));
    CHECK(umbp_gpu_host_register(eng, later, 4096) == -EEXIST, "pinning: registered twice");
    if (lay)
        umbp_kv_layout_destroy(lay);
    umbp_gpu_host_unregister(eng, pool);
    umbp_gpu_host_unregister(eng, later);
    umbp_gpu_engine_destroy(eng);
    free(pool), free(later);
}

int main(int argc, char **argv)
{
    const char *which = "host";
    int small = 0;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            which = argv[++i];
        else if (strcmp(argv[i], "--small") == 0)
            small = 1;
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "usage: %s [--backend host|device] [--seed N] [--small]\n", argv[0]);
            return 2;
        }
    }
    rng_state = seed ? seed : 1;
    printf("test_gpu_copy: backend %s, seed %" PRIu64 "\n", which, seed);

    if (strcmp(which, "host") == 0) {
        test_errors();
        test_ramp_overlapped();
        test_ramp_up_skipped();
        test_discard_reaches_the_slot(1);
        test_discard_reaches_the_slot(0);
        test_evict_first_reaches_restores(1);
        test_evict_first_reaches_restores(0);
        test_host_async_event_records();
        test_pinning_holds_up_no_transfer();
        run_backend(UMBP_GPU_BACKEND_HOST, 0);
    } else {
        umbp_gpu_backend_t found = UMBP_GPU_BACKEND_AUTO;
        char why[512] = "";
        const umbp_gpu_backend_t order[] = {UMBP_GPU_BACKEND_CUDA, UMBP_GPU_BACKEND_HIP};
        for (size_t i = 0; i < 2 && found == UMBP_GPU_BACKEND_AUTO; i++) {
            int n = 0;
            if (umbp_gpu_backend_probe(order[i], &n) == 0)
                found = order[i];
            else
                snprintf(why + strlen(why), sizeof(why) - strlen(why), "%s%s", why[0] ? "; " : "",
                         umbp_gpu_last_error());
        }
        if (found == UMBP_GPU_BACKEND_AUTO) {
            printf("SKIP: no GPU device: %s\n", why);
            return 0;
        }
        run_backend(found, !small);
    }
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
