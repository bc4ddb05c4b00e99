/*
 * bench_failover - umbp-master failover on a Redis lease, on loopback.
 *
 * Starts its own redis-server (a free loopback port, no persistence, a
 * temporary --dir), two umbp-master processes leasing in it
 * ("lease_url": "redis://127.0.0.1:<port>/bench"), N synthetic nodes and one
 * lookup client, all given the Redis URL as their master address (they find
 * the leader in the store and follow takeovers).  Each node registers with
 * its own host/pid/start, holds K keys that it RESYNCs when the master asks,
 * and heartbeats every 100 ms, answering REGISTER and RESYNC in the ack.
 * The lookup client LOCATEs a sample of every node's keys every few ms.
 *
 * Then, R rounds of kill -9 of the leader and R of SIGTERM (a clean stop:
 * the lease is released), each timed from the signal:
 *   takeover     the leader key names a new epoch (read from Redis)
 *   first owner  the first LOCATE answered by the new leader with an owner
 *   relearned    the first LOCATE that finds every sampled key of every node
 *                on its own node (the nodes registered and resynced)
 * and the killed master is restarted as the new standby before the next
 * round.  The kill waits a random 0 .. ttl/3 first, so it falls anywhere in
 * the leader's renewal period.  The baseline, from the same run: the lease
 * itself (a kill cannot fail over before the lease expires; the ratio
 * takeover / ttl), and the relearn at startup (no failover) for the keys/s.
 *
 *   build/bench/bench_failover [-t lease_ttl_ms] [-r rounds] [-n nodes]
 *                              [-k keys_per_node] [-s sample_per_node]
 *                              [-w node_threads] [-p discovery_poll_ms] [-K]
 *
 * -p: the clients' read period of the leader key (0: the library's, 250 ms).
 * -K keeps the temporary directory (the masters' and Redis's logs).
 * Exits 0 saying why when redis-server is not on PATH or the build has no
 * Redis client (hiredis); 1 when a round does not complete.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "leader_lease.h"
#include "master_client.h"
#include "tcp.h"
#include "umbp/tier.h"

#define HEARTBEAT_MS 100
#define LOOKUP_EVERY_US 5000
#define LEASE_POLL_US 2000

/* ---- options and shared state ----------------------------------------------------------- */

static struct {
    uint64_t ttl_ms, timeout_ms, poll_ms;
    int rounds, nodes, keys, sample, workers;
    bool keep;
} opt = {.ttl_ms = 3000, .rounds = 5, .nodes = 8, .keys = 10000, .sample = 100,
         .workers = 2};

static char dir[64], url[128];

struct master_proc {
    char name[8], addr[64], log[128];
    pid_t pid;
};
static struct master_proc masters[2];
static pid_t redis_pid = -1;

struct node {
    int idx;
    struct mclient *c;
    struct proto_register reg;
    umbp_key_t *keys;
    uint64_t *sizes;
    bool need_register;
    uint64_t next_ns;
    /* under mu: the latest resync (epoch of the master it went to) */
    uint64_t rs_epoch, rs_t0, rs_t1;
    uint64_t registers, resyncs, failures;
    char last_error[256];
};
static struct node *nodes;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool stopping;

/* The lookup thread's view, under mu. */
static struct {
    bool armed;
    uint64_t old_epoch, t0;
    uint64_t t_answer, t_any, t_all; /* first answer of a higher epoch: any, one owner, all */
    /* the last LOCATE */
    int rc;
    uint64_t epoch;
    bool complete;
    size_t found;
    char last_error[256];
} look;

static umbp_key_t key_of(int node, uint32_t i)
{
    umbp_key_t k;
    memset(&k, 0, sizeof(k));
    memcpy(k.bytes, &i, 4);
    uint32_t n = (uint32_t)node;
    memcpy(k.bytes + 4, &n, 4);
    k.bytes[31] = 0x5a;
    return k;
}

static double ms(uint64_t ns) { return (double)ns / 1e6; }

static void sleep_ms(uint64_t v) { usleep((useconds_t)(v * 1000)); }

/* ---- processes ------------------------------------------------------------------------ */

static int free_port(uint16_t *port)
{
    int fd;
    if (net_tcp_listen("127.0.0.1:0", "bench", 1, &fd, port, NULL, 0) < 0)
        return -1;
    close(fd);
    return 0;
}

