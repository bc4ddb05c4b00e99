/*
 * test_server.c - umbp-server as its clients see it: every test starts the
 * real binary (UMBP_SERVER_BIN) in a private socket directory and talks the
 * wire protocol through the small blocking client (server/sync_client.c),
 * mapping the pool a worker is handed.  What is checked is what users rely
 * on: bytes written through one client's mapping are read back exactly
 * through another's; a client that sends garbage, or dies holding
 * reservations and leases, costs nothing and disturbs no one; a live socket
 * is never taken over, a stale one is replaced; strangers are refused.
 *
 * The server logs to <dir>/server.log; a test that stops a server expects
 * exit status 0 (in the sanitizer build that includes LeakSanitizer's
 * verdict on the server).  Waits are bounded only to turn hangs into
 * failures (TU_WAIT_MS); nothing asserts how long anything takes.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdpass.h"
#include "proto.h"
#include "scrape.h" /* umbp_input_budget_used_bytes */
#include "server.h"
#include "server_config.h"
#include "srv.h" /* track.c, tested directly below */
#include "sync_client.h"
#include "test_util.h"
#include "umbp/tier.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define CLIENT_TIMEOUT_MS 30000
#define NOBODY 65534
/* The write deadline the test's workers declare: a reservation they leave
 * unfinished comes back this long after its grant. */
#define WRITE_MS 2000
static uint32_t write_ms = WRITE_MS; /* per test (each runs in its own process) */
static const char *client_ns = "ns-test"; /* the namespace clients declare (per test) */

/* ---- a server process ---------------------------------------------------------- */

struct srv {
    pid_t pid;
    char dir[64];
    char path[128];
    char log[128];
};

static bool log_has(const struct srv *s, const char *needle)
{
    return strstr(tu_slurp(s->log), needle) != NULL;
}

static pid_t spawn(const char *json, const char *log)
{
    return tu_spawn_server(UMBP_SERVER_BIN, json, log);
}

/* The config every test uses, plus `extra` (JSON members, or ""). */
static void config(const struct srv *s, const char *extra, char *json, size_t len)
{
    snprintf(json, len, "{\"socket_dir\": \"%s\", \"capacity_bytes\": \"16MiB\", "
             "\"log_level\": \"info\"%s%s}", s->dir, extra[0] ? ", " : "", extra);
}

static void srv_paths(struct srv *s, const char *instance)
{
    snprintf(s->path, sizeof(s->path), "%s/umbp-dp0%s%s.sock", s->dir,
             instance[0] ? "-" : "", instance);
    snprintf(s->log, sizeof(s->log), "%s/server.log", s->dir);
}

static void make_dir(struct srv *s)
{
    snprintf(s->dir, sizeof(s->dir), "/tmp/umbp-test-XXXXXX");
    cr_assert_not_null(mkdtemp(s->dir));
    srv_paths(s, "");
}

/* Polls the socket with PING until it answers: true; false if the server
 * exited first (its status in *status). */
static bool serving(const struct srv *s, int *status)
{
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                            .role = PROTO_ROLE_ADMIN};
    for (;;) {
        if (waitpid(s->pid, status, WNOHANG) == s->pid)
            return false;
        struct sync_client c;
        char err[512];
        if (sync_client_connect(&c, s->path, &h, CLIENT_TIMEOUT_MS, err, sizeof(err)) == 0) {
            sync_client_close(&c);
            return true;
        }
        cr_assert(tu_now_ms() < end, "umbp-server never answered at %s", s->path);
        tu_sleep_ms(5);
    }
}

/* Polls the socket with PING until it answers (or the server exits). */
static void wait_ready(const struct srv *s)
{
    int status;
    if (!serving(s, &status))
        cr_assert_fail("umbp-server exited (status 0x%x) before serving:\n%s", status,
                       tu_slurp(s->log));
}

static void srv_start_in(struct srv *s, const char *extra)
{
    char json[2048];
    config(s, extra, json, sizeof(json));
    s->pid = spawn(json, s->log);
    wait_ready(s);
}

static void srv_start(struct srv *s, const char *extra)
{
    make_dir(s);
    srv_start_in(s, extra);
}

/* SIGTERM; expects a clean exit that removed the socket. */
static void srv_stop(struct srv *s)
{
    int status;
    cr_assert_eq(kill(s->pid, SIGTERM), 0);
    cr_assert_eq(waitpid(s->pid, &status, 0), s->pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "umbp-server did not exit cleanly (status 0x%x):\n%s", status, tu_slurp(s->log));
    struct stat st;
    cr_assert(lstat(s->path, &st) < 0, "the socket %s outlived its server", s->path);
}

static void rm_dir(const struct srv *s)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", s->dir);
    cr_assert_eq(system(cmd), 0);
}

/* Runs a server that must fail; returns its exit status, log in s->log.
 * One that is still running after TU_WAIT_MS (it did not refuse) is
 * killed and fails the test. */
static int srv_run_failing(struct srv *s, const char *extra)
{
    char json[2048];
    int status;
    config(s, extra, json, sizeof(json));
    pid_t pid = spawn(json, s->log);
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (tu_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_assert_fail("umbp-server started although it should have refused");
        }
        tu_sleep_ms(5);
    }
    cr_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* ---- clients ---------------------------------------------------------------------- */

struct client {
    struct sync_client c;
    uint8_t *pool;
    size_t pool_size;
};

static int client_try(struct client *cl, const char *path, uint8_t role, uint32_t flags,
                      uint16_t version, const char *engine, char *err, size_t errlen)
{
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = version, .role = role,
                            .flags = flags, .pid = (uint32_t)getpid(), .dp_rank = 0,
                            .tp_rank = 1,
                            .write_deadline_ms = role == PROTO_ROLE_WORKER ? write_ms : 0};
    snprintf(h.engine_id, sizeof(h.engine_id), "%s", engine);
    snprintf(h.name_space, sizeof(h.name_space), "%s", client_ns);
    memset(cl, 0, sizeof(*cl));
    int rc = sync_client_connect(&cl->c, path, &h, CLIENT_TIMEOUT_MS, err, errlen);
    if (rc < 0 || role != PROTO_ROLE_WORKER)
        return rc;
    cl->pool_size = cl->c.welcome.pool_size;
    cl->pool = mmap(NULL, cl->pool_size, PROT_READ | PROT_WRITE, MAP_SHARED, cl->c.pool_fd, 0);
    cr_assert(cl->pool != MAP_FAILED, "mmap of the pool: %s", strerror(errno));
    return 0;
}

static void client_open(struct client *cl, const char *path, uint8_t role, uint32_t flags,
                        const char *engine)
{
    char err[512] = "";
    int rc = client_try(cl, path, role, flags, PROTO_VERSION, engine, err, sizeof(err));
    cr_assert_eq(rc, 0, "connect to %s: %d: %s", path, rc, err);
}

static void client_close(struct client *cl)
{
    if (cl->pool)
        munmap(cl->pool, cl->pool_size);
    sync_client_close(&cl->c);
}

static void send_buf(struct client *cl, struct proto_buf *b)
{
    cr_assert_eq(sync_client_send(&cl->c, b->data, b->len), 0);
    proto_buf_free(b);
}

/* Reads the reply of seq (skipping EVENTS), of the expected type. */
static void reply(struct client *cl, uint64_t seq, uint16_t type, struct proto_frame *f)
{
    char err[256] = "";
    int rc;
    do
        rc = sync_client_recv(&cl->c, f, err, sizeof(err));
    while (rc == 0 && f->type == PROTO_EVENTS);
    cr_assert_eq(rc, 0, "waiting for %s: %d: %s", proto_type_name(type), rc, err);
    cr_assert_eq(f->type, type, "got %s, expected %s", proto_type_name(f->type),
                 proto_type_name(type));
    cr_assert_eq(f->seq, seq);
}

static uint64_t send_keys(struct client *cl, uint16_t type, uint32_t arg, const umbp_key_t *k,
                          uint32_t n)
{
    struct proto_buf b = {0};
    uint64_t seq = cl->c.next_seq++;
    cr_assert_eq(proto_begin(&b, type, seq, n, arg), 0);
    for (uint32_t i = 0; i < n; i++)
        proto_put_key(&b, &k[i]);
    cr_assert_eq(proto_end(&b), 0);
    send_buf(cl, &b);
    return seq;
}

static void lookup(struct client *cl, const umbp_key_t *k, uint32_t n, uint8_t *present)
{
    struct proto_frame f;
    uint64_t seq = send_keys(cl, PROTO_LOOKUP, 0, k, n);
    reply(cl, seq, PROTO_LOOKUP_R, &f);
    cr_assert_eq(f.n, n);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(proto_get_u8(&f, i, &present[i]), 0);
}

/* RESERVE with arg (a hold in ms: reservations made ahead of their keys). */
static void reserve_held(struct client *cl, const umbp_key_t *k, const uint64_t *size,
                         uint32_t n, uint32_t hold_ms, struct proto_region_item *out)
{
    struct proto_buf b = {0};
    struct proto_frame f;
    uint64_t seq = cl->c.next_seq++;
    cr_assert_eq(proto_begin(&b, PROTO_RESERVE, seq, n, hold_ms), 0);
    for (uint32_t i = 0; i < n; i++) {
        struct proto_reserve_item it = {.key = k[i], .size = size[i]};
        proto_put_reserve_item(&b, &it);
    }
    cr_assert_eq(proto_end(&b), 0);
    send_buf(cl, &b);
    reply(cl, seq, PROTO_RESERVE_R, &f);
    cr_assert_eq(f.n, n);
    for (uint32_t i = 0; i < n; i++) {
        char err[256] = "";
        cr_assert_eq(proto_get_region_item(&f, i, &out[i]), 0);
        cr_assert_eq(proto_region_check(&out[i], size[i], cl->c.welcome.pool_size, true, err,
                                        sizeof(err)), 0, "%s", err);
    }
}

static void reserve(struct client *cl, const umbp_key_t *k, const uint64_t *size, uint32_t n,
                    struct proto_region_item *out)
{
    reserve_held(cl, k, size, n, 0, out);
}

/* PUBLISH_AS of one reservation (from, token) as key: its status. */
static int32_t publish_as(struct client *cl, const umbp_key_t *from, uint64_t token,
                          const umbp_key_t *key)
{
    struct proto_buf b = {0};
    struct proto_frame f;
    uint64_t seq = cl->c.next_seq++;
    struct proto_rename_item it = {*from, token, *key};
    cr_assert_eq(proto_begin(&b, PROTO_PUBLISH_AS, seq, 1, 0), 0);
    cr_assert_eq(proto_put_rename_item(&b, &it), 0);
    cr_assert_eq(proto_end(&b), 0);
    send_buf(cl, &b);
    reply(cl, seq, PROTO_PUBLISH_R, &f);
    cr_assert_eq(f.n, 1);
    int32_t st;
    cr_assert_eq(proto_get_status(&f, 0, &st), 0);
    return st;
}

static void acquire(struct client *cl, const umbp_key_t *k, uint32_t n,
                    struct proto_region_item *out)
{
    struct proto_frame f;
    uint64_t seq = send_keys(cl, PROTO_ACQUIRE, 5000, k, n);
    reply(cl, seq, PROTO_ACQUIRE_R, &f);
    cr_assert_eq(f.n, n);
    for (uint32_t i = 0; i < n; i++) {
        char err[256] = "";
        cr_assert_eq(proto_get_region_item(&f, i, &out[i]), 0);
        cr_assert_eq(proto_region_check(&out[i], 0, cl->c.welcome.pool_size, false, err,
                                        sizeof(err)), 0, "%s", err);
    }
}

/* PUBLISH or RELEASE (replies with statuses) or ABORT (none). */
static void tokens(struct client *cl, uint16_t type, const umbp_key_t *k,
                   const struct proto_region_item *r, uint32_t n, int32_t *status)
{
    struct proto_buf b = {0};
    uint64_t seq = cl->c.next_seq++;
    cr_assert_eq(proto_begin(&b, type, seq, n, 0), 0);
    for (uint32_t i = 0; i < n; i++) {
        struct proto_token_item it = {.key = k[i], .token = r[i].token};
        proto_put_token_item(&b, &it);
    }
    cr_assert_eq(proto_end(&b), 0);
    send_buf(cl, &b);
    if (type == PROTO_ABORT)
        return;
    struct proto_frame f;
    reply(cl, seq, type == PROTO_PUBLISH ? PROTO_PUBLISH_R : PROTO_RELEASE_R, &f);
    cr_assert_eq(f.n, n);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(proto_get_status(&f, i, &status[i]), 0);
}

