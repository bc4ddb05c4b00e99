/*
 * test_dram_pool.c - the dram tier's host memory pool.
 *
 * Checks what a user would see: the bytes are usable and, when shared,
 * visible through the descriptor or /dev/shm; the shm file exists exactly
 * while the pool lives; huge pages are used when the system has them and
 * fall back with a warning when it does not (the test reads the system's
 * huge-page counters and never changes them); prefault makes every page
 * resident (mincore); the NUMA binding is visible to get_mempolicy.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pool.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024ull)

static struct dram_pool_params params(uint64_t capacity)
{
    return (struct dram_pool_params){
        .capacity = capacity,
        .shm_name = "",
        .hugepage_size = 2 * MiB,
        .numa_node = -1,
    };
}

static struct dram_pool *make(const struct dram_pool_params *p)
{
    struct dram_pool *pool = NULL;
    char err[512] = "";
    int rc = dram_pool_create(p, &pool, err, sizeof(err));

    cr_assert_eq(rc, 0, "dram_pool_create: %d %s", rc, err);
    cr_assert_not_null(pool);
    cr_assert_not_null(pool->base);
    return pool;
}

static void fill_and_check(struct dram_pool *pool, uint8_t seed)
{
    uint8_t *b = pool->base;

    for (uint64_t i = 0; i < pool->size; i++)
        b[i] = (uint8_t)(i * 7 + seed);
    for (uint64_t i = 0; i < pool->size; i += 4093)
        cr_assert_eq(b[i], (uint8_t)(i * 7 + seed), "byte %llu",
                     (unsigned long long)i);
}

static size_t resident_pages(const struct dram_pool *pool)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = pool->size / page, res = 0;
    unsigned char *vec = calloc(n, 1);

    cr_assert_not_null(vec);
    cr_assert_eq(mincore(pool->base, pool->size, vec), 0);
    for (size_t i = 0; i < n; i++)
        res += vec[i] & 1;
    free(vec);
    return res;
}

Test(dram_pool, anonymous)
{
    struct dram_pool_params p = params(MiB + 1);
    struct dram_pool *pool = make(&p);

    cr_assert_eq(pool->page_size, (uint64_t)sysconf(_SC_PAGESIZE));
    cr_assert_eq(pool->size, MiB + pool->page_size, "rounded up to a page");
    cr_assert_eq(pool->fd, -1);
    cr_assert_not(pool->hugepages);
    cr_assert_str_empty(pool->warning);
    cr_assert_eq(resident_pages(pool), 0, "nothing touched without prefault");
    fill_and_check(pool, 1);
    dram_pool_destroy(pool);
}

Test(dram_pool, prefault_makes_every_page_resident)
{
    struct dram_pool_params p = params(8 * MiB);
    struct dram_pool *pool;

    p.prefault = true;
    pool = make(&p);
    cr_assert_eq(resident_pages(pool), pool->size / (size_t)sysconf(_SC_PAGESIZE));
    fill_and_check(pool, 2);
    dram_pool_destroy(pool);
}

Test(dram_pool, memfd_is_shared_through_its_descriptor)
{
    struct dram_pool_params p = params(256 * KiB);
    struct dram_pool *pool;
    char link[64], target[256] = "";
    uint8_t back[4096];

    p.shared = true;
    pool = make(&p);
    cr_assert_geq(pool->fd, 0);
    snprintf(link, sizeof(link), "/proc/self/fd/%d", pool->fd);
    cr_assert_gt(readlink(link, target, sizeof(target) - 1), 0);
    cr_assert(strstr(target, "memfd:umbp-dram"), "fd is %s", target);
    fill_and_check(pool, 3);
    cr_assert_eq(pread(pool->fd, back, sizeof(back), 8192), (ssize_t)sizeof(back));
    cr_assert_arr_eq(back, (uint8_t *)pool->base + 8192, sizeof(back),
                     "the descriptor sees the bytes written to the mapping");
    dram_pool_destroy(pool);
}

Test(dram_pool, shm_name_lives_exactly_as_long_as_the_pool)
{
    struct dram_pool_params p = params(300 * KiB);
    struct dram_pool *pool, *second = NULL;
    char name[64], path[96], err[512] = "";
    struct stat st;

    snprintf(name, sizeof(name), "umbp-test-pool-%d", (int)getpid());
    snprintf(path, sizeof(path), "/dev/shm/%s", name);
    unlink(path); /* a crashed earlier run */
    p.shared = true;
    p.shm_name = name;
    pool = make(&p);
    cr_assert_eq(stat(path, &st), 0, "%s exists while the pool lives", path);
    cr_assert_eq(st.st_mode & 0777, 0600);
    cr_assert_eq((uint64_t)st.st_size, pool->size);
    fill_and_check(pool, 4);

    /* Another process would see the same bytes through the name. */
    int fd = shm_open(pool->shm_path, O_RDONLY, 0);
    cr_assert_geq(fd, 0);
    uint8_t *view = mmap(NULL, pool->size, PROT_READ, MAP_SHARED, fd, 0);
    cr_assert_neq(view, MAP_FAILED);
    cr_assert_arr_eq(view, pool->base, pool->size);
    munmap(view, pool->size);
    close(fd);

    /* The name is exclusive (its owner lock), and a failed create leaves it
     * alone. */
    cr_assert_eq(dram_pool_create(&p, &second, err, sizeof(err)), -EBUSY);
    cr_assert_null(second);
    cr_assert(strstr(err, "dram_shm_name"), "error names the option: %s", err);
    cr_assert_eq(stat(path, &st), 0, "the failed create did not unlink it");

    dram_pool_destroy(pool);
    cr_assert_eq(stat(path, &st), -1, "%s is gone after destroy", path);
    cr_assert_eq(errno, ENOENT);
    char owner[128];
    snprintf(owner, sizeof(owner), "%s.owner", path);
    cr_assert_eq(stat(owner, &st), -1, "%s is left after destroy", owner);
}

