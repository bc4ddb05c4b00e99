/*
 * test_api_badinput.c - every public function given bad arguments returns its
 * specific error and changes nothing; back-pressure; destroy with work still
 * in flight.
 *
 * Leaks (of op handles, of in-flight ops at destroy) are caught by
 * LeakSanitizer in the sanitizer build; hangs by the Criterion timeouts.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "umbp/umbp.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static umbp_runtime_t *small_rt(const char *extra)
{
    return tu_create("{\"capacity_bytes\": \"8MiB\", \"log_level\": \"error\", "
                     "\"lookup_timeout_ms\": 10000%s}",
                     extra ? extra : "");
}

/* ---- creation ------------------------------------------------------------------ */

Test(api, create_needs_out)
{
    cr_assert_eq(umbp_runtime_create("{}", NULL), -EINVAL);
    cr_assert_neq(umbp_last_error()[0], '\0');
    cr_assert_eq(umbp_runtime_create(NULL, NULL), -EINVAL);
    umbp_runtime_destroy(NULL); /* a no-op */
}

/* ---- put / get -------------------------------------------------------------------- */

Test(api, put_bad_arguments)
{
    umbp_runtime_t *rt = small_rt(NULL);
    uint8_t buf[100] = {0};
    umbp_range_t rg = {buf, 100, 0};
    umbp_put_item_t it = {tu_key_id(1, 1), 100, &rg, 1};
    umbp_op_t *op = (umbp_op_t *)(uintptr_t)0x1;
    cr_assert_eq(umbp_put(NULL, &it, 1, &op), -EINVAL);
    cr_assert_eq(umbp_put(rt, NULL, 1, &op), -EINVAL);
    cr_assert_eq(umbp_put(rt, &it, 0, &op), -EINVAL);
    cr_assert_eq(umbp_put(rt, &it, 1, NULL), -EINVAL);
    cr_assert_eq(umbp_put(rt, NULL, 0, NULL), -EINVAL);
    cr_assert_eq(op, (umbp_op_t *)(uintptr_t)0x1, "*op written on a refused call");
    cr_assert_eq(tu_present(rt, it.key), 0);
    umbp_stats_t s = tu_stats(rt);
    cr_assert_eq(s.puts_ok + s.puts_failed + s.puts_existing, 0);
    /* a valid call still works afterwards: nothing was half-submitted */
    cr_assert_eq(umbp_put(rt, &it, 1, &op), 0);
    tu_wait(op);
    cr_assert_eq(umbp_op_key_status(op, 0), 0);
    umbp_op_release(op);
    tu_destroy(rt);
}

Test(api, get_bad_arguments)
{
    umbp_runtime_t *rt = small_rt(NULL);
    uint8_t buf[100];
    tu_poison(buf, sizeof(buf));
    umbp_range_t rg = {buf, 100, 0};
    umbp_get_item_t it = {tu_key_id(1, 1), &rg, 1};
    umbp_op_t *op = (umbp_op_t *)(uintptr_t)0x1;
    cr_assert_eq(umbp_get(NULL, &it, 1, &op), -EINVAL);
    cr_assert_eq(umbp_get(rt, NULL, 1, &op), -EINVAL);
    cr_assert_eq(umbp_get(rt, &it, 0, &op), -EINVAL);
    cr_assert_eq(umbp_get(rt, &it, 1, NULL), -EINVAL);
    cr_assert_eq(op, (umbp_op_t *)(uintptr_t)0x1);
    cr_assert(tu_is_poisoned(buf, sizeof(buf)));
    umbp_stats_t s = tu_stats(rt);
    cr_assert_eq(s.gets_ok + s.gets_miss + s.gets_failed, 0);
    cr_assert_eq(umbp_get(rt, &it, 1, &op), 0);
    tu_wait(op);
    cr_assert_eq(umbp_op_key_status(op, 0), -ENOENT);
    umbp_op_release(op);
    tu_destroy(rt);
}