static struct proto_stats stats(struct client *cl)
{
    struct proto_frame f;
    struct proto_stats st;
    char err[256] = "";
    cr_assert_eq(sync_client_call(&cl->c, PROTO_STATS, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(proto_get_stats(&f, &st), 0);
    return st;
}

static void ping(struct client *cl)
{
    struct proto_frame f;
    char err[256] = "";
    cr_assert_eq(sync_client_call(&cl->c, PROTO_PING, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(f.type, PROTO_PONG);
}

/* Expects an ERROR frame (status `status`, a message), then the end. */
static void expect_status_then_eof(struct client *cl, int status, const char *needle)
{
    struct proto_frame f;
    struct proto_error e;
    char err[256] = "";
    cr_assert_eq(sync_client_recv(&cl->c, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(f.type, PROTO_ERROR, "got %s", proto_type_name(f.type));
    cr_assert_eq(proto_get_error(&f, &e), 0);
    cr_assert_eq(e.status, status, "ERROR status %d, not %d (%s)", e.status, status, e.message);
    cr_assert(strstr(e.message, needle), "ERROR message '%s' does not name '%s'", e.message,
              needle);
    int rc = sync_client_recv(&cl->c, &f, err, sizeof(err));
    cr_assert_eq(rc, -ECONNRESET, "after ERROR the server kept the session (%d)", rc);
}

static void expect_error_then_eof(struct client *cl, const char *needle)
{
    expect_status_then_eof(cl, -EPROTO, needle);
}

/* ---- the round trip ----------------------------------------------------------------- */

#define NOBJ 8

Test(server, round_trip_between_two_clients)
{
    struct tu_rng rng;
    uint64_t seed = tu_time_seed();
    tu_rng_seed(&rng, seed);
    cr_log_info("seed %llu", (unsigned long long)seed);
    struct srv s;
    srv_start(&s, "");
    struct client a, b, lk;
    client_open(&a, s.path, PROTO_ROLE_WORKER, 0, "eng-a");
    client_open(&b, s.path, PROTO_ROLE_WORKER, 0, "eng-b");
    client_open(&lk, s.path, PROTO_ROLE_LOOKUP, 0, "eng-b-sched");
    cr_assert_eq(lk.c.pool_fd, -1, "a lookup session must not get the pool");

    umbp_key_t k[NOBJ];
    uint64_t size[NOBJ];
    uint8_t *data[NOBJ], present[NOBJ];
    struct proto_region_item wr[NOBJ], rd[NOBJ];
    int32_t st[NOBJ];
    for (int i = 0; i < NOBJ; i++) {
        k[i] = tu_key_random(&rng);
        size[i] = tu_rng_between(&rng, 1, 300 * KiB);
        data[i] = malloc(size[i]);
        tu_fill_random(&rng, data[i], size[i]);
    }
    reserve(&a, k, size, NOBJ, wr);
    for (int i = 0; i < NOBJ; i++) {
        cr_assert_eq(wr[i].status, 0, "reserve %d: %d", i, wr[i].status);
        memcpy(a.pool + wr[i].offset, data[i], size[i]);
    }
    lookup(&b, k, NOBJ, present);
    for (int i = 0; i < NOBJ; i++)
        cr_assert_eq(present[i], 0, "key %d visible before publish", i);
    /* another session cannot publish a's reservation */
    tokens(&b, PROTO_PUBLISH, k, wr, 1, st);
    cr_assert_eq(st[0], -ENOENT);
    tokens(&a, PROTO_PUBLISH, k, wr, NOBJ, st);
    for (int i = 0; i < NOBJ; i++)
        cr_assert_eq(st[i], 0, "publish %d: %d", i, st[i]);
    lookup(&lk, k, NOBJ, present);
    for (int i = 0; i < NOBJ; i++)
        cr_assert_eq(present[i], 1, "key %d missing after publish", i);
    /* first writer wins */
    struct proto_region_item again;
    reserve(&b, k, size, 1, &again);
    cr_assert_eq(again.status, UMBP_TIER_EXISTS);

    acquire(&b, k, NOBJ, rd);
    for (int i = 0; i < NOBJ; i++) {
        cr_assert_eq(rd[i].status, 0, "acquire %d: %d", i, rd[i].status);
        cr_assert_eq(rd[i].size, size[i]);
        size_t d = tu_first_diff(b.pool + rd[i].offset, data[i], size[i]);
        cr_assert_eq(d, SIZE_MAX, "object %d differs at byte %zu of %llu", i, d,
                     (unsigned long long)size[i]);
    }
    struct proto_stats during = stats(&b);
    cr_assert_eq(during.num_leased, NOBJ);
    tokens(&b, PROTO_RELEASE, k, rd, NOBJ, st);
    for (int i = 0; i < NOBJ; i++)
        cr_assert_eq(st[i], 0, "release %d: %d", i, st[i]);
    tokens(&b, PROTO_RELEASE, k, rd, 1, st);
    cr_assert_eq(st[0], UMBP_E_STALE, "a second release of one lease");

    struct proto_stats after = stats(&lk);
    cr_assert_eq(after.num_objects, NOBJ);
    cr_assert_eq(after.num_pending, 0);
    cr_assert_eq(after.num_leased, 0);
    cr_assert_eq(after.sessions, 3);
    cr_assert_eq(after.publishes, NOBJ);
    cr_assert_eq(after.acquire_hits, NOBJ);

    for (int i = 0; i < NOBJ; i++)
        free(data[i]);
    client_close(&lk);
    client_close(&b);
    client_close(&a);
    srv_stop(&s);
    rm_dir(&s);
}

Test(server, abort_drops_a_reservation)
{
    struct srv s;
    srv_start(&s, "");
    struct client a;
    client_open(&a, s.path, PROTO_ROLE_WORKER, 0, "eng-a");
    umbp_key_t k = tu_key_id(1, 1);
    uint64_t size = 4096;
    struct proto_region_item r;
    uint8_t present;
    reserve(&a, &k, &size, 1, &r);
    cr_assert_eq(r.status, 0);
    cr_assert_eq(stats(&a).num_pending, 1);
    tokens(&a, PROTO_ABORT, &k, &r, 1, NULL);
    struct proto_stats st = stats(&a);
    cr_assert_eq(st.num_pending, 0);
    cr_assert_eq(st.used_bytes, 0);
    lookup(&a, &k, 1, &present);
    cr_assert_eq(present, 0);
    reserve(&a, &k, &size, 1, &r);
    cr_assert_eq(r.status, 0, "the key stays reservable after an abort");
    client_close(&a);
    srv_stop(&s);
    rm_dir(&s);
}

/* Reservations made ahead of their keys (RESERVE.arg, PUBLISH_AS): one
 * held past its writer's deadline (200 ms) because of its hold (3 s) is
 * still there; only the session that made it can publish it, only with its
 * token and placeholder; then the object is the key's, bytes and all, and
 * the placeholder is nothing.  A second one published as a key present
 * already is refused (1: first writer wins) and its region freed.  A hold
 * past PROTO_HOLD_MAX_MS is malformed: ERROR naming RESERVE.arg. */
Test(server, publish_as_names_a_reservation_made_ahead)
{
    write_ms = 200;
    struct srv s;
    srv_start(&s, "");
    struct client a, b, c;
    client_open(&a, s.path, PROTO_ROLE_WORKER, 0, "eng-a");
    client_open(&b, s.path, PROTO_ROLE_WORKER, 0, "eng-b");
    umbp_key_t ph = tu_key_id(0xa4, 1), ph2 = tu_key_id(0xa4, 2), k = tu_key_id(0xa5, 1);
    uint64_t size = 64 * KiB;
    struct proto_region_item r, r2, g;
    reserve_held(&a, &ph, &size, 1, 3000, &r);
    cr_assert_eq(r.status, 0);
    tu_fill_from_key(&k, 0, a.pool + r.offset, size);
    tu_sleep_ms(1000); /* past the write deadline, inside the hold */
    struct proto_stats st = stats(&a);
    cr_assert_eq(st.num_pending, 1, "the hold was not honoured");
    cr_assert_eq(st.reservations_expired, 0);
    cr_assert_eq(publish_as(&b, &ph, r.token, &k), -ENOENT, "another session's reservation");
    cr_assert_eq(publish_as(&a, &ph, r.token + 1, &k), -ENOENT, "a wrong token");
    cr_assert_eq(publish_as(&a, &ph2, r.token, &k), -ENOENT, "a wrong placeholder");
    cr_assert_eq(publish_as(&a, &ph, r.token, &k), 0);
    cr_assert_eq(publish_as(&a, &ph, r.token, &k), -ENOENT, "published twice");
    uint8_t present[2];
    umbp_key_t both[2] = {k, ph};
    lookup(&b, both, 2, present);
    cr_assert(present[0] && !present[1], "key %d placeholder %d", present[0], present[1]);
    acquire(&b, &k, 1, &g);
    cr_assert_eq(g.status, 0);
    cr_assert_eq(g.size, size);
    cr_assert_eq(tu_check_from_key(&k, 0, b.pool + g.offset, size), SIZE_MAX,
                 "the object's bytes are not the ones written into the reservation");
    int32_t rs;
    tokens(&b, PROTO_RELEASE, &k, &g, 1, &rs);
    cr_assert_eq(rs, 0);

    reserve_held(&a, &ph2, &size, 1, 3000, &r2);
    cr_assert_eq(r2.status, 0);
    memset(a.pool + r2.offset, 0x5a, size); /* another writer's bytes */
    cr_assert_eq(publish_as(&a, &ph2, r2.token, &k), UMBP_TIER_EXISTS);
    st = stats(&a);
    cr_assert_eq(st.num_pending, 0, "the refused reservation is still held");
    cr_assert_eq(st.num_objects, 1);
    acquire(&b, &k, 1, &g);
    cr_assert_eq(tu_check_from_key(&k, 0, b.pool + g.offset, size), SIZE_MAX,
                 "the first writer's object changed");
    tokens(&b, PROTO_RELEASE, &k, &g, 1, &rs);

    client_open(&c, s.path, PROTO_ROLE_WORKER, 0, "eng-c");
    struct proto_buf pb = {0};
    struct proto_reserve_item it = {ph, size};
    cr_assert_eq(proto_begin(&pb, PROTO_RESERVE, c.c.next_seq++, 1, PROTO_HOLD_MAX_MS), 0);
    proto_put_reserve_item(&pb, &it);
    cr_assert_eq(proto_end(&pb), 0);
    uint8_t *arg = pb.data + PROTO_HDR_SIZE + 4; /* the body's arg: one past the bound */
    arg[0] = (uint8_t)((PROTO_HOLD_MAX_MS + 1) & 0xff);
    arg[1] = (uint8_t)((PROTO_HOLD_MAX_MS + 1) >> 8 & 0xff);
    arg[2] = (uint8_t)((PROTO_HOLD_MAX_MS + 1) >> 16 & 0xff);
    arg[3] = (uint8_t)((PROTO_HOLD_MAX_MS + 1) >> 24);
    send_buf(&c, &pb);
    expect_error_then_eof(&c, "RESERVE.arg");
    client_close(&c);
    client_close(&a);
    client_close(&b);
    srv_stop(&s);
    rm_dir(&s);
}

Test(server, full_pool_evicts_for_a_reservation)
{
    struct srv s;
    srv_start(&s, "");
    struct client a;
    client_open(&a, s.path, PROTO_ROLE_WORKER, 0, "eng-a");
    /* 16 MiB pool: 20 objects of 1 MiB do not fit without evicting */
    for (uint64_t i = 0; i < 20; i++) {
        umbp_key_t k = tu_key_id(2, i);
        uint64_t size = MiB;
        struct proto_region_item r;
        int32_t st;
        reserve(&a, &k, &size, 1, &r);
        cr_assert_eq(r.status, 0, "reserve %llu: %d", (unsigned long long)i, r.status);
        tokens(&a, PROTO_PUBLISH, &k, &r, 1, &st);
        cr_assert_eq(st, 0);
    }
    struct proto_stats st = stats(&a);
    cr_assert(st.evictions >= 4, "evictions %llu", (unsigned long long)st.evictions);
    cr_assert(st.used_bytes <= st.capacity_bytes);
    client_close(&a);
    srv_stop(&s);
    rm_dir(&s);
}

/* ---- bad clients ------------------------------------------------------------------- */

Test(server, garbage_disconnects_only_its_sender)
{
    struct tu_rng rng;
    tu_rng_seed(&rng, tu_time_seed());
    struct srv s;
    srv_start(&s, "");
    struct client good, bad;
    char err[256];
    client_open(&good, s.path, PROTO_ROLE_WORKER, 0, "eng-good");

    /* garbage instead of a HELLO: a header with nonzero flags */
    cr_assert_eq(sync_client_dial(&bad.c, s.path, CLIENT_TIMEOUT_MS, err, sizeof(err)), 0);
    uint8_t junk[64];
    tu_fill_random(&rng, junk, sizeof(junk));
    junk[6] = 0xff;
    cr_assert_eq(sync_client_send(&bad.c, junk, sizeof(junk)), 0);
    expect_error_then_eof(&bad, "frame.flags");
    sync_client_close(&bad.c);

    /* a frame whose len does not match its records, after a good HELLO */
    client_open(&bad, s.path, PROTO_ROLE_WORKER, 0, "eng-bad");
    uint8_t frame[16 + 8 + 10] = {0};
    uint32_t len = 8 + 10, n = 1;
    memcpy(frame, &len, 4);
    frame[4] = PROTO_LOOKUP;
    frame[8] = 7; /* seq */
    memcpy(frame + 16, &n, 4);
    cr_assert_eq(sync_client_send(&bad.c, frame, sizeof(frame)), 0);
    expect_error_then_eof(&bad, "LOOKUP.len");
    client_close(&bad);

    /* a frame over PROTO_MAX_BODY: -EMSGSIZE, as protocol.md says (it was -EPROTO) */
    client_open(&bad, s.path, PROTO_ROLE_WORKER, 0, "eng-big");
    uint8_t big[16] = {0};
    len = PROTO_MAX_BODY + 1;
    memcpy(big, &len, 4);
    big[4] = PROTO_LOOKUP;
    big[8] = 8;
    cr_assert_eq(sync_client_send(&bad.c, big, sizeof(big)), 0);
    expect_status_then_eof(&bad, -EMSGSIZE, "frame.len");
    client_close(&bad);

    /* the well-behaved client never noticed */
    ping(&good);
    umbp_key_t k = tu_key_id(3, 1);
    uint64_t size = 1000;
    struct proto_region_item r;
    int32_t st;
    reserve(&good, &k, &size, 1, &r);
    cr_assert_eq(r.status, 0);
    tokens(&good, PROTO_PUBLISH, &k, &r, 1, &st);
    cr_assert_eq(st, 0);
    cr_assert_eq(stats(&good).protocol_errors, 3);
    client_close(&good);
    srv_stop(&s);
    cr_assert(log_has(&s, "malformed frame: frame.flags"), "no log line for the garbage");
    rm_dir(&s);
}

Test(server, roles_are_enforced)
{
    struct srv s;
    srv_start(&s, "");
    struct client lk, adm;
    client_open(&lk, s.path, PROTO_ROLE_LOOKUP, 0, "sched");
    umbp_key_t k = tu_key_id(4, 1);
    uint64_t size = 64;
    struct proto_buf b = {0};
    struct proto_reserve_item it = {.key = k, .size = size};
    cr_assert_eq(proto_begin(&b, PROTO_RESERVE, 1, 1, 0), 0);
    proto_put_reserve_item(&b, &it);
    cr_assert_eq(proto_end(&b), 0);
    send_buf(&lk, &b);
    expect_error_then_eof(&lk, "RESERVE is not allowed for role lookup");
    client_close(&lk);

    client_open(&adm, s.path, PROTO_ROLE_ADMIN, 0, "admin");
    send_keys(&adm, PROTO_LOOKUP, 0, &k, 1);
    expect_error_then_eof(&adm, "LOOKUP is not allowed for role admin");
    client_close(&adm);
    srv_stop(&s);
    rm_dir(&s);
}

Test(server, wrong_protocol_version_gets_hello_err)
{
    struct srv s;
    srv_start(&s, "");
    struct client cl;
    char err[512] = "";
    int rc = client_try(&cl, s.path, PROTO_ROLE_WORKER, 0, PROTO_VERSION + 1, "future", err,
                        sizeof(err));
    cr_assert_eq(rc, -EPROTO, "rc %d: %s", rc, err);
    cr_assert(strstr(err, "protocol version"), "message: %s", err);
    /* a newer client may also set flags this server does not know */
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION + 1,
                            .role = PROTO_ROLE_WORKER, .write_deadline_ms = WRITE_MS};
    struct proto_buf b = {0};
    cr_assert_eq(sync_client_dial(&cl.c, s.path, CLIENT_TIMEOUT_MS, err, sizeof(err)), 0);
    cr_assert_eq(proto_begin(&b, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(&b, &h), 0);
    cr_assert_eq(proto_end(&b), 0);
    b.data[16 + 8 + 8] = 0x80; /* HELLO.flags: a bit unknown to version 1 */
    send_buf(&cl, &b);
    struct proto_frame f;
    struct proto_error e;
    cr_assert_eq(sync_client_recv(&cl.c, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(f.type, PROTO_HELLO_ERR, "got %s", proto_type_name(f.type));
    cr_assert_eq(proto_get_error(&f, &e), 0);
    cr_assert_eq(e.status, -EPROTO);
    cr_assert_eq(sync_client_recv(&cl.c, &f, err, sizeof(err)), -ECONNRESET);
    sync_client_close(&cl.c);
    /* the server is still fine */
    client_open(&cl, s.path, PROTO_ROLE_ADMIN, 0, "admin");
    ping(&cl);
    client_close(&cl);
    srv_stop(&s);
    rm_dir(&s);
}

/* ---- a client killed with -9 ---------------------------------------------------------- */

#define HELD 16

/* The child: reserve HELD new keys, lease the parent's, say so, wait. */
static void holder_child(const char *path, const umbp_key_t *leased, int fd_ready)
{
    struct client cl;
    char err[512];
    if (client_try(&cl, path, PROTO_ROLE_WORKER, 0, PROTO_VERSION, "victim", err,
                   sizeof(err)) < 0)
        _exit(1);
    umbp_key_t k[HELD];
    uint64_t size[HELD];
    struct proto_region_item r[HELD];
    for (int i = 0; i < HELD; i++) {
        k[i] = tu_key_id(6, (uint64_t)i);
        size[i] = 8 * KiB;
    }
    reserve(&cl, k, size, HELD, r);
    acquire(&cl, leased, HELD, r);
    if (write(fd_ready, "r", 1) != 1)
        _exit(1);
    for (;;)
        pause();
}

static bool back_to(const struct proto_stats *now, const struct proto_stats *before)
{
    return now->used_bytes == before->used_bytes && now->num_pending == before->num_pending &&
           now->num_leased == before->num_leased;
}

Test(server, killed_client_leaks_nothing)
{
    struct srv s;
    srv_start(&s, "");
    struct client a;
    client_open(&a, s.path, PROTO_ROLE_WORKER, 0, "eng-a");
    umbp_key_t pub[HELD];
    uint64_t size[HELD];
    struct proto_region_item r[HELD];
    int32_t st[HELD];
    for (int i = 0; i < HELD; i++) {
        pub[i] = tu_key_id(5, (uint64_t)i);
        size[i] = 16 * KiB;
    }
    reserve(&a, pub, size, HELD, r);
    tokens(&a, PROTO_PUBLISH, pub, r, HELD, st);
    struct proto_stats before = stats(&a);

    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) {
        close(p[0]);
        holder_child(s.path, pub, p[1]);
    }
    close(p[1]);
    char c;
    cr_assert_eq(read(p[0], &c, 1), 1, "the child never got its reservations and leases");
    struct proto_stats held = stats(&a);
    cr_assert_eq(held.num_pending, before.num_pending + HELD);
    cr_assert_eq(held.num_leased, before.num_leased + HELD);
    cr_assert_eq(kill(child, SIGKILL), 0);
    cr_assert_eq(waitpid(child, NULL, 0), child);

    struct proto_stats now;
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    do {
        now = stats(&a);
        if (!back_to(&now, &before))
            tu_sleep_ms(2);
    } while (!back_to(&now, &before) && tu_now_ms() < end);
    cr_assert(back_to(&now, &before), "after the kill: used %llu (was %llu), pending %llu, "
              "leased %llu", (unsigned long long)now.used_bytes,
              (unsigned long long)before.used_bytes, (unsigned long long)now.num_pending,
              (unsigned long long)now.num_leased);
    /* the dead client's keys are free to store again */
    umbp_key_t k = tu_key_id(6, 0);
    uint64_t sz = 8 * KiB;
    reserve(&a, &k, &sz, 1, r);
    cr_assert_eq(r[0].status, 0);
    client_close(&a);
    close(p[0]);
    srv_stop(&s);
    rm_dir(&s);
}

/* ---- the socket path ------------------------------------------------------------------ */

Test(server, second_server_on_one_socket_fails)
{
    struct srv s, t;
    srv_start(&s, "");
    t = s;
    snprintf(t.log, sizeof(t.log), "%s/second.log", s.dir);
    cr_assert_eq(srv_run_failing(&t, ""), 1);
    char pidtext[64];
    snprintf(pidtext, sizeof(pidtext), "live umbp-server (pid %d)", (int)s.pid);
    cr_assert(log_has(&t, "lookup_instance"), "the refusal does not name lookup_instance");
    cr_assert(log_has(&t, pidtext), "the refusal does not name the live server's pid");
    /* the first one is untouched; another lookup_instance is another socket */
    struct client cl;
    client_open(&cl, s.path, PROTO_ROLE_ADMIN, 0, "admin");
    ping(&cl);
    client_close(&cl);
    srv_paths(&t, "second");
    snprintf(t.log, sizeof(t.log), "%s/second.log", s.dir);
    srv_start_in(&t, "\"lookup_instance\": \"second\"");
    srv_stop(&t);
    srv_stop(&s);
    rm_dir(&s);
}

/* Two servers on one named pool would each allocate in the same memory and
 * hand the same bytes to two objects: the second is refused at startup,
 * naming dram_shm_name and the live owner's pid, and the first one's
 * objects stay exact; once the owner is killed (-9) a new server adopts. */
Test(server, second_server_on_one_live_pool_fails)
{
    char pool[64], extra[160];
    snprintf(pool, sizeof(pool), "umbp-test-owner-%d", (int)getpid());
    tu_rm_named_pool(pool);
    snprintf(extra, sizeof(extra), "\"dram_shm_name\": \"%s\"", pool);
    struct srv s, t;
    srv_start(&s, extra);

    enum { N = 4 };
    umbp_key_t k[N];
    uint64_t size[N];
    struct proto_region_item r[N];
    int32_t st[N];
    struct client cl;
    client_open(&cl, s.path, PROTO_ROLE_WORKER, 0, "first");
    for (uint32_t i = 0; i < N; i++) {
        k[i] = tu_key_id(0x0e1, i);
        size[i] = 256 * KiB;
    }
    reserve(&cl, k, size, N, r);
    for (uint32_t i = 0; i < N; i++)
        tu_fill_from_key(&k[i], 0, cl.pool + r[i].offset, size[i]);
    tokens(&cl, PROTO_PUBLISH, k, r, N, st);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(st[i], 0);

    /* another socket (lookup_instance), the same pool */
    t = s;
    srv_paths(&t, "second");
    snprintf(t.log, sizeof(t.log), "%s/second.log", s.dir);
    char both[256];
    snprintf(both, sizeof(both), "%s, \"lookup_instance\": \"second\"", extra);
    cr_assert_eq(srv_run_failing(&t, both), 1);
    char pidtext[64];
    snprintf(pidtext, sizeof(pidtext), "(pid %d)", (int)s.pid);
    cr_assert(log_has(&t, "dram_shm_name="), "the refusal does not name dram_shm_name");
    cr_assert(log_has(&t, pidtext), "the refusal does not name the owner's pid %d", (int)s.pid);
    cr_assert(!log_has(&t, "adopted"), "the second server adopted a live pool");

    /* the first server's objects are intact */
    acquire(&cl, k, N, r);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(tu_check_from_key(&k[i], 0, cl.pool + r[i].offset, size[i]), SIZE_MAX,
                     "object %u changed", i);
    tokens(&cl, PROTO_RELEASE, k, r, N, st);
    client_close(&cl);

    /* the owner dies: its lock goes with it, and a new server adopts */
    kill(s.pid, SIGKILL);
    int status;
    cr_assert_eq(waitpid(s.pid, &status, 0), s.pid);
    srv_start_in(&t, both);
    cr_assert(log_has(&t, "adopted"), "a server after the owner's death did not adopt the pool");
    client_open(&cl, t.path, PROTO_ROLE_WORKER, 0, "after");
    acquire(&cl, k, N, r);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(tu_check_from_key(&k[i], 0, cl.pool + r[i].offset, size[i]), SIZE_MAX,
                     "object %u changed", i);
    tokens(&cl, PROTO_RELEASE, k, r, N, st);
    client_close(&cl);
    srv_stop(&t);
    tu_rm_named_pool(pool);
    rm_dir(&s);
}

/* ---- a writer outliving its session ------------------------------------------------ */

/* How the writer's session ends. */
enum ending {
    END_DROP,        /* the connection drops, the client lives on */
    END_CLIENT_EXIT, /* the client process exits */
    END_CLIENT_KILL, /* the client process is killed (-9) */
    END_SERVER_TERM, /* the server is stopped (SIGTERM) and started again */
    END_SERVER_KILL, /* the server is killed (-9) and started again */
    END_ADOPT_CRASH, /* ... and the server that adopted the pool dies too */
};

#define END_WRITE_MS 60000u   /* the writer's declared deadline: the whole test */
#define END_OBJ (1 * MiB)
#define END_NFILL 40          /* 40 MiB through a 16 MiB pool: every free byte reused */

/* A child that reserves `size` bytes, reports the region's offset and then
 * exits or waits to be killed. */
static pid_t writer_child(const char *path, const umbp_key_t *k, uint64_t size, bool exit_now,
                          uint64_t *offset)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct client cl;
        struct proto_region_item r;
        char err[512];
        close(fds[0]);
        if (client_try(&cl, path, PROTO_ROLE_WORKER, 0, PROTO_VERSION, "writer", err,
                       sizeof(err)) < 0)
            _exit(1);
        reserve(&cl, k, &size, 1, &r);
        if (r.status != 0 || write(fds[1], &r.offset, sizeof(r.offset)) != sizeof(r.offset))
            _exit(1);
        if (exit_now)
            _exit(0); /* the session ends with the process */
        for (;;)
            pause();
    }
    close(fds[1]);
    cr_assert_eq(read(fds[0], offset, sizeof(*offset)), (ssize_t)sizeof(*offset),
                 "the writer child got no region");
    close(fds[0]);
    return pid;
}

/* Restarts the server the way `how` says; the pool is named, so its
 * journal carries what the writer was granted. */
static void restart_server(struct srv *s, const char *extra, enum ending how)
{
    int status;
    if (how == END_SERVER_TERM) {
        srv_stop(s);
    } else {
        kill(s->pid, SIGKILL);
        cr_assert_eq(waitpid(s->pid, &status, 0), s->pid);
    }
    srv_start_in(s, extra);
    if (how == END_ADOPT_CRASH) { /* it adopted the pool and died before the deadline */
        kill(s->pid, SIGKILL);
        cr_assert_eq(waitpid(s->pid, &status, 0), s->pid);
        srv_start_in(s, extra);
    }
}

/* A worker is granted a region, then its session ends (`how`) while its copy
 * is still running (a stalled source page, a GPU transfer in flight).  Other
 * clients then store far more than the pool holds, so every region that can
 * be handed out is; then the stalled copy finishes.  The server must never
 * have handed the writer's region to anyone before the writer's declared
 * deadline, and every object stored must read back exactly. */
static void writer_outlives_its_session(enum ending how)
{
    char pool[64], extra[256];
    snprintf(pool, sizeof(pool), "umbp-test-end-%d", (int)getpid());
    tu_rm_named_pool(pool);
    /* a short adoption grace: the writer's own deadline must be what holds
     * its region across a restart, not the grace */
    snprintf(extra, sizeof(extra), "\"dram_shm_name\": \"%s\", \"adopt_grace_ms\": 100, "
             "\"lease_ttl_ms\": 1000", pool); /* housekeeping every 100 ms */
    struct srv s;
    srv_start(&s, extra);
    write_ms = END_WRITE_MS;

    /* the observer maps the same pool: it plays the stalled copy at the end */
    struct client obs;
    client_open(&obs, s.path, PROTO_ROLE_WORKER, 0, "observer");
    umbp_key_t wk = tu_key_id(0xe0d, (uint64_t)how);
    uint64_t wsize = 2 * MiB, woff = 0;
    struct proto_region_item wr;
    struct client w;
    pid_t child = -1;
    if (how == END_CLIENT_EXIT || how == END_CLIENT_KILL) {
        child = writer_child(s.path, &wk, wsize, how == END_CLIENT_EXIT, &woff);
        if (how == END_CLIENT_KILL)
            kill(child, SIGKILL);
        cr_assert_eq(waitpid(child, NULL, 0), child);
    } else {
        client_open(&w, s.path, PROTO_ROLE_WORKER, 0, "writer");
        reserve(&w, &wk, &wsize, 1, &wr);
        cr_assert_eq(wr.status, 0);
        woff = wr.offset;
        sync_client_close(&w.c); /* the mapping stays: the copy goes on */
        if (how != END_DROP)
            restart_server(&s, extra, how);
    }
    /* long enough for a grace of 100 ms and a housekeeping tick to pass:
     * only the writer's own deadline may keep its region now */
    tu_sleep_ms(500);

    write_ms = WRITE_MS;
    struct client f;
    client_open(&f, s.path, PROTO_ROLE_WORKER, 0, "filler");
    umbp_key_t k[END_NFILL];
    for (uint32_t i = 0; i < END_NFILL; i++) {
        uint64_t size = END_OBJ;
        struct proto_region_item r;
        int32_t st;
        k[i] = tu_key_id(0xf11, i);
        reserve(&f, &k[i], &size, 1, &r);
        cr_assert_eq(r.status, 0, "fill %u: reserve failed (%d)", i, r.status);
        cr_assert(r.offset + r.size <= woff || r.offset >= woff + wsize,
                  "fill %u got [%llu, +%llu), inside the region [%llu, +%llu) whose writer "
                  "may still write", i, (unsigned long long)r.offset,
                  (unsigned long long)r.size, (unsigned long long)woff,
                  (unsigned long long)wsize);
        tu_fill_from_key(&k[i], 0, f.pool + r.offset, size);
        tokens(&f, PROTO_PUBLISH, &k[i], &r, 1, &st);
        cr_assert_eq(st, 0);
    }
    /* the stalled copy finishes */
    memset(obs.pool + woff, 0xa5, wsize);
    size_t verified = 0;
    for (uint32_t i = 0; i < END_NFILL; i++) {
        struct proto_region_item r;
        int32_t st;
        acquire(&f, &k[i], 1, &r);
        if (r.status != 0)
            continue; /* evicted to make room for later fills */
        cr_assert_eq(tu_check_from_key(&k[i], 0, f.pool + r.offset, r.size), SIZE_MAX,
                     "fill %u reads back another object's bytes", i);
        tokens(&f, PROTO_RELEASE, &k[i], &r, 1, &st);
        verified++;
    }
    cr_assert_geq(verified, 4, "only %zu objects left to check", verified);
    struct proto_stats st = stats(&f);
    cr_assert_eq(st.held_regions, 1, "the writer's region is not held (%llu)",
                 (unsigned long long)st.held_regions);
    client_close(&f);
    munmap(obs.pool, obs.pool_size);
    obs.pool = NULL;
    if (how == END_DROP || how == END_CLIENT_EXIT || how == END_CLIENT_KILL)
        client_close(&obs);
    else
        sync_client_close(&obs.c);
    if (how == END_DROP)
        munmap(w.pool, w.pool_size);
    else if (how != END_CLIENT_EXIT && how != END_CLIENT_KILL)
        munmap(w.pool, w.pool_size);
    srv_stop(&s);
    tu_rm_named_pool(pool);
    rm_dir(&s);
}

Test(server, writer_outlives_a_dropped_connection) { writer_outlives_its_session(END_DROP); }
Test(server, writer_outlives_its_client_exit) { writer_outlives_its_session(END_CLIENT_EXIT); }
Test(server, writer_outlives_its_client_kill) { writer_outlives_its_session(END_CLIENT_KILL); }
Test(server, writer_outlives_a_server_sigterm) { writer_outlives_its_session(END_SERVER_TERM); }
Test(server, writer_outlives_a_server_kill) { writer_outlives_its_session(END_SERVER_KILL); }
Test(server, writer_outlives_a_crash_after_adoption) { writer_outlives_its_session(END_ADOPT_CRASH); }

/* A connected client that reserved the whole pool and never publishes nor
 * aborts (stuck) keeps it only until its write deadline; then the space
 * comes back and its late publish is refused. */
Test(server, an_unfinished_reservation_is_reclaimed_at_its_deadline)
{
    struct srv s;
    srv_start(&s, "");
    struct client stuck, other;
    client_open(&stuck, s.path, PROTO_ROLE_WORKER, 0, "stuck");
    client_open(&other, s.path, PROTO_ROLE_WORKER, 0, "other");
    enum { N = 14 };
    umbp_key_t k[N];
    uint64_t size[N];
    struct proto_region_item r[N], o;
    for (uint32_t i = 0; i < N; i++) {
        k[i] = tu_key_id(0x57c, i);
        size[i] = 1 * MiB;
    }
    reserve(&stuck, k, size, N, r);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(r[i].status, 0);
    umbp_key_t ok = tu_key_id(0x57d, 0);
    uint64_t osize = 4 * MiB;
    reserve(&other, &ok, &osize, 1, &o);
    cr_assert_eq(o.status, -ENOSPC, "the pool was not full (%d)", o.status);
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    do {
        tu_sleep_ms(20);
        reserve(&other, &ok, &osize, 1, &o);
    } while (o.status == -ENOSPC && tu_now_ms() < end);
    cr_assert_eq(o.status, 0, "the stuck client's reservations never expired");
    int32_t st[N];
    tokens(&stuck, PROTO_PUBLISH, k, r, N, st);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(st[i], -ENOENT, "a publish after the deadline was accepted");
    struct proto_stats ps = stats(&other);
    cr_assert_eq(ps.reservations_expired, N);
    client_close(&stuck);
    client_close(&other);
    srv_stop(&s);
    rm_dir(&s);
}

Test(server, stale_socket_is_replaced)
{
    struct srv s;
    make_dir(&s);
    /* what a server killed with -9 leaves: a socket file nobody listens on
     * and an unlocked lock file */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    cr_assert(strlen(s.path) < sizeof(addr.sun_path));
    memcpy(addr.sun_path, s.path, strlen(s.path) + 1);
    cr_assert_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    close(fd);
    char lock[160];
    snprintf(lock, sizeof(lock), "%s.lock", s.path);
    FILE *f = fopen(lock, "w");
    fprintf(f, "999999\n");
    fclose(f);
    srv_start_in(&s, "");
    struct client cl;
    client_open(&cl, s.path, PROTO_ROLE_ADMIN, 0, "admin");
    ping(&cl);
    client_close(&cl);
    srv_stop(&s);
    cr_assert(log_has(&s, "replaced the stale socket"));
    rm_dir(&s);
}

Test(server, unsafe_socket_dir_is_refused)
{
    struct srv s;
    make_dir(&s);
    cr_assert_eq(chmod(s.dir, 0777), 0);
    cr_assert_eq(srv_run_failing(&s, ""), 1);
    cr_assert(log_has(&s, "socket_dir="), "the refusal does not name socket_dir");
    rm_dir(&s);
}

Test(server, bad_options_are_refused_by_name)
{
    static const struct { const char *json, *name; } bad[] = {
        {"\"allowed_uids\": \"no-such-user-xyz\"", "allowed_uids"},
        {"\"allowed_gids\": \"1,,2\"", "allowed_gids"},
        {"\"socket_group\": \"no-such-group-xyz\"", "socket_group"},
        {"\"namespace_quotas\": \"a=4GiB\"", "namespace_quotas"},
        {"\"namespace_quotas\": \"a=1MiB,a=2MiB\"", "namespace_quotas"},
        {"\"namespace_quotas\": \"justaname\"", "namespace_quotas"},
        {"\"metrics_port\": 65536", "metrics_port"},
        {"\"max_sessions\": 0", "max_sessions"},
        {"\"session_warm_keys\": -1", "session_warm_keys"},
        {"\"session_warm_keys\": 65537", "session_warm_keys"},
        {"\"session_warm_keys\": \"many\"", "session_warm_keys"},
        {"\"lookup_instance\": \"a/b\"", "lookup_instance"},
        {"\"no_such_option\": 1", "no_such_option"},
        /* a node's options (node.c): refused as the rdma tier refuses them */
        {"\"master_address\": \"nonsense\"", "master_address"},
        {"\"master_address\": \"127.0.0.1:1\", \"heartbeat_ms\": 1", "heartbeat_ms"},
    };
    struct srv s;
    make_dir(&s);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(s.log, sizeof(s.log), "%s/bad%zu.log", s.dir, i);
        cr_assert_eq(srv_run_failing(&s, bad[i].json), 1, "%s was accepted", bad[i].json);
        cr_assert(log_has(&s, bad[i].name), "the refusal of %s does not name %s", bad[i].json,
                  bad[i].name);
    }
    rm_dir(&s);
}

/* ---- who may connect -------------------------------------------------------------------- */

/* In a child as uid/gid nobody: 0 refused after connecting (HELLO_ERR
 * -EACCES naming allowed_uids), 1 could not connect at all (or was refused
 * without being told why), 2 served. */
static int connect_as_nobody(const char *path)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0)
            _exit(3);
        struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                                .role = PROTO_ROLE_ADMIN};
        struct sync_client c;
        char err[512];
        int rc = sync_client_connect(&c, path, &h, CLIENT_TIMEOUT_MS, err, sizeof(err));
        /* refused: a HELLO_ERR naming the option */
        _exit(rc == 0 ? 2 : rc == -EACCES && strstr(err, "allowed_uids") ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

Test(server, other_users_are_refused)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to connect as another user (uid %d)", NOBODY);
    struct srv s;
    /* the group may reach the socket; SO_PEERCRED still says no */
    srv_start(&s, "\"socket_group\": \"65534\"");
    cr_assert_eq(connect_as_nobody(s.path), 0, "uid %d was not refused at the handshake",
                 NOBODY);
    struct client cl;
    client_open(&cl, s.path, PROTO_ROLE_ADMIN, 0, "admin");
    cr_assert_eq(stats(&cl).refused_connections, 1);
    client_close(&cl);
    srv_stop(&s);
    cr_assert(log_has(&s, "refused a connection from uid 65534 gid 65534"));
    rm_dir(&s);

    /* without socket_group the filesystem already keeps it out */
    srv_start(&s, "");
    cr_assert_eq(connect_as_nobody(s.path), 1);
    srv_stop(&s);
    rm_dir(&s);

    /* allowed_gids lets the group in */
    srv_start(&s, "\"socket_group\": \"65534\", \"allowed_gids\": \"65534\"");
    cr_assert_eq(connect_as_nobody(s.path), 2, "an allowed group was refused");
    srv_stop(&s);
    rm_dir(&s);
}

Test(server, max_sessions_is_enforced)
{
    struct srv s;
    srv_start(&s, "\"max_sessions\": 2");
    struct client a, b, c;
    char err[512];
    client_open(&a, s.path, PROTO_ROLE_ADMIN, 0, "one");
    client_open(&b, s.path, PROTO_ROLE_ADMIN, 0, "two");
    int rc = client_try(&c, s.path, PROTO_ROLE_ADMIN, 0, PROTO_VERSION, "three", err,
                        sizeof(err));
    cr_assert_eq(rc, -EUSERS, "a third session: %d (%s)", rc, err);
    cr_assert_not_null(strstr(err, "max_sessions (2) reached"), "a third session: %s", err);
    cr_assert_eq(stats(&a).refused_connections, 1);
    client_close(&b);
    client_close(&a);
    srv_stop(&s);
    cr_assert(log_has(&s, "max_sessions (2) reached"));
    rm_dir(&s);
}

/* ---- events ------------------------------------------------------------------------------ */

/* Reads EVENTS frames until `want` events (records plus lost) are
 * accounted for; returns the lost part. */
static uint64_t drain_events(struct client *cl, uint64_t want, umbp_key_t *keys,
                             uint32_t *types, uint64_t cap)
{
    uint64_t seen = 0, lost = 0;
    while (seen + lost < want) {
        struct proto_frame f;
        char err[256] = "";
        int rc = sync_client_recv(&cl->c, &f, err, sizeof(err));
        cr_assert_eq(rc, 0, "after %llu of %llu events: %s", (unsigned long long)(seen + lost),
                     (unsigned long long)want, err);
        cr_assert_eq(f.type, PROTO_EVENTS);
        lost += f.arg;
        for (uint32_t i = 0; i < f.n; i++, seen++) {
            struct proto_event_item it;
            cr_assert_eq(proto_get_event_item(&f, i, &it), 0);
            if (seen < cap) {
                keys[seen] = it.key;
                types[seen] = it.type;
            }
        }
    }
    cr_assert_eq(seen + lost, want, "more events than happened");
    return lost;
}

Test(server, events_reach_subscribers)
{
    struct srv s;
    srv_start(&s, "");
    struct client sub, w, adm;
    client_open(&sub, s.path, PROTO_ROLE_LOOKUP, PROTO_HELLO_EVENTS, "watcher");
    client_open(&w, s.path, PROTO_ROLE_WORKER, 0, "writer");
    client_open(&adm, s.path, PROTO_ROLE_ADMIN, 0, "admin");
    umbp_key_t k[3], got[6];
    uint64_t size[3] = {100, 200, 300};
    uint32_t types[6];
    struct proto_region_item r[3];
    int32_t st[3];
    for (int i = 0; i < 3; i++)
        k[i] = tu_key_id(7, (uint64_t)i);
    reserve(&w, k, size, 3, r);
    tokens(&w, PROTO_PUBLISH, k, r, 3, st);
    struct proto_frame f;
    char err[256];
    cr_assert_eq(sync_client_call(&adm.c, PROTO_CLEAR, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(f.type, PROTO_CLEAR_R);
    cr_assert_eq(drain_events(&sub, 6, got, types, 6), 0);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(types[i], UMBP_EVENT_STORED);
        cr_assert(tu_key_eq(&got[i], &k[i]));
        cr_assert_eq(types[3 + i], UMBP_EVENT_REMOVED);
    }
    uint8_t present[3];
    lookup(&w, k, 3, present);
    cr_assert(!present[0] && !present[1] && !present[2], "clear left objects");
    client_close(&adm);
    client_close(&w);
    client_close(&sub);
    srv_stop(&s);
    rm_dir(&s);
}

/* A subscriber that stops reading loses events (counted), never stalls
 * the server, and learns exactly how many it lost. */
Test(server, slow_subscriber_loses_counted_events)
{
    struct srv s;
    srv_start(&s, "\"event_backlog_bytes\": \"64KiB\"");
    struct client sub, w;
    client_open(&sub, s.path, PROTO_ROLE_LOOKUP, PROTO_HELLO_EVENTS, "sleeper");
    client_open(&w, s.path, PROTO_ROLE_WORKER, 0, "writer");
    enum { BATCH = 4096, ROUNDS = 12 };
    umbp_key_t *k = malloc(BATCH * sizeof(*k));
    uint64_t *size = malloc(BATCH * sizeof(*size));
    struct proto_region_item *r = malloc(BATCH * sizeof(*r));
    int32_t *st = malloc(BATCH * sizeof(*st));
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < BATCH; i++) {
            k[i] = tu_key_id(8 + (uint64_t)round, (uint64_t)i);
            size[i] = 256;
        }
        reserve(&w, k, size, BATCH, r);
        tokens(&w, PROTO_PUBLISH, k, r, BATCH, st);
        struct proto_frame f;
        char err[256];
        cr_assert_eq(sync_client_call(&w.c, PROTO_CLEAR, &f, err, sizeof(err)), 0, "%s", err);
    }
    ping(&w);
    uint64_t lost = drain_events(&sub, 2ull * BATCH * ROUNDS, NULL, NULL, 0);
    cr_assert(lost > 0, "nothing was dropped: the test did not fill the backlog");
    free(k);
    free(size);
    free(r);
    free(st);
    client_close(&w);
    client_close(&sub);
    srv_stop(&s);
    rm_dir(&s);
}

/* ---- the umbp tool ---------------------------------------------------------------------- */

static int run_cli(const char *args, char *out, size_t len)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s %s 2>&1", UMBP_CLI_BIN, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(server, umbp_tool_stat_reset_ping)
{
    struct srv s;
    srv_start(&s, "");
    struct client w;
    client_open(&w, s.path, PROTO_ROLE_WORKER, 0, "engine-seven");
    umbp_key_t k = tu_key_id(9, 1);
    uint64_t size = 5000;
    struct proto_region_item r;
    int32_t st;
    uint8_t present;
    reserve(&w, &k, &size, 1, &r);
    tokens(&w, PROTO_PUBLISH, &k, &r, 1, &st);
    lookup(&w, &k, 1, &present);

    char out[8192], args[256];
    snprintf(args, sizeof(args), "--socket-dir %s stat", s.dir);
    cr_assert_eq(run_cli(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "1 objects"), "%s", out);
    cr_assert(strstr(out, "hit rate 100.0%"), "%s", out);
    cr_assert(strstr(out, "engine-seven"), "%s", out);
    cr_assert(strstr(out, "worker"), "%s", out);
    snprintf(args, sizeof(args), "--socket-dir %s reset", s.dir);
    cr_assert_eq(run_cli(args, out, sizeof(out)), 0, "%s", out);
    lookup(&w, &k, 1, &present);
    cr_assert_eq(present, 0, "reset left the object");
    snprintf(args, sizeof(args), "--socket-dir %s ping", s.dir);
    cr_assert_eq(run_cli(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "pong"), "%s", out);
    snprintf(args, sizeof(args), "--socket-dir %s --instance nobody-here ping", s.dir);
    cr_assert_eq(run_cli(args, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "umbp-dp0-nobody-here.sock"), "the error does not name the path: %s",
              out);
    client_close(&w);
    srv_stop(&s);
    rm_dir(&s);
}

/* ---- leases end by themselves ---------------------------------------------------------- */

Test(server, leases_expire_at_the_servers_cap)
{
    struct srv s;
    srv_start(&s, "\"lease_ttl_ms\": 20");
    struct client w;
    client_open(&w, s.path, PROTO_ROLE_WORKER, 0, "eng");
    cr_assert_eq(w.c.welcome.lease_ttl_ms, 20);
    umbp_key_t k = tu_key_id(10, 1);
    uint64_t size = 4096;
    struct proto_region_item r;
    int32_t st;
    reserve(&w, &k, &size, 1, &r);
    tokens(&w, PROTO_PUBLISH, &k, &r, 1, &st);
    acquire(&w, &k, 1, &r); /* asks for 5000 ms; the server caps it at 20 */
    cr_assert_eq(r.status, 0);
    struct proto_stats now;
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while ((now = stats(&w)).leases_expired == 0 && tu_now_ms() < end)
        tu_sleep_ms(5);
    cr_assert_eq(now.leases_expired, 1, "the lease never expired");
    cr_assert_eq(now.num_leased, 0);
    /* the object was not reused, so the bytes read under it are valid */
    tokens(&w, PROTO_RELEASE, &k, &r, 1, &st);
    cr_assert_eq(st, 0);
    client_close(&w);
    srv_stop(&s);
    rm_dir(&s);
}

/* ---- pipelining ---------------------------------------------------------------------------- */

#define PIPELINED 100000

struct pipeliner {
    struct client *cl;
    int rc;
};

static void *send_many(void *arg)
{
    struct pipeliner *p = arg;
    struct proto_buf b = {0};
    for (uint64_t i = 0; i < PIPELINED && p->rc == 0; i++) {
        p->rc = proto_put_empty(&b, PROTO_STATS, i + 1, 0);
        if (b.len >= 64 * KiB || i + 1 == PIPELINED) {
            p->rc = p->rc ? p->rc : sync_client_send(&p->cl->c, b.data, b.len);
            proto_buf_consume(&b, b.len);
        }
    }
    proto_buf_free(&b);
    return NULL;
}

/* Far more replies than the server buffers for one client: it stops
 * reading that client instead of growing, and every reply comes in order. */
Test(server, pipelined_requests_are_answered_in_order)
{
    struct srv s;
    srv_start(&s, "");
    struct client cl;
    client_open(&cl, s.path, PROTO_ROLE_ADMIN, 0, "pipeliner");
    struct pipeliner p = {.cl = &cl};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, send_many, &p), 0);
    /* read nothing until the server has stopped reading this client */
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (!log_has(&s, "sends faster than it reads")) {
        cr_assert(tu_now_ms() < end, "the server never paused a client that does not read");
        tu_sleep_ms(5);
    }
    for (uint64_t i = 0; i < PIPELINED; i++) {
        struct proto_frame f;
        reply(&cl, i + 1, PROTO_STATS_R, &f);
    }
    pthread_join(t, NULL);
    cr_assert_eq(p.rc, 0);
    client_close(&cl);
    srv_stop(&s);
    rm_dir(&s);
}

