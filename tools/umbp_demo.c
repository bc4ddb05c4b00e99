/*
 * umbp-demo - the main job: embedded mode on a synthetic multi-layer KV cache.
 *
 * Builds a vLLM-shaped KV cache in host memory (one tensor per layer, shaped
 * (2, num_blocks, block_size, heads, head_dim), random contents), stores every
 * block as one object (all layers' K and V chunks end to end: 2 * layers
 * ranges per object), looks the prefix up, restores every block into a fresh
 * poisoned KV cache, and verifies every byte.  Prints hit rate, bytes moved,
 * GB/s and the pool's statistics.  Exit status 0 only if every byte matched.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "umbp/umbp.h"

struct demo {
    int layers, block_tokens, heads, head_dim, dtype_bytes, batch;
    size_t blocks;
    size_t chunk;       /* bytes of K (or V) of one block in one layer */
    uint8_t **src, **dst; /* per layer tensors */
    umbp_key_t *keys;
    char config[512];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)(x >> (8 * (i & 7)));
}

static uint8_t *chunk_ptr(uint8_t *layer, const struct demo *d, size_t block, int kv)
{
    return layer + ((size_t)kv * d->blocks + block) * d->chunk;
}

static void block_ranges(const struct demo *d, uint8_t **tensors, size_t block, umbp_range_t *r)
{
    uint64_t off = 0;
    for (int l = 0; l < d->layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            r->ptr = chunk_ptr(tensors[l], d, block, kv);
            r->len = d->chunk;
            r->offset = off;
            off += d->chunk;
            r++;
        }
}

/* One line that updates in place on a terminal, every 10% otherwise. */
static void progress(const char *what, size_t done, size_t total)
{
    static size_t last_decile = SIZE_MAX;
    bool tty = isatty(STDERR_FILENO);
    size_t pct = total ? done * 100 / total : 100;
    if (!tty && pct / 10 == last_decile && done != total)
        return;
    last_decile = done == total ? SIZE_MAX : pct / 10;
    fprintf(stderr, tty ? "\r  %-8s %6zu / %zu blocks (%3zu%%)" : "  %-8s %6zu / %zu blocks (%3zu%%)\n",
            what, done, total, pct);
    if (tty && done == total)
        fputc('\n', stderr);
}

/* Submits blocks [0, blocks) in batches, put or get, and waits for each. */
static int run_batches(umbp_runtime_t *rt, struct demo *d, bool put, size_t *ok_out)
{
    size_t nr = (size_t)d->layers * 2;
    umbp_range_t *ranges = calloc((size_t)d->batch * nr, sizeof(*ranges));
    umbp_put_item_t *pi = calloc((size_t)d->batch, sizeof(*pi));
    umbp_get_item_t *gi = calloc((size_t)d->batch, sizeof(*gi));
    int rc = 0;
    size_t ok = 0, reported = 0;
    if (!ranges || !pi || !gi) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t b0 = 0; b0 < d->blocks; b0 += (size_t)d->batch) {
        size_t n = d->blocks - b0 < (size_t)d->batch ? d->blocks - b0 : (size_t)d->batch;
        for (size_t i = 0; i < n; i++) {
            block_ranges(d, put ? d->src : d->dst, b0 + i, &ranges[i * nr]);
            pi[i] = (umbp_put_item_t){d->keys[b0 + i], nr * d->chunk, &ranges[i * nr], (uint32_t)nr};
            gi[i] = (umbp_get_item_t){d->keys[b0 + i], &ranges[i * nr], (uint32_t)nr};
        }
        umbp_op_t *op;
        do {
            rc = put ? umbp_put(rt, pi, n, &op) : umbp_get(rt, gi, n, &op);
        } while (rc == -EAGAIN);
        if (rc < 0) {
            fprintf(stderr, "\n%s failed: %s\n", put ? "put" : "get", umbp_strerror(rc));
            goto out;
        }
        if ((rc = umbp_op_wait(op, -1)) != 0) {
            fprintf(stderr, "\n%s did not complete: %s\n", put ? "put" : "get", umbp_strerror(rc));
            umbp_op_release(op);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            int s = umbp_op_key_status(op, i);
            if (s == 0)
                ok++;
            else if (reported++ < 5)
                fprintf(stderr, "\n  block %zu: %s\n", b0 + i, umbp_strerror(s));
        }
        umbp_op_release(op);
        progress(put ? "store" : "restore", b0 + n, d->blocks);
    }
