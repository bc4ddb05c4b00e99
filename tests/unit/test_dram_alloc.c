/*
 * test_dram_alloc.c - the dram allocator against a shadow model.
 *
 * The shadow is one byte per 256-byte granule of the range: a block handed
 * out must cover only free granules (no overlap), lie inside [0, capacity)
 * and be aligned; a free must give back exactly what was taken.  Long
 * seeded random runs also compare the allocator's idea of the largest free
 * block with the shadow's, so a false -ENOSPC cannot hide.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024ull)

static uint64_t rng_state;

static uint64_t rng(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct live {
    uint64_t off, size;
};

struct model {
    struct dram_alloc *a;
    uint64_t cap;
    uint8_t *shadow;    /* 1 per granule in use */
    struct live *live;
    size_t nlive, maxlive;
    uint64_t used;
};

static void model_init(struct model *m, uint64_t cap, size_t maxlive)
{
    memset(m, 0, sizeof(*m));
    cr_assert_eq(dram_alloc_create(cap, &m->a), 0);
    m->cap = dram_alloc_capacity(m->a);
    m->shadow = calloc(m->cap / DRAM_ALLOC_ALIGN, 1);
    m->live = calloc(maxlive, sizeof(*m->live));
    m->maxlive = maxlive;
    cr_assert(m->shadow && m->live);
}

static void model_fini(struct model *m)
{
    dram_alloc_destroy(m->a);
    free(m->shadow);
    free(m->live);
}

static int model_get(struct model *m, uint64_t size)
{
    uint64_t off = UINT64_MAX, len = dram_alloc_round(size);
    int rc = dram_alloc_get(m->a, size, &off);

    if (rc == -ENOSPC) {
        cr_assert_gt(len, dram_alloc_largest_free(m->a),
                     "-ENOSPC for %llu bytes with a free block of %llu",
                     (unsigned long long)len,
                     (unsigned long long)dram_alloc_largest_free(m->a));
        return rc;
    }
    cr_assert_eq(rc, 0, "get(%llu) = %d", (unsigned long long)size, rc);
    cr_assert_eq(off % DRAM_ALLOC_ALIGN, 0, "offset %llu misaligned",
                 (unsigned long long)off);
    cr_assert_leq(off + len, m->cap, "block [%llu, +%llu) past capacity",
                  (unsigned long long)off, (unsigned long long)len);
    cr_assert_null(memchr(m->shadow + off / DRAM_ALLOC_ALIGN, 1,
                          len / DRAM_ALLOC_ALIGN),
                   "block at %llu overlaps a live one", (unsigned long long)off);
    memset(m->shadow + off / DRAM_ALLOC_ALIGN, 1, len / DRAM_ALLOC_ALIGN);
    cr_assert_lt(m->nlive, m->maxlive);
    m->live[m->nlive++] = (struct live){ off, size };
    m->used += len;
    return 0;
}

static void model_put(struct model *m, size_t i)
{
    struct live l = m->live[i];
    uint64_t len = dram_alloc_round(l.size);

    cr_assert_eq(dram_alloc_put(m->a, l.off), 0);
    memset(m->shadow + l.off / DRAM_ALLOC_ALIGN, 0, len / DRAM_ALLOC_ALIGN);
    m->live[i] = m->live[--m->nlive];
    m->used -= len;
}

static uint64_t shadow_largest_run(const struct model *m)
{
    uint64_t best = 0, run = 0;

    for (uint64_t g = 0; g < m->cap / DRAM_ALLOC_ALIGN; g++) {
        run = m->shadow[g] ? 0 : run + 1;
        if (run > best)
            best = run;
    }
    return best * DRAM_ALLOC_ALIGN;
}

static void model_check(const struct model *m)
{
    cr_assert_eq(dram_alloc_check(m->a), 0, "invariant %d broken",
                 dram_alloc_check(m->a));
    cr_assert_eq(dram_alloc_used(m->a), m->used);
    cr_assert_eq(dram_alloc_largest_free(m->a), shadow_largest_run(m));
}

