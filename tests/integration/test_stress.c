/*
 * test_stress.c - concurrent puts, gets, lookups and clears on one runtime
 * whose pool is small enough that eviction never stops.
 *
 * Every object's bytes are derived from its key (test_util.h), so any thread
 * can check any get byte for byte without shared state.  A get may miss (the
 * object was evicted or cleared) but a key with status 0 must hold exactly
 * the object's bytes in every range: one torn or stale byte fails the test.
 * Counters kept by the threads must also agree with the runtime's own.
 *
 * Worker threads never call Criterion assertions (not thread safe); they
 * count, and the main thread asserts.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "umbp/umbp.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define KEY_SPACE 0x5757ull

struct stress_cfg {
    const char *name;
    int threads;
    uint64_t min_size, max_size;    /* object sizes, derived from the key */
    uint32_t min_batch, max_batch;
    uint64_t keyspace;
    uint64_t target_gets;           /* stop once this many gets succeeded ... */
    uint64_t max_iters;             /* ... or each thread did this many rounds */
    unsigned clear_every_ms;        /* 0: no clearing thread */
};

struct stress {
    const struct stress_cfg *cfg;
    umbp_runtime_t *rt;
    uint64_t seed;
    atomic_bool stop;
    /* counts */
    _Atomic uint64_t gets_ok, gets_miss, gets_stale, gets_keys, get_bytes;
    _Atomic uint64_t puts_keys, puts_ok, puts_nospace;
    _Atomic uint64_t lookups, lookup_keys, lookup_hits;
    _Atomic uint64_t lookup_timeouts, lookup_timeout_keys, lookup_skipped;
    _Atomic uint64_t op_timeouts; /* keys with UMBP_E_TIMEOUT (bounded, allowed) */
    _Atomic uint64_t clears, eagain;
    /* failures */
    _Atomic uint64_t torn, bad_status, bad_submit, bad_lookup, hung;
    pthread_mutex_t msg_lock;
    char first_failure[512];
};

static void fail_note(struct stress *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_note(struct stress *s, const char *fmt, ...)
{
    pthread_mutex_lock(&s->msg_lock);
    if (!s->first_failure[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->first_failure, sizeof(s->first_failure), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&s->msg_lock);
}

static uint64_t obj_size(const struct stress_cfg *c, uint64_t id)
{
    return c->min_size + tu_splitmix64(id * 7919 + 17) % (c->max_size - c->min_size + 1);
}

/* Waits for op; -1 (and counts a hang) if it does not complete. */
static int wait_op(struct stress *s, umbp_op_t *op)
{
    if (umbp_op_wait(op, TU_WAIT_MS) != 0) {
        atomic_fetch_add(&s->hung, 1);
        fail_note(s, "an operation did not complete within %d ms", TU_WAIT_MS);
        return -1;
    }
    return 0;
}

/* Submits with retry on back-pressure (not expected with the defaults). */
static int submit_put(struct stress *s, umbp_put_item_t *it, size_t n, umbp_op_t **op)
{
    int rc;
    while ((rc = umbp_put(s->rt, it, n, op)) == -EAGAIN) {
        atomic_fetch_add(&s->eagain, 1);
        tu_sleep_ms(1);
    }
    return rc;
}

static int submit_get(struct stress *s, umbp_get_item_t *it, size_t n, umbp_op_t **op)
{
    int rc;
    while ((rc = umbp_get(s->rt, it, n, op)) == -EAGAIN) {
        atomic_fetch_add(&s->eagain, 1);
        tu_sleep_ms(1);
    }
    return rc;
}

struct worker {
    struct stress *s;
    int idx;
    struct tu_rng r;
    uint64_t *ids;
    umbp_key_t *keys;
    uint8_t **src, **dst;
    umbp_range_t (*rg)[4];
    umbp_put_item_t *pit;
    umbp_get_item_t *git;
    uint8_t *present;
};

static void pick_ids(struct worker *w, uint32_t n, bool recent_bias)
{
    const struct stress_cfg *c = w->s->cfg;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id;
        bool dup;
        do {
            id = tu_rng_below(&w->r, c->keyspace);
            if (recent_bias && i > 0 && tu_rng_below(&w->r, 2))
                id = (w->ids[i - 1] + 1) % c->keyspace; /* runs of neighbours */
            dup = false;
            for (uint32_t j = 0; j < i; j++)
                dup = dup || w->ids[j] == id;
        } while (dup);
        w->ids[i] = id;
        w->keys[i] = tu_key_id(KEY_SPACE, id);
    }
}

static void do_put(struct worker *w, uint32_t n)
{
    struct stress *s = w->s;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t size = obj_size(s->cfg, w->ids[i]);
        tu_fill_from_key(&w->keys[i], 0, w->src[i], size);
        uint32_t nr = tu_tile(&w->r, w->src[i], size, (uint32_t)tu_rng_between(&w->r, 1, 4),
                              w->rg[i]);
        w->pit[i] = (umbp_put_item_t){w->keys[i], size, w->rg[i], nr};
    }
    umbp_op_t *op;
    int rc = submit_put(s, w->pit, n, &op);
    if (rc != 0) {
        atomic_fetch_add(&s->bad_submit, 1);
        fail_note(s, "umbp_put submit: %d (%s)", rc, umbp_strerror(rc));
        return;
    }
    if (wait_op(s, op) < 0)
        return; /* the op still reads src: leak it rather than free under it */
    for (uint32_t i = 0; i < n; i++) {
        int st = umbp_op_key_status(op, i);
        if (st == 0)
            atomic_fetch_add(&s->puts_ok, 1);
        else if (st == -ENOSPC)
            atomic_fetch_add(&s->puts_nospace, 1);
        else if (st == UMBP_E_TIMEOUT)
            atomic_fetch_add(&s->op_timeouts, 1);
        else {
            atomic_fetch_add(&s->bad_status, 1);
            fail_note(s, "put status %d (%s)", st, umbp_strerror(st));
        }
    }
    atomic_fetch_add(&s->puts_keys, n);
    umbp_op_release(op);
}

