/*
 * redis_fixture.h - a real redis-server process for tests: started on a
 * free loopback port without persistence (--save '' --appendonly no) in a
 * private directory, waited for until it answers PING (bounded), signalled
 * (SIGSTOP, SIGCONT, SIGKILL), restarted on the same port (empty: nothing
 * was persisted, as a Redis that lost its data), and killed with its test
 * (PR_SET_PDEATHSIG).  redis_cmd() sends one command through hiredis for
 * the test to read or write keys behind the code under test.
 *
 * Call redis_need() first: it skips the test, saying why, when this build
 * has no hiredis (UMBP_HAVE_HIREDIS) or no redis-server can be found
 * ($UMBP_REDIS_SERVER, else redis-server on $PATH).
 *
 * TLS (rediss://): redis_certs_make() makes a CA, a server certificate
 * (subjectAltName IP:127.0.0.1 and DNS:localhost) and client certificates
 * with the openssl CLI in a private directory, at test time (nothing is
 * committed; redis_certs_remove() removes it).  A struct redis given
 * them (r.tls) listens on a TLS port (r.tls_port: --tls-port, with
 * --tls-cert-file, --tls-key-file, --tls-ca-cert-file, --tls-auth-clients
 * yes or no, --tls-replication yes: a replica or sentinel speaks TLS to the
 * instances it watches) besides its plain port, on which the fixture's own
 * commands (hiredis, which has no TLS here) and its readiness check go.
 * redis_tls_need() skips, saying why, without OpenSSL in this build
 * (UMBP_HAVE_OPENSSL), the openssl CLI, or a redis-server with TLS.
 */
#ifndef UMBP_TEST_REDIS_FIXTURE_H
#define UMBP_TEST_REDIS_FIXTURE_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#if UMBP_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

#define REDIS_READY_MS 5000 /* bound on a start until PING answers */
#define REDIS_CMD_MS 2000   /* bound on one redis_cmd */

/* The TLS material of a test, made by redis_certs_make. */
struct redis_certs {
    char dir[64];            /* private, 0700; redis_certs_remove() removes it */
    char cnf[96];            /* the openssl config (extensions) */
    char ca[96], ca_key[96]; /* the CA: signed the server's and client's */
    char other_ca[96], other_ca_key[96]; /* a CA that signed neither */
    char server[96], server_key[96];     /* IP:127.0.0.1, DNS:localhost; by ca */
    char server_dns[96], server_dns_key[96]; /* DNS:localhost only; by ca */
    char client[96], client_key[96];     /* a client certificate by ca (0600 key) */
    char other_client[96], other_client_key[96]; /* one by other_ca */
    char log[96];            /* the openssl CLI's output */
};

struct redis {
    pid_t pid;          /* 0: not running */
    uint16_t port;      /* kept across restarts */
    const struct redis_certs *tls; /* set: a TLS port too (tls_port) */
    uint16_t tls_port;  /* with tls: kept across restarts (0 at the first: a free one) */
    bool tls_auth_clients; /* with tls: --tls-auth-clients yes (mutual TLS), else no */
    char tls_port_s[8];
    bool stopped;       /* SIGSTOPped */
    char dir[128];      /* its private --dir (removed once it runs: it stays empty) */
    char log[160];      /* its stdout and stderr (kept after stop) */
    const char *extra[24]; /* more arguments, NULL-terminated (kept across restarts) */
    const char *password;  /* set with "--requirepass" in extra: redis_cmd sends AUTH */
    bool sentinel;         /* run as a Sentinel (its directives in extra: "--sentinel",
                              "monitor", ...), with a config file of its own */
    char conf[160];        /* the sentinel's config file (it rewrites it) */
    char primary_port[8];  /* a replica's or sentinel's primary (redis_start_with_sentinel) */
    char reply[1024];   /* redis_str's last answer */
};

static inline uint64_t redis_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* The redis-server to start, or NULL. */
static inline const char *redis_server_bin(void)
{
    static char found[512];
    const char *env = getenv("UMBP_REDIS_SERVER");
    if (env && *env)
        return access(env, X_OK) == 0 ? env : NULL;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        snprintf(found, sizeof(found), "%.*s/redis-server", (int)n, path);
        if (n && access(found, X_OK) == 0)
            return found;
        path += n + (path[n] == ':');
    }
    return NULL;
}

