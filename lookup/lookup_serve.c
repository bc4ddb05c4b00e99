/*
 * lookup_serve.c - a worker's lookup service: the scheduler asks this rank
 * which keys its pool holds, over the lookup role of the standalone
 * protocol, on a Unix stream socket.
 *
 * Setting up (umbp_lookup_serve, caller's thread): the directory, then the
 * path.  One service per path: it holds flock(LOCK_EX) on "<path>.lock" for
 * its lifetime (net/lockfile.c, shared with umbp-server), so two engines starting at once cannot both take a path; a
 * socket file at the path that nobody holds the lock for, and that refuses a
 * connect(), is a dead engine's and is replaced; one that accepts is a live
 * engine's (never taken over: -EADDRINUSE naming lookup_instance); a file
 * that is not a socket is refused and left alone.  The listening socket is
 * bound, made 0600 and put in listen state here, then MSG_LOOKUP_SERVE
 * hands it to the loop thread (connections that arrive meanwhile wait in
 * the backlog).
 *
 * Serving (loop thread only, like the lookup actor): connections are
 * accepted from this user or root (SO_PEERCRED), 64 at most; input is read
 * without blocking and cut into frames by proto_frame_parse.  The first
 * frame must be HELLO of role lookup (HELLO_OK back, no descriptor), then
 * LOOKUP (LOOKUP_R: one u8 per key), STATS, PING.  A LOOKUP is one tier
 * lookup of the whole frame, called as the lookup actor calls it: no LRU
 * change unless PROTO_LOOKUP_TOUCH, quarantined keys count as misses, the
 * lookup is counted in the runtime's stats.  The embedded tier answers
 * inline (remote tiers are refused at umbp_lookup_serve), so a frame's
 * reply is appended before the next frame is looked at.  A malformed frame
 * gets an ERROR frame naming the field (best effort), a log line, and that
 * connection is closed; nothing else notices.  A client that sends faster
 * than it reads is paused (not read) while its replies exceed OUT_PAUSE.
 *
 * Stopping: when umbp_runtime_destroy begins (on_stop, loop thread) every
 * connection is closed at once, the listener too, and the socket and lock
 * files are removed (the socket only if it is still ours).  What is left
 * when the loop has ended (a service whose start message was never
 * delivered) is freed by lookup_service_free.  Nothing here waits.
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
#include "lockfile.h"
#include "lookup_int.h"
#include "proto.h"
#include "rt.h"
#include "tier_call.h"

#define LK_MAX_CONNS 64
#define IN_INITIAL (64u << 10)
#define OUT_PAUSE (1u << 20)
#define ACCEPT_BATCH 16
#define ACCEPT_RETRY_S 0.1

struct lk_conn {
    struct lookup_service *svc;
    struct lk_conn *prev, *next;
    int fd;
    ev_io rio, wio;
    uint64_t id;
    pid_t pid;
    bool greeted;
    bool paused;                 /* not reading: replies above OUT_PAUSE */
    uint8_t *in;                 /* unparsed input [0, in_len) */
    size_t in_len, in_cap;
    struct proto_buf out;        /* replies; [out_off, out.len) unsent */
    size_t out_off;
    char why[PROTO_ERRMSG_MAX];  /* why it closes, for the log */
};

struct lookup_service {
    struct msg_hdr hdr;          /* MSG_LOOKUP_SERVE */
    struct umbp_runtime *rt;
    char path[LK_PATH_MAX], lock_path[LK_PATH_MAX + 8];
    char ns[UMBP_LOOKUP_NS_HEX_LEN + 1];
    uint32_t dp_index, rank;
    int listen_fd, lock_fd;
    dev_t sock_dev;              /* the socket file we bound, so that we */
    ino_t sock_ino;              /* never remove another engine's */
    bool started, stopped;
    ev_io accept_w;
    ev_timer accept_retry_w;
    struct lk_conn *conns;
    unsigned nconns;
    uint64_t next_id;
    uint64_t protocol_errors, refused;
    /* one lookup at a time (loop thread): the tier's requests */
    struct umbp_tier_req *reqs;
    struct umbp_tier_req **req_ptrs;
    uint8_t *present;
    size_t cap;
};