/* 1-4 disjoint random sub-ranges of [0, size), shuffled; each lands at its
 * own offset inside dst so ranges never share destination bytes. */
static uint32_t random_get_ranges(struct tu_rng *r, uint8_t *dst, uint64_t size,
                                  umbp_range_t *out)
{
    uint32_t want = (uint32_t)tu_rng_between(r, 1, 4);
    uint64_t cuts[8];
    uint32_t nc = want * 2;
    for (uint32_t i = 0; i < nc; i++)
        cuts[i] = tu_rng_below(r, size + 1);
    for (uint32_t a = 1; a < nc; a++)
        for (uint32_t b = a; b > 0 && cuts[b] < cuts[b - 1]; b--) {
            uint64_t t = cuts[b];
            cuts[b] = cuts[b - 1];
            cuts[b - 1] = t;
        }
    uint32_t n = 0;
    for (uint32_t i = 0; i + 1 < nc; i += 2)
        if (cuts[i + 1] > cuts[i])
            out[n++] = (umbp_range_t){dst + cuts[i], cuts[i + 1] - cuts[i], cuts[i]};
    if (n == 0)
        out[n++] = (umbp_range_t){dst, size, 0};
    for (uint32_t a = n; a > 1; a--) {
        uint32_t b = (uint32_t)tu_rng_below(r, a);
        umbp_range_t t = out[a - 1];
        out[a - 1] = out[b];
        out[b] = t;
    }
    return n;
}

static void do_get(struct worker *w, uint32_t n)
{
    struct stress *s = w->s;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t size = obj_size(s->cfg, w->ids[i]);
        tu_poison(w->dst[i], size);
        uint32_t nr = random_get_ranges(&w->r, w->dst[i], size, w->rg[i]);
        w->git[i] = (umbp_get_item_t){w->keys[i], w->rg[i], nr};
    }
    umbp_op_t *op;
    int rc = submit_get(s, w->git, n, &op);
    if (rc != 0) {
        atomic_fetch_add(&s->bad_submit, 1);
        fail_note(s, "umbp_get submit: %d (%s)", rc, umbp_strerror(rc));
        return;
    }
    if (wait_op(s, op) < 0)
        return;
    uint64_t ok = 0, bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        int st = umbp_op_key_status(op, i);
        if (st == -ENOENT) {
            atomic_fetch_add(&s->gets_miss, 1);
            continue;
        }
        if (st == UMBP_E_STALE) {
            atomic_fetch_add(&s->gets_stale, 1);
            continue;
        }
        if (st == UMBP_E_TIMEOUT) {
            atomic_fetch_add(&s->op_timeouts, 1);
            continue;
        }
        if (st != 0) {
            atomic_fetch_add(&s->bad_status, 1);
            fail_note(s, "get status %d (%s)", st, umbp_strerror(st));
            continue;
        }
        for (uint32_t k = 0; k < w->git[i].num_ranges; k++) {
            const umbp_range_t *g = &w->git[i].ranges[k];
            size_t d = tu_check_from_key(&w->keys[i], g->offset, g->ptr, g->len);
            if (d != SIZE_MAX) {
                atomic_fetch_add(&s->torn, 1);
                fail_note(s,
                          "key id %llu (size %llu): status 0 but byte %llu differs "
                          "(range %llu+%llu)",
                          (unsigned long long)w->ids[i],
                          (unsigned long long)obj_size(s->cfg, w->ids[i]),
                          (unsigned long long)(g->offset + d), (unsigned long long)g->offset,
                          (unsigned long long)g->len);
                break;
            }
            bytes += g->len;
        }
        ok++;
    }
    atomic_fetch_add(&s->gets_ok, ok);
    atomic_fetch_add(&s->gets_keys, n);
    atomic_fetch_add(&s->get_bytes, bytes);
    umbp_op_release(op);
}

