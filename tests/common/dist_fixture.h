/*
 * dist_fixture.h - the processes of the distributed-mode tests: umbp-master
 * on a free loopback port (struct master, with extra JSON options) and
 * umbp-dist-node processes (tests/integration/dist_node.c: one runtime
 * each, driven over pipes; UCX over tcp on lo), with their answers parsed
 * and checked byte-exact (`wrong` must be 0 in every get), bounded waits on
 * outcomes (a key found, a get that hits), and the logs printed on failure.
 * Used by test_distributed and test_failover.
 *
 * Needs UMBP_DIST_NODE_BIN and UMBP_MASTER_BIN (the build defines them);
 * DIST_TEST_NAME (default "test_distributed") prefixes the logs in /tmp.
 */
#ifndef UMBP_TEST_DIST_FIXTURE_H
#define UMBP_TEST_DIST_FIXTURE_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"
#include "umbp/umbp.h"

#ifndef UMBP_DIST_NODE_BIN
#error "UMBP_DIST_NODE_BIN must name the umbp-dist-node binary"
#endif
#ifndef UMBP_MASTER_BIN
#error "UMBP_MASTER_BIN must name the umbp-master binary"
#endif
#ifndef DIST_TEST_NAME
#define DIST_TEST_NAME "test_distributed"
#endif

#define ANSWER_MS 90000 /* bound on one answer: far past every timeout a node has */
#define LEARN_TRIES 400 /* outcome loops: LEARN_TRIES x 50 ms at most */

static inline void pause_ms(int ms) { usleep((useconds_t)ms * 1000); }

static inline uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* The logs of the masters started (distinct paths): failures print them. */
#define DIST_MASTER_LOGS 4
static char dist_master_logs[DIST_MASTER_LOGS][160];

static inline void dist_note_master_log(const char *path)
{
    for (int i = 0; i < DIST_MASTER_LOGS; i++) {
        if (!strcmp(dist_master_logs[i], path))
            return;
        if (!dist_master_logs[i][0]) {
            snprintf(dist_master_logs[i], sizeof(dist_master_logs[i]), "%s", path);
            return;
        }
    }
}

static inline void dump_master_log(void)
{
    for (int i = 0; i < DIST_MASTER_LOGS && dist_master_logs[i][0]; i++)
        cr_log_error("umbp-master's log (%s):\n%s", dist_master_logs[i],
                     tu_slurp(dist_master_logs[i]));
}

/* ---- the master ----------------------------------------------------------------- */

struct master {
    pid_t pid;
    uint16_t port;
    char addr[64];
    char log[160];
    char extra[512];
};

