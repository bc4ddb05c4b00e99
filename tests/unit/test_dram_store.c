/*
 * test_dram_store.c - the object store's persistent pools: a store that
 * ends without cleaning up (a crash, SIGKILL, an upgrade) leaves its named
 * pool and journal in /dev/shm, and the next store on the same name adopts
 * every published object byte-exact, never a pending one.
 *
 * Real processes where it matters: the writer is a child that is SIGKILLed
 * in the middle of its work.  Names are unique per test run.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "journal.h"
#include "store.h"
#include "test_util.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static char pool_name[64];

static void name_init(void)
{
    snprintf(pool_name, sizeof(pool_name), "umbp-test-store-%d-%llu", (int)getpid(),
             (unsigned long long)tu_time_seed() % 1000000);
}

static void name_cleanup(void)
{
    tu_rm_named_pool(pool_name);
}

TestSuite(dram_store, .init = name_init, .fini = name_cleanup);

static struct dram_store *open_store(uint64_t cap, int *rc_out, char *err, size_t errlen)
{
    struct dram_store_params p = {
        .pool = {.capacity = cap, .shared = true, .shm_name = pool_name,
                 .hugepage_size = 2 * MiB, .numa_node = -1, .persistent = true},
        .capacity = cap,
        .high_watermark = 0.9,
        .low_watermark = 0.7,
        .journal_slots = 1024,
    };
    struct dram_store *s = NULL;
    int rc = dram_store_create(&p, &s, err, errlen);
    if (rc_out)
        *rc_out = rc;
    return rc == 0 ? s : NULL;
}

static struct dram_store *must_open(uint64_t cap)
{
    char err[512] = "";
    int rc;
    struct dram_store *s = open_store(cap, &rc, err, sizeof(err));
    cr_assert_not_null(s, "store: %s (%d)", err, rc);
    return s;
}

static uint8_t *base_of(struct dram_store *s) { return dram_store_pool(s)->base; }

/* Object i: key from i, size from i, bytes from key (test_util). */
static uint64_t obj_size(size_t i) { return 1 + (i * 7919) % (48 * KiB); }

static void put_obj(struct dram_store *s, size_t i, bool publish)
{
    umbp_key_t k = tu_key_id(77, i);
    struct dram_store_region r;
    cr_assert_eq(dram_store_reserve(s, &k, obj_size(i), &r), 0, "reserve %zu", i);
    tu_fill_from_key(&k, 0, base_of(s) + r.offset, obj_size(i));
    if (publish)
        cr_assert_eq(dram_store_publish(s, &k, r.token), 0);
}

static void expect_obj(struct dram_store *s, size_t i)
{
    umbp_key_t k = tu_key_id(77, i);
    struct dram_store_region r;
    cr_assert_eq(dram_store_acquire(s, &k, umbp_now_ns(), 1000000000ull, &r), 0,
                 "object %zu was not adopted", i);
    cr_assert_eq(r.size, obj_size(i));
    cr_assert_eq(tu_check_from_key(&k, 0, base_of(s) + r.offset, r.size), SIZE_MAX,
              "object %zu adopted with wrong bytes", i);
    uint64_t freed = 0;
    cr_assert_eq(dram_store_release(s, r.token, &freed), 0);
}

Test(dram_store, adopts_published_objects_after_a_kill)
{
    const size_t n = 200, pending = 5;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* the server that dies */
        struct dram_store *s = must_open(16 * MiB);
        for (size_t i = 0; i < n; i++)
            put_obj(s, i, true);
        for (size_t i = n; i < n + pending; i++)
            put_obj(s, i, false); /* being written when it dies */
        kill(getpid(), SIGKILL);
        _exit(1);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);

    struct dram_store *s = must_open(16 * MiB);
    struct dram_store_adoption a;
    dram_store_adoption(s, &a);
    cr_assert(a.adopted);
    cr_assert_eq(a.objects, n);
    cr_assert_eq(a.held_pending, pending);
    cr_assert_eq(a.dropped, 0);
    for (size_t i = 0; i < n; i++)
        expect_obj(s, i);
    for (size_t i = n; i < n + pending; i++) {
        umbp_key_t k = tu_key_id(77, i);
        cr_assert(!dram_store_lookup(s, &k, false), "a pending object %zu became visible", i);
    }
    struct umbp_tier_usage u, u2;
    dram_store_usage(s, &u);
    cr_assert_eq(u.num_objects, n);
    dram_store_adopt_finish(s);
    dram_store_usage(s, &u2);
    cr_assert_lt(u2.used_bytes, u.used_bytes, "held pending regions were not freed");
    /* the LRU order survived: the first stored is evicted first */
    bool more;
    dram_store_evict(s, u2.used_bytes - 1, 0, 1, &more);
    umbp_key_t k0 = tu_key_id(77, 0), k1 = tu_key_id(77, 1);
    cr_assert(!dram_store_lookup(s, &k0, false));
    cr_assert(dram_store_lookup(s, &k1, false));
    /* it keeps working, and the next incarnation sees the new objects too */
    put_obj(s, 1000, true);
    uint64_t id = dram_store_pool_id(s);
    dram_store_destroy(s);
    s = must_open(16 * MiB);
    cr_assert_eq(dram_store_pool_id(s), id, "the pool id changed across a restart");
    expect_obj(s, 1000);
    expect_obj(s, 1);
    dram_store_destroy(s);
}

