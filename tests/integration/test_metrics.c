/*
 * test_metrics.c - umbp-server's /metrics endpoint as Prometheus sees it:
 * every test starts the real binary (UMBP_SERVER_BIN) with metrics_port on a
 * free port, in a private socket directory, and scrapes it with a raw TCP
 * client ("GET /metrics HTTP/1.0", read to the end).  What is checked is
 * what a user of a dashboard relies on: the answer is the text format
 * 0.0.4; the gauges and counters follow what a protocol client
 * (server/sync_client.c) just did; request latencies are counted; label
 * values a client chose are escaped; only /metrics is served; a metrics
 * port already taken stops a second server, naming metrics_port.
 *
 * A scrape sees a snapshot the server's loop renders when asked; a loop
 * slower than 100 ms answers with the previous one, so checks of values
 * scrape until the value shows (bounded by TU_WAIT_MS, to turn hangs into
 * failures; nothing asserts how long anything takes).  The server logs to
 * <dir>/server.log; a stopped server must exit 0 (in the sanitizer build
 * that includes LeakSanitizer's verdict).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto.h"
#include "scrape.h"
#include "sync_client.h"
#include "test_util.h"

#define CLIENT_TIMEOUT_MS 30000
#define PORT_TRIES 8

/* ---- a server process ---------------------------------------------------------- */

struct srv {
    pid_t pid;
    char dir[64];
    char path[128];
    char log[128];
    unsigned port;
};

static bool log_has(const struct srv *s, const char *needle)
{
    return strstr(tu_slurp(s->log), needle) != NULL;
}

/* A port nobody listens on now (the kernel's pick for port 0); another
 * process may still take it before the server does, hence the retries in
 * srv_start. */
static unsigned free_port(int family)
{
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        len = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof(*a);
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    cr_assert_eq(bind(fd, (struct sockaddr *)&ss, len), 0, "bind: %s", strerror(errno));
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
    unsigned port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    close(fd);
    return port;
}

static pid_t spawn(const char *json, const char *log)
{
    return tu_spawn_server(UMBP_SERVER_BIN, json, log);
}

static void config(const struct srv *s, const char *extra, char *json, size_t len)
{
    snprintf(json, len, "{\"socket_dir\": \"%s\", \"capacity_bytes\": \"16MiB\", "
             "\"log_level\": \"info\", \"metrics_port\": %u%s%s}", s->dir, s->port,
             extra[0] ? ", " : "", extra);
}

static void make_dir(struct srv *s)
{
    snprintf(s->dir, sizeof(s->dir), "/tmp/umbp-test-XXXXXX");
    cr_assert_not_null(mkdtemp(s->dir));
    snprintf(s->path, sizeof(s->path), "%s/umbp-dp0.sock", s->dir);
    snprintf(s->log, sizeof(s->log), "%s/server.log", s->dir);
}

/* Polls the socket with PING until it answers: true; false if the server
 * exited first (its status in *status). */
static bool wait_ready(const struct srv *s, int *status)
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

/* Starts a server with metrics on a free port of `address` (an IPv4 or IPv6
 * literal), picking another port when someone took the first meanwhile. */
static void srv_start_on(struct srv *s, const char *address)
{
    char extra[128], json[2048];
    int family = strchr(address, ':') ? AF_INET6 : AF_INET;
    make_dir(s);
    snprintf(extra, sizeof(extra), "\"metrics_address\": \"%s\"", address);
    for (int i = 0; i < PORT_TRIES; i++) {
        int status;
        s->port = free_port(family);
        config(s, extra, json, sizeof(json));
        s->pid = spawn(json, s->log);
        if (wait_ready(s, &status))
            return;
        const char *text = tu_slurp(s->log);
        cr_assert(strstr(text, "Address already in use"),
                  "umbp-server exited (status 0x%x) before serving:\n%s", status, text);
        unlink(s->log);
    }
    cr_assert_fail("no free metrics port in %d tries", PORT_TRIES);
}

