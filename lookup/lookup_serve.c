/*
 * lookup_serve.c - a worker's lookup service: the scheduler asks this rank
 * which keys its pool holds, over the lookup role of the standalone
 * protocol, on a Unix stream socket.  It knows nothing of the runtime:
 * the runtime hands it a lookup_host (lookup_serve.h; the runtime's side
 * is runtime/lookup_host.c) and drives its life.
 *
 * Setting up (lookup_serve_setup, caller's thread): the directory, then
 * the path.  One service per path: it holds flock(LOCK_EX) on
 * "<path>.lock" for its lifetime (net/lockfile.c, shared with
 * umbp-server), so two engines starting at once cannot both take a path;
 * a socket file at the path that nobody holds the lock for, and that
 * refuses a connect(), is a dead engine's and is replaced; one that
 * accepts is a live engine's (never taken over: -EADDRINUSE naming
 * lookup_instance); a file that is not a socket is refused and left alone
 * (net/listen.c, NET_STALE_PROBE).  The listening socket is bound, made
 * 0600 and put in listen state here, then the runtime hands the service to
 * the loop thread (connections that arrive meanwhile wait in the backlog).
 *
 * Serving (loop thread only, like the lookup actor) is net/service.c's,
 * with this file's words and handlers: connections are accepted from this
 * user or root (SO_PEERCRED), 64 at most; input is read without blocking
 * and cut into frames by proto_frame_parse.  The first frame must be HELLO
 * of role lookup (HELLO_OK back, no descriptor), then LOOKUP (LOOKUP_R:
 * one u8 per key), STATS, PING.  A LOOKUP is one call of the host's
 * lookup for the whole frame, which the runtime answers as the lookup
 * actor does: no LRU change unless PROTO_LOOKUP_TOUCH, quarantined keys
 * count as misses, the lookup is counted in the runtime's stats.  The
 * embedded tier answers inline (remote tiers are refused at
 * umbp_lookup_serve), so a frame's reply is appended before the next frame
 * is looked at.  A malformed frame gets an ERROR frame naming the field
 * (best effort), a log line, and that connection is closed; nothing else
 * notices.  A client that sends faster than it reads is paused (not read)
 * while its replies exceed OUT_PAUSE.
 *
 * Stopping (lookup_serve_stop: umbp_runtime_destroy began, loop thread):
 * every connection is closed at once, the listener too, and the socket and
 * lock files are removed (the socket only if it is still ours).  What is
 * left when the loop has ended (a service that was never started) is freed
 * by lookup_serve_free.  Nothing here waits.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "inbuf.h"
#include "listen.h"
#include "lockfile.h"
#include "lookup_int.h"
#include "lookup_serve.h"
#include "proto.h"
#include "service.h"

#define LK_MAX_CONNS 64
#define IN_INITIAL (64u << 10)
#define OUT_PAUSE (1u << 20)
#define ACCEPT_BATCH 16
#define ACCEPT_RETRY_S 0.1

struct lk_service {
    struct lookup_host host;     /* the runtime's side: lookups, usage, counters */
    char path[LK_PATH_MAX], lock_path[LK_PATH_MAX + 8];
    char ns[UMBP_LOOKUP_NS_HEX_LEN + 1];
    uint32_t dp_index, rank;
    int lock_fd;
    struct net_listener listener; /* net/listen.h: removes only the socket file we bound */
    bool started, stopped;
    struct net_service svc;      /* accept, connections, buffers (net/service.h) */
    uint64_t protocol_errors, refused;
    /* one lookup at a time (loop thread): the tier's requests */
    struct umbp_tier_req *reqs;
    struct umbp_tier_req **req_ptrs;
    uint8_t *present;
    size_t cap;
};

static struct lk_service *svc_of(const struct net_conn *c)
{
    return c->svc->p.owner;
}

#define CONN_FMT "lookup service %s: connection %llu (pid %d)"
#define CONN_ARGS(c) svc_of(c)->path, (unsigned long long)(c)->id, (int)(c)->pid

/* ---- requests ------------------------------------------------------------------ */