Test(dram_store, another_capacity_is_refused_naming_the_pool)
{
    struct dram_store *s = must_open(8 * MiB);
    put_obj(s, 1, true);
    dram_store_destroy(s);
    char err[512] = "";
    int rc;
    cr_assert_null(open_store(16 * MiB, &rc, err, sizeof(err)));
    cr_assert_lt(rc, 0);
    cr_assert(strstr(err, "dram_shm_name") && strstr(err, pool_name), "%s", err);
    s = must_open(8 * MiB); /* the right size still adopts */
    expect_obj(s, 1);
    dram_store_destroy(s);
}

/* A journal whose records lie (overlap, out of the pool): those are
 * dropped, the rest adopted. */
Test(dram_store, untrustworthy_records_are_dropped)
{
    struct dram_store *s = must_open(8 * MiB);
    for (size_t i = 0; i < 10; i++)
        put_obj(s, i, true);
    dram_store_destroy(s);
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm/%s.meta", pool_name);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    /* slots start after a 4 KiB header; slot layout: state, pad, off, size */
    uint64_t off = 4096 + 64 * 3 + 8, bad = 1ull << 40;
    fseek(f, (long)off, SEEK_SET);
    fwrite(&bad, 8, 1, f); /* record 3: offset outside the pool */
    fclose(f);
    s = must_open(8 * MiB);
    struct dram_store_adoption a;
    dram_store_adoption(s, &a);
    cr_assert_eq(a.dropped, 1);
    cr_assert_eq(a.objects, 9);
    for (size_t i = 0; i < 10; i++)
        if (i != 3)
            expect_obj(s, i);
    dram_store_destroy(s);
}

/* ---- namespaces and quotas ------------------------------------------------ */

static struct dram_store *plain_store(uint64_t cap)
{
    struct dram_store_params p = {
        .pool = {.capacity = cap, .hugepage_size = 2 * MiB, .numa_node = -1},
        .capacity = cap, .high_watermark = 0.9, .low_watermark = 0.7,
    };
    struct dram_store *s;
    char err[256];
    cr_assert_eq(dram_store_create(&p, &s, err, sizeof(err)), 0, "%s", err);
    return s;
}

static void put_ns(struct dram_store *s, unsigned ns, uint64_t id, uint64_t size, int want)
{
    umbp_key_t k = tu_key_id(ns, id);
    struct dram_store_region r;
    int rc = dram_store_reserve_ns(s, &k, size, ns, &r);
    cr_assert_eq(rc, want, "ns %u object %llu: %d", ns, (unsigned long long)id, rc);
    if (rc == 0)
        cr_assert_eq(dram_store_publish(s, &k, r.token), 0);
}

static bool has(struct dram_store *s, unsigned ns, uint64_t id)
{
    umbp_key_t k = tu_key_id(ns, id);
    return dram_store_lookup(s, &k, false);
}

Test(dram_store, a_tenant_over_its_quota_evicts_only_its_own)
{
    struct dram_store *s = plain_store(8 * MiB);
    cr_assert_eq(dram_store_set_quota(s, 1, 1 * MiB), 0);
    cr_assert_eq(dram_store_set_quota(s, 2, 1 * MiB), 0);
    cr_assert_eq(dram_store_set_quota(s, DRAM_STORE_MAX_NS, 1), -EINVAL);
    for (uint64_t i = 0; i < 16; i++)
        put_ns(s, 1, i, 64 * KiB, 0);
    for (uint64_t i = 0; i < 8; i++)
        put_ns(s, 2, i, 64 * KiB, 0);
    for (uint64_t i = 0; i < 20; i++)
        put_ns(s, 0, i, 64 * KiB, 0); /* the default namespace has no quota */
    for (uint64_t i = 16; i < 20; i++) /* tenant 1 writes on past its quota */
        put_ns(s, 1, i, 64 * KiB, 0);
    struct dram_store_ns_usage u1, u2;
    dram_store_ns_usage(s, 1, &u1);
    dram_store_ns_usage(s, 2, &u2);
    cr_assert_eq(u1.used_bytes, 1 * MiB);
    cr_assert_eq(u1.objects, 16);
    cr_assert_eq(u1.evictions, 4);
    for (uint64_t i = 0; i < 4; i++)
        cr_assert(!has(s, 1, i), "tenant 1's oldest object %llu survived", (unsigned long long)i);
    for (uint64_t i = 4; i < 20; i++)
        cr_assert(has(s, 1, i));
    for (uint64_t i = 0; i < 8; i++)
        cr_assert(has(s, 2, i), "tenant 2 lost object %llu to tenant 1", (unsigned long long)i);
    for (uint64_t i = 0; i < 20; i++)
        cr_assert(has(s, 0, i), "the default namespace lost object %llu", (unsigned long long)i);
    cr_assert_eq(u2.evictions, 0);
    put_ns(s, 2, 100, 2 * MiB, -EDQUOT); /* larger than the whole quota */
    dram_store_destroy(s);
}

Test(dram_store, a_quota_held_by_leases_refuses_with_edquot)
{
    struct dram_store *s = plain_store(8 * MiB);
    dram_store_set_quota(s, 3, 256 * KiB);
    struct dram_store_region r[4];
    for (uint64_t i = 0; i < 4; i++) {
        put_ns(s, 3, i, 64 * KiB, 0);
        umbp_key_t k = tu_key_id(3, i);
        cr_assert_eq(dram_store_acquire(s, &k, umbp_now_ns(), 1000000000ull, &r[i]), 0);
    }
    put_ns(s, 3, 9, 64 * KiB, -EDQUOT);
    uint64_t freed = 0;
    cr_assert_eq(dram_store_release(s, r[0].token, &freed), 0);
    put_ns(s, 3, 9, 64 * KiB, 0); /* object 0 is no longer leased: it goes */
    cr_assert(!has(s, 3, 0));
    for (uint64_t i = 1; i < 4; i++)
        cr_assert_eq(dram_store_release(s, r[i].token, &freed), 0);
    dram_store_destroy(s);
}

