/* bench_util.h - timing, random fill, keys and pipelined submission shared
 * by the host benchmarks. */
#ifndef UMBP_BENCH_UTIL_H
#define UMBP_BENCH_UTIL_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "umbp/umbp.h"

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void bench_fill(void *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567;
    uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(b + i, &x, 8);
    }
    for (; i < n; i++)
        b[i] = (uint8_t)i;
}

static inline umbp_key_t bench_key(uint64_t round, uint64_t i)
{
    umbp_key_t k;
    memset(&k, 0, sizeof(k));
    uint64_t x = round * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xC2B2AE3D27D4EB4Full;
    for (int w = 0; w < 4; w++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(k.bytes + 8 * w, &x, 8);
    }
    return k;
}

static inline umbp_runtime_t *bench_runtime(const char *json)
{
    umbp_runtime_t *rt;
    if (umbp_runtime_create(json, &rt) < 0) {
        fprintf(stderr, "umbp_runtime_create: %s\n", umbp_last_error());
        exit(1);
    }
    return rt;
}

static inline void bench_wait_ok(umbp_op_t *op, const char *what)
{
    if (umbp_op_wait(op, 60000) != 0) {
        fprintf(stderr, "%s: op did not complete\n", what);
        exit(1);
    }
    for (size_t i = 0; i < umbp_op_num_keys(op); i++) {
        int s = umbp_op_key_status(op, i);
        if (s != 0) {
            fprintf(stderr, "%s: key %zu failed: %s\n", what, i, umbp_strerror(s));
            exit(1);
        }
    }
    umbp_op_release(op);
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* Puts (put) or gets nobj objects of obj bytes laid out back to back at
 * buf, keys bench_key(round, i), in batches of BENCH_BATCH with BENCH_DEPTH
 * batches in flight; rg, pi and gi are scratch arrays of nobj entries.
 * Returns the seconds it took; exits on any failed key. */
#define BENCH_BATCH 32
#define BENCH_DEPTH 4

static inline double bench_pass(umbp_runtime_t *rt, uint8_t *buf, size_t obj, size_t nobj, uint64_t round,
                   bool put, umbp_range_t *rg, umbp_put_item_t *pi, umbp_get_item_t *gi)
{
    umbp_op_t *ring[BENCH_DEPTH] = {0};
    size_t slot = 0;
    double t0 = bench_now();
    for (size_t i0 = 0; i0 < nobj; i0 += BENCH_BATCH) {
        size_t n = nobj - i0 < BENCH_BATCH ? nobj - i0 : BENCH_BATCH;
        if (ring[slot])
            bench_wait_ok(ring[slot], put ? "put" : "get");
        ring[slot] = NULL;
        for (size_t i = i0; i < i0 + n; i++) {
            rg[i] = (umbp_range_t){buf + i * obj, obj, 0};
            pi[i] = (umbp_put_item_t){bench_key(round, i), obj, &rg[i], 1};
            gi[i] = (umbp_get_item_t){bench_key(round, i), &rg[i], 1};
        }
        int rc;
        do
            rc = put ? umbp_put(rt, &pi[i0], n, &ring[slot]) : umbp_get(rt, &gi[i0], n, &ring[slot]);
        while (rc == -EAGAIN);
        if (rc < 0) {
            fprintf(stderr, "submit: %s\n", umbp_strerror(rc));
            exit(1);
        }
        slot = (slot + 1) % BENCH_DEPTH;
    }
    for (size_t s = 0; s < BENCH_DEPTH; s++)
        if (ring[s])
            bench_wait_ok(ring[s], put ? "put" : "get");
    return bench_now() - t0;
}


#endif