#define CONN_FMT "lookup service %s: connection %llu (pid %d)"
#define CONN_ARGS(c) (c)->svc->path, (unsigned long long)(c)->id, (int)(c)->pid

/* ---- connections: closing, output ------------------------------------------ */

static void conn_close(struct lk_conn *c)
{
    struct lookup_service *s = c->svc;
    struct ev_loop *loop = s->rt->loop;
    umbp_log(UMBP_LOG_DEBUG, CONN_FMT ": %s", CONN_ARGS(c), c->why[0] ? c->why : "closed");
    ev_io_stop(loop, &c->rio);
    ev_io_stop(loop, &c->wio);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    proto_buf_free(&c->out);
    free(c->in);
    free(c);
}

static size_t backlog(const struct lk_conn *c) { return c->out.len - c->out_off; }

/* Writes what it can.  < 0: the peer is gone (why set). */
static int conn_flush(struct lk_conn *c)
{
    struct ev_loop *loop = c->svc->rt->loop;
    int rc = proto_out_send(c->fd, &c->out, &c->out_off);
    if (rc < 0) {
        snprintf(c->why, sizeof(c->why), "send: %s", strerror(-rc));
        return rc;
    }
    if (c->out_off == c->out.len) {
        c->out_off = 0;
        if (c->out.cap > OUT_PAUSE)
            proto_buf_free(&c->out); /* give a large buffer back */
        else
            proto_buf_consume(&c->out, c->out.len);
        ev_io_stop(loop, &c->wio);
    } else {
        ev_io_start(loop, &c->wio);
    }
    return 0;
}

/* ---- requests ------------------------------------------------------------------ */

static int reply_end(struct lk_conn *c, int rc)
{
    int erc = proto_end(&c->out);
    rc = rc ? rc : erc;
    if (rc < 0)
        snprintf(c->why, sizeof(c->why), "cannot build a reply: %s", strerror(-rc));
    return rc;
}

static int ensure_scratch(struct lookup_service *s, size_t n)
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

struct lk_call {
    bool done;
    int rc;
};

static void lookup_answered(void *arg, int rc)
{
    struct lk_call *call = arg;
    call->done = true;
    call->rc = rc;
}

static int handle_lookup(struct lk_conn *c, const struct proto_frame *f)
{
    struct lookup_service *s = c->svc;
    struct umbp_runtime *rt = s->rt;
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
    struct lk_call call = {false, 0};
    int h = tier_health(rt->tier);
    if (h < 0 || n == 0)
        lookup_answered(&call, h);
    else
        tier_lookup(rt->tier, s->req_ptrs, n, s->present, f->arg & PROTO_LOOKUP_TOUCH,
                    lookup_answered, &call);
    if (!call.done) {
        /* a local tier answers inline (tier.h); one that does not would
         * write into our scratch later: refuse to go on */
        umbp_log(UMBP_LOG_ERROR, "lookup service %s: tier %s did not answer a lookup inline; "
                 "the service stops", s->path, rt->tier_name);
        snprintf(c->why, sizeof(c->why), "tier answered asynchronously");
        return -ENOTSUP;
    }
    if (call.rc < 0)
        memset(s->present, 0, n);
    lookup_account(rt, s->reqs, s->present, n);
    int rc = proto_begin(&c->out, PROTO_LOOKUP_R, f->seq, (uint32_t)n, 0);
    for (size_t k = 0; rc == 0 && k < n; k++)
        rc = proto_put_u8(&c->out, s->present[k] ? 1 : 0);
    return reply_end(c, rc);
}

#define LOAD(f) atomic_load_explicit(&rt->cnt.f, memory_order_relaxed)

