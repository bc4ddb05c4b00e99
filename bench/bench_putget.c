/*
 * bench_putget - host-only put and get throughput of large objects through
 * the public API, against plain memcpy of the same bytes in the same run.
 *
 * For each object size (256 KiB, 2 MiB) and copy_threads (1, 2): puts
 * `total` bytes of new objects in batches of 32 with up to 4 batches in
 * flight, then gets them all back into a separate buffer; verifies the bytes
 * once; repeats `rounds` times (clear between rounds, untimed) and reports the
 * best round.  Baseline: single-threaded memcpy from the same source into the
 * same destination buffer (warm, prefaulted), best of the same rounds.
 * Target (design brief): >= 0.8 x memcpy.
 */
#include "bench_util.h"

struct bench {
    size_t obj, nobj;
    uint8_t *src, *dst;
    umbp_range_t *ranges;
    umbp_put_item_t *pi;
    umbp_get_item_t *gi;
};

static double run_pass(umbp_runtime_t *rt, struct bench *b, uint64_t round, bool put)
{
    return bench_pass(rt, put ? b->src : b->dst, b->obj, b->nobj, round, put, b->ranges, b->pi,
                      b->gi);
}

static double memcpy_pass(struct bench *b)
{
    double t0 = bench_now();
    for (size_t i = 0; i < b->nobj; i++)
        memcpy(b->dst + i * b->obj, b->src + i * b->obj, b->obj);
    return bench_now() - t0;
}

static void run_size(size_t obj, size_t total, int rounds)
{
    struct bench b = {.obj = obj, .nobj = total / obj};
    size_t bytes = b.nobj * obj;
    b.src = malloc(bytes);
    b.dst = malloc(bytes);
    b.ranges = calloc(b.nobj, sizeof(*b.ranges));
    b.pi = calloc(b.nobj, sizeof(*b.pi));
    b.gi = calloc(b.nobj, sizeof(*b.gi));
    if (!b.src || !b.dst || !b.ranges || !b.pi || !b.gi) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    bench_fill(b.src, bytes, obj);
    memset(b.dst, 0, bytes);
    double best_memcpy = 1e9;
    for (int r = 0; r < rounds; r++) {
        double t = memcpy_pass(&b);
        best_memcpy = t < best_memcpy ? t : best_memcpy;
    }
    double base = bytes / best_memcpy / 1e9;
    printf("%-8zu KiB objects, %zu MiB per pass: memcpy baseline %.2f GB/s\n", obj >> 10,
           bytes >> 20, base);
    for (int threads = 1; threads <= 2; threads++) {
        char cfg[256];
        snprintf(cfg, sizeof(cfg),
                 "{\"capacity_bytes\":%zu,\"copy_threads\":%d,\"dram_prefault\":true}",
                 bytes + bytes / 2, threads);
        umbp_runtime_t *rt = bench_runtime(cfg);
        double best_put = 1e9, best_get = 1e9;
        for (int r = 0; r < rounds; r++) {
            memset(b.dst, 0x5A, bytes);
            double tp = run_pass(rt, &b, (uint64_t)r + 1, true);
            double tg = run_pass(rt, &b, (uint64_t)r + 1, false);
            if (r == 0 && memcmp(b.src, b.dst, bytes) != 0) {
                fprintf(stderr, "restored bytes differ\n");
                exit(1);
            }
            best_put = tp < best_put ? tp : best_put;
            best_get = tg < best_get ? tg : best_get;
            umbp_clear(rt);
        }
        double gp = bytes / best_put / 1e9, gg = bytes / best_get / 1e9;
        printf("  copy_threads=%d  put %6.2f GB/s (%.2fx memcpy)   get %6.2f GB/s (%.2fx memcpy)\n",
               threads, gp, gp / base, gg, gg / base);
        umbp_runtime_destroy(rt);
    }
    free(b.src);
    free(b.dst);
    free(b.ranges);
    free(b.pi);
    free(b.gi);
}

int main(int argc, char **argv)
{
    size_t total = (argc > 1 ? strtoull(argv[1], NULL, 10) : 1024) << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    printf("bench_putget: host put/get through the public API vs memcpy (target >= 0.80x)\n");
    run_size(256u << 10, total, rounds);
    run_size(2u << 20, total, rounds);
    return 0;
}