/* ---- lookup, clear, flush, stats ---------------------------------------------------------- */

Test(api, lookup_bad_arguments)
{
    umbp_runtime_t *rt = small_rt(NULL);
    umbp_key_t k[2] = {tu_key_id(1, 1), tu_key_id(1, 2)};
    uint8_t present[2] = {7, 7};
    size_t prefix = 7;
    cr_assert_eq(umbp_lookup(NULL, k, 2, present, &prefix, 0), -EINVAL);
    cr_assert_eq(umbp_lookup(rt, NULL, 2, present, &prefix, 0), -EINVAL);
    cr_assert_eq(umbp_lookup(rt, k, 2, present, &prefix, 1u << 1), -EINVAL);
    cr_assert_eq(umbp_lookup(rt, k, 2, present, &prefix, 0x80000000u), -EINVAL);
    cr_assert_eq(umbp_lookup(rt, k, 2, present, &prefix, ~0u), -EINVAL);
    /* a refused lookup reports nothing present */
    cr_assert_eq(present[0], 0);
    cr_assert_eq(present[1], 0);
    cr_assert_eq(prefix, 0);
    /* n == 0 is fine, with or without keys */
    cr_assert_eq(umbp_lookup(rt, NULL, 0, NULL, NULL, 0), 0);
    cr_assert_eq(umbp_lookup(rt, k, 0, NULL, &prefix, 0), 0);
    cr_assert_eq(prefix, 0);
    /* both outputs optional */
    cr_assert_eq(umbp_lookup(rt, k, 2, NULL, NULL, UMBP_LOOKUP_TOUCH), 0);
    umbp_stats_t s = tu_stats(rt);
    cr_assert_eq(s.lookups, 1, "refused lookups were counted");
    tu_destroy(rt);
}

Test(api, control_calls_bad_arguments)
{
    umbp_stats_t s;
    cr_assert_eq(umbp_clear(NULL), -EINVAL);
    cr_assert_eq(umbp_flush(NULL, 0), -EINVAL);
    cr_assert_eq(umbp_flush(NULL, -1), -EINVAL);
    cr_assert_eq(umbp_get_stats(NULL, &s), -EINVAL);
    cr_assert_eq(umbp_prewake(NULL), -EINVAL);
    umbp_runtime_t *rt = small_rt(NULL);
    cr_assert_eq(umbp_get_stats(rt, NULL), -EINVAL);
    umbp_event_t ev[4];
    uint64_t lost = 99;
    cr_assert_eq(umbp_events_drain(NULL, ev, 4, &lost), 0);
    cr_assert_eq(lost, 0);
    lost = 99;
    cr_assert_eq(umbp_events_drain(rt, NULL, 4, &lost), 0);
    cr_assert_eq(lost, 0);
    cr_assert_eq(umbp_events_drain(rt, ev, 0, NULL), 0);
    tu_destroy(rt);
}

/* ---- op handles ------------------------------------------------------------------------------- */

Test(api, op_functions_bad_arguments)
{
    cr_assert_eq(umbp_op_test(NULL), -EINVAL);
    cr_assert_eq(umbp_op_wait(NULL, 0), -EINVAL);
    cr_assert_eq(umbp_op_wait(NULL, -1), -EINVAL);
    cr_assert_eq(umbp_op_num_keys(NULL), 0);
    cr_assert_eq(umbp_op_key_status(NULL, 0), -EINVAL);
    cr_assert_eq(umbp_op_num_ok(NULL), 0);
    umbp_op_release(NULL); /* a no-op */

    umbp_runtime_t *rt = small_rt(NULL);
    uint8_t buf[3][64];
    umbp_range_t rg[3];
    umbp_put_item_t it[3];
    for (int i = 0; i < 3; i++) {
        memset(buf[i], i, 64);
        rg[i] = (umbp_range_t){buf[i], 64, 0};
        it[i] = (umbp_put_item_t){tu_key_id(2, (uint64_t)i), 64, &rg[i], 1};
    }
    umbp_op_t *op;
    cr_assert_eq(umbp_put(rt, it, 3, &op), 0);
    tu_wait(op);
    cr_assert_eq(umbp_op_wait(op, 0), 0);
    cr_assert_eq(umbp_op_wait(op, -1), 0);
    cr_assert_eq(umbp_op_num_keys(op), 3);
    cr_assert_eq(umbp_op_num_ok(op), 3);
    cr_assert_eq(umbp_op_key_status(op, 2), 0);
    cr_assert_eq(umbp_op_key_status(op, 3), -EINVAL);
    cr_assert_eq(umbp_op_key_status(op, SIZE_MAX), -EINVAL);
    umbp_op_release(op);
    tu_destroy(rt);
}

