/*
 * bench_load_latency - how long a small restore takes while bulk offload is
 * in flight, against the same restore on an idle runtime in the same run.
 *
 * A 64 KiB get (one engine block of a small model) is timed from umbp_get to
 * completion, `samples` times: first with nothing else in flight (the
 * baseline), then while 1 GiB of puts (2 MiB objects, 8 batches of 64 in
 * flight at once) keeps every copy worker busy.  Gets are copied before
 * puts and a put yields between 2 MiB chunks, so the loaded latency should
 * stay within a chunk's copy time of the idle one.  Prints p50 and p99 of
 * both and their ratio.  Usage: bench_load_latency [samples] [copy_threads]
 */
#include "bench_util.h"

#define SMALL (64u << 10)
#define BULK_OBJ (2u << 20)
#define BULK_BATCH 64
#define BULK_DEPTH 8

static double time_get(umbp_runtime_t *rt, umbp_key_t key, uint8_t *dst)
{
    umbp_range_t rg = {dst, SMALL, 0};
    umbp_get_item_t it = {key, &rg, 1};
    umbp_op_t *op;
    double t0 = bench_now();
    int rc;
    while ((rc = umbp_get(rt, &it, 1, &op)) == -EAGAIN)
        ;
    if (rc < 0) {
        fprintf(stderr, "get: %s\n", umbp_strerror(rc));
        exit(1);
    }
    bench_wait_ok(op, "small get");
    return bench_now() - t0;
}

static void pct(double *v, size_t n, double *p50, double *p99)
{
    qsort(v, n, sizeof(*v), cmp_double);
    *p50 = v[n / 2];
    *p99 = v[(size_t)((double)n * 0.99)];
}

int main(int argc, char **argv)
{
    size_t samples = argc > 1 ? strtoul(argv[1], NULL, 10) : 400;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    if (samples < 10)
        samples = 10;
    char cfg[256];
    snprintf(cfg, sizeof(cfg),
             "{\"capacity_bytes\": \"3GiB\", \"copy_threads\": %d, \"max_inflight_ops\": 64, "
             "\"put_wait_ms\": 60000, \"timeout_ms\": 60000, \"dram_prefault\": true}", threads);
    umbp_runtime_t *rt = bench_runtime(cfg);
    uint8_t *small = malloc(SMALL), *dst = malloc(SMALL);
    bench_fill(small, SMALL, 1);
    umbp_key_t skey = bench_key(0, 0);
    umbp_range_t srg = {small, SMALL, 0};
    umbp_put_item_t spi = {skey, SMALL, &srg, 1};
    umbp_op_t *op;
    if (umbp_put(rt, &spi, 1, &op) < 0)
        return 1;
    bench_wait_ok(op, "small put");

    size_t nbulk = (1ull << 30) / BULK_OBJ;
    uint8_t *bulk = malloc((size_t)BULK_OBJ * nbulk);
    bench_fill(bulk, (size_t)BULK_OBJ * nbulk, 2);
    umbp_range_t *br = calloc(nbulk, sizeof(*br));
    umbp_put_item_t *bi = calloc(nbulk, sizeof(*bi));

    double *idle = calloc(samples, sizeof(double)), *busy = calloc(samples, sizeof(double));
    for (size_t i = 0; i < samples; i++)
        idle[i] = time_get(rt, skey, dst);

    size_t got = 0;
    for (uint64_t round = 1; got < samples; round++) {
        umbp_op_t *ring[BULK_DEPTH];
        size_t nring = 0;
        for (size_t i0 = 0; i0 < nbulk && nring < BULK_DEPTH; i0 += BULK_BATCH) {
            size_t n = nbulk - i0 < BULK_BATCH ? nbulk - i0 : BULK_BATCH;
            for (size_t i = i0; i < i0 + n; i++) {
                br[i] = (umbp_range_t){bulk + i * BULK_OBJ, BULK_OBJ, 0};
                bi[i] = (umbp_put_item_t){bench_key(round, i), BULK_OBJ, &br[i], 1};
            }
            if (umbp_put(rt, &bi[i0], n, &ring[nring]) == 0)
                nring++;
        }
        /* sample while the bulk puts are being copied */
        for (size_t k = 0; k < samples / 8 + 1 && got < samples; k++)
            busy[got++] = time_get(rt, skey, dst);
        for (size_t r = 0; r < nring; r++) {
            umbp_op_wait(ring[r], 60000);
            umbp_op_release(ring[r]);
        }
        umbp_clear(rt);
        spi.key = skey;
        if (umbp_put(rt, &spi, 1, &op) == 0)
            bench_wait_ok(op, "small put");
    }
    if (memcmp(dst, small, SMALL) != 0) {
        fprintf(stderr, "restored bytes differ\n");
        return 1;
    }
    double i50, i99, b50, b99;
    pct(idle, samples, &i50, &i99);
    pct(busy, samples, &b50, &b99);
    printf("64 KiB get, %d copy threads, %zu samples each\n", threads, samples);
    printf("  idle (baseline):        p50 %8.1f us  p99 %8.1f us\n", i50 * 1e6, i99 * 1e6);
    printf("  under 1 GiB of puts:    p50 %8.1f us  p99 %8.1f us\n", b50 * 1e6, b99 * 1e6);
    printf("  ratio loaded/idle:      p50 %6.2fx    p99 %6.2fx\n", b50 / i50, b99 / i99);
    umbp_runtime_destroy(rt);
    free(small), free(dst), free(bulk), free(br), free(bi), free(idle), free(busy);
    return 0;
}