static void do_lookup(struct worker *w, uint32_t n)
{
    struct stress *s = w->s;
    size_t prefix = SIZE_MAX;
    memset(w->present, 0x77, n);
    int rc = umbp_lookup(s->rt, w->keys, n, w->present, &prefix, (n & 1) ? UMBP_LOOKUP_TOUCH : 0);
    if (rc == -EAGAIN) {
        atomic_fetch_add(&s->eagain, 1);
        return;
    }
    /* bounded by lookup_timeout_ms: under load a lookup may time out, and
     * while one is stuck the next ones miss at once without asking */
    if (rc == UMBP_E_TIMEOUT) {
        atomic_fetch_add(&s->lookup_timeouts, 1);
        atomic_fetch_add(&s->lookup_timeout_keys, n);
        return;
    }
    if (rc == UMBP_E_NOT_ATTEMPTED) {
        atomic_fetch_add(&s->lookup_skipped, 1);
        return;
    }
    if (rc != 0) {
        atomic_fetch_add(&s->bad_lookup, 1);
        fail_note(s, "umbp_lookup: %d (%s)", rc, umbp_strerror(rc));
        return;
    }
    size_t lead = 0, hits = 0;
    while (lead < n && w->present[lead] == 1)
        lead++;
    for (uint32_t i = 0; i < n; i++) {
        if (w->present[i] > 1) {
            atomic_fetch_add(&s->bad_lookup, 1);
            fail_note(s, "lookup present[%u] = %u", i, w->present[i]);
            return;
        }
        hits += w->present[i];
    }
    if (prefix != lead) {
        atomic_fetch_add(&s->bad_lookup, 1);
        fail_note(s, "lookup prefix_len %zu but %zu leading keys present", prefix, lead);
    }
    atomic_fetch_add(&s->lookups, 1);
    atomic_fetch_add(&s->lookup_keys, n);
    atomic_fetch_add(&s->lookup_hits, hits);
}

static bool should_stop(struct stress *s, uint64_t iter)
{
    const struct stress_cfg *c = s->cfg;
    if (atomic_load(&s->stop))
        return true;
    if (c->target_gets && atomic_load(&s->gets_ok) >= c->target_gets)
        return true;
    if (iter >= c->max_iters)
        return true;
    /* a pile of failures is enough to report */
    return atomic_load(&s->torn) + atomic_load(&s->bad_status) + atomic_load(&s->hung) > 100;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct stress *s = w->s;
    const struct stress_cfg *c = s->cfg;
    for (uint64_t iter = 0; !should_stop(s, iter); iter++) {
        uint32_t n = (uint32_t)tu_rng_between(&w->r, c->min_batch, c->max_batch);
        pick_ids(w, n, true);
        do_put(w, n);
        do_get(w, n);       /* mostly hits: just written */
        pick_ids(w, n, false);
        do_lookup(w, n);
        if (iter % 4 == 3)
            do_get(w, n);   /* random keys: many misses */
    }
    return NULL;
}

static void *clearer_main(void *arg)
{
    struct stress *s = arg;
    while (!atomic_load(&s->stop)) {
        tu_sleep_ms(s->cfg->clear_every_ms);
        if (atomic_load(&s->stop))
            break;
        int rc = umbp_clear(s->rt);
        if (rc == 0)
            atomic_fetch_add(&s->clears, 1);
        else if (rc != -EAGAIN) {
            atomic_fetch_add(&s->bad_status, 1);
            fail_note(s, "umbp_clear: %d (%s)", rc, umbp_strerror(rc));
        }
    }
    return NULL;
}