/* Reservations made ahead of their keys (a client's spares) hold at most
 * 1/8 of a namespace's quota: beyond it -EDQUOT before anything is
 * evicted, so a tenant whose quota is small next to the spares a worker
 * asks for keeps its cache (with no share, each spare evicted one of its
 * objects).  A published spare no longer counts; an aborted one frees its
 * share; ordinary reservations are not limited by it. */
Test(dram_store, spares_hold_at_most_an_eighth_of_a_quota)
{
    struct dram_store *s = plain_store(8 * MiB);
    dram_store_set_quota(s, 1, 1 * MiB);
    for (uint64_t i = 0; i < 16; i++) /* the quota full of the tenant's cache */
        put_ns(s, 1, i, 64 * KiB, 0);
    uint64_t until = umbp_now_ns() + 60000000000ull;
    struct dram_store_region r[3];
    umbp_key_t sp[3];
    for (uint64_t i = 0; i < 3; i++) {
        sp[i] = tu_key_id(0xa4ead, i);
        int want = i < 2 ? 0 : -EDQUOT; /* 128 KiB: two of 64 KiB */
        cr_assert_eq(dram_store_reserve_until(s, &sp[i], 64 * KiB, 1, until, true, &r[i]), want,
                     "spare %llu", (unsigned long long)i);
    }
    struct dram_store_ns_usage u;
    dram_store_ns_usage(s, 1, &u);
    cr_assert_eq(u.evictions, 2, "the spares evicted %llu objects, want 2",
                 (unsigned long long)u.evictions);
    for (uint64_t i = 2; i < 16; i++)
        cr_assert(has(s, 1, i), "object %llu evicted for a spare", (unsigned long long)i);
    umbp_key_t k = tu_key_id(1, 100);
    cr_assert_eq(dram_store_publish_as(s, &sp[0], r[0].token, &k), 0);
    dram_store_abort(s, &sp[1], r[1].token);
    for (uint64_t i = 3; i < 5; i++) { /* the share is free again */
        sp[2] = tu_key_id(0xa4ead, i);
        cr_assert_eq(dram_store_reserve_until(s, &sp[2], 64 * KiB, 1, until, true, &r[2]), 0,
                     "spare %llu after a publish and an abort", (unsigned long long)i);
    }
    put_ns(s, 1, 200, 512 * KiB, 0); /* an ordinary put: its own room */
    dram_store_destroy(s);
}

/* The index, the lease table and the records of objects and allocator
 * blocks are made at creation at the size a full pool of KV objects needs
 * (one per 64 KiB): filling a pool with the objects it expects and leasing
 * 4,096 of them at once grows none of them (growing rehashed the index, reallocated the
 * leases, or faulted in new heap pages, on the loop thread while a store or
 * restore waited: docs/benchmarks.md). */
Test(dram_store, tables_start_at_the_size_a_full_pool_needs)
{
    struct dram_store *s = plain_store(256 * MiB); /* 4,096 objects of 64 KiB */
    enum { N = 4096 };
    struct dram_store_tables t0, t1;
    dram_store_tables(s, &t0);
    cr_assert_geq(t0.lease_slots, N, "lease table of %zu slots", t0.lease_slots);
    cr_assert_geq(t0.object_records, N, "%zu object records", t0.object_records);
    cr_assert_geq(t0.block_records, N + 1, "%zu block records", t0.block_records);
    static struct dram_store_region r[N];
    for (uint64_t i = 0; i < N; i++) {
        umbp_key_t k = tu_key_id(5, i);
        cr_assert_eq(dram_store_reserve(s, &k, 64 * KiB, &r[i]), 0, "reserve %llu",
                     (unsigned long long)i);
        cr_assert_eq(dram_store_publish(s, &k, r[i].token), 0);
    }
    for (uint64_t i = 0; i < N; i++) {
        umbp_key_t k = tu_key_id(5, i);
        cr_assert_eq(dram_store_acquire(s, &k, umbp_now_ns(), 1000000000ull, &r[i]), 0);
    }
    dram_store_tables(s, &t1);
    cr_assert_eq(t1.index_slots, t0.index_slots, "the index grew from %zu to %zu slots",
                 t0.index_slots, t1.index_slots);
    cr_assert_eq(t1.lease_slots, t0.lease_slots, "the lease table grew from %zu to %zu slots",
                 t0.lease_slots, t1.lease_slots);
    cr_assert_eq(t1.object_records, t0.object_records, "object records grew from %zu to %zu",
                 t0.object_records, t1.object_records);
    cr_assert_eq(t1.block_records, t0.block_records, "block records grew from %zu to %zu",
                 t0.block_records, t1.block_records);
    uint64_t freed = 0;
    for (uint64_t i = 0; i < N; i++)
        cr_assert_eq(dram_store_release(s, r[i].token, &freed), 0);
    dram_store_destroy(s);
}

/* A reservation made with a writer deadline: orphaned, its key is free at
 * once and its region is not handed out before the deadline, in this
 * store and in the next one that adopts the pool (the journal's hold
 * time); a reservation nobody finishes is reclaimed at its deadline. */