/* Skips the calling test, with the reason, where Redis cannot be used. */
static inline void redis_need(void)
{
#if !UMBP_HAVE_HIREDIS
    cr_skip_test("built without hiredis (pkg-config hiredis; scripts/setup.sh installs "
                 "libhiredis-dev): no redis:// lease to test");
#endif
    if (!redis_server_bin())
        cr_skip_test("no redis-server on PATH (or $UMBP_REDIS_SERVER; scripts/setup.sh installs "
                     "redis-server)");
}

static inline uint16_t redis_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    cr_assert_geq(fd, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* One raw PING over a fresh socket, bounded by ms: true if "+PONG" came
 * (or "-NOAUTH": a Redis started with requirepass answers, asking for it). */
static inline bool redis_pings(uint16_t port, int ms)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char buf[64];
    size_t got = 0;
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
              send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6;
    while (ok && got < 7) { /* "+PONG\r\n", or the start of "-NOAUTH ..." */
        ssize_t r = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = 0;
    return ok && (strncmp(buf, "+PONG", 5) == 0 || strncmp(buf, "-NOAUTH", 7) == 0);
}

/* Starts redis-server on r->port (0: a free one), with r->extra. */
static inline void redis_start(struct redis *r)
{
    const char *bin = redis_server_bin();
    cr_assert_not_null(bin, "no redis-server (call redis_need() first)");
    if (!r->port)
        r->port = redis_free_port();
    /* a fresh directory each start; removed once Redis runs in it (nothing
     * is persisted there), so a test that fails leaves none behind */
    snprintf(r->dir, sizeof(r->dir), "/tmp/umbp-test-redis.%d.XXXXXX", getpid());
    cr_assert_not_null(mkdtemp(r->dir), "mkdtemp %s: %s", r->dir, strerror(errno));
    if (!r->log[0])
        snprintf(r->log, sizeof(r->log), "/tmp/umbp-test-redis.%s.%u.log", tu_run_tag(), r->port);
    char port[8];
    snprintf(port, sizeof(port), "%u", r->port);
    const char *argv[64] = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                            "--save", "", "--appendonly", "no", "--dir", r->dir,
                            "--daemonize", "no", "--logfile", ""};
    int argc = 15;
    if (r->sentinel) { /* redis-server <conf> --sentinel: no persistence options */
        if (!r->conf[0])
            snprintf(r->conf, sizeof(r->conf), "/tmp/umbp-test-sentinel.%d.%u.conf", getpid(),
                     r->port);
        FILE *cf = fopen(r->conf, "w");
        cr_assert_not_null(cf, "%s: %s", r->conf, strerror(errno));
        fclose(cf);
        const char *sv[] = {"redis-server", r->conf, "--sentinel", "--port", port, "--bind",
                            "127.0.0.1", "--dir", r->dir, "--daemonize", "no", "--logfile", ""};
        argc = 13;
        memcpy(argv, sv, sizeof(sv));
    }
    for (int i = 0; i < 24 && r->extra[i] && argc < 47; i++)
        argv[argc++] = r->extra[i];
    if (r->tls) {
        if (!r->tls_port)
            r->tls_port = redis_free_port();
        snprintf(r->tls_port_s, sizeof(r->tls_port_s), "%u", r->tls_port);
        const char *tv[] = {"--tls-port", r->tls_port_s, "--tls-cert-file", r->tls->server,
                            "--tls-key-file", r->tls->server_key, "--tls-ca-cert-file",
                            r->tls->ca, "--tls-auth-clients", r->tls_auth_clients ? "yes" : "no",
                            "--tls-replication", "yes"};
        for (size_t i = 0; i < sizeof(tv) / sizeof(tv[0]); i++)
            argv[argc++] = tv[i];
    }
    argv[argc] = NULL;
    r->pid = fork();
    cr_assert_geq(r->pid, 0);
    if (r->pid == 0) {
        int fd = open(r->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test leaves no redis-server behind */
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    r->stopped = false;
    uint64_t end = redis_now_ms() + REDIS_READY_MS;
    while (!redis_pings(r->port, 500)) {
        int st;
        cr_assert_eq(waitpid(r->pid, &st, WNOHANG), 0, "redis-server exited; its log (%s):\n%s",
                     r->log, tu_slurp(r->log));
        cr_assert_lt(redis_now_ms(), end, "redis-server does not answer PING on port %u within "
                     "%d ms; its log:\n%s", r->port, REDIS_READY_MS, tu_slurp(r->log));
        usleep(10000);
    }
    rmdir(r->dir); /* empty: Redis keeps it as its working directory */
}

#if UMBP_HAVE_HIREDIS
static inline redisReply *redis_try_cmd(struct redis *r, const char *fmt, ...);
#endif

/* A sentinel sen watching the primary on primary_port as `service`, with
 * `quorum` (1 .. 9), the primary down after 300 ms and a failover timeout
 * of 3 s, asking its clients for `password` unless that is NULL.  Nothing
 * need listen on primary_port: the sentinel then names an address that
 * refuses connections (a stale answer) for as long as it runs, since it
 * has no replica to promote.  sen is zeroed here; service and password
 * must outlive it (restarts reuse them). */
static inline void redis_start_sentinel_tls(struct redis *sen, const char *service,
                                            uint16_t primary_port, int quorum,
                                            const char *password,
                                            const struct redis_certs *tls)
{
    static const char *const quorums[] = {"1", "2", "3", "4", "5", "6", "7", "8", "9"};
    cr_assert(quorum >= 1 && quorum <= 9, "a sentinel's quorum %d is not 1 .. 9", quorum);
    memset(sen, 0, sizeof(*sen));
    sen->tls = tls; /* TLS: its clients', and to the primary (primary_port: its TLS port) */
    snprintf(sen->primary_port, sizeof(sen->primary_port), "%u", primary_port);
    const char *sv[] = {"--sentinel", "monitor", service, "127.0.0.1", sen->primary_port,
                        quorums[quorum - 1],
                        "--sentinel", "down-after-milliseconds", service, "300",
                        "--sentinel", "failover-timeout", service, "3000"};
    sen->sentinel = true;
    size_t n = 0;
    for (; n < sizeof(sv) / sizeof(sv[0]); n++)
        sen->extra[n] = sv[n];
    if (password) {
        sen->extra[n++] = "--requirepass";
        sen->extra[n++] = password;
        sen->password = password;
    }
    redis_start(sen);
}

static inline void redis_start_sentinel(struct redis *sen, const char *service,
                                        uint16_t primary_port, int quorum, const char *password)
{
    redis_start_sentinel_tls(sen, service, primary_port, quorum, password, NULL);
}

/* A primary p, its replica rep, synced (bounded), and one sentinel sen
 * watching p as `service` with quorum 1, so that it fails over alone (p
 * down after 300 ms), asking its clients for sentinel_password unless that
 * is NULL.  Syncs are diskless, both ways (the primary demoted to a
 * replica too): the fixture's Redis has no directory for a sync's file.
 * The structs are zeroed here (sen by redis_start_sentinel). */
static inline void redis_start_with_sentinel_tls(struct redis *p, struct redis *rep,
                                                 struct redis *sen, const char *service,
                                                 const char *sentinel_password,
                                                 const struct redis_certs *tls)
{
#if UMBP_HAVE_HIREDIS
    memset(p, 0, sizeof(*p));
    memset(rep, 0, sizeof(*rep));
    p->tls = rep->tls = tls; /* TLS: replication and the sentinel over the TLS ports */
    p->extra[0] = "--repl-diskless-sync-delay"; /* sync at once */
    p->extra[1] = "0";
    /* should Sentinel demote it to a replica: it loads its new primary's
     * data from the socket, keeping its own meanwhile (it has data: not
     * on-empty-db); a load from disk would retry a file it cannot create,
     * blocking 5 s at a time */
    p->extra[2] = "--repl-diskless-load";
    p->extra[3] = "swapdb";
    redis_start(p);
    snprintf(rep->primary_port, sizeof(rep->primary_port), "%u", tls ? p->tls_port : p->port);
    const char *rv[] = {"--replicaof", "127.0.0.1", rep->primary_port, "--repl-diskless-load",
                        "on-empty-db", "--repl-diskless-sync-delay", "0"};
    for (size_t i = 0; i < sizeof(rv) / sizeof(rv[0]); i++)
        rep->extra[i] = rv[i];
    redis_start(rep);
    uint64_t end = redis_now_ms() + 20000;
    for (;;) {
        redisReply *x = redis_try_cmd(rep, "INFO replication");
        bool up = x && x->type == REDIS_REPLY_STRING && strstr(x->str, "master_link_status:up");
        if (x)
            freeReplyObject(x);
        if (up)
            break;
        cr_assert_lt(redis_now_ms(), end, "the replica on port %u never synced with %u",
                     rep->port, p->port);
        usleep(20000);
    }
    redis_start_sentinel_tls(sen, service, tls ? p->tls_port : p->port, 1, sentinel_password,
                             tls);
#else
    (void)p, (void)rep, (void)sen, (void)service, (void)sentinel_password, (void)tls;
    cr_skip_test("no hiredis");
#endif
}

static inline void redis_start_with_sentinel(struct redis *p, struct redis *rep,
                                             struct redis *sen, const char *service,
                                             const char *sentinel_password)
{
    redis_start_with_sentinel_tls(p, rep, sen, service, sentinel_password, NULL);
}

/* SIGSTOP, SIGCONT, SIGKILL (reaped: r->pid becomes 0) or SIGTERM (same). */
static inline void redis_signal(struct redis *r, int sig)
{
    cr_assert_neq(r->pid, 0, "redis-server is not running");
    tu_kill_wait(r->pid, sig);
    if (sig == SIGSTOP)
        r->stopped = true;
    else if (sig == SIGCONT)
        r->stopped = false;
    else if (sig == SIGKILL || sig == SIGTERM) {
        int st;
        if (r->stopped && sig == SIGTERM)
            kill(r->pid, SIGCONT);
        waitpid(r->pid, &st, 0);
        r->pid = 0;
        r->stopped = false;
    }
}

/* kill -9 and start again on the same port: an empty Redis. */
static inline void redis_restart_same_port(struct redis *r)
{
    if (r->pid)
        redis_signal(r, SIGKILL);
    redis_start(r);
}

/* Kills it (if running); the log stays. */
static inline void redis_stop(struct redis *r)
{
    if (r->pid)
        redis_signal(r, SIGKILL);
    if (r->conf[0])
        unlink(r->conf);
}

/* "redis://127.0.0.1:<port>/<cluster>" */
static inline const char *redis_url(const struct redis *r, const char *cluster, char *buf,
                                    size_t cap)
{
    snprintf(buf, cap, "redis://127.0.0.1:%u/%s", r->port, cluster);
    return buf;
}

#if UMBP_HAVE_HIREDIS
/* One command (hiredis format: %s, %b, %lld ...) on a fresh connection,
 * bounded by REDIS_CMD_MS: its reply (freeReplyObject it); NULL, with the
 * reason logged, if Redis did not answer.  (Logged as info: Criterion 2.4
 * exits 1 after any cr_log_warn, which ctest counts as a failure.) */
static inline redisReply *redis_try_cmd(struct redis *r, const char *fmt, ...)
{
    struct timeval tv = {.tv_sec = REDIS_CMD_MS / 1000, .tv_usec = (REDIS_CMD_MS % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c || c->err) {
        cr_log_info("redis port %u: connect: %s", r->port, c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (r->password) {
        redisReply *a = redisCommand(c, "AUTH %s", r->password);
        if (a)
            freeReplyObject(a);
    }
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!rep)
        cr_log_info("redis port %u: '%s': %s", r->port, fmt, c->errstr);
    redisFree(c);
    return rep;
}

#define redis_cmd(r, ...)                                                                  \
    ({                                                                                     \
        redisReply *rep_ = redis_try_cmd((r), __VA_ARGS__);                                \
        cr_assert_not_null(rep_, "redis-server on port %u did not answer a command",       \
                           (r)->port);                                                     \
        rep_;                                                                              \
    })

/* The reply, as text in r->reply: a string or status as is, an integer in
 * decimal, "(nil)", "(error) <message>", "(array of n)". */
static inline const char *redis_render(struct redis *r, redisReply *rep)
{
    switch (rep->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
        snprintf(r->reply, sizeof(r->reply), "%.*s", (int)rep->len, rep->str);
        break;
    case REDIS_REPLY_INTEGER:
        snprintf(r->reply, sizeof(r->reply), "%lld", rep->integer);
        break;
    case REDIS_REPLY_NIL:
        snprintf(r->reply, sizeof(r->reply), "(nil)");
        break;
    case REDIS_REPLY_ERROR:
        snprintf(r->reply, sizeof(r->reply), "(error) %.*s", (int)rep->len, rep->str);
        break;
    default:
        snprintf(r->reply, sizeof(r->reply), "(array of %zu)", rep->elements);
    }
    freeReplyObject(rep);
    return r->reply;
}

/* A command's reply as text (redis_render): redis_str(&r, "GET %s", key). */
#define redis_str(r, ...) redis_render((r), redis_cmd((r), __VA_ARGS__))

/* A command whose reply is not wanted; asserts it is not an error. */
#define redis_do(r, ...)                                                                   \
    do {                                                                                   \
        const char *a_ = redis_str((r), __VA_ARGS__);                                      \
        cr_assert(strncmp(a_, "(error)", 7) != 0, "redis: %s", a_);                        \
    } while (0)
#else
/* Without hiredis there is nothing to test against Redis (redis_need()
 * skips); these only keep the tests compiling. */
#define redis_str(r, ...) (cr_assert_fail("built without hiredis"), (r)->reply)
#define redis_do(r, ...) cr_assert_fail("built without hiredis")
#endif /* UMBP_HAVE_HIREDIS */

/* ---- TLS ------------------------------------------------------------------------------- */

/* A program on $PATH, or NULL. */
static inline const char *redis_which(const char *name, char *buf, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        snprintf(buf, cap, "%.*s/%s", (int)n, path, name);
        if (n && access(buf, X_OK) == 0)
            return buf;
        path += n + (path[n] == ':');
    }
    return NULL;
}

/* Whether the redis-server binary has TLS in it (OpenSSL linked or built
 * in: Debian's does; a source build needs BUILD_TLS=yes). */
static inline bool redis_server_has_tls(void)
{
    const char *bin = redis_server_bin();
    FILE *fp = bin ? fopen(bin, "rb") : NULL;
    if (!fp)
        return false;
    static const char needle[] = "SSL_CTX_new";
    char buf[65536 + sizeof(needle)];
    size_t keep = 0, n;
    bool found = false;
    while (!found && (n = fread(buf + keep, 1, sizeof(buf) - keep, fp)) > 0) {
        size_t len = keep + n;
        found = memmem(buf, len, needle, sizeof(needle) - 1) != NULL;
        keep = len < sizeof(needle) ? len : sizeof(needle) - 1;
        memmove(buf, buf + len - keep, keep);
    }
    fclose(fp);
    return found;
}

/* Skips the calling test, with the reason, where TLS to Redis cannot be
 * tested. */
static inline void redis_tls_need(void)
{
    redis_need();
#if !UMBP_HAVE_OPENSSL
    cr_skip_test("built without OpenSSL (pkg-config openssl; scripts/setup.sh installs "
                 "libssl-dev): no rediss:// lease to test");
#endif
    char buf[512];
    if (!redis_which("openssl", buf, sizeof(buf)))
        cr_skip_test("no openssl CLI on PATH (scripts/setup.sh installs openssl): the test "
                     "certificates cannot be made");
    if (!redis_server_has_tls())
        cr_skip_test("redis-server (%s) has no TLS in it (Debian's has; a source build needs "
                     "BUILD_TLS=yes)", redis_server_bin());
}

/* Runs the openssl CLI with args (NULL-terminated), its output appended to
 * c->log; asserts it succeeded. */
static inline void redis_openssl(const struct redis_certs *c, const char *const *args)
{
    char bin[512];
    cr_assert_not_null(redis_which("openssl", bin, sizeof(bin)), "no openssl CLI");
    const char *argv[40] = {"openssl"};
    int argc = 1;
    for (int i = 0; args[i] && argc < 39; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(c->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        int nul = open("/dev/null", O_RDONLY);
        dup2(nul, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "openssl %s %s failed (status %d); its "
              "output (%s):\n%s", args[0], args[1] ? args[1] : "", st, c->log, tu_slurp(c->log));
}

/* A key (EC P-256) and a certificate for `cn` with the extensions `ext`
 * (a section of c->cnf), signed by ca/ca_key (self-signed if ca is NULL). */
static inline void redis_cert(const struct redis_certs *c, const char *cn, const char *ext,
                              const char *ca, const char *ca_key, const char *cert,
                              const char *key, const char *serial)
{
    char subj[128], csr[128];
    snprintf(subj, sizeof(subj), "/CN=%s", cn);
    if (!ca) {
        const char *a[] = {"req", "-config", c->cnf, "-x509", "-new", "-newkey", "ec",
                           "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
                           "-out", cert, "-days", "2", "-subj", subj, "-extensions", ext,
                           "-set_serial", serial, NULL};
        redis_openssl(c, a);
        return;
    }
    snprintf(csr, sizeof(csr), "%s.csr", cert);
    const char *a[] = {"req", "-config", c->cnf, "-new", "-newkey", "ec", "-pkeyopt",
                       "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
                       "-subj", subj, NULL};
    redis_openssl(c, a);
    const char *b[] = {"x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-set_serial",
                       serial, "-out", cert, "-days", "2", "-extfile", c->cnf, "-extensions",
                       ext, NULL};
    redis_openssl(c, b);
    unlink(csr);
    cr_assert_eq(chmod(key, 0600), 0);
}

/* Makes the TLS material of c (redis_tls_need() first). */
static inline void redis_certs_make(struct redis_certs *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->dir, sizeof(c->dir), "/tmp/umbp-test-tls.%d.XXXXXX", getpid());
    cr_assert_not_null(mkdtemp(c->dir), "mkdtemp: %s", strerror(errno));
#define RC_PATH(f, name) snprintf(c->f, sizeof(c->f), "%s/" name, c->dir)
    RC_PATH(cnf, "openssl.cnf");
    RC_PATH(log, "openssl.log");
    RC_PATH(ca, "ca.pem");
    RC_PATH(ca_key, "ca.key");
    RC_PATH(other_ca, "other-ca.pem");
    RC_PATH(other_ca_key, "other-ca.key");
    RC_PATH(server, "server.pem");
    RC_PATH(server_key, "server.key");
    RC_PATH(server_dns, "server-dns.pem");
    RC_PATH(server_dns_key, "server-dns.key");
    RC_PATH(client, "client.pem");
    RC_PATH(client_key, "client.key");
    RC_PATH(other_client, "other-client.pem");
    RC_PATH(other_client_key, "other-client.key");
#undef RC_PATH
    FILE *fp = fopen(c->cnf, "w");
    cr_assert_not_null(fp, "%s: %s", c->cnf, strerror(errno));
    fputs("[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = umbp test\n"
          "[ca]\nbasicConstraints = critical,CA:TRUE\n"
          "keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n"
          "[server]\nbasicConstraints = critical,CA:FALSE\n"
          "keyUsage = critical,digitalSignature,keyEncipherment\n"
          /* clientAuth too: a replica or sentinel presents it to the primary */
          "extendedKeyUsage = serverAuth,clientAuth\n"
          "subjectAltName = IP:127.0.0.1,DNS:localhost\n"
          "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n"
          "[server_dns]\nbasicConstraints = critical,CA:FALSE\n"
          "keyUsage = critical,digitalSignature,keyEncipherment\n"
          "extendedKeyUsage = serverAuth,clientAuth\nsubjectAltName = DNS:localhost\n"
          "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n"
          "[client]\nbasicConstraints = critical,CA:FALSE\n"
          "keyUsage = critical,digitalSignature\nextendedKeyUsage = clientAuth\n"
          "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n", fp);
    fclose(fp);
    redis_cert(c, "umbp test CA", "ca", NULL, NULL, c->ca, c->ca_key, "1");
    redis_cert(c, "umbp other CA", "ca", NULL, NULL, c->other_ca, c->other_ca_key, "2");
    redis_cert(c, "umbp test server", "server", c->ca, c->ca_key, c->server, c->server_key, "3");
    redis_cert(c, "umbp test server (a name only)", "server_dns", c->ca, c->ca_key,
               c->server_dns, c->server_dns_key, "6");
    redis_cert(c, "umbp test client", "client", c->ca, c->ca_key, c->client, c->client_key,
               "4");
    redis_cert(c, "umbp other client", "client", c->other_ca, c->other_ca_key, c->other_client,
               c->other_client_key, "5");
}

/* Removes c's directory and every file in it (a test's own files there
 * too); idempotent. */
static inline void redis_certs_remove(struct redis_certs *c)
{
    tu_rmdir_flat(c->dir);
    c->dir[0] = 0;
}

#endif /* UMBP_TEST_REDIS_FIXTURE_H */