static void run_stress(const struct stress_cfg *c, const char *json)
{
    struct stress *s = calloc(1, sizeof(*s));
    s->cfg = c;
    s->seed = tu_time_seed();
    pthread_mutex_init(&s->msg_lock, NULL);
    cr_log_info("%s: seed %llu", c->name, (unsigned long long)s->seed);
    s->rt = tu_create("%s", json);

    struct worker *w = calloc((size_t)c->threads, sizeof(*w));
    pthread_t *th = calloc((size_t)c->threads, sizeof(*th));
    for (int t = 0; t < c->threads; t++) {
        w[t].s = s;
        w[t].idx = t;
        tu_rng_seed(&w[t].r, s->seed + (uint64_t)t * 1000003);
        w[t].ids = calloc(c->max_batch, sizeof(uint64_t));
        w[t].keys = calloc(c->max_batch, sizeof(umbp_key_t));
        w[t].src = calloc(c->max_batch, sizeof(uint8_t *));
        w[t].dst = calloc(c->max_batch, sizeof(uint8_t *));
        w[t].rg = calloc(c->max_batch, sizeof(*w[t].rg));
        w[t].pit = calloc(c->max_batch, sizeof(umbp_put_item_t));
        w[t].git = calloc(c->max_batch, sizeof(umbp_get_item_t));
        w[t].present = calloc(c->max_batch, 1);
        for (uint32_t i = 0; i < c->max_batch; i++) {
            w[t].src[i] = malloc(c->max_size);
            w[t].dst[i] = malloc(c->max_size);
        }
    }
    uint64_t t0 = tu_now_ms();
    for (int t = 0; t < c->threads; t++)
        cr_assert_eq(pthread_create(&th[t], NULL, worker_main, &w[t]), 0);
    pthread_t clearer;
    if (c->clear_every_ms)
        cr_assert_eq(pthread_create(&clearer, NULL, clearer_main, s), 0);
    for (int t = 0; t < c->threads; t++)
        pthread_join(th[t], NULL);
    atomic_store(&s->stop, true);
    if (c->clear_every_ms)
        pthread_join(clearer, NULL);
    uint64_t ms = tu_now_ms() - t0;

    cr_assert_eq(umbp_flush(s->rt, TU_WAIT_MS), 0);
    umbp_stats_t st = tu_stats(s->rt);
    fprintf(stderr,
            "%s: %llu ms, %d threads: gets %llu ok (%llu MiB verified) / %llu keys, %llu miss, "
            "%llu stale; puts %llu keys, %llu ok, %llu no-space; lookups %llu (%llu keys, %llu "
            "hits, %llu timed out, %llu skipped); timeouts %llu; clears %llu; evictions %llu (%llu MiB); leases expired %llu; -EAGAIN %llu; "
            "torn %llu, bad status %llu, bad submit %llu, bad lookup %llu, hung %llu\n",
            c->name, (unsigned long long)ms, c->threads,
            (unsigned long long)s->gets_ok, (unsigned long long)(s->get_bytes / MiB),
            (unsigned long long)s->gets_keys, (unsigned long long)s->gets_miss,
            (unsigned long long)s->gets_stale, (unsigned long long)s->puts_keys,
            (unsigned long long)s->puts_ok, (unsigned long long)s->puts_nospace,
            (unsigned long long)s->lookups, (unsigned long long)s->lookup_keys,
            (unsigned long long)s->lookup_hits, (unsigned long long)s->lookup_timeouts,
            (unsigned long long)s->lookup_skipped, (unsigned long long)s->op_timeouts,
            (unsigned long long)s->clears,
            (unsigned long long)st.evictions, (unsigned long long)(st.evicted_bytes / MiB),
            (unsigned long long)st.leases_expired, (unsigned long long)s->eagain,
            (unsigned long long)s->torn, (unsigned long long)s->bad_status,
            (unsigned long long)s->bad_submit, (unsigned long long)s->bad_lookup,
            (unsigned long long)s->hung);

    cr_assert_eq(s->hung, 0, "%s", s->first_failure);
    cr_assert_eq(s->torn, 0, "%llu gets returned status 0 with wrong bytes; first: %s",
                 (unsigned long long)s->torn, s->first_failure);
    cr_assert_eq(s->bad_status + s->bad_submit + s->bad_lookup, 0, "%s", s->first_failure);
    if (c->target_gets)
        cr_assert_geq(s->gets_ok, c->target_gets, "only %llu successful gets",
                      (unsigned long long)s->gets_ok);
    cr_assert_gt(s->gets_ok, 0, "no get ever succeeded");
    cr_assert_gt(st.evictions, 0, "the pool never evicted: the test did not stress eviction");
    /* the runtime's counters agree with what the threads saw (a lookup that
     * timed out for its caller still completes, and counts, in the runtime) */
    cr_assert_eq(st.gets_ok, s->gets_ok);
    cr_assert_eq(st.gets_miss, s->gets_miss);
    cr_assert_geq(st.gets_failed, s->gets_stale);
    cr_assert_eq(st.puts_ok + st.puts_existing + st.puts_failed, s->puts_keys);
    cr_assert_geq(st.puts_failed, s->puts_nospace);
    cr_assert_eq(st.gets_failed + st.puts_failed, s->gets_stale + s->puts_nospace + s->op_timeouts);
    cr_assert_eq(st.lookups, s->lookups + s->lookup_timeouts);
    cr_assert_eq(st.lookup_keys, s->lookup_keys + s->lookup_timeout_keys);
    cr_assert_geq(st.lookup_hits, s->lookup_hits);
    cr_assert_eq(st.num_pending, 0);
    cr_assert_eq(st.num_leased, 0);
    cr_assert_leq(st.used_bytes, st.capacity_bytes);

    /* what is left is intact */
    uint8_t *buf = malloc(c->max_size);
    size_t checked = 0;
    for (uint64_t id = 0; id < c->keyspace; id++) {
        umbp_key_t k = tu_key_id(KEY_SPACE, id);
        uint64_t size = obj_size(c, id);
        int rc = tu_get_whole(s->rt, k, buf, size);
        if (rc == -ENOENT)
            continue;
        cr_assert_eq(rc, 0, "final get of id %llu: %d", (unsigned long long)id, rc);
        cr_assert_eq(tu_check_from_key(&k, 0, buf, size), SIZE_MAX, "final get of id %llu torn",
                     (unsigned long long)id);
        checked++;
    }
    st = tu_stats(s->rt);
    cr_assert_eq(checked, st.num_objects);
    free(buf);

    tu_destroy(s->rt);
    for (int t = 0; t < c->threads; t++) {
        for (uint32_t i = 0; i < c->max_batch; i++) {
            free(w[t].src[i]);
            free(w[t].dst[i]);
        }
        free(w[t].ids);
        free(w[t].keys);
        free(w[t].src);
        free(w[t].dst);
        free(w[t].rg);
        free(w[t].pit);
        free(w[t].git);
        free(w[t].present);
    }
    free(w);
    free(th);
    pthread_mutex_destroy(&s->msg_lock);
    free(s);
}

