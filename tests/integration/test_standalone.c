/*
 * test_standalone.c - standalone mode with real processes: an umbp-server
 * (tests/common/server_fixture.h) and engine processes attached to it.
 *
 *  - objects stored by one process are restored byte-exact by another,
 *    through umbp_put/umbp_get and through the KV path (host GPU backend);
 *  - the server killed (SIGKILL) under four busy client threads: every op
 *    completes, every get that says 0 has the exact bytes, lookups miss
 *    while it is down, and a new server is picked up by reconnecting;
 *  - the server stopped (SIGSTOP): lookups come back bounded, and while one
 *    is stuck the next is refused at once (UMBP_E_NOT_ATTEMPTED);
 *  - creation without a server fails naming the socket; auto_start from
 *    eight processes at once starts exactly one server.
 *
 * Object bytes are derived from the key (test_util.h), so any process can
 * check any object without shared state.  Forked children and worker
 * threads never call Criterion assertions: they report through exit codes
 * and counters.  Waits are bounded only to turn a hang into a failure; the
 * times measured are logged, never asserted.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu.h" /* gpu/ private layer: the host backend's "device" memory */
#include "rt.h"  /* the runtime's record of its warm-up store */
#include "server_fixture.h"
#include "test_util.h"
#include "umbp/gpu.h"
#include "umbp/umbp.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static struct tu_server srv;

static void need_server(void)
{
    if (!tu_server_built())
        cr_skip_test("umbp-server was not built (no server/ target)");
}

static void start_server(const char *json)
{
    need_server();
    tu_server_start(&srv, json ? json : "{\"capacity_bytes\": \"64MiB\", \"log_level\": \"error\"}");
}

/* A standalone runtime on srv; extra is "" or ", members". */
static int sa_try_create(umbp_runtime_t **rt, const char *extra)
{
    return tu_try_create(rt, "{\"mode\": \"standalone\", \"socket_dir\": \"%s\", "
                         "\"log_level\": \"error\"%s}", tu_server_dir(&srv), extra ? extra : "");
}

static umbp_runtime_t *sa_create(const char *extra)
{
    umbp_runtime_t *rt = NULL;
    int rc = sa_try_create(&rt, extra);
    cr_assert_eq(rc, 0, "standalone runtime: %d (%s): %s", rc, umbp_strerror(rc),
                 umbp_last_error());
    return rt;
}

static uint64_t size_of_id(uint64_t id) { return 1 + (tu_splitmix64(id) % (200 * KiB)); }

/* Puts key (space, id) with bytes from the key; the key's status, or the
 * submit error, or UMBP_E_INPROGRESS if it never completed. */
static int put_key(umbp_runtime_t *rt, umbp_key_t k, uint64_t size)
{
    uint8_t *buf = malloc(size);
    tu_fill_from_key(&k, 0, buf, size);
    umbp_range_t r = {buf, size, 0};
    umbp_put_item_t it = {k, size, &r, 1};
    umbp_op_t *op = NULL;
    int rc = umbp_put(rt, &it, 1, &op);
    if (rc == 0) {
        rc = umbp_op_wait(op, TU_WAIT_MS) == 0 ? umbp_op_key_status(op, 0) : UMBP_E_INPROGRESS;
        umbp_op_release(op);
    }
    free(buf);
    return rc;
}

/* Gets key into a poisoned buffer; *bad is set if status 0 came with wrong
 * bytes.  Returns as put_key. */
static int get_key(umbp_runtime_t *rt, umbp_key_t k, uint64_t size, bool *bad)
{
    uint8_t *buf = malloc(size);
    tu_poison(buf, size);
    umbp_range_t r = {buf, size, 0};
    umbp_get_item_t it = {k, &r, 1};
    umbp_op_t *op = NULL;
    int rc = umbp_get(rt, &it, 1, &op);
    if (rc == 0) {
        rc = umbp_op_wait(op, TU_WAIT_MS) == 0 ? umbp_op_key_status(op, 0) : UMBP_E_INPROGRESS;
        umbp_op_release(op);
    }
    *bad = rc == 0 && tu_check_from_key(&k, 0, buf, size) != SIZE_MAX;
    free(buf);
    return rc;
}

/* Runs fn(arg) in a child process; returns its exit status (0 = success). */
static int in_child(int (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(fn(arg));
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- one process stores, another restores ----------------------------------- */

#define NOBJ 64
#define SPACE_A 0xa11ceull

static int child_store(void *arg)
{
    umbp_runtime_t *rt;
    if (sa_try_create(&rt, NULL) != 0)
        return 2;
    int bad = 0;
    for (uint64_t i = 0; i < NOBJ; i++)
        bad += put_key(rt, tu_key_id(SPACE_A, i), size_of_id(i)) != 0;
    umbp_runtime_destroy(rt);
    return bad ? 3 : 0;
}

Test(standalone, put_in_one_process_restore_in_another)
{
    start_server(NULL);
    cr_assert_eq(in_child(child_store, NULL), 0, "the storing process failed");
    umbp_runtime_t *rt = sa_create(NULL);
    umbp_key_t keys[NOBJ];
    for (uint64_t i = 0; i < NOBJ; i++)
        keys[i] = tu_key_id(SPACE_A, i);
    size_t prefix = 0;
    cr_assert_eq(umbp_lookup(rt, keys, NOBJ, NULL, &prefix, 0), 0);
    cr_assert_eq(prefix, NOBJ, "only %zu of %d objects visible to a second process", prefix, NOBJ);
    for (uint64_t i = 0; i < NOBJ; i++) {
        bool bad;
        int rc = get_key(rt, keys[i], size_of_id(i), &bad);
        cr_assert_eq(rc, 0, "object %llu: %d (%s)", (unsigned long long)i, rc, umbp_strerror(rc));
        cr_assert(!bad, "object %llu restored with wrong bytes", (unsigned long long)i);
    }
    umbp_stats_t s;
    cr_assert_eq(umbp_get_stats(rt, &s), 0);
    cr_assert_eq(s.num_objects, NOBJ);
    tu_destroy(rt);
    tu_server_cleanup(&srv);
}

/* Batches above PROTO_MAX_RECORDS (65536) travel as several frames of one
 * call; a lookup of 150000 keys is also larger than the socket buffers, so
 * it is written in pieces from the write watcher. */
Test(standalone, batches_larger_than_one_frame)
{
    start_server(NULL);
    umbp_runtime_t *rt = sa_create(", \"timeout_ms\": 60000, \"lookup_timeout_ms\": 60000");
    enum { NPUT = 70000, NLOOK = 150000 };
    umbp_key_t *k = malloc(NLOOK * sizeof(*k));
    uint8_t *data = malloc(NPUT), *back = malloc(NPUT);
    umbp_range_t *r = malloc(NPUT * sizeof(*r));
    umbp_put_item_t *pi = malloc(NPUT * sizeof(*pi));
    umbp_get_item_t *gi = malloc(NPUT * sizeof(*gi));
    for (size_t i = 0; i < NLOOK; i++)
        k[i] = tu_key_id(0xb16, i);
    for (size_t i = 0; i < NPUT; i++) {
        data[i] = (uint8_t)tu_splitmix64(i);
        r[i] = (umbp_range_t){&data[i], 1, 0};
        pi[i] = (umbp_put_item_t){k[i], 1, &r[i], 1};
    }
    umbp_op_t *op;
    cr_assert_eq(umbp_put(rt, pi, NPUT, &op), 0);
    cr_assert_eq(umbp_op_wait(op, TU_WAIT_MS), 0);
    cr_assert_eq(umbp_op_num_ok(op), NPUT, "%zu of %d keys stored", umbp_op_num_ok(op), NPUT);
    umbp_op_release(op);
    uint8_t *present = malloc(NLOOK);
    size_t prefix;
    cr_assert_eq(umbp_lookup(rt, k, NLOOK, present, &prefix, 0), 0);
    cr_assert_eq(prefix, NPUT);
    for (size_t i = 0; i < NLOOK; i++)
        cr_assert_eq(present[i], i < NPUT, "present[%zu] = %u", i, present[i]);
    tu_poison(back, NPUT);
    for (size_t i = 0; i < NPUT; i++) {
        r[i] = (umbp_range_t){&back[i], 1, 0};
        gi[i] = (umbp_get_item_t){k[i], &r[i], 1};
    }
    cr_assert_eq(umbp_get(rt, gi, NPUT, &op), 0);
    cr_assert_eq(umbp_op_wait(op, TU_WAIT_MS), 0);
    cr_assert_eq(umbp_op_num_ok(op), NPUT);
    umbp_op_release(op);
    cr_assert_eq(tu_first_diff(back, data, NPUT), SIZE_MAX);
    free(present);
    free(gi);
    free(pi);
    free(r);
    free(back);
    free(data);
    free(k);
    tu_destroy(rt);
    tu_server_cleanup(&srv);
}

/* ---- the same through the KV path (host backend) ----------------------------- */

#define L 4
#define NB 32
#define BS 16
#define HD 128 /* heads * head dim */
#define ESZ 2
#define CHUNK ((size_t)BS * HD * ESZ)
#define LAYER_BYTES (2 * (size_t)NB * CHUNK)
#define KV_BLOCKS 16

struct kv_side {
    const struct gpu_ops *ops;
    umbp_runtime_t *rt;
    void *dev[L];
    umbp_kv_handle_t kv;
};

static uint8_t expected_byte(int layer, size_t off) { return (uint8_t)(tu_splitmix64((uint64_t)layer << 40 | off) >> 17); }

static umbp_key_t kv_key(int i) { return tu_key_id(0x4b56, (uint64_t)i); }

/* One layer's tensor over base: (2, NB, BS, heads, head dim), K and V
 * first, blocks second. */
static void kv_tensor(umbp_kv_tensor_t *t, void *base)
{
    memset(t, 0, sizeof(*t));
    t->base = base;
    t->ndim = 5;
    int64_t shape[5] = {2, NB, BS, HD / 64, 64};
    memcpy(t->shape, shape, sizeof(shape));
    umbp_kv_tensor_set_contiguous(t);
    t->elem_size = ESZ;
    t->block_dim = 1;
    t->kv_dim = 0;
    t->layer_dim = -1;
}

/* A host "GPU" KV cache's layers, filled from the pattern or poisoned, and
 * their tensors (k->rt made, nothing registered yet). */
static int kv_layers(struct kv_side *k, bool fill, umbp_kv_tensor_t *t)
{
    memset(k, 0, sizeof(*k));
    k->ops = gpu_backend_ops(UMBP_GPU_BACKEND_HOST);
    if (!k->ops || sa_try_create(&k->rt, ", \"gpu_backend\": \"host\"") != 0)
        return -1;
    for (int l = 0; l < L; l++) {
        if (gpu_dev_alloc(k->ops, LAYER_BYTES, &k->dev[l]) != 0)
            return -1;
        uint8_t *p = k->dev[l]; /* host backend: device memory is host memory */
        for (size_t o = 0; o < LAYER_BYTES; o++)
            p[o] = fill ? expected_byte(l, o) : TU_POISON;
        kv_tensor(&t[l], k->dev[l]);
    }
    return 0;
}

static int kv_open(struct kv_side *k, bool fill)
{
    umbp_kv_tensor_t t[L];
    if (kv_layers(k, fill, t) < 0)
        return -1;
    return umbp_kv_register(k->rt, t, L, &k->kv);
}

static void kv_close(struct kv_side *k)
{
    umbp_runtime_destroy(k->rt);
    for (int l = 0; l < L; l++)
        if (k->dev[l])
            gpu_dev_free(k->ops, k->dev[l]);
}

static int kv_wait(umbp_op_t *op)
{
    int rc = umbp_op_wait(op, TU_WAIT_MS) == 0 ? 0 : UMBP_E_INPROGRESS;
    for (size_t i = 0; rc == 0 && i < umbp_op_num_keys(op); i++)
        rc = umbp_op_key_status(op, i);
    umbp_op_release(op);
    return rc;
}

static int child_kv_store(void *arg)
{
    struct kv_side k;
    if (kv_open(&k, true) != 0)
        return 2;
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(i), (uint64_t)i};
    umbp_op_t *op;
    int rc = umbp_kv_store(k.rt, k.kv, b, KV_BLOCKS, NULL, &op);
    if (rc == 0)
        rc = kv_wait(op);
    kv_close(&k);
    return rc == 0 ? 0 : 3;
}

/* Key i (i < KV_BLOCKS) was restored into block NB - 1 - i of a poisoned
 * cache, except keys miss_a and miss_b (-1: none), which missed: every byte
 * of every layer is the key's stored byte or still the poison. */
static void check_reversed_layers(void *const *dev, int layers, int miss_a, int miss_b)
{
    for (int l = 0; l < layers; l++) {
        const uint8_t *p = dev[l];
        for (int kvh = 0; kvh < 2; kvh++)
            for (int blk = 0; blk < NB; blk++) {
                int i = NB - 1 - blk; /* the key restored into blk */
                bool loaded = i < KV_BLOCKS && i != miss_a && i != miss_b;
                size_t at = ((size_t)kvh * NB + (size_t)blk) * CHUNK;
                size_t src = ((size_t)kvh * NB + (size_t)i) * CHUNK;
                for (size_t o = 0; o < CHUNK; o++) {
                    uint8_t want = loaded ? expected_byte(l, src + o) : TU_POISON;
                    cr_assert_eq(p[at + o], want, "layer %d %s block %d byte %zu", l,
                                 kvh ? "V" : "K", blk, o);
                }
            }
    }
}

static void check_reversed_restore(const struct kv_side *k, int miss_a, int miss_b)
{
    check_reversed_layers(k->dev, L, miss_a, miss_b);
}

/* Loads keys 0 .. KV_BLOCKS - 1 reversed into k's cache and checks every
 * byte (check_reversed_restore: the cache was poisoned first). */
static void load_reversed_and_check(struct kv_side *k)
{
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(i), (uint64_t)(NB - 1 - i)};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_load(k->rt, k->kv, b, KV_BLOCKS, NULL, &op), 0, "%s",
                 umbp_last_error());
    int rc = kv_wait(op);
    cr_assert_eq(rc, 0, "kv load: %d (%s)", rc, umbp_strerror(rc));
    check_reversed_restore(k, -1, -1);
}