/* Huge pages of this size the system can still hand out. */
static uint64_t hugepages_available(uint64_t page_size)
{
    char path[128];
    unsigned long long free_pages = 0, resv = 0;
    FILE *f;

    snprintf(path, sizeof(path),
             "/sys/kernel/mm/hugepages/hugepages-%llukB/free_hugepages",
             (unsigned long long)(page_size / KiB));
    if (!(f = fopen(path, "r")))
        return 0;
    if (fscanf(f, "%llu", &free_pages) != 1)
        free_pages = 0;
    fclose(f);
    snprintf(path, sizeof(path),
             "/sys/kernel/mm/hugepages/hugepages-%llukB/resv_hugepages",
             (unsigned long long)(page_size / KiB));
    if ((f = fopen(path, "r"))) {
        if (fscanf(f, "%llu", &resv) != 1)
            resv = 0;
        fclose(f);
    }
    return free_pages > resv ? free_pages - resv : 0;
}

static void check_hugepages(bool shared, uint64_t page_size)
{
    struct dram_pool_params p = params(4 * MiB);
    uint64_t need = 4 * MiB / page_size ? 4 * MiB / page_size : 1;
    bool available = hugepages_available(page_size) >= need;
    struct dram_pool *pool;

    p.shared = shared;
    p.hugepages = true;
    p.hugepage_size = page_size;
    pool = make(&p);
    if (available) {
        cr_assert(pool->hugepages, "huge pages are available but not used: %s",
                  pool->warning);
        cr_assert_eq(pool->page_size, page_size);
        cr_assert_str_empty(pool->warning);
    } else {
        cr_assert_not(pool->hugepages);
        cr_assert_eq(pool->page_size, (uint64_t)sysconf(_SC_PAGESIZE));
        cr_assert_eq(pool->size, 4 * MiB, "4 KiB pages, not rounded to %llu",
                     (unsigned long long)page_size);
        cr_assert(strstr(pool->warning, "dram_use_hugepages"), "%s", pool->warning);
        cr_assert(strstr(pool->warning, "nr_hugepages"),
                  "the warning says how to fix it: %s", pool->warning);
    }
    fill_and_check(pool, 5);
    dram_pool_destroy(pool);
}