/* One million verified gets of 4-16 KiB objects, 1-4 ranges each, batches of
 * 16-64, four threads, a 2 MiB pool over ~40 MiB of keys, and a clear every
 * 20 ms: objects are evicted or cleared while they are being read all the
 * time.  (Checked against a dram tier mutated to free cleared objects under
 * their readers: it fails here with torn gets.) */
Test(stress, million_verified_gets_under_eviction, .timeout = 900)
{
    static const struct stress_cfg c = {
        .name = "million_verified_gets_under_eviction",
        .threads = 4,
        .min_size = 4 * KiB,
        .max_size = 16 * KiB,
        .min_batch = 16,
        .max_batch = 64,
        .keyspace = 4096,
        .target_gets = 1000000,
        .max_iters = 1000000,
        .clear_every_ms = 20,
    };
    run_stress(&c, "{\"capacity_bytes\": \"2MiB\", \"log_level\": \"error\"}");
}

/*
 * Leases of 10 ms on objects of 256 KiB-1 MiB while six threads compete for
 * two cores: copies are preempted past their lease, the objects are evicted
 * and their regions reused.  Such a get must report UMBP_E_STALE (counted),
 * never status 0 with wrong bytes.  How many leases expire depends on the
 * scheduler; the count is printed.  A clear every 50 ms frees objects whose
 * leases expired at once.  (The deterministic version of this check
 * is conformance/expired_lease_reused_region_is_stale.)
 */
Test(stress, short_leases_never_return_reused_bytes, .timeout = 900)
{
    static const struct stress_cfg c = {
        .name = "short_leases_never_return_reused_bytes",
        .threads = 6,
        .min_size = 256 * KiB,
        .max_size = 1 * MiB,
        .min_batch = 4,
        .max_batch = 12,
        .keyspace = 256,
        .target_gets = 0,
        .max_iters = 150,
        .clear_every_ms = 50,
    };
    run_stress(&c, "{\"capacity_bytes\": \"16MiB\", \"lease_ttl_ms\": 10, \"copy_threads\": 3,"
                   " \"log_level\": \"error\"}");
}