static bool on_path(const char *prog)
{
    const char *p = getenv("PATH");
    char buf[512];
    while (p && *p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, prog);
        if (access(buf, X_OK) == 0)
            return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

/* fork + exec with stdout and stderr appended to log; dies with us. */
static pid_t spawn(const char *log, char *const argv[])
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static pid_t start_redis(uint16_t port)
{
    char p[16], log[128];
    snprintf(p, sizeof(p), "%u", port);
    snprintf(log, sizeof(log), "%s/redis.log", dir);
    char *argv[] = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", dir, "--daemonize", "no", NULL};
    return spawn(log, argv);
}

static void start_master(struct master_proc *m)
{
    char json[768];
    snprintf(json, sizeof(json),
             "{\"listen\": \"%s\", \"log_level\": \"info\", \"lease_url\": \"%s\", "
             "\"lease_ttl_ms\": %" PRIu64 ", \"lease_timeout_ms\": %" PRIu64 ", "
             "\"heartbeat_suspect_ms\": 60000, \"heartbeat_dead_ms\": 120000}",
             m->addr, url, opt.ttl_ms, opt.timeout_ms);
    char *argv[] = {UMBP_MASTER_BIN, "--json", json, NULL};
    m->pid = spawn(m->log, argv);
}

/* Until the master accepts a connection (it listens before its lease thread
 * starts: a little more for that). */
static int wait_listening(const struct master_proc *m, uint64_t limit_ms)
{
    uint64_t end = umbp_now_ns() + limit_ms * 1000000ull;
    while (umbp_now_ns() < end) {
        int fd = -1, rc = net_tcp_connect(m->addr, &fd);
        if (rc == -EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            if (poll(&p, 1, 200) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 &&
                soerr == 0)
                rc = 0;
        }
        if (fd >= 0)
            close(fd);
        if (rc == 0) {
            sleep_ms(100);
            return 0;
        }
        if (waitpid(m->pid, NULL, WNOHANG) == m->pid) {
            fprintf(stderr, "umbp-master %s exited at start: see %s\n", m->name, m->log);
            return -1;
        }
        sleep_ms(10);
    }
    fprintf(stderr, "umbp-master %s not listening on %s after %" PRIu64 " ms\n", m->name,
            m->addr, limit_ms);
    return -1;
}

static void stop_proc(pid_t *pid)
{
    if (*pid <= 0)
        return;
    kill(*pid, SIGTERM);
    for (int i = 0; i < 300 && waitpid(*pid, NULL, WNOHANG) == 0; i++)
        sleep_ms(10);
    if (kill(*pid, 0) == 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
    }
    *pid = -1;
}

static void tail_log(const char *path)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "tail -n 15 '%s' | sed 's/^/    /'", path);
    fprintf(stderr, "  %s:\n", path);
    fflush(stderr);
    if (system(cmd) != 0)
        fprintf(stderr, "    (cannot read it)\n");
}

/* ---- the synthetic nodes ------------------------------------------------------------------- */

static struct mclient *client(uint8_t role, const char *id, uint64_t timeout_ms)
{
    struct mclient_config cfg = {.address = url, .role = role, .engine_id = id,
                                 .timeout_ms = timeout_ms, .hello_timeout_ms = 1000,
                                 .discovery_poll_ms = opt.poll_ms};
    struct mclient *c;
    if (mclient_create(&cfg, &c) < 0)
        return NULL;
    return c;
}

static void node_failed(struct node *n)
{
    pthread_mutex_lock(&mu);
    n->failures++;
    snprintf(n->last_error, sizeof(n->last_error), "%s", mclient_last_error(n->c));
    pthread_mutex_unlock(&mu);
}

static void node_counted(uint64_t *counter)
{
    pthread_mutex_lock(&mu);
    (*counter)++;
    pthread_mutex_unlock(&mu);
}

/* One heartbeat (or REGISTER), then whatever the ack asks: -1 when a call
 * failed (the next tick tries again). */