static int handle_stats(struct lk_conn *c, const struct proto_frame *f)
{
    struct lookup_service *s = c->svc;
    struct umbp_runtime *rt = s->rt;
    struct umbp_tier_usage u;
    tier_usage(rt->tier, &u);
    struct proto_stats st = {
        .capacity_bytes = u.capacity_bytes, .used_bytes = u.used_bytes,
        .num_objects = u.num_objects, .num_pending = u.num_pending,
        .num_leased = u.num_leased, .evictions = u.evictions,
        .evicted_bytes = u.evicted_bytes, .leases_expired = u.leases_expired,
        .sessions = s->nconns, .lookups = LOAD(lookups), .lookup_keys = LOAD(lookup_keys),
        .lookup_hits = LOAD(lookup_hits), .protocol_errors = s->protocol_errors,
        .refused_connections = s->refused,
    };
    int rc = proto_begin(&c->out, PROTO_STATS_R, f->seq, 1, 0);
    if (rc == 0)
        rc = proto_put_stats(&c->out, &st);
    return reply_end(c, rc);
}

/* HELLO: role lookup, this protocol version, and (where given) this
 * service's namespace, DP index and rank, so a client that computed the
 * path for another rank learns it at once. */
static int handle_hello(struct lk_conn *c, const struct proto_frame *f, char *what,
                        size_t whatlen)
{
    struct lookup_service *s = c->svc;
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
    tier_usage(s->rt->tier, &u);
    /* as umbp-server answers a lookup session, without a descriptor; this
     * rank's pool is private to it, so pool_id 0 ("no shared pool") */
    struct proto_welcome w = {
        .version = PROTO_VERSION, .lease_ttl_ms = (uint32_t)s->rt->core->lease_ttl_ms,
        .session_id = c->id, .pool_id = 0, .pool_size = u.capacity_bytes,
        .capacity_bytes = u.capacity_bytes,
    };
    int rc = proto_begin(&c->out, PROTO_HELLO_OK, f->seq, 1, 0);
    if (rc == 0)
        rc = proto_put_welcome(&c->out, &w);
    if ((rc = reply_end(c, rc)) < 0)
        return rc;
    c->greeted = true;
    return 0;
}

/* One frame.  0, or < 0: close (why or what says why; -EPROTO: malformed). */
static int handle_frame(struct lk_conn *c, const struct proto_frame *f, char *what,
                        size_t whatlen)
{
    if (!c->greeted)
        return handle_hello(c, f, what, whatlen);
    switch (f->type) {
    case PROTO_LOOKUP: return handle_lookup(c, f);
    case PROTO_STATS: return handle_stats(c, f);
    case PROTO_PING: {
        int rc = proto_put_empty(&c->out, PROTO_PONG, f->seq, 0);
        if (rc < 0)
            snprintf(c->why, sizeof(c->why), "cannot build a reply: %s", strerror(-rc));
        return rc;
    }
    case PROTO_HELLO:
        snprintf(what, whatlen, "frame.type: HELLO after the handshake (once per session)");
        return -EPROTO;
    default:
        snprintf(what, whatlen, "frame.type: %s is not allowed for role lookup (it may send "
                 "LOOKUP, STATS, PING)", proto_type_name(f->type));
        return -EPROTO;
    }
}

/* ---- connections: input ------------------------------------------------------------ */

static void malformed(struct lk_conn *c, const char *what)
{
    c->svc->protocol_errors++;
    umbp_log(UMBP_LOG_WARN, CONN_FMT ": malformed frame: %s; disconnected", CONN_ARGS(c), what);
    proto_put_error_frame(&c->out, PROTO_ERROR, 0, -EPROTO, what);
    snprintf(c->why, sizeof(c->why), "malformed frame");
}

/* Handles the whole frames in `in` (until paused), then flushes.  < 0:
 * close the connection. */