Test(standalone, kv_store_in_one_process_load_in_another)
{
    start_server(NULL);
    cr_assert_eq(in_child(child_kv_store, NULL), 0, "the storing process failed");
    struct kv_side k;
    cr_assert_eq(kv_open(&k, false), 0, "KV setup: %s", umbp_last_error());
    load_reversed_and_check(&k); /* block i's object into block NB - 1 - i */
    kv_close(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

static bool server_idle(const umbp_stats_t *s, void *arg);
static void kv_round_trip_once_healthy(struct kv_side *k);

/* One KV object: every layer's K and V chunk of a block. */
#define KV_OBJ ((uint64_t)L * 2 * CHUNK)

/* The first registration's warm-up store (gpu_warm_store) goes through the
 * server, RESERVE to ABORT: it copied (status 0), and the server holds
 * nothing of it, neither an object nor a pending reservation nor its bytes
 * (beyond the reservations made ahead for the cache's stores, which the
 * stats count apart).
 * A warm-up load of stored keys copies nothing and gives its leases back. */
Test(standalone, the_warm_up_store_leaves_the_server_as_it_was)
{
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    int rc = ((struct umbp_runtime *)k.rt)->kv.warm_store_rc;
    cr_expect_eq(rc, 0, "the warm-up store: %d (%s)", rc, umbp_strerror(rc));
    umbp_stats_t st;
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0, "%s", umbp_last_error());
    cr_expect_eq(st.num_objects, 0, "the warm-up key was published");
    cr_expect_eq(st.num_pending, st.reserved_ahead, "the warm-up reservation is still held");
    cr_expect_eq(st.used_bytes, st.reserved_ahead * KV_OBJ,
                 "the warm-up reservation's bytes are still allocated");
    cr_expect_eq(st.puts_ok + st.puts_failed + st.puts_existing + st.kv_transfers, 0);

    /* a warm-up load (umbp_kv_warm_load) of keys the server holds: their
     * leases go back, nothing is copied into the poisoned cache */
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(i), (uint64_t)i};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_store(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0, "%s", umbp_last_error());
    cr_assert_eq(kv_wait(op), 0);
    for (int l = 0; l < L; l++)
        memset(k.dev[l], TU_POISON, LAYER_BYTES);
    cr_assert_eq(umbp_kv_warm_load(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0, "%s",
                 umbp_last_error());
    cr_assert_eq(umbp_op_wait(op, TU_WAIT_MS), 0);
    for (int i = 0; i < KV_BLOCKS; i++)
        cr_expect_eq(umbp_op_key_status(op, i), -ENOENT, "key %d", i);
    umbp_op_release(op);
    for (int l = 0; l < L; l++)
        for (size_t o = 0; o < LAYER_BYTES; o++)
            cr_assert_eq(((uint8_t *)k.dev[l])[o], TU_POISON, "layer %d byte %zu written", l, o);
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_eq(st.num_leased, 0, "a warm-up's lease is still held");
    cr_expect_eq(st.gets_ok + st.gets_miss + st.gets_failed, 0);
    kv_close(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* ---- reservations made ahead (reserve_ahead_bytes, backends/shm/shm_ahead.c) ---- */

/* The server's 64 MiB pool: 1/32 of it in spares of KV_OBJ bytes. */
#define AHEAD_WANT ((64 * MiB / 32) / KV_OBJ)

static bool ahead_full(const umbp_stats_t *s, void *arg)
{
    (void)arg;
    return s->reserved_ahead == AHEAD_WANT && s->num_pending == AHEAD_WANT;
}

/* Stores blocks 0 .. n - 1 of kv under keys key_base .. key_base + n - 1. */
static void store_from(umbp_runtime_t *rt, umbp_kv_handle_t kv, int key_base, int n)
{
    umbp_kv_block_t b[NB];
    for (int i = 0; i < n; i++)
        b[i] = (umbp_kv_block_t){kv_key(key_base + i), (uint64_t)i};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_store(rt, kv, b, (size_t)n, NULL, &op), 0, "%s", umbp_last_error());
    int rc = kv_wait(op);
    cr_assert_eq(rc, 0, "kv store of keys %d..: %d (%s)", key_base, rc, umbp_strerror(rc));
}

static void store_blocks(struct kv_side *k, int n) { store_from(k->rt, k->kv, 0, n); }

/* Once every runtime of the test is gone: the server holds `objects`
 * objects in `bytes` and nothing pending or leased (asked through a new
 * runtime with no KV cache, so no spares of its own). */
static void server_holds_only(uint64_t objects, uint64_t bytes)
{
    umbp_runtime_t *rt = sa_create(NULL);
    umbp_stats_t st;
    cr_assert(tu_wait_stats(rt, server_idle, NULL, TU_WAIT_MS, &st),
              "%llu pending, %llu leased at the server", (unsigned long long)st.num_pending,
              (unsigned long long)st.num_leased);
    cr_expect_eq(st.num_objects, objects);
    cr_expect_eq(st.used_bytes, bytes, "%llu bytes in use, want %llu (regions held?)",
                 (unsigned long long)st.used_bytes, (unsigned long long)bytes);
    tu_destroy(rt);
}

/* A store of keys 0 .. KV_BLOCKS - 1 while the server is stopped: its
 * copies need no server, its publish waits; it ends (by its deadline)
 * without hanging.  Its first key's status. */
static int store_beside_stopped_server(struct kv_side *k)
{
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(i), (uint64_t)i};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_store(k->rt, k->kv, b, KV_BLOCKS, NULL, &op), 0, "%s",
                 umbp_last_error());
    cr_assert_eq(umbp_op_wait(op, TU_WAIT_MS), 0, "the store hung beside a stopped server");
    int rc = umbp_op_key_status(op, 0);
    umbp_op_release(op);
    return rc;
}

/* A KV cache's registration makes the worker reserve AHEAD_WANT regions
 * ahead of their keys; a store of KV_BLOCKS blocks takes them (no RESERVE
 * of its own), publishes them under its keys, and another process restores
 * them byte-exact.  Storing the same keys again through new spares finds
 * them present at publish: counted as existing, the spares' regions freed.
 * The spares are refilled when the session is idle, and given back at
 * destroy: the server then holds the objects and nothing pending. */
Test(standalone, kv_stores_use_reservations_made_ahead)
{
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st),
              "spares: %llu held, %llu pending at the server (want %llu)",
              (unsigned long long)st.reserved_ahead, (unsigned long long)st.num_pending,
              (unsigned long long)AHEAD_WANT);
    cr_assert_eq(st.reserved_ahead_used, 0);

    store_blocks(&k, KV_BLOCKS);
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_eq(st.reserved_ahead_used, KV_BLOCKS, "the store did not use the spares");
    cr_expect_eq(st.puts_ok, KV_BLOCKS);
    cr_expect_eq(st.num_objects, KV_BLOCKS, "the spares were not published under the keys");
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st), "not refilled: %llu held",
              (unsigned long long)st.reserved_ahead);

    store_blocks(&k, KV_BLOCKS); /* the same keys again */
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_eq(st.reserved_ahead_used, 2 * KV_BLOCKS);
    cr_expect_eq(st.puts_existing, KV_BLOCKS, "a repeat was not reported as existing");
    cr_expect_eq(st.puts_ok, KV_BLOCKS);
    cr_expect_eq(st.num_objects, KV_BLOCKS);
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st));
    cr_expect_eq(st.used_bytes, (KV_BLOCKS + AHEAD_WANT) * KV_OBJ,
                 "a repeat's region was not freed");
    kv_close(&k);

    cr_assert_eq(kv_open(&k, false), 0, "KV setup: %s", umbp_last_error());
    load_reversed_and_check(&k);
    kv_close(&k);
    server_holds_only(KV_BLOCKS, KV_BLOCKS * KV_OBJ);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* reserve_ahead_bytes 0: no spares, stores reserve as before. */
Test(standalone, reserve_ahead_off)
{
    setenv("UMBP_RESERVE_AHEAD_BYTES", "0", 1);
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    store_blocks(&k, KV_BLOCKS);
    umbp_stats_t st;
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_eq(st.reserved_ahead + st.reserved_ahead_used + st.num_pending, 0);
    cr_expect_eq(st.num_objects, KV_BLOCKS);
    kv_close(&k);
    unsetenv("UMBP_RESERVE_AHEAD_BYTES");
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* A spare is handed out only well inside its hold: with a hold of one
 * second (and a write deadline of two), the tier checks four times a
 * second and replaces spares about every half second.  After 5 s, longer
 * than the server keeps any spare of the first fill, a store still takes
 * spares (fresh ones: an old one's region would be gone and its publish
 * fail) and round-trips byte-exact. */
Test(standalone, reservations_made_ahead_are_renewed_within_their_hold)
{
    setenv("UMBP_RESERVE_AHEAD_HOLD_MS", "1000", 1);
    setenv("UMBP_TIMEOUT_MS", "1000", 1);
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st));
    tu_sleep_ms(5000);
    /* spares are replaced a check (250 ms here) before they would be
     * retired; a store on a host stalled longer than that can find none
     * and reserve as before: try again (the replacement itself is tested
     * by spares_are_replaced_before_they_are_retired) */
    for (int i = 0; i < 4 && st.reserved_ahead_used == 0; i++) {
        cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st));
        store_blocks(&k, KV_BLOCKS);
        cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    }
    cr_expect_eq(st.reserved_ahead_used, KV_BLOCKS, "no usable spare after 5 s");
    cr_expect_eq(st.num_objects, KV_BLOCKS);
    for (int l = 0; l < L; l++)
        memset(k.dev[l], TU_POISON, LAYER_BYTES);
    load_reversed_and_check(&k);
    kv_close(&k);
    unsetenv("UMBP_RESERVE_AHEAD_HOLD_MS");
    unsetenv("UMBP_TIMEOUT_MS");
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* Spares are replaced a check before they would be retired, so a store
 * never finds them gone for a refill's round trip.  With a hold of 8 s
 * checks come every 2 s and the first fill's spares are usable until 7.2 s
 * after it: replacements are asked at the check of 4 s (the old ones given
 * back once they are granted); retiring them without replacements would
 * come at the check of 6 s, then a refill.  The server is stopped from 5 s
 * to past a store at 6.5 s: the store takes spares only if their
 * replacements came before the stop (1 s of slack each way).  Its publish
 * cannot be answered, so it fails by its deadline; after SIGCONT a round
 * trip is byte-exact and nothing else stays in use. */
Test(standalone, spares_are_replaced_before_they_are_retired)
{
    setenv("UMBP_RESERVE_AHEAD_HOLD_MS", "8000", 1);
    setenv("UMBP_TIMEOUT_MS", "1000", 1);
    setenv("UMBP_LOOKUP_TIMEOUT_MS", "10000", 1); /* health() lets the calls out */
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st));
    uint64_t t0 = tu_now_ms(); /* just after the first fill */
    tu_sleep_ms(5000);
    tu_server_signal(&srv, SIGSTOP);
    tu_sleep_ms((unsigned)(t0 + 6500 - tu_now_ms()));
    int rc = store_beside_stopped_server(&k);
    cr_expect_eq(rc, UMBP_E_TIMEOUT, "%s", umbp_strerror(rc));
    tu_server_signal(&srv, SIGCONT);
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0, "%s", umbp_last_error());
    cr_expect_eq(st.reserved_ahead_used, KV_BLOCKS,
                 "the store found no spare: they were retired before their replacements came");
    kv_round_trip_once_healthy(&k);
    kv_close(&k);
    unsetenv("UMBP_RESERVE_AHEAD_HOLD_MS");
    unsetenv("UMBP_TIMEOUT_MS");
    unsetenv("UMBP_LOOKUP_TIMEOUT_MS");
    server_holds_only(KV_BLOCKS, KV_BLOCKS * KV_OBJ);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* Without the warm-up store, a KV store names its object size itself, also
 * when it is sliced (gpu_store_slice_blocks 4: four slices of 4 blocks,
 * which are the ops that reserve): spares follow its first store, and the
 * next store takes them.  When only the unsliced parent carried the KV
 * mark, sliced stores never named the size and no spare was ever made. */