Test(dram_store, writer_deadlines_hold_regions_across_an_adoption)
{
    struct dram_store *s = must_open(1 * MiB);
    uint64_t now = umbp_now_ns(), until = now + 3000000000ull; /* 3 s */
    umbp_key_t k = tu_key_id(91, 1), k2 = tu_key_id(91, 2);
    struct dram_store_region r, r2, again;
    cr_assert_eq(dram_store_reserve_until(s, &k, 512 * KiB, 0, until, false, &r), 0);
    cr_assert_eq(dram_store_reserve_until(s, &k2, 256 * KiB, 0, until, false, &r2), 0);
    cr_assert_eq(dram_store_next_writer_deadline(s), until);
    cr_assert_eq(dram_store_orphan(s, &k, r.token, now), 0, "freed before its deadline");
    uint64_t held, expired;
    dram_store_writer_counts(s, &held, &expired);
    cr_assert_eq(held, 1);
    /* the key may be stored again, not in the held region */
    cr_assert_eq(dram_store_reserve(s, &k, 128 * KiB, &again), 0);
    cr_assert(again.offset >= r.offset + r.size || again.offset + again.size <= r.offset);
    dram_store_abort(s, &k, again.token);
    cr_assert_eq(dram_store_expire_writers(s, until - 1), 0);
    dram_store_destroy(s); /* k held, k2 pending: both in the journal */

    s = must_open(1 * MiB);
    struct dram_store_adoption a;
    dram_store_adoption(s, &a);
    cr_assert_eq(a.held_pending, 2);
    /* both regions out of use: a reserve of everything else fits, one
     * byte more does not */
    struct umbp_tier_usage u;
    dram_store_usage(s, &u);
    cr_assert_geq(u.used_bytes, 768 * KiB);
    /* until the hold time (whole seconds, rounded up) nothing comes back */
    cr_assert_eq(dram_store_expire_writers(s, until - 1), 0);
    cr_assert_eq(dram_store_expire_writers(s, until + 1000000000ull), 2);
    dram_store_usage(s, &u);
    cr_assert_eq(u.used_bytes, 0, "held regions were not freed at their deadline");
    /* a live reservation nobody finishes: reclaimed, its publish refused */
    now = umbp_now_ns();
    cr_assert_eq(dram_store_reserve_until(s, &k2, 4096, 0, now + 1000, false, &r2), 0);
    cr_assert_eq(dram_store_expire_writers(s, now + 2000), 1);
    dram_store_writer_counts(s, &held, &expired);
    cr_assert_eq(expired, 1);
    cr_assert_eq(dram_store_publish(s, &k2, r2.token), -ENOENT);
    dram_store_destroy(s);
}

/* A reservation made under a placeholder key and published as another key
 * (dram_store_publish_as, the server's PUBLISH_AS): the object is the new
 * key's, bytes and all, in the store and in the journal (a restarted store
 * adopts it under the new key, never under the placeholder); a key already
 * present makes it UMBP_TIER_EXISTS and frees the placeholder's region; a
 * wrong token or placeholder is -ENOENT and changes nothing. */
Test(dram_store, publish_as_renames_in_the_store_and_the_journal)
{
    struct dram_store *s = must_open(8 * MiB);
    umbp_key_t ph = tu_key_id(0xa4ead, 1), ph2 = tu_key_id(0xa4ead, 2);
    umbp_key_t k = tu_key_id(77, 5), dup = tu_key_id(77, 6);
    struct dram_store_region r, r2;
    cr_assert_eq(dram_store_reserve_until(s, &ph, obj_size(5), 0, umbp_now_ns() + 60000000000ull,
                                          true, &r), 0);
    tu_fill_from_key(&k, 0, base_of(s) + r.offset, obj_size(5));
    cr_assert_eq(dram_store_publish_as(s, &ph, r.token + 1, &k), -ENOENT, "a wrong token");
    cr_assert_eq(dram_store_publish_as(s, &ph2, r.token, &k), -ENOENT, "a wrong placeholder");
    cr_assert(!dram_store_lookup(s, &k, false));
    cr_assert_eq(dram_store_publish_as(s, &ph, r.token, &k), 0);
    cr_assert(dram_store_lookup(s, &k, false));
    cr_assert(!dram_store_lookup(s, &ph, false), "the placeholder is visible");
    cr_assert_eq(dram_store_publish(s, &ph, r.token), -ENOENT, "published twice");
    expect_obj(s, 5);

    put_obj(s, 6, true);
    struct umbp_tier_usage u0, u1;
    dram_store_usage(s, &u0);
    cr_assert_eq(dram_store_reserve(s, &ph2, obj_size(6), &r2), 0);
    memset(base_of(s) + r2.offset, 0x5a, obj_size(6)); /* the second writer's bytes */
    cr_assert_eq(dram_store_publish_as(s, &ph2, r2.token, &dup), UMBP_TIER_EXISTS);
    dram_store_usage(s, &u1);
    cr_assert_eq(u1.used_bytes, u0.used_bytes, "the repeat's region was not freed");
    cr_assert_eq(u1.num_pending, 0);
    cr_assert_eq(u1.num_objects, 2);
    expect_obj(s, 6);

    dram_store_destroy(s); /* as a killed server leaves it: the journal stays */
    s = must_open(8 * MiB);
    struct dram_store_adoption a;
    dram_store_adoption(s, &a);
    cr_assert_eq(a.objects, 2);
    expect_obj(s, 5);
    cr_assert(!dram_store_lookup(s, &ph, false), "adopted under the placeholder");
    dram_store_destroy(s);
}

