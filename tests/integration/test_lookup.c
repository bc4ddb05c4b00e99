/*
 * test_lookup.c - the scheduler's lookups with real processes and sockets:
 * workers' lookup services (umbp_lookup_serve) and the lookup client.
 *
 *  - two forked worker processes, ranks 0 and 1 of one namespace, hold
 *    different random key sets; the parent's client gets present[] exactly
 *    and the prefix present on both, with rows in any order, several rows
 *    on one rank, and a row larger than one frame (65,536 keys);
 *  - a live socket is never taken over, a stale one is replaced, a file
 *    that is not a socket is refused and left alone; destroy removes the
 *    socket;
 *  - a killed rank (SIGKILL) and a stalled one (SIGSTOP) make misses with
 *    a negative code and no hang; while the stalled rank's query is
 *    unanswered it is not asked again (its lookup counter proves it), and
 *    after SIGCONT it answers again; one stalled past 10 x the timeout
 *    (at least 5 s) is dropped and redialled;
 *  - garbage, a wrong role, a request before HELLO, a connection over the
 *    cap: only that connection is closed; the others keep working;
 *  - standalone mode: the client against a real umbp-server.
 *
 * Forked workers never call Criterion assertions: they report over a
 * socketpair.  Times are asserted only against generous bounds (10x the
 * lookup timeout) so that a hang fails; they are logged, never tightened.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdpass.h"
#include "proto.h"
#include "server_fixture.h"
#include "test_util.h"
#include "umbp/lookup.h"
#include "umbp/umbp.h"

#define NS "00112233445566778899aabbccddeeff"
#define OBJ 256
#define TIMEOUT_MS 200

/* ---- a private directory ------------------------------------------------------- */

static char tdir[64];

static void rm_dir(void)
{
    if (!tdir[0])
        return;
    DIR *d = opendir(tdir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[384];
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof(p), "%s/%s", tdir, e->d_name);
            unlink(p);
        }
    }
    if (d)
        closedir(d);
    rmdir(tdir);
    tdir[0] = 0;
}

static void mk_dir(void)
{
    snprintf(tdir, sizeof(tdir), "/tmp/umbp-lk-XXXXXX");
    cr_assert_not_null(mkdtemp(tdir), "mkdtemp: %s", strerror(errno));
    atexit(rm_dir);
}

static void path_of(uint32_t rank, const char *inst, char *out)
{
    cr_assert_eq(umbp_lookup_socket_path(tdir, NS, inst, 0, rank, out, 108), 0, "%s",
                 umbp_last_error());
}

static umbp_lookup_client_t *client(int num_ranks, int timeout_ms)
{
    char json[512];
    snprintf(json, sizeof(json), "{\"namespace\": \"%s\", \"num_ranks\": %d, \"lookup_dir\": "
             "\"%s\", \"lookup_timeout_ms\": %d}", NS, num_ranks, tdir, timeout_ms);
    umbp_lookup_client_t *c = NULL;
    int rc = umbp_lookup_client_create(json, &c);
    cr_assert_eq(rc, 0, "umbp_lookup_client_create(%s) = %d: %s", json, rc, umbp_last_error());
    return c;
}

/* ---- putting keys (any process: no Criterion assertions) ------------------------ */

static uint8_t obj_bytes[OBJ];

static int put_keys(umbp_runtime_t *rt, const umbp_key_t *keys, size_t n)
{
    if (n == 0)
        return 0;
    umbp_range_t rg = {obj_bytes, OBJ, 0};
    umbp_put_item_t *it = calloc(n, sizeof(*it));
    if (!it)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        it[i] = (umbp_put_item_t){keys[i], OBJ, &rg, 1};
    umbp_op_t *op = NULL;
    int rc = umbp_put(rt, it, n, &op);
    free(it);
    if (rc < 0)
        return rc;
    if (umbp_op_wait(op, TU_WAIT_MS) != 0)
        rc = UMBP_E_TIMEOUT;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = umbp_op_key_status(op, i);
    umbp_op_release(op);
    return rc;
}

static umbp_runtime_t *worker_runtime(void)
{
    umbp_runtime_t *rt = NULL;
    int rc = umbp_runtime_create("{\"capacity_bytes\": \"32MiB\", \"copy_threads\": 1, "
                                 "\"log_level\": \"error\"}", &rt);
    return rc == 0 ? rt : NULL;
}

/* ---- worker processes ------------------------------------------------------------ */

struct worker {
    pid_t pid;
    int ctl; /* the parent's end: 's' asks for the lookup counters, 'q' ends it */
};

static void worker_main(int ctl, uint32_t rank, const umbp_key_t *keys, size_t n)
{
    umbp_runtime_t *rt = worker_runtime();
    int32_t st = rt ? 0 : -ENOMEM;
    if (st == 0)
        st = umbp_lookup_serve(rt, tdir, NS, "", 0, rank);
    if (st == 0)
        st = put_keys(rt, keys, n);
    if (write(ctl, &st, sizeof(st)) != sizeof(st))
        _exit(2);
    char cmd;
    /* 'q' ends it (EOF may never come: later workers inherit the parent's end) */
    while (read(ctl, &cmd, 1) == 1 && cmd != 'q') {
        umbp_stats_t s = {0};
        int rc;
        while ((rc = umbp_get_stats(rt, &s)) == UMBP_E_TIMEOUT)
            ;
        uint64_t v[2] = {s.lookups, s.lookup_keys};
        if (rc < 0 || write(ctl, v, sizeof(v)) != sizeof(v))
            _exit(3);
    }
    umbp_runtime_destroy(rt);
    _exit(0);
}