static int conn_process(struct lk_conn *c)
{
    size_t pos = 0;
    int rc = 0;
    while (rc == 0) {
        if (backlog(c) > OUT_PAUSE) {
            c->paused = true;
            ev_io_stop(c->svc->rt->loop, &c->rio);
            break;
        }
        struct proto_frame f;
        char what[PROTO_ERRMSG_MAX] = "";
        long n = proto_frame_parse(c->in + pos, c->in_len - pos, false, &f, what, sizeof(what));
        if (n == 0)
            break;
        if (n > 0) {
            rc = handle_frame(c, &f, what, sizeof(what));
            pos += (size_t)n;
        } else {
            rc = (int)n;
        }
        if (rc == -EPROTO || rc == -EMSGSIZE)
            malformed(c, what[0] ? what : "frame");
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    int frc = conn_flush(c); /* the replies, and an ERROR or HELLO_ERR before a close */
    return rc < 0 ? rc : frc;
}

/* Room for more input (proto_in_room). */
static int in_room(struct lk_conn *c)
{
    return proto_in_room(&c->in, c->in_len, &c->in_cap, IN_INITIAL);
}

static void read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct lk_conn *c = umbp_container_of(w, struct lk_conn, rio);
    (void)loop;
    (void)revents;
    int rc = in_room(c);
    if (rc < 0) {
        snprintf(c->why, sizeof(c->why), "no memory for its input");
        conn_close(c);
        return;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        snprintf(c->why, sizeof(c->why), "%s", n == 0 ? "disconnected" : strerror(errno));
        conn_close(c);
        return;
    }
    c->in_len += (size_t)n;
    if (conn_process(c) < 0)
        conn_close(c);
}

static void write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct lk_conn *c = umbp_container_of(w, struct lk_conn, wio);
    (void)revents;
    int rc = conn_flush(c);
    if (rc == 0 && c->paused && backlog(c) == 0) {
        c->paused = false;
        ev_io_start(loop, &c->rio);
        rc = conn_process(c); /* the frames that waited */
    }
    if (rc < 0)
        conn_close(c);
}

/* ---- accepting ------------------------------------------------------------------------ */

static void refuse(struct lookup_service *s, int fd, const struct ucred *cr, const char *why)
{
    s->refused++;
    umbp_log(UMBP_LOG_WARN, "lookup service %s: refused a connection from uid %u pid %d: %s",
             s->path, cr ? (unsigned)cr->uid : 0u, cr ? (int)cr->pid : 0, why);
    close(fd);
}

static void accept_one(void *ctx, int fd)
{
    struct lookup_service *s = ctx;
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
        refuse(s, fd, NULL, strerror(errno));
        return;
    }
    if (cr.uid != geteuid() && cr.uid != 0) {
        refuse(s, fd, &cr, "not this engine's user (nor root)");
        return;
    }
    if (s->nconns >= LK_MAX_CONNS) {
        refuse(s, fd, &cr, "64 lookup connections are open already");
        return;
    }
    struct lk_conn *c = calloc(1, sizeof(*c));
    if (!c || !(c->in = malloc(IN_INITIAL))) {
        free(c);
        refuse(s, fd, &cr, "out of memory for a connection");
        return;
    }
    c->svc = s;
    c->fd = fd;
    c->pid = cr.pid;
    c->id = ++s->next_id;
    c->in_cap = IN_INITIAL;
    ev_io_init(&c->rio, read_cb, fd, EV_READ);
    ev_io_init(&c->wio, write_cb, fd, EV_WRITE);
    ev_io_start(s->rt->loop, &c->rio);
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    umbp_log(UMBP_LOG_DEBUG, CONN_FMT ": connected", CONN_ARGS(c));
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct lookup_service *s = umbp_container_of(w, struct lookup_service, accept_w);
    (void)revents;
    int rc = umbp_accept_batch(s->listen_fd, ACCEPT_BATCH, accept_one, s);
    if (rc < 0) {
        umbp_log(UMBP_LOG_WARN, "lookup service %s: accept: %s; new connections wait "
                 "%.1f s", s->path, strerror(-rc), ACCEPT_RETRY_S);
        ev_io_stop(loop, &s->accept_w);
        ev_timer_start(loop, &s->accept_retry_w);
    }
}

