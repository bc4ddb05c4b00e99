/*
 * bench_lookup - prefix lookup of 1,000 keys through umbp_lookup (embedded).
 *
 * Stores 1,000 small objects, then times `iters` lookups of all 1,000 keys
 * (a full hit) and of 1,000 keys whose second half is absent, reporting the
 * median and p99.  Baseline from the same run: a lookup of a single key,
 * the fixed cost of a call.  With the loop thread asleep a lookup runs on
 * the caller's thread (the loop lock, runtime/actor_lookup.c); the last
 * row times the same lookups while another thread keeps restoring the
 * objects, so the loop is busy and most lookups are posted to it (and, under
 * ThreadSanitizer, both paths race real loop work).
 * Target (design brief): median <= 100 us for 1,000 keys.
 */
#include <pthread.h>
#include <stdatomic.h>

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

struct getter {
    umbp_runtime_t *rt;
    const umbp_key_t *keys;
    _Atomic bool stop;
    uint64_t rounds;
};

/* Restores the 1,000 objects in batches of 100 until told to stop. */
static void *getter_main(void *arg)
{
    struct getter *g = arg;
    static uint8_t dst[100][4096];
    umbp_range_t r[100];
    umbp_get_item_t items[100];
    for (int i = 0; i < 100; i++)
        r[i] = (umbp_range_t){dst[i], sizeof(dst[i]), 0};
    while (!atomic_load(&g->stop)) {
        for (int b = 0; b < NKEYS / 100; b++) {
            for (int i = 0; i < 100; i++)
                items[i] = (umbp_get_item_t){g->keys[b * 100 + i], &r[i], 1};
            umbp_op_t *op;
            if (umbp_get(g->rt, items, 100, &op) == 0)
                bench_wait_ok(op, "get");
        }
        g->rounds++;
    }
    return NULL;
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
    struct getter g = {.rt = rt, .keys = keys};
    pthread_t th;
    double mb, pb;
    if (pthread_create(&th, NULL, getter_main, &g) != 0)
        return 1;
    time_lookups(rt, keys, NKEYS, iters, NKEYS, &mb, &pb);
    atomic_store(&g.stop, true);
    pthread_join(th, NULL);
    printf("bench_lookup: %d lookups each, embedded mode (target: median <= 100 us for 1000 keys)\n",
           iters);
    printf("  baseline 1 key                median %7.1f us  p99 %7.1f us\n", m1, p1);
    printf("  1000 keys, all present        median %7.1f us  p99 %7.1f us  (%.1fx baseline)\n",
           mf, pf, mf / m1);
    printf("  1000 keys, prefix 500         median %7.1f us  p99 %7.1f us  (%.1fx baseline)\n",
           mh, ph, mh / m1);
    printf("  1000 keys, restores running   median %7.1f us  p99 %7.1f us  (%.1fx baseline; "
           "%llu rounds of 1000 gets meanwhile)\n",
           mb, pb, mb / m1, (unsigned long long)g.rounds);
    umbp_runtime_destroy(rt);
    return 0;
}