static void srv_start(struct srv *s) { srv_start_on(s, "127.0.0.1"); }

/* SIGTERM; expects a clean exit. */
static void srv_stop(struct srv *s)
{
    int status;
    cr_assert_eq(kill(s->pid, SIGTERM), 0);
    cr_assert_eq(waitpid(s->pid, &status, 0), s->pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "umbp-server did not exit cleanly (status 0x%x):\n%s", status, tu_slurp(s->log));
}

static void rm_dir(const struct srv *s)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", s->dir);
    cr_assert_eq(system(cmd), 0);
}

/* ---- a scraper (tests/common/scrape.h) ------------------------------------------------- */

/* Sends `request` to address:port and reads the whole answer, or fails. */
static struct tu_http_reply http(const char *address, unsigned port, const char *request)
{
    struct tu_http_reply h;
    char err[768];
    int rc = tu_http(address, port, request, TU_WAIT_MS, &h, err, sizeof(err));
    cr_assert_eq(rc, 0, "%s", err);
    return h;
}

static struct tu_http_reply scrape(const struct srv *s, const char *address)
{
    struct tu_http_reply h = http(address, s->port, "GET /metrics HTTP/1.0\r\n\r\n");
    cr_assert_eq(h.status, 200, "GET /metrics: %d\n%s", h.status, h.body);
    return h;
}

/* Scrapes until `series` shows at least `min`; returns the last value. */
static double scrape_until(const struct srv *s, const char *series, double min)
{
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    for (;;) {
        struct tu_http_reply h = scrape(s, "127.0.0.1");
        double v = tu_sample(h.body, series);
        if (v >= min || tu_now_ms() >= end) {
            cr_assert(v >= min, "%s is %g, expected at least %g; the scrape:\n%s", series, v,
                      min, h.body);
            free(h.body);
            return v;
        }
        free(h.body);
        tu_sleep_ms(10);
    }
}

/* ---- a protocol client ------------------------------------------------------------------- */

static void worker_open(struct sync_client *c, const char *path, const char *engine,
                        const char *name_space)
{
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                            .role = PROTO_ROLE_WORKER, .pid = (uint32_t)getpid(),
                            .write_deadline_ms = 2000};
    char err[512] = "";
    snprintf(h.engine_id, sizeof(h.engine_id), "%s", engine);
    snprintf(h.name_space, sizeof(h.name_space), "%s", name_space);
    int rc = sync_client_connect(c, path, &h, CLIENT_TIMEOUT_MS, err, sizeof(err));
    cr_assert_eq(rc, 0, "connect to %s: %d: %s", path, rc, err);
}

static void recv_reply(struct sync_client *c, uint64_t seq, uint16_t type,
                       struct proto_frame *f)
{
    char err[256] = "";
    int rc;
    do
        rc = sync_client_recv(c, f, err, sizeof(err));
    while (rc == 0 && f->type == PROTO_EVENTS);
    cr_assert_eq(rc, 0, "waiting for %s: %d: %s", proto_type_name(type), rc, err);
    cr_assert_eq(f->type, type, "got %s", proto_type_name(f->type));
    cr_assert_eq(f->seq, seq);
}

static void send_frame(struct sync_client *c, struct proto_buf *b)
{
    cr_assert_eq(proto_end(b), 0);
    cr_assert_eq(sync_client_send(c, b->data, b->len), 0);
    proto_buf_free(b);
}

static struct proto_region_item reserve_one(struct sync_client *c, const umbp_key_t *k,
                                            uint64_t size)
{
    struct proto_buf b = {0};
    struct proto_frame f;
    struct proto_region_item r;
    struct proto_reserve_item it = {.key = *k, .size = size};
    uint64_t seq = c->next_seq++;
    cr_assert_eq(proto_begin(&b, PROTO_RESERVE, seq, 1, 0), 0);
    proto_put_reserve_item(&b, &it);
    send_frame(c, &b);
    recv_reply(c, seq, PROTO_RESERVE_R, &f);
    cr_assert_eq(proto_get_region_item(&f, 0, &r), 0);
    cr_assert_eq(r.status, 0, "reserve: %d", r.status);
    return r;
}