static void accept_retry_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct lookup_service *s = umbp_container_of(w, struct lookup_service, accept_retry_w);
    (void)revents;
    if (!s->stopped)
        ev_io_start(loop, &s->accept_w);
}

/* ---- the runtime's hooks --------------------------------------------------------------- */

void lookup_service_start(struct umbp_runtime *rt, struct msg_hdr *m)
{
    struct lookup_service *s = (struct lookup_service *)m;
    if (s->stopped)
        return; /* shutdown began before the message arrived */
    ev_io_init(&s->accept_w, accept_cb, s->listen_fd, EV_READ);
    ev_timer_init(&s->accept_retry_w, accept_retry_cb, ACCEPT_RETRY_S, 0.0);
    ev_io_start(rt->loop, &s->accept_w);
    s->started = true;
}

/* Closes the files and removes the socket if it is still the one we bound. */
static void release_files(struct lookup_service *s)
{
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
        s->listen_fd = -1;
        struct stat st;
        if (lstat(s->path, &st) == 0 && st.st_dev == s->sock_dev && st.st_ino == s->sock_ino)
            unlink(s->path);
    }
    if (s->lock_fd >= 0) {
        net_lock_release(s->lock_path, s->lock_fd);
        s->lock_fd = -1;
    }
}

void lookup_service_stop(struct umbp_runtime *rt)
{
    struct lookup_service *s = atomic_load_explicit(&rt->lookup_service, memory_order_acquire);
    if (!s || s->stopped)
        return;
    s->stopped = true;
    while (s->conns) {
        snprintf(s->conns->why, sizeof(s->conns->why), "the runtime is shutting down");
        conn_close(s->conns);
    }
    if (s->started) {
        ev_io_stop(rt->loop, &s->accept_w);
        ev_timer_stop(rt->loop, &s->accept_retry_w);
    }
    release_files(s);
    umbp_log(UMBP_LOG_INFO, "lookup service %s: stopped", s->path);
}

static void service_free(struct lookup_service *s)
{
    release_files(s);
    free(s->reqs);
    free(s->req_ptrs);
    free(s->present);
    free(s);
}

void lookup_service_free(struct umbp_runtime *rt)
{
    struct lookup_service *s = atomic_exchange(&rt->lookup_service, NULL);
    if (s)
        service_free(s); /* the loop has ended: no connection is left */
}

/* ---- setting up (caller's thread) ------------------------------------------------------ */

static int busy(const struct lookup_service *s, const char *who, char *err, size_t errlen)
{
    snprintf(err, errlen, "lookup socket %s is served by another live engine%s; a live socket "
             "is never taken over: give this engine a distinct lookup_instance (or another "
             "lookup_dir)", s->path, who);
    return -EADDRINUSE;
}

/* The lock file itself is net/lockfile.c; the words are ours. */
static int lock_take(struct lookup_service *s, char *err, size_t errlen)
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

/* With the lock held: whatever is at the path.  A socket that accepts a
 * connection is a live listener that does not take our lock (never taken
 * over); one that refuses is stale and removed; anything else is refused. */
static int clear_path(struct lookup_service *s, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(s->path, &st) < 0)
        return 0;
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "lookup socket %s: a file that is not a socket is in the way; "
                 "it is left alone: remove it, or choose another lookup_dir", s->path);
        return -EEXIST;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, s->path, strlen(s->path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "socket(AF_UNIX): %s", strerror(e));
        return -e;
    }
    int rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
    int e = rc < 0 ? errno : 0;
    close(fd);
    if (rc == 0 || e == EAGAIN || e == EINPROGRESS) /* EAGAIN: a listener, backlog full */
        return busy(s, "", err, errlen);
    if (unlink(s->path) < 0) {
        int ue = errno;
        snprintf(err, errlen, "lookup socket %s: cannot remove the stale socket (%s; connect "
                 "said %s)", s->path, strerror(ue), strerror(e));
        return -ue;
    }
    umbp_log(UMBP_LOG_INFO, "lookup socket %s: replaced a stale socket (connect: %s)", s->path,
             strerror(e));
    return 0;
}