Test(standalone, a_sliced_store_names_its_size)
{
    setenv("UMBP_GPU_WARM_STORE", "false", 1);
    setenv("UMBP_GPU_STORE_SLICE_BLOCKS", "4", 1);
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_stats_t st;
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_eq(st.reserved_ahead, 0, "spares without a store");
    store_from(k.rt, k.kv, 0, KV_BLOCKS);
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st),
              "%llu spares after a sliced store, want %llu", (unsigned long long)st.reserved_ahead,
              (unsigned long long)AHEAD_WANT);
    store_from(k.rt, k.kv, 100, 4); /* one slice: from the spares */
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_eq(st.reserved_ahead_used, 4);
    for (int l = 0; l < L; l++)
        memset(k.dev[l], TU_POISON, LAYER_BYTES);
    load_reversed_and_check(&k);
    kv_close(&k);
    unsetenv("UMBP_GPU_WARM_STORE");
    unsetenv("UMBP_GPU_STORE_SLICE_BLOCKS");
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* A sliced store's first slice is half a slice, so that a first store
 * submitted as the Python binding submits it (a head, then the rest at
 * once) takes both its first transfers' regions from the spares.  Spares:
 * AHEAD_WANT (64); the head (40 keys, one op: slices of 40) takes 40 of
 * them, leaving 24; the rest (66 keys) starts with a slice of 20, which
 * they hold (then 40 and 6, more than the 4 left).  With whole slices it
 * started with 40, more than the 24 held: a RESERVE round trip in front of
 * its copy (then 26: reserved_ahead_used 40).  Every key of both stores is
 * then restored from the server byte-exact. */
Test(standalone, a_sliced_stores_first_slice_fits_the_spares_a_head_leaves)
{
    setenv("UMBP_GPU_STORE_SLICE_BLOCKS", "40", 1);
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st));
    enum { HEAD = 40, REST = 66, LEAD = 20 };
    cr_assert_eq(AHEAD_WANT, 64);
    umbp_kv_block_t head[HEAD], rest[REST];
    for (int i = 0; i < HEAD; i++)
        head[i] = (umbp_kv_block_t){kv_key(1000 + i), (uint64_t)(i % NB)};
    for (int i = 0; i < REST; i++)
        rest[i] = (umbp_kv_block_t){kv_key(2000 + i), (uint64_t)(i % NB)};
    umbp_op_t *a, *b;
    cr_assert_eq(umbp_kv_store(k.rt, k.kv, head, HEAD, NULL, &a), 0, "%s", umbp_last_error());
    cr_assert_eq(umbp_kv_store(k.rt, k.kv, rest, REST, NULL, &b), 0, "%s", umbp_last_error());
    int rc = kv_wait(a);
    cr_assert_eq(rc, 0, "the head: %d (%s)", rc, umbp_strerror(rc));
    rc = kv_wait(b);
    cr_assert_eq(rc, 0, "the rest: %d (%s)", rc, umbp_strerror(rc));
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_geq(st.reserved_ahead_used, HEAD + LEAD,
                  "%llu keys took a spare: the rest's first slice waited for a round trip",
                  (unsigned long long)st.reserved_ahead_used);
    /* both stores' keys, back from the server into a poisoned cache */
    for (int part = 0; part < 2; part++) {
        const umbp_kv_block_t *src = part ? rest : head;
        int n = part ? REST : HEAD;
        for (int at = 0; at < n; at += NB) {
            int m = n - at < NB ? n - at : NB;
            umbp_kv_block_t dst[NB];
            for (int i = 0; i < m; i++)
                dst[i] = (umbp_kv_block_t){src[at + i].key, (uint64_t)(NB - 1 - i)};
            for (int l = 0; l < L; l++)
                memset(k.dev[l], TU_POISON, LAYER_BYTES);
            umbp_op_t *op;
            cr_assert_eq(umbp_kv_load(k.rt, k.kv, dst, (size_t)m, NULL, &op), 0, "%s",
                         umbp_last_error());
            rc = kv_wait(op);
            cr_assert_eq(rc, 0, "load of part %d at %d: %d (%s)", part, at, rc, umbp_strerror(rc));
            for (int l = 0; l < L; l++)
                for (int i = 0; i < m; i++)
                    for (int kvh = 0; kvh < 2; kvh++) {
                        size_t from = ((size_t)kvh * NB + src[at + i].block) * CHUNK;
                        size_t to = ((size_t)kvh * NB + (size_t)(NB - 1 - i)) * CHUNK;
                        const uint8_t *p = (const uint8_t *)k.dev[l] + to;
                        for (size_t o = 0; o < CHUNK; o++)
                            cr_assert_eq(p[o], expected_byte(l, from + o),
                                         "part %d key %d layer %d %s byte %zu", part, at + i, l,
                                         kvh ? "V" : "K", o);
                    }
        }
    }
    kv_close(&k);
    unsetenv("UMBP_GPU_STORE_SLICE_BLOCKS");
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* Two KV caches of different object sizes on one runtime, as a hybrid
 * model registers its attention groups and its Mamba state: each size gets
 * spares of its own from its registration on (its warm-up store names the
 * size), an even share of the budget (the first size's spares shrink to
 * their share).  The first and later stores of both take spares and both
 * restore byte-exact; once the runtime is gone the server holds the objects
 * and nothing pending.  With spares for the first size only, the held
 * count never reaches both shares; with the warm-up at the first
 * registration only, not before the second cache's first store. */
#define LB 2 /* the second cache's layers: objects of KV_OBJ / 2 */

static bool spares_held(const umbp_stats_t *s, void *arg)
{
    uint64_t want = *(const uint64_t *)arg;
    return s->reserved_ahead == want && s->num_pending == want;
}

static void load_reversed_from(umbp_runtime_t *rt, umbp_kv_handle_t kv, int key_base)
{
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(key_base + i), (uint64_t)(NB - 1 - i)};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_load(rt, kv, b, KV_BLOCKS, NULL, &op), 0, "%s", umbp_last_error());
    int rc = kv_wait(op);
    cr_assert_eq(rc, 0, "kv load of keys %d..: %d (%s)", key_base, rc, umbp_strerror(rc));
}

Test(standalone, each_kv_object_size_gets_spares)
{
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    void *dev_b[LB];
    umbp_kv_tensor_t t[LB];
    for (int l = 0; l < LB; l++) { /* its own memory, the pattern of layers 0 and 1 */
        cr_assert_eq(gpu_dev_alloc(k.ops, LAYER_BYTES, &dev_b[l]), 0);
        memcpy(dev_b[l], k.dev[l], LAYER_BYTES);
        kv_tensor(&t[l], dev_b[l]);
    }
    umbp_kv_handle_t kv_b;
    cr_assert_eq(umbp_kv_register(k.rt, t, LB, &kv_b), 0, "%s", umbp_last_error());

    /* the second registration's warm-up store named its size: both shares
     * are held before either cache has stored, and the first stores of both
     * take spares; so do the next ones, once the spares are made again */
    uint64_t want = (64 * MiB / 32 / 2) / KV_OBJ + (64 * MiB / 32 / 2) / (KV_OBJ / 2);
    umbp_stats_t st;
    for (int round = 0; round < 2; round++) {
        cr_assert(tu_wait_stats(k.rt, spares_held, &want, 20000, &st),
                  "round %d: spares: %llu held, %llu pending at the server (want %llu: both "
                  "sizes' shares)", round, (unsigned long long)st.reserved_ahead,
                  (unsigned long long)st.num_pending, (unsigned long long)want);
        uint64_t used = st.reserved_ahead_used;
        store_from(k.rt, kv_b, 100 + 200 * round, KV_BLOCKS);
        store_from(k.rt, k.kv, 200 + 200 * round, KV_BLOCKS);
        cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
        cr_expect_eq(st.reserved_ahead_used, used + 2 * KV_BLOCKS,
                     "round %d: a store took no spare", round);
    }
    cr_expect_eq(st.num_objects, 4 * KV_BLOCKS);

    for (int l = 0; l < LB; l++)
        memset(dev_b[l], TU_POISON, LAYER_BYTES);
    load_reversed_from(k.rt, kv_b, 300);
    check_reversed_layers(dev_b, LB, -1, -1);
    for (int l = 0; l < L; l++)
        memset(k.dev[l], TU_POISON, LAYER_BYTES);
    load_reversed_from(k.rt, k.kv, 400);
    check_reversed_restore(&k, -1, -1);

    kv_close(&k);
    for (int l = 0; l < LB; l++)
        gpu_dev_free(k.ops, dev_b[l]);
    server_holds_only(4 * KV_BLOCKS, 2 * KV_BLOCKS * KV_OBJ + 2 * KV_BLOCKS * (KV_OBJ / 2));
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* A tenant whose quota is small next to the spares its worker asks for
 * (namespace "t", quota 1 MiB; the worker wants 64 spares of 32 KiB, 2 MiB):
 * the server grants spares up to 1/8 of the quota and refuses the rest
 * without evicting, so the tenant's stores stay stored across the refills
 * that follow.  Without the share the first refill took the whole quota,
 * and each later one evicted an object stored just before. */
static bool spares_at_eighth_of_quota(const umbp_stats_t *s, void *arg)
{
    (void)arg;
    return s->reserved_ahead == MiB / 8 / KV_OBJ;
}

Test(standalone, a_tenants_spares_stay_within_its_quota)
{
    setenv("UMBP_RESERVE_AHEAD_HOLD_MS", "1000", 1); /* a refill every 250 ms */
    setenv("UMBP_NAMESPACE", "t", 1);
    start_server("{\"capacity_bytes\": \"64MiB\", \"log_level\": \"error\", "
                 "\"namespace_quotas\": \"t=1MiB\"}");
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, spares_at_eighth_of_quota, NULL, TU_WAIT_MS, &st),
              "%llu spares held, want %llu (1/8 of the quota)",
              (unsigned long long)st.reserved_ahead, (unsigned long long)(MiB / 8 / KV_OBJ));
    store_blocks(&k, KV_BLOCKS);
    tu_sleep_ms(800); /* three checks, each asking for the missing spares */
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_leq(st.reserved_ahead, MiB / 8 / KV_OBJ);
    for (int l = 0; l < L; l++)
        memset(k.dev[l], TU_POISON, LAYER_BYTES);
    load_reversed_and_check(&k); /* every stored block still there */
    kv_close(&k);
    unsetenv("UMBP_RESERVE_AHEAD_HOLD_MS");
    unsetenv("UMBP_NAMESPACE");
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* Two object sizes whose refills come back short (the namespace's quota
 * lets spares take 128 KiB, far less than either size's share): each size
 * asks again only at a check (every 250 ms with a 1 s hold), not every few
 * ms, and the first does not starve the second of its turn.  Counted by
 * the keys the server says it was asked to reserve (`umbp stat`) over
 * 600 ms idle: a few refills per check at most, each asking for fewer
 * than 100 keys.  When a short size was asked again at once, the two sent
 * hundreds of refills. */
static uint64_t server_keys_reserved(void)
{
    char cmd[512], out[8192];
    snprintf(cmd, sizeof(cmd), "%s --socket-dir %s stat 2>&1", UMBP_CLI_BIN,
             tu_server_dir(&srv));
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "umbp stat: %s", out);
    unsigned long long keys;
    const char *line = strstr(out, "stores:");
    cr_assert(line && sscanf(line, "stores: %llu keys reserved", &keys) == 1, "umbp stat: %s",
              out);
    return keys;
}

Test(standalone, short_refills_wait_for_a_check)
{
    setenv("UMBP_RESERVE_AHEAD_HOLD_MS", "1000", 1);
    setenv("UMBP_NAMESPACE", "t", 1);
    start_server("{\"capacity_bytes\": \"64MiB\", \"log_level\": \"error\", "
                 "\"namespace_quotas\": \"t=1MiB\"}");
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_kv_tensor_t t[LB];
    for (int l = 0; l < LB; l++)
        kv_tensor(&t[l], k.dev[l]); /* a second size: LB of the layers */
    umbp_kv_handle_t kv_b;
    cr_assert_eq(umbp_kv_register(k.rt, t, LB, &kv_b), 0, "%s", umbp_last_error());
    tu_sleep_ms(300);
    uint64_t before = server_keys_reserved();
    tu_sleep_ms(600);
    uint64_t asked = server_keys_reserved() - before;
    cr_expect_leq(asked, 12 * 100, "%llu keys asked for in 600 ms", (unsigned long long)asked);
    store_blocks(&k, KV_BLOCKS); /* and the tenant still stores and restores */
    for (int l = 0; l < L; l++)
        memset(k.dev[l], TU_POISON, LAYER_BYTES);
    load_reversed_and_check(&k);
    kv_close(&k);
    unsetenv("UMBP_RESERVE_AHEAD_HOLD_MS");
    unsetenv("UMBP_NAMESPACE");
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* The workers of a host share a small pool's spares: a worker keeps at
 * most 1/16 of the pool divided among the server's sessions (and 1/32 of
 * it alone).  With five more sessions, the worker's spares shrink to at
 * most 1/96 of the pool (given back at the next check: every 250 ms with
 * a 1 s hold), a store still takes them, and once the others are gone the
 * spares grow back to 1/32.  Without the division they stay at 1/32. */
struct at_most {
    uint64_t most;
};

static bool spares_at_most(const umbp_stats_t *s, void *arg)
{
    uint64_t most = ((const struct at_most *)arg)->most;
    return s->reserved_ahead && s->reserved_ahead <= most && s->num_pending == s->reserved_ahead;
}

