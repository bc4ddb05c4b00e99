/*
 * test_deadlines.c - every op ends by its deadline, control calls are never
 * starved by data ops, and a get released in flight is safe (issue 6,
 * defects b, c, e).
 *
 * A copy worker is stalled for as long as a test wants with the trap of
 * test_util.h (a get whose destination faults).  With one copy thread,
 * everything queued behind it can only finish if the runtime cuts it at its
 * deadline; the tests wait for that while the trap still holds, so they
 * fail (after the generous TU_WAIT_MS bound) if it never happens.  No test
 * asserts how long anything takes.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static umbp_runtime_t *one_worker_rt(const char *extra)
{
    return tu_create("{\"capacity_bytes\": \"16MiB\", \"copy_threads\": 1, \"timeout_ms\": 200, "
                     "\"lookup_timeout_ms\": 10000, \"log_level\": \"error\"%s}",
                     extra ? extra : "");
}

/* Stores obj and holds the single copy worker in a get of it. */
static umbp_op_t *stall_worker(umbp_runtime_t *rt, struct tu_obj *obj, umbp_range_t *rg)
{
    tu_put_ok(rt, obj, 1);
    uint8_t *trap = tu_trap_arm(obj->size);
    *rg = (umbp_range_t){trap, obj->size, 0};
    umbp_get_item_t it = {obj->key, rg, 1};
    umbp_op_t *op;
    cr_assert_eq(umbp_get(rt, &it, 1, &op), 0);
    tu_trap_wait_hit();
    return op;
}

/* Waits for op while the trap still holds the only worker. */
static void wait_while_stalled(umbp_op_t *op, const char *what)
{
    cr_assert_eq(umbp_op_wait(op, TU_WAIT_MS), 0,
                 "%s queued behind a stalled copy never completed: timeout_ms does not "
                 "bound it", what);
}

Test(deadlines, queued_get_ends_at_deadline_behind_stalled_copy)
{
    struct tu_rng r;
    tu_rng_seed(&r, tu_time_seed());
    umbp_runtime_t *rt = one_worker_rt(NULL);
    struct tu_obj big, small;
    tu_obj_init(&big, &r, tu_key_random(&r), 1 * MiB, 1, false);
    tu_obj_init(&small, &r, tu_key_random(&r), 4 * KiB, 1, false);
    tu_put_ok(rt, &small, 1);
    umbp_range_t trg;
    umbp_op_t *stalled = stall_worker(rt, &big, &trg);

    uint8_t *dst = malloc(small.size);
    tu_poison(dst, small.size);
    umbp_range_t rg = {dst, small.size, 0};
    umbp_get_item_t it = {small.key, &rg, 1};
    umbp_op_t *op;
    cr_assert_eq(umbp_get(rt, &it, 1, &op), 0);
    wait_while_stalled(op, "a 4 KiB get");
    cr_assert_eq(umbp_op_key_status(op, 0), UMBP_E_TIMEOUT, "status %s",
                 umbp_strerror(umbp_op_key_status(op, 0)));
    for (size_t i = 0; i < small.size; i++)
        cr_assert_eq(dst[i], TU_POISON, "a get cut before its copy started wrote byte %zu", i);
    umbp_op_release(op);
    umbp_stats_t s = tu_stats(rt);
    cr_assert_geq(s.ops_timed_out, 1);

    tu_trap_release();
    tu_wait(stalled);
    umbp_op_release(stalled);
    tu_trap_free();
    /* nothing stays leased, and the key still restores */
    cr_assert_eq(tu_stats(rt).num_leased, 0);
    tu_expect_obj(rt, &small);
    tu_obj_free(&big);
    tu_obj_free(&small);
    free(dst);
    tu_destroy(rt);
}

Test(deadlines, queued_put_ends_at_deadline_and_leaves_nothing)
{
    struct tu_rng r;
    tu_rng_seed(&r, tu_time_seed());
    umbp_runtime_t *rt = one_worker_rt(NULL);
    struct tu_obj big, p;
    tu_obj_init(&big, &r, tu_key_random(&r), 1 * MiB, 1, false);
    tu_obj_init(&p, &r, tu_key_random(&r), 64 * KiB, 3, false);
    umbp_range_t trg;
    umbp_op_t *stalled = stall_worker(rt, &big, &trg);

    umbp_put_item_t it = tu_obj_item(&p);
    umbp_op_t *op;
    cr_assert_eq(umbp_put(rt, &it, 1, &op), 0);
    wait_while_stalled(op, "a put");
    cr_assert_eq(umbp_op_key_status(op, 0), UMBP_E_TIMEOUT);
    umbp_op_release(op);
    umbp_stats_t s = tu_stats(rt);
    cr_assert_eq(s.num_pending, 0, "the cut put kept its reservation");
    cr_assert_eq(s.num_objects, 1);
    cr_assert_eq(tu_present(rt, p.key), 0, "a put cut before its copy became visible");

    tu_trap_release();
    tu_wait(stalled);
    umbp_op_release(stalled);
    tu_trap_free();
    tu_put_ok(rt, &p, 1); /* and it can be stored again */
    tu_expect_obj(rt, &p);
    tu_obj_free(&big);
    tu_obj_free(&p);
    tu_destroy(rt);
}

/* Every data op of the pool in flight: lookups, stats, flush and clear
 * still answer (they have their own ops). */