/* ---- hostile clients ----------------------------------------------------------------------- */

/* A random, well-formed request of the worker's repertoire, with keys from
 * a small set and tokens that are real, stale or invented. */
static void random_request(struct tu_rng *r, struct proto_buf *b, uint64_t seq,
                           const uint64_t *seen_tokens, size_t nseen)
{
    static const uint16_t types[] = {PROTO_LOOKUP, PROTO_RESERVE, PROTO_PUBLISH, PROTO_ABORT,
                                     PROTO_ACQUIRE, PROTO_RELEASE, PROTO_STATS, PROTO_PING,
                                     PROTO_CLEAR};
    uint16_t type = types[tu_rng_below(r, sizeof(types) / sizeof(types[0]))];
    uint32_t n = (uint32_t)tu_rng_between(r, 1, 40), arg = 0;
    if (type == PROTO_STATS || type == PROTO_PING || type == PROTO_CLEAR) {
        cr_assert_eq(proto_put_empty(b, type, seq, 0), 0);
        return;
    }
    if (type == PROTO_ACQUIRE)
        arg = (uint32_t)tu_rng_between(r, 1, 100000);
    if (type == PROTO_LOOKUP)
        arg = (uint32_t)tu_rng_below(r, 2);
    cr_assert_eq(proto_begin(b, type, seq, n, arg), 0);
    for (uint32_t i = 0; i < n; i++) {
        umbp_key_t k = tu_key_id(11, tu_rng_below(r, 64));
        if (type == PROTO_LOOKUP || type == PROTO_ACQUIRE) {
            proto_put_key(b, &k);
        } else if (type == PROTO_RESERVE) {
            uint64_t sizes[] = {0, 1, 4096, 100000, 1ull << 40};
            struct proto_reserve_item it = {k, sizes[tu_rng_below(r, 5)]};
            proto_put_reserve_item(b, &it);
        } else {
            uint64_t tok = nseen && tu_rng_below(r, 2) ? seen_tokens[tu_rng_below(r, nseen)]
                                                       : tu_rng_next(r);
            struct proto_token_item it = {k, tok};
            proto_put_token_item(b, &it);
        }
    }
    cr_assert_eq(proto_end(b), 0);
}

