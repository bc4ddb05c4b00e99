/*
 * session.c - one connected client as the server sees it: what it holds
 * (reservations, leases, events), its place on the run queue, and the
 * server's words for its life; the socket, buffers, frame loop, pause and
 * deadlines are net/service.c's, configured here (session_service_init).
 *
 * Whole frames are handled in order (requests.c), up to SRV_SLICE_RECORDS
 * records per loop turn, and their replies appended to `out`, so replies
 * leave in request order.  A session with more to do than one turn allows
 * (a large frame part handled, or many frames) is handed to on_yield: it
 * goes on the server's run queue and is not read until the queue has
 * given it turns enough (see Fairness in srv.h).  A client that sends
 * faster than it reads is paused (its socket is not read) while its output
 * is above SRV_OUT_PAUSE, so its replies cannot grow without bound.
 *
 * The service's deadline timer (see Timeouts in srv.h) ends a session that
 * has not sent a whole HELLO within handshake_timeout_ms of connecting, or
 * whose partial frame has not completed within frame_timeout_ms.
 *
 * A session ends on EOF, a socket error, a malformed frame (an ERROR frame
 * naming the field goes out first, best effort), a backlog over SRV_OUT_MAX,
 * a refused HELLO or a deadline.  Whatever it still holds ends with it
 * (session_end): leases are released at once; reservations are orphaned -
 * the key is free again at once, the region only when its writer has
 * provably stopped (its declared write deadline, counted from the grant,
 * has passed: the client may be alive and still copying after its
 * connection dropped), so a client killed with -9 leaks nothing for longer
 * than its deadline and a live one never writes into a region handed to
 * someone else.
 *
 * Loop thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "inbuf.h"
#include "srv.h"
#include "util.h"


/* ---- opening ---------------------------------------------------------------------- */

static void session_name(const struct net_conn *c, char *buf, size_t len)
{
    snprintf(buf, len, SESSION_FMT, SESSION_ARGS(to_session((struct net_conn *)c)));
}

static int session_begin(struct net_conn *c)
{
    struct srv_session *ss = to_session(c);
    ss->srv = c->svc->p.owner;
    if (track_init(&ss->reservations, true) < 0 || track_init(&ss->leases, false) < 0) {
        track_fini(&ss->leases);
        track_fini(&ss->reservations);
        return -ENOMEM;
    }
    umbp_log(UMBP_LOG_INFO, SESSION_FMT ": connected (uid %u gid %u)", SESSION_ARGS(ss),
             (unsigned)c->uid, (unsigned)c->gid);
    return 0;
}

struct srv_session *session_open(struct umbp_server *s, int fd, pid_t pid, uid_t uid,
                                 gid_t gid)
{
    struct ucred cr = {.pid = pid, .uid = uid, .gid = gid};
    struct net_conn *c = net_service_adopt(&s->svc, fd, &cr);
    return c ? to_session(c) : NULL;
}

/* ---- the run queue ----------------------------------------------------------------- */

static void runq_push(struct net_conn *c)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    c->held = true; /* not read, no frame deadline, until its turn */
    ss->run_next = NULL;
    *s->runq_tail = ss;
    s->runq_tail = &ss->run_next;
    s->nrunq++;
    ev_idle_start(s->loop, &s->run_w);
}

static struct srv_session *runq_pop(struct umbp_server *s)
{
    struct srv_session *ss = s->runq;
    s->runq = ss->run_next;
    if (!s->runq)
        s->runq_tail = &s->runq;
    s->nrunq--;
    ss->conn.held = false;
    return ss;
}

/* Off the run queue (a walk: the queue is short, and a queued session
 * rarely closes), its partial reply and held events freed: what ending
 * needs besides the rest. */
static void session_unschedule(struct srv_session *ss)
{
    struct umbp_server *s = ss->srv;
    if (ss->conn.held) {
        struct srv_session **p = &s->runq;
        while (*p != ss)
            p = &(*p)->run_next;
        *p = ss->run_next;
        if (s->runq_tail == &ss->run_next)
            s->runq_tail = p;
        s->nrunq--;
        ss->conn.held = false;
    }
    proto_buf_free(&ss->reply);
    proto_buf_free(&ss->held);
}

/* One more slice for every session queued before this turn, in order;
 * those with work left queue again at the tail. */
static void run_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
    struct umbp_server *s = umbp_container_of(w, struct umbp_server, run_w);
    (void)revents;
    for (size_t n = s->nrunq; n && s->runq; n--) {
        struct srv_session *ss = runq_pop(s);
        if (net_conn_process(&ss->conn) < 0)
            net_conn_close(&ss->conn);
    }
    if (!s->runq)
        ev_idle_stop(loop, w);
}

void session_runq_init(struct umbp_server *s)
{
    s->runq = NULL;
    s->runq_tail = &s->runq;
    ev_idle_init(&s->run_w, run_cb);
    /* idle watchers of the highest priority run every turn, before the
     * sessions' I/O, and keep the loop from blocking while work is queued */
    ev_set_priority(&s->run_w, EV_MAXPRI);
}

void session_runq_stop(struct umbp_server *s) { ev_idle_stop(s->loop, &s->run_w); }

/* ---- ending -------------------------------------------------------------------------- */

static void release_one(void *arg, uint64_t token, const umbp_key_t *key)
{
    (void)key;
    srv_store_release(arg, token);
}

struct orphan_ctx {
    const struct srv_store *st;
    uint64_t now;
};