static bool read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, TU_WAIT_MS) <= 0)
            return false;
        ssize_t n = read(fd, p, len);
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* Forks a worker serving `rank` with keys stored, and waits until it is up. */
static void worker_start(struct worker *w, uint32_t rank, const umbp_key_t *keys, size_t n)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        close(sv[0]);
        worker_main(sv[1], rank, keys, n);
    }
    close(sv[1]);
    w->pid = pid;
    w->ctl = sv[0];
    int32_t st = 1;
    cr_assert(read_full(w->ctl, &st, sizeof(st)), "worker %u never came up", rank);
    cr_assert_eq(st, 0, "worker %u: %d (%s)", rank, st, umbp_strerror(st));
}

static uint64_t worker_lookups(struct worker *w)
{
    uint64_t v[2];
    cr_assert_eq(write(w->ctl, "s", 1), 1);
    cr_assert(read_full(w->ctl, v, sizeof(v)), "worker %d: no stats", (int)w->pid);
    return v[0];
}

static void worker_end(struct worker *w, bool kill_it)
{
    if (w->pid <= 0)
        return;
    if (kill_it) {
        kill(w->pid, SIGCONT);
        kill(w->pid, SIGKILL);
    } else {
        cr_expect_eq(write(w->ctl, "q", 1), 1);
    }
    close(w->ctl);
    int st = 0;
    while (waitpid(w->pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!kill_it)
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d ended with 0x%x",
                  (int)w->pid, st);
    w->pid = 0;
}

/* ---- key sets ----------------------------------------------------------------------- */

/* Row keys (random) and which of them a rank holds: a leading run of
 * `lead` present keys, then about half. */
struct row {
    umbp_key_t *keys;
    uint8_t *mask;
    size_t n, lead;
    umbp_key_t *held;
    size_t nheld;
};

static void row_make(struct row *r, struct tu_rng *g, size_t n, size_t lead)
{
    r->n = n;
    r->keys = calloc(n, sizeof(*r->keys));
    r->mask = calloc(n, 1);
    r->held = calloc(n, sizeof(*r->held));
    cr_assert(r->keys && r->mask && r->held);
    r->nheld = 0;
    for (size_t i = 0; i < n; i++) {
        r->keys[i] = tu_key_random(g);
        r->mask[i] = i < lead || (i > lead && tu_rng_below(g, 2));
        if (r->mask[i])
            r->held[r->nheld++] = r->keys[i];
    }
    r->lead = 0;
    while (r->lead < n && r->mask[r->lead])
        r->lead++;
}

static void row_free(struct row *r)
{
    free(r->keys);
    free(r->mask);
    free(r->held);
}

/* Queries rows (each rows[i] asked of rank rank_of[i]) and checks
 * present[] and the prefix exactly. */
static void expect_query(umbp_lookup_client_t *c, struct row *const *rows, size_t nrows,
                         const uint32_t *rank_of)
{
    size_t n = rows[0]->n;
    umbp_key_t *keys = calloc(n * nrows, sizeof(*keys));
    uint8_t *present = malloc(n * nrows);
    cr_assert(keys && present);
    size_t want = n;
    for (size_t r = 0; r < nrows; r++) {
        memcpy(keys + r * n, rows[r]->keys, n * sizeof(*keys));
        if (rows[r]->lead < want)
            want = rows[r]->lead;
    }
    memset(present, 0xee, n * nrows);
    size_t prefix = 12345;
    int rc = umbp_lookup_client_query(c, keys, n, nrows, rank_of, present, &prefix);
    cr_assert_eq(rc, 0, "query: %d (%s)", rc, umbp_strerror(rc));
    for (size_t r = 0; r < nrows; r++)
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(present[r * n + i], rows[r]->mask[i], "row %zu key %zu: %u, want %u",
                         r, i, present[r * n + i], rows[r]->mask[i]);
    cr_assert_eq(prefix, want, "prefix %zu, want %zu", prefix, want);
    free(keys);
    free(present);
}

/* ---- across processes ------------------------------------------------------------------ */

Test(lookup, two_worker_processes_prefix_and_present)
{
    uint64_t seed = tu_time_seed();
    cr_log_info("seed %llu", (unsigned long long)seed);
    struct tu_rng g;
    tu_rng_seed(&g, seed);
    mk_dir();
    size_t n = 200;
    struct row a, b;
    row_make(&a, &g, n, tu_rng_between(&g, 20, 150));
    row_make(&b, &g, n, tu_rng_between(&g, 20, 150));
    struct worker w0, w1;
    worker_start(&w0, 0, a.held, a.nheld);
    worker_start(&w1, 1, b.held, b.nheld);
    uint64_t before0 = worker_lookups(&w0);

    umbp_lookup_client_t *c = client(2, 5000);
    struct row *ab[] = {&a, &b};
    expect_query(c, ab, 2, NULL);
    cr_assert_eq(worker_lookups(&w0), before0 + 1, "one LOOKUP per rank per query");

    /* rows in another order, and two rows on one rank */
    struct row *ba[] = {&b, &a};
    uint32_t r10[] = {1, 0};
    expect_query(c, ba, 2, r10);
    struct row *aba[] = {&a, &b, &a};
    uint32_t r010[] = {0, 1, 0};
    expect_query(c, aba, 3, r010);
    cr_assert_eq(worker_lookups(&w0), before0 + 3, "two rows of one rank: still one LOOKUP");

    /* a row larger than one frame: the first keys are a's, the rest absent */
    struct row big;
    row_make(&big, &g, 70000, 0);
    memcpy(big.keys, a.keys, n * sizeof(umbp_key_t));
    memcpy(big.mask, a.mask, n);
    memset(big.mask + n, 0, big.n - n);
    big.lead = a.lead;
    struct row *bigrow[] = {&big};
    expect_query(c, bigrow, 1, NULL);
    cr_assert_eq(worker_lookups(&w0), before0 + 5, "70000 keys: two frames, one round trip");

    umbp_lookup_client_destroy(c);
    worker_end(&w0, false);
    worker_end(&w1, false);
    char p[108];
    path_of(0, "", p);
    cr_assert_neq(access(p, F_OK), 0, "destroy left the socket %s", p);
    row_free(&a);
    row_free(&b);
    row_free(&big);
    tu_check_leaks();
}