/* ---- named pools: what an adopter must not trust --------------------------- */

static struct dram_store *open_slots(uint64_t cap, uint32_t slots)
{
    struct dram_store_params p = {
        .pool = {.capacity = cap, .shared = true, .shm_name = pool_name,
                 .hugepage_size = 2 * MiB, .numa_node = -1, .persistent = true},
        .capacity = cap, .high_watermark = 0.9, .low_watermark = 0.7, .journal_slots = slots,
    };
    struct dram_store *s = NULL;
    char err[512] = "";
    int rc = dram_store_create(&p, &s, err, sizeof(err));
    cr_assert_eq(rc, 0, "store: %s (%d)", err, rc);
    return s;
}

static void unlink_part(const char *suffix)
{
    char p[96];
    snprintf(p, sizeof(p), "/%s%s", pool_name, suffix);
    shm_unlink(p);
}

/* An operator removed the pool file and kept its journal: the new (zeroed)
 * pool is another pool.  Clients still mapping the old, unlinked file know
 * it only by the id changing; the same id made them keep writing and reading
 * the old file while new clients used the new one (wrong bytes, status 0). */
Test(dram_store, a_pool_file_made_anew_under_its_journal_is_another_pool)
{
    struct dram_store *s = must_open(16 * MiB);
    for (size_t i = 0; i < 3; i++)
        put_obj(s, i, true);
    uint64_t id = dram_store_pool_id(s);
    dram_store_destroy(s); /* a named pool stays, as after a kill */
    unlink_part("");       /* the pool only; <name>.meta stays */
    s = must_open(16 * MiB);
    struct dram_store_adoption a;
    dram_store_adoption(s, &a);
    cr_assert(!a.adopted, "a pool made anew was reported adopted");
    cr_assert_neq(dram_store_pool_id(s), id, "a pool made anew kept the old pool's id");
    for (size_t i = 0; i < 3; i++) {
        umbp_key_t k = tu_key_id(77, i);
        cr_assert(!dram_store_lookup(s, &k, false), "object %zu of the old pool is listed", i);
    }
    /* the table now describes the new file: the next restart adopts it */
    put_obj(s, 10, true);
    uint64_t id2 = dram_store_pool_id(s);
    dram_store_destroy(s);
    s = must_open(16 * MiB);
    dram_store_adoption(s, &a);
    cr_assert(a.adopted);
    cr_assert_eq(dram_store_pool_id(s), id2);
    expect_obj(s, 10);
    dram_store_destroy(s);
}

/* An object removed (a reset, a newer copy's eviction of it) while a reader
 * still copies it must not come back after a kill: its journal record goes
 * at the removal, not when the last reader ends. */
Test(dram_store, an_object_removed_while_read_is_not_adopted)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct dram_store *s = must_open(16 * MiB);
        put_obj(s, 0, true);
        umbp_key_t k = tu_key_id(77, 0);
        struct dram_store_region r;
        if (dram_store_acquire(s, &k, umbp_now_ns(), 60000000000ull, &r) != 0)
            _exit(2);
        dram_store_clear(s); /* a reset while the lease is held */
        if (dram_store_lookup(s, &k, false))
            _exit(3);
        put_obj(s, 1, true); /* stored after the reset: kept */
        kill(getpid(), SIGKILL);
        _exit(1);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child failed: status %d", st);
    struct dram_store *s = must_open(16 * MiB);
    umbp_key_t k0 = tu_key_id(77, 0);
    cr_assert(!dram_store_lookup(s, &k0, false),
              "an object removed before the kill came back with the restart");
    expect_obj(s, 1);
    dram_store_destroy(s);
}

/* Reservations past the journal's records are not kept across a restart,
 * and while their writers may write, an adopter hands out nothing; once
 * they are published, that hold is over.  It stayed, freezing every put of
 * the next server for the writers' whole deadline. */
Test(dram_store, a_full_journal_freezes_no_restart_after_its_writers_finished)
{
    enum { SLOTS = 8, N = 12 };
    struct dram_store *s = open_slots(16 * MiB, SLOTS);
    uint64_t until = umbp_now_ns() + 60000000000ull;
    for (size_t i = 0; i < N; i++) {
        umbp_key_t k = tu_key_id(77, i);
        struct dram_store_region r;
        cr_assert_eq(dram_store_reserve_until(s, &k, obj_size(i), 0, until, false, &r), 0);
        tu_fill_from_key(&k, 0, base_of(s) + r.offset, obj_size(i));
        cr_assert_eq(dram_store_publish(s, &k, r.token), 0);
    }
    dram_store_destroy(s);
    s = open_slots(16 * MiB, SLOTS);
    struct dram_store_adoption a;
    dram_store_adoption(s, &a);
    cr_assert(a.adopted);
    cr_assert_eq(a.objects, SLOTS, "the objects with a record are adopted");
    umbp_key_t k = tu_key_id(78, 0);
    struct dram_store_region r;
    int rc = dram_store_reserve(s, &k, 4096, &r);
    cr_assert_eq(rc, 0, "a restart after every writer finished refuses reservations: %d", rc);
    dram_store_destroy(s);

    /* a writer still writing when the owner dies: the adopter waits for it */
    s = open_slots(16 * MiB, SLOTS);
    for (size_t i = 0; i < SLOTS; i++) { /* every record in use */
        umbp_key_t kk = tu_key_id(79, i);
        cr_assert_eq(dram_store_reserve(s, &kk, 4096, &r), 0);
        cr_assert_eq(dram_store_publish(s, &kk, r.token), 0);
    }
    umbp_key_t late = tu_key_id(80, 0);
    cr_assert_eq(dram_store_reserve_until(s, &late, 4096, 0, umbp_now_ns() + 60000000000ull,
                                          false, &r), 0);
    dram_store_destroy(s);
    s = open_slots(16 * MiB, SLOTS);
    k = tu_key_id(78, 1);
    cr_assert_eq(dram_store_reserve(s, &k, 4096, &r), -ENOSPC,
                 "an adopter handed out space while a writer without a record may write");
    dram_store_destroy(s);
}