static int listen_open(struct lookup_service *s, char *err, size_t errlen)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    struct stat st;
    memcpy(a.sun_path, s->path, strlen(s->path) + 1); /* fits: the path was checked */
    s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->listen_fd < 0) {
        int e = errno;
        snprintf(err, errlen, "socket(AF_UNIX): %s", strerror(e));
        return -e;
    }
    if (bind(s->listen_fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int e = errno;
        snprintf(err, errlen, "lookup socket %s: bind: %s; check lookup_dir", s->path,
                 strerror(e));
        close(s->listen_fd);
        s->listen_fd = -1;
        return -e;
    }
    if (lstat(s->path, &st) == 0) {
        s->sock_dev = st.st_dev;
        s->sock_ino = st.st_ino;
    }
    /* 0600 is the first gate (SO_PEERCRED on accept the second) */
    if (chmod(s->path, 0600) < 0 || listen(s->listen_fd, SOMAXCONN) < 0) {
        int e = errno;
        snprintf(err, errlen, "lookup socket %s: %s", s->path, strerror(e));
        return -e; /* release_files removes it */
    }
    return 0;
}

static int serve_setup(struct umbp_runtime *rt, struct lookup_service *s, const char *dir,
                       const char *ns_hex, const char *instance, char *err, size_t errlen)
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
    if (tier_caps(rt->tier) & UMBP_TIER_CAP_REMOTE) {
        snprintf(err, errlen, "umbp_lookup_serve: the runtime's tier %s is remote (mode %s); "
                 "a lookup service serves an embedded rank's own pool, and in standalone "
                 "mode the scheduler asks umbp-server (lookup client mode \"standalone\")",
                 rt->tier_name, rt->core->mode);
        return -ENOTSUP;
    }
    snprintf(s->lock_path, sizeof(s->lock_path), "%s.lock", s->path);
    if ((rc = lookup_dir_prepare(dir, is_default, "lookup_dir", err, errlen)) < 0 ||
        (rc = lock_take(s, err, errlen)) < 0 || (rc = clear_path(s, err, errlen)) < 0 ||
        (rc = listen_open(s, err, errlen)) < 0)
        return rc;
    return 0;
}

int umbp_lookup_serve(umbp_runtime_t *rt, const char *dir, const char *ns_hex,
                      const char *instance, uint32_t dp_index, uint32_t rank)
{
    char err[512] = "";
    if (!rt) {
        umbp_set_error("umbp_lookup_serve: rt must not be NULL");
        return -EINVAL;
    }
    if (atomic_load(&rt->closing)) {
        umbp_set_error("umbp_lookup_serve: the runtime is shutting down");
        return UMBP_E_NOT_ATTEMPTED;
    }
    struct lookup_service *s = calloc(1, sizeof(*s));
    if (!s) {
        umbp_set_error("umbp_lookup_serve: out of memory");
        return -ENOMEM;
    }
    s->hdr.type = MSG_LOOKUP_SERVE;
    s->rt = rt;
    s->listen_fd = s->lock_fd = -1;
    s->dp_index = dp_index;
    s->rank = rank;
    struct lookup_service *none = NULL;
    if (!atomic_compare_exchange_strong(&rt->lookup_service, &none, s)) {
        umbp_set_error("umbp_lookup_serve: this runtime already serves lookups (one service "
                       "per runtime)");
        free(s);
        return -EBUSY;
    }
    int rc = serve_setup(rt, s, dir, ns_hex, instance, err, sizeof(err));
    if (rc == 0 && (rc = rt_post(rt, &s->hdr)) < 0)
        snprintf(err, sizeof(err), "umbp_lookup_serve: the lookup actor's mailbox is full");
    if (rc < 0) {
        atomic_store(&rt->lookup_service, NULL);
        service_free(s);
        umbp_set_error("%s", err);
        return rc;
    }
    umbp_log(UMBP_LOG_INFO, "lookup service: dp %u rank %u at %s", (unsigned)dp_index,
             (unsigned)rank, s->path);
    return 0;
}