/* ---- dead and stalled ranks -------------------------------------------------------------- */

/* SIGSTOP takes effect asynchronously: wait until the kernel says 'T'. */
static void stop_and_wait(pid_t pid)
{
    tu_kill_wait(pid, SIGSTOP);
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    for (;;) {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = 0;
        const char *p = strrchr(buf, ')');
        if (p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't'))
            return;
        cr_assert_lt(tu_now_ms(), end, "worker %d never stopped", (int)pid);
        tu_sleep_ms(1);
    }
}

static int timed_query(umbp_lookup_client_t *c, struct row *a, struct row *b, uint64_t *ms)
{
    size_t n = a->n;
    umbp_key_t *keys = calloc(2 * n, sizeof(*keys));
    uint8_t *present = malloc(2 * n);
    cr_assert(keys && present);
    memcpy(keys, a->keys, n * sizeof(*keys));
    memcpy(keys + n, b->keys, n * sizeof(*keys));
    size_t prefix = 999;
    uint64_t t0 = tu_now_ms();
    int rc = umbp_lookup_client_query(c, keys, n, 2, NULL, present, &prefix);
    *ms = tu_now_ms() - t0;
    if (rc != 0) {
        /* rank 1 failed: its row misses, rank 0's answer is kept */
        cr_assert_eq(prefix, 0);
        for (size_t i = 0; i < n; i++) {
            cr_assert_eq(present[i], a->mask[i], "rank 0's row, key %zu", i);
            cr_assert_eq(present[n + i], 0, "a failed rank's row must miss (key %zu)", i);
        }
    } else {
        cr_assert_eq(prefix, a->lead < b->lead ? a->lead : b->lead);
    }
    free(keys);
    free(present);
    return rc;
}

Test(lookup, stalled_rank_single_flight_then_answers, .timeout = 120)
{
    uint64_t seed = tu_time_seed();
    cr_log_info("seed %llu", (unsigned long long)seed);
    struct tu_rng g;
    tu_rng_seed(&g, seed);
    mk_dir();
    struct row a, b;
    row_make(&a, &g, 64, 30);
    row_make(&b, &g, 64, 40);
    struct worker w0, w1;
    worker_start(&w0, 0, a.held, a.nheld);
    worker_start(&w1, 1, b.held, b.nheld);
    umbp_lookup_client_t *c = client(2, TIMEOUT_MS);
    uint64_t ms;
    cr_assert_eq(timed_query(c, &a, &b, &ms), 0);
    uint64_t l0 = worker_lookups(&w1);

    stop_and_wait(w1.pid);
    int rc = timed_query(c, &a, &b, &ms);
    cr_log_info("stalled rank: %d after %llu ms", rc, (unsigned long long)ms);
    cr_assert_eq(rc, UMBP_E_TIMEOUT, "rc %d (%s)", rc, umbp_strerror(rc));
    cr_assert_lt(ms, 10 * TIMEOUT_MS, "a stalled rank held the query %llu ms",
                 (unsigned long long)ms);
    for (int i = 0; i < 3; i++) {
        rc = timed_query(c, &a, &b, &ms);
        cr_assert_eq(rc, UMBP_E_NOT_ATTEMPTED, "rc %d (%s)", rc, umbp_strerror(rc));
        cr_assert_lt(ms, 10 * TIMEOUT_MS);
    }

    kill(w1.pid, SIGCONT);
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    size_t answered = 0;
    while (answered < 3) {
        rc = timed_query(c, &a, &b, &ms);
        cr_assert(rc == 0 || rc == UMBP_E_NOT_ATTEMPTED, "rc %d (%s)", rc, umbp_strerror(rc));
        answered += rc == 0;
        cr_assert_lt(tu_now_ms(), end, "the resumed rank never answered again");
        if (rc)
            tu_sleep_ms(5);
    }
    /* asked once while stalled (answered late), then only when answered */
    cr_assert_eq(worker_lookups(&w1), l0 + 1 + answered,
                 "a rank with a query due was asked again");
    umbp_lookup_client_destroy(c);
    worker_end(&w0, false);
    worker_end(&w1, false);
    row_free(&a);
    row_free(&b);
}

/* A rank that stays stalled past 10 x lookup_timeout_ms (at least 5 s) is
 * dropped and dialled again: it is asked again (and times out again) instead
 * of missing forever; once resumed it answers. */