Test(standalone, workers_share_a_small_pools_spares)
{
    setenv("UMBP_RESERVE_AHEAD_HOLD_MS", "1000", 1);
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st));
    umbp_runtime_t *others[5];
    for (int i = 0; i < 5; i++)
        others[i] = sa_create(NULL);
    struct at_most m = {(64 * MiB / 16 / 6) / KV_OBJ};
    cr_assert(tu_wait_stats(k.rt, spares_at_most, &m, 20000, &st),
              "beside 5 other sessions: %llu spares held, %llu pending (at most %llu)",
              (unsigned long long)st.reserved_ahead, (unsigned long long)st.num_pending,
              (unsigned long long)m.most);
    store_blocks(&k, KV_BLOCKS);
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_eq(st.reserved_ahead_used, KV_BLOCKS, "a store took no spare");
    for (int i = 0; i < 5; i++)
        tu_destroy(others[i]);
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, 20000, &st),
              "alone again: %llu spares held (want %llu)", (unsigned long long)st.reserved_ahead,
              (unsigned long long)AHEAD_WANT);
    for (int l = 0; l < L; l++)
        memset(k.dev[l], TU_POISON, LAYER_BYTES);
    load_reversed_and_check(&k);
    kv_close(&k);
    unsetenv("UMBP_RESERVE_AHEAD_HOLD_MS");
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* A worker that fills its spares, then dies by SIGKILL (exit 137). */
static int child_fill_spares_and_die(void *arg)
{
    (void)arg;
    struct kv_side k;
    umbp_stats_t st;
    if (kv_open(&k, true) != 0 || !tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st))
        return 2;
    raise(SIGKILL);
    return 3;
}

static bool nothing_pending(const umbp_stats_t *s, void *arg)
{
    (void)arg;
    return s->num_pending == 0;
}

static bool only_objects(const umbp_stats_t *s, void *arg)
{
    (void)arg;
    return s->num_pending == 0 && s->used_bytes == s->num_objects * KV_OBJ;
}

/* The worker killed (SIGKILL) while it holds spares: the server ends its
 * session, keeps the spares' regions out of use until their hold plus the
 * write deadline (1 s + 2 s here: the worker may have been copying into
 * one), and frees them then; a store and restore of another process meanwhile
 * are byte-exact. */
Test(standalone, a_worker_killed_holding_spares)
{
    setenv("UMBP_RESERVE_AHEAD_HOLD_MS", "1000", 1);
    setenv("UMBP_TIMEOUT_MS", "1000", 1);
    start_server(NULL);
    cr_assert_eq(in_child(child_fill_spares_and_die, NULL), 128 + SIGKILL,
                 "the worker did not fill its spares and die");
    umbp_runtime_t *rt = sa_create(NULL); /* no KV cache: no spares of its own */
    umbp_stats_t st;
    cr_assert(tu_wait_stats(rt, nothing_pending, NULL, TU_WAIT_MS, &st),
              "the dead worker's spares are still pending: %llu",
              (unsigned long long)st.num_pending);
    cr_expect_eq(st.used_bytes, AHEAD_WANT * KV_OBJ,
                 "the dead worker's regions were freed before its deadline");
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    kv_round_trip_once_healthy(&k);
    kv_close(&k);
    cr_assert(tu_wait_stats(rt, only_objects, NULL, TU_WAIT_MS, &st),
              "regions of the dead worker still allocated: %llu bytes for %llu objects",
              (unsigned long long)st.used_bytes, (unsigned long long)st.num_objects);
    cr_expect_eq(st.num_objects, KV_BLOCKS);
    tu_destroy(rt);
    unsetenv("UMBP_RESERVE_AHEAD_HOLD_MS");
    unsetenv("UMBP_TIMEOUT_MS");
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* Spares die with their session: the server killed (SIGKILL) and started
 * again (a new pool), the worker's old spares are never handed out; it
 * makes new ones in the new session and a store through them round-trips
 * byte-exact. */
Test(standalone, reservations_made_ahead_die_with_the_server)
{
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st));
    tu_server_stop(&srv); /* SIGKILL */
    start_server(NULL);
    kv_round_trip_once_healthy(&k);
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st), "no spares in the new "
              "session: %llu held", (unsigned long long)st.reserved_ahead);
    uint64_t used = st.reserved_ahead_used;
    kv_round_trip_once_healthy(&k);
    cr_assert_eq(umbp_get_stats(k.rt, &st), 0);
    cr_expect_gt(st.reserved_ahead_used, used, "the new session's spares were not used");
    kv_close(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* The spares are held, and the server holds nothing else pending or leased. */
static bool only_spares_pending(const umbp_stats_t *s, void *arg)
{
    (void)arg;
    return ahead_full(s, NULL) && s->num_leased == 0;
}

/* A server and a KV cache whose calls expire after 300 ms (timeout_ms),
 * while health() lets them out (lookup_timeout_ms 10 s); the test ends with
 * close_with_short_deadlines. */
static void open_with_short_deadlines(struct kv_side *k)
{
    setenv("UMBP_TIMEOUT_MS", "300", 1);
    setenv("UMBP_LOOKUP_TIMEOUT_MS", "10000", 1);
    start_server(NULL);
    cr_assert_eq(kv_open(k, true), 0, "KV setup: %s", umbp_last_error());
}

static void close_with_short_deadlines(struct kv_side *k)
{
    kv_close(k);
    unsetenv("UMBP_TIMEOUT_MS");
    unsetenv("UMBP_LOOKUP_TIMEOUT_MS");
}

/* A store through spares while the server is stopped (SIGSTOP): its
 * copies need no server, its PUBLISH_AS waits, and the store fails by its
 * deadline (UMBP_E_TIMEOUT) without hanging.  Once the server runs again
 * the late reply is consumed, the spares come back, nothing else stays
 * pending, and a round trip is byte-exact. */
Test(standalone, a_store_through_spares_beside_a_stopped_server)
{
    struct kv_side k;
    open_with_short_deadlines(&k);
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st));
    tu_server_signal(&srv, SIGSTOP);
    int rc = store_beside_stopped_server(&k);
    cr_expect_eq(rc, UMBP_E_TIMEOUT, "%s", umbp_strerror(rc));
    tu_server_signal(&srv, SIGCONT);
    cr_assert(tu_wait_stats(k.rt, only_spares_pending, NULL, TU_WAIT_MS, &st),
              "after SIGCONT: %llu pending, %llu spares, %llu leased",
              (unsigned long long)st.num_pending, (unsigned long long)st.reserved_ahead,
              (unsigned long long)st.num_leased);
    kv_round_trip_once_healthy(&k);
    close_with_short_deadlines(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* A runtime destroyed while a refill of its spares is unanswered waits for
 * the answer (timeout_ms at most) and gives the spares back: the server
 * keeps nothing of them.  Closed at once instead, the session would leave
 * the server to grant the RESERVE to a session that is gone, and to hold
 * those regions for the hold plus the write deadline (40 s here), in use
 * for nothing - the flake of kv_stores_use_reservations_made_ahead, whose
 * second runtime is destroyed soon after its registration's fill.
 *
 * The fill goes out 5 ms after the registration's warm-up store named the
 * object size, when the session is idle; the server is stopped before it
 * can answer, the runtime is destroyed from another thread, and the server
 * resumed 300 ms later.  An attempt counts when the destroy returned after
 * the resume (the fill was in flight: a STATS call outstanding at the stop,
 * every 200 ms, keeps it from going out); without the wait none does. */
struct destroy_during_fill {
    struct kv_side *k;
    atomic_bool resumed;
    bool after_resume;
};

static void *destroy_in_thread(void *p)
{
    struct destroy_during_fill *d = p;
    kv_close(d->k);
    d->after_resume = atomic_load(&d->resumed);
    return NULL;
}

Test(standalone, a_runtime_destroyed_during_a_refill_gives_the_spares_back)
{
    start_server(NULL);
    int counted = 0;
    for (int attempt = 0; attempt < 4 && !counted; attempt++) {
        struct kv_side k;
        cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
        tu_server_signal(&srv, SIGSTOP);
        tu_sleep_ms(100); /* the fill is sent, unanswered */
        struct destroy_during_fill d = {.k = &k};
        atomic_init(&d.resumed, false);
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, destroy_in_thread, &d), 0);
        tu_sleep_ms(300);
        atomic_store(&d.resumed, true);
        tu_server_signal(&srv, SIGCONT);
        pthread_join(th, NULL);
        counted += d.after_resume;
    }
    cr_assert(counted, "every runtime was destroyed before the server answered its refill");
    server_holds_only(0, 0); /* the refill's regions not held */
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* The same, but the stopped server is killed (SIGKILL, never resumed)
 * while the destroy waits for its refill's answer: the connection drops,
 * the refill fails, and the destroy returns (nothing hangs).  A new server
 * on the same socket directory then serves a new runtime byte-exact, its
 * pool holding nothing of the dead one's spares. */
Test(standalone, a_runtime_destroyed_during_a_refill_beside_a_killed_server)
{
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    tu_server_signal(&srv, SIGSTOP);
    tu_sleep_ms(100); /* the fill is sent, unanswered */
    struct destroy_during_fill d = {.k = &k};
    atomic_init(&d.resumed, false);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, destroy_in_thread, &d), 0);
    tu_sleep_ms(300);
    kill(srv.pid, SIGKILL); /* not tu_server_stop: it resumes the server first */
    while (waitpid(srv.pid, NULL, 0) < 0 && errno == EINTR)
        ;
    srv.pid = 0;
    pthread_join(th, NULL); /* a destroy that hung would hang here */
    start_server(NULL);
    struct kv_side k2;
    cr_assert_eq(kv_open(&k2, true), 0, "KV setup beside the new server: %s", umbp_last_error());
    store_blocks(&k2, KV_BLOCKS);
    for (int l = 0; l < L; l++)
        memset(k2.dev[l], TU_POISON, LAYER_BYTES);
    load_reversed_and_check(&k2);
    kv_close(&k2);
    server_holds_only(KV_BLOCKS, KV_BLOCKS * KV_OBJ);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* A refill answered after its deadline: the fill's call times out beside a
 * stopped server (timeout_ms 300), and when the server runs again its late
 * answer's regions are aborted (the tier's path for late replies) and new
 * spares are made.  The server then holds this runtime's spares and nothing
 * else - not the late ones, which it would otherwise keep for their hold
 * plus the write deadline (31 s here, longer than the 20 s waited) - stores
 * round-trip byte-exact, and nothing is in use once the runtime is gone. */
Test(standalone, a_refill_answered_late_is_undone)
{
    struct kv_side k;
    open_with_short_deadlines(&k);
    tu_server_signal(&srv, SIGSTOP);
    tu_sleep_ms(800); /* the fill went out 5 ms after the warm-up store and expired */
    tu_server_signal(&srv, SIGCONT);
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, only_spares_pending, NULL, 20000, &st),
              "after SIGCONT: %llu pending at the server, %llu spares held",
              (unsigned long long)st.num_pending, (unsigned long long)st.reserved_ahead);
    cr_expect_eq(st.used_bytes, AHEAD_WANT * KV_OBJ);
    kv_round_trip_once_healthy(&k);
    close_with_short_deadlines(&k);
    server_holds_only(KV_BLOCKS, KV_BLOCKS * KV_OBJ);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* A runtime destroyed while calls that timed out still have replies due
 * (timeout_ms 300, the server stopped): the destroy waits for the late
 * answers (its drain, timeout_ms at most), so late grants are aborted
 * instead of going to a closed session, which the server would hold to
 * the spares' hold plus the write deadline.  First a refill of spares: the
 * server stopped right after registration, 800 ms (the refill that follows
 * the warm-up store expires, unless it was answered before the stop; the
 * leak check holds either way).  Then a store through spares, whose
 * PUBLISH_AS times out beside the stopped server: the destroy returns only
 * after the server, resumed 100 ms into it, answered.  Without the wait
 * the destroy returned at once and the server held the whole refill. */
static void destroy_beside_stopped_server(struct kv_side *k, bool *after_resume)
{
    struct destroy_during_fill d = {.k = k};
    atomic_init(&d.resumed, false);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, destroy_in_thread, &d), 0);
    tu_sleep_ms(100);
    atomic_store(&d.resumed, true);
    tu_server_signal(&srv, SIGCONT);
    pthread_join(th, NULL);
    *after_resume = d.after_resume;
}

Test(standalone, a_runtime_destroyed_with_calls_timed_out_waits_for_their_answers)
{
    struct kv_side k;
    open_with_short_deadlines(&k);
    tu_server_signal(&srv, SIGSTOP);
    tu_sleep_ms(800); /* the fill went out 5 ms after the warm-up store and expired */
    bool after;
    destroy_beside_stopped_server(&k, &after);
    cr_log_info("refill: the destroy returned %s the server answered", after ? "after" : "before");
    server_holds_only(0, 0); /* the late refill's regions not held */

    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_stats_t st;
    cr_assert(tu_wait_stats(k.rt, ahead_full, NULL, TU_WAIT_MS, &st));
    tu_server_signal(&srv, SIGSTOP);
    int rc = store_beside_stopped_server(&k);
    cr_assert_eq(rc, UMBP_E_TIMEOUT, "a store beside a stopped server: %d", rc);
    destroy_beside_stopped_server(&k, &after);
    cr_expect(after, "the destroy returned before the server answered the store's publish");
    unsetenv("UMBP_TIMEOUT_MS");
    unsetenv("UMBP_LOOKUP_TIMEOUT_MS");
    /* the late publish made the objects; nothing else is held */
    server_holds_only(KV_BLOCKS, KV_BLOCKS * KV_OBJ);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* ---- populate_pool ---------------------------------------------------------------- */

/* The server's shared memory resident now (RssShmem in /proc/<pid>/status). */
static uint64_t server_shmem_bytes(void)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)srv.pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    unsigned long long kib = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "RssShmem: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (uint64_t)kib * KiB;
}

/* populate_pool (default true): once serving, the server allocates every
 * page of its pool in the background; off, the pool stays unallocated
 * until clients touch it.  Either way a KV cache round-trips byte-exact. */
/* MADV_POPULATE_WRITE (Linux 5.14) works here: populate_pool needs it. */
static bool kernel_populates(void)
{
    size_t len = 1 << 16;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    bool ok = madvise(p, len, 23 /* MADV_POPULATE_WRITE */) == 0;
    munmap(p, len);
    return ok;
}

