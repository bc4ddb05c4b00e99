/*
 * test_kv_runtime - the GPU KV path through the public API: register a
 * FlashAttention-shaped KV cache, store blocks as objects, poison the cache,
 * load the objects back into other blocks (and a layer subset), and compare
 * every byte.  Runs on the host backend everywhere (device memory is host
 * memory there, so CI exercises the whole path) and on the real GPU when one
 * is present (skips with the reason otherwise).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h" /* gpu/ private layer: device alloc and copies for the test */
#include "rt.h"  /* the runtime's copy engine, to read the shape it was given */
#include "umbp/gpu.h"
#include "umbp/umbp.h"

#define L 4       /* layers */
#define NB 64     /* blocks per layer tensor */
#define BS 16     /* tokens per block */
#define H 2
#define D 64
#define ESZ 2     /* bf16 */
#define CHUNK ((size_t)BS * H * D * ESZ)      /* one K (or V) of one block */
#define LAYER_BYTES (2 * (size_t)NB * CHUNK) /* (2, NB, BS, H, D) */
#define STORED 32

struct fixture {
    const struct gpu_ops *ops;
    umbp_runtime_t *rt;
    void *dev[L];
    uint8_t *orig[L], *back[L];
    umbp_kv_handle_t kv;
    umbp_kv_block_t blocks[STORED];
};

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 77;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static umbp_key_t key_of(int i)
{
    umbp_key_t k;
    memset(&k, 0x3C, sizeof(k));
    memcpy(k.bytes, &i, sizeof(i));
    return k;
}

static const uint8_t *chunk(const uint8_t *layer, size_t block, int kv)
{
    return layer + ((size_t)kv * NB + block) * CHUNK;
}

static void setup_cfg(struct fixture *f, umbp_gpu_backend_t b, const char *name,
                      const char *extra);

static void setup(struct fixture *f, umbp_gpu_backend_t b, const char *name)
{
    setup_cfg(f, b, name, "\"capacity_bytes\":\"64MiB\"");
}

/* The runtime, then (fixture_register) the cache: filled, registered. */
static void fixture_create(struct fixture *f, umbp_gpu_backend_t b, const char *name,
                           const char *extra)
{
    memset(f, 0, sizeof(*f));
    f->ops = gpu_backend_ops(b);
    cr_assert_not_null(f->ops);
    char cfg[256];
    snprintf(cfg, sizeof(cfg), "{%s,\"gpu_backend\":\"%s\"}", extra, name);
    cr_assert_eq(umbp_runtime_create(cfg, &f->rt), 0, "%s", umbp_last_error());
}

/* One layer's tensor (2, NB, BS, H, D) at base, as the fixture registers it. */
static umbp_kv_tensor_t layer_tensor(void *base)
{
    umbp_kv_tensor_t t;
    memset(&t, 0, sizeof(t));
    t.base = base;
    t.ndim = 5;
    int64_t shape[5] = {2, NB, BS, H, D};
    memcpy(t.shape, shape, sizeof(shape));
    umbp_kv_tensor_set_contiguous(&t);
    t.elem_size = ESZ;
    t.block_dim = 1;
    t.kv_dim = 0;
    t.layer_dim = -1;
    return t;
}

static void fixture_register(struct fixture *f)
{
    umbp_kv_tensor_t t[L];
    for (int l = 0; l < L; l++) {
        cr_assert_eq(gpu_dev_alloc(f->ops, LAYER_BYTES, &f->dev[l]), 0);
        f->orig[l] = malloc(LAYER_BYTES);
        f->back[l] = malloc(LAYER_BYTES);
        fill(f->orig[l], LAYER_BYTES, (uint64_t)l + 1);
        cr_assert_eq(gpu_memcpy_sync(f->ops, f->dev[l], f->orig[l], LAYER_BYTES), 0);
        t[l] = layer_tensor(f->dev[l]);
    }
    cr_assert_eq(umbp_kv_register(f->rt, t, L, &f->kv), 0, "%s", umbp_last_error());
    cr_assert_eq(umbp_kv_object_size(f->rt, f->kv), 2 * L * CHUNK);
    for (int i = 0; i < STORED; i++)
        f->blocks[i] = (umbp_kv_block_t){key_of(i), (uint64_t)i};
}

static void setup_cfg(struct fixture *f, umbp_gpu_backend_t b, const char *name,
                      const char *extra)
{
    fixture_create(f, b, name, extra);
    fixture_register(f);
}

static void teardown_fixture(struct fixture *f)
{
    umbp_runtime_destroy(f->rt);
    for (int l = 0; l < L; l++) {
        gpu_dev_free(f->ops, f->dev[l]);
        free(f->orig[l]);
        free(f->back[l]);
    }
}

static void wait_all(umbp_op_t *op, int expect)
{
    cr_assert_eq(umbp_op_wait(op, 60000), 0);
    for (size_t i = 0; i < umbp_op_num_keys(op); i++)
        cr_assert_eq(umbp_op_key_status(op, i), expect, "key %zu: %s", i,
                     umbp_strerror(umbp_op_key_status(op, i)));
    umbp_op_release(op);
}