static int node_step(struct node *n)
{
    struct proto_ack a;
    uint64_t seq = (uint64_t)opt.keys, used = (uint64_t)opt.keys * 4096;
    if (n->need_register) {
        if (mclient_register(n->c, &n->reg, &a) < 0)
            return -1;
        n->need_register = false;
        node_counted(&n->registers);
    } else if (mclient_heartbeat(n->c, seq, used, NULL, 0, &a) < 0) {
        return -1;
    }
    for (int hop = 0; hop < 4; hop++) {
        if (a.action == PROTO_ACK_REGISTER) {
            n->need_register = true;
            if (mclient_register(n->c, &n->reg, &a) < 0)
                return -1;
            n->need_register = false;
            node_counted(&n->registers);
        } else if (a.action == PROTO_ACK_RESYNC) {
            uint64_t t0 = umbp_now_ns();
            int rc = mclient_resync(n->c, seq, used, n->keys, n->sizes, (size_t)opt.keys, 0, &a);
            uint64_t t1 = umbp_now_ns();
            if (rc < 0)
                return -1;
            pthread_mutex_lock(&mu);
            n->resyncs++;
            n->rs_epoch = mclient_master_epoch(n->c);
            n->rs_t0 = t0;
            n->rs_t1 = t1;
            pthread_mutex_unlock(&mu);
        } else {
            break;
        }
    }
    return 0;
}

static void *node_thread(void *arg)
{
    int w = (int)(intptr_t)arg;
    while (!atomic_load(&stopping)) {
        uint64_t now = umbp_now_ns(), next = now + HEARTBEAT_MS * 1000000ull;
        for (int i = w; i < opt.nodes; i += opt.workers) {
            struct node *n = &nodes[i];
            if (now >= n->next_ns) {
                if (node_step(n) < 0)
                    node_failed(n);
                n->next_ns += HEARTBEAT_MS * 1000000ull;
                now = umbp_now_ns();
                if (n->next_ns < now) /* fell behind: no burst */
                    n->next_ns = now + HEARTBEAT_MS * 1000000ull;
            }
            if (n->next_ns < next)
                next = n->next_ns;
        }
        now = umbp_now_ns();
        if (next > now)
            usleep((useconds_t)((next - now) / 1000));
    }
    return NULL;
}

/* ---- the lookup client --------------------------------------------------------------------- */

static void *lookup_thread(void *arg)
{
    struct mclient *c = arg;
    size_t nk = (size_t)opt.nodes * (size_t)opt.sample;
    umbp_key_t *keys = malloc(nk * sizeof(*keys));
    struct proto_location *loc = malloc(nk * sizeof(*loc));
    char host[PROTO_NAME_MAX];
    for (int n = 0; n < opt.nodes; n++)
        for (int i = 0; i < opt.sample; i++) /* spread over the node's keys */
            keys[(size_t)n * opt.sample + i] =
                key_of(n, (uint32_t)((uint64_t)i * opt.keys / opt.sample));
    while (!atomic_load(&stopping)) {
        int rc = mclient_locate(c, keys, nk, loc);
        uint64_t now = umbp_now_ns(), epoch = mclient_master_epoch(c);
        size_t found = 0, any = 0;
        if (rc == 0)
            for (int n = 0; n < opt.nodes; n++) {
                snprintf(host, sizeof(host), "fo-node-%d", n);
                for (int i = 0; i < opt.sample; i++) {
                    const struct proto_location *l = &loc[(size_t)n * opt.sample + i];
                    any += l->nrep > 0;
                    for (uint32_t r = 0; r < l->nrep; r++) {
                        const struct proto_node_info *ni = mclient_node(c, l->refs[r]);
                        if (ni && strcmp(ni->host, host) == 0) {
                            found++;
                            break;
                        }
                    }
                }
            }
        pthread_mutex_lock(&mu);
        look.rc = rc;
        look.epoch = epoch;
        look.found = found;
        look.complete = rc == 0 && found == nk;
        if (rc < 0)
            snprintf(look.last_error, sizeof(look.last_error), "%s", mclient_last_error(c));
        if (look.armed && rc == 0 && epoch > look.old_epoch && now > look.t0) {
            if (!look.t_answer)
                look.t_answer = now;
            if (any && !look.t_any)
                look.t_any = now;
            if (look.complete && !look.t_all)
                look.t_all = now;
        }
        pthread_mutex_unlock(&mu);
        usleep(LOOKUP_EVERY_US);
    }
    free(keys);
    free(loc);
    return NULL;
}

/* ---- measurement --------------------------------------------------------------------------- */

struct result {
    bool ok;
    uint64_t e0, e1;
    double take, answer, any, all, exit_ms; /* ms from the signal; exit: the old master's */
    double rs_window, rs_call_med;          /* resyncs to the new leader: span, median call */
};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The resyncs the nodes sent to a master of this epoch: the span from the
 * first's start to the last's end, and the median call.  0: some node has
 * not resynced to it. */