static int reply_end(struct net_conn *c, int rc)
{
    int erc = proto_end(&c->out);
    rc = rc ? rc : erc;
    if (rc < 0)
        snprintf(c->why, sizeof(c->why), "cannot build a reply: %s", strerror(-rc));
    return rc;
}

static int ensure_scratch(struct lk_service *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    struct umbp_tier_req *r = realloc(s->reqs, n * sizeof(*r));
    if (r)
        s->reqs = r;
    struct umbp_tier_req **p = realloc(s->req_ptrs, n * sizeof(*p));
    if (p)
        s->req_ptrs = p;
    uint8_t *b = realloc(s->present, n);
    if (b)
        s->present = b;
    if (!r || !p || !b)
        return -ENOMEM;
    s->cap = n;
    return 0;
}

static int handle_lookup(struct net_conn *c, const struct proto_frame *f)
{
    struct lk_service *s = svc_of(c);
    size_t n = f->n;
    if (ensure_scratch(s, n ? n : 1) < 0) {
        snprintf(c->why, sizeof(c->why), "no memory for a lookup of %zu keys", n);
        return -ENOMEM;
    }
    for (size_t k = 0; k < n; k++) {
        memset(&s->reqs[k], 0, sizeof(s->reqs[k]));
        proto_get_key(f, (uint32_t)k, &s->reqs[k].key); /* parsed: in bounds */
        s->req_ptrs[k] = &s->reqs[k];
    }
    if (lookup_host_lookup(&s->host, s->reqs, s->req_ptrs, n, s->present,
                           f->arg & PROTO_LOOKUP_TOUCH) < 0) {
        /* a local tier answers inline (tier.h); one that does not would
         * write into our scratch later: refuse to go on */
        umbp_log(UMBP_LOG_ERROR, "lookup service %s: tier %s did not answer a lookup inline; "
                 "the service stops", s->path, s->host.tier_name);
        snprintf(c->why, sizeof(c->why), "tier answered asynchronously");
        return -ENOTSUP;
    }
    int rc = proto_begin(&c->out, PROTO_LOOKUP_R, f->seq, (uint32_t)n, 0);
    for (size_t k = 0; rc == 0 && k < n; k++)
        rc = proto_put_u8(&c->out, s->present[k] ? 1 : 0);
    return reply_end(c, rc);
}

static int handle_stats(struct net_conn *c, const struct proto_frame *f)
{
    struct lk_service *s = svc_of(c);
    struct umbp_tier_usage u;
    struct lookup_host_counters n;
    lookup_host_usage(&s->host, &u);
    lookup_host_counters(&s->host, &n);
    struct proto_stats st = {
        .capacity_bytes = u.capacity_bytes, .used_bytes = u.used_bytes,
        .num_objects = u.num_objects, .num_pending = u.num_pending,
        .num_leased = u.num_leased, .evictions = u.evictions,
        .evicted_bytes = u.evicted_bytes, .leases_expired = u.leases_expired,
        .sessions = s->svc.nconns, .lookups = n.lookups, .lookup_keys = n.lookup_keys,
        .lookup_hits = n.lookup_hits, .protocol_errors = s->protocol_errors,
        .refused_connections = s->refused,
    };
    int rc = proto_begin(&c->out, PROTO_STATS_R, f->seq, 1, 0);
    if (rc == 0)
        rc = proto_put_stats(&c->out, &st);
    return reply_end(c, rc);
}

static const struct net_role lookup_role; /* below, with the handlers */

/* HELLO: role lookup, this protocol version, and (where given) this
 * service's namespace, DP index and rank, so a client that computed the
 * path for another rank learns it at once. */