/* Collects the tokens of region replies so later requests can reuse them. */
static void note_tokens(const struct proto_frame *f, uint64_t *seen, size_t *nseen, size_t cap)
{
    if (f->type != PROTO_RESERVE_R && f->type != PROTO_ACQUIRE_R)
        return;
    for (uint32_t i = 0; i < f->n; i++) {
        struct proto_region_item it;
        cr_assert_eq(proto_get_region_item(f, i, &it), 0);
        if (it.status == 0)
            seen[*nseen < cap ? (*nseen)++ : tu_splitmix64(it.token) % cap] = it.token;
    }
}

/* Sessions that send random requests (some of them corrupted by a flipped
 * byte) and vanish at random points: the server keeps serving, and once
 * they are all gone nothing is pending or leased. */
Test(server, hostile_clients_leave_nothing_behind)
{
    struct tu_rng rng;
    uint64_t seed = tu_time_seed();
    tu_rng_seed(&rng, seed);
    cr_log_info("seed %llu", (unsigned long long)seed);
    struct srv s;
    srv_start(&s, "\"lease_ttl_ms\": 600000");
    struct client ctl;
    client_open(&ctl, s.path, PROTO_ROLE_ADMIN, 0, "control");
    uint64_t seen[256];
    size_t nseen = 0;
    for (int round = 0; round < 60; round++) {
        struct client cl;
        client_open(&cl, s.path, PROTO_ROLE_WORKER, tu_rng_below(&rng, 2), "hostile");
        int requests = (int)tu_rng_between(&rng, 1, 30);
        bool corrupt = tu_rng_below(&rng, 4) == 0;
        for (int q = 0; q < requests; q++) {
            struct proto_buf b = {0};
            uint64_t seq = cl.c.next_seq++;
            random_request(&rng, &b, seq, seen, nseen);
            uint16_t type;
            memcpy(&type, b.data + 4, 2);
            if (corrupt && q == requests - 1) {
                /* Not a RESERVE's arg (body bytes 4-7): flipped, it is a valid
                 * hold of up to PROTO_HOLD_MAX_MS (10 min) that the server
                 * honours after the session ends, past this test's wait (CI,
                 * 2026-12-06: held regions still there after 60 s) */
                size_t at = tu_rng_below(&rng, b.len - (type == PROTO_RESERVE ? 4 : 0));
                if (type == PROTO_RESERVE && at >= PROTO_HDR_SIZE + 4)
                    at += 4;
                b.data[at] ^= (uint8_t)tu_rng_between(&rng, 1, 255);
            }
            send_buf(&cl, &b);
            if (corrupt && q == requests - 1)
                break; /* whatever the server makes of it, this client is done */
            if (type == PROTO_ABORT)
                continue;
            struct proto_frame f;
            char err[256];
            int rc;
            do
                rc = sync_client_recv(&cl.c, &f, err, sizeof(err));
            while (rc == 0 && f.type == PROTO_EVENTS);
            cr_assert_eq(rc, 0, "seed %llu, round %d request %d (%s): %s",
                         (unsigned long long)seed, round, q, proto_type_name(type), err);
            cr_assert_eq(f.seq, seq);
            note_tokens(&f, seen, &nseen, sizeof(seen) / sizeof(seen[0]));
        }
        client_close(&cl);
        ping(&ctl);
    }
    /* what the sessions reserved and left is held until their write
     * deadline (WRITE_MS), then comes back */
    struct proto_stats now;
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (((now = stats(&ctl)).num_pending || now.num_leased || now.held_regions) &&
           tu_now_ms() < end)
        tu_sleep_ms(2);
    cr_assert_eq(now.num_pending, 0, "seed %llu: reservations outlived their sessions",
                 (unsigned long long)seed);
    cr_assert_eq(now.held_regions, 0, "seed %llu: held regions outlived their writers' "
                 "deadlines", (unsigned long long)seed);
    cr_assert_eq(now.num_leased, 0, "seed %llu: leases outlived their sessions",
                 (unsigned long long)seed);
    cr_assert_eq(now.sessions, 1);
    struct proto_frame f;
    char err[256];
    cr_assert_eq(sync_client_call(&ctl.c, PROTO_CLEAR, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(stats(&ctl).used_bytes, 0, "space leaked");
    client_close(&ctl);
    srv_stop(&s);
    rm_dir(&s);
}

/* ---- fairness: large frames are handled in slices ------------------------------------------ */

#define BIG_BATCH 60000u /* records in one frame: 15 slices of SRV_SLICE_RECORDS */

static void big_keys(umbp_key_t *k, uint64_t *size, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        memset(&k[i], 0, sizeof(k[i]));
        memcpy(k[i].bytes, "big-", 4);
        memcpy(k[i].bytes + 4, &i, sizeof(i));
        size[i] = 256;
    }
}

/* One client sends a 60,000-key ACQUIRE; another keeps asking STATS
 * meanwhile.  The server answers the second between the slices of the
 * first: some STATS reply counts part of the big frame's acquires, which a
 * server handling the frame in one go can never show (its counter goes
 * from none to all of them at once).  The big frame's reply is still one
 * frame with every record right, and the big client's next request (a
 * PING sent right behind it) is answered after it.  The big client
 * subscribes to events: those of its own 60,000 publishes come after the
 * PUBLISH_R, as they do for a frame handled at once. */
Test(server, a_large_frame_lets_other_clients_in_between_its_slices)
{
    /* reserving and publishing 60,000 keys took over WRITE_MS (2 s) on a
     * loaded 2-vCPU machine, and the publish then met reclaimed regions:
     * this test is about slices, not write deadlines */
    write_ms = END_WRITE_MS;
    struct srv s;
    srv_start(&s, "\"capacity_bytes\": \"64MiB\"");
    struct client big, small;
    client_open(&big, s.path, PROTO_ROLE_WORKER, PROTO_HELLO_EVENTS, "big");
    client_open(&small, s.path, PROTO_ROLE_LOOKUP, 0, "small");
    umbp_key_t *k = calloc(BIG_BATCH, sizeof(*k));
    uint64_t *size = calloc(BIG_BATCH, sizeof(*size));
    struct proto_region_item *r = calloc(BIG_BATCH, sizeof(*r));
    int32_t *st = calloc(BIG_BATCH, sizeof(*st));
    uint8_t *present = calloc(BIG_BATCH, 1);
    cr_assert(k && size && r && st && present);
    big_keys(k, size, BIG_BATCH);

    reserve(&big, k, size, BIG_BATCH, r); /* checks every region */
    struct proto_buf b = {0};
    uint64_t pseq = big.c.next_seq++;
    cr_assert_eq(proto_begin(&b, PROTO_PUBLISH, pseq, BIG_BATCH, 0), 0);
    for (uint32_t i = 0; i < BIG_BATCH; i++) {
        struct proto_token_item it = {.key = k[i], .token = r[i].token};
        proto_put_token_item(&b, &it);
    }
    cr_assert_eq(proto_end(&b), 0);
    send_buf(&big, &b);
    struct proto_frame f;
    char err[256] = "";
    cr_assert_eq(sync_client_recv(&big.c, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(f.type, PROTO_PUBLISH_R, "%s came before the PUBLISH_R of the events' "
                 "own frame", proto_type_name(f.type));
    cr_assert_eq(f.n, BIG_BATCH);
    for (uint32_t i = 0; i < BIG_BATCH; i++) {
        cr_assert_eq(proto_get_status(&f, i, &st[i]), 0);
        cr_assert_eq(st[i], 0, "publish %u: %d", i, st[i]);
    }
    lookup(&small, k, BIG_BATCH, present);
    for (uint32_t i = 0; i < BIG_BATCH; i++)
        cr_assert_eq(present[i], 1, "key %u published but not found", i);

    uint64_t before = stats(&small).acquires;
    uint64_t aseq = send_keys(&big, PROTO_ACQUIRE, 5000, k, BIG_BATCH);
    cr_assert_eq(proto_put_empty(&b, PROTO_PING, big.c.next_seq++, 0), 0);
    send_buf(&big, &b);
    uint64_t done, readings = 0, between = 0;
    do {
        done = stats(&small).acquires - before;
        readings++;
        between += done > 0 && done < BIG_BATCH;
    } while (done < BIG_BATCH);
    cr_log_info("%llu STATS replies, %llu of them during the big frame",
                (unsigned long long)readings, (unsigned long long)between);
    cr_assert(between > 0, "no STATS reply came while the 60,000-key frame was handled: "
              "it held the loop (the counter jumped from 0 to %u)", BIG_BATCH);

    reply(&big, aseq, PROTO_ACQUIRE_R, &f);
    cr_assert_eq(f.n, BIG_BATCH);
    for (uint32_t i = 0; i < BIG_BATCH; i++) {
        struct proto_region_item it;
        cr_assert_eq(proto_get_region_item(&f, i, &it), 0);
        cr_assert_eq(it.status, 0, "acquire %u: %d", i, it.status);
        cr_assert_eq(it.offset, r[i].offset, "acquire %u: another region", i);
        r[i].token = it.token;
    }
    reply(&big, aseq + 1, PROTO_PONG, &f);
    tokens(&big, PROTO_RELEASE, k, r, BIG_BATCH, st);
    for (uint32_t i = 0; i < BIG_BATCH; i++)
        cr_assert_eq(st[i], 0, "release %u: %d", i, st[i]);
    cr_assert_eq(stats(&small).num_leased, 0);
    free(k);
    free(size);
    free(r);
    free(st);
    free(present);
    client_close(&small);
    client_close(&big);
    srv_stop(&s);
    rm_dir(&s);
}

/* ---- timeouts: silent and half-open connections ------------------------------------------- */

static int dial_raw(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    cr_assert(strlen(path) < sizeof(a.sun_path));
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "connect %s: %s", path,
                 strerror(errno));
    return fd;
}

/* recv until EOF (0) or an error; bytes before it (an ERROR frame) are fine. */
static bool reads_eof(int fd)
{
    struct timeval tv = {.tv_sec = CLIENT_TIMEOUT_MS / 1000};
    /* blocking reads bounded by the timeout (a sync_client's socket is
     * non-blocking: its poll() driver waits) */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[512];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return true;
        if (n < 0)
            return false; /* EAGAIN: the timeout; the server kept it */
    }
}

#define SILENT 1024

/* 1,024 connections that never finish a HELLO (most send nothing, every
 * fourth half a HELLO) take every session slot (max_sessions 1024); the
 * handshake deadline frees them, so a real client gets in and is served,
 * and every silent one reads EOF. */
Test(server, silent_connections_are_dropped_after_handshake_timeout_ms)
{
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < SILENT + 256) {
        rl.rlim_cur = rl.rlim_max < SILENT + 256 ? rl.rlim_max : SILENT + 256;
        cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    cr_assert_geq(rl.rlim_cur, SILENT + 64, "needs %d descriptors (ulimit -n)", SILENT + 64);
    struct srv s;
    srv_start(&s, "\"max_sessions\": 1024, \"handshake_timeout_ms\": 200");
    struct proto_buf hello = {0};
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                            .role = PROTO_ROLE_ADMIN};
    cr_assert_eq(proto_begin(&hello, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(&hello, &h), 0);
    cr_assert_eq(proto_end(&hello), 0);
    int *fds = calloc(SILENT, sizeof(int));
    for (int i = 0; i < SILENT; i++) {
        fds[i] = dial_raw(s.path);
        if (i % 4 == 3)
            cr_assert_eq(send(fds[i], hello.data, hello.len / 2, MSG_NOSIGNAL),
                         (ssize_t)(hello.len / 2));
    }
    proto_buf_free(&hello);

    struct client cl;
    char err[512] = "";
    uint64_t end = tu_now_ms() + TU_WAIT_MS, tries = 0;
    int rc;
    while ((rc = client_try(&cl, s.path, PROTO_ROLE_ADMIN, 0, PROTO_VERSION, "real", err,
                            sizeof(err))) != 0) {
        cr_assert(rc == -EUSERS || rc == -ECONNRESET || rc == -EPIPE, "connect: %d: %s", rc, err);
        cr_assert(tu_now_ms() < end, "the silent connections kept every session slot");
        tries++;
        tu_sleep_ms(10);
    }
    cr_log_info("the real client got in after %llu refusals", (unsigned long long)tries);
    ping(&cl);
    for (int i = 0; i < SILENT; i++) {
        cr_assert(reads_eof(fds[i]), "silent connection %d was kept", i);
        close(fds[i]);
    }
    free(fds);
    ping(&cl);
    client_close(&cl);
    srv_stop(&s);
    cr_assert(log_has(&s, "no HELLO within handshake_timeout_ms (200 ms"));
    rm_dir(&s);
}

/* A greeted client sends 10 bytes of a frame header and stops: its
 * session ends after frame_timeout_ms; the others are unaffected, and an
 * idle greeted client (nothing partial) outlives the deadline. */
Test(server, a_partial_frame_ends_its_session_after_frame_timeout_ms)
{
    struct srv s;
    srv_start(&s, "\"frame_timeout_ms\": 200");
    struct client idle, partial, other;
    client_open(&idle, s.path, PROTO_ROLE_ADMIN, 0, "idle");
    client_open(&partial, s.path, PROTO_ROLE_WORKER, 0, "partial");
    client_open(&other, s.path, PROTO_ROLE_ADMIN, 0, "other");
    umbp_key_t key = {{0}};
    uint64_t size = 4096;
    struct proto_region_item r;
    reserve(&partial, &key, &size, 1, &r); /* held: aborted when the session ends */
    struct proto_buf b = {0};
    cr_assert_eq(proto_put_empty(&b, PROTO_PING, 99, 0), 0);
    cr_assert_eq(sync_client_send(&partial.c, b.data, 10), 0);
    proto_buf_free(&b);
    ping(&other);
    cr_assert(reads_eof(partial.c.fd), "a session with a partial frame was kept");
    ping(&other);
    ping(&idle); /* idle since before the partial frame began */
    struct proto_stats st = stats(&other);
    cr_assert_eq(st.num_pending, 0, "the dropped session's reservation was not aborted");
    cr_assert_eq(st.sessions, 2); /* idle and other */
    client_close(&partial);
    client_close(&other);
    client_close(&idle);
    srv_stop(&s);
    cr_assert(log_has(&s, "a frame stayed incomplete for frame_timeout_ms (200 ms; 10 bytes"));
    rm_dir(&s);
}

/* ---- input_budget_bytes ---------------------------------------------------------------- */

#define BIG_KEYS PROTO_MAX_RECORDS /* a LOOKUP of 65,536 keys: 2 MiB and 24 bytes */

/* A whole LOOKUP of BIG_KEYS keys (key i of client c: bytes c, i), seq given. */
static void big_lookup(struct proto_buf *b, uint8_t who, uint64_t seq)
{
    cr_assert_eq(proto_begin(b, PROTO_LOOKUP, seq, BIG_KEYS, 0), 0);
    for (uint32_t i = 0; i < BIG_KEYS; i++) {
        umbp_key_t k = {{0}};
        k.bytes[0] = who;
        memcpy(k.bytes + 1, &i, 4);
        proto_put_key(b, &k);
    }
    cr_assert_eq(proto_end(b), 0);
}

struct big_send {
    struct client *cl;
    const uint8_t *p;
    size_t len;
    int rc;
};

static void *big_send_main(void *arg)
{
    struct big_send *bs = arg;
    bs->rc = sync_client_send(&bs->cl->c, bs->p, bs->len);
    return NULL;
}

static bool readable_within(int fd, int ms)
{
    struct pollfd q = {.fd = fd, .events = POLLIN};
    return poll(&q, 1, ms) == 1;
}

static void big_reply(struct client *cl, uint64_t seq)
{
    struct proto_frame f;
    reply(cl, seq, PROTO_LOOKUP_R, &f);
    cr_assert_eq(f.n, BIG_KEYS);
}

/* Four sessions hold unfinished 2 MiB frames (most of an 8 MiB
 * input_budget_bytes); a fifth one's frame waits, not read and not
 * answered, while small requests of others go on; when one of the four
 * finishes its frame (and gives its input back), the fifth is read and
 * answered, then the rest. */
Test(server, a_frame_over_input_budget_bytes_waits_for_another_to_finish)
{
    struct srv s;
    srv_start(&s, "\"input_budget_bytes\": \"8MiB\"");
    struct client h[4], w, other;
    struct proto_buf fr[4] = {{0}}, wf = {0};
    const size_t part = 1 << 20;
    for (int i = 0; i < 4; i++) {
        client_open(&h[i], s.path, PROTO_ROLE_LOOKUP, 0, "holder");
        big_lookup(&fr[i], (uint8_t)i, h[i].c.next_seq++);
        /* read by the server past its first 64 KiB: its input has grown */
        cr_assert_eq(sync_client_send(&h[i].c, fr[i].data, part), 0);
    }
    client_open(&w, s.path, PROTO_ROLE_LOOKUP, 0, "waiter");
    client_open(&other, s.path, PROTO_ROLE_ADMIN, 0, "other");
    uint64_t wseq = w.c.next_seq++;
    big_lookup(&wf, 9, wseq);
    struct big_send bs = {&w, wf.data, wf.len, -1};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, big_send_main, &bs), 0);
    ping(&other);
    cr_assert(!readable_within(w.c.fd, 300), "a frame over input_budget_bytes was answered");
    ping(&other); /* small frames of others are read meanwhile */
    /* holder 0 finishes: answered, its 2 MiB given back, the waiter goes on */
    cr_assert_eq(sync_client_send(&h[0].c, fr[0].data + part, fr[0].len - part), 0);
    big_reply(&h[0], fr[0].data[8]); /* its seq: the header's low byte (seqs are small) */
    cr_assert_eq(pthread_join(th, NULL), 0);
    cr_assert_eq(bs.rc, 0);
    big_reply(&w, wseq);
    for (int i = 1; i < 4; i++) {
        cr_assert_eq(sync_client_send(&h[i].c, fr[i].data + part, fr[i].len - part), 0);
        big_reply(&h[i], fr[i].data[8]);
    }
    ping(&w); /* nothing left over: every session goes on */
    for (int i = 0; i < 4; i++) {
        proto_buf_free(&fr[i]);
        client_close(&h[i]);
    }
    proto_buf_free(&wf);
    client_close(&w);
    client_close(&other);
    srv_stop(&s);
    cr_assert(log_has(&s, "waits: input_budget_bytes (8 MiB) is held by other connections' "
                          "unfinished frames (1 waited so far"));
    rm_dir(&s);
}