/* Mostly KV-block sizes (64 KiB .. 2 MiB), some tiny and odd ones. */
static uint64_t random_size(void)
{
    switch (rng() % 4) {
    case 0:
        return 1 + rng() % 4096;
    case 1:
        return 1 + rng() % (300 * KiB);
    default:
        return 64 * KiB << (rng() % 6);
    }
}

static void free_all_randomly(struct model *m)
{
    while (m->nlive)
        model_put(m, rng() % m->nlive);
}

Test(dram_alloc, basics)
{
    struct dram_alloc *a;
    uint64_t off, off2;

    cr_assert_eq(dram_alloc_create(MiB, &a), 0);
    cr_assert_eq(dram_alloc_capacity(a), MiB);
    cr_assert_eq(dram_alloc_get(a, 0, &off), -EINVAL);
    cr_assert_eq(dram_alloc_get(a, 1, &off), 0);
    cr_assert_eq(off, 0);
    cr_assert_eq(dram_alloc_used(a), DRAM_ALLOC_ALIGN, "1 byte takes a granule");
    cr_assert_eq(dram_alloc_get(a, 257, &off2), 0);
    cr_assert_eq(off2, DRAM_ALLOC_ALIGN);
    cr_assert_eq(dram_alloc_used(a), 3 * DRAM_ALLOC_ALIGN);
    cr_assert_eq(dram_alloc_put(a, off2 + 256), -ENOENT, "not a block start");
    cr_assert_eq(dram_alloc_put(a, 12345), -ENOENT);
    cr_assert_eq(dram_alloc_put(a, off), 0);
    cr_assert_eq(dram_alloc_put(a, off), -ENOENT, "double free detected");
    cr_assert_eq(dram_alloc_put(a, off2), 0);
    cr_assert_eq(dram_alloc_used(a), 0);
    cr_assert_eq(dram_alloc_free_blocks(a), 1);
    cr_assert_eq(dram_alloc_check(a), 0);
    dram_alloc_destroy(a);
}

Test(dram_alloc, capacity_edges)
{
    struct dram_alloc *a;
    uint64_t off;

    cr_assert_eq(dram_alloc_create(100, &a), -EINVAL);
    cr_assert_eq(dram_alloc_create(0, &a), -EINVAL);
    cr_assert_eq(dram_alloc_create(1000, &a), 0);
    cr_assert_eq(dram_alloc_capacity(a), 768, "rounded down to granules");
    cr_assert_eq(dram_alloc_get(a, 769, &off), -ENOSPC);
    cr_assert_eq(dram_alloc_get(a, UINT64_MAX, &off), -ENOSPC);
    cr_assert_eq(dram_alloc_get(a, 768, &off), 0);
    cr_assert_eq(off, 0);
    cr_assert_eq(dram_alloc_get(a, 1, &off), -ENOSPC);
    dram_alloc_destroy(a);
}

Test(dram_alloc, enospc_when_full_and_reuse)
{
    struct model m;
    size_t n = 0;

    model_init(&m, 16 * MiB, 1024);
    while (model_get(&m, 64 * KiB) == 0)
        n++;
    cr_assert_eq(n, 256, "16 MiB holds 256 blocks of 64 KiB, got %zu", n);
    cr_assert_eq(model_get(&m, 1), -ENOSPC);
    cr_assert_eq(dram_alloc_largest_free(m.a), 0);
    model_put(&m, 17);
    cr_assert_eq(model_get(&m, 64 * KiB), 0, "the freed block is reused");
    cr_assert_eq(model_get(&m, 1), -ENOSPC);
    model_check(&m);
    free_all_randomly(&m);
    model_fini(&m);
}