static int handle_hello(struct net_conn *c, const struct proto_frame *f, char *what,
                        size_t whatlen)
{
    struct lk_service *s = svc_of(c);
    struct proto_hello h;
    if (f->type != PROTO_HELLO) {
        snprintf(what, whatlen, "frame.type: %s before HELLO; a session's first frame must "
                 "be HELLO", proto_type_name(f->type));
        return -EPROTO;
    }
    if (proto_get_hello(f, &h, what, whatlen) < 0)
        return -EPROTO;
    char msg[PROTO_ERRMSG_MAX] = "";
    int status = -EINVAL;
    if (h.version != PROTO_VERSION) {
        snprintf(msg, sizeof(msg), "HELLO.version: this lookup service speaks protocol "
                 "version %d, not %u", PROTO_VERSION, h.version);
        status = -EPROTO;
    } else if (h.role != PROTO_ROLE_LOOKUP) {
        snprintf(msg, sizeof(msg), "HELLO.role: a worker's lookup service takes role lookup "
                 "(1) only, got %u", h.role);
    } else if (h.name_space[0] && strcasecmp(h.name_space, s->ns) != 0) {
        snprintf(msg, sizeof(msg), "HELLO.name_space: this service serves namespace %s, "
                 "not %.64s", s->ns, h.name_space);
    } else if (h.dp_rank != s->dp_index || h.tp_rank != s->rank) {
        snprintf(msg, sizeof(msg), "HELLO.dp_rank/tp_rank: this service serves dp %u rank "
                 "%u, not dp %u rank %u", s->dp_index, s->rank, h.dp_rank, h.tp_rank);
    }
    if (msg[0]) {
        proto_put_error_frame(&c->out, PROTO_HELLO_ERR, f->seq, status, msg);
        umbp_log(UMBP_LOG_WARN, CONN_FMT ": refused: %s", CONN_ARGS(c), msg);
        snprintf(c->why, sizeof(c->why), "refused HELLO");
        return -ECONNABORTED;
    }
    struct umbp_tier_usage u;
    lookup_host_usage(&s->host, &u);
    /* as umbp-server answers a lookup session, without a descriptor; this
     * rank's pool is private to it, so pool_id 0 ("no shared pool") */
    struct proto_welcome w = {
        .version = PROTO_VERSION, .lease_ttl_ms = s->host.lease_ttl_ms,
        .session_id = c->id, .pool_id = 0, .pool_size = u.capacity_bytes,
        .capacity_bytes = u.capacity_bytes,
    };
    int rc = proto_begin(&c->out, PROTO_HELLO_OK, f->seq, 1, 0);
    if (rc == 0)
        rc = proto_put_welcome(&c->out, &w);
    if ((rc = reply_end(c, rc)) < 0)
        return rc;
    c->role = &lookup_role;
    return 0;
}

static int handle_ping(struct net_conn *c, const struct proto_frame *f)
{
    int rc = proto_put_empty(&c->out, PROTO_PONG, f->seq, 0);
    if (rc < 0)
        snprintf(c->why, sizeof(c->why), "cannot build a reply: %s", strerror(-rc));
    return rc;
}

/* What role lookup may send; anything else is malformed ("frame.type: X is
 * not allowed for role lookup (it may send LOOKUP, STATS, PING)"). */
static const struct net_role lookup_role = {
    .name = "lookup",
    .handlers = {
        [PROTO_LOOKUP] = handle_lookup, [PROTO_STATS] = handle_stats,
        [PROTO_PING] = handle_ping,
    },
};

/* ---- the service's hooks (net/service.h) ------------------------------------------- */

static void conn_name(const struct net_conn *c, char *buf, size_t len)
{
    snprintf(buf, len, CONN_FMT, CONN_ARGS(c));
}

static int conn_open(struct net_conn *c)
{
    umbp_log(UMBP_LOG_DEBUG, CONN_FMT ": connected", CONN_ARGS(c));
    return 0;
}

static void conn_refuse(struct net_service *svc, int fd, const struct ucred *cr,
                        enum net_refusal why, int err)
{
    struct lk_service *s = svc->p.owner;
    const char *text = why == NET_REFUSE_CRED   ? strerror(err)
                       : why == NET_REFUSE_PEER ? "not this engine's user (nor root)"
                       : why == NET_REFUSE_FULL ? "64 lookup connections are open already"
                                                : "out of memory for a connection";
    (void)fd;
    s->refused++;
    umbp_log(UMBP_LOG_WARN, "lookup service %s: refused a connection from uid %u pid %d: %s",
             s->path, cr ? (unsigned)cr->uid : 0u, cr ? (int)cr->pid : 0, text);
}

static void conn_malformed(struct net_conn *c) { svc_of(c)->protocol_errors++; }

