/*
 * bench_kv - GPU store and restore of a 10,000-token prefix through the
 * runtime's public API (umbp_kv_store / umbp_kv_load): the whole path an
 * engine uses, pool reservation, actors, leases and publish included, on top
 * of the copy engine that bench/gpu/bench_gpu_copy measures alone.
 *
 * Three layouts (32 layers x 32 KiB chunks, 24 x 16 KiB, 32 x 4 KiB; 625
 * blocks of 16 tokens).  Baseline from the same run: one contiguous pinned
 * host<->device memcpy of the same bytes.  Each store round writes new keys
 * (a fresh prefix); restores read the last stored prefix back; the best of
 * `rounds` is reported, with the median and the first round (the process's
 * first store and load of the layout), and the first restore is checked byte
 * for byte.
 * Each line is followed by where the runtime's time went, per GPU transfer
 * (umbp_stats_t kv_*): before the copy engine had it (queueing, leases or
 * reservations), inside its submit, on the GPU, and after (publish/release).
 * Prints "SKIP" and exits 0 without a GPU.
 *
 *   bench_kv [rounds [backend [LAYERSxKIB]]]   e.g. bench_kv 10 cuda 16x16
 *   (the miniature engine's geometry); without it the three layouts above
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu.h"
#include "umbp/gpu.h"
#include "umbp/umbp.h"

#define NBLK 625
#define BS 16

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define DIE_IF(c, ...)                                                                 \
    do {                                                                               \
        if (c) {                                                                       \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, " (%s / %s)\n", umbp_last_error(), umbp_gpu_last_error()); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static umbp_key_t key_of(int round, int i)
{
    umbp_key_t k;
    memset(&k, 0, sizeof(k));
    memcpy(k.bytes, &round, sizeof(round));
    memcpy(k.bytes + 8, &i, sizeof(i));
    return k;
}

static void wait_ok(umbp_op_t *op, const char *what)
{
    DIE_IF(umbp_op_wait(op, 60000) != 0, "%s did not complete", what);
    size_t ok = umbp_op_num_ok(op), n = umbp_op_num_keys(op);
    DIE_IF(ok != n, "%s: %zu of %zu keys failed (first: %s)", what, n - ok, n,
           umbp_strerror(umbp_op_key_status(op, 0)));
    umbp_op_release(op);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* adds the kv_* phases between two snapshots to acc */
static void phases_add(uint64_t acc[5], const umbp_stats_t *a, const umbp_stats_t *b)
{
    acc[0] += b->kv_transfers - a->kv_transfers;
    acc[1] += b->kv_prepare_ns - a->kv_prepare_ns;
    acc[2] += b->kv_launch_ns - a->kv_launch_ns;
    acc[3] += b->kv_gpu_ns - a->kv_gpu_ns;
    acc[4] += b->kv_finish_ns - a->kv_finish_ns;
}