static int resync_stats(uint64_t epoch, double *window, double *call_med)
{
    double *calls = calloc((size_t)opt.nodes, sizeof(*calls));
    uint64_t lo = UINT64_MAX, hi = 0;
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < opt.nodes; i++) {
        if (nodes[i].rs_epoch != epoch)
            continue;
        lo = nodes[i].rs_t0 < lo ? nodes[i].rs_t0 : lo;
        hi = nodes[i].rs_t1 > hi ? nodes[i].rs_t1 : hi;
        calls[n++] = ms(nodes[i].rs_t1 - nodes[i].rs_t0);
    }
    pthread_mutex_unlock(&mu);
    *window = n ? ms(hi - lo) : 0;
    *call_med = n ? median(calls, n) : 0;
    free(calls);
    return n == opt.nodes;
}

static void diagnose(const char *what)
{
    fprintf(stderr, "%s\n", what);
    pthread_mutex_lock(&mu);
    fprintf(stderr, "  lookup: last rc %d, epoch %" PRIu64 ", found %zu of %zu, last error: %s\n",
            look.rc, look.epoch, look.found, (size_t)opt.nodes * opt.sample, look.last_error);
    for (int i = 0; i < opt.nodes; i++)
        fprintf(stderr, "  node %d: registers %" PRIu64 ", resyncs %" PRIu64 " (last to epoch %"
                PRIu64 "), failures %" PRIu64 ", last error: %s\n", i, nodes[i].registers,
                nodes[i].resyncs, nodes[i].rs_epoch, nodes[i].failures, nodes[i].last_error);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < 2; i++)
        tail_log(masters[i].log);
    opt.keep = true;
}

/* The leader as the store says: 1, 0 (none), < 0 (error). */
static int leader(struct lease *l, struct lease_holder *h)
{
    char err[256];
    return lease_leader(l, h, err, sizeof(err));
}

/* A leader, the lookup finding every node through it, both masters up. */
static int wait_steady(struct lease *l, struct lease_holder *h, uint64_t limit_ms)
{
    uint64_t end = umbp_now_ns() + limit_ms * 1000000ull;
    while (umbp_now_ns() < end) {
        if (leader(l, h) == 1) {
            pthread_mutex_lock(&mu);
            bool ok = look.complete && look.epoch == h->epoch;
            pthread_mutex_unlock(&mu);
            if (ok)
                return 0;
        }
        sleep_ms(10);
    }
    return -1;
}

static int slot_of(const char *address)
{
    for (int i = 0; i < 2; i++)
        if (strcmp(masters[i].addr, address) == 0)
            return i;
    return -1;
}