static void poison_and_download(struct fixture *f, bool download)
{
    for (int l = 0; l < L; l++) {
        if (download)
            cr_assert_eq(gpu_memcpy_sync(f->ops, f->back[l], f->dev[l], LAYER_BYTES), 0);
        else
            cr_assert_eq(gpu_memset_sync(f->ops, f->dev[l], 0xA5, LAYER_BYTES), 0);
    }
}

static bool is_poison(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0xA5)
            return false;
    return true;
}

/* transfers: how many GPU transfers the store must take (0: unchecked) */
static void run_round_trip_in(umbp_gpu_backend_t b, const char *name, uint64_t transfers)
{
    struct fixture f;
    setup(&f, b, name);
    umbp_op_t *op;
    umbp_stats_t s0, s1;
    cr_assert_eq(umbp_get_stats(f.rt, &s0), 0);
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, f.blocks, STORED, NULL, &op), 0);
    wait_all(op, 0);
    cr_assert_eq(umbp_get_stats(f.rt, &s1), 0);
    if (transfers)
        cr_expect_eq(s1.kv_transfers - s0.kv_transfers, transfers,
                     "a store of %d blocks took %llu transfers, want %llu", STORED,
                     (unsigned long long)(s1.kv_transfers - s0.kv_transfers),
                     (unsigned long long)transfers);

    /* the object of block i is layer 0 K, layer 0 V, layer 1 K, ...: check
     * through a plain host get as well */
    uint8_t *obj = malloc(2 * L * CHUNK);
    umbp_range_t r = {obj, 2 * L * CHUNK, 0};
    umbp_get_item_t gi = {key_of(5), &r, 1};
    cr_assert_eq(umbp_get(f.rt, &gi, 1, &op), 0);
    wait_all(op, 0);
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++)
            cr_assert(memcmp(obj + ((size_t)l * 2 + kv) * CHUNK, chunk(f.orig[l], 5, kv), CHUNK) == 0,
                      "object layout: layer %d %s", l, kv ? "V" : "K");
    free(obj);

    /* restore object of block i into block i + STORED of a poisoned cache */
    poison_and_download(&f, false);
    umbp_kv_block_t moved[STORED];
    for (int i = 0; i < STORED; i++)
        moved[i] = (umbp_kv_block_t){key_of(i), (uint64_t)(i + STORED)};
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, moved, STORED, NULL, &op), 0);
    wait_all(op, 0);
    poison_and_download(&f, true);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < STORED; i++)
            for (int kv = 0; kv < 2; kv++) {
                cr_assert(memcmp(chunk(f.back[l], (size_t)i + STORED, kv), chunk(f.orig[l], (size_t)i, kv),
                                 CHUNK) == 0, "layer %d block %d %s differs", l, i, kv ? "V" : "K");
                cr_assert(is_poison(chunk(f.back[l], (size_t)i, kv), CHUNK),
                          "layer %d block %d was written but not asked for", l, i);
            }
    teardown_fixture(&f);
}

static void run_round_trip(umbp_gpu_backend_t b, const char *name)
{
    run_round_trip_in(b, name, 0);
}

static void run_partial_and_errors(umbp_gpu_backend_t b, const char *name)
{
    struct fixture f;
    setup(&f, b, name);
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, f.blocks, 4, NULL, &op), 0);
    wait_all(op, 0);
    poison_and_download(&f, false);

    /* layers 1..2 of key 3 into block 63: other layers stay poisoned */
    umbp_kv_block_t one = {key_of(3), NB - 1};
    umbp_kv_xfer_opts_t opts = {.first_layer = 1, .num_layers = 2};
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, &one, 1, &opts, &op), 0);
    wait_all(op, 0);
    poison_and_download(&f, true);
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *got = chunk(f.back[l], NB - 1, kv);
            if (l == 1 || l == 2)
                cr_assert(memcmp(got, chunk(f.orig[l], 3, kv), CHUNK) == 0, "layer %d", l);
            else
                cr_assert(is_poison(got, CHUNK), "layer %d outside the subset was written", l);
        }

    /* a missing key fails alone; the others of the batch load */
    umbp_kv_block_t mix[2] = {{key_of(0), 10}, {key_of(999), 11}};
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, mix, 2, NULL, &op), 0);
    cr_assert_eq(umbp_op_wait(op, 60000), 0);
    cr_assert_eq(umbp_op_key_status(op, 0), 0);
    cr_assert_eq(umbp_op_key_status(op, 1), -ENOENT);
    umbp_op_release(op);

    /* whole-batch errors */
    umbp_kv_block_t bad = {key_of(1), NB};
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, &bad, 1, NULL, &op), UMBP_E_SHAPE);
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, f.blocks, 1, &opts, &op), UMBP_E_SHAPE,
                 "a store of part of the layers must be refused");
    cr_assert_eq(umbp_kv_load(f.rt, f.kv + 100, f.blocks, 1, NULL, &op), -ENOENT);
    umbp_kv_block_t dup[2] = {{key_of(0), 1}, {key_of(0), 2}};
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, dup, 2, NULL, &op), UMBP_E_DUPLICATE_KEY);
    opts = (umbp_kv_xfer_opts_t){.first_layer = L};
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, f.blocks, 1, &opts, &op), UMBP_E_SHAPE);
    cr_assert_eq(umbp_kv_load(NULL, f.kv, f.blocks, 1, NULL, &op), -EINVAL);
    umbp_kv_handle_t h2;
    cr_assert_eq(umbp_kv_register(f.rt, NULL, 1, &h2), -EINVAL);
    umbp_kv_tensor_t badt = layer_tensor(f.dev[0]);
    badt.block_dim = 7; /* no such dimension */
    badt.kv_dim = 0;
    badt.layer_dim = -1;
    int rc = umbp_kv_register(f.rt, &badt, 1, &h2);
    cr_assert_eq(rc, UMBP_E_KV_ROLE, "rc %d: %s", rc, umbp_last_error());
    cr_assert(strstr(umbp_last_error(), "block_dim") != NULL, "message: %s", umbp_last_error());
    cr_assert_eq(umbp_kv_deregister(f.rt, f.kv + 100), -ENOENT);
    cr_assert_eq(umbp_kv_deregister(f.rt, f.kv), 0);
    teardown_fixture(&f);
}