/* An op that cannot finish yet (its copy is stalled): every accessor says
 * "in progress"; releasing it early is allowed and recycles it later. */
Test(api, op_in_progress, .timeout = 300)
{
    umbp_runtime_t *rt = small_rt(", \"copy_threads\": 2");
    struct tu_rng r;
    tu_rng_seed(&r, 11);
    struct tu_obj o;
    tu_obj_init(&o, &r, tu_key_random(&r), 64 * KiB, 1, false);
    tu_put_ok(rt, &o, 1);
    uint8_t *dst = tu_trap_arm(64 * KiB);
    umbp_range_t rg = {dst, 64 * KiB, 0};
    umbp_get_item_t it = {o.key, &rg, 1};
    umbp_op_t *op;
    cr_assert_eq(umbp_get(rt, &it, 1, &op), 0);
    tu_trap_wait_hit();
    cr_assert_eq(umbp_op_test(op), UMBP_E_INPROGRESS);
    cr_assert_eq(umbp_op_wait(op, 0), UMBP_E_INPROGRESS);
    cr_assert_eq(umbp_op_wait(op, 20), UMBP_E_INPROGRESS);
    cr_assert_eq(umbp_op_key_status(op, 0), UMBP_E_INPROGRESS);
    cr_assert_eq(umbp_op_key_status(op, 1), -EINVAL);
    cr_assert_eq(umbp_op_num_ok(op), 0);
    cr_assert_eq(umbp_op_num_keys(op), 1);
    /* a second get of the same key proceeds on the other copy worker */
    tu_expect_obj(rt, &o);
    tu_trap_release();
    tu_wait(op);
    cr_assert_eq(umbp_op_key_status(op, 0), 0);
    cr_assert_eq(memcmp(dst, o.data, 64 * KiB), 0);
    umbp_op_release(op);

    /* released while in flight: the runtime cuts it (or it finishes first)
     * and recycles it; its lease ends either way */
    umbp_op_t *op2;
    tu_trap_free();
    dst = tu_trap_arm(64 * KiB);
    rg.ptr = dst;
    cr_assert_eq(umbp_get(rt, &it, 1, &op2), 0);
    tu_trap_wait_hit();
    umbp_op_release(op2);
    tu_trap_release();
    cr_assert_eq(umbp_flush(rt, TU_WAIT_MS), 0);
    umbp_stats_t s;
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    do {
        s = tu_stats(rt);
        cr_assert(tu_now_ms() < end, "the released get never finished");
    } while (s.gets_ok + s.gets_failed < 3 || s.num_leased);
    tu_trap_free();
    tu_obj_free(&o);
    tu_destroy(rt);
}

/* ---- memory registration ----------------------------------------------------------------------- */