Test(lookup, wedged_rank_is_redialled, .timeout = 120)
{
    struct tu_rng g;
    tu_rng_seed(&g, tu_time_seed());
    mk_dir();
    struct row a, b;
    row_make(&a, &g, 64, 30);
    row_make(&b, &g, 64, 40);
    struct worker w0, w1;
    worker_start(&w0, 0, a.held, a.nheld);
    worker_start(&w1, 1, b.held, b.nheld);
    umbp_lookup_client_t *c = client(2, TIMEOUT_MS);
    uint64_t ms;
    cr_assert_eq(timed_query(c, &a, &b, &ms), 0);
    stop_and_wait(w1.pid);
    cr_assert_eq(timed_query(c, &a, &b, &ms), UMBP_E_TIMEOUT);
    cr_assert_eq(timed_query(c, &a, &b, &ms), UMBP_E_NOT_ATTEMPTED);
    tu_sleep_ms(5200); /* past the 5 s floor */
    /* dropped (not attempted), then redialled after the backoff: asked and
     * stalled again, so a timeout rather than another silent miss */
    int rc = timed_query(c, &a, &b, &ms);
    cr_assert_eq(rc, UMBP_E_NOT_ATTEMPTED, "rc %d (%s)", rc, umbp_strerror(rc));
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    do {
        tu_sleep_ms(20);
        rc = timed_query(c, &a, &b, &ms);
        cr_assert_lt(tu_now_ms(), end, "the dropped rank was never asked again");
    } while (rc == UMBP_E_NOT_ATTEMPTED);
    cr_assert_eq(rc, UMBP_E_TIMEOUT, "rc %d (%s)", rc, umbp_strerror(rc));
    kill(w1.pid, SIGCONT);
    end = tu_now_ms() + TU_WAIT_MS;
    while ((rc = timed_query(c, &a, &b, &ms)) != 0) {
        cr_assert(rc == UMBP_E_NOT_ATTEMPTED, "rc %d (%s)", rc, umbp_strerror(rc));
        cr_assert_lt(tu_now_ms(), end, "the resumed rank never answered again");
        tu_sleep_ms(5);
    }
    umbp_lookup_client_destroy(c);
    worker_end(&w0, false);
    worker_end(&w1, false);
    row_free(&a);
    row_free(&b);
}

Test(lookup, dead_rank_misses_without_hanging, .timeout = 120)
{
    struct tu_rng g;
    tu_rng_seed(&g, tu_time_seed());
    mk_dir();
    struct row a, b;
    row_make(&a, &g, 64, 10);
    row_make(&b, &g, 64, 20);
    struct worker w0, w1;
    worker_start(&w0, 0, a.held, a.nheld);
    worker_start(&w1, 1, b.held, b.nheld);
    umbp_lookup_client_t *c = client(2, TIMEOUT_MS);
    uint64_t ms;
    cr_assert_eq(timed_query(c, &a, &b, &ms), 0);
    worker_end(&w1, true); /* SIGKILL: its socket file stays behind */
    for (int i = 0; i < 20; i++) {
        int rc = timed_query(c, &a, &b, &ms);
        cr_assert_lt(rc, 0, "a dead rank answered");
        cr_assert_lt(ms, 10 * TIMEOUT_MS, "query %d took %llu ms", i, (unsigned long long)ms);
        if (i < 2)
            cr_log_info("dead rank: %d (%s) after %llu ms", rc, umbp_strerror(rc),
                        (unsigned long long)ms);
        tu_sleep_ms(7);
    }
    /* a new worker on the dead one's stale socket: picked up after the backoff */
    worker_start(&w1, 1, b.held, b.nheld);
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (timed_query(c, &a, &b, &ms) != 0) {
        cr_assert_lt(tu_now_ms(), end, "the restarted rank was never asked again");
        tu_sleep_ms(20);
    }
    umbp_lookup_client_destroy(c);
    worker_end(&w0, false);
    worker_end(&w1, false);
    row_free(&a);
    row_free(&b);
}

/* A dead rank's backoff reaches its 1 s cap; a worker restarted within that
 * second is asked by the very next query, because its socket appeared in
 * the lookup directory (without the watch that query would miss it:
 * UMBP_E_NOT_ATTEMPTED, backing off). */
Test(lookup, restarted_rank_is_asked_when_its_socket_appears, .timeout = 120)
{
    struct tu_rng g;
    tu_rng_seed(&g, tu_time_seed());
    mk_dir();
    struct row a, b;
    row_make(&a, &g, 64, 10);
    row_make(&b, &g, 64, 20);
    struct worker w0, w1;
    worker_start(&w0, 0, a.held, a.nheld);
    worker_start(&w1, 1, b.held, b.nheld);
    umbp_lookup_client_t *c = client(2, TIMEOUT_MS);
    uint64_t ms;
    cr_assert_eq(timed_query(c, &a, &b, &ms), 0);
    worker_end(&w1, true); /* SIGKILL: its socket file stays behind */
    /* failed dials at 10, 30, 70, ... 1270 ms, then every 1000 ms: after
     * 1.5 s of queries, one that dialled and failed leaves 1 s of backoff */
    uint64_t t0 = tu_now_ms();
    int rc;
    do {
        rc = timed_query(c, &a, &b, &ms);
        cr_assert_lt(rc, 0, "a dead rank answered");
        tu_sleep_ms(2);
    } while (tu_now_ms() - t0 < 1500 || rc == UMBP_E_NOT_ATTEMPTED);
    cr_log_info("the dial that failed last: %d (%s)", rc, umbp_strerror(rc));
    worker_start(&w1, 1, b.held, b.nheld);
    uint64_t restarted = tu_now_ms();
    rc = timed_query(c, &a, &b, &ms);
    cr_log_info("the first query %llu ms after the restart: %d (%s)",
                (unsigned long long)(tu_now_ms() - restarted), rc, umbp_strerror(rc));
    cr_assert_eq(rc, 0, "the restarted rank was not asked at once: %d (%s)", rc,
                 umbp_strerror(rc));
    umbp_lookup_client_destroy(c);
    worker_end(&w0, false);
    worker_end(&w1, false);
    row_free(&a);
    row_free(&b);
}