/* An object stored by a plain put of another size is refused per key. */
static void run_foreign_object(umbp_gpu_backend_t b, const char *name)
{
    struct fixture f;
    setup(&f, b, name);
    uint8_t small[4096];
    fill(small, sizeof(small), 9);
    umbp_range_t r = {small, sizeof(small), 0};
    umbp_put_item_t pi = {key_of(7), sizeof(small), &r, 1};
    umbp_op_t *op;
    cr_assert_eq(umbp_put(f.rt, &pi, 1, &op), 0);
    wait_all(op, 0);
    umbp_kv_block_t one = {key_of(7), 0};
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, &one, 1, NULL, &op), 0);
    wait_all(op, UMBP_E_SHAPE);
    teardown_fixture(&f);
}

static bool have_device(umbp_gpu_backend_t *b, const char **name)
{
    int n;
    if (umbp_gpu_backend_probe(UMBP_GPU_BACKEND_CUDA, &n) == 0) {
        *b = UMBP_GPU_BACKEND_CUDA;
        *name = "cuda";
        return true;
    }
    if (umbp_gpu_backend_probe(UMBP_GPU_BACKEND_HIP, &n) == 0) {
        *b = UMBP_GPU_BACKEND_HIP;
        *name = "hip";
        return true;
    }
    return false;
}

#define DEVICE_OR_SKIP(b, name)                                                     \
    umbp_gpu_backend_t b;                                                           \
    const char *name;                                                               \
    if (!have_device(&b, &name))                                                    \
        cr_skip_test("no GPU: %s", umbp_gpu_last_error());

Test(kv_host, round_trip) { run_round_trip(UMBP_GPU_BACKEND_HOST, "host"); }
/* The copy kernels' shape, staging, L2 and ramp options reach the engine:
 * the defaults (32 blocks of 128 threads, 256 MiB, both L2 hints, no ramp
 * where copies overlap an end) and values given, as the engine holds them. */
static void expect_shape(const char *extra, uint32_t ctas, uint32_t threads, uint64_t staging,
                         uint32_t hints)
{
    const uint32_t both =
        UMBP_GPU_L2_DISCARD_STAGING | UMBP_GPU_EVICT_FIRST_RESTORE | UMBP_GPU_RAMP_OVERLAPPED;
    struct fixture f;
    setup_cfg(&f, UMBP_GPU_BACKEND_HOST, "host", extra);
    umbp_gpu_config_t c;
    umbp_gpu_engine_get_config(((struct umbp_runtime *)f.rt)->kv.engine, &c);
    cr_expect_eq(c.max_ctas, ctas, "%s: max_ctas %u", extra, c.max_ctas);
    cr_expect_eq(c.threads_per_cta, threads, "%s: threads_per_cta %u", extra, c.threads_per_cta);
    cr_expect_eq(c.staging_bytes, staging, "%s: staging_bytes %llu", extra,
                 (unsigned long long)c.staging_bytes);
    cr_expect_eq(c.flags & both, hints, "%s: L2 and ramp flags 0x%x", extra, c.flags & both);
    teardown_fixture(&f);
}

Test(kv_host, kernel_shape_options_reach_the_engine)
{
    const uint64_t MiB = 1 << 20;
    const uint32_t l2 = UMBP_GPU_L2_DISCARD_STAGING | UMBP_GPU_EVICT_FIRST_RESTORE;
    expect_shape("\"capacity_bytes\":\"64MiB\"", 32, 128, 256 * MiB, l2);
    expect_shape("\"capacity_bytes\":\"64MiB\",\"gpu_max_ctas\":5,\"gpu_threads_per_cta\":96,"
                 "\"gpu_staging_bytes\":\"16MiB\",\"gpu_l2_discard_staging\":false",
                 5, 96, 16 * MiB, UMBP_GPU_EVICT_FIRST_RESTORE);
    expect_shape("\"capacity_bytes\":\"64MiB\",\"gpu_evict_first_restore\":false", 32, 128,
                 256 * MiB, UMBP_GPU_L2_DISCARD_STAGING);
    expect_shape("\"capacity_bytes\":\"64MiB\",\"gpu_ramp_overlapped\":true", 32, 128,
                 256 * MiB, l2 | UMBP_GPU_RAMP_OVERLAPPED);
}