Test(api, mem_register_bad_arguments)
{
    umbp_runtime_t *rt = small_rt(NULL);
    static uint8_t region[64 * 1024];
    umbp_mem_handle_t h = 12345;
    umbp_mem_desc_t d = {region, sizeof(region), UMBP_MEM_HOST, 0};
    cr_assert_eq(umbp_mem_register(NULL, &d, &h), -EINVAL);
    cr_assert_eq(umbp_mem_register(rt, NULL, &h), -EINVAL);
    cr_assert_eq(umbp_mem_register(rt, &d, NULL), -EINVAL);
    umbp_mem_desc_t bad = d;
    bad.addr = NULL;
    cr_assert_eq(umbp_mem_register(rt, &bad, &h), -EINVAL);
    bad = d;
    bad.len = 0;
    cr_assert_eq(umbp_mem_register(rt, &bad, &h), -EINVAL);
    bad = d;
    bad.addr = (void *)(uintptr_t)(UINTPTR_MAX - 100);
    bad.len = 1000; /* wraps */
    cr_assert_eq(umbp_mem_register(rt, &bad, &h), -EINVAL);
    bad = d;
    bad.kind = (umbp_mem_kind_t)7;
    cr_assert_eq(umbp_mem_register(rt, &bad, &h), -EINVAL);
    cr_assert_eq(h, 12345, "handle written on failure");
    /* device memory without a GPU copy engine */
    bad = d;
    bad.kind = UMBP_MEM_DEVICE;
    cr_assert_eq(umbp_mem_register(rt, &bad, &h), -ENOTSUP);
    cr_assert_eq(h, 12345);
    tu_destroy(rt);
}

Test(api, mem_register_overlaps_and_deregister)
{
    umbp_runtime_t *rt = small_rt(NULL);
    uint8_t *region = malloc(1 * MiB);
    umbp_mem_handle_t a, b, c, x = 0;
    umbp_mem_desc_t d = {region + 4096, 8192, UMBP_MEM_HOST, 0};
    cr_assert_eq(umbp_mem_register(rt, &d, &a), 0);
    /* every kind of overlap with [4096, 12288) */
    static const struct {
        size_t off, len;
    } overlap[] = {
        {4096, 8192}, {4096, 1}, {12287, 1}, {0, 4097}, {12287, 100}, {0, 65536}, {6000, 10},
    };
    for (size_t i = 0; i < sizeof(overlap) / sizeof(overlap[0]); i++) {
        umbp_mem_desc_t o = {region + overlap[i].off, overlap[i].len, UMBP_MEM_HOST, 0};
        cr_assert_eq(umbp_mem_register(rt, &o, &x), -EEXIST, "overlap %zu+%zu accepted",
                     overlap[i].off, overlap[i].len);
    }
    /* adjacent regions on both sides are fine */
    umbp_mem_desc_t left = {region, 4096, UMBP_MEM_HOST, 0};
    umbp_mem_desc_t right = {region + 12288, 4096, UMBP_MEM_HOST, 0};
    cr_assert_eq(umbp_mem_register(rt, &left, &b), 0);
    cr_assert_eq(umbp_mem_register(rt, &right, &c), 0);
    cr_assert(a != b && b != c && a != c, "handles are not distinct");
    /* puts and gets through registered host memory work */
    struct tu_rng r;
    tu_rng_seed(&r, 3);
    tu_fill_random(&r, region, 16384);
    umbp_range_t rg[3] = {{region, 4096, 0}, {region + 4096, 8192, 4096},
                          {region + 12288, 4096, 12288}};
    umbp_put_item_t it = {tu_key_id(3, 1), 16384, rg, 3};
    umbp_op_t *op;
    cr_assert_eq(umbp_put(rt, &it, 1, &op), 0);
    tu_wait(op);
    cr_assert_eq(umbp_op_key_status(op, 0), 0);
    umbp_op_release(op);
    uint8_t *back = region + 65536;
    cr_assert_eq(tu_get_whole(rt, it.key, back, 16384), 0);
    cr_assert_eq(memcmp(back, region, 16384), 0);

    cr_assert_eq(umbp_mem_deregister(rt, a), 0);
    cr_assert_eq(umbp_mem_deregister(rt, a), -ENOENT, "deregistered twice");
    cr_assert_eq(umbp_mem_deregister(rt, a + b + c + 1000), -ENOENT);
    cr_assert_eq(umbp_mem_deregister(rt, 0), -ENOENT);
    cr_assert_eq(umbp_mem_deregister(NULL, b), -EINVAL);
    /* the hole can be registered again */
    cr_assert_eq(umbp_mem_register(rt, &d, &a), 0);
    cr_assert_eq(umbp_mem_deregister(rt, a), 0);
    cr_assert_eq(umbp_mem_deregister(rt, b), 0);
    cr_assert_eq(umbp_mem_deregister(rt, c), 0);
    free(region);
    tu_destroy(rt);
}