out:
    free(ranges);
    free(pi);
    free(gi);
    *ok_out = ok;
    return rc;
}

static size_t verify(const struct demo *d, size_t *bad_blocks)
{
    size_t bad = 0, blocks_bad = 0;
    for (size_t b = 0; b < d->blocks; b++) {
        bool block_ok = true;
        for (int l = 0; l < d->layers; l++)
            for (int kv = 0; kv < 2; kv++) {
                const uint8_t *s = chunk_ptr(d->src[l], d, b, kv);
                const uint8_t *t = chunk_ptr(d->dst[l], d, b, kv);
                if (memcmp(s, t, d->chunk) != 0) {
                    for (size_t i = 0; i < d->chunk; i++)
                        bad += s[i] != t[i];
                    block_ok = false;
                }
            }
        blocks_bad += !block_ok;
    }
    *bad_blocks = blocks_bad;
    return bad;
}

static void print_stats(umbp_runtime_t *rt)
{
    umbp_stats_t s;
    if (umbp_get_stats(rt, &s) != 0)
        return;
    printf("pool: capacity %.1f MiB, used %.1f MiB, %" PRIu64 " objects, %" PRIu64
           " evictions (%.1f MiB)\n",
           s.capacity_bytes / 1048576.0, s.used_bytes / 1048576.0, s.num_objects, s.evictions,
           s.evicted_bytes / 1048576.0);
    printf("ops: puts ok %" PRIu64 " existing %" PRIu64 " failed %" PRIu64 "; gets ok %" PRIu64
           " miss %" PRIu64 " failed %" PRIu64 "; lookups %" PRIu64 " (%" PRIu64 " keys, %" PRIu64
           " hits)\n",
           s.puts_ok, s.puts_existing, s.puts_failed, s.gets_ok, s.gets_miss, s.gets_failed,
           s.lookups, s.lookup_keys, s.lookup_hits);
}

static int setup(struct demo *d)
{
    d->chunk = (size_t)d->block_tokens * (size_t)d->heads * (size_t)d->head_dim *
               (size_t)d->dtype_bytes;
    d->src = calloc((size_t)d->layers, sizeof(*d->src));
    d->dst = calloc((size_t)d->layers, sizeof(*d->dst));
    d->keys = calloc(d->blocks, sizeof(*d->keys));
    if (!d->src || !d->dst || !d->keys)
        return -ENOMEM;
    size_t layer_bytes = 2 * d->blocks * d->chunk;
    for (int l = 0; l < d->layers; l++) {
        d->src[l] = malloc(layer_bytes);
        d->dst[l] = malloc(layer_bytes);
        if (!d->src[l] || !d->dst[l])
            return -ENOMEM;
        fill_random(d->src[l], layer_bytes, (uint64_t)l + 1);
        memset(d->dst[l], 0xA5, layer_bytes); /* poison */
    }
    for (size_t b = 0; b < d->blocks; b++) {
        /* a stand-in for the connector's key: hash of (namespace, block) */
        char name[64];
        int len = snprintf(name, sizeof(name), "umbp-demo/block/%zu", b);
        XXH128_hash_t h1 = XXH3_128bits_withSeed(name, (size_t)len, 1);
        XXH128_hash_t h2 = XXH3_128bits_withSeed(name, (size_t)len, 2);
        memcpy(d->keys[b].bytes, &h1, 16);
        memcpy(d->keys[b].bytes + 16, &h2, 16);
    }
    return 0;
}

static void teardown(struct demo *d)
{
    for (int l = 0; d->src && l < d->layers; l++) {
        free(d->src[l]);
        free(d->dst[l]);
    }
    free(d->src);
    free(d->dst);
    free(d->keys);
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--blocks N] [--layers L] [--heads H] [--head-dim D] [--block-tokens T]\n"
            "          [--batch B] [--config JSON]\n"
            "Stores N KV blocks of L layers (K and V chunks of T*H*D*2 bytes each) in an\n"
            "embedded umbp runtime, restores them into a fresh cache and verifies every byte.\n",
            argv0);
}