/* How long a waiter polls before it sleeps (op_spin_ns): through a KV
 * transfer 50 ms with gpu_wait_poll (the default), 50 us without it and for
 * any other op, not at all where poll_wait is off. */
static void expect_spin(const char *extra, uint64_t kv_ns, uint64_t other_ns)
{
    struct fixture f;
    setup_cfg(&f, UMBP_GPU_BACKEND_HOST, "host", extra);
    umbp_op_t *op = NULL;
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, f.blocks, STORED, NULL, &op), 0);
    cr_expect_eq(op_spin_ns(op), kv_ns, "%s: a KV store's waiter polls %llu ns", extra,
                 (unsigned long long)op_spin_ns(op));
    wait_all(op, 0);
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, f.blocks, STORED, NULL, &op), 0);
    cr_expect_eq(op_spin_ns(op), kv_ns, "%s: a KV load's waiter polls %llu ns", extra,
                 (unsigned long long)op_spin_ns(op));
    wait_all(op, 0);
    uint8_t buf[64];
    umbp_range_t rg = {.ptr = buf, .len = sizeof(buf), .offset = 0};
    umbp_get_item_t it = {.key = key_of(9999), .ranges = &rg, .num_ranges = 1};
    cr_assert_eq(umbp_get(f.rt, &it, 1, &op), 0);
    cr_expect_eq(op_spin_ns(op), other_ns, "%s: a host get's waiter polls %llu ns", extra,
                 (unsigned long long)op_spin_ns(op));
    cr_assert_eq(umbp_op_wait(op, 60000), 0);
    umbp_op_release(op);
    teardown_fixture(&f);
}

Test(kv_host, waiters_poll_through_kv_transfers)
{
    const uint64_t us = 1000, ms = 1000 * us;
    expect_spin("\"capacity_bytes\":\"64MiB\",\"poll_wait\":\"on\"", 50 * ms, 50 * us);
    expect_spin("\"capacity_bytes\":\"64MiB\",\"poll_wait\":\"on\",\"gpu_wait_poll\":false",
                50 * us, 50 * us);
    expect_spin("\"capacity_bytes\":\"64MiB\",\"poll_wait\":\"off\"", 0, 0);
}

/* Where a GPU transfer's time went (umbp_stats_t kv_*): a store and a load of
 * 32 blocks are one transfer each, and the two parts of prepare (the wait for
 * the loop thread, the tier's reservation or leases) are set and fit in it. */
static void expect_phases(const umbp_stats_t *a, const umbp_stats_t *b, const char *what)
{
#define DELTA(f) ((unsigned long long)(b->f - a->f))
    cr_expect_eq(DELTA(kv_transfers), 1, "%s: transfers %llu", what, DELTA(kv_transfers));
    cr_expect(DELTA(kv_prepare_ns) > 0 && DELTA(kv_gpu_ns) > 0, "%s: prepare %llu gpu %llu", what,
              DELTA(kv_prepare_ns), DELTA(kv_gpu_ns));
    cr_expect(DELTA(kv_queue_ns) > 0 && DELTA(kv_tier_ns) > 0, "%s: queue %llu tier %llu", what,
              DELTA(kv_queue_ns), DELTA(kv_tier_ns));
    cr_expect(DELTA(kv_queue_ns) + DELTA(kv_tier_ns) <= DELTA(kv_prepare_ns),
              "%s: queue %llu + tier %llu within prepare %llu", what, DELTA(kv_queue_ns),
              DELTA(kv_tier_ns), DELTA(kv_prepare_ns));
#undef DELTA
}

Test(kv_host, transfer_phases_are_counted_and_add_up)
{
    struct fixture f;
    setup(&f, UMBP_GPU_BACKEND_HOST, "host");
    umbp_op_t *op = NULL;
    umbp_stats_t st[3];
    cr_assert_eq(umbp_get_stats(f.rt, &st[0]), 0);
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, f.blocks, STORED, NULL, &op), 0);
    wait_all(op, 0);
    cr_assert_eq(umbp_get_stats(f.rt, &st[1]), 0);
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, f.blocks, STORED, NULL, &op), 0);
    wait_all(op, 0);
    cr_assert_eq(umbp_get_stats(f.rt, &st[2]), 0);
    expect_phases(&st[0], &st[1], "store");
    expect_phases(&st[1], &st[2], "load");
    teardown_fixture(&f);
}

/* umbp_prewake sets the loop thread polling (counted) where poll_wait is on,
 * sends nothing where it is off, and refuses no runtime. */
static uint64_t prewakes_seen(umbp_runtime_t *rt, uint64_t want)
{
    umbp_stats_t st = {0};
    for (int i = 0; i < 10000; i++) { /* the loop takes it asynchronously */
        cr_assert_eq(umbp_get_stats(rt, &st), 0);
        if (st.prewakes >= want)
            break;
        usleep(1000);
    }
    return st.prewakes;
}