/* ---- error strings ------------------------------------------------------------------------------- */

Test(api, strerror_names_every_code_distinctly)
{
    static const int codes[] = {
        UMBP_OK,         UMBP_E_INPROGRESS,    UMBP_E_NOT_ATTEMPTED, UMBP_E_TIMEOUT,
        UMBP_E_STALE,    UMBP_E_SHAPE,         UMBP_E_DUPLICATE_KEY, UMBP_E_QUARANTINED,
        -ENOSPC,         -ENOENT,              -EAGAIN,              -EFBIG,
        -EINVAL,         -EEXIST,              -ENOTSUP,             -ENOMEM,
        -EFAULT,         -ETIMEDOUT,           -ECONNREFUSED,        -EPERM,
    };
    enum { N = sizeof(codes) / sizeof(codes[0]) };
    char copy[N][256];
    for (size_t i = 0; i < N; i++) {
        const char *s = umbp_strerror(codes[i]);
        cr_assert_not_null(s, "umbp_strerror(%d) is NULL", codes[i]);
        cr_assert_neq(s[0], '\0', "umbp_strerror(%d) is empty", codes[i]);
        snprintf(copy[i], sizeof(copy[i]), "%s", s);
    }
    for (size_t i = 0; i < N; i++)
        for (size_t j = i + 1; j < N; j++)
            cr_assert_str_neq(copy[i], copy[j], "codes %d and %d share the string '%s'", codes[i],
                              codes[j], copy[i]);
    /* anything else is still named, never NULL */
    static const int odd[] = {1, 4096, -4096, -4097 - 100, INT32_MIN, INT32_MAX, -100000};
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        const char *s = umbp_strerror(odd[i]);
        cr_assert_not_null(s);
        cr_assert_neq(s[0], '\0');
    }
}

/* ---- back-pressure ------------------------------------------------------------------------------- */