static void run_layout(const struct gpu_ops *o, const char *backend, int layers, size_t chunk,
                       int rounds, int nops)
{
    size_t heads_dim = chunk / (BS * 2); /* bf16 elements per token */
    size_t layer_bytes = 2 * (size_t)NBLK * chunk, total = layer_bytes * (size_t)layers;
    char cfg[256];
    snprintf(cfg, sizeof(cfg),
             "{\"capacity_bytes\":%zu,\"gpu_backend\":\"%s\",\"dram_prefault\":true}",
             total * 4, backend);
    umbp_runtime_t *rt;
    DIE_IF(umbp_runtime_create(cfg, &rt) < 0, "runtime");
    void **dev = calloc((size_t)layers, sizeof(void *));
    umbp_kv_tensor_t *t = calloc((size_t)layers, sizeof(*t));
    uint8_t *ref = malloc(layer_bytes), *back = malloc(layer_bytes);
    for (int l = 0; l < layers; l++) {
        DIE_IF(gpu_dev_alloc(o, layer_bytes, &dev[l]) < 0, "device alloc");
        for (size_t i = 0; i < layer_bytes; i++)
            ref[i] = (uint8_t)(i * 131 + (size_t)l * 7 + (i >> 12));
        DIE_IF(gpu_memcpy_sync(o, dev[l], ref, layer_bytes) < 0, "upload");
        t[l].base = dev[l];
        t[l].ndim = 4;
        t[l].shape[0] = 2, t[l].shape[1] = NBLK, t[l].shape[2] = BS;
        t[l].shape[3] = (int64_t)heads_dim;
        umbp_kv_tensor_set_contiguous(&t[l]);
        t[l].elem_size = 2;
        t[l].block_dim = 1;
        t[l].kv_dim = 0;
        t[l].layer_dim = -1;
    }
    umbp_kv_handle_t kv;
    DIE_IF(umbp_kv_register(rt, t, (uint32_t)layers, &kv) < 0, "register");

    /* baseline: contiguous pinned memcpy of the same bytes */
    void *pinned, *dcont;
    DIE_IF(gpu_host_alloc(o, total, &pinned) < 0 || gpu_dev_alloc(o, total, &dcont) < 0, "baseline");
    double base[2] = {1e9, 1e9};
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        gpu_memcpy_sync(o, pinned, dcont, total);
        double t1 = now();
        gpu_memcpy_sync(o, dcont, pinned, total);
        double t2 = now();
        base[0] = t1 - t0 < base[0] ? t1 - t0 : base[0];
        base[1] = t2 - t1 < base[1] ? t2 - t1 : base[1];
    }

    umbp_kv_block_t blocks[NBLK];
    double best[2] = {1e9, 1e9}, *times = calloc(2 * (size_t)rounds, sizeof(double));
    double *sub_t = calloc(2 * (size_t)rounds, sizeof(double)); /* the submit calls */
    umbp_stats_t s0, s1;
    uint64_t ph[2][5] = {{0}}; /* store, load: transfers, prepare, launch, gpu, finish */
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < NBLK; i++)
            blocks[i] = (umbp_kv_block_t){key_of(r + 1000 * nops, i), (uint64_t)i};
        umbp_op_t *op[16];
        int per = (NBLK + nops - 1) / nops;
        DIE_IF(umbp_get_stats(rt, &s0) < 0, "stats");
        double t0 = now();
        for (int j = 0; j < nops; j++) {
            int first = j * per, cnt = NBLK - first < per ? NBLK - first : per;
            DIE_IF(umbp_kv_store(rt, kv, blocks + first, (size_t)cnt, NULL, &op[j]) < 0, "store");
        }
        sub_t[r] = now() - t0;
        for (int j = 0; j < nops; j++)
            wait_ok(op[j], "store");
        double t1 = now();
        DIE_IF(umbp_get_stats(rt, &s1) < 0, "stats");
        if (r > 0 || rounds == 1) /* the first round warms up */
            phases_add(ph[0], &s0, &s1);
        s0 = s1;
        t1 = now();
        for (int j = 0; j < nops; j++) {
            int first = j * per, cnt = NBLK - first < per ? NBLK - first : per;
            DIE_IF(umbp_kv_load(rt, kv, blocks + first, (size_t)cnt, NULL, &op[j]) < 0, "load");
        }
        sub_t[rounds + r] = now() - t1;
        for (int j = 0; j < nops; j++)
            wait_ok(op[j], "load");
        double t2 = now();
        DIE_IF(umbp_get_stats(rt, &s1) < 0, "stats");
        if (r > 0 || rounds == 1)
            phases_add(ph[1], &s0, &s1);
        times[r] = t1 - t0;
        times[rounds + r] = t2 - t1;
        best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
        best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
        if (r == 0) { /* the restore wrote the same bytes back: check them */
            for (int l = 0; l < layers; l++) {
                DIE_IF(gpu_memcpy_sync(o, back, dev[l], layer_bytes) < 0, "download");
                for (size_t i = 0; i < layer_bytes; i++)
                    ref[i] = (uint8_t)(i * 131 + (size_t)l * 7 + (i >> 12));
                DIE_IF(memcmp(ref, back, layer_bytes) != 0, "layer %d restored wrong bytes", l);
            }
        }
        umbp_clear(rt);
    }
    printf("%2d layers x %2zu KiB, %d op%s: contiguous %6.2f / %6.2f GB/s; umbp_kv_store %6.2f GB/s "
           "(%.3fx)  umbp_kv_load %6.2f GB/s (%.3fx)\n",
           layers, chunk >> 10, nops, nops > 1 ? "s" : " ", total / base[0] / 1e9, total / base[1] / 1e9, total / best[0] / 1e9,
           base[0] / best[0], total / best[1] / 1e9, base[1] / best[1]);
    /* the process's first store and load of this layout (round 0, before
     * the sort): what an engine's first prefix pays */
    printf("    first round: store %.3fx, load %.3fx\n", base[0] / times[0], base[1] / times[rounds]);
    qsort(times, (size_t)rounds, sizeof(double), cmp_double);
    qsort(times + rounds, (size_t)rounds, sizeof(double), cmp_double);
    qsort(sub_t, (size_t)rounds, sizeof(double), cmp_double);
    qsort(sub_t + rounds, (size_t)rounds, sizeof(double), cmp_double);
    printf("    median: store %.3fx, load %.3fx; submit calls %.0f / %.0f us\n",
           base[0] / times[rounds / 2], base[1] / times[rounds + rounds / 2],
           sub_t[rounds / 2] * 1e6, sub_t[rounds + rounds / 2] * 1e6);
    free(times);
    free(sub_t);
    for (int d = 0; d < 2; d++)
        printf("    %s, mean per transfer of %.0f a round: prepare %.0f us, launch %.0f us, "
               "gpu %.0f us, finish %.0f us\n", d ? "load " : "store",
               (double)ph[d][0] / (rounds > 1 ? rounds - 1 : 1), ph[d][0] ? ph[d][1] / 1e3 / ph[d][0] : 0.0,
               ph[d][0] ? ph[d][2] / 1e3 / ph[d][0] : 0.0, ph[d][0] ? ph[d][3] / 1e3 / ph[d][0] : 0.0,
               ph[d][0] ? ph[d][4] / 1e3 / ph[d][0] : 0.0);
    gpu_host_free(o, pinned);
    gpu_dev_free(o, dcont);
    umbp_runtime_destroy(rt);
    for (int l = 0; l < layers; l++)
        gpu_dev_free(o, dev[l]);
    free(dev);
    free(t);
    free(ref);
    free(back);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    const char *backend = argc > 2 ? argv[2] : "cuda";
    umbp_gpu_backend_t b = strcmp(backend, "hip") == 0    ? UMBP_GPU_BACKEND_HIP
                           : strcmp(backend, "host") == 0 ? UMBP_GPU_BACKEND_HOST
                                                          : UMBP_GPU_BACKEND_CUDA;
    int n;
    if (umbp_gpu_backend_probe(b, &n) < 0) {
        printf("SKIP: bench_kv: no %s device: %s\n", backend, umbp_gpu_last_error());
        return 0;
    }
    const struct gpu_ops *o = gpu_backend_ops(b);
    /* UMBP_MODE=standalone UMBP_SOCKET_DIR=... runs the same through a server */
    const char *mode = getenv("UMBP_MODE") ? getenv("UMBP_MODE") : "embedded";
    printf("bench_kv: 10,000-token prefix (625 blocks) through umbp_kv_store/load, mode %s, "
           "backend %s, best of %d (ratios vs contiguous pinned memcpy, same run)\n", mode,
           backend, rounds);
    /* one op of 625 blocks, then the same blocks as 5 ops in flight at once,
     * which lets the store/load actors reserve and publish one op while the
     * GPU copies another */
    int only_layers = 0, only_kib = 0;
    if (argc > 3 && (sscanf(argv[3], "%dx%d", &only_layers, &only_kib) != 2 ||
                     only_layers < 1 || only_layers > 64 || only_kib < 1 || only_kib > 256)) {
        fprintf(stderr, "bench_kv: layout '%s' is not LAYERSxKIB (1-64 x 1-256)\n", argv[3]);
        return 2;
    }
    for (int nops = 1; nops <= 5; nops += 4) {
        if (only_layers) {
            run_layout(o, backend, only_layers, (size_t)only_kib << 10, rounds, nops);
            continue;
        }
        run_layout(o, backend, 32, 32 << 10, rounds, nops);
        run_layout(o, backend, 24, 16 << 10, rounds, nops);
        run_layout(o, backend, 32, 4 << 10, rounds, nops);
    }
    return 0;
}