/* The waiter's frame begins first (60 KiB: within its first 64 KiB), then
 * four holders take the budget with unfinished 2 MiB frames and stall, and
 * the waiter sends the rest and waits.  frame_timeout_ms ends the holders,
 * which gives the budget to the waiter: read, answered and connected,
 * although its frame began more than frame_timeout_ms before it was read
 * (its deadline does not run while it waits, holding none of the budget). */
Test(server, stalled_frames_holding_input_budget_bytes_end_and_the_waiter_goes_on)
{
    struct srv s;
    srv_start(&s, "\"input_budget_bytes\": \"8MiB\", \"frame_timeout_ms\": 2000");
    struct client h[4], w;
    struct proto_buf fr[4] = {{0}}, wf = {0};
    client_open(&w, s.path, PROTO_ROLE_LOOKUP, 0, "waiter");
    uint64_t wseq = w.c.next_seq++;
    big_lookup(&wf, 9, wseq);
    const size_t first = 60 << 10;
    cr_assert_eq(sync_client_send(&w.c, wf.data, first), 0); /* its deadline starts */
    tu_sleep_ms(1000); /* the holders' frames begin a second later: they end later too */
    for (int i = 0; i < 4; i++) {
        client_open(&h[i], s.path, PROTO_ROLE_LOOKUP, 0, "staller");
        big_lookup(&fr[i], (uint8_t)i, h[i].c.next_seq++);
        cr_assert_eq(sync_client_send(&h[i].c, fr[i].data, 1 << 20), 0);
    }
    /* read once the holders end, 2 s after they began: 3 s after its own start */
    cr_assert_eq(sync_client_send(&w.c, wf.data + first, wf.len - first), 0);
    big_reply(&w, wseq);
    for (int i = 0; i < 4; i++)
        cr_assert(reads_eof(h[i].c.fd), "a stalled frame's session was kept");
    ping(&w);
    for (int i = 0; i < 4; i++) {
        proto_buf_free(&fr[i]);
        client_close(&h[i]);
    }
    proto_buf_free(&wf);
    client_close(&w);
    srv_stop(&s);
    cr_assert(log_has(&s, "waits: input_budget_bytes (8 MiB)"), "the waiter never waited");
    rm_dir(&s);
}