Test(kv_host, prewake_sets_the_loop_polling)
{
    cr_expect_eq(umbp_prewake(NULL), -EINVAL);
    umbp_runtime_t *rt = NULL;
    cr_assert_eq(umbp_runtime_create("{\"capacity_bytes\":\"16MiB\",\"poll_wait\":\"on\"}", &rt),
                 0, "%s", umbp_last_error());
    cr_expect_eq(prewakes_seen(rt, 0), 0);
    cr_expect_eq(umbp_prewake(rt), 0);
    cr_expect_eq(prewakes_seen(rt, 1), 1);
    cr_expect_eq(umbp_prewake(rt), 0);
    cr_expect_eq(prewakes_seen(rt, 2), 2);
    umbp_runtime_destroy(rt);
    cr_assert_eq(umbp_runtime_create("{\"capacity_bytes\":\"16MiB\",\"poll_wait\":\"off\"}", &rt),
                 0, "%s", umbp_last_error());
    cr_expect_eq(umbp_prewake(rt), 0);
    cr_expect_eq(prewakes_seen(rt, 0), 0, "poll_wait off: no prewake sent");
    umbp_runtime_destroy(rt);
}

/* The first registration sizes the ops a process's first batches take (the
 * top gpu_warm_transfers of the free list) for at least 1,024 keys, so that
 * a first 600-block batch grows nothing; gpu_warm_transfers 0 leaves them.
 * (Without the warm-up store, whose op may still be on its way back to the
 * free list when registration returns.) */
static size_t warmed_ops(const char *extra, size_t keys)
{
    struct fixture f;
    setup_cfg(&f, UMBP_GPU_BACKEND_HOST, "host", extra);
    struct umbp_runtime *rt = (struct umbp_runtime *)f.rt;
    size_t n = 0;
    pthread_mutex_lock(&rt->free_data.lock);
    for (size_t i = rt->free_data.n; i-- > 0 && rt->free_data.v[i]->cap_keys >= keys;)
        n++;
    pthread_mutex_unlock(&rt->free_data.lock);
    teardown_fixture(&f);
    return n;
}

#define NO_WARM_STORE ",\"gpu_warm_store\":false"

Test(kv_host, registration_sizes_the_first_ops)
{
    cr_expect_eq(warmed_ops("\"capacity_bytes\":\"64MiB\"" NO_WARM_STORE, 1024), 16,
                 "the top 16 ops (gpu_warm_transfers' default) hold 1,024 keys");
    cr_expect_eq(warmed_ops("\"capacity_bytes\":\"64MiB\",\"gpu_warm_transfers\":3" NO_WARM_STORE, 1024),
                 3);
    cr_expect_eq(warmed_ops("\"capacity_bytes\":\"64MiB\",\"gpu_warm_transfers\":0" NO_WARM_STORE, 1024),
                 0);
}

/* The first registration stores block 0 once under a random key and aborts
 * it (gpu_warm_store): the copy ran (status 0), and nothing of it is left:
 * no object, no pool bytes, no event, no counter; a second registration
 * repeats it only for an object size not warmed yet, and gpu_warm_store
 * false skips it. */
Test(kv_host, registration_warms_the_store_path_and_leaves_nothing)
{
    struct fixture f;
    setup_cfg(&f, UMBP_GPU_BACKEND_HOST, "host",
              "\"capacity_bytes\":\"64MiB\",\"enable_events\":true");
    struct umbp_runtime *rt = (struct umbp_runtime *)f.rt;
    cr_expect_eq(rt->kv.warm_store_rc, 0, "the warm-up store ran and copied: %d",
                 rt->kv.warm_store_rc);
    umbp_stats_t st;
    cr_assert_eq(umbp_get_stats(f.rt, &st), 0);
    cr_expect_eq(st.num_objects, 0, "the warm-up key was published");
    cr_expect_eq(st.used_bytes, 0, "the warm-up reservation was kept");
    cr_expect_eq(st.puts_ok + st.puts_failed + st.puts_existing, 0);
    cr_expect_eq(st.kv_transfers, 0);
    umbp_event_t ev[4];
    uint64_t lost = 0;
    cr_expect_eq(umbp_events_drain(f.rt, ev, 4, &lost), 0, "an event for the warm-up key");
    cr_expect_eq(lost, 0);
    /* the cache itself is as it was: a store reads the GPU's bytes only */
    poison_and_download(&f, true);
    for (int l = 0; l < L; l++)
        cr_expect_eq(memcmp(f.back[l], f.orig[l], LAYER_BYTES), 0, "layer %d changed", l);
    /* a second cache of the same object size warms nothing new ... */
    rt->kv.warm_store_rc = 7;
    umbp_kv_tensor_t t[L];
    for (int l = 0; l < L; l++)
        t[l] = layer_tensor(f.dev[l]);
    umbp_kv_handle_t h2;
    cr_assert_eq(umbp_kv_register(f.rt, t, L, &h2), 0, "%s", umbp_last_error());
    cr_expect_eq(rt->kv.warm_store_rc, 7, "a cache of a known size warmed again");
    /* ... one of a new size (a hybrid model's other group) warms once */
    cr_assert_eq(umbp_kv_register(f.rt, t, 1, &h2), 0, "%s", umbp_last_error());
    cr_expect_eq(rt->kv.warm_store_rc, 0, "a cache of a new size was not warmed: %d",
                 rt->kv.warm_store_rc);
    rt->kv.warm_store_rc = 7;
    cr_assert_eq(umbp_kv_register(f.rt, t, 1, &h2), 0, "%s", umbp_last_error());
    cr_expect_eq(rt->kv.warm_store_rc, 7, "the new size warmed twice");
    cr_assert_eq(umbp_get_stats(f.rt, &st), 0);
    cr_expect_eq(st.num_objects + st.used_bytes + st.puts_ok + st.kv_transfers, 0,
                 "the second warm-up left something");
    cr_expect_eq(umbp_events_drain(f.rt, ev, 4, &lost), 0, "an event for a warm-up key");
    teardown_fixture(&f);

    setup_cfg(&f, UMBP_GPU_BACKEND_HOST, "host",
              "\"capacity_bytes\":\"64MiB\",\"gpu_warm_store\":false");
    cr_expect_eq(((struct umbp_runtime *)f.rt)->kv.warm_store_rc, 1, "gpu_warm_store false");
    teardown_fixture(&f);
}