static void orphan_one(void *arg, uint64_t token, const umbp_key_t *key)
{
    struct orphan_ctx *o = arg;
    srv_store_orphan(o->st, key, token, o->now);
}

/* The service's on_close: what the session held, and its line. */
static void session_end(struct net_conn *c)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    uint64_t leases = ss->leases.n, reservations = ss->reservations.n;

    struct orphan_ctx o = {&s->st, umbp_now_ns()};
    /* a slice waiting for the cluster: its answer is dropped when it comes */
    srv_node_call_cancel(ss->node_call);
    ss->node_call = NULL;
    srv_node_slice_done(ss);
    track_drain(&ss->leases, release_one, (void *)&s->st);
    track_drain(&ss->reservations, orphan_one, &o);
    umbp_log(UMBP_LOG_INFO, SESSION_FMT ": %s; released %llu leases; %llu unfinished "
             "reservations held until their writer's deadline (%llu ms after each grant, "
             "plus the hold of those made ahead)",
             SESSION_ARGS(ss), c->why[0] ? c->why : "closed", (unsigned long long)leases,
             (unsigned long long)reservations,
             (unsigned long long)(ss->write_deadline_ns / 1000000ull));
    if (ss->events)
        srv_events_unsubscribe(ss);
    session_unschedule(ss);
    track_fini(&ss->leases);
    track_fini(&ss->reservations);
}

void session_close(struct srv_session *ss) { net_conn_close(&ss->conn); }

void session_warm(struct srv_session *ss)
{
    struct net_conn *c = &ss->conn;
    const size_t hdr = PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE;
    size_t keys = (size_t)ss->srv->cfg->opt.session_warm_keys;
    if (!keys)
        return;
    (void)track_presize(&ss->reservations, keys);
    (void)track_presize(&ss->leases, keys);
    /* the replies of RESERVE and ACQUIRE: a region a key */
    proto_out_warm(&ss->reply, hdr + keys * PROTO_REGION_ITEM_SIZE);
    proto_out_warm(&c->out, hdr + keys * PROTO_REGION_ITEM_SIZE);
    /* the input past what came with the HELLO (bytes behind it may follow),
     * as much as a PUBLISH or RELEASE of that many keys takes */
    size_t in = hdr + keys * PROTO_TOKEN_ITEM_SIZE, room = c->in_cap - c->in_len;
    umbp_touch_pages(c->in + c->in_len, in < room ? in : room);
}

int session_reply_done(struct srv_session *ss)
{
    int rc = proto_buf_move(&ss->conn.out, &ss->reply);
    return rc ? rc : proto_buf_move(&ss->conn.out, &ss->held);
}

/* ---- the service's other hooks -------------------------------------------------------- */

static void session_timeout(struct net_conn *c, bool handshake)
{
    struct srv_session *ss = to_session(c);
    const struct srv_options *o = &ss->srv->cfg->opt;
    if (handshake) {
        umbp_log(UMBP_LOG_WARN, SESSION_FMT ": no HELLO within handshake_timeout_ms (%lld "
                 "ms; %zu bytes came); disconnected", SESSION_ARGS(ss),
                 (long long)o->handshake_timeout_ms, c->in_len);
        snprintf(c->why, sizeof(c->why), "handshake_timeout_ms passed");
    } else {
        umbp_log(UMBP_LOG_WARN, SESSION_FMT ": a frame stayed incomplete for "
                 "frame_timeout_ms (%lld ms; %zu bytes of it came); disconnected",
                 SESSION_ARGS(ss), (long long)o->frame_timeout_ms, c->in_len);
        snprintf(c->why, sizeof(c->why), "frame_timeout_ms passed");
    }
}

static void session_malformed(struct net_conn *c) { to_session(c)->srv->c.protocol_errors++; }

static void session_processed(struct net_conn *c) { srv_note_request(to_session(c)->srv); }

static const struct net_service_ops session_ops = {
    .name = session_name,
    .on_open = session_begin,
    .on_refuse = srv_listen_refuse,
    .on_hello = srv_handle_hello,
    .run = srv_run_frame,
    .on_processed = session_processed,
    .on_yield = runq_push,
    .on_malformed = session_malformed,
    .on_timeout = session_timeout,
    .on_accept_error = srv_listen_accept_error,
    .on_close = session_end,
};

void session_service_init(struct umbp_server *s)
{
    const struct srv_config *c = s->cfg;
    struct net_service_params p = {
        .loop = s->loop, .ops = &session_ops, .owner = s,
        .conn_size = sizeof(struct srv_session),
        .peer = {.uids = c->uids, .nuids = c->nuids, .gids = c->gids, .ngids = c->ngids},
        .max_conns = (unsigned)c->opt.max_sessions, .accept_batch = 64,
        .accept_retry_s = 0.1, /* after EMFILE: try again this much later */
        .in_initial = SRV_IN_INITIAL,
        .in_budget = (size_t)c->opt.input_budget_bytes,
        .in_budget_option = "input_budget_bytes",
        .out_pause = SRV_OUT_PAUSE, .out_resume = SRV_OUT_RESUME,
        .out_keep = SRV_OUT_RESUME, .out_max = SRV_OUT_MAX,
        .handshake_timeout_ms = c->opt.handshake_timeout_ms,
        .frame_timeout_ms = c->opt.frame_timeout_ms,
        .slice_records = SRV_SLICE_RECORDS,
    };
    net_service_init(&s->svc, &p);
}