Test(dram_alloc, fragmentation_and_coalescing)
{
    struct dram_alloc *a;
    uint64_t offs[64], off;

    cr_assert_eq(dram_alloc_create(64 * 64 * KiB, &a), 0);
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(dram_alloc_get(a, 64 * KiB, &offs[i]), 0);
        cr_assert_eq(offs[i], i * 64 * KiB);
    }
    for (int i = 0; i < 64; i += 2)
        cr_assert_eq(dram_alloc_put(a, offs[i]), 0);
    /* Half the pool is free, but only in 64 KiB holes. */
    cr_assert_eq(dram_alloc_used(a), 32 * 64 * KiB);
    cr_assert_eq(dram_alloc_free_blocks(a), 32);
    cr_assert_eq(dram_alloc_get(a, 64 * KiB + 1, &off), -ENOSPC);
    /* Freeing block 11 merges holes 10, 11 and 12 into one of 192 KiB. */
    cr_assert_eq(dram_alloc_put(a, offs[11]), 0);
    cr_assert_eq(dram_alloc_free_blocks(a), 31);
    cr_assert_eq(dram_alloc_largest_free(a), 192 * KiB);
    cr_assert_eq(dram_alloc_get(a, 192 * KiB, &off), 0);
    cr_assert_eq(off, offs[10]);
    cr_assert_eq(dram_alloc_check(a), 0);
    dram_alloc_destroy(a);
}

Test(dram_alloc, best_fit)
{
    struct dram_alloc *a;
    uint64_t o[7], off;

    /* used 64K | hole 256K | used | hole 128K | used | hole 192K | used */
    cr_assert_eq(dram_alloc_create(1024 * KiB, &a), 0);
    uint64_t sizes[7] = { 64, 256, 64, 128, 64, 192, 256 };
    for (int i = 0; i < 7; i++)
        cr_assert_eq(dram_alloc_get(a, sizes[i] * KiB, &o[i]), 0);
    cr_assert_eq(dram_alloc_put(a, o[1]), 0);
    cr_assert_eq(dram_alloc_put(a, o[3]), 0);
    cr_assert_eq(dram_alloc_put(a, o[5]), 0);
    cr_assert_eq(dram_alloc_get(a, 100 * KiB, &off), 0);
    cr_assert_eq(off, o[3], "the 128 KiB hole is the best fit");
    cr_assert_eq(dram_alloc_get(a, 150 * KiB, &off), 0);
    cr_assert_eq(off, o[5], "then the 192 KiB hole");
    cr_assert_eq(dram_alloc_get(a, 200 * KiB, &off), 0);
    cr_assert_eq(off, o[1]);
    cr_assert_eq(dram_alloc_check(a), 0);
    dram_alloc_destroy(a);
}

/* Hundreds of thousands of random operations, biased to keep the pool
 * between half and nearly full, where fragmentation bites. */
static void random_run(uint64_t seed, uint64_t cap, long ops)
{
    struct model m;

    rng_state = seed;
    model_init(&m, cap, 1 << 16);
    for (long i = 0; i < ops; i++) {
        bool fill = m.used < m.cap / 2 || (m.used < m.cap - m.cap / 16 && rng() % 2);

        if ((fill || m.nlive == 0) && m.nlive < m.maxlive)
            model_get(&m, random_size());
        else
            model_put(&m, rng() % m.nlive);
        if (i % 4999 == 0)
            model_check(&m);
    }
    model_check(&m);
    free_all_randomly(&m);
    model_check(&m);
    cr_assert_eq(dram_alloc_free_blocks(m.a), 1, "everything coalesced");
    uint64_t off = 1;
    cr_assert_eq(dram_alloc_get(m.a, m.cap, &off), 0,
                 "the whole capacity fits once everything is freed");
    cr_assert_eq(off, 0);
    model_fini(&m);
}

Test(dram_alloc, random_vs_shadow_seed1, .timeout = 120)
{
    random_run(1, 256 * MiB, 300000);
}

Test(dram_alloc, random_vs_shadow_seed2_odd_capacity, .timeout = 120)
{
    random_run(0xdecafbad, 64 * MiB + 3 * 256 + 17, 200000);
}

Test(dram_alloc, tiny_objects_many_blocks, .timeout = 120)
{
    struct model m;

    rng_state = 42;
    model_init(&m, 8 * MiB, 1 << 16);
    for (long i = 0; i < 200000; i++) {
        if (m.nlive == 0 || (rng() % 3 && m.nlive < m.maxlive))
            model_get(&m, 1 + rng() % 1000);
        else
            model_put(&m, rng() % m.nlive);
        if (i % 9973 == 0)
            model_check(&m);
    }
    model_check(&m);
    free_all_randomly(&m);
    cr_assert_eq(dram_alloc_free_blocks(m.a), 1);
    model_fini(&m);
}