/* umbp_kv_warm_load copies nothing: keys the pool holds fail -ENOENT like
 * absent ones, the poisoned cache stays poisoned, nothing is counted, and
 * the leases went back (a real load of the same keys then restores them). */
Test(kv_host, a_warm_load_copies_and_counts_nothing)
{
    struct fixture f;
    setup(&f, UMBP_GPU_BACKEND_HOST, "host");
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, f.blocks, STORED, NULL, &op), 0);
    wait_all(op, 0);
    poison_and_download(&f, false);
    umbp_stats_t a, b;
    cr_assert_eq(umbp_get_stats(f.rt, &a), 0);
    umbp_kv_block_t mixed[2 * STORED]; /* the stored keys, then as many absent ones */
    for (int i = 0; i < 2 * STORED; i++)
        mixed[i] = (umbp_kv_block_t){key_of(i), (uint64_t)i};
    cr_assert_eq(umbp_kv_warm_load(NULL, f.kv, mixed, 2, NULL, &op), -EINVAL);
    cr_assert_eq(umbp_kv_warm_load(f.rt, f.kv, mixed, 2 * STORED, NULL, &op), 0, "%s",
                 umbp_last_error());
    wait_all(op, -ENOENT);
    mixed[1].key = mixed[0].key;
    cr_expect_eq(umbp_kv_warm_load(f.rt, f.kv, mixed, 2, NULL, &op), UMBP_E_DUPLICATE_KEY,
                 "a warm-up's batch is checked as a load's");
    cr_assert_eq(umbp_get_stats(f.rt, &b), 0);
    cr_expect_eq(b.gets_ok + b.gets_miss + b.gets_failed, a.gets_ok + a.gets_miss + a.gets_failed,
                 "a warm-up was counted");
    cr_expect_eq(b.kv_transfers, a.kv_transfers);
    cr_expect_eq(b.num_leased, 0, "a warm-up's lease was kept");
    poison_and_download(&f, true);
    for (int l = 0; l < L; l++)
        cr_expect(is_poison(f.back[l], LAYER_BYTES), "layer %d was written by a warm-up", l);
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, f.blocks, STORED, NULL, &op), 0);
    wait_all(op, 0);
    poison_and_download(&f, true);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < STORED; i++)
            for (int kv = 0; kv < 2; kv++)
                cr_assert(memcmp(chunk(f.back[l], (size_t)i, kv), chunk(f.orig[l], (size_t)i, kv),
                                 CHUNK) == 0, "layer %d block %d %s after the warm-up", l, i,
                          kv ? "V" : "K");
    teardown_fixture(&f);
}

/* A warm-up that finds the pool full of published objects fails with
 * -ENOSPC at once, instead of evicting one of them or waiting for space. */
Test(kv_host, the_warm_up_store_never_evicts)
{
    struct fixture f;
    /* no eviction in the background: the pool fills to its last byte */
    fixture_create(&f, UMBP_GPU_BACKEND_HOST, "host",
                   "\"capacity_bytes\":\"4MiB\",\"dram_high_watermark\":1.0,"
                   "\"dram_low_watermark\":0.99");
    static uint8_t obj[2 * L * CHUNK];
    memset(obj, 0x5A, sizeof(obj));
    umbp_stats_t before, after;
    for (int i = 0;; i++) { /* until no object of this size fits */
        umbp_key_t k = key_of(100000 + i);
        umbp_range_t r = {.ptr = obj, .len = sizeof(obj), .offset = 0};
        umbp_put_item_t it = {k, sizeof(obj), &r, 1};
        umbp_op_t *op = NULL;
        cr_assert_eq(umbp_put(f.rt, &it, 1, &op), 0, "%s", umbp_last_error());
        wait_all(op, 0);
        cr_assert_eq(umbp_get_stats(f.rt, &before), 0);
        cr_assert(i < 1000, "4 MiB never filled");
        if (before.capacity_bytes - before.used_bytes < sizeof(obj))
            break;
    }
    fixture_register(&f);
    int rc = ((struct umbp_runtime *)f.rt)->kv.warm_store_rc;
    cr_expect_eq(rc, -ENOSPC, "%d %s", rc, umbp_strerror(rc));
    cr_assert_eq(umbp_get_stats(f.rt, &after), 0);
    cr_expect_eq(after.evictions, before.evictions, "the warm-up evicted");
    cr_expect_eq(after.num_objects, before.num_objects);
    cr_expect_eq(after.used_bytes, before.used_bytes);
    cr_expect_eq(after.puts_failed, before.puts_failed);
    teardown_fixture(&f);
}

