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

#endif