static void conn_accept_error(struct net_service *svc, int err, double retry_s)
{
    struct lk_service *s = svc->p.owner;
    umbp_log(UMBP_LOG_WARN, "lookup service %s: accept: %s; new connections wait %.1f s",
             s->path, strerror(err), retry_s);
}

static void conn_close(struct net_conn *c)
{
    umbp_log(UMBP_LOG_DEBUG, CONN_FMT ": %s", CONN_ARGS(c), c->why[0] ? c->why : "closed");
}

static const struct net_service_ops lookup_service_ops = {
    .name = conn_name,
    .on_open = conn_open,
    .on_refuse = conn_refuse,
    .on_hello = handle_hello,
    .on_malformed = conn_malformed,
    .on_accept_error = conn_accept_error,
    .on_close = conn_close,
};

/* Accepted from this user or root, 64 at most; a client whose replies are
 * above OUT_PAUSE is not read until they have all gone; no timeouts (the
 * scheduler's client bounds its own calls). */
static void service_init(struct lk_service *s)
{
    struct net_service_params p = {
        .loop = s->host.loop, .ops = &lookup_service_ops, .owner = s,
        .conn_size = sizeof(struct net_conn), .peer = {.allow_root = true},
        .max_conns = LK_MAX_CONNS, .accept_batch = ACCEPT_BATCH,
        .accept_retry_s = ACCEPT_RETRY_S, .in_initial = IN_INITIAL,
        .out_pause = OUT_PAUSE, .out_resume = 1, .out_keep = OUT_PAUSE,
    };
    net_service_init(&s->svc, &p);
}

/* ---- starting and stopping (loop thread) ---------------------------------------------- */

void lookup_serve_start(struct lk_service *s)
{
    if (s->stopped)
        return; /* shutdown began before the message arrived */
    net_service_start(&s->svc, s->listener.fd);
    s->started = true;
}

/* Closes the files and removes the socket if it is still the one we bound. */
static void release_files(struct lk_service *s)
{
    net_listen_close(s->path, &s->listener);
    if (s->lock_fd >= 0) {
        net_lock_release(s->lock_path, s->lock_fd);
        s->lock_fd = -1;
    }
}

void lookup_serve_stop(struct lk_service *s)
{
    if (s->stopped)
        return;
    s->stopped = true;
    net_service_close_all(&s->svc, "the runtime is shutting down");
    net_service_stop_accepting(&s->svc);
    release_files(s);
    umbp_log(UMBP_LOG_INFO, "lookup service %s: stopped", s->path);
}

void lookup_serve_free(struct lk_service *s)
{
    if (!s)
        return;
    release_files(s);
    free(s->reqs);
    free(s->req_ptrs);
    free(s->present);
    free(s);
}

const char *lookup_serve_path(const struct lk_service *s) { return s->path; }

/* ---- setting up (caller's thread) ------------------------------------------------------ */

static int busy(const struct lk_service *s, const char *who, char *err, size_t errlen)
{
    snprintf(err, errlen, "lookup socket %s is served by another live engine%s; a live socket "
             "is never taken over: give this engine a distinct lookup_instance (or another "
             "lookup_dir)", s->path, who);
    return -EADDRINUSE;
}

/* The lock file itself is net/lockfile.c; the words are ours. */
static int lock_take(struct lk_service *s, char *err, size_t errlen)
{
    struct net_lock_result r;
    char who[48] = "";
    net_lock_take(s->lock_path, &r);
    switch (r.outcome) {
    case NET_LOCK_TAKEN:
        if (r.pid_failed)
            umbp_log(UMBP_LOG_WARN, "lookup socket lock %s: cannot record the pid (%s)",
                     s->lock_path, strerror(r.pid_errno));
        s->lock_fd = r.fd;
        return 0;
    case NET_LOCK_OPEN_FAILED:
        snprintf(err, errlen, "lookup socket lock %s: cannot open it (%s)", s->lock_path,
                 strerror(r.err));
        return -r.err;
    case NET_LOCK_HELD:
        if (r.holder_known)
            snprintf(who, sizeof(who), " (pid %ld)", r.holder_pid);
        return busy(s, who, err, errlen);
    case NET_LOCK_FLOCK_FAILED:
        snprintf(err, errlen, "lookup socket lock %s: flock: %s", s->lock_path,
                 strerror(r.err));
        return -r.err;
    case NET_LOCK_REPLACED:
        break;
    }
    snprintf(err, errlen, "lookup socket lock %s keeps being replaced; is another engine "
             "starting and stopping on this path?", s->lock_path);
    return -EAGAIN;
}

