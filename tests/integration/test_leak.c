/*
 * test_leak.c - create and destroy runtimes many times, with traffic in
 * between, and check that nothing accumulates: file descriptors, threads,
 * /dev/shm entries, shared mappings and address space.  Heap leaks are
 * LeakSanitizer's job in the sanitizer build (the same test runs there).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "umbp/umbp.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static size_t count_dir(const char *path, const char *prefix)
{
    DIR *d = opendir(path);
    cr_assert_not_null(d, "cannot open %s", path);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' && (!prefix || strncmp(e->d_name, prefix, strlen(prefix)) == 0))
            n++;
    closedir(d);
    return n - (prefix ? 0 : 1); /* the DIR's own descriptor, when counting fds */
}

static size_t count_fds(void) { return count_dir("/proc/self/fd", NULL); }

/* Threads of this process.  pthread_join returns when the kernel clears the
 * thread's tid, which can be a moment before the task leaves /proc, so a
 * count above `want` is read again for up to a second (not a timed check:
 * a thread that really leaked stays). */
static size_t count_threads_raw(void);
static size_t count_threads_settled(size_t want)
{
    size_t n = count_threads_raw();
    for (int i = 0; i < 1000 && n > want; i++) {
        tu_sleep_ms(1);
        n = count_threads_raw();
    }
    return n;
}

static size_t count_threads_raw(void)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Lines of /proc/self/maps containing needle. */
static size_t count_maps(const char *needle)
{
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert_not_null(f);
    char line[1024];
    size_t n = 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static uint64_t vm_size_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    cr_assert_not_null(f);
    char line[256];
    unsigned long long v = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmSize: %llu kB", &v) == 1)
            break;
    fclose(f);
    return v;
}

static char shm_prefix[64];

/* One runtime's life: i picks the configuration. */
static void one_cycle(int i, struct tu_rng *r)
{
    char json[512];
    const char *lvl = "\"log_level\": \"error\", \"lookup_timeout_ms\": 10000";
    switch (i % 5) {
    case 0: /* a large anonymous pool, never touched beyond a few objects */
        snprintf(json, sizeof(json), "{\"capacity_bytes\": \"256MiB\", %s}", lvl);
        break;
    case 1: /* memfd */
        snprintf(json, sizeof(json),
                 "{\"capacity_bytes\": \"4MiB\", \"dram_use_shared_memory\": true, %s}", lvl);
        break;
    case 2: /* named POSIX shared memory */
        snprintf(json, sizeof(json),
                 "{\"capacity_bytes\": \"4MiB\", \"dram_use_shared_memory\": true, "
                 "\"dram_shm_name\": \"%s%d\", %s}",
                 shm_prefix, i, lvl);
        break;
    case 3: /* events, small op pool, huge pages (falling back), prefault */
        snprintf(json, sizeof(json),
                 "{\"capacity_bytes\": \"4MiB\", \"enable_events\": true, "
                 "\"event_queue_size\": 16, \"max_inflight_ops\": 8, "
                 "\"dram_use_hugepages\": true, \"dram_prefault\": true, %s}",
                 lvl);
        break;
    default: /* several copy threads, short leases */
        snprintf(json, sizeof(json),
                 "{\"capacity_bytes\": \"2MiB\", \"copy_threads\": 4, \"lease_ttl_ms\": 10, %s}",
                 lvl);
        break;
    }
    umbp_runtime_t *rt = tu_create("%s", json);
    enum { N = 8 };
    struct tu_obj o[N];
    for (int k = 0; k < N; k++)
        tu_obj_init(&o[k], r, tu_key_random(r), tu_rng_between(r, 1, 256 * KiB), 3, false);
    tu_put_ok(rt, o, N);
    for (int k = 0; k < N; k += 3)
        tu_expect_obj(rt, &o[k]);
    umbp_key_t keys[N];
    for (int k = 0; k < N; k++)
        keys[k] = o[k].key;
    size_t prefix;
    cr_assert_eq(umbp_lookup(rt, keys, N, NULL, &prefix, UMBP_LOOKUP_TOUCH), 0);
    umbp_event_t ev[8];
    umbp_events_drain(rt, ev, 8, NULL);
    if (i % 3 == 0)
        cr_assert_eq(umbp_clear(rt), 0);
    /* leave work behind: an unreleased completed op, and ops in flight */
    umbp_put_item_t it = tu_obj_item(&o[0]);
    umbp_op_t *kept;
    cr_assert_eq(umbp_put(rt, &it, 1, &kept), 0);
    tu_wait(kept);
    uint8_t *dst = malloc(256 * KiB);
    umbp_range_t rg = {dst, o[1].size, 0};
    umbp_get_item_t g = {o[1].key, &rg, 1};
    umbp_op_t *inflight_get, *inflight_put;
    cr_assert_eq(umbp_get(rt, &g, 1, &inflight_get), 0);
    umbp_put_item_t it2 = tu_obj_item(&o[2]);
    cr_assert_eq(umbp_put(rt, &it2, 1, &inflight_put), 0);
    if (i % 2)
        umbp_op_release(inflight_get);
    tu_destroy(rt);
    free(dst);
    for (int k = 0; k < N; k++)
        tu_obj_free(&o[k]);
}