Test(standalone, the_server_populates_its_pool)
{
    if (!kernel_populates())
        cr_skip_test("this kernel has no MADV_POPULATE_WRITE (Linux 5.14): populate_pool "
                     "does nothing here");
    start_server(NULL); /* 64 MiB */
    uint64_t end = tu_now_ms() + TU_WAIT_MS, have = 0;
    while ((have = server_shmem_bytes()) < 64 * MiB && tu_now_ms() < end)
        tu_sleep_ms(20);
    cr_assert_geq(have, 64 * MiB, "the pool was not populated: %llu bytes resident",
                  (unsigned long long)have);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    kv_round_trip_once_healthy(&k);
    kv_close(&k);
    tu_server_cleanup(&srv);

    start_server("{\"capacity_bytes\": \"64MiB\", \"log_level\": \"error\", "
                 "\"populate_pool\": false}");
    tu_sleep_ms(300);
    have = server_shmem_bytes();
    cr_assert_lt(have, 8 * MiB, "populate_pool=false populated %llu bytes",
                 (unsigned long long)have);
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    kv_round_trip_once_healthy(&k);
    kv_close(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* After a server came back: stores KV_BLOCKS blocks (retrying while the
 * session recovers, 20 s at most), then restores them reversed into the
 * poisoned cache and checks every byte. */
static void kv_round_trip_once_healthy(struct kv_side *k)
{
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(i), (uint64_t)i};
    umbp_op_t *op;
    int rc = UMBP_E_NOT_ATTEMPTED;
    for (int i = 0; i < 400 && rc != 0; i++) {
        cr_assert_eq(umbp_kv_store(k->rt, k->kv, b, KV_BLOCKS, NULL, &op), 0, "%s",
                     umbp_last_error());
        if ((rc = kv_wait(op)) != 0)
            tu_sleep_ms(50);
    }
    cr_assert_eq(rc, 0, "store once the server is back: %d (%s)", rc, umbp_strerror(rc));
    for (int l = 0; l < L; l++)
        memset(k->dev[l], TU_POISON, LAYER_BYTES);
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i].block = (uint64_t)(NB - 1 - i);
    cr_assert_eq(umbp_kv_load(k->rt, k->kv, b, KV_BLOCKS, NULL, &op), 0, "%s",
                 umbp_last_error());
    cr_assert_eq(kv_wait(op), 0);
    check_reversed_restore(k, -1, -1);
}

/* A server stopped (SIGSTOP) while an engine registers its cache: the
 * warm-up store cannot finish, registration still returns (its wait is
 * bounded at a second; the time is logged, not asserted) and succeeds, and
 * once the server runs again the cache stores and restores. */