static int one_round(struct lease *l, int sig, int round, struct result *res)
{
    struct lease_holder h;
    memset(res, 0, sizeof(*res));
    if (wait_steady(l, &h, 20000) < 0) {
        diagnose("not steady before the round (no leader, or the lookup does not find every "
                 "node) after 20 s");
        return -1;
    }
    sleep_ms((uint64_t)(rand() % (int)(opt.ttl_ms / 3))); /* anywhere in a renewal period */
    if (leader(l, &h) != 1 || slot_of(h.address) < 0) {
        diagnose("the leader vanished before the signal");
        return -1;
    }
    int li = slot_of(h.address);
    struct master_proc *m = &masters[li];
    res->e0 = h.epoch;
    pthread_mutex_lock(&mu);
    look.armed = true;
    look.old_epoch = h.epoch;
    look.t_answer = look.t_any = look.t_all = 0;
    uint64_t t0 = look.t0 = umbp_now_ns();
    pthread_mutex_unlock(&mu);
    kill(m->pid, sig);

    uint64_t take = 0, gone = 0, all = 0, end = t0 + (opt.ttl_ms * 3 + 15000) * 1000000ull;
    while (umbp_now_ns() < end && !(take && gone && all)) {
        if (!take && leader(l, &h) == 1 && h.epoch > res->e0) {
            take = umbp_now_ns();
            res->e1 = h.epoch;
            if (slot_of(h.address) != 1 - li)
                fprintf(stderr, "round %d: the new leader is %s, not the standby %s\n", round,
                        h.address, masters[1 - li].addr);
        }
        if (!gone && waitpid(m->pid, NULL, WNOHANG) == m->pid)
            gone = umbp_now_ns();
        pthread_mutex_lock(&mu);
        all = look.t_all;
        pthread_mutex_unlock(&mu);
        usleep(LEASE_POLL_US);
    }
    pthread_mutex_lock(&mu);
    look.armed = false;
    uint64_t t_answer = look.t_answer, t_any = look.t_any;
    pthread_mutex_unlock(&mu);
    if (!gone) {
        fprintf(stderr, "round %d: umbp-master %s (pid %d) still running %.0f ms after signal "
                "%d; killed\n", round, m->name, (int)m->pid, ms(umbp_now_ns() - t0), sig);
        kill(m->pid, SIGKILL);
        waitpid(m->pid, NULL, 0);
        gone = umbp_now_ns();
    }
    res->exit_ms = ms(gone - t0);
    res->take = take ? ms(take - t0) : -1;
    res->answer = t_answer ? ms(t_answer - t0) : -1;
    res->any = t_any ? ms(t_any - t0) : -1;
    res->all = all ? ms(all - t0) : -1;
    res->ok = take && all;
    if (res->ok && !resync_stats(res->e1, &res->rs_window, &res->rs_call_med))
        fprintf(stderr, "round %d: the lookup found every node but not every node resynced "
                "to epoch %" PRIu64 "\n", round, res->e1);
    printf("  %-7s round %d: %s epoch %" PRIu64 " -> %" PRIu64 ": takeover %8.1f ms, first "
           "answer %8.1f ms, first owner %8.1f ms, every node %8.1f ms; resyncs %.1f ms span, "
           "%.2f ms per node; old master gone %.1f ms\n", sig == SIGKILL ? "kill -9" : "SIGTERM",
           round, m->name, res->e0, res->e1, res->take, res->answer, res->any, res->all,
           res->rs_window, res->rs_call_med, res->exit_ms);
    fflush(stdout);
    if (!res->ok) {
        diagnose(take ? "the nodes were not all relearned by the new leader"
                      : "no takeover: the leader key never named a higher epoch");
        return -1;
    }
    start_master(m); /* the new standby */
    return wait_listening(m, 10000);
}

static void summary(const char *what, struct result *r, int n)
{
    enum { ROWS = 6 };
    double v[ROWS][64];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].ok)
            continue;
        v[0][k] = r[i].take;
        v[1][k] = r[i].answer;
        v[2][k] = r[i].any;
        v[3][k] = r[i].all;
        v[4][k] = r[i].rs_window > 0 ? (double)opt.nodes * opt.keys / (r[i].rs_window / 1e3) : 0;
        v[5][k] = r[i].rs_call_med > 0 ? (double)opt.keys / (r[i].rs_call_med / 1e3) : 0;
        k++;
    }
    if (!k) {
        printf("%s: no complete round\n", what);
        return;
    }
    const char *names[ROWS] = {"takeover", "first answer", "first owner", "every node",
                               "relearn keys/s", "resync keys/s"};
    for (int j = 0; j < ROWS; j++) {
        double mn = v[j][0], mx = v[j][0];
        for (int i = 1; i < k; i++) {
            mn = v[j][i] < mn ? v[j][i] : mn;
            mx = v[j][i] > mx ? v[j][i] : mx;
        }
        double md = median(v[j], k);
        if (j < 4)
            printf("%s %-14s min %8.1f  median %8.1f  max %8.1f ms   / ttl: %.2f %.2f %.2f\n",
                   what, names[j], mn, md, mx, mn / (double)opt.ttl_ms,
                   md / (double)opt.ttl_ms, mx / (double)opt.ttl_ms);
        else
            printf("%s %-14s min %8.0f  median %8.0f  max %8.0f  (%s)\n", what, names[j], mn,
                   md, mx, j == 4 ? "every node's keys / the span of the resyncs"
                                  : "one node's keys / its RESYNC call, median of the nodes");
    }
}

/* ---- main ---------------------------------------------------------------------------------- */