/* One test, so that Criterion's parallel workers never compete for a small
 * huge-page reserve between reading the counters and mapping. */
Test(dram_pool, hugepages_2m_anonymous_then_memfd)
{
    check_hugepages(false, 2 * MiB);
    check_hugepages(true, 2 * MiB);
}

Test(dram_pool, hugepages_anonymous_1g)
{
    check_hugepages(false, 1024 * MiB);
}

Test(dram_pool, hugepages_with_shm_name_fall_back)
{
    struct dram_pool_params p = params(MiB);
    struct dram_pool *pool;
    char name[64];

    snprintf(name, sizeof(name), "umbp-test-pool-huge-%d", (int)getpid());
    p.shared = true;
    p.shm_name = name;
    p.hugepages = true;
    pool = make(&p);
    cr_assert_not(pool->hugepages);
    cr_assert(strstr(pool->warning, "dram_shm_name"), "%s", pool->warning);
    fill_and_check(pool, 6);
    dram_pool_destroy(pool);
}

Test(dram_pool, numa_node_0_binds)
{
    struct dram_pool_params p = params(2 * MiB);
    struct dram_pool *pool;
    unsigned long mask[1024 / (8 * sizeof(unsigned long))] = { 0 };
    int mode = -1;

    p.numa_node = 0;
    p.prefault = true;
    pool = make(&p);
    if (numa_available() < 0) {
        dram_pool_destroy(pool);
        cr_skip_test("no NUMA support in this kernel: nothing to bind");
    }
    cr_assert_eq(get_mempolicy(&mode, mask, 1024, pool->base, MPOL_F_ADDR), 0);
    cr_assert_eq(mode, MPOL_BIND);
    cr_assert_eq(mask[0], 1ul, "bound to node 0 only");
    cr_assert_eq(resident_pages(pool), pool->size / (size_t)sysconf(_SC_PAGESIZE));
    fill_and_check(pool, 7);
    dram_pool_destroy(pool);
}

Test(dram_pool, no_numa_node_leaves_default_policy)
{
    struct dram_pool_params p = params(MiB);
    struct dram_pool *pool = make(&p);
    unsigned long mask[1024 / (8 * sizeof(unsigned long))] = { 0 };
    int mode = -1;

    if (numa_available() >= 0) {
        cr_assert_eq(get_mempolicy(&mode, mask, 1024, pool->base, MPOL_F_ADDR), 0);
        cr_assert_eq(mode, MPOL_DEFAULT);
    }
    dram_pool_destroy(pool);
}

Test(dram_pool, numa_node_1000_fails_naming_the_option)
{
    struct dram_pool_params p = params(MiB);
    struct dram_pool *pool = NULL;
    char err[512] = "", want[64];
    int highest = numa_available() < 0 ? 0 : numa_max_node();

    p.numa_node = 1000;
    cr_assert_eq(dram_pool_create(&p, &pool, err, sizeof(err)), -EINVAL);
    cr_assert_null(pool);
    cr_assert(strstr(err, "dram_numa_node=1000"), "%s", err);
    snprintf(want, sizeof(want), "highest is %d", highest);
    cr_assert(strstr(err, want), "names the highest node: %s", err);
}

Test(dram_pool, zero_capacity_fails_naming_the_option)
{
    struct dram_pool_params p = params(0);
    struct dram_pool *pool = NULL;
    char err[512] = "";

    cr_assert_eq(dram_pool_create(&p, &pool, err, sizeof(err)), -EINVAL);
    cr_assert_null(pool);
    cr_assert(strstr(err, "capacity_bytes"), "%s", err);
}