/* A server killed while creating its pool leaves a journal of no bytes, or
 * one sized without its header, or a pool file of no bytes; the next start
 * refused them ("not the journal of a pool of this size", "holds a pool of 0
 * bytes") and a supervisor restarted it in a loop. */
Test(dram_store, files_left_by_a_creator_killed_before_sizing_them_are_made_anew)
{
    char p[96];
    for (int round = 0; round < 3; round++) {
        name_cleanup();
        snprintf(p, sizeof(p), "/%s%s", pool_name, round == 2 ? "" : ".meta");
        int fd = shm_open(p, O_CREAT | O_EXCL | O_RDWR, 0600);
        cr_assert_geq(fd, 0);
        if (round == 1) /* sized, no header yet */
            cr_assert_eq(ftruncate(fd, 4096 + 1024 * 64), 0);
        close(fd);
        char err[512] = "";
        int rc;
        struct dram_store *s = open_store(16 * MiB, &rc, err, sizeof(err));
        cr_assert_not_null(s, "round %d: refused: %s (%d)", round, err, rc);
        put_obj(s, 5, true);
        dram_store_destroy(s);
        s = must_open(16 * MiB);
        expect_obj(s, 5);
        dram_store_destroy(s);
    }
}

/* An embedded runtime's named pool (not persistent) is its own: a server
 * started on that name adopted it and allocated over its live objects. */
Test(dram_store, a_live_runtimes_named_pool_is_not_adopted)
{
    struct dram_pool_params pp = {.capacity = 16 * MiB, .shared = true, .shm_name = pool_name,
                                  .hugepage_size = 2 * MiB, .numa_node = -1,
                                  .persistent = false};
    struct dram_pool *pool = NULL;
    char err[512] = "";
    cr_assert_eq(dram_pool_create(&pp, &pool, err, sizeof(err)), 0, "%s", err);
    int rc;
    struct dram_store *s = open_store(16 * MiB, &rc, err, sizeof(err));
    cr_assert_null(s, "a server's store adopted a pool a live runtime owns");
    cr_assert_eq(rc, -EBUSY, "%d: %s", rc, err);
    cr_assert(strstr(err, "dram_shm_name") && strstr(err, "in use by a live process"),
              "the refusal does not say why: %s", err);
    dram_pool_destroy(pool);
    /* gone with its owner: a server may now create the name */
    s = must_open(16 * MiB);
    dram_store_destroy(s);
}

/* ---- namespaces of a named pool ---------------------------------------------- */

/* An owner's numbering of namespace names (a server's: quota entries first,
 * then names as they come), as the store's callbacks see it. */
struct numbering {
    char name[8][64];
    unsigned n;
};

static const char *nb_name(void *ctx, unsigned ns)
{
    struct numbering *t = ctx;
    return ns < t->n ? t->name[ns] : NULL;
}

static unsigned nb_of_name(void *ctx, const char *name)
{
    struct numbering *t = ctx;
    for (unsigned i = 1; i < t->n; i++)
        if (strcmp(t->name[i], name) == 0)
            return i;
    if (t->n == 8)
        return 0;
    snprintf(t->name[t->n], sizeof(t->name[0]), "%s", name);
    return t->n++;
}

static unsigned nb_id(struct numbering *t, const char *name) { return nb_of_name(t, name); }

static struct dram_store *open_numbered(struct numbering *t)
{
    struct dram_store_params p = {
        .pool = {.capacity = 8 * MiB, .shared = true, .shm_name = pool_name,
                 .hugepage_size = 2 * MiB, .numa_node = -1, .persistent = true},
        .capacity = 8 * MiB, .high_watermark = 0.9, .low_watermark = 0.7,
        .journal_slots = 1024, .ns_name = nb_name, .ns_of_name = nb_of_name, .ctx = t,
    };
    struct dram_store *s = NULL;
    char err[512] = "";
    int rc = dram_store_create(&p, &s, err, sizeof(err));
    cr_assert_eq(rc, 0, "store: %s (%d)", err, rc);
    return s;
}

/* Object `id` of tenant `tag` (keys are the tenant's, whatever its number). */
static void put_tagged(struct dram_store *s, unsigned ns, unsigned tag, uint64_t id,
                       bool publish)
{
    umbp_key_t k = tu_key_id(0x7a9000 + tag, id);
    struct dram_store_region r;
    cr_assert_eq(dram_store_reserve_ns(s, &k, 64 * KiB, ns, &r), 0, "tag %u object %llu", tag,
                 (unsigned long long)id);
    if (publish)
        cr_assert_eq(dram_store_publish(s, &k, r.token), 0);
}

static bool has_tagged(struct dram_store *s, unsigned tag, uint64_t id)
{
    umbp_key_t k = tu_key_id(0x7a9000 + tag, id);
    return dram_store_lookup(s, &k, false);
}