Test(api, backpressure_with_unreleased_handles)
{
    umbp_runtime_t *rt = small_rt(", \"max_inflight_ops\": 4");
    uint8_t buf[6][128];
    umbp_range_t rg[6];
    umbp_put_item_t it[6];
    for (int i = 0; i < 6; i++) {
        memset(buf[i], 0x10 + i, sizeof(buf[i]));
        rg[i] = (umbp_range_t){buf[i], 128, 0};
        it[i] = (umbp_put_item_t){tu_key_id(4, (uint64_t)i), 128, &rg[i], 1};
    }
    umbp_op_t *held[4];
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(umbp_put(rt, &it[i], 1, &held[i]), 0);
        tu_wait(held[i]); /* complete, but the handle is kept */
    }
    umbp_op_t *op = (umbp_op_t *)(uintptr_t)0x1;
    cr_assert_eq(umbp_put(rt, &it[4], 1, &op), -EAGAIN);
    cr_assert_eq(op, (umbp_op_t *)(uintptr_t)0x1);
    uint8_t dst[128];
    umbp_range_t grg = {dst, 128, 0};
    umbp_get_item_t git = {it[0].key, &grg, 1};
    cr_assert_eq(umbp_get(rt, &git, 1, &op), -EAGAIN);
    /* control calls have their own ops: data ops in flight never starve
     * them (issue 6 defect c: they returned -EAGAIN here) */
    umbp_key_t k = it[0].key;
    uint8_t present = 0;
    cr_assert_eq(umbp_lookup(rt, &k, 1, &present, NULL, 0), 0);
    cr_assert_eq(present, 1);
    umbp_stats_t s;
    cr_assert_eq(umbp_get_stats(rt, &s), 0);
    cr_assert_eq(s.num_objects, 4);
    cr_assert_eq(umbp_flush(rt, 10000), 0);
    /* releasing one makes room for exactly one */
    umbp_op_release(held[0]);
    cr_assert_eq(umbp_put(rt, &it[4], 1, &op), 0);
    tu_wait(op);
    cr_assert_eq(umbp_op_key_status(op, 0), 0);
    umbp_op_t *op2;
    cr_assert_eq(umbp_put(rt, &it[5], 1, &op2), -EAGAIN);
    umbp_op_release(op);
    for (int i = 1; i < 4; i++)
        umbp_op_release(held[i]);
    s = tu_stats(rt);
    cr_assert_eq(s.mailbox_full, 3, "refused submissions counted %llu, want 3",
                 (unsigned long long)s.mailbox_full);
    cr_assert_eq(s.puts_ok, 5);
    cr_assert_eq(tu_present(rt, it[5].key), 0);
    /* everything is usable again */
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(tu_get_whole(rt, it[i].key, dst, 128), 0);
        cr_assert_eq(memcmp(dst, buf[i], 128), 0);
    }
    tu_destroy(rt);
}

/* The op pool is last in first out: a submission takes the op released last
 * (its per-key arrays grown and warm), not the next of all max_inflight_ops
 * in turn.  Sequential puts therefore cycle through a handful of ops (the
 * one in flight, one whose last reference a copy worker has yet to drop);
 * a FIFO pool hands out a new one every time (64 of 64). */
Test(api, op_pool_reuses_recently_released_ops)
{
    umbp_runtime_t *rt = small_rt(NULL);
    uint8_t buf[256];
    memset(buf, 0x5a, sizeof(buf));
    enum { PUTS = 64 };
    umbp_op_t *seen[PUTS];
    size_t distinct = 0;
    for (int i = 0; i < PUTS; i++) {
        umbp_range_t rg = {buf, sizeof(buf), 0};
        umbp_put_item_t it = {tu_key_id(77, (uint64_t)i), sizeof(buf), &rg, 1};
        umbp_op_t *op;
        cr_assert_eq(umbp_put(rt, &it, 1, &op), 0);
        size_t d = 0;
        while (d < distinct && seen[d] != op)
            d++;
        if (d == distinct)
            seen[distinct++] = op;
        tu_wait(op);
        cr_assert_eq(umbp_op_key_status(op, 0), 0);
        umbp_op_release(op);
    }
    cr_assert_leq(distinct, 4, "%d sequential puts used %zu different ops", PUTS, distinct);
    tu_destroy(rt);
}

/* ---- destroy with work outstanding ----------------------------------------------------------------- */

Test(api, destroy_with_unreleased_handles)
{
    umbp_runtime_t *rt = small_rt(NULL);
    uint8_t buf[4][4096];
    umbp_range_t rg[4];
    umbp_put_item_t it[4];
    for (int i = 0; i < 4; i++) {
        memset(buf[i], i, sizeof(buf[i]));
        rg[i] = (umbp_range_t){buf[i], 4096, 0};
        it[i] = (umbp_put_item_t){tu_key_id(5, (uint64_t)i), 4096, &rg[i], 1};
    }
    umbp_op_t *op[4];
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(umbp_put(rt, &it[i], 1, &op[i]), 0);
        tu_wait(op[i]);
    }
    /* handles never released: destroy frees them (LeakSanitizer checks) */
    tu_destroy(rt);
}

