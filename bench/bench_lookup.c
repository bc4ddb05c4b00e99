/*
 * bench_lookup - prefix lookup of 1,000 keys through umbp_lookup (embedded).
 *
 * Stores 1,000 small objects, then times `iters` lookups of all 1,000 keys
 * (a full hit) and of 1,000 keys whose second half is absent, reporting the
 * median and p99.  Baseline from the same run: a lookup of a single key,
 * which is the fixed cost of one round trip to the lookup actor.
 * Target (design brief): median <= 100 us for 1,000 keys.
 */
#include "bench_util.h"

#define NKEYS 1000

static void time_lookups(umbp_runtime_t *rt, const umbp_key_t *keys, size_t n, int iters,
                         size_t expect_prefix, double *median, double *p99)
{
    double *t = malloc(sizeof(double) * (size_t)iters);
    uint8_t present[NKEYS];
    for (int i = 0; i < iters; i++) {
        size_t prefix;
        double t0 = bench_now();
        int rc = umbp_lookup(rt, keys, n, present, &prefix, 0);
        t[i] = bench_now() - t0;
        if (rc != 0 || prefix != expect_prefix) {
            fprintf(stderr, "lookup: rc %s, prefix %zu (expected %zu)\n", umbp_strerror(rc),
                    prefix, expect_prefix);
            exit(1);
        }
    }
    qsort(t, (size_t)iters, sizeof(double), cmp_double);
    *median = t[iters / 2] * 1e6;
    *p99 = t[(size_t)iters * 99 / 100] * 1e6;
    free(t);
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 5000;
    umbp_runtime_t *rt = bench_runtime("{\"capacity_bytes\":\"64MiB\"}");
    static umbp_key_t keys[NKEYS], half[NKEYS];
    static uint8_t payload[4096];
    bench_fill(payload, sizeof(payload), 7);
    umbp_range_t r = {payload, sizeof(payload), 0};
    umbp_put_item_t items[NKEYS];
    for (size_t i = 0; i < NKEYS; i++) {
        keys[i] = bench_key(1, i);
        half[i] = i < NKEYS / 2 ? keys[i] : bench_key(2, i);
        items[i] = (umbp_put_item_t){keys[i], sizeof(payload), &r, 1};
    }
    umbp_op_t *op;
    if (umbp_put(rt, items, NKEYS, &op) < 0)
        return 1;
    bench_wait_ok(op, "put");
    double m1, p1, mf, pf, mh, ph;
    time_lookups(rt, keys, 1, iters, 1, &m1, &p1);
    time_lookups(rt, keys, NKEYS, iters, NKEYS, &mf, &pf);
    time_lookups(rt, half, NKEYS, iters, NKEYS / 2, &mh, &ph);
    printf("bench_lookup: %d lookups each, embedded mode (target: median <= 100 us for 1000 keys)\n",
           iters);
    printf("  baseline 1 key (round trip)   median %7.1f us  p99 %7.1f us\n", m1, p1);
    printf("  1000 keys, all present        median %7.1f us  p99 %7.1f us  (%.1fx baseline)\n",
           mf, pf, mf / m1);
    printf("  1000 keys, prefix 500         median %7.1f us  p99 %7.1f us  (%.1fx baseline)\n",
           mh, ph, mh / m1);
    umbp_runtime_destroy(rt);
    return 0;
}