/* With the lock held, the socket by net/listen.c: whatever is at the path
 * by NET_STALE_PROBE (a socket that accepts a connection is a live listener
 * that does not take our lock, never taken over; one that refuses is stale
 * and removed; anything else is refused), then bind, 0600 (the first gate,
 * SO_PEERCRED on accept the second), listen.  The words are ours. */
static int listen_open(struct lk_service *s, char *err, size_t errlen)
{
    struct net_listen_params p = {.path = s->path, .stale = NET_STALE_PROBE, .mode = 0600};
    struct net_listen_result r;
    net_listen_open(&p, &s->listener, &r);
    if (r.replaced)
        umbp_log(UMBP_LOG_INFO, "lookup socket %s: replaced a stale socket (connect: %s)",
                 s->path, strerror(r.probe_err));
    switch (r.outcome) {
    case NET_LISTEN_OK:
        return 0;
    case NET_LISTEN_NOT_SOCKET:
        snprintf(err, errlen, "lookup socket %s: a file that is not a socket is in the way; "
                 "it is left alone: remove it, or choose another lookup_dir", s->path);
        return -EEXIST;
    case NET_LISTEN_LIVE:
        return busy(s, "", err, errlen);
    case NET_LISTEN_UNLINK_FAILED:
        snprintf(err, errlen, "lookup socket %s: cannot remove the stale socket (%s; connect "
                 "said %s)", s->path, strerror(r.err), strerror(r.probe_err));
        break;
    case NET_LISTEN_SOCKET_FAILED:
        snprintf(err, errlen, "socket(AF_UNIX): %s", strerror(r.err));
        break;
    case NET_LISTEN_BIND_FAILED:
        snprintf(err, errlen, "lookup socket %s: bind: %s; check lookup_dir", s->path,
                 strerror(r.err));
        break;
    case NET_LISTEN_CHOWN_FAILED: /* not asked for */
    case NET_LISTEN_CHMOD_FAILED:
    case NET_LISTEN_LISTEN_FAILED:
        snprintf(err, errlen, "lookup socket %s: %s", s->path, strerror(r.err));
        break;
    }
    return -r.err; /* release_files removes what was made */
}

struct lk_service *lookup_serve_new(const struct lookup_host *host, uint32_t dp_index,
                                    uint32_t rank)
{
    struct lk_service *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->host = *host;
    s->lock_fd = -1;
    s->listener = (struct net_listener)NET_LISTENER_INIT;
    s->dp_index = dp_index;
    s->rank = rank;
    service_init(s);
    return s;
}

int lookup_serve_setup(struct lk_service *s, const char *dir, const char *ns_hex,
                       const char *instance, char *err, size_t errlen)
{
    char def[LK_PATH_MAX];
    bool is_default = !dir || !dir[0];
    int rc;
    if (is_default) {
        lookup_default_dir(def, sizeof(def));
        dir = def;
    }
    if ((rc = lookup_socket_path(dir, ns_hex, instance, s->dp_index, s->rank, s->path,
                                 sizeof(s->path), err, errlen)) < 0)
        return rc;
    for (size_t i = 0; i < UMBP_LOOKUP_NS_HEX_LEN; i++)
        s->ns[i] = (char)(ns_hex[i] >= 'A' && ns_hex[i] <= 'F' ? ns_hex[i] - 'A' + 'a'
                                                             : ns_hex[i]);
    snprintf(s->lock_path, sizeof(s->lock_path), "%s.lock", s->path);
    if ((rc = lookup_dir_prepare(dir, is_default, "lookup_dir", err, errlen)) < 0 ||
        (rc = lock_take(s, err, errlen)) < 0 || (rc = listen_open(s, err, errlen)) < 0)
        return rc;
    return 0;
}
