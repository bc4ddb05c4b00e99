/*
 * bench_alloc - allocation + publish rate: puts of small (4 KiB, one range)
 * objects in batches of 64 into a pool under constant eviction, measured as
 * objects per second; a second pass into a pool large enough to never evict.
 * Baseline from the same run: malloc + memcpy + free of the same sizes on the
 * calling thread (what the allocator, index and copy cost with no runtime).
 */
#include "bench_util.h"

#define OBJ 4096
#define BATCH 64

static double put_rate(const char *cfg, size_t nobj)
{
    umbp_runtime_t *rt = bench_runtime(cfg);
    static uint8_t payload[OBJ];
    bench_fill(payload, sizeof(payload), 3);
    umbp_range_t r = {payload, OBJ, 0};
    umbp_put_item_t items[BATCH];
    umbp_op_t *ring[4] = {0};
    size_t slot = 0;
    double t0 = bench_now();
    for (size_t i0 = 0; i0 < nobj; i0 += BATCH) {
        for (size_t i = 0; i < BATCH; i++)
            items[i] = (umbp_put_item_t){bench_key(9, i0 + i), OBJ, &r, 1};
        if (ring[slot]) {
            umbp_op_wait(ring[slot], 60000);
            umbp_op_release(ring[slot]);
        }
        int rc;
        do {
            rc = umbp_put(rt, items, BATCH, &ring[slot]);
        } while (rc == -EAGAIN);
        if (rc < 0) {
            fprintf(stderr, "put: %s\n", umbp_strerror(rc));
            exit(1);
        }
        slot = (slot + 1) % 4;
    }
    for (size_t s = 0; s < 4; s++)
        if (ring[s]) {
            umbp_op_wait(ring[s], 60000);
            umbp_op_release(ring[s]);
        }
    double t = bench_now() - t0;
    umbp_stats_t st;
    umbp_get_stats(rt, &st);
    printf("    (puts ok %llu, failed %llu, evictions %llu)\n", (unsigned long long)st.puts_ok,
           (unsigned long long)st.puts_failed, (unsigned long long)st.evictions);
    umbp_runtime_destroy(rt);
    return (double)nobj / t;
}

int main(int argc, char **argv)
{
    size_t nobj = argc > 1 ? strtoull(argv[1], NULL, 10) : 500000;
    static uint8_t payload[OBJ];
    bench_fill(payload, sizeof(payload), 3);
    double t0 = bench_now();
    for (size_t i = 0; i < nobj; i++) {
        void *p = malloc(OBJ);
        memcpy(p, payload, OBJ);
        __asm__ volatile("" : : "r"(p) : "memory");
        free(p);
    }
    double base = (double)nobj / (bench_now() - t0);
    printf("bench_alloc: %zu puts of 4 KiB objects, batches of %d\n", nobj, BATCH);
    printf("  baseline malloc+memcpy+free      %10.0f objects/s\n", base);
    char cfg[128];
    snprintf(cfg, sizeof(cfg), "{\"capacity_bytes\":%zu,\"dram_prefault\":true}", (size_t)nobj * OBJ * 2);
    double big = put_rate(cfg, nobj);
    printf("  umbp put, no eviction            %10.0f objects/s (%.2fx baseline)\n", big, big / base);
    double small = put_rate("{\"capacity_bytes\":\"64MiB\",\"dram_prefault\":true}", nobj);
    printf("  umbp put, constant eviction      %10.0f objects/s (%.2fx baseline)\n", small,
           small / base);
    return 0;
}