Test(standalone, registration_beside_a_stopped_server)
{
    start_server(NULL);
    struct kv_side k;
    umbp_kv_tensor_t t[L];
    cr_assert_eq(kv_layers(&k, true, t), 0, "KV setup: %s", umbp_last_error());
    tu_server_signal(&srv, SIGSTOP);
    uint64_t t0 = tu_now_ms();
    int rc = umbp_kv_register(k.rt, t, L, &k.kv);
    cr_log_info("registration beside a stopped server: %llu ms",
                (unsigned long long)(tu_now_ms() - t0));
    tu_server_signal(&srv, SIGCONT);
    cr_assert_eq(rc, 0, "%s", umbp_last_error());
    cr_expect_neq(((struct umbp_runtime *)k.rt)->kv.warm_store_rc, 0,
                  "the warm-up store finished against a stopped server");
    kv_round_trip_once_healthy(&k);
    kv_close(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* The same, and the engine deregisters the cache and frees its memory
 * before the server runs again (what umbp.h allows: none of its ops uses
 * the handle).  The registration's warm-up store was still in flight:
 * deregistration waits for it, so once the server answers it reads no
 * freed layout nor freed GPU memory (ASan saw both before the wait), and
 * the runtime goes on: a new cache stores and restores byte-exact. */
Test(standalone, deregistration_waits_for_a_warm_up_store_in_flight)
{
    start_server(NULL);
    struct kv_side k;
    umbp_kv_tensor_t t[L];
    cr_assert_eq(kv_layers(&k, true, t), 0, "KV setup: %s", umbp_last_error());
    tu_server_signal(&srv, SIGSTOP);
    cr_assert_eq(umbp_kv_register(k.rt, t, L, &k.kv), 0, "%s", umbp_last_error());
    pid_t resume = fork(); /* the server runs again while deregistration waits */
    if (resume == 0) {
        usleep(300000);
        kill(srv.pid, SIGCONT);
        _exit(0);
    }
    cr_assert_eq(umbp_kv_deregister(k.rt, k.kv), 0);
    waitpid(resume, NULL, 0);
    tu_server_signal(&srv, SIGCONT);
    for (int l = 0; l < L; l++) {
        gpu_dev_free(k.ops, k.dev[l]);
        k.dev[l] = NULL;
    }
    cr_assert_eq(umbp_flush(k.rt, TU_WAIT_MS), 0);
    for (int l = 0; l < L; l++) { /* a new cache, the same pattern */
        cr_assert_eq(gpu_dev_alloc(k.ops, LAYER_BYTES, &k.dev[l]), 0);
        uint8_t *p = k.dev[l];
        for (size_t o = 0; o < LAYER_BYTES; o++)
            p[o] = expected_byte(l, o);
        kv_tensor(&t[l], k.dev[l]);
    }
    cr_assert_eq(umbp_kv_register(k.rt, t, L, &k.kv), 0, "%s", umbp_last_error());
    kv_round_trip_once_healthy(&k);
    kv_close(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* The server killed (SIGKILL) before an engine registers: the warm-up store
 * fails at once and registration still succeeds; a new server (a new pool)
 * then takes the cache's blocks and gives them back byte-exact. */
Test(standalone, registration_after_the_server_was_killed)
{
    start_server(NULL);
    struct kv_side k;
    umbp_kv_tensor_t t[L];
    cr_assert_eq(kv_layers(&k, true, t), 0, "KV setup: %s", umbp_last_error());
    tu_server_stop(&srv); /* SIGKILL */
    uint64_t t0 = tu_now_ms();
    int rc = umbp_kv_register(k.rt, t, L, &k.kv);
    cr_log_info("registration after a server kill: %llu ms",
                (unsigned long long)(tu_now_ms() - t0));
    cr_assert_eq(rc, 0, "%s", umbp_last_error());
    cr_expect_lt(((struct umbp_runtime *)k.rt)->kv.warm_store_rc, 0,
                 "the warm-up store succeeded without a server");
    start_server(NULL);
    kv_round_trip_once_healthy(&k);
    kv_close(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* A KV cache deregistered while a transfer on it is in flight (waited for
 * or not, released or not): the layout was freed under the transfer (a
 * use-after-free, a segfault from Python).  Deregistration now refuses with
 * -EBUSY naming why, and succeeds once the transfers completed. */
Test(standalone, deregistration_refuses_while_a_transfer_is_in_flight)
{
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    store_blocks(&k, KV_BLOCKS);
    tu_server_signal(&srv, SIGSTOP); /* the load's acquire waits for it */
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(i), (uint64_t)(NB - 1 - i)};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_load(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0, "%s", umbp_last_error());
    int rc = umbp_kv_deregister(k.rt, k.kv);
    cr_assert_eq(rc, -EBUSY, "deregistration under a load in flight: %d (%s)", rc,
                 umbp_strerror(rc));
    cr_assert(strstr(umbp_last_error(), "in flight"), "the refusal says: %s", umbp_last_error());
    umbp_op_release(op); /* released unwaited: it still runs */
    cr_assert_eq(umbp_kv_deregister(k.rt, k.kv), -EBUSY, "a released load still reads it");
    tu_server_signal(&srv, SIGCONT);
    uint64_t t0 = tu_now_ms();
    while ((rc = umbp_kv_deregister(k.rt, k.kv)) == -EBUSY && tu_now_ms() - t0 < TU_WAIT_MS)
        tu_sleep_ms(5);
    cr_assert_eq(rc, 0, "deregistration after the load completed: %d (%s)", rc,
                 umbp_strerror(rc));
    cr_assert_eq(umbp_kv_deregister(k.rt, k.kv), -ENOENT);

    /* a binding's warm-up load (umbp_kv_warm_load) reads the layout too: a
     * binding that stopped waiting for it must not free it under it */
    umbp_kv_tensor_t t[L];
    for (int l = 0; l < L; l++)
        kv_tensor(&t[l], k.dev[l]);
    cr_assert_eq(umbp_kv_register(k.rt, t, L, &k.kv), 0, "%s", umbp_last_error());
    tu_server_signal(&srv, SIGSTOP);
    cr_assert_eq(umbp_kv_warm_load(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0, "%s",
                 umbp_last_error());
    umbp_op_release(op);
    rc = umbp_kv_deregister(k.rt, k.kv);
    cr_assert_eq(rc, -EBUSY, "deregistration under a warm-up load in flight: %d (%s)", rc,
                 umbp_strerror(rc));
    tu_server_signal(&srv, SIGCONT);
    t0 = tu_now_ms();
    while ((rc = umbp_kv_deregister(k.rt, k.kv)) == -EBUSY && tu_now_ms() - t0 < TU_WAIT_MS)
        tu_sleep_ms(5);
    cr_assert_eq(rc, 0, "%d (%s)", rc, umbp_strerror(rc));
    k.kv = 0;
    kv_close(&k);
    tu_server_cleanup(&srv);
}

/* A load split into a head of 2 keys and the rest (gpu_load_head_blocks):
 * a miss in the head (key 1) and one in the tail (key 9) fail at their own
 * keys, every hit is restored byte-exact, and no other block is written. */
Test(standalone, kv_load_with_a_head_statuses_and_bytes)
{
    setenv("UMBP_GPU_LOAD_HEAD_BLOCKS", "2", 1); /* 16 keys: 8 heads */
    start_server(NULL);
    cr_assert_eq(in_child(child_kv_store, NULL), 0, "the storing process failed");
    struct kv_side k;
    cr_assert_eq(kv_open(&k, false), 0, "KV setup: %s", umbp_last_error());
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(i == 1 || i == 9 ? 100 + i : i), (uint64_t)(NB - 1 - i)};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_load(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0, "%s", umbp_last_error());
    cr_assert_eq(umbp_op_wait(op, TU_WAIT_MS), 0);
    cr_assert_eq(umbp_op_num_keys(op), KV_BLOCKS);
    for (size_t i = 0; i < KV_BLOCKS; i++)
        cr_assert_eq(umbp_op_key_status(op, i), i == 1 || i == 9 ? -ENOENT : 0, "key %zu: %s", i,
                     umbp_strerror(umbp_op_key_status(op, i)));
    cr_assert_eq(umbp_op_num_ok(op), KV_BLOCKS - 2);
    umbp_op_release(op);
    check_reversed_restore(&k, 1, 9);
    kv_close(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* The same, where registering the new pool with the GPU fails at first
 * (pinned memory short while the old pool is still pinned; the host
 * backend refuses while UMBP_GPU_HOST_PIN_FAIL is set): KV stores into it
 * fail, the registration is tried again a second later, and once it can
 * be the KV path carries on byte-exact.  Before, the failed registration
 * was never tried again: every KV transfer failed until the engine
 * restarted. */
static int64_t ms_until_put_works(umbp_runtime_t *rt);

Test(standalone, kv_registers_a_new_pool_again_after_a_failure)
{
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    setenv("UMBP_GPU_HOST_PIN_FAIL", "1", 1);
    tu_server_stop(&srv);
    start_server(NULL);
    cr_assert_geq(ms_until_put_works(k.rt), 0, "no put succeeded after the restart");
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(200 + i), (uint64_t)i};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_store(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0);
    int rc = kv_wait(op);
    cr_assert_eq(rc, UMBP_E_GPU_UNREGISTERED, "a KV store into an unregistered pool: %d (%s)",
                 rc, umbp_strerror(rc));
    unsetenv("UMBP_GPU_HOST_PIN_FAIL");
    rc = -1;
    for (int i = 0; i < 40 && rc != 0; i++) { /* tried again a second after the failure */
        tu_sleep_ms(100);
        for (int j = 0; j < KV_BLOCKS; j++)
            b[j] = (umbp_kv_block_t){kv_key(300 + 100 * i + j), (uint64_t)j};
        cr_assert_eq(umbp_kv_store(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0);
        rc = kv_wait(op);
    }
    cr_assert_eq(rc, 0, "KV stores still fail 4 s after the pool could be registered: %d (%s)",
                 rc, umbp_strerror(rc));
    for (int l = 0; l < L; l++)
        memset(k.dev[l], TU_POISON, LAYER_BYTES);
    cr_assert_eq(umbp_kv_load(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0);
    cr_assert_eq(kv_wait(op), 0);
    for (int l = 0; l < L; l++)
        for (int kvh = 0; kvh < 2; kvh++)
            for (int blk = 0; blk < KV_BLOCKS; blk++) {
                size_t at = ((size_t)kvh * NB + (size_t)blk) * CHUNK;
                for (size_t o = 0; o < CHUNK; o++)
                    cr_assert_eq(((uint8_t *)k.dev[l])[at + o], expected_byte(l, at + o),
                                 "layer %d block %d byte %zu", l, blk, o);
            }
    kv_close(&k);
    tu_check_leaks();
    tu_server_cleanup(&srv);
}

/* A server restarted without a named pool hands out a new pool: the KV
 * path registers it with the GPU and carries on (before, every transfer
 * failed with UMBP_E_GPU_UNREGISTERED until the engine restarted). */

Test(standalone, kv_survives_a_new_pool)
{
    start_server(NULL);
    struct kv_side k;
    cr_assert_eq(kv_open(&k, true), 0, "KV setup: %s", umbp_last_error());
    umbp_kv_block_t b[KV_BLOCKS];
    for (int i = 0; i < KV_BLOCKS; i++)
        b[i] = (umbp_kv_block_t){kv_key(i), (uint64_t)i};
    umbp_op_t *op;
    cr_assert_eq(umbp_kv_store(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0);
    cr_assert_eq(kv_wait(op), 0);
    tu_server_stop(&srv); /* SIGKILL: the pool goes with it */
    start_server(NULL);
    int64_t ms = ms_until_put_works(k.rt);
    cr_assert_geq(ms, 0, "no put succeeded after the restart");
    for (int i = 0; i < KV_BLOCKS; i++) /* the old objects are gone: store them anew */
        b[i] = (umbp_kv_block_t){kv_key(100 + i), (uint64_t)i};
    cr_assert_eq(umbp_kv_store(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0);
    int rc = kv_wait(op);
    cr_assert_eq(rc, 0, "KV store into the new pool: %d (%s)", rc, umbp_strerror(rc));
    /* poison the cache, load the blocks back, compare every byte */
    for (int l = 0; l < L; l++)
        memset(k.dev[l], TU_POISON, LAYER_BYTES);
    cr_assert_eq(umbp_kv_load(k.rt, k.kv, b, KV_BLOCKS, NULL, &op), 0);
    rc = kv_wait(op);
    cr_assert_eq(rc, 0, "KV load from the new pool: %d (%s)", rc, umbp_strerror(rc));
    for (int l = 0; l < L; l++) {
        const uint8_t *p = k.dev[l];
        for (int kvh = 0; kvh < 2; kvh++)
            for (int blk = 0; blk < KV_BLOCKS; blk++) {
                size_t at = ((size_t)kvh * NB + (size_t)blk) * CHUNK;
                for (size_t o = 0; o < CHUNK; o++)
                    cr_assert_eq(p[at + o], expected_byte(l, at + o), "layer %d block %d byte %zu",
                                 l, blk, o);
            }
    }
    kv_close(&k);
    tu_server_cleanup(&srv);
}

/* ---- the server killed under load ----------------------------------------------- */

struct load {
    umbp_runtime_t *rt;
    atomic_bool stop, restarted;
    _Atomic uint64_t ops, hung, torn, gets_ok, puts_ok, puts_ok_after;
    _Atomic uint64_t failed_statuses;
};

struct worker {
    struct load *ld;
    int id;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct load *ld = w->ld;
    for (uint64_t i = 0; !atomic_load(&ld->stop); i++) {
        umbp_key_t k = tu_key_id(0x77000 + (uint64_t)w->id, i);
        uint64_t size = size_of_id(i) / 4 + 1;
        int rc = put_key(ld->rt, k, size);
        bool after = atomic_load(&ld->restarted), bad = false;
        if (rc == 0) {
            atomic_fetch_add(&ld->puts_ok, 1);
            if (after)
                atomic_fetch_add(&ld->puts_ok_after, 1);
        }
        int g = get_key(ld->rt, k, size, &bad);
        uint8_t present;
        size_t prefix;
        umbp_lookup(ld->rt, &k, 1, &present, &prefix, 0); /* bounded by the API */
        atomic_fetch_add(&ld->ops, 3);
        if (rc == UMBP_E_INPROGRESS || g == UMBP_E_INPROGRESS)
            atomic_fetch_add(&ld->hung, 1);
        if (bad)
            atomic_fetch_add(&ld->torn, 1);
        if (g == 0)
            atomic_fetch_add(&ld->gets_ok, 1);
        if (rc != 0 || g != 0)
            atomic_fetch_add(&ld->failed_statuses, 1);
    }
    return NULL;
}

/* Puts until one succeeds; ms it took, or -1 after TU_WAIT_MS. */
static int64_t ms_until_put_works(umbp_runtime_t *rt)
{
    uint64_t t0 = tu_now_ms();
    for (uint64_t i = 0; tu_now_ms() - t0 < TU_WAIT_MS; i++) {
        if (put_key(rt, tu_key_id(0x88, i), 1000) == 0)
            return (int64_t)(tu_now_ms() - t0);
        tu_sleep_ms(1);
    }
    return -1;
}

Test(standalone, server_killed_under_load_then_restarted)
{
    start_server(NULL);
    struct load ld = {0};
    ld.rt = sa_create(", \"timeout_ms\": 3000, \"lookup_timeout_ms\": 500, "
                      "\"reconnect_max_ms\": 50, \"log_level\": \"warn\"");
    umbp_key_t before = tu_key_id(0x99, 1);
    cr_assert_eq(put_key(ld.rt, before, 5000), 0);
    enum { W = 4 };
    pthread_t th[W];
    struct worker w[W];
    for (int i = 0; i < W; i++) {
        w[i] = (struct worker){&ld, i};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    tu_sleep_ms(300);
    uint64_t ops_before_kill = atomic_load(&ld.ops);
    tu_server_stop(&srv); /* SIGKILL */
    tu_sleep_ms(100);
    /* down: lookups miss (an error or no hit, never a stale hit) */
    for (int i = 0; i < 5; i++) {
        uint8_t present = 7;
        size_t prefix = 7;
        int rc = umbp_lookup(ld.rt, &before, 1, &present, &prefix, 0);
        cr_assert(rc == 0 || rc == UMBP_E_NOT_ATTEMPTED || rc == UMBP_E_TIMEOUT ||
                  rc == -ECONNRESET, "lookup while down: %d (%s)", rc, umbp_strerror(rc));
        cr_assert_eq(prefix, 0, "a lookup hit while the server is down");
        cr_assert_eq(present, 0);
    }
    bool bad;
    int g = get_key(ld.rt, before, 5000, &bad);
    cr_assert_neq(g, 0, "a get succeeded while the server is down");
    tu_sleep_ms(200);
    /* a new server (a new, empty pool): the clients carry on */
    tu_server_start(&srv, "{\"capacity_bytes\": \"64MiB\", \"log_level\": \"error\"}");
    atomic_store(&ld.restarted, true);
    int64_t ms = ms_until_put_works(ld.rt);
    cr_assert_geq(ms, 0, "no put succeeded within %d ms of the new server", TU_WAIT_MS);
    cr_log_info("reconnected: first put succeeded %lld ms after the new server answered",
                (long long)ms);
    tu_sleep_ms(300);
    atomic_store(&ld.stop, true);
    for (int i = 0; i < W; i++)
        pthread_join(th[i], NULL);
    cr_log_info("%llu ops (%llu before the kill), %llu puts ok (%llu after the restart), "
                "%llu gets ok, %llu rounds with a failed status",
                (unsigned long long)atomic_load(&ld.ops), (unsigned long long)ops_before_kill,
                (unsigned long long)atomic_load(&ld.puts_ok),
                (unsigned long long)atomic_load(&ld.puts_ok_after),
                (unsigned long long)atomic_load(&ld.gets_ok),
                (unsigned long long)atomic_load(&ld.failed_statuses));
    cr_assert_eq(atomic_load(&ld.hung), 0, "operations that never completed");
    cr_assert_eq(atomic_load(&ld.torn), 0, "gets that said 0 with wrong bytes");
    cr_assert_gt(ops_before_kill, 0, "the workers did nothing before the kill");
    cr_assert_gt(atomic_load(&ld.puts_ok_after), 0, "no worker put succeeded after the restart");
    bool badb;
    umbp_key_t k2 = tu_key_id(0x99, 2);
    cr_assert_eq(put_key(ld.rt, k2, 70000), 0);
    cr_assert_eq(get_key(ld.rt, k2, 70000, &badb), 0);
    cr_assert(!badb);
    tu_destroy(ld.rt);
    tu_server_cleanup(&srv);
}

/* ---- a restarted server is found when its socket appears --------------------------- */

/* The file at fd, from its start, into buf (NUL-terminated). */
static void read_whole(int fd, char *buf, size_t len)
{
    ssize_t n = pread(fd, buf, len - 1, 0);
    buf[n > 0 ? n : 0] = 0;
}

static size_t count_in(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* Backoff alone (reconnect_max_ms 60000): attempts at 10, 30, 70, ... 2550,
 * 5110 ms after the loss.  The server comes back right after the 8th
 * failed attempt, so the backoff's next try is 2.5 s away: the reconnect
 * must come from the socket appearing (the directory watch), logged as
 * such, with no more than its quick retries failing before it. */
Test(standalone, reconnect_follows_the_socket_appearing)
{
    start_server(NULL);
    char logp[160], log[65536];
    snprintf(logp, sizeof(logp), "%s/client.log", srv.dir);
    int logfd = open(logp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(logfd, 0);
    int saved = dup(2);
    dup2(logfd, 2); /* the runtime logs to stderr */
    umbp_runtime_t *rt = sa_create(", \"log_level\": \"debug\", \"reconnect_max_ms\": 60000");
    cr_assert_eq(put_key(rt, tu_key_id(0x51, 0), 1000), 0);
    tu_server_stop(&srv);
    size_t failed = 0;
    for (uint64_t t0 = tu_now_ms(); failed < 8 && tu_now_ms() - t0 < TU_WAIT_MS;
         tu_sleep_ms(2)) {
        read_whole(logfd, log, sizeof(log));
        failed = count_in(log, "reconnect failed");
    }
    tu_server_start(&srv, NULL);
    int64_t ms = ms_until_put_works(rt);
    read_whole(logfd, log, sizeof(log));
    dup2(saved, 2);
    close(saved);
    tu_destroy(rt);
    close(logfd);
    cr_log_info("first put %lld ms after the new server answered", (long long)ms);
    cr_assert_eq(failed, 8, "the backoff's attempts were not logged:\n%s", log);
    cr_assert_geq(ms, 0, "no put succeeded after the restart");
    const char *line = strstr(log, "reconnected to umbp-server");
    cr_assert_not_null(line, "no reconnect logged:\n%s", log);
    const char *eol = strchr(line, '\n');
    cr_assert(eol && memmem(line, (size_t)(eol - line), "socket appeared", 15),
              "the reconnect did not come from the socket appearing: %.*s",
              (int)(eol ? eol - line : 200), line);
    size_t after = count_in(log, "reconnect failed") - failed;
    cr_log_info("%zu failed attempts after the restart (the quick retries allow 4)", after);
    cr_assert_leq(after, 4, "%zu attempts failed after the socket appeared:\n%s", after, log);
    tu_server_cleanup(&srv);
}

/* ---- a named pool survives the server -------------------------------------------- */

#define ADOPT_PER_WORKER 2500

struct adopt_worker {
    umbp_runtime_t *rt;
    int id;
    atomic_bool *killed;
    int status[ADOPT_PER_WORKER];
    bool before_kill[ADOPT_PER_WORKER];
    uint64_t hung, torn;
};

static uint64_t adopt_size(int id, int i) { return 1 + tu_splitmix64((uint64_t)id << 20 | (uint64_t)i) % (24 * KiB); }
static umbp_key_t adopt_key(int id, int i) { return tu_key_id(0xAD0 + (uint64_t)id, (uint64_t)i); }

static void *adopt_worker_main(void *arg)
{
    struct adopt_worker *w = arg;
    for (int i = 0; i < ADOPT_PER_WORKER; i++) {
        bool before = !atomic_load(w->killed);
        w->status[i] = put_key(w->rt, adopt_key(w->id, i), adopt_size(w->id, i));
        w->before_kill[i] = before && !atomic_load(w->killed);
        bool bad = false;
        int g = get_key(w->rt, adopt_key(w->id, i), adopt_size(w->id, i), &bad);
        w->hung += w->status[i] == UMBP_E_INPROGRESS || g == UMBP_E_INPROGRESS;
        w->torn += bad;
    }
    return NULL;
}

/* kill -9 of a server on a named pool with puts and gets in flight from 4
 * clients: no op hangs, no get returns wrong bytes, and the restarted
 * server adopts the pool: every object whose put returned 0 restores
 * byte-exact through the same clients, which reconnect on their own. */
Test(standalone, named_pool_survives_server_kill)
{
    char name[64], cfg[256];
    snprintf(name, sizeof(name), "umbp-test-adopt-%d", (int)getpid());
    snprintf(cfg, sizeof(cfg), "{\"capacity_bytes\": \"256MiB\", \"dram_shm_name\": \"%s\", "
             "\"log_level\": \"error\", \"adopt_grace_ms\": 100}", name);
    start_server(cfg);
    enum { W = 4 };
    atomic_bool killed = false;
    struct adopt_worker *w = calloc(W, sizeof(*w));
    pthread_t th[W];
    for (int i = 0; i < W; i++) {
        w[i] = (struct adopt_worker){.id = i, .killed = &killed};
        w[i].rt = sa_create(", \"timeout_ms\": 3000, \"lookup_timeout_ms\": 500, "
                            "\"reconnect_max_ms\": 50, \"log_level\": \"error\"");
        pthread_create(&th[i], NULL, adopt_worker_main, &w[i]);
    }
    tu_sleep_ms(60);
    atomic_store(&killed, true);
    tu_server_stop(&srv); /* SIGKILL, mid-load */
    tu_sleep_ms(100);
    uint64_t t0 = tu_now_ms();
    start_server(cfg);
    int64_t ms = ms_until_put_works(w[0].rt);
    cr_assert_geq(ms, 0, "no put succeeded after the restart");
    cr_log_info("first put %lld ms after the new server started answering (%llu ms after "
                "its start)", (long long)ms, (unsigned long long)(tu_now_ms() - t0));
    for (int i = 0; i < W; i++)
        pthread_join(th[i], NULL);
    size_t published = 0, restored = 0;
    for (int i = 0; i < W; i++) {
        cr_assert_eq(w[i].hung, 0, "worker %d: operations that never completed", i);
        cr_assert_eq(w[i].torn, 0, "worker %d: gets that said 0 with wrong bytes", i);
        for (int k = 0; k < ADOPT_PER_WORKER; k++) {
            if (w[i].status[k] != 0 || !w[i].before_kill[k])
                continue;
            published++;
            bool bad = false;
            int g = get_key(w[i].rt, adopt_key(i, k), adopt_size(i, k), &bad);
            cr_assert_eq(g, 0, "worker %d key %d, published before the kill, is gone after "
                         "the restart: %s", i, k, umbp_strerror(g));
            cr_assert(!bad, "worker %d key %d restored wrong bytes", i, k);
            restored++;
        }
    }
    cr_log_info("%zu objects published before the kill, %zu restored byte-exact after it",
                published, restored);
    cr_assert_gt(published, 0, "nothing was published before the kill");
    cr_assert_lt(published, (size_t)W * ADOPT_PER_WORKER, "the kill came after all the work");
    for (int i = 0; i < W; i++)
        tu_destroy(w[i].rt);
    free(w);
    tu_server_cleanup(&srv);
    tu_rm_named_pool(name);
}

/* An operator removed the named pool's file but kept its journal, and the
 * server restarted: the new pool is empty and another file.  It kept the
 * old pool id, so a client that stayed up kept its mapping of the old,
 * unlinked file while a new client mapped the new one: each read the
 * other's objects from different memory, with status 0. */
Test(standalone, a_named_pool_made_anew_is_remapped_by_every_client)
{
    char name[64], cfg[256], path[96];
    snprintf(name, sizeof(name), "umbp-test-anew-%d", (int)getpid());
    snprintf(cfg, sizeof(cfg), "{\"capacity_bytes\": \"64MiB\", \"dram_shm_name\": \"%s\", "
             "\"log_level\": \"error\"}", name);
    start_server(cfg);
    const char *extra = ", \"timeout_ms\": 3000, \"reconnect_max_ms\": 50";
    umbp_runtime_t *a = sa_create(extra);
    cr_assert_eq(put_key(a, tu_key_id(0xa9, 1), 64 * KiB), 0);
    tu_server_stop(&srv);
    snprintf(path, sizeof(path), "/%s", name);
    cr_assert_eq(shm_unlink(path), 0, "the pool file: %s", strerror(errno));
    start_server(cfg);
    cr_assert_geq(ms_until_put_works(a), 0, "no put succeeded after the restart");
    cr_assert_eq(put_key(a, tu_key_id(0xa9, 2), 64 * KiB), 0);
    umbp_runtime_t *b = sa_create(extra);
    bool bad = false;
    int rc = get_key(b, tu_key_id(0xa9, 2), 64 * KiB, &bad);
    cr_assert_eq(rc, 0, "a new client cannot read what a client that stayed up stored: %s",
                 umbp_strerror(rc));
    cr_assert(!bad, "a new client read other bytes than a client that stayed up stored");
    cr_assert_eq(put_key(b, tu_key_id(0xa9, 3), 64 * KiB), 0);
    rc = get_key(a, tu_key_id(0xa9, 3), 64 * KiB, &bad);
    cr_assert_eq(rc, 0, "%s", umbp_strerror(rc));
    cr_assert(!bad, "a client that stayed up read other bytes than a new client stored");
    rc = get_key(a, tu_key_id(0xa9, 1), 64 * KiB, &bad);
    cr_assert(rc != 0 || !bad, "an object of the removed pool was served with wrong bytes");
    tu_destroy(a);
    tu_destroy(b);
    tu_server_cleanup(&srv);
    tu_rm_named_pool(name);
}

/* ---- a put stops writing when it loses the server ---------------------------------- */

/* The server holds a region it granted only until the writer's declared
 * deadline; a client that lost the server must not keep copying into it
 * (the server may already have handed it to someone else).  The put's
 * source has one trapped page: the copy worker stalls there (a slow source
 * page), the server dies, the page is released, and the worker must stop at
 * its next chunk instead of copying the rest. */
#define TRAP_PAGE 4096

Test(standalone, a_put_stops_writing_when_it_loses_the_server)
{
    char name[64], cfg[256];
    snprintf(name, sizeof(name), "umbp-test-revoke-%d", (int)getpid());
    snprintf(cfg, sizeof(cfg), "{\"capacity_bytes\": \"64MiB\", \"dram_shm_name\": \"%s\", "
             "\"log_level\": \"error\"}", name);
    start_server(cfg);
    umbp_runtime_t *rt = sa_create(", \"copy_threads\": 1, \"timeout_ms\": 60000, "
                                   "\"reconnect_max_ms\": 50");
    const uint64_t size = 8 * MiB; /* 16 copy chunks of 512 KiB */
    uint8_t *src = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(src != MAP_FAILED);
    umbp_key_t k = tu_key_id(0x4e7, 1);
    tu_fill_from_key(&k, 0, src, size);
    tu_trap_pages(src + 512 * KiB + 8 * TRAP_PAGE, TRAP_PAGE); /* inside the second chunk */

    umbp_range_t rg = {.ptr = src, .len = size, .offset = 0};
    umbp_put_item_t it = {.key = k, .object_size = size, .ranges = &rg, .num_ranges = 1};
    umbp_op_t *op;
    cr_assert_eq(umbp_put(rt, &it, 1, &op), 0);
    tu_trap_wait_hit();
    tu_server_stop(&srv); /* SIGKILL while the copy is stalled */
    /* until the client has seen the connection drop (its lookups then fail
     * at once as not attempted; the revocation came first) */
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    for (;;) {
        size_t prefix;
        if (umbp_lookup(rt, &k, 1, NULL, &prefix, 0) == UMBP_E_NOT_ATTEMPTED)
            break;
        cr_assert(tu_now_ms() < end, "the client never noticed its server's death");
        tu_sleep_ms(5);
    }
    tu_trap_release();
    cr_assert_eq(umbp_op_wait(op, -1), 0);
    int st = umbp_op_key_status(op, 0);
    cr_assert_lt(st, 0, "a put that lost its server succeeded");
    umbp_op_release(op);

    /* the pool outlives its server: the first chunk is in it (so the scan
     * can see this put's bytes), nothing after the stalled chunk is */
    char path[96];
    snprintf(path, sizeof(path), "/dev/shm/%s", name);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    struct stat stt;
    cr_assert_eq(fstat(fd, &stt), 0);
    uint8_t *pool = mmap(NULL, (size_t)stt.st_size, PROT_READ, MAP_SHARED, fd, 0);
    cr_assert(pool != MAP_FAILED);
    cr_assert_not_null(memmem(pool, (size_t)stt.st_size, src, 256),
                       "the put's first chunk is not in the pool");
    for (uint64_t c = 2; c < size / (512 * KiB); c++)
        cr_assert_null(memmem(pool, (size_t)stt.st_size, src + c * 512 * KiB, 256),
                       "chunk %llu was written after the server was lost",
                       (unsigned long long)c);
    munmap(pool, (size_t)stt.st_size);
    close(fd);
    tu_destroy(rt);
    munmap(src, size);
    tu_server_cleanup(&srv);
    tu_rm_named_pool(name);
}

/* ---- the server stopped ----------------------------------------------------------- */

Test(standalone, server_stopped_lookups_bounded)
{
    start_server(NULL);
    umbp_runtime_t *rt = sa_create(", \"lookup_timeout_ms\": 100, \"timeout_ms\": 3000");
    enum { N = 8 };
    umbp_key_t k[N];
    for (int i = 0; i < N; i++) {
        k[i] = tu_key_id(0x5709, (uint64_t)i);
        cr_assert_eq(put_key(rt, k[i], 4096), 0);
    }
    size_t prefix;
    cr_assert_eq(umbp_lookup(rt, k, N, NULL, &prefix, 0), 0);
    cr_assert_eq(prefix, N);

    tu_server_signal(&srv, SIGSTOP);
    uint64_t t0 = tu_now_ms();
    int rc1 = umbp_lookup(rt, k, N, NULL, &prefix, 0);
    uint64_t first = tu_now_ms() - t0;
    cr_assert(rc1 == UMBP_E_TIMEOUT || rc1 == UMBP_E_NOT_ATTEMPTED,
              "lookup of a stopped server: %d (%s)", rc1, umbp_strerror(rc1));
    uint64_t worst = 0;
    for (int i = 0; i < 5; i++) {
        t0 = tu_now_ms();
        int rc = umbp_lookup(rt, k, N, NULL, &prefix, 0);
        uint64_t dt = tu_now_ms() - t0;
        worst = dt > worst ? dt : worst;
        cr_assert_eq(rc, UMBP_E_NOT_ATTEMPTED, "lookup %d while one is stuck: %d (%s)", i, rc,
                     umbp_strerror(rc));
        cr_assert_eq(prefix, 0);
    }
    cr_log_info("stopped server: first lookup returned after %llu ms (lookup_timeout_ms 100), "
                "the next ones after at most %llu ms", (unsigned long long)first,
                (unsigned long long)worst);
    tu_server_signal(&srv, SIGCONT);
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    int rc;
    while ((rc = umbp_lookup(rt, k, N, NULL, &prefix, 0)) != 0 || prefix != N) {
        cr_assert(tu_now_ms() < end, "lookups never recovered after SIGCONT: %d", rc);
        tu_sleep_ms(5);
    }
    bool bad;
    cr_assert_eq(get_key(rt, k[3], 4096, &bad), 0);
    cr_assert(!bad);
    tu_destroy(rt);
    tu_server_cleanup(&srv);
}

/* Calls that time out while the server is stopped: their late replies are
 * undone, so no reservation or lease stays behind once it runs again. */
static bool server_idle(const umbp_stats_t *s, void *arg)
{
    (void)arg;
    return s->num_pending == 0 && s->num_leased == 0;
}

Test(standalone, late_replies_are_undone)
{
    start_server(NULL);
    /* a generous lookup_timeout_ms keeps health() from refusing the calls
     * before they are sent; timeout_ms is their deadline */
    umbp_runtime_t *rt = sa_create(", \"lookup_timeout_ms\": 10000, \"timeout_ms\": 300");
    umbp_key_t have = tu_key_id(0x1a7e, 1), fresh = tu_key_id(0x1a7e, 2);
    cr_assert_eq(put_key(rt, have, 8192), 0);
    tu_server_signal(&srv, SIGSTOP);
    int rc = put_key(rt, fresh, 8192);
    cr_assert_eq(rc, UMBP_E_TIMEOUT, "put to a stopped server: %d (%s)", rc, umbp_strerror(rc));
    bool bad;
    rc = get_key(rt, have, 8192, &bad);
    cr_assert_eq(rc, UMBP_E_TIMEOUT, "get from a stopped server: %d (%s)", rc, umbp_strerror(rc));
    tu_server_signal(&srv, SIGCONT);
    umbp_stats_t s;
    cr_assert(tu_wait_stats(rt, server_idle, NULL, TU_WAIT_MS, &s),
              "late grants were not undone: %llu pending, %llu leased",
              (unsigned long long)s.num_pending, (unsigned long long)s.num_leased);
    cr_assert_eq(s.num_objects, 1, "the timed-out put was published anyway");
    size_t prefix;
    cr_assert_eq(umbp_lookup(rt, &fresh, 1, NULL, &prefix, 0), 0);
    cr_assert_eq(prefix, 0);
    /* and the key can be stored now */
    cr_assert_eq(put_key(rt, fresh, 8192), 0);
    cr_assert_eq(get_key(rt, fresh, 8192, &bad), 0);
    cr_assert(!bad);
    tu_destroy(rt);
    tu_server_cleanup(&srv);
}

/* Shutdown never hangs: destroy with calls outstanding at a stopped server. */
Test(standalone, destroy_while_server_stopped)
{
    start_server(NULL);
    umbp_runtime_t *rt = sa_create(", \"lookup_timeout_ms\": 10000, \"timeout_ms\": 500");
    umbp_key_t k = tu_key_id(0xde57, 1);
    cr_assert_eq(put_key(rt, k, 4096), 0);
    tu_server_signal(&srv, SIGSTOP);
    enum { N = 8 };
    umbp_op_t *op[N];
    uint8_t buf[N][4096];
    umbp_range_t r[N];
    for (int i = 0; i < N; i++) {
        r[i] = (umbp_range_t){buf[i], 4096, 0};
        if (i % 2) {
            umbp_get_item_t g = {k, &r[i], 1};
            cr_assert_eq(umbp_get(rt, &g, 1, &op[i]), 0);
        } else {
            umbp_put_item_t p = {tu_key_id(0xde57, 10 + (uint64_t)i), 4096, &r[i], 1};
            cr_assert_eq(umbp_put(rt, &p, 1, &op[i]), 0);
        }
    }
    uint64_t t0 = tu_now_ms();
    tu_destroy(rt); /* the ops' handles go with it */
    cr_log_info("destroy with %d ops at a stopped server took %llu ms (timeout_ms 500)", N,
                (unsigned long long)(tu_now_ms() - t0));
    tu_server_signal(&srv, SIGCONT);
    tu_server_cleanup(&srv);
}

/* role lookup: an engine's scheduler asks without a pool. */
Test(standalone, lookup_role_has_no_pool)
{
    start_server(NULL);
    umbp_runtime_t *w = sa_create(NULL);
    umbp_key_t k = tu_key_id(0x100c, 1);
    cr_assert_eq(put_key(w, k, 1000), 0);
    umbp_runtime_t *l = sa_create(", \"role\": \"lookup\"");
    size_t prefix;
    cr_assert_eq(umbp_lookup(l, &k, 1, NULL, &prefix, 0), 0);
    cr_assert_eq(prefix, 1, "the scheduler does not see the worker's object");
    cr_assert_eq(put_key(l, tu_key_id(0x100c, 2), 1000), -ENOTSUP);
    bool bad;
    cr_assert_eq(get_key(l, k, 1000, &bad), -ENOTSUP);
    tu_destroy(l);
    tu_destroy(w);
    tu_server_cleanup(&srv);
}

/* ---- creation ------------------------------------------------------------------------- */

Test(standalone, no_server_fails_naming_the_socket)
{
    const char *dir = tu_server_dir(&srv); /* nothing started there */
    umbp_runtime_t *rt = NULL;
    int rc = sa_try_create(&rt, NULL);
    cr_assert_lt(rc, 0);
    cr_assert_null(rt);
    cr_log_info("no server: %s", umbp_last_error());
    cr_assert_not_null(strstr(umbp_last_error(), srv.sock), "message does not name %s: %s",
                       srv.sock, umbp_last_error());
    cr_assert_not_null(strstr(umbp_last_error(), "auto_start"), "message: %s", umbp_last_error());
    /* auto_start with a binary that does not exist names server_path */
    char extra[768];
    snprintf(extra, sizeof(extra), ", \"auto_start\": true, \"server_path\": \"%s/none\", "
             "\"startup_timeout_ms\": 3000", dir);
    rc = sa_try_create(&rt, extra);
    cr_assert_lt(rc, 0);
    cr_log_info("bad server_path: %s", umbp_last_error());
    cr_assert_not_null(strstr(umbp_last_error(), "server_path"), "message: %s", umbp_last_error());
    /* a server that dies at once (as one whose shared libraries this host
     * lacks does, in the dynamic loader): the error quotes its last words */
    char script[512];
    snprintf(script, sizeof(script), "%s/dies", dir);
    FILE *f = fopen(script, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\necho 'starting' >&2\n"
               "echo 'umbp-server: error while loading shared libraries: libumbp_fake.so.1: "
               "cannot open shared object file: No such file or directory' >&2\nexit 127\n");
    fclose(f);
    cr_assert_eq(chmod(script, 0755), 0);
    snprintf(extra, sizeof(extra), ", \"auto_start\": true, \"server_path\": \"%s\", "
             "\"startup_timeout_ms\": 3000", script);
    rc = sa_try_create(&rt, extra);
    cr_assert_lt(rc, 0);
    cr_log_info("a server that dies: %s", umbp_last_error());
    cr_assert_not_null(strstr(umbp_last_error(), "libumbp_fake.so.1: cannot open shared object "
                              "file"), "message: %s", umbp_last_error());
    cr_assert_null(strstr(umbp_last_error(), "starting"), "not the last line: %s",
                   umbp_last_error());
    /* one that dies saying nothing: the log's earlier lines are another
     * server's, never quoted as this one's */
    f = fopen(script, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\nexit 1\n");
    fclose(f);
    rc = sa_try_create(&rt, extra);
    cr_assert_lt(rc, 0);
    cr_log_info("a server that dies silently: %s", umbp_last_error());
    cr_assert_null(strstr(umbp_last_error(), "libumbp_fake"), "an earlier server's line quoted: %s",
                   umbp_last_error());
    cr_assert_not_null(strstr(umbp_last_error(), "auto_start: umbp-server"), "message: %s",
                       umbp_last_error());
    tu_server_cleanup(&srv);
}

/* ---- refused clients are told why ------------------------------------------------------ */

#define NOBODY 65534

static bool become_nobody(void)
{
    return setgroups(0, NULL) == 0 && setresgid(NOBODY, NOBODY, NOBODY) == 0 &&
           setresuid(NOBODY, NOBODY, NOBODY) == 0;
}

/* As uid/gid 65534: creation must fail; its message goes up the pipe. */
static int child_create_as_nobody(void *arg)
{
    int msg = *(int *)arg;
    if (!become_nobody())
        return 4;
    umbp_runtime_t *rt = NULL;
    int rc = sa_try_create(&rt, NULL);
    const char *m = rc == 0 ? "(created)" : umbp_last_error();
    if (write(msg, m, strlen(m)) < 0)
        return 5;
    if (rc == 0)
        umbp_runtime_destroy(rt);
    return rc == 0 ? 1 : 0;
}

/* Runs child_create_as_nobody; its exit status, its message in msg. */
static int create_as_nobody(char *msg, size_t len)
{
    int p[2];
    cr_assert_eq(pipe2(p, O_NONBLOCK), 0);
    int rc = in_child(child_create_as_nobody, &p[1]);
    ssize_t n = read(p[0], msg, len - 1);
    msg[n > 0 ? n : 0] = 0;
    close(p[0]);
    close(p[1]);
    return rc;
}

Test(standalone, refused_clients_are_told_why)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to run a client as uid %d", NOBODY);
    char msg[1024];
    /* the socket directory is 0700 root: the file system keeps uid 65534 out */
    start_server(NULL);
    cr_assert_eq(chmod(srv.dir, 0700), 0);
    cr_assert_eq(create_as_nobody(msg, sizeof(msg)), 0, "as uid %d: %s", NOBODY, msg);
    cr_log_info("socket_dir 0700 root: %s", msg);
    cr_assert_not_null(strstr(msg, "permission denied on the socket directory"), "%s", msg);
    cr_assert_not_null(strstr(msg, srv.dir), "does not name %s: %s", srv.dir, msg);
    cr_assert_not_null(strstr(msg, "mode 0700"), "%s", msg);
    tu_server_cleanup(&srv);
    memset(&srv, 0, sizeof(srv));

    /* the group may reach the socket, but allowed_uids leaves 65534 out */
    start_server("{\"capacity_bytes\": \"16MiB\", \"log_level\": \"error\", "
                 "\"socket_group\": \"65534\", \"allowed_uids\": \"1\"}");
    cr_assert_eq(create_as_nobody(msg, sizeof(msg)), 0, "as uid %d: %s", NOBODY, msg);
    cr_log_info("allowed_uids 1: %s", msg);
    cr_assert_not_null(strstr(msg, "uid 65534 (gid 65534) is not in allowed_uids"), "%s", msg);
    cr_assert_not_null(strstr(msg, srv.sock), "does not name %s: %s", srv.sock, msg);
    tu_server_cleanup(&srv);
    memset(&srv, 0, sizeof(srv));
}

/* A client of uid 65534 that was let in, and the next server does not let
 * it in: its reconnect log line carries the server's reason. */
Test(standalone, refused_reconnect_logs_why)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to run a client as uid %d", NOBODY);
    start_server("{\"capacity_bytes\": \"16MiB\", \"log_level\": \"error\", "
                 "\"socket_group\": \"65534\", \"allowed_uids\": \"65534\"}");
    char logp[160];
    snprintf(logp, sizeof(logp), "%s.client.log", srv.dir); /* beside the dir, root's */
    int logfd = open(logp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(logfd, 0);
    int up[2], go[2];
    cr_assert_eq(pipe2(up, O_CLOEXEC), 0); /* not inherited by the servers */
    cr_assert_eq(pipe2(go, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(up[0]);
        close(go[1]);
        dup2(logfd, 2);
        umbp_runtime_t *rt = NULL;
        int rc = become_nobody() ? sa_try_create(&rt, ", \"log_level\": \"warn\", "
                                                 "\"reconnect_max_ms\": 20") : -1;
        char c = rc == 0 ? 'y' : 'n';
        if (write(up[1], &c, 1) < 0 || rc != 0)
            _exit(2);
        while (read(go[0], &c, 1) < 0 && errno == EINTR) /* EOF: done */
            ;
        umbp_runtime_destroy(rt);
        _exit(0);
    }
    close(up[1]);
    close(go[0]);
    char c = 0;
    cr_assert_eq(read(up[0], &c, 1), 1);
    cr_assert_eq(c, 'y', "uid %d could not attach while allowed", NOBODY);
    tu_server_stop(&srv);
    tu_server_start(&srv, "{\"capacity_bytes\": \"16MiB\", \"log_level\": \"error\", "
                    "\"socket_group\": \"65534\", \"allowed_uids\": \"1\"}");
    char log[8192] = "";
    const char *line = NULL;
    for (uint64_t t0 = tu_now_ms(); !line && tu_now_ms() - t0 < TU_WAIT_MS; tu_sleep_ms(5)) {
        ssize_t n = pread(logfd, log, sizeof(log) - 1, 0);
        log[n > 0 ? n : 0] = 0;
        line = strstr(log, "reconnect failed: umbp-server at");
    }
    close(go[1]); /* the child destroys its runtime and exits */
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    close(up[0]);
    close(logfd);
    unlink(logp);
    cr_log_info("client log:\n%s", log);
    cr_assert_not_null(line, "no reconnect line naming the refusal in the client's log");
    const char *eol = strchr(line, '\n');
    cr_assert_not_null(strstr(line, "is not in allowed_uids"), "%.*s",
                       (int)(eol ? eol - line : 200), line);
    cr_assert(eol && memmem(line, (size_t)(eol - line), "allowed_uids", 12),
              "the refusal is not on the reconnect line: %.*s", (int)(eol ? eol - line : 200),
              line);
    tu_server_cleanup(&srv);
    memset(&srv, 0, sizeof(srv));
}

/* pids of running umbp-server processes whose command line names dir. */
static size_t servers_in(const char *dir, pid_t *pids, size_t max)
{
    size_t n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], cmd[4096], state = 0;
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        int ok = fscanf(f, "%*d %*s %c", &state);
        fclose(f);
        if (ok != 1 || state == 'Z')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        f = fopen(path, "r");
        size_t len = f ? fread(cmd, 1, sizeof(cmd) - 1, f) : 0;
        if (f)
            fclose(f);
        cmd[len] = 0;
        const char *argv0 = strrchr(cmd, '/') ? strrchr(cmd, '/') + 1 : cmd;
        bool is_server = len && strcmp(argv0, "umbp-server") == 0;
        for (size_t i = 0; i + 1 < len; i++)
            if (!cmd[i])
                cmd[i] = ' ';
        if (is_server && strstr(cmd, dir) && n < max)
            pids[n++] = (pid_t)atoi(e->d_name);
    }
    if (d)
        closedir(d);
    return n;
}

struct starter {
    int gate; /* read end: closed by the parent to start everyone at once */
    int index;
};

static int child_auto_start(void *arg)
{
    struct starter *s = arg;
    char c;
    if (read(s->gate, &c, 1) < 0)
        return 4;
    char extra[512];
    snprintf(extra, sizeof(extra), ", \"auto_start\": true, \"server_path\": \"%s\", "
             "\"capacity_bytes\": \"16MiB\", \"startup_timeout_ms\": 30000",
#ifdef UMBP_SERVER_BIN
             UMBP_SERVER_BIN
#else
             "umbp-server"
#endif
    );
    umbp_runtime_t *rt;
    if (sa_try_create(&rt, extra) != 0) {
        fprintf(stderr, "creator %d: %s\n", s->index, umbp_last_error());
        return 2;
    }
    int rc = put_key(rt, tu_key_id(0xa5a5, (uint64_t)s->index), 3000);
    umbp_runtime_destroy(rt);
    return rc == 0 ? 0 : 3;
}

Test(standalone, auto_start_from_eight_processes_starts_one_server)
{
    need_server();
    const char *dir = tu_server_dir(&srv);
    enum { P = 8 };
    int gate[2];
    cr_assert_eq(pipe(gate), 0);
    pid_t kids[P];
    for (int i = 0; i < P; i++) {
        kids[i] = fork();
        cr_assert_geq(kids[i], 0);
        if (kids[i] == 0) {
            close(gate[1]);
            struct starter s = {gate[0], i};
            _exit(child_auto_start(&s));
        }
    }
    close(gate[0]);
    close(gate[1]); /* everyone's read returns now */
    int failed = 0;
    for (int i = 0; i < P; i++) {
        int st;
        while (waitpid(kids[i], &st, 0) < 0 && errno == EINTR)
            ;
        failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    pid_t pids[16];
    size_t n = servers_in(dir, pids, 16);
    /* the server outlives its starters; check the objects and stop it */
    umbp_runtime_t *rt = NULL;
    int rc = n ? sa_try_create(&rt, NULL) : -1;
    size_t prefix = 0;
    if (rc == 0) {
        umbp_key_t k[P];
        for (int i = 0; i < P; i++)
            k[i] = tu_key_id(0xa5a5, (uint64_t)i);
        umbp_lookup(rt, k, P, NULL, &prefix, 0);
        umbp_runtime_destroy(rt);
    }
    for (size_t i = 0; i < n; i++)
        kill(pids[i], SIGKILL);
    cr_assert_eq(failed, 0, "%d of %d creators with auto_start failed", failed, P);
    cr_assert_eq(n, 1, "%zu umbp-server processes serve %s, want exactly 1", n, dir);
    cr_assert_eq(prefix, P, "the one server holds %zu of the %d objects", prefix, P);
    tu_server_cleanup(&srv);
}