static int parse_args(int argc, char **argv, struct demo *d)
{
    static const struct option opts[] = {
        {"blocks", 1, 0, 'n'}, {"layers", 1, 0, 'l'},       {"heads", 1, 0, 'h'},
        {"head-dim", 1, 0, 'd'}, {"block-tokens", 1, 0, 't'}, {"batch", 1, 0, 'b'},
        {"config", 1, 0, 'c'}, {"help", 0, 0, '?'},         {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        long v = optarg ? strtol(optarg, NULL, 10) : 0;
        switch (c) {
        case 'n': d->blocks = (size_t)v; break;
        case 'l': d->layers = (int)v; break;
        case 'h': d->heads = (int)v; break;
        case 'd': d->head_dim = (int)v; break;
        case 't': d->block_tokens = (int)v; break;
        case 'b': d->batch = (int)v; break;
        case 'c': snprintf(d->config, sizeof(d->config), "%s", optarg); break;
        default: usage(argv[0]); return -1;
        }
    }
    if (d->blocks < 1 || d->layers < 1 || d->heads < 1 || d->head_dim < 1 ||
        d->block_tokens < 1 || d->batch < 1 || d->batch > 4096) {
        fprintf(stderr, "every size must be a positive integer (batch at most 4096)\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct demo d = {.layers = 32, .block_tokens = 16, .heads = 4, .head_dim = 128,
                     .dtype_bytes = 2, .batch = 32, .blocks = 2000};
    if (parse_args(argc, argv, &d) < 0)
        return 2;
    int rc = setup(&d);
    if (rc < 0) {
        fprintf(stderr, "cannot allocate the synthetic KV cache: %s\n", strerror(-rc));
        return 1;
    }
    size_t obj = 2 * (size_t)d.layers * d.chunk, total = obj * d.blocks;
    if (!d.config[0]) /* room for every block plus headroom below the high watermark */
        snprintf(d.config, sizeof(d.config), "{\"mode\":\"embedded\",\"capacity_bytes\":%zu,\"dram_prefault\":true}",
                 total + total / 4 + (64u << 20));
    printf("umbp-demo: %zu blocks x %d layers x {K,V} x %zu KiB = %.1f MiB per block, %.1f GiB "
           "total\nconfig: %s\n",
           d.blocks, d.layers, d.chunk >> 10, obj / 1048576.0, total / 1073741824.0, d.config);
    fflush(stdout); /* before the progress lines on stderr */
    umbp_runtime_t *rt;
    if ((rc = umbp_runtime_create(d.config, &rt)) < 0) {
        fprintf(stderr, "umbp_runtime_create: %s\n", umbp_last_error());
        teardown(&d);
        return 1;
    }
    size_t stored = 0, restored = 0, prefix = 0;
    double t0 = now_s();
    rc = run_batches(rt, &d, true, &stored);
    double t1 = now_s();
    if (rc == 0)
        rc = umbp_lookup(rt, d.keys, d.blocks, NULL, &prefix, 0);
    double t2 = now_s();
    if (rc == 0)
        rc = run_batches(rt, &d, false, &restored);
    double t3 = now_s();
    size_t bad_blocks = 0, bad = rc == 0 ? verify(&d, &bad_blocks) : 0;

    printf("store:   %zu/%zu blocks, %.2f GiB in %.3f s = %.2f GB/s\n", stored, d.blocks,
           stored * obj / 1073741824.0, t1 - t0, stored * obj / (t1 - t0) / 1e9);
    printf("lookup:  cached prefix %zu of %zu blocks in %.1f us\n", prefix, d.blocks,
           (t2 - t1) * 1e6);
    printf("restore: %zu/%zu blocks, %.2f GiB in %.3f s = %.2f GB/s\n", restored, d.blocks,
           restored * obj / 1073741824.0, t3 - t2, restored * obj / (t3 - t2) / 1e9);
    printf("hit rate: %.1f%%\n", 100.0 * (double)restored / (double)d.blocks);
    print_stats(rt);
    umbp_runtime_destroy(rt);
    teardown(&d);
    if (rc < 0) {
        printf("FAILED: %s\n", umbp_strerror(rc));
        return 1;
    }
    if (bad || restored != d.blocks) {
        printf("FAILED: %zu wrong bytes in %zu blocks, %zu blocks not restored\n", bad,
               bad_blocks, d.blocks - restored);
        return 1;
    }
    printf("verified: every byte of %zu restored blocks matches (%.2f GiB)\n", restored,
           restored * obj / 1073741824.0);
    return 0;
}