/* A TCP port of 127.0.0.1 that was free a moment ago (bound to 0, closed). */
static unsigned free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, len), 0, "bind: %s", strerror(errno));
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* srv_start with metrics_port on a free port of 127.0.0.1 (another one
 * when someone took it meanwhile); returns the port. */
static unsigned srv_start_metrics_in(struct srv *s, const char *extra)
{
    for (int i = 0; i < 5; i++) {
        char more[512], json[2048];
        unsigned port = free_port();
        int status;
        snprintf(more, sizeof(more), "%s, \"metrics_port\": %u", extra, port);
        config(s, more, json, sizeof(json));
        s->pid = spawn(json, s->log);
        if (serving(s, &status))
            return port;
        const char *text = tu_slurp(s->log);
        cr_assert(strstr(text, "Address already in use"),
                  "umbp-server exited (status 0x%x) before serving:\n%s", status, text);
        unlink(s->log);
    }
    cr_assert_fail("no free metrics port in 5 tries");
    return 0;
}

static unsigned srv_start_metrics(struct srv *s, const char *extra)
{
    make_dir(s);
    return srv_start_metrics_in(s, extra);
}

/* A series of /metrics once it shows `want` (scraped until then; a
 * scrape may see the snapshot of a moment before). */
static double metric_until(unsigned port, const char *series, double want)
{
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    for (;;) {
        char err[512] = "";
        char *body = tu_scrape("127.0.0.1", port, TU_WAIT_MS, err, sizeof(err));
        cr_assert_not_null(body, "%s", err);
        double v = tu_sample(body, series);
        free(body);
        if (v == want || tu_now_ms() > end)
            return v;
        tu_sleep_ms(10);
    }
}