static void cleanup(void)
{
    for (int i = 0; i < 2; i++)
        stop_proc(&masters[i].pid);
    stop_proc(&redis_pid);
    if (!dir[0])
        return;
    if (opt.keep) {
        printf("logs kept in %s\n", dir);
        return;
    }
    const char *files[] = {"master-a.log", "master-b.log", "redis.log", "dump.rdb"};
    char p[160];
    for (size_t i = 0; i < sizeof(files) / sizeof(*files); i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, files[i]);
        unlink(p);
    }
    if (rmdir(dir) < 0)
        fprintf(stderr, "cannot remove %s: %s\n", dir, strerror(errno));
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_failover [-t lease_ttl_ms] [-r rounds] [-n nodes] "
            "[-k keys_per_node] [-s sample_per_node] [-w node_threads] [-p discovery_poll_ms] "
            "[-K]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int ch;
    while ((ch = getopt(argc, argv, "t:r:n:k:s:w:p:K")) != -1) {
        switch (ch) {
        case 't': opt.ttl_ms = strtoull(optarg, NULL, 10); break;
        case 'r': opt.rounds = atoi(optarg); break;
        case 'n': opt.nodes = atoi(optarg); break;
        case 'k': opt.keys = atoi(optarg); break;
        case 's': opt.sample = atoi(optarg); break;
        case 'w': opt.workers = atoi(optarg); break;
        case 'p': opt.poll_ms = strtoull(optarg, NULL, 10); break;
        case 'K': opt.keep = true; break;
        default: return usage();
        }
    }
    if (opt.ttl_ms < 300 || opt.rounds < 1 || opt.rounds > 64 || opt.nodes < 1 ||
        opt.nodes > 1000 || opt.keys < 1 || opt.sample < 1 || opt.workers < 1)
        return usage();
    if (opt.sample > opt.keys)
        opt.sample = opt.keys;
    if ((size_t)opt.nodes * opt.sample > PROTO_MAX_RECORDS)
        opt.sample = (int)(PROTO_MAX_RECORDS / opt.nodes);
    if (opt.workers > opt.nodes)
        opt.workers = opt.nodes;
    opt.timeout_ms = opt.ttl_ms / 10 < 10 ? 10 : opt.ttl_ms / 10; /* <= ttl / 3 */
#ifndef UMBP_HAVE_HIREDIS
    printf("bench_failover: skipped: this build has no Redis client (hiredis; "
           "scripts/setup.sh installs libhiredis-dev), so no lease\n");
    return 0;