static struct dram_store_ns_usage ns_use(struct dram_store *s, unsigned ns)
{
    struct dram_store_ns_usage u;
    dram_store_ns_usage(s, ns, &u);
    return u;
}

/* Adopted objects count in the namespace that stored them, found by name:
 * the next owner numbers its namespaces otherwise (another quota first,
 * tenants arriving in another order); a quota over an adopted namespace
 * evicts that namespace's own oldest objects. */
Test(dram_store, adopted_objects_keep_their_namespace_by_name)
{
    struct numbering t1 = {.n = 1};
    unsigned a1 = nb_id(&t1, "a"), b1 = nb_id(&t1, "b");
    struct dram_store *s = open_numbered(&t1);
    for (uint64_t i = 0; i < 6; i++)
        put_tagged(s, a1, 'a', i, true);
    for (uint64_t i = 0; i < 3; i++)
        put_tagged(s, b1, 'b', i, true);
    put_tagged(s, 0, 0, 0, true);
    put_tagged(s, a1, 'a', 100, false); /* being written at the "kill" */
    dram_store_destroy(s);

    struct numbering t2 = {.n = 1};
    unsigned b2 = nb_id(&t2, "b"), c2 = nb_id(&t2, "c");
    s = open_numbered(&t2);
    unsigned a2 = nb_id(&t2, "a");
    cr_assert(a2 != a1 && b2 != b1 && c2, "the test needs another numbering");
    struct dram_store_adoption ad;
    dram_store_adoption(s, &ad);
    cr_assert_eq(ad.objects, 10);
    cr_assert_eq(ad.held_pending, 1);
    cr_assert_eq(ad.unnamed, 0);
    cr_assert_eq(ns_use(s, a2).objects, 6, "a: %llu objects",
                 (unsigned long long)ns_use(s, a2).objects);
    cr_assert_eq(ns_use(s, a2).used_bytes, 7 * 64 * KiB, "a's held region is a's");
    cr_assert_eq(ns_use(s, b2).objects, 3);
    cr_assert_eq(ns_use(s, b2).used_bytes, 3 * 64 * KiB);
    cr_assert_eq(ns_use(s, 0).objects, 1);
    cr_assert_eq(ns_use(s, 0).used_bytes, 64 * KiB);
    cr_assert_eq(ns_use(s, c2).used_bytes, 0);
    /* a quota below what a holds: its next store evicts a's oldest, no one
     * else's (the held region counts until its writer's grace ends) */
    dram_store_adopt_finish(s);
    cr_assert_eq(dram_store_set_quota(s, a2, 4 * 64 * KiB), 0);
    put_tagged(s, a2, 'a', 6, true);
    cr_assert_eq(ns_use(s, a2).used_bytes, 4 * 64 * KiB);
    cr_assert_eq(ns_use(s, a2).evictions, 3);
    for (uint64_t i = 0; i < 3; i++)
        cr_assert(!has_tagged(s, 'a', i), "a's oldest object %llu survived",
                  (unsigned long long)i);
    for (uint64_t i = 3; i < 7; i++)
        cr_assert(has_tagged(s, 'a', i));
    for (uint64_t i = 0; i < 3; i++)
        cr_assert(has_tagged(s, 'b', i), "b lost object %llu to a", (unsigned long long)i);
    cr_assert(has_tagged(s, 0, 0));
    put_tagged(s, c2, 'c', 0, true); /* a name new to the pool */
    dram_store_destroy(s);

    /* the names stay the pool's: a third owner, a third numbering */
    struct numbering t3 = {.n = 1};
    unsigned x3 = nb_id(&t3, "x");
    s = open_numbered(&t3);
    unsigned a3 = nb_id(&t3, "a"), b3 = nb_id(&t3, "b"), c3 = nb_id(&t3, "c");
    cr_assert(x3 && a3 != a2);
    cr_assert_eq(ns_use(s, a3).objects, 4);
    cr_assert_eq(ns_use(s, b3).objects, 3);
    cr_assert_eq(ns_use(s, c3).objects, 1);
    cr_assert_eq(ns_use(s, x3).objects, 0);
    cr_assert_eq(ns_use(s, 0).objects, 1);
    dram_store_destroy(s);
}

static void write_part(const char *suffix, long off, const void *p, size_t len)
{
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm/%s%s", pool_name, suffix);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fseek(f, off, SEEK_SET), 0);
    cr_assert_eq(fwrite(p, 1, len, f), len);
    fclose(f);
}

/* <name>.ns is read from outside: what cannot be read counts in the default
 * namespace, and the numbers its records carry are never given to another
 * name (that would hand a's objects to whoever comes next). */