static void publish_one(struct sync_client *c, const umbp_key_t *k,
                        const struct proto_region_item *r)
{
    struct proto_buf b = {0};
    struct proto_frame f;
    struct proto_token_item it = {.key = *k, .token = r->token};
    int32_t st;
    uint64_t seq = c->next_seq++;
    cr_assert_eq(proto_begin(&b, PROTO_PUBLISH, seq, 1, 0), 0);
    proto_put_token_item(&b, &it);
    send_frame(c, &b);
    recv_reply(c, seq, PROTO_PUBLISH_R, &f);
    cr_assert_eq(proto_get_status(&f, 0, &st), 0);
    cr_assert_eq(st, 0, "publish: %d", st);
}

/* ---- the tests ------------------------------------------------------------------------------ */

#define RESERVE_COUNT "umbp_request_duration_seconds_count{type=\"RESERVE\"}"
#define RESERVE_INF "umbp_request_duration_seconds_bucket{type=\"RESERVE\",le=\"+Inf\"}"

Test(metrics, scrape_follows_a_store)
{
    struct srv s;
    srv_start(&s);
    struct tu_http_reply h = scrape(&s, "127.0.0.1");
    cr_assert(strncmp(h.content_type, "text/plain; version=0.0.4", 25) == 0,
              "Content-Type: %s", h.content_type);
    cr_assert_eq(tu_sample(h.body, "umbp_capacity_bytes"), 16.0 * 1024 * 1024);
    cr_assert_eq(tu_sample(h.body, "umbp_objects"), 0);
    cr_assert(strstr(h.body, "# TYPE umbp_objects gauge\n"), "no TYPE line:\n%s", h.body);
    cr_assert(strstr(h.body, "# HELP umbp_reserves_total "), "no HELP line:\n%s", h.body);
    cr_assert(strstr(h.body, "# TYPE umbp_request_duration_seconds histogram\n"));
    double reserves_before = tu_sample(h.body, RESERVE_COUNT);
    cr_assert_eq(reserves_before, 0);
    free(h.body);

    struct sync_client c;
    worker_open(&c, s.path, "eng-\"a\"\\1", "ns-test");
    umbp_key_t k = tu_key_id(7, 1);
    struct proto_region_item r = reserve_one(&c, &k, 4096);
    scrape_until(&s, "umbp_pending", 1);
    publish_one(&c, &k, &r);

    scrape_until(&s, "umbp_objects", 1);
    h = scrape(&s, "127.0.0.1");
    cr_assert_eq(tu_sample(h.body, "umbp_objects"), 1, "%s", h.body);
    cr_assert_eq(tu_sample(h.body, "umbp_pending"), 0);
    cr_assert(tu_sample(h.body, "umbp_used_bytes") >= 4096);
    cr_assert_eq(tu_sample(h.body, "umbp_reserves_total"), 1);
    cr_assert_eq(tu_sample(h.body, "umbp_publishes_total"), 1);
    cr_assert(tu_sample(h.body, "umbp_sessions") >= 1);
    /* small frames take nothing of input_budget_bytes, and nothing waited */
    cr_assert_eq(tu_sample(h.body, "umbp_input_budget_used_bytes"), 0, "%s", h.body);
    cr_assert_eq(tu_sample(h.body, "umbp_input_budget_waits_total"), 0);
    cr_assert(tu_sample(h.body, RESERVE_COUNT) >= reserves_before + 1, "%s", h.body);
    cr_assert_eq(tu_sample(h.body, RESERVE_INF), tu_sample(h.body, RESERVE_COUNT));
    cr_assert(tu_sample(h.body, "umbp_request_duration_seconds_count{type=\"PUBLISH\"}") >= 1);
    /* the session's namespace "ns-test" is the server's namespace 1 */
    cr_assert_eq(tu_sample(h.body,
                           "umbp_namespace_objects{namespace_id=\"1\",namespace=\"ns-test\"}"),
                 1, "%s", h.body);

    /* the engine id a client chose, escaped as the text format requires */
    char series[256];
    snprintf(series, sizeof(series), "umbp_session_reservations{session=\"%llu\",pid=\"%d\","
             "role=\"worker\",engine_id=\"eng-\\\"a\\\"\\\\1\",namespace=\"ns-test\"}",
             (unsigned long long)c.welcome.session_id, (int)getpid());
    cr_assert_eq(tu_sample(h.body, series), 0, "no series %s in:\n%s", series, h.body);
    free(h.body);

    sync_client_close(&c);
    srv_stop(&s);
    rm_dir(&s);
}