/* with polling waiters and a polling loop, as on machines of 8+ cores */
Test(kv_host, round_trip_polling)
{
    setenv("UMBP_POLL_WAIT", "on", 1);
    run_round_trip(UMBP_GPU_BACKEND_HOST, "host");
}

/* batches split into slices of 3 child ops: statuses land at the right keys */
Test(kv_host, round_trip_sliced)
{
    setenv("UMBP_GPU_STORE_SLICE_BLOCKS", "3", 1);
    run_round_trip_in(UMBP_GPU_BACKEND_HOST, "host", 11); /* 2, then 3s */
}
/* Which transfers say another follows them (UMBP_KV_XFER_FOLLOWED, so that
 * without gpu_ramp_overlapped they end without a ramp-down): a store's
 * slices but the last; never a load's head, whose rest waits for its
 * leases, nor an op that is not a child. */
Test(kv_host, only_a_store_slice_with_more_after_it_is_followed)
{
    struct umbp_op parent = {.kind = OP_PUT, .n = 10};
    struct umbp_op child = {.kind = OP_PUT, .n = 4, .parent = &parent, .parent_base = 0};
    cr_expect_eq(kv_xfer_flags(&child), UMBP_KV_XFER_FOLLOWED, "the first slice");
    child.parent_base = 4;
    cr_expect_eq(kv_xfer_flags(&child), UMBP_KV_XFER_FOLLOWED, "a middle slice");
    child.parent_base = 6;
    cr_expect_eq(kv_xfer_flags(&child), 0, "the last slice");
    cr_expect_eq(kv_xfer_flags(&parent), 0, "an unsliced store");
    parent.kind = child.kind = OP_GET;
    child.parent_base = 0;
    cr_expect_eq(kv_xfer_flags(&child), 0, "a load's head");
}
/* More slices than the child cap (64): the slice grows so that every key
 * lands in exactly one child.  Keys 0..99 store GPU blocks i % NB. */
Test(kv_host, sliced_store_past_the_child_cap)
{
    setenv("UMBP_GPU_STORE_SLICE_BLOCKS", "1", 1);
    struct fixture f;
    setup(&f, UMBP_GPU_BACKEND_HOST, "host");
    umbp_kv_block_t blocks[100];
    umbp_key_t keys[100];
    for (int i = 0; i < 100; i++) {
        keys[i] = key_of(i);
        blocks[i] = (umbp_kv_block_t){keys[i], (uint64_t)(i % NB)};
    }
    umbp_op_t *op;
    /* a key twice, in different children (slices of 2 past the cap): the
     * whole store is refused and nothing is stored */
    blocks[99].key = keys[0];
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, blocks, 100, NULL, &op), UMBP_E_DUPLICATE_KEY);
    blocks[99].key = keys[99];
    size_t prefix = 1;
    cr_assert_eq(umbp_lookup(f.rt, keys, 100, NULL, &prefix, 0), 0);
    cr_assert_eq(prefix, 0, "a refused store stored %zu keys", prefix);
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, blocks, 100, NULL, &op), 0);
    wait_all(op, 0);
    cr_assert_eq(umbp_lookup(f.rt, keys, 100, NULL, &prefix, 0), 0);
    cr_assert_eq(prefix, 100);
    /* keys 64..99 hold blocks 0..35: restore them into a poisoned cache */
    poison_and_download(&f, false);
    for (int i = 0; i < 36; i++)
        blocks[i] = (umbp_kv_block_t){keys[64 + i], (uint64_t)i};
    cr_assert_eq(umbp_kv_load(f.rt, f.kv, blocks, 36, NULL, &op), 0);
    wait_all(op, 0);
    poison_and_download(&f, true);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < 36; i++)
            for (int kv = 0; kv < 2; kv++)
                cr_assert(memcmp(chunk(f.back[l], (size_t)i, kv), chunk(f.orig[l], (size_t)i, kv),
                                 CHUNK) == 0, "layer %d block %d", l, i);
    teardown_fixture(&f);
}

/* A pool of 4 ops cannot hold a parent and its children: the store must
 * still go through (unsplit), not fail with -EAGAIN forever. */
Test(kv_host, small_op_pool_does_not_split)
{
    setenv("UMBP_GPU_STORE_SLICE_BLOCKS", "3", 1);
    struct fixture f;
    setup_cfg(&f, UMBP_GPU_BACKEND_HOST, "host",
              "\"capacity_bytes\":\"64MiB\",\"max_inflight_ops\":4");
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, f.blocks, 20, NULL, &op), 0);
    wait_all(op, 0);
    teardown_fixture(&f);
}