static int log_count(const struct srv *s, const char *needle)
{
    int n = 0;
    for (const char *p = tu_slurp(s->log); (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* Whether the server ends fd's connection within ms: its hangup, seen
 * without reading (reading would drain a paused session's replies, and
 * the server would resume it). */
static bool hangup_within(int fd, int ms)
{
    struct pollfd q = {.fd = fd, .events = POLLRDHUP};
    int n;
    while ((n = poll(&q, 1, ms)) < 0 && errno == EINTR)
        ;
    return n == 1 && (q.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

#define PAUSE_OBJECTS (3 * BIG_KEYS) /* a CLEAR of them: 7 MiB of REMOVED events */

/* Four subscribers each send 1 MiB of a 2 MiB frame (their inputs grow:
 * input_budget_bytes all but taken), then a CLEAR of 196,608 objects
 * stored before they came queues 7 MiB of EVENTS to each, which none of
 * them reads; 4 KiB more of each frame finds its replies over
 * SRV_OUT_PAUSE, and the session is paused holding its budget (the log's
 * pause line for each, and umbp_input_budget_used_bytes, say so).  Their
 * frames' deadlines end them all the same, and a waiter's frame is then
 * read and answered.  With the deadline stopped for every paused session
 * (not only those holding no budget), the four stayed, never reading, and
 * the waiter waited for ever. */
Test(server, a_paused_session_holding_input_budget_bytes_ends_at_frame_timeout_ms)
{
    /* storing 196,608 keys may take over WRITE_MS on a loaded machine: this
     * test is about frame deadlines, not write deadlines */
    write_ms = END_WRITE_MS;
    const int timeout_ms = 5000; /* the pauses come 0.2-1 s after the frames begin */
    struct srv s;
    unsigned port = srv_start_metrics(&s, "\"input_budget_bytes\": \"8MiB\", "
                                      "\"frame_timeout_ms\": 5000, \"capacity_bytes\": \"64MiB\"");
    struct client wr, h[4], w;
    struct proto_buf fr[4] = {{0}}, wf = {0};
    client_open(&wr, s.path, PROTO_ROLE_WORKER, 0, "writer");
    umbp_key_t *k = calloc(BIG_KEYS, sizeof(*k));
    uint64_t *size = calloc(BIG_KEYS, sizeof(*size));
    struct proto_region_item *r = calloc(BIG_KEYS, sizeof(*r));
    int32_t *st = calloc(BIG_KEYS, sizeof(*st));
    cr_assert(k && size && r && st);
    for (uint64_t done = 0; done < PAUSE_OBJECTS; done += BIG_KEYS) {
        for (uint32_t i = 0; i < BIG_KEYS; i++) {
            k[i] = tu_key_id(30, done + i);
            size[i] = 256;
        }
        reserve(&wr, k, size, BIG_KEYS, r);
        tokens(&wr, PROTO_PUBLISH, k, r, BIG_KEYS, st);
        for (uint32_t i = 0; i < BIG_KEYS; i++)
            cr_assert_eq(st[i], 0, "publish %u: %d", i, st[i]);
    }
    const size_t part = 1 << 20;
    for (int i = 0; i < 4; i++) { /* their frames' deadlines start */
        client_open(&h[i], s.path, PROTO_ROLE_LOOKUP, PROTO_HELLO_EVENTS, "paused");
        big_lookup(&fr[i], (uint8_t)i, h[i].c.next_seq++);
        cr_assert_eq(sync_client_send(&h[i].c, fr[i].data, part), 0);
    }
    const double held = 4.0 * (double)(fr[0].len - SRV_IN_INITIAL);
    double used = metric_until(port, "umbp_input_budget_used_bytes", held);
    cr_assert_eq(used, held, "the four inputs did not grow (%.0f of input_budget_bytes used)",
                 used);
    struct proto_frame f;
    char err[256] = "";
    cr_assert_eq(sync_client_call(&wr.c, PROTO_CLEAR, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(f.type, PROTO_CLEAR_R); /* its events are queued before the four are read */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sync_client_send(&h[i].c, fr[i].data + part, 4 << 10), 0);
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (log_count(&s, "sends faster than it reads") < 4 && tu_now_ms() < end)
        tu_sleep_ms(10);
    cr_assert_eq(log_count(&s, "sends faster than it reads"), 4, "not all four were paused "
                 "(their frames' deadlines passed first?):\n%s", tu_slurp(s.log));
    used = metric_until(port, "umbp_input_budget_used_bytes", held);
    cr_assert_eq(used, held, "the paused sessions do not hold their budget (%.0f used)", used);

    client_open(&w, s.path, PROTO_ROLE_LOOKUP, 0, "waiter");
    uint64_t wseq = w.c.next_seq++;
    big_lookup(&wf, 9, wseq);
    struct big_send bs = {&w, wf.data, wf.len, -1};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, big_send_main, &bs), 0);
    for (int i = 0; i < 4; i++)
        cr_assert(hangup_within(h[i].c.fd, 10 * timeout_ms), "a paused session holding "
                  "input_budget_bytes was still connected %d ms later (frame_timeout_ms %d)",
                  10 * timeout_ms, timeout_ms);
    cr_assert_eq(pthread_join(th, NULL), 0);
    cr_assert_eq(bs.rc, 0);
    big_reply(&w, wseq);
    ping(&w);
    for (int i = 0; i < 4; i++) {
        proto_buf_free(&fr[i]);
        client_close(&h[i]);
    }
    proto_buf_free(&wf);
    free(k);
    free(size);
    free(r);
    free(st);
    client_close(&w);
    client_close(&wr);
    srv_stop(&s);
    cr_assert(log_has(&s, "waits: input_budget_bytes (8 MiB)"), "the waiter never waited");
    cr_assert_eq(log_count(&s, "a frame stayed incomplete for frame_timeout_ms (5000 ms"), 4);
    rm_dir(&s);
}

/* Before its HELLO a session takes none of the budget: a first frame larger
 * than its first 64 KiB of input ends it, with an ERROR saying so. */
Test(server, a_frame_over_64_kib_before_hello_ends_the_session)
{
    struct srv s;
    srv_start(&s, "");
    int fd = dial_raw(s.path);
    struct proto_buf b = {0};
    big_lookup(&b, 1, 1);
    cr_assert_gt(send(fd, b.data, 100 << 10, MSG_NOSIGNAL), 64 << 10); /* past 64 KiB */
    proto_buf_free(&b);
    char buf[4096];
    ssize_t n, got = 0;
    struct timeval tv = {.tv_sec = CLIENT_TIMEOUT_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    while ((n = recv(fd, buf + got, sizeof(buf) - (size_t)got, 0)) > 0 &&
           got + n < (ssize_t)sizeof(buf))
        got += n;
    cr_assert(n == 0 || (n < 0 && errno == ECONNRESET), "the session was kept");
    struct proto_frame f;
    char err[256];
    cr_assert_gt(proto_frame_parse((uint8_t *)buf, (size_t)got, true, &f, err, sizeof(err)), 0,
                 "no whole frame before the close: %s", err);
    struct proto_error pe;
    cr_assert_eq(f.type, PROTO_ERROR);
    cr_assert_eq(proto_get_error(&f, &pe), 0);
    cr_assert(strstr(pe.message, "before HELLO"), "ERROR says: %s", pe.message);
    close(fd);
    srv_stop(&s);
    rm_dir(&s);
}

/* input_budget_bytes below two of the largest frames is refused, naming it. */
Test(server, input_budget_bytes_below_8_mib_is_refused)
{
    struct srv s;
    make_dir(&s);
    cr_assert_neq(srv_run_failing(&s, "\"input_budget_bytes\": \"4MiB\""), 0);
    cr_assert(log_has(&s, "input_budget_bytes"), "the error does not name the option");
    rm_dir(&s);
}

/* ---- the documentation ---------------------------------------------------------------------- */

/* Every server option has a row, with its default, in the operations docs
 * (docs/operations.md, its standalone section). */
Test(server, docs_list_every_server_option)
{
    const char *ops = tu_slurp(UMBP_SOURCE_DIR "/docs/operations.md");
    cr_assert(ops[0], "docs/operations.md is missing or empty");
    for (const struct umbp_option *o = srv_options; o->name; o++) {
        char row[96], def[96];
        snprintf(row, sizeof(row), "| `%s` | ", o->name);
        snprintf(def, sizeof(def), "`%s`", o->def[0] ? o->def : "\"\"");
        const char *at = strstr(ops, row);
        cr_expect_not_null(at, "the docs have no row for server option %s", o->name);
        if (!at)
            continue;
        const char *eol = strchr(at, '\n'), *d = strstr(at, def);
        cr_expect(d && (!eol || d < eol), "the docs' row of %s should show default %s",
                  o->name, def);
    }
}

/* ---- a session's token table (server/track.c) ------------------------------------ */

/* Random adds and takes against a plain array: every token held is found
 * with its key, none that is not, through millions of cycles (the churn a
 * long-lived engine session makes) and growth. */
Test(server, token_table_matches_a_model)
{
    enum { N = 4096 };
    struct srv_track t;
    cr_assert_eq(track_init(&t, true), 0);
    static uint64_t tok[N];
    static bool held[N];
    uint64_t next = 1, x = 0x1234567;
    for (int round = 0; round < 400000; round++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t i = x % N;
        umbp_key_t k = tu_key_id(5, i);
        if (!held[i]) {
            tok[i] = next++ * 0x100000001ull; /* oids and (generation << 32 | slot) */
            cr_assert_eq(track_add(&t, tok[i], &k), 0);
            held[i] = true;
        } else {
            umbp_key_t other = tu_key_id(6, i);
            cr_assert(!track_take(&t, tok[i], &other), "taken with another key");
            cr_assert(track_take(&t, tok[i], &k), "token %zu lost", i);
            cr_assert(!track_take(&t, tok[i], &k), "token %zu taken twice", i);
            held[i] = false;
        }
    }
    size_t n = 0;
    for (size_t i = 0; i < N; i++)
        n += held[i];
    cr_assert_eq(t.n, n);
    for (size_t i = 0; i < N; i++) {
        umbp_key_t k = tu_key_id(5, i);
        cr_assert_eq(track_take(&t, tok[i], &k), held[i], "token %zu", i);
    }
    cr_assert_eq(t.n, 0);
    cr_assert(!track_take(&t, 0, NULL));
    track_fini(&t);
}

/* ---- a worker's session made ready at HELLO (session_warm) ------------------------ */

/* Runs the server's loop until the session has answered HELLO (HELLO_OK
 * read back, its pool descriptor closed). */
static void hello_in_process(struct umbp_server *s, int fd, uint8_t role)
{
    struct proto_buf b = {0};
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION, .role = role,
                            .write_deadline_ms = role == PROTO_ROLE_WORKER ? 1000 : 0};
    cr_assert_eq(proto_begin(&b, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(&b, &h), 0);
    cr_assert_eq(proto_end(&b), 0);
    cr_assert_eq(send(fd, b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
    proto_buf_free(&b);
    uint8_t buf[4096];
    for (int i = 0; i < 1000; i++) {
        ev_run(s->loop, EVRUN_NOWAIT);
        int pool_fd = -1;
        ssize_t n = proto_recv_with_fd(fd, buf, sizeof(buf), &pool_fd);
        if (pool_fd >= 0)
            close(pool_fd);
        if (n > 0)
            return;
    }
    cr_assert_fail("no answer to HELLO");
}

/* Whether every page of [p, p + len) is resident. */
static bool resident(const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095, e = (uintptr_t)p + len;
    size_t pages = (e - a + 4095) / 4096;
    unsigned char *v = malloc(pages);
    cr_assert_eq(mincore((void *)a, e - a, v), 0, "mincore: %s", strerror(errno));
    bool all = true;
    for (size_t i = 0; i < pages; i++)
        all = all && (v[i] & 1);
    free(v);
    return all;
}

/* A worker's first requests must not grow its token tables or buffers
 * (page faults and rehashes under the first store and restore: 200-300 us
 * each on the H200 host's first restore); an admin session makes nothing
 * ahead.  Fails with session_warm undone. */
static struct umbp_server *server_in_process(char *dir, size_t len, const char *extra)
{
    char json[512], err[512];
    snprintf(dir, len, "/tmp/umbp-test-warm-%d", (int)getpid());
    cr_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    snprintf(json, sizeof(json), "{\"socket_dir\": \"%s\", \"capacity_bytes\": \"2MiB\", "
             "\"log_level\": \"error\"%s}", dir, extra);
    struct umbp_server *s;
    cr_assert_eq(umbp_server_create(json, &s, err, sizeof(err)), 0, "%s", err);
    return s;
}

static void server_in_process_end(struct umbp_server *s, char *dir)
{
    for (int i = 0; i < 1000 && s->svc.nconns; i++)
        ev_run(s->loop, EVRUN_NOWAIT);
    cr_expect_eq(s->svc.nconns, 0);
    umbp_server_destroy(s);
    rmdir(dir);
}

Test(server, a_worker_session_is_ready_for_its_first_requests)
{
    char dir[64];
    struct umbp_server *s = server_in_process(dir, sizeof(dir), "");
    int w[2], a[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, w), 0);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, a), 0);
    struct srv_session *worker = session_open(s, w[0], getpid(), geteuid(), getegid());
    struct srv_session *admin = session_open(s, a[0], getpid(), geteuid(), getegid());
    cr_assert(worker && admin);
    hello_in_process(s, w[1], PROTO_ROLE_WORKER);
    hello_in_process(s, a[1], PROTO_ROLE_ADMIN);

    const size_t keys = 1024; /* session_warm_keys' default */
    const struct srv_track *tr[] = {&worker->reservations, &worker->leases};
    for (int i = 0; i < 2; i++) {
        cr_expect_geq(tr[i]->cap, 2 * keys, "%s table: %zu slots",
                      i ? "lease" : "reservation", tr[i]->cap);
        cr_expect(resident(tr[i]->slots, tr[i]->cap * sizeof(*tr[i]->slots)),
                  "%s table not touched", i ? "lease" : "reservation");
    }
    const struct proto_buf *bufs[] = {&worker->reply, &worker->conn.out};
    for (int i = 0; i < 2; i++) {
        cr_expect_geq(bufs[i]->cap - bufs[i]->len, keys * PROTO_REGION_ITEM_SIZE,
                      "%s: room for %zu bytes",
                      i ? "output" : "reply", bufs[i]->cap - bufs[i]->len);
        if (bufs[i]->cap)
            cr_expect(resident(bufs[i]->data, bufs[i]->cap), "%s not touched",
                      i ? "output" : "reply");
    }
    cr_expect(resident(worker->conn.in, keys * PROTO_TOKEN_ITEM_SIZE), "input not touched");
    cr_expect_lt(admin->reservations.cap, 2 * keys, "an admin session warmed");
    cr_expect_eq(admin->reply.cap, 0, "an admin session warmed");

    /* the tables made ahead hold what they were made for without growing */
    struct srv_track_slot *slots = worker->leases.slots;
    for (uint64_t t = 1; t <= keys; t++)
        cr_assert_eq(track_add(&worker->leases, t << 32 | t, NULL), 0);
    cr_expect(worker->leases.slots == slots, "the lease table grew");
    for (uint64_t t = 1; t <= keys; t++)
        cr_assert(track_take(&worker->leases, t << 32 | t, NULL), "token %llu lost",
                  (unsigned long long)t);
    close(w[1]);
    close(a[1]);
    server_in_process_end(s, dir);

    /* session_warm_keys 0: a worker makes nothing ahead either */
    s = server_in_process(dir, sizeof(dir), ", \"session_warm_keys\": 0");
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, w), 0);
    worker = session_open(s, w[0], getpid(), geteuid(), getegid());
    cr_assert(worker);
    hello_in_process(s, w[1], PROTO_ROLE_WORKER);
    cr_expect_lt(worker->leases.cap, 2 * keys, "warmed with session_warm_keys 0");
    cr_expect_eq(worker->reply.cap, 0, "warmed with session_warm_keys 0");
    close(w[1]);
    server_in_process_end(s, dir);
}

/* track_presize on a table that holds tokens keeps every one. */
Test(server, presizing_a_token_table_keeps_what_it_holds)
{
    struct srv_track t;
    cr_assert_eq(track_init(&t, true), 0);
    for (uint64_t i = 1; i <= 20; i++) {
        umbp_key_t k = tu_key_id(7, i);
        cr_assert_eq(track_add(&t, i * 0x100000001ull, &k), 0);
    }
    cr_assert_eq(track_presize(&t, 5000), 0);
    cr_assert_geq(t.cap, 10000);
    size_t cap = t.cap;
    cr_assert_eq(track_presize(&t, 100), 0);
    cr_assert_eq(t.cap, cap, "presizing to less shrank the table");
    for (uint64_t i = 1; i <= 20; i++) {
        umbp_key_t k = tu_key_id(7, i);
        cr_assert(track_take(&t, i * 0x100000001ull, &k), "token %llu lost",
                  (unsigned long long)i);
    }
    cr_assert_eq(t.n, 0);
    track_fini(&t);
}

/* ---- namespaces across a restart ---------------------------------------------------- */

#define NSR_OBJ (256 * KiB)

/* Stores objects first..first+n-1 of tenant `tag` as a client of namespace
 * `ns`. */
static void store_as(const struct srv *s, const char *ns, unsigned tag, uint32_t first,
                     uint32_t n)
{
    enum { MAX = 16 };
    umbp_key_t k[MAX];
    uint64_t size[MAX];
    struct proto_region_item r[MAX];
    int32_t st[MAX];
    struct client cl;
    cr_assert_leq(n, MAX);
    client_ns = ns;
    client_open(&cl, s->path, PROTO_ROLE_WORKER, 0, "tenant");
    for (uint32_t i = 0; i < n; i++) {
        k[i] = tu_key_id(0x45e000 + tag, first + i);
        size[i] = NSR_OBJ;
    }
    reserve(&cl, k, size, n, r);
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_eq(r[i].status, 0, "%s: reserve %u: %d", ns, first + i, r[i].status);
        tu_fill_from_key(&k[i], 0, cl.pool + r[i].offset, size[i]);
    }
    tokens(&cl, PROTO_PUBLISH, k, r, n, st);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(st[i], 0);
    client_close(&cl);
}

static bool stored(const struct srv *s, unsigned tag, uint32_t i)
{
    struct client cl;
    umbp_key_t k = tu_key_id(0x45e000 + tag, i);
    uint8_t present;
    client_open(&cl, s->path, PROTO_ROLE_WORKER, 0, "look");
    lookup(&cl, &k, 1, &present);
    client_close(&cl);
    return present;
}

static double ns_metric(unsigned port, const char *family, unsigned id, const char *name,
                        double want)
{
    char series[256];
    snprintf(series, sizeof(series), "%s{namespace_id=\"%u\",namespace=\"%s\"}", family, id,
             name);
    return metric_until(port, series, want);
}

/* A server killed (-9) and started again on its named pool counts every
 * adopted object in the namespace that stored it, found by name: the new
 * server lists its quotas in another order, so "a" has another number; a's
 * quota covers its objects from before the restart, and its next store
 * past the quota evicts a's own oldest, none of b's. */
Test(server, adopted_objects_count_in_their_namespace)
{
    char pool[64], extra[256];
    snprintf(pool, sizeof(pool), "umbp-test-nsadopt-%d", (int)getpid());
    tu_rm_named_pool(pool);
    struct srv s;
    snprintf(extra, sizeof(extra), "\"dram_shm_name\": \"%s\", "
             "\"namespace_quotas\": \"a=2MiB,b=8MiB\"", pool);
    unsigned port = srv_start_metrics(&s, extra);
    store_as(&s, "a", 'a', 0, 6);  /* 1.5 MiB of a's 2 */
    store_as(&s, "b", 'b', 0, 4);
    cr_assert_eq(ns_metric(port, "umbp_namespace_objects", 1, "a", 6), 6);

    kill(s.pid, SIGKILL);
    int status;
    cr_assert_eq(waitpid(s.pid, &status, 0), s.pid);
    snprintf(extra, sizeof(extra), "\"dram_shm_name\": \"%s\", "
             "\"namespace_quotas\": \"b=8MiB,a=2MiB\"", pool); /* now b is 1, a is 2 */
    port = srv_start_metrics_in(&s, extra);
    cr_assert(log_has(&s, "adopted"), "the server did not adopt the pool");
    double a_objs = ns_metric(port, "umbp_namespace_objects", 2, "a", 6);
    double a_bytes = ns_metric(port, "umbp_namespace_used_bytes", 2, "a", 6 * NSR_OBJ);
    double b_objs = ns_metric(port, "umbp_namespace_objects", 1, "b", 4);
    cr_assert(a_objs == 6 && a_bytes == 6 * NSR_OBJ && b_objs == 4,
              "after adoption: a has %.0f objects (%.0f bytes), b %.0f; want 6 (%llu), 4",
              a_objs, a_bytes, b_objs, (unsigned long long)(6 * NSR_OBJ));
    cr_assert_eq(ns_metric(port, "umbp_namespace_objects", 0, "", -1), -1,
                 "adopted objects counted in the default namespace");

    store_as(&s, "a", 'a', 6, 4); /* 2.5 MiB: past a's quota by 2 objects */
    cr_assert_eq(ns_metric(port, "umbp_namespace_used_bytes", 2, "a", 2 * MiB), 2 * MiB);
    cr_assert_eq(ns_metric(port, "umbp_namespace_evictions_total", 2, "a", 2), 2);
    for (uint32_t i = 0; i < 2; i++)
        cr_assert(!stored(&s, 'a', i), "a's oldest object %u survived its quota", i);
    for (uint32_t i = 2; i < 10; i++)
        cr_assert(stored(&s, 'a', i), "a lost object %u", i);
    for (uint32_t i = 0; i < 4; i++)
        cr_assert(stored(&s, 'b', i), "b lost object %u to a's quota", i);
    srv_stop(&s);
    tu_rm_named_pool(pool);
    rm_dir(&s);
}