Test(api, destroy_with_ops_in_flight, .timeout = 300)
{
    for (int round = 0; round < 5; round++) {
        umbp_runtime_t *rt = small_rt(", \"put_wait_ms\": 60000");
        enum { N = 32 };
        struct tu_rng r;
        tu_rng_seed(&r, (uint64_t)round);
        struct tu_obj o[N];
        for (int i = 0; i < N; i++)
            tu_obj_init(&o[i], &r, tu_key_random(&r), 512 * KiB, 4, false);
        umbp_op_t *op[2 * N];
        uint8_t *dst[N];
        umbp_range_t grg[N];
        for (int i = 0; i < N; i++) {
            umbp_put_item_t it = tu_obj_item(&o[i]);
            cr_assert_eq(umbp_put(rt, &it, 1, &op[i]), 0);
        }
        for (int i = 0; i < N; i++) {
            dst[i] = malloc(512 * KiB);
            grg[i] = (umbp_range_t){dst[i], 512 * KiB, 0};
            umbp_get_item_t g = {o[i].key, &grg[i], 1};
            cr_assert_eq(umbp_get(rt, &g, 1, &op[N + i]), 0);
        }
        /* a pool of 8 MiB cannot take 16 MiB: some puts wait for space */
        if (round % 2)
            for (int i = 0; i < N; i += 2)
                umbp_op_release(op[i]); /* some handles released, some not */
        tu_destroy(rt);
        for (int i = 0; i < N; i++) {
            free(dst[i]);
            tu_obj_free(&o[i]);
        }
    }
}

static void *release_later(void *arg)
{
    tu_sleep_ms(*(unsigned *)arg);
    tu_trap_release();
    return NULL;
}

/* destroy while a copy is stalled and a put waits for space behind leased
 * objects: the waiting put is failed at once, the running copy is finished
 * (it is released by another thread 200 ms later), and destroy returns. */
Test(api, destroy_with_stalled_copy_and_waiting_put, .timeout = 300)
{
    umbp_runtime_t *rt = tu_create("{\"capacity_bytes\": \"1MiB\", \"put_wait_ms\": 600000, "
                                   "\"timeout_ms\": 600000, \"copy_threads\": 2, "
                                   "\"lookup_timeout_ms\": 10000, \"log_level\": \"error\"}");
    struct tu_rng r;
    tu_rng_seed(&r, 5);
    enum { N = 14 };
    struct tu_obj o[N];
    for (int i = 0; i < N; i++)
        tu_obj_init(&o[i], &r, tu_key_random(&r), 64 * KiB, 1, false);
    tu_put_ok(rt, o, N);
    /* lease all of them */
    uint8_t *dst[N];
    umbp_range_t grg[N];
    umbp_get_item_t g[N];
    for (int i = 0; i < N; i++) {
        dst[i] = i == 0 ? tu_trap_arm(64 * KiB) : malloc(64 * KiB);
        grg[i] = (umbp_range_t){dst[i], 64 * KiB, 0};
        g[i] = (umbp_get_item_t){o[i].key, &grg[i], 1};
    }
    umbp_op_t *gop;
    cr_assert_eq(umbp_get(rt, g, N, &gop), 0);
    tu_trap_wait_hit();
    struct tu_obj big;
    tu_obj_init(&big, &r, tu_key_random(&r), 512 * KiB, 2, false);
    umbp_put_item_t it = tu_obj_item(&big);
    umbp_op_t *pop;
    cr_assert_eq(umbp_put(rt, &it, 1, &pop), 0);
    cr_assert_eq(umbp_op_wait(pop, 50), UMBP_E_INPROGRESS);
    pthread_t t;
    unsigned delay = 200;
    cr_assert_eq(pthread_create(&t, NULL, release_later, &delay), 0);
    tu_destroy(rt);
    pthread_join(t, NULL);
    for (int i = 1; i < N; i++)
        free(dst[i]);
    tu_trap_free();
    tu_obj_free(&big);
    for (int i = 0; i < N; i++)
        tu_obj_free(&o[i]);
}