/* ---- the socket path ------------------------------------------------------------------------ */

Test(lookup, live_socket_never_taken_over)
{
    mk_dir();
    char p[108], lock[120];
    path_of(0, "", p);
    snprintf(lock, sizeof(lock), "%s.lock", p);
    umbp_runtime_t *rt1 = worker_runtime(), *rt2 = worker_runtime();
    cr_assert(rt1 && rt2);
    cr_assert_eq(umbp_lookup_serve(rt1, tdir, NS, "", 0, 0), 0, "%s", umbp_last_error());
    cr_assert_eq(umbp_lookup_serve(rt1, tdir, NS, "x", 0, 1), -EBUSY);
    int rc = umbp_lookup_serve(rt2, tdir, NS, "", 0, 0);
    cr_assert_eq(rc, -EADDRINUSE, "rc %d (%s)", rc, umbp_strerror(rc));
    cr_assert(strstr(umbp_last_error(), "lookup_instance"), "%s", umbp_last_error());
    cr_assert_eq(umbp_lookup_serve(rt2, tdir, NS, "second", 0, 0), 0, "%s", umbp_last_error());
    cr_assert_eq(access(p, F_OK), 0);
    umbp_runtime_destroy(rt1);
    cr_assert_neq(access(p, F_OK), 0, "destroy left the socket");
    cr_assert_neq(access(lock, F_OK), 0, "destroy left the lock file");
    umbp_runtime_t *rt3 = worker_runtime();
    cr_assert_eq(umbp_lookup_serve(rt3, tdir, NS, "", 0, 0), 0, "%s", umbp_last_error());
    umbp_runtime_destroy(rt3);
    umbp_runtime_destroy(rt2);
    tu_check_leaks();
}

static int bind_at(const char *path, bool do_listen)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0, "bind %s: %s", path,
                 strerror(errno));
    if (do_listen)
        cr_assert_eq(listen(fd, 4), 0);
    return fd;
}

Test(lookup, stale_socket_replaced_foreign_files_refused)
{
    mk_dir();
    char p[108];
    path_of(0, "", p);
    /* a dead engine's socket: bound, nobody listens */
    close(bind_at(p, false));
    umbp_runtime_t *rt = worker_runtime();
    cr_assert_not_null(rt);
    cr_assert_eq(umbp_lookup_serve(rt, tdir, NS, "", 0, 0), 0, "%s", umbp_last_error());
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600, "socket mode %o", st.st_mode & 0777);
    umbp_key_t k = tu_key_id(1, 1);
    cr_assert_eq(put_keys(rt, &k, 1), 0);
    umbp_lookup_client_t *c = client(1, 5000);
    uint8_t present = 0;
    size_t prefix = 0;
    cr_assert_eq(umbp_lookup_client_query(c, &k, 1, 1, NULL, &present, &prefix), 0);
    cr_assert_eq(present, 1);
    cr_assert_eq(prefix, 1);
    umbp_lookup_client_destroy(c);
    umbp_runtime_destroy(rt);

    /* a listener of something else (no lock taken): live, never taken over */
    int lfd = bind_at(p, true);
    rt = worker_runtime();
    int rc = umbp_lookup_serve(rt, tdir, NS, "", 0, 0);
    cr_assert_eq(rc, -EADDRINUSE, "rc %d (%s)", rc, umbp_strerror(rc));
    cr_assert(strstr(umbp_last_error(), "lookup_instance"), "%s", umbp_last_error());
    close(lfd);
    unlink(p);

    /* a regular file: refused, left alone */
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "keep", 4), 4);
    close(fd);
    rc = umbp_lookup_serve(rt, tdir, NS, "", 0, 0);
    cr_assert_eq(rc, -EEXIST, "rc %d (%s)", rc, umbp_strerror(rc));
    cr_assert(strstr(umbp_last_error(), "not a socket"), "%s", umbp_last_error());
    cr_assert_eq(stat(p, &st), 0, "the file was removed");
    cr_assert(S_ISREG(st.st_mode) && st.st_size == 4);
    /* the failed attempts left the runtime free to serve elsewhere */
    cr_assert_eq(umbp_lookup_serve(rt, tdir, NS, "other", 0, 0), 0, "%s", umbp_last_error());
    umbp_runtime_destroy(rt);
    tu_check_leaks();
}

/* ---- bad input ------------------------------------------------------------------------------ */

static int raw_connect(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "connect: %s",
                 strerror(errno));
    return fd;
}

static void raw_send(int fd, struct proto_buf *b)
{
    cr_assert_eq(proto_send_with_fd(fd, b->data, b->len, -1), 0);
    b->len = 0;
}

/* The next frame's type into *type (its records into rec, up to reclen);
 * false on EOF. */
struct raw_in {
    uint8_t buf[1 << 17];
    size_t len;
};