Test(dram_store, an_unreadable_namespace_table_counts_in_the_default_namespace)
{
    struct numbering t1 = {.n = 1};
    unsigned a1 = nb_id(&t1, "a"), b1 = nb_id(&t1, "b");
    struct dram_store *s = open_numbered(&t1);
    for (uint64_t i = 0; i < 4; i++)
        put_tagged(s, a1, 'a', i, true);
    for (uint64_t i = 0; i < 2; i++)
        put_tagged(s, b1, 'b', i, true);
    dram_store_destroy(s);
    /* b's entry (number 2 in this pool's table) loses its terminating NUL */
    char junk[64];
    memset(junk, 'z', sizeof(junk));
    write_part(".ns", 2 * 64, junk, sizeof(junk));
    struct numbering t2 = {.n = 1};
    s = open_numbered(&t2);
    unsigned a2 = nb_id(&t2, "a");
    struct dram_store_adoption ad;
    dram_store_adoption(s, &ad);
    cr_assert_eq(ad.objects, 6);
    cr_assert_eq(ad.unnamed, 2);
    cr_assert_eq(ns_use(s, a2).objects, 4);
    cr_assert_eq(ns_use(s, 0).objects, 2, "b's objects are not in the default namespace");
    dram_store_destroy(s);

    /* a header of garbage: nothing is named */
    write_part(".ns", 0, junk, 8);
    struct numbering t3 = {.n = 1};
    s = open_numbered(&t3);
    dram_store_adoption(s, &ad);
    cr_assert_eq(ad.objects, 6);
    cr_assert_eq(ad.unnamed, 6);
    cr_assert_eq(ns_use(s, 0).objects, 6);
    /* a new name takes a number no record carries */
    unsigned d3 = nb_id(&t3, "d");
    put_tagged(s, d3, 'd', 0, true);
    dram_store_destroy(s);
    struct numbering t4 = {.n = 1};
    s = open_numbered(&t4);
    unsigned d4 = nb_id(&t4, "d");
    cr_assert_eq(ns_use(s, d4).objects, 1);
    cr_assert_eq(ns_use(s, 0).objects, 6, "d got the number of old records");
    dram_store_destroy(s);

    /* no table at all (removed): the default namespace */
    unlink_part(".ns");
    struct numbering t5 = {.n = 1};
    s = open_numbered(&t5);
    cr_assert_eq(ns_use(s, 0).objects, 7);
    dram_store_destroy(s);
}

/* Tables written before namespaces were recorded (version 1, 0 in the oid's
 * top bits) are adopted, in the default namespace, and become version 2. */
Test(dram_store, a_version_1_journal_is_adopted_in_the_default_namespace)
{
    struct dram_store *s = must_open(8 * MiB);
    for (size_t i = 0; i < 3; i++)
        put_obj(s, i, true);
    dram_store_destroy(s);
    uint32_t v = 1;
    write_part(".meta", 8, &v, sizeof(v)); /* magic (8), then the version */
    struct numbering t = {.n = 1};
    unsigned a = nb_id(&t, "a");
    s = open_numbered(&t);
    struct dram_store_adoption ad;
    dram_store_adoption(s, &ad);
    cr_assert(ad.adopted);
    cr_assert_eq(ad.objects, 3);
    cr_assert_eq(ns_use(s, 0).objects, 3);
    for (size_t i = 0; i < 3; i++)
        expect_obj(s, i);
    put_tagged(s, a, 'a', 0, true);
    dram_store_destroy(s);
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm/%s.meta", pool_name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, 8, SEEK_SET), 0);
    cr_assert_eq(fread(&v, sizeof(v), 1, f), 1);
    fclose(f);
    cr_assert_eq(v, 2, "the table is still version %u", v);
    s = open_numbered(&t);
    cr_assert_eq(ns_use(s, a).objects, 1);
    cr_assert_eq(ns_use(s, 0).objects, 3);
    dram_store_destroy(s);
}

/* The decoder of <name>.ns, byte by byte. */
Test(dram_store, the_namespace_table_decoder_reads_only_what_is_sound)
{
    enum { E = DRAM_JOURNAL_NS_BYTES, MAX = 6 };
    uint8_t buf[8 * E];
    char names[MAX][DRAM_JOURNAL_NS_BYTES];
    memset(buf, 0, sizeof(buf));
    uint64_t magic = 0x424154534e504d55ull, pool = 0x1234;
    uint32_t ver = 1, es = E;
    memcpy(buf, &magic, 8);
    memcpy(buf + 8, &ver, 4);
    memcpy(buf + 12, &es, 4);
    memcpy(buf + 16, &pool, 8);
    strcpy((char *)buf + 1 * E, "a");
    memset(buf + 2 * E, 'x', E);                 /* not terminated */
    strcpy((char *)buf + 3 * E, "c");
    buf[3 * E + 10] = 1;                         /* a byte after its NUL */
    /* 4: unused */
    strcpy((char *)buf + 5 * E, "tenant five");
    strcpy((char *)buf + 6 * E, "past max");     /* number 6 >= MAX */
    cr_assert_eq(dram_journal_ns_parse(buf, 7 * E, pool, names, MAX), 3);
    cr_assert_str_eq(names[1], "a");
    cr_assert_str_eq(names[2], "");
    cr_assert_str_eq(names[3], "");
    cr_assert_str_eq(names[4], "");
    cr_assert_str_eq(names[5], "tenant five");
    /* a torn last entry, even a terminated one */
    cr_assert_eq(dram_journal_ns_parse(buf, 5 * E + 20, pool, names, MAX), 3);
    cr_assert_str_eq(names[1], "a");
    cr_assert_str_eq(names[5], "");
    /* not this pool's, not a table, too short */
    cr_assert_eq(dram_journal_ns_parse(buf, 7 * E, pool + 1, names, MAX), -1);
    cr_assert_str_eq(names[1], "");
    cr_assert_eq(dram_journal_ns_parse(buf, E - 1, pool, names, MAX), -1);
    buf[0] ^= 1;
    cr_assert_eq(dram_journal_ns_parse(buf, 7 * E, pool, names, MAX), -1);
    buf[0] ^= 1;
    cr_assert_eq(dram_journal_ns_parse(buf, E, pool, names, MAX), 0, "a header alone");
}