static inline uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static inline bool accepts(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* Starts umbp-master on m->port (0: a free one) with m->extra (JSON members):
 * 0 once it accepts, or -EADDRINUSE when it exited because a port it was
 * given (listen, metrics_port) was taken meanwhile: a free port is only free
 * when it is picked, and the other tests of a parallel run (or any
 * connection's ephemeral port) may take it before the master binds it.
 * Any other exit fails the test. */
static inline int master_try_start(struct master *m)
{
    if (!m->port)
        m->port = free_port();
    snprintf(m->addr, sizeof(m->addr), "127.0.0.1:%u", m->port);
    if (!m->log[0])
        snprintf(m->log, sizeof(m->log), "/tmp/" DIST_TEST_NAME ".%s.master.%u.log", tu_run_tag(),
                 m->port);
    dist_note_master_log(m->log);
    struct stat sb;
    size_t from = stat(m->log, &sb) == 0 ? (size_t)sb.st_size : 0; /* this start's lines */
    char json[1024];
    snprintf(json, sizeof(json),
             "{\"listen\": \"%s\", \"log_level\": \"info\", \"heartbeat_suspect_ms\": 1000, "
             "\"heartbeat_dead_ms\": 2000%s%s}",
             m->addr, m->extra[0] ? ", " : "", m->extra);
    m->pid = fork();
    cr_assert_geq(m->pid, 0);
    if (m->pid == 0) {
        int fd = open(m->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(UMBP_MASTER_BIN, "umbp-master", "--json", json, (char *)NULL);
        _exit(127);
    }
    /* ready when this start's log says it serves (both ports bound): a
     * connection alone may reach whoever holds the port */
    for (int i = 0; i < 1000; i++) {
        if (strstr(tu_slurp_from(m->log, from), "umbp-master: serving") && accepts(m->port))
            return 0;
        int st;
        if (waitpid(m->pid, &st, WNOHANG) == m->pid) {
            m->pid = 0;
            const char *mine = tu_slurp_from(m->log, from);
            if (strstr(mine, "Address already in use"))
                return -EADDRINUSE;
            cr_assert_fail("umbp-master exited; log:\n%s", mine);
        }
        pause_ms(10);
    }
    cr_assert_fail("umbp-master does not serve on %s; log:\n%s", m->addr, tu_slurp(m->log));
    return -ETIMEDOUT;
}

/* master_try_start that copes with a port taken meanwhile: a first start
 * (m->port 0) moves to a fresh port; a restart keeps its port, since the
 * nodes know the master by it, and tries again for a few seconds (a port
 * taken by another connection's ephemeral end is free again when that
 * connection ends).  Ports named in m->extra are the caller's to renew. */
static inline void master_start(struct master *m)
{
    bool fresh = m->port == 0;
    for (int attempt = 0;; attempt++) {
        int rc = master_try_start(m);
        if (rc == 0)
            return;
        cr_assert_lt(attempt, fresh ? 4 : 50,
                     "umbp-master: a port of %s was taken before it could bind it, %d times; "
                     "log:\n%s", m->addr, attempt + 1, tu_slurp(m->log));
        cr_log_info("umbp-master: a port of %s was taken; %s", m->addr,
                    fresh ? "a fresh one" : "the same again in 100 ms");
        if (fresh)
            m->port = 0, m->log[0] = 0;
        else
            pause_ms(100);
    }
}

static inline void master_signal(struct master *m, int sig)
{
    int st;
    tu_kill_wait(m->pid, sig);
    if (sig == SIGKILL) {
        waitpid(m->pid, &st, 0);
        m->pid = 0;
    }
}

static inline void master_stop(struct master *m)
{
    if (m->pid) {
        kill(m->pid, SIGCONT);
        master_signal(m, SIGKILL);
    }
}

/* The master's log names `what` within a bounded wait. */
static inline bool log_has(const char *path, const char *what)
{
    for (int i = 0; i < LEARN_TRIES; i++) {
        if (strstr(tu_slurp(path), what))
            return true;
        pause_ms(50);
    }
    return false;
}

/* ---- nodes ------------------------------------------------------------------------ */

struct node {
    const char *name;
    pid_t pid;
    int in, out; /* its stdin (we write), its stdout (we read) */
    char rbuf[8192];
    size_t rlen;
    char line[8192];
    char log[160];
    bool eof; /* it closed its stdout: exited or crashed */
};

/* One line from the node, within ms; false on EOF or past the bound. */
static inline bool node_read(struct node *n, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    for (;;) {
        char *nl = memchr(n->rbuf, '\n', n->rlen);
        if (nl) {
            size_t len = (size_t)(nl - n->rbuf);
            memcpy(n->line, n->rbuf, len);
            n->line[len] = 0;
            memmove(n->rbuf, nl + 1, n->rlen - len - 1);
            n->rlen -= len + 1;
            return true;
        }
        uint64_t t = now_ms();
        if (t >= end || n->rlen == sizeof(n->rbuf))
            return false;
        struct pollfd p = {n->out, POLLIN, 0};
        int r = poll(&p, 1, (int)(end - t));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        ssize_t got = read(n->out, n->rbuf + n->rlen, sizeof(n->rbuf) - n->rlen);
        if (got <= 0) {
            n->eof = true;
            return false;
        }
        n->rlen += (size_t)got;
    }
}

/* Starts a node with the config json; the first line it printed is in
 * n->line ("ready" or "error <rc> <msg>"); false if it printed none. */
static inline bool node_spawn(struct node *n, const char *name, const char *json)
{
    int in[2], out[2];
    memset(n, 0, sizeof(*n));
    n->name = name;
    snprintf(n->log, sizeof(n->log), "/tmp/" DIST_TEST_NAME ".%s.%s.log", tu_run_tag(), name);
    cr_assert_eq(pipe2(in, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(out, O_CLOEXEC), 0);
    n->pid = fork();
    cr_assert_geq(n->pid, 0);
    if (n->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        int fd = open(n->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        dup2(fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setenv("UCX_TLS", "tcp", 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
        setenv("UCX_MEM_EVENTS", "no", 1);
        execl(UMBP_DIST_NODE_BIN, "umbp-dist-node", json, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    n->in = in[1];
    n->out = out[0];
    return node_read(n, ANSWER_MS);
}

static inline void node_start(struct node *n, const char *name, const char *json)
{
    cr_assert(node_spawn(n, name, json), "node %s printed nothing; log:\n%s", name,
              tu_slurp(n->log));
    cr_assert_str_eq(n->line, "ready", "node %s: %s; log:\n%s", name, n->line, tu_slurp(n->log));
}

/* A node answers "ready" once its runtime is up, which may be before the
 * master acked its REGISTER (until then its reads ask the master nothing:
 * remote keys miss).  Waits, bounded, for the ack's log line, which needs
 * the node's log_level at info or debug. */
static inline void node_wait_registered(struct node *n)
{
    uint64_t end = tu_now_ms() + ANSWER_MS;
    while (!log_has(n->log, "rdma: registered with the master") && tu_now_ms() < end)
        pause_ms(10);
    cr_assert(log_has(n->log, "rdma: registered with the master"),
              "node %s did not register within %d ms (log_level info or debug?); its log:\n%s",
              n->name, ANSWER_MS, tu_slurp(n->log));
}

/* Sends one command and returns its answer line (asserting one came). */
static inline const char *node_cmd(struct node *n, const char *fmt, ...)
{
    char cmd[256];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
    va_end(ap);
    cmd[len++] = '\n';
    cr_assert_eq(write(n->in, cmd, (size_t)len), len, "node %s: cannot write", n->name);
    cr_assert(node_read(n, ANSWER_MS), "node %s: %s '%.*s'; log:\n%s", n->name,
              n->eof ? "exited (or crashed) answering" : "no answer within the bound to",
              len - 1, cmd, tu_slurp(n->log));
    return n->line;
}

static inline void node_kill(struct node *n, int sig)
{
    int st;
    tu_kill_wait(n->pid, sig);
    if (sig == SIGKILL) {
        waitpid(n->pid, &st, 0);
        n->pid = 0;
        close(n->in);
        close(n->out);
    }
}

/* quit (bounded), else kill -9 */
static inline void node_stop(struct node *n)
{
    if (!n->pid)
        return;
    kill(n->pid, SIGCONT);
    if (write(n->in, "quit\n", 5) == 5 && node_read(n, ANSWER_MS)) {
        for (int i = 0; i < 2000; i++) {
            int st;
            if (waitpid(n->pid, &st, WNOHANG) == n->pid) {
                n->pid = 0;
                close(n->in);
                close(n->out);
                return;
            }
            pause_ms(10);
        }
    }
    node_kill(n, SIGKILL);
}

/* ---- answers ----------------------------------------------------------------------- */

/* Gets do not log their answers (loops that poll many times). */
static bool dist_quiet;

struct got {
    size_t hit, miss, wrong, dirty, quar, timeout, nattempt, reset, other;
};

static inline struct got node_get(struct node *n, const char *verb, uint64_t seed, uint64_t count,
                           uint64_t size)
{
    const char *a = size ? node_cmd(n, "%s %llu %llu %llu", verb, (unsigned long long)seed,
                                    (unsigned long long)count, (unsigned long long)size)
                         : node_cmd(n, "%s %llu %llu", verb, (unsigned long long)seed,
                                    (unsigned long long)count);
    struct got g;
    cr_assert_eq(sscanf(a, "ok %zu %zu %zu dirty=%zu quar=%zu timeout=%zu nattempt=%zu reset=%zu "
                           "other=%zu",
                        &g.hit, &g.miss, &g.wrong, &g.dirty, &g.quar, &g.timeout, &g.nattempt,
                        &g.reset, &g.other),
                 9, "node %s: %s %llu: '%s'", n->name, verb, (unsigned long long)seed, a);
    cr_assert_eq(g.hit + g.miss, count, "node %s: '%s'", n->name, a);
    cr_assert_eq(g.wrong, 0, "node %s: %s %llu: wrong bytes: '%s'", n->name, verb,
                 (unsigned long long)seed, a);
    if (!dist_quiet)
        cr_log_info("%s: %s %llu x%llu -> %s", n->name, verb, (unsigned long long)seed,
                    (unsigned long long)count, a);
    return g;
}

static inline struct got get(struct node *n, uint64_t seed, uint64_t count, uint64_t size)
{
    return node_get(n, "get", seed, count, size);
}

static inline struct got kvget(struct node *n, uint64_t seed, uint64_t count)
{
    return node_get(n, "kvget", seed, count, 0);
}

/* Bounded loop until a get of the keys hits them all (a peer that failed is
 * skipped for peer_failure_backoff_ms: its keys miss meanwhile). */
static inline void get_until_hit(struct node *n, uint64_t seed, uint64_t count, uint64_t size)
{
    for (int i = 0; i < LEARN_TRIES; i++) {
        if (get(n, seed, count, size).hit == count)
            return;
        pause_ms(50);
    }
    dump_master_log();
    cr_assert_fail("node %s: seed %llu never hit all %llu keys; log:\n%s", n->name,
                   (unsigned long long)seed, (unsigned long long)count, tu_slurp(n->log));
}

static inline void put(struct node *n, uint64_t seed, uint64_t count, uint64_t size)
{
    const char *a = node_cmd(n, "put %llu %llu %llu", (unsigned long long)seed,
                             (unsigned long long)count, (unsigned long long)size);
    size_t stored;
    cr_assert(sscanf(a, "ok %zu", &stored) == 1 && stored == count, "node %s: put %llu: '%s'",
              n->name, (unsigned long long)seed, a);
}

static inline void kvput(struct node *n, uint64_t seed, uint64_t count)
{
    const char *a = node_cmd(n, "kvput %llu %llu", (unsigned long long)seed,
                             (unsigned long long)count);
    size_t stored;
    cr_assert(sscanf(a, "ok %zu", &stored) == 1 && stored == count, "node %s: kvput %llu: '%s'",
                     n->name, (unsigned long long)seed, a);
}

/* How many of keys (seed, 0..count) node n's lookup finds; *prefix too. */
static inline size_t lookup(struct node *n, uint64_t seed, uint64_t count, size_t *prefix)
{
    const char *a = node_cmd(n, "lookup %llu %llu", (unsigned long long)seed,
                             (unsigned long long)count);
    size_t present, pre;
    int rc;
    cr_assert_eq(sscanf(a, "ok %zu %zu %d", &present, &pre, &rc), 3, "node %s: '%s'", n->name, a);
    if (prefix)
        *prefix = pre;
    return present;
}

/* Bounded loop until n's lookup finds `want` of the keys; asserts it did. */
static inline void until_found(struct node *n, uint64_t seed, uint64_t count, size_t want)
{
    size_t got = 0;
    for (int i = 0; i < LEARN_TRIES; i++) {
        if ((got = lookup(n, seed, count, NULL)) == want)
            return;
        pause_ms(50);
    }
    dump_master_log();
    cr_assert_fail("node %s: lookup of seed %llu finds %zu of %llu keys, want %zu; log:\n%s",
                   n->name, (unsigned long long)seed, got, (unsigned long long)count, want,
                   tu_slurp(n->log));
}

/* ---- configs ----------------------------------------------------------------------- */

/* A node's config: master_address is a host:port or a lease URL. */
static inline const char *node_json(char *buf, size_t cap, const char *master_address,
                                    const char *host, const char *extra)
{
    snprintf(buf, cap,
             "{\"mode\": \"distributed\", \"master_address\": \"%s\", \"node_host\": \"%s\", "
             "\"capacity_bytes\": \"256MiB\", \"heartbeat_ms\": 100, \"timeout_ms\": 5000, "
             "\"lookup_timeout_ms\": 500, \"gpu_backend\": \"host\"%s%s}",
             master_address, host, extra && *extra ? ", " : "", extra ? extra : "");
    return buf;
}

static inline void need_distributed(void)
{
    if (umbp_mode_flags("distributed") < 0)
        cr_skip_test("distributed mode is not built into this libumbp: %s", umbp_last_error());
    if (access(UMBP_MASTER_BIN, X_OK) != 0)
        cr_skip_test("umbp-master is not built (%s)", UMBP_MASTER_BIN);
}

/* A node that died makes our next write to its stdin fail: EPIPE, not a
 * SIGPIPE that would kill the test before it says which node died. */
static inline void no_sigpipe(void) { signal(SIGPIPE, SIG_IGN); }

#endif /* UMBP_TEST_DIST_FIXTURE_H */