/* A sliced store whose later slices meet a full pool: each child's
 * statuses must land at its own keys.  1 MiB holds exactly 32 objects of
 * 32 KiB; no waiting and no eviction (high watermark 100%). */
Test(kv_host, sliced_store_statuses_land_at_their_keys)
{
    setenv("UMBP_GPU_STORE_SLICE_BLOCKS", "3", 1);
    struct fixture f;
    setup_cfg(&f, UMBP_GPU_BACKEND_HOST, "host",
              "\"capacity_bytes\":\"1MiB\",\"put_wait_ms\":10000,"
              "\"dram_high_watermark\":1.0,\"dram_low_watermark\":0.9");
    umbp_kv_block_t blocks[40];
    for (int i = 0; i < 40; i++)
        blocks[i] = (umbp_kv_block_t){key_of(i), (uint64_t)i};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_store(f.rt, f.kv, blocks, 40, NULL, &op), 0);
    cr_assert_eq(umbp_op_wait(op, 60000), 0);
    cr_assert_eq(umbp_op_num_keys(op), 40);
    /* 40 blocks into a pool of 32: the later slices evict the earliest
     * published blocks (LRU), so every key lands with 0 at its own index
     * (a child writing past its slice would leave keys in progress) */
    for (size_t i = 0; i < 40; i++)
        cr_assert_eq(umbp_op_key_status(op, i), 0, "key %zu: %s", i,
                     umbp_strerror(umbp_op_key_status(op, i)));
    cr_assert_eq(umbp_op_num_ok(op), 40);
    umbp_op_release(op);
    size_t prefix;
    umbp_key_t keys[40];
    uint8_t present[40];
    for (int i = 0; i < 40; i++)
        keys[i] = key_of(i);
    cr_assert_eq(umbp_lookup(f.rt, keys, 40, present, &prefix, 0), 0);
    size_t hits = 0;
    for (int i = 0; i < 40; i++)
        hits += present[i];
    cr_assert_eq(hits, 32, "the pool holds 32 blocks, %zu present", hits);
    cr_assert(present[39], "the newest block is present");
    teardown_fixture(&f);
}
Test(kv_host, partial_layers_and_errors) { run_partial_and_errors(UMBP_GPU_BACKEND_HOST, "host"); }
Test(kv_host, foreign_object) { run_foreign_object(UMBP_GPU_BACKEND_HOST, "host"); }

Test(kv_device, round_trip)
{
    DEVICE_OR_SKIP(b, name);
    run_round_trip(b, name);
}
Test(kv_device, partial_layers_and_errors)
{
    DEVICE_OR_SKIP(b, name);
    run_partial_and_errors(b, name);
}
Test(kv_device, foreign_object)
{
    DEVICE_OR_SKIP(b, name);
    run_foreign_object(b, name);
}

/* gpu_store_method / gpu_restore_method: every method moves every byte
 * (the options reach the engine: an unknown one is refused in test_config) */
static void round_trip_methods(bool device, const char *store, const char *restore)
{
    setenv("UMBP_GPU_STORE_METHOD", store, 1);
    setenv("UMBP_GPU_RESTORE_METHOD", restore, 1);
    if (!device) {
        run_round_trip(UMBP_GPU_BACKEND_HOST, "host");
        return;
    }
    DEVICE_OR_SKIP(b, name);
    run_round_trip(b, name);
}
Test(kv_host, round_trip_store_kernel_restore_kernel) { round_trip_methods(false, "kernel", "kernel"); }
Test(kv_host, round_trip_store_staged_restore_dma) { round_trip_methods(false, "staged", "dma"); }
Test(kv_device, round_trip_store_kernel_restore_kernel) { round_trip_methods(true, "kernel", "kernel"); }
Test(kv_device, round_trip_store_dma_restore_staged) { round_trip_methods(true, "dma", "staged"); }

Test(kv_host, auto_backend_without_device_is_refused)
{
    umbp_gpu_backend_t b;
    const char *name;
    if (have_device(&b, &name))
        cr_skip_test("a GPU is present");
    umbp_runtime_t *rt;
    cr_assert_eq(umbp_runtime_create("{\"capacity_bytes\":\"8MiB\"}", &rt), 0);
    umbp_kv_tensor_t t;
    memset(&t, 0, sizeof(t));
    static uint8_t mem[2 * 4 * 64];
    t.base = mem;
    t.ndim = 3;
    t.shape[0] = 2, t.shape[1] = 4, t.shape[2] = 64;
    umbp_kv_tensor_set_contiguous(&t);
    t.elem_size = 1;
    t.block_dim = 1;
    t.kv_dim = 0;
    t.layer_dim = -1;
    umbp_kv_handle_t h;
    cr_assert_eq(umbp_kv_register(rt, &t, 1, &h), -ENODEV);
    cr_assert(strstr(umbp_last_error(), "gpu_backend") != NULL, "message: %s", umbp_last_error());
    umbp_runtime_destroy(rt);
}