Test(leak, create_destroy_200_times, .timeout = 600)
{
    struct tu_rng r;
    uint64_t seed = tu_time_seed();
    cr_log_info("seed %llu", (unsigned long long)seed);
    tu_rng_seed(&r, seed);
    snprintf(shm_prefix, sizeof(shm_prefix), "umbp-leak-%d-", (int)getpid());

    /* warm up: lazily created process state (malloc arenas, libnuma, ...) */
    for (int i = 0; i < 5; i++)
        one_cycle(i, &r);
    size_t fds0 = count_fds(), threads0 = count_threads_settled(0);
    size_t shm0 = count_dir("/dev/shm", shm_prefix);
    size_t memfd0 = count_maps("umbp-dram"), shmmap0 = count_maps(shm_prefix);
    uint64_t vm0 = vm_size_kib();
    cr_assert_eq(shm0, 0);

    for (int i = 0; i < 200; i++) {
        one_cycle(i, &r);
        /* checked every cycle too, so a leak names the configuration */
        cr_assert_eq(count_dir("/dev/shm", shm_prefix), 0, "cycle %d (config %d) left a /dev/shm "
                     "entry", i, i % 5);
        cr_assert_eq(count_fds(), fds0, "cycle %d (config %d): %zu fds, %zu before", i, i % 5,
                     count_fds(), fds0);
        size_t nt = count_threads_settled(threads0);
        cr_assert_leq(nt, threads0, "cycle %d (config %d): %zu threads, %zu before", i, i % 5,
                      nt, threads0);
    }
    cr_assert_eq(count_maps("umbp-dram"), memfd0, "memfd pools still mapped");
    cr_assert_eq(count_maps(shm_prefix), shmmap0, "named shm pools still mapped");
    uint64_t vm1 = vm_size_kib();
    cr_log_info("VmSize %llu KiB -> %llu KiB", (unsigned long long)vm0, (unsigned long long)vm1);
    /* 40 of the cycles map 256 MiB each: leaking them would add 10 GiB; the
     * allowance covers allocator arenas growing */
    cr_assert_lt(vm1, vm0 + 2 * 1024 * 1024, "address space grew from %llu to %llu KiB",
                 (unsigned long long)vm0, (unsigned long long)vm1);
}

/* A runtime that fails to create leaks nothing either. */
Test(leak, failed_creates, .timeout = 600)
{
    char name[64];
    snprintf(name, sizeof(name), "umbp-leakf-%d", (int)getpid());
    char json[256];
    snprintf(json, sizeof(json),
             "{\"capacity_bytes\": \"4MiB\", \"dram_use_shared_memory\": true, "
             "\"dram_shm_name\": \"%s\", \"log_level\": \"error\"}",
             name);
    umbp_runtime_t *holder = tu_create("%s", json);
    for (int i = 0; i < 3; i++) { /* warm up */
        umbp_runtime_t *rt;
        cr_assert_lt(umbp_runtime_create(json, &rt), 0);
    }
    size_t fds0 = count_fds(), threads0 = count_threads_settled(0);
    uint64_t vm0 = vm_size_kib();
    static const char *const bad[] = {
        NULL, /* the shm name in use: fails after the option checks */
        "{\"capacity_bytes\": \"4MiB\", \"dram_numa_node\": 1000, \"log_level\": \"error\"}",
        "{\"capacity_bytes\": \"4MiB\", \"tier\": \"nosuch\", \"log_level\": \"error\"}",
        "{\"capacity_bytes\": 1}",
        "{\"timeout_ms\": \"x\"}",
        "{",
    };
    for (int i = 0; i < 200; i++) {
        const char *j = bad[i % 6] ? bad[i % 6] : json;
        umbp_runtime_t *rt = NULL;
        cr_assert_lt(umbp_runtime_create(j, &rt), 0, "%s accepted", j);
    }
    cr_assert_eq(count_fds(), fds0);
    cr_assert_leq(count_threads_settled(threads0), threads0);
    cr_assert_lt(vm_size_kib(), vm0 + 512 * 1024);
    tu_destroy(holder);
    cr_assert_eq(count_dir("/dev/shm", name), 0);
    tu_check_leaks();
}