Test(deadlines, control_calls_while_data_ops_fill_the_pool)
{
    struct tu_rng r;
    tu_rng_seed(&r, tu_time_seed());
    umbp_runtime_t *rt = one_worker_rt(", \"max_inflight_ops\": 4, \"timeout_ms\": 600000");
    struct tu_obj big, o[3];
    tu_obj_init(&big, &r, tu_key_random(&r), 1 * MiB, 1, false);
    for (int i = 0; i < 3; i++) {
        tu_obj_init(&o[i], &r, tu_key_random(&r), 8 * KiB, 1, false);
        tu_put_ok(rt, &o[i], 1);
    }
    umbp_range_t trg;
    umbp_op_t *stalled = stall_worker(rt, &big, &trg);
    uint8_t dst[3][8 * KiB];
    umbp_range_t rg[3];
    umbp_op_t *ops[3];
    for (int i = 0; i < 3; i++) { /* queued behind the stalled worker */
        rg[i] = (umbp_range_t){dst[i], 8 * KiB, 0};
        umbp_get_item_t it = {o[i].key, &rg[i], 1};
        cr_assert_eq(umbp_get(rt, &it, 1, &ops[i]), 0);
    }
    umbp_op_t *extra;
    umbp_get_item_t it = {o[0].key, &rg[0], 1};
    cr_assert_eq(umbp_get(rt, &it, 1, &extra), -EAGAIN, "the data pool is full");
    for (int round = 0; round < 200; round++) {
        uint8_t present[3];
        umbp_key_t keys[3] = {o[0].key, o[1].key, o[2].key};
        size_t prefix = 0;
        cr_assert_eq(umbp_lookup(rt, keys, 3, present, &prefix, 0), 0, "lookup %d starved", round);
        cr_assert_eq(prefix, 3);
    }
    umbp_stats_t s;
    cr_assert_eq(umbp_get_stats(rt, &s), 0);
    cr_assert_eq(umbp_flush(rt, 10000), 0);
    tu_trap_release();
    tu_wait(stalled);
    umbp_op_release(stalled);
    for (int i = 0; i < 3; i++) {
        tu_wait(ops[i]);
        cr_assert_eq(umbp_op_key_status(ops[i], 0), 0);
        cr_assert_eq(memcmp(dst[i], o[i].data, 8 * KiB), 0);
        umbp_op_release(ops[i]);
    }
    cr_assert_eq(umbp_clear(rt), 0);
    tu_trap_free();
    tu_obj_free(&big);
    for (int i = 0; i < 3; i++)
        tu_obj_free(&o[i]);
    tu_destroy(rt);
}

/* A get whose handle is released while its copy runs: the runtime cuts it,
 * ends its leases and recycles it; nothing leaks, nothing else is touched. */
Test(deadlines, get_released_in_flight_is_recycled_safely)
{
    struct tu_rng r;
    tu_rng_seed(&r, tu_time_seed());
    umbp_runtime_t *rt = one_worker_rt(", \"timeout_ms\": 600000");
    struct tu_obj big, other;
    tu_obj_init(&big, &r, tu_key_random(&r), 8 * MiB, 1, false);
    tu_obj_init(&other, &r, tu_key_random(&r), 64 * KiB, 1, false);
    tu_put_ok(rt, &other, 1);
    umbp_range_t trg;
    umbp_op_t *stalled = stall_worker(rt, &big, &trg);
    umbp_op_release(stalled); /* in flight */
    cr_assert_eq(tu_stats(rt).num_leased, 1);
    tu_trap_release();
    /* the op is recycled once cut: the lease ends */
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (tu_stats(rt).num_leased != 0)
        cr_assert(tu_now_ms() < end, "a released get kept its lease");
    for (int i = 0; i < 20; i++) /* its op is reused by later gets */
        tu_expect_obj(rt, &other);
    tu_expect_obj(rt, &big);
    tu_trap_free();
    tu_obj_free(&big);
    tu_obj_free(&other);
    tu_destroy(rt);
}

/* A full pool and puts of more keys than one eviction slice (256) and than
 * the watermarks' gap: every key of every put lands.  The evictor freed
 * room while a put's first keys were being copied, before the put could
 * wait for room, so the put waited for a free that had already happened
 * and its last keys failed -ENOSPC after put_wait_ms (113 of 625 2 MiB
 * objects into a 4 GiB pool, every round once it was full). */
Test(space, large_puts_into_a_full_pool_all_land)
{
    umbp_runtime_t *rt = tu_create("{\"capacity_bytes\": \"64MiB\", \"put_wait_ms\": 2000, "
                                   "\"timeout_ms\": 60000, \"log_level\": \"error\"}");
    enum { N = 625, SZ = 64 * 1024 };
    uint8_t *src = malloc((size_t)N * SZ);
    cr_assert(src);
    static umbp_range_t rg[N];
    static umbp_put_item_t it[N];
    for (int round = 0; round < 8; round++) {
        for (int i = 0; i < N; i++) {
            it[i].key = tu_key_id(0x5ace, (uint64_t)round * N + (uint64_t)i);
            tu_fill_from_key(&it[i].key, 0, src + (size_t)i * SZ, SZ);
            rg[i] = (umbp_range_t){src + (size_t)i * SZ, SZ, 0};
            it[i].ranges = &rg[i];
            it[i].num_ranges = 1;
            it[i].object_size = SZ;
        }
        umbp_op_t *op;
        cr_assert_eq(umbp_put(rt, it, N, &op), 0);
        cr_assert_eq(umbp_op_wait(op, TU_WAIT_MS), 0);
        size_t failed = 0;
        int first = 0;
        for (size_t i = 0; i < N; i++)
            if (umbp_op_key_status(op, i) != 0 && failed++ == 0)
                first = umbp_op_key_status(op, i);
        cr_assert_eq(failed, 0, "round %d: %zu of %d keys failed (%s)", round, failed, N,
                     umbp_strerror(first));
        umbp_op_release(op);
    }
    free(src);
    umbp_runtime_destroy(rt);
}
