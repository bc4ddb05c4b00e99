/*
 * bench_py_baseline - the C side of bench/python/bench_py_overhead.py: the
 * engine-side calls of one scheduler/worker step made straight from C, so
 * the Python bench can print its own cost beside them and the ratio.
 *
 * Same workload as the Python bench: a host-backend KV cache of small blocks
 * (2 layers of FlashAttention shape (2, 4096, 1, 1, 16), bf16: 128-byte
 * objects, so the copies are negligible) and, per iteration, 512 fresh
 * 32-byte block hashes.  Timed, per iteration:
 *   store_plan   umbp_keys_derive of 512 keys + the umbp_kv_block_t array +
 *                umbp_kv_store (submission only; the op is waited for and
 *                released outside the timing)
 *   lookup       umbp_lookup of those 512 keys (synchronous round trip)
 *   load_submit  the umbp_kv_block_t array + umbp_kv_load (submission only)
 *   derive_keys  umbp_keys_derive of the 512 keys alone
 *   call         one trivial exported call (umbp_gpu_backends_built), the
 *                floor of any binding's per-call cost
 * Output: one "NAME median_us P50 p90_us P90" line each (parsed by the
 * Python bench), after a header line.  Usage: bench_py_baseline [iters]
 */
#include "bench_util.h"
#include "umbp/gpu.h"
#include "umbp/keys.h"

#define NB 4096
#define NKEYS 512
#define L 2

static double quantile(double *t, int n, int pct)
{
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[(size_t)n * (size_t)pct / 100] * 1e6;
}

static void report(const char *name, double *t, int n)
{
    double p50 = quantile(t, n, 50), p90 = quantile(t, n, 90);
    printf("%s median_us %.3f p90_us %.3f\n", name, p50, p90);
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 300;
    if (iters < 10)
        iters = 10;
    umbp_runtime_t *rt = bench_runtime("{\"capacity_bytes\":\"256MiB\",\"gpu_backend\":\"host\"}");
    static uint16_t layer[L][2 * NB * 16];
    umbp_kv_tensor_t t[L];
    for (int l = 0; l < L; l++) {
        bench_fill(layer[l], sizeof(layer[l]), (uint64_t)l + 1);
        memset(&t[l], 0, sizeof(t[l]));
        t[l].base = layer[l];
        t[l].ndim = 5;
        int64_t shape[5] = {2, NB, 1, 1, 16};
        memcpy(t[l].shape, shape, sizeof(shape));
        umbp_kv_tensor_set_contiguous(&t[l]);
        t[l].elem_size = 2;
        t[l].block_dim = 1;
        t[l].kv_dim = 0;
        t[l].layer_dim = -1;
    }
    umbp_kv_handle_t kv;
    if (umbp_kv_register(rt, t, L, &kv) < 0) {
        fprintf(stderr, "umbp_kv_register: %s\n", umbp_last_error());
        return 1;
    }
    umbp_ns_desc_t d = {.model = "bench/model", .revision = "", .block_size = 16,
                        .layout = "NHD", .dtype = "bfloat16", .tp = 1, .pp = 1, .pcp = 1,
                        .dcp = 1};
    umbp_ns_t ns;
    umbp_rank_id_t rank = {0, 0, 0, 0};
    if (umbp_ns_derive(&d, &ns) < 0)
        return 1;
    static uint8_t hashes[NKEYS][32];
    static umbp_key_t keys[NKEYS];
    static umbp_kv_block_t blocks[NKEYS];
    static uint8_t present[NKEYS];
    double *ts = malloc(sizeof(double) * (size_t)iters);
    double *tl = malloc(sizeof(double) * (size_t)iters);
    double *tg = malloc(sizeof(double) * (size_t)iters);
    double *td = malloc(sizeof(double) * (size_t)iters);
    for (int it = 0; it < iters; it++) {
        for (size_t i = 0; i < NKEYS; i++) {
            bench_fill(hashes[i], 32, (uint64_t)it * NKEYS + i + 1);
        }
        umbp_op_t *op;
        double t0 = bench_now();
        if (umbp_keys_derive(&ns, &rank, 0, hashes, 32, NKEYS, keys) < 0)
            return 1;
        for (size_t i = 0; i < NKEYS; i++) {
            blocks[i].key = keys[i];
            blocks[i].block = ((size_t)it * NKEYS + i) % NB;
        }
        int rc = umbp_kv_store(rt, kv, blocks, NKEYS, NULL, &op);
        ts[it] = bench_now() - t0;
        if (rc < 0) {
            fprintf(stderr, "umbp_kv_store: %s\n", umbp_strerror(rc));
            return 1;
        }
        bench_wait_ok(op, "store");

        size_t prefix = 0;
        t0 = bench_now();
        rc = umbp_lookup(rt, keys, NKEYS, present, &prefix, 0);
        tl[it] = bench_now() - t0;
        if (rc < 0 || prefix != NKEYS) {
            fprintf(stderr, "umbp_lookup: %s, prefix %zu\n", umbp_strerror(rc), prefix);
            return 1;
        }

        t0 = bench_now();
        for (size_t i = 0; i < NKEYS; i++) {
            blocks[i].key = keys[i];
            blocks[i].block = ((size_t)it * NKEYS + i + 7) % NB;
        }
        rc = umbp_kv_load(rt, kv, blocks, NKEYS, NULL, &op);
        tg[it] = bench_now() - t0;
        if (rc < 0) {
            fprintf(stderr, "umbp_kv_load: %s\n", umbp_strerror(rc));
            return 1;
        }
        bench_wait_ok(op, "load");

        t0 = bench_now();
        umbp_keys_derive(&ns, &rank, 0, hashes, 32, NKEYS, keys);
        td[it] = bench_now() - t0;
    }
    enum { CALLS = 2000000 };
    volatile unsigned sink = 0;
    double t0 = bench_now();
    for (int i = 0; i < CALLS; i++)
        sink += umbp_gpu_backends_built();
    double call_us = (bench_now() - t0) / CALLS * 1e6;
    (void)sink;

    printf("bench_py_baseline: %d iterations of %d blocks, host backend, %d-byte objects\n", iters,
           NKEYS, (int)umbp_kv_object_size(rt, kv));
    report("store_plan", ts, iters);
    report("lookup", tl, iters);
    report("load_submit", tg, iters);
    report("derive_keys", td, iters);
    printf("call median_us %.4f p90_us %.4f\n", call_us, call_us);
    free(ts);
    free(tl);
    free(tg);
    free(td);
    umbp_runtime_destroy(rt);
    return 0;
}