static bool raw_frame(int fd, struct raw_in *in, struct proto_frame *f)
{
    static uint8_t keep[1 << 17];
    for (;;) {
        char err[256];
        long n = proto_frame_parse(in->buf, in->len, true, f, err, sizeof(err));
        cr_assert_geq(n, 0, "the service sent a malformed frame: %s", err);
        if (n > 0) {
            /* hand out a copy: the buffer moves on */
            memcpy(keep, in->buf, (size_t)n);
            f->records = keep + (f->records - in->buf);
            memmove(in->buf, in->buf + n, in->len - (size_t)n);
            in->len -= (size_t)n;
            return true;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        cr_assert_gt(poll(&pfd, 1, TU_WAIT_MS), 0, "the service neither answered nor closed");
        ssize_t got = read(fd, in->buf + in->len, sizeof(in->buf) - in->len);
        if (got <= 0)
            return false;
        in->len += (size_t)got;
    }
}

static void hello(struct proto_buf *b, uint8_t role, uint32_t rank)
{
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION, .role = role,
                            .pid = (uint32_t)getpid(), .tp_rank = rank,
                            .write_deadline_ms = role == PROTO_ROLE_WORKER ? 1000 : 0};
    memcpy(h.name_space, NS, strlen(NS));
    cr_assert_eq(proto_begin(b, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(b, &h), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void lookup_frame(struct proto_buf *b, uint64_t seq, const umbp_key_t *k, uint32_t n)
{
    cr_assert_eq(proto_begin(b, PROTO_LOOKUP, seq, n, 0), 0);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(proto_put_key(b, &k[i]), 0);
    cr_assert_eq(proto_end(b), 0);
}

/* Expects the service to close fd (after an optional ERROR/HELLO_ERR). */
static void expect_closed(int fd, struct raw_in *in, uint16_t first)
{
    struct proto_frame f;
    bool got = raw_frame(fd, in, &f);
    if (first) {
        cr_assert(got, "closed without %s", proto_type_name(first));
        cr_assert_eq(f.type, first, "got %s, want %s", proto_type_name(f.type),
                     proto_type_name(first));
        got = raw_frame(fd, in, &f);
    }
    cr_assert(!got, "the connection stayed open (sent %s)", proto_type_name(f.type));
    close(fd);
    in->len = 0;
}

/* A greeted raw connection's lookup of keys, checked against want. */
static void raw_lookup_ok(int fd, struct raw_in *in, uint64_t seq, const umbp_key_t *k,
                          const uint8_t *want, uint32_t n)
{
    struct proto_buf b = {0};
    lookup_frame(&b, seq, k, n);
    raw_send(fd, &b);
    proto_buf_free(&b);
    struct proto_frame f;
    cr_assert(raw_frame(fd, in, &f), "closed instead of answering");
    cr_assert_eq(f.type, PROTO_LOOKUP_R, "%s", proto_type_name(f.type));
    cr_assert_eq(f.seq, seq);
    cr_assert_eq(f.n, n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t v;
        cr_assert_eq(proto_get_u8(&f, i, &v), 0);
        cr_assert_eq(v, want[i], "key %u", i);
    }
}

static void raw_greet(int fd, struct raw_in *in, uint32_t rank)
{
    struct proto_buf b = {0};
    hello(&b, PROTO_ROLE_LOOKUP, rank);
    raw_send(fd, &b);
    proto_buf_free(&b);
    struct proto_frame f;
    cr_assert(raw_frame(fd, in, &f));
    cr_assert_eq(f.type, PROTO_HELLO_OK, "%s", proto_type_name(f.type));
    struct proto_welcome w;
    char err[128];
    cr_assert_eq(proto_get_welcome(&f, &w, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(w.version, PROTO_VERSION);
    cr_assert_eq(w.pool_id, 0);
    cr_assert_gt(w.capacity_bytes, 0);
}

Test(lookup, bad_frames_close_only_their_connection)
{
    mk_dir();
    char p[108];
    path_of(0, "", p);
    umbp_runtime_t *rt = worker_runtime();
    cr_assert_not_null(rt);
    cr_assert_eq(umbp_lookup_serve(rt, tdir, NS, "", 0, 0), 0, "%s", umbp_last_error());
    umbp_key_t k[3] = {tu_key_id(7, 0), tu_key_id(7, 1), tu_key_id(7, 2)};
    cr_assert_eq(put_keys(rt, k, 2), 0);
    uint8_t want[3] = {1, 1, 0};

    umbp_lookup_client_t *c = client(1, 5000);
    uint8_t present[3];
    size_t prefix;
    cr_assert_eq(umbp_lookup_client_query(c, k, 3, 1, NULL, present, &prefix), 0);
    cr_assert_eq(prefix, 2);
    static struct raw_in in_keep, in;
    int keep = raw_connect(p); /* greeted, stays open throughout */
    raw_greet(keep, &in_keep, 0);
    raw_lookup_ok(keep, &in_keep, 2, k, want, 3);

    struct proto_buf b = {0};
    /* garbage: a header with nonzero flags */
    int fd = raw_connect(p);
    uint8_t junk[24] = {8, 0, 0, 0, 4, 0, 3, 0};
    cr_assert_eq(proto_send_with_fd(fd, junk, sizeof(junk), -1), 0);
    expect_closed(fd, &in, PROTO_ERROR);
    /* a request before HELLO */
    fd = raw_connect(p);
    lookup_frame(&b, 1, k, 1);
    raw_send(fd, &b);
    expect_closed(fd, &in, PROTO_ERROR);
    /* role worker */
    fd = raw_connect(p);
    hello(&b, PROTO_ROLE_WORKER, 0);
    raw_send(fd, &b);
    expect_closed(fd, &in, PROTO_HELLO_ERR);
    /* another rank's HELLO (a client that computed the wrong path) */
    fd = raw_connect(p);
    hello(&b, PROTO_ROLE_LOOKUP, 5);
    raw_send(fd, &b);
    expect_closed(fd, &in, PROTO_HELLO_ERR);
    /* greeted, then a second HELLO; then garbage after a good lookup */
    fd = raw_connect(p);
    raw_greet(fd, &in, 0);
    hello(&b, PROTO_ROLE_LOOKUP, 0);
    raw_send(fd, &b);
    expect_closed(fd, &in, PROTO_ERROR);
    fd = raw_connect(p);
    raw_greet(fd, &in, 0);
    raw_lookup_ok(fd, &in, 2, k, want, 3);
    cr_assert_eq(proto_put_empty(&b, PROTO_PING, 3, 0), 0);
    raw_send(fd, &b);
    struct proto_frame f;
    cr_assert(raw_frame(fd, &in, &f));
    cr_assert_eq(f.type, PROTO_PONG);
    cr_assert_eq(proto_send_with_fd(fd, junk, sizeof(junk), -1), 0);
    expect_closed(fd, &in, PROTO_ERROR);
    /* a LOOKUP with a bad length, and a half frame then a hang-up */
    fd = raw_connect(p);
    raw_greet(fd, &in, 0);
    lookup_frame(&b, 2, k, 2);
    b.data[0] = 8 + 32 + 5; /* len no longer 8 + n * 32 */
    raw_send(fd, &b);
    expect_closed(fd, &in, PROTO_ERROR);
    fd = raw_connect(p);
    lookup_frame(&b, 1, k, 3);
    cr_assert_eq(proto_send_with_fd(fd, b.data, 30, -1), 0);
    b.len = 0;
    close(fd);
    proto_buf_free(&b);

    /* the others never noticed */
    raw_lookup_ok(keep, &in_keep, 3, k, want, 3);
    memset(present, 9, sizeof(present));
    cr_assert_eq(umbp_lookup_client_query(c, k, 3, 1, NULL, present, &prefix), 0);
    cr_assert_eq(prefix, 2);
    cr_assert_eq(memcmp(present, want, 3), 0);
    umbp_stats_t s = tu_stats(rt);
    cr_assert_geq(s.lookups, 5, "lookups through the service are counted (%llu)",
                  (unsigned long long)s.lookups);
    umbp_lookup_client_destroy(c);
    /* destroy with a client connected: bounded, and the client sees the end */
    uint64_t t0 = tu_now_ms();
    umbp_runtime_destroy(rt);
    cr_assert_lt(tu_now_ms() - t0, 10000);
    cr_assert(!raw_frame(keep, &in_keep, &f), "still open after destroy");
    close(keep);
    cr_assert_neq(access(p, F_OK), 0);
    tu_check_leaks();
}

Test(lookup, connections_capped)
{
    mk_dir();
    char p[108];
    path_of(0, "", p);
    umbp_runtime_t *rt = worker_runtime();
    cr_assert_eq(umbp_lookup_serve(rt, tdir, NS, "", 0, 0), 0, "%s", umbp_last_error());
    umbp_key_t k = tu_key_id(3, 3);
    cr_assert_eq(put_keys(rt, &k, 1), 0);
    uint8_t yes = 1;
    static struct raw_in in[65];
    int fd[65];
    for (int i = 0; i < 64; i++) {
        fd[i] = raw_connect(p);
        raw_greet(fd[i], &in[i], 0); /* accepted and served */
    }
    fd[64] = raw_connect(p); /* the kernel's backlog takes it; the service closes it */
    expect_closed(fd[64], &in[64], 0);
    raw_lookup_ok(fd[0], &in[0], 2, &k, &yes, 1);
    close(fd[1]);
    /* a place is free again */
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    for (;;) {
        int f2 = raw_connect(p);
        struct proto_buf b = {0};
        hello(&b, PROTO_ROLE_LOOKUP, 0);
        raw_send(f2, &b);
        proto_buf_free(&b);
        struct proto_frame fr;
        in[64].len = 0;
        bool ok = raw_frame(f2, &in[64], &fr);
        close(f2);
        if (ok) {
            cr_assert_eq(fr.type, PROTO_HELLO_OK);
            break;
        }
        cr_assert_lt(tu_now_ms(), end, "a freed place was never given out");
        tu_sleep_ms(5);
    }
    for (int i = 0; i < 64; i++)
        if (i != 1)
            close(fd[i]);
    umbp_runtime_destroy(rt);
    tu_check_leaks();
}

/* ---- standalone mode ---------------------------------------------------------------------- */

static struct tu_server srv;

/* Starts the server, stores rows a and b (their held keys) through a
 * standalone worker runtime, returned, and opens *c, a two-rank scheduler
 * client of the server with lookup_timeout_ms timeout_ms. */
static umbp_runtime_t *standalone_rows_and_client(const struct row *a, const struct row *b,
                                                  int timeout_ms, umbp_lookup_client_t **c)
{
    tu_server_start(&srv, "{\"capacity_bytes\": \"64MiB\", \"log_level\": \"error\"}");
    umbp_runtime_t *w = tu_create("{\"mode\": \"standalone\", \"socket_dir\": \"%s\", "
                                  "\"log_level\": \"error\"}", srv.dir);
    cr_assert_eq(put_keys(w, a->held, a->nheld), 0);
    cr_assert_eq(put_keys(w, b->held, b->nheld), 0);
    char json[512];
    snprintf(json, sizeof(json), "{\"mode\": \"standalone\", \"socket_dir\": \"%s\", "
             "\"num_ranks\": 2, \"lookup_timeout_ms\": %d, \"engine_id\": \"sched\"}",
             srv.dir, timeout_ms);
    *c = NULL;
    cr_assert_eq(umbp_lookup_client_create(json, c), 0, "%s", umbp_last_error());
    return w;
}

Test(lookup, standalone_prefix_across_rows, .timeout = 120)
{
    if (!tu_server_built())
        cr_skip_test("umbp-server was not built (no server/ target)");
    struct tu_rng g;
    uint64_t seed = tu_time_seed();
    cr_log_info("seed %llu", (unsigned long long)seed);
    tu_rng_seed(&g, seed);
    struct row a, b;
    row_make(&a, &g, 100, tu_rng_between(&g, 10, 90));
    row_make(&b, &g, 100, tu_rng_between(&g, 10, 90));
    umbp_lookup_client_t *c;
    umbp_runtime_t *w = standalone_rows_and_client(&a, &b, 5000, &c);
    struct row *ab[] = {&a, &b};
    expect_query(c, ab, 2, NULL);
    struct row *ba[] = {&b, &a};
    uint32_t r10[] = {1, 0};
    expect_query(c, ba, 2, r10);

    tu_server_stop(&srv);
    umbp_key_t keys[2] = {a.keys[0], b.keys[0]};
    uint8_t present[2] = {7, 7};
    size_t prefix = 7;
    uint64_t t0 = tu_now_ms();
    int rc = umbp_lookup_client_query(c, keys, 1, 2, NULL, present, &prefix);
    cr_log_info("server gone: %d (%s) after %llu ms", rc, umbp_strerror(rc),
                (unsigned long long)(tu_now_ms() - t0));
    cr_assert_lt(rc, 0);
    cr_assert_eq(prefix, 0);
    cr_assert(present[0] == 0 && present[1] == 0);
    cr_assert_lt(tu_now_ms() - t0, 50000);
    umbp_lookup_client_destroy(c);
    umbp_runtime_destroy(w);
    tu_server_cleanup(&srv);
    row_free(&a);
    row_free(&b);
}

/* Standalone: a stalled (SIGSTOPped) server costs one lookup_timeout_ms,
 * later queries miss at once without asking, and after SIGCONT the answers
 * are exact again. */
Test(lookup, standalone_stalled_server_single_flight, .timeout = 120)
{
    if (!tu_server_built())
        cr_skip_test("umbp-server was not built (no server/ target)");
    struct tu_rng g;
    tu_rng_seed(&g, tu_time_seed());
    struct row a, b;
    row_make(&a, &g, 64, 20);
    row_make(&b, &g, 64, 30);
    umbp_lookup_client_t *c;
    umbp_runtime_t *w = standalone_rows_and_client(&a, &b, TIMEOUT_MS, &c);
    struct row *ab[] = {&a, &b};
    expect_query(c, ab, 2, NULL);

    tu_server_signal(&srv, SIGSTOP);
    /* both rows come from the one server: a failure leaves all of them absent */
    umbp_key_t keys[2 * 64];
    uint8_t present[2 * 64];
    memcpy(keys, a.keys, 64 * sizeof(umbp_key_t));
    memcpy(keys + 64, b.keys, 64 * sizeof(umbp_key_t));
    for (int round = 0; round < 2; round++) {
        size_t prefix = 99;
        memset(present, 7, sizeof(present));
        uint64_t t0 = tu_now_ms();
        int rc = umbp_lookup_client_query(c, keys, 64, 2, NULL, present, &prefix);
        uint64_t ms = tu_now_ms() - t0;
        cr_log_info("stalled server, query %d: %s after %llu ms", round, umbp_strerror(rc),
                    (unsigned long long)ms);
        cr_assert_lt(rc, 0, "a stalled server answered");
        if (round == 1)
            cr_assert_eq(rc, UMBP_E_NOT_ATTEMPTED, "asked again while one was due: %s",
                         umbp_strerror(rc));
        cr_assert_lt(ms, 10 * TIMEOUT_MS, "a stalled server held the query %llu ms",
                     (unsigned long long)ms);
        cr_assert_eq(prefix, 0);
        for (size_t i = 0; i < sizeof(present); i++)
            cr_assert_eq(present[i], 0, "key %zu present while the server is stalled", i);
    }
    tu_server_signal(&srv, SIGCONT);
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    int rc;
    size_t prefix;
    while ((rc = umbp_lookup_client_query(c, keys, 64, 2, NULL, present, &prefix)) != 0) {
        cr_assert_lt(rc, 0);
        cr_assert_eq(prefix, 0, "a failed query reported a prefix");
        cr_assert_lt(tu_now_ms(), end, "the resumed server never answered: %s", umbp_strerror(rc));
        tu_sleep_ms(10);
    }
    expect_query(c, ab, 2, NULL); /* exact present[] and prefix of both rows */
    umbp_lookup_client_destroy(c);
    umbp_runtime_destroy(w);
    tu_server_cleanup(&srv);
    row_free(&a);
    row_free(&b);
}

Test(lookup, standalone_without_server_fails_at_create)
{
    mk_dir();
    char json[256];
    snprintf(json, sizeof(json), "{\"mode\": \"standalone\", \"socket_dir\": \"%s\", "
             "\"startup_timeout_ms\": 50}", tdir);
    umbp_lookup_client_t *c = NULL;
    int rc = umbp_lookup_client_create(json, &c);
    cr_assert_lt(rc, 0);
    cr_assert_null(c);
    cr_assert(strstr(umbp_last_error(), "umbp-server"), "%s", umbp_last_error());
}