Test(metrics, only_get_metrics_is_served)
{
    struct srv s;
    srv_start(&s);
    struct tu_http_reply h = http("127.0.0.1", s.port, "GET /other HTTP/1.0\r\n\r\n");
    cr_assert_eq(h.status, 404, "GET /other: %d", h.status);
    free(h.body);
    h = http("127.0.0.1", s.port, "GET / HTTP/1.0\r\n\r\n");
    cr_assert_eq(h.status, 404, "GET /: %d", h.status);
    free(h.body);
    h = http("127.0.0.1", s.port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    cr_assert_eq(h.status, 405, "POST /metrics: %d", h.status);
    free(h.body);
    h = http("127.0.0.1", s.port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
    cr_assert_eq(h.status, 200, "GET /metrics?x=1: %d", h.status);
    free(h.body);
    srv_stop(&s);
    rm_dir(&s);
}

Test(metrics, a_taken_port_stops_a_second_server)
{
    struct srv a, b;
    char json[2048];
    int status;
    srv_start(&a);
    b = a; /* same metrics port, another socket in the same directory */
    snprintf(b.log, sizeof(b.log), "%s/second.log", a.dir);
    config(&b, "\"lookup_instance\": \"second\"", json, sizeof(json));
    pid_t pid = spawn(json, b.log);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x", status);
    char where[64];
    snprintf(where, sizeof(where), "127.0.0.1:%u", a.port);
    cr_assert(log_has(&b, "metrics_port"), "the refusal does not name metrics_port");
    cr_assert(log_has(&b, where), "the refusal does not name %s", where);
    struct stat st;
    char sock[160];
    snprintf(sock, sizeof(sock), "%s/umbp-dp0-second.sock", a.dir);
    cr_assert(lstat(sock, &st) < 0, "the refused server left its socket %s", sock);
    /* the first one is untouched */
    struct tu_http_reply h = scrape(&a, "127.0.0.1");
    free(h.body);
    srv_stop(&a);
    rm_dir(&a);
}

Test(metrics, ipv6_address)
{
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in6 lo = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool have_v6 = fd >= 0 && bind(fd, (struct sockaddr *)&lo, sizeof(lo)) == 0;
    if (fd >= 0)
        close(fd);
    if (!have_v6)
        cr_skip_test("no IPv6 loopback (::1) on this host");
    struct srv s;
    srv_start_on(&s, "::1");
    struct tu_http_reply h = scrape(&s, "::1");
    cr_assert(tu_sample(h.body, "umbp_capacity_bytes") > 0, "%s", h.body);
    free(h.body);
    char where[64];
    snprintf(where, sizeof(where), "http://[::1]:%u/metrics", s.port);
    cr_assert(log_has(&s, where), "no start-up line naming %s", where);
    srv_stop(&s);
    rm_dir(&s);
}