#endif
    if (!on_path("redis-server")) {
        printf("bench_failover: skipped: redis-server is not on PATH (scripts/setup.sh "
               "installs it)\n");
        return 0;
    }
    signal(SIGPIPE, SIG_IGN);
    srand(1);
    snprintf(dir, sizeof(dir), "/tmp/umbp-failover-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    atexit(cleanup);

    uint16_t rport, mport[2];
    if (free_port(&rport) < 0 || free_port(&mport[0]) < 0 || free_port(&mport[1]) < 0)
        return 1;
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/bench", rport);
    redis_pid = start_redis(rport);
    struct lease *l;
    char err[512];
    if (lease_open(url, 200, &l, err, sizeof(err)) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct lease_holder h;
    int rc = -1;
    for (int i = 0; i < 500 && (rc = leader(l, &h)) < 0; i++)
        sleep_ms(10);
    if (rc < 0) {
        fprintf(stderr, "redis-server on port %u does not answer\n", rport);
        char p[128];
        snprintf(p, sizeof(p), "%s/redis.log", dir);
        tail_log(p);
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        struct master_proc *m = &masters[i];
        snprintf(m->name, sizeof(m->name), "%c", 'a' + i);
        snprintf(m->addr, sizeof(m->addr), "127.0.0.1:%u", mport[i]);
        snprintf(m->log, sizeof(m->log), "%s/master-%c.log", dir, 'a' + i);
        start_master(m);
        if (wait_listening(m, 10000) < 0)
            return 1;
    }
    uint64_t te = umbp_now_ns() + 10000000000ull;
    while ((rc = leader(l, &h)) != 1 && umbp_now_ns() < te)
        sleep_ms(5);
    if (rc != 1) {
        diagnose("no master took the lease in 10 s");
        return 1;
    }
    printf("bench_failover: redis-server 127.0.0.1:%u, masters %s and %s, lease_ttl_ms %" PRIu64
           ", lease_timeout_ms %" PRIu64 "; %d nodes x %d keys (heartbeat %d ms, %d threads), "
           "lookup of %d keys per node every %d ms; clients read the leader every %" PRIu64 " ms; "
           "%d rounds each of kill -9 and SIGTERM\n",
           rport, masters[0].addr, masters[1].addr, opt.ttl_ms, opt.timeout_ms, opt.nodes,
           opt.keys, HEARTBEAT_MS, opt.workers, opt.sample, LOOKUP_EVERY_US / 1000,
           opt.poll_ms ? opt.poll_ms : 250, opt.rounds);
    printf("first leader: %s, epoch %" PRIu64 "\n", h.address, h.epoch);
    fflush(stdout);

    nodes = calloc((size_t)opt.nodes, sizeof(*nodes));
    for (int i = 0; i < opt.nodes; i++) {
        struct node *n = &nodes[i];
        char id[32];
        n->idx = i;
        snprintf(id, sizeof(id), "fo-node-%d", i);
        if (!(n->c = client(PROTO_ROLE_NODE, id, 2000)))
            return 1;
        snprintf(n->reg.host, sizeof(n->reg.host), "fo-node-%d", i);
        n->reg.pid = 100000u + (uint32_t)i;
        n->reg.start_ns = umbp_now_ns() + (uint64_t)i;
        n->reg.capacity_bytes = 1ull << 40;
        n->reg.used_bytes = (uint64_t)opt.keys * 4096;
        n->reg.seq = (uint64_t)opt.keys; /* K stored events: the master asks for a resync */
        n->reg.addr_len = 16;
        memcpy(n->reg.addr, &i, sizeof(i));
        n->keys = malloc((size_t)opt.keys * sizeof(*n->keys));
        n->sizes = malloc((size_t)opt.keys * sizeof(*n->sizes));
        for (int k = 0; k < opt.keys; k++) {
            n->keys[k] = key_of(i, (uint32_t)k);
            n->sizes[k] = 4096;
        }
        n->need_register = true;
    }
    struct mclient *lc = client(PROTO_ROLE_LOOKUP, "fo-lookup", 1000);
    if (!lc)
        return 1;
    pthread_t nth[64], lth;
    if (opt.workers > 64)
        opt.workers = 64;
    uint64_t t_start = umbp_now_ns();
    for (int i = 0; i < opt.nodes; i++) /* heartbeat phases spread over the period */
        nodes[i].next_ns = t_start + (uint64_t)i * HEARTBEAT_MS * 1000000ull / opt.nodes;
    for (int w = 0; w < opt.workers; w++)
        pthread_create(&nth[w], NULL, node_thread, (void *)(intptr_t)w);
    pthread_create(&lth, NULL, lookup_thread, lc);

    /* the baseline relearn: every node registers and resyncs with the first leader */
    if (wait_steady(l, &h, 30000) < 0) {
        diagnose("the first leader did not learn every node in 30 s");
        return 1;
    }
    double win, call_med;
    resync_stats(h.epoch, &win, &call_med);
    printf("startup (no failover): every node found %.1f ms after the nodes started; resyncs "
           "%.1f ms span = %.0f keys/s, %.2f ms per node's %d keys = %.0f keys/s per node\n",
           ms(umbp_now_ns() - t_start), win, (double)opt.nodes * opt.keys / (win / 1e3),
           call_med, opt.keys, opt.keys / (call_med / 1e3));
    fflush(stdout);

    struct result kill_r[64], term_r[64];
    int failed = 0;
    for (int r = 0; r < opt.rounds && !failed; r++)
        failed = one_round(l, SIGKILL, r + 1, &kill_r[r]) < 0;
    for (int r = 0; r < opt.rounds && !failed; r++)
        failed = one_round(l, SIGTERM, r + 1, &term_r[r]) < 0;
    atomic_store(&stopping, true);
    for (int w = 0; w < opt.workers; w++)
        pthread_join(nth[w], NULL);
    pthread_join(lth, NULL);

    if (!failed) {
        printf("summary, lease_ttl_ms %" PRIu64 " (the baseline: a kill cannot fail over before "
               "the lease expires; ratio = time / ttl):\n", opt.ttl_ms);
        summary("kill -9", kill_r, opt.rounds);
        summary("SIGTERM", term_r, opt.rounds);
    }
    for (int i = 0; i < opt.nodes; i++) {
        mclient_destroy(nodes[i].c);
        free(nodes[i].keys);
        free(nodes[i].sizes);
    }
    mclient_destroy(lc);
    free(nodes);
    lease_close(l);
    return failed;
}
