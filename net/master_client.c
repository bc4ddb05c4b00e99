/*
 * master_client.c - a client of umbp-master (master_client.h): the owner
 * of one net/session (HELLO, HELLO_OK, replies) and of its poll() driver.
 *
 * A call is heap-allocated and shared by the caller and the session
 * (refs): the caller leaves at its deadline, the session keeps an overdue
 * call as an orphan until its late reply comes (dropped then) or the
 * connection goes.  Output arrays belong to the caller, so a call stops
 * writing to them (locs = NULL) once the caller has left.
 *
 * Threads: the caller's, one at a time.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ev.h>

#include "leader_watch.h"
#include "master_client.h"
#include "session.h"
#include "session_ev.h"
#include "session_poll.h"
#include "tcp.h"
#include "umbp/tier.h"

struct mclient {
    struct mclient_config cfg;
    char address[NET_TCP_NAME_MAX + 256];
    char engine_id[PROTO_NAME_MAX];
    struct net_session s;
    struct net_poll d;                 /* blocking: the poll() driver */
    struct pollfd pfd[1];
    struct net_ev ev;                  /* with a loop: the libev driver */
    bool tried;                        /* the first attempt was started */
    uint32_t epoch;                    /* of the node list below; 0: none */
    struct proto_node_info *nodes;     /* PROTO_MAX_NODES_FRAME */
    size_t nnodes;
    uint16_t *by_ref;                  /* NODE_SLOTS: ref -> index + 1 (0: empty) */
    char last_error[PROTO_ERRMSG_MAX + 128];
    /* A redis:// address: the leader as the lease store says (its thread),
     * the epoch of the master this connection was welcomed by (0: none or
     * no lease), and, with a loop, the doorbell the watch rings. */
    struct leader_watch *watch;
    uint64_t master_epoch;
    uint64_t highest_epoch;            /* without a watch: the highest welcomed */
    uint64_t dialled_epoch;            /* the leader the last dial was to */
    ev_async change_w;
};

struct mcall {
    struct net_call nc;                /* first: container_of */
    struct mclient *c;
    int refs;                          /* the caller's and the session's */
    bool done;
    int status;
    struct proto_ack ack;
    struct proto_location *locs;       /* the caller's; NULL once it left */
    size_t nkeys;
    mclient_done_fn cb;                /* an async call's; NULL: blocking */
    void *cb_arg;
};

static uint64_t ms_ns(uint64_t ms) { return ms * 1000000ull; }

/* The node list's index by ref: open addressing, at most half full. */
#define NODE_SLOTS (2 * PROTO_MAX_NODES_FRAME)
_Static_assert((NODE_SLOTS & (NODE_SLOTS - 1)) == 0 && NODE_SLOTS <= 65535,
               "NODE_SLOTS: a power of two that a uint16_t index + 1 fits");

static size_t ref_slot(uint32_t ref) { return (size_t)((ref * 2654435761u) >> 20) % NODE_SLOTS; }

static void index_nodes(struct mclient *c)
{
    memset(c->by_ref, 0, NODE_SLOTS * sizeof(*c->by_ref));
    for (size_t i = 0; i < c->nnodes; i++) {
        size_t h = ref_slot(c->nodes[i].ref);
        while (c->by_ref[h])
            h = (h + 1) % NODE_SLOTS;
        c->by_ref[h] = (uint16_t)(i + 1);
    }
}

/* ---- replies ----------------------------------------------------------------------- */

static int take_nodes(struct mclient *c, const struct proto_frame *f, char *err, size_t errlen)
{
    if (f->arg == c->epoch)
        return 0; /* unchanged */
    /* every record is checked before the list changes: a bad one leaves the
     * old list whole (it was overwritten up to the bad record, under the old
     * epoch and index) */
    struct proto_node_info tmp;
    for (uint32_t i = 0; i < f->n; i++)
        if (proto_get_node_info(f, i, &tmp, err, errlen) < 0)
            return -EPROTO;
    for (uint32_t i = 0; i < f->n; i++)
        proto_get_node_info(f, i, &c->nodes[i], err, errlen);
    c->nnodes = f->n;
    c->epoch = f->arg;
    index_nodes(c);
    return 0;
}

static int on_reply(struct net_call *nc, const struct proto_frame *f, char *err, size_t errlen)
{
    struct mcall *m = (struct mcall *)nc;
    switch (f->type) {
    case PROTO_REGISTER_R:
    case PROTO_HEARTBEAT_R:
    case PROTO_RESYNC_R:
        return proto_get_ack(f, &m->ack, err, errlen) < 0 ? -EPROTO : 0;
    case PROTO_LOCATE_R:
        if (f->n != m->nkeys) {
            snprintf(err, errlen, "LOCATE_R.n: %u records for %zu keys", f->n, m->nkeys);
            return -EPROTO;
        }
        for (uint32_t i = 0; m->locs && i < f->n; i++)
            if (proto_get_location(f, i, &m->locs[i], err, errlen) < 0)
                return -EPROTO;
        return 0;
    case PROTO_NODES_R:
        return take_nodes(m->c, f, err, errlen);
    case PROTO_PONG:
        return 0;
    default:
        snprintf(err, errlen, "%s is not a reply of the master", proto_type_name(f->type));
        return -EPROTO;
    }
}

static int on_late_reply(struct net_call *nc, const struct proto_frame *f, char *err,
                         size_t errlen)
{
    struct mcall *m = (struct mcall *)nc;
    if (f->type == PROTO_NODES_R) /* still news */
        return take_nodes(m->c, f, err, errlen);
    return 0; /* the caller has gone: dropped */
}

static void on_done(struct net_call *nc, int status)
{
    struct mcall *m = (struct mcall *)nc;
    m->done = true;
    m->status = status;
    if (m->cb) {
        bool acked = status == 0 && !m->locs && m->nkeys == 0;
        if (status < 0 && m->locs) /* a part answer is no answer */
            memset(m->locs, 0, m->nkeys * sizeof(*m->locs));
        mclient_done_fn cb = m->cb;
        m->cb = NULL;
        m->locs = NULL; /* the caller's arrays are theirs again */
        cb(m->cb_arg, status, acked ? &m->ack : NULL);
    }
}

static void on_free(struct net_call *nc)
{
    struct mcall *m = (struct mcall *)nc;
    if (--m->refs == 0)
        free(m);
}

static const struct net_call_ops call_ops = {
    .on_reply = on_reply, .on_late_reply = on_late_reply, .on_done = on_done,
    .on_free = on_free,
};

/* ---- the session's hooks ----------------------------------------------------------- */

static int hello(struct net_session *s, char *err, size_t errlen)
{
    struct mclient *c = s->owner;
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION, .role = c->cfg.role,
                            .pid = (uint32_t)getpid()};
    snprintf(h.engine_id, sizeof(h.engine_id), "%s", c->engine_id);
    int rc = proto_begin(&s->out, PROTO_HELLO, s->next_seq++, 1, 0);
    if (rc == 0)
        rc = proto_put_hello(&s->out, &h);
    if (rc == 0)
        rc = proto_end(&s->out);
    if (rc < 0)
        snprintf(err, errlen, "cannot build HELLO: %s", strerror(-rc));
    return rc;
}

/* A welcoming master's epoch (HELLO_OK.pool_id: 0 for one without a
 * lease).  Found through the lease store, a master must show exactly the
 * highest epoch the store has shown: below it, it was deposed (it woke up
 * after a takeover) and must not take traffic back; above it, the store
 * has not said so yet (re-read, dial again), and a master's word alone
 * never raises the bar, so one that claims a huge epoch cannot lock the
 * client out of the real leader.  With a fixed address: never below the
 * highest welcomed. */
static int check_epoch(struct mclient *c, uint64_t epoch, char *err, size_t errlen)
{
    const char *at = c->cfg.loop ? c->ev.tcp_address : c->d.tcp_address;
    uint64_t seen = c->watch ? leader_watch_max_epoch(c->watch) : c->highest_epoch;
    if (c->watch && epoch == 0) {
        snprintf(err, errlen, "the master at %s holds no lease (epoch 0) but %s names it: "
                 "give every umbp-master the same lease_url", at, leader_watch_url(c->watch));
    } else if (epoch < seen) {
        snprintf(err, errlen, "the master at %s has epoch %llu, below %llu already seen: "
                 "a deposed leader, refused", at, (unsigned long long)epoch,
                 (unsigned long long)seen);
    } else if (c->watch && epoch > seen) {
        snprintf(err, errlen, "the master at %s claims epoch %llu, above the %llu %s shows: "
                 "reading the store again", at, (unsigned long long)epoch,
                 (unsigned long long)seen, leader_watch_url(c->watch));
    } else {
        c->master_epoch = epoch;
        if (!c->watch && epoch > c->highest_epoch)
            c->highest_epoch = epoch;
        return 0;
    }
    snprintf(c->last_error, sizeof(c->last_error), "%s", err);
    if (c->watch)
        leader_watch_poke(c->watch);
    return -ESTALE;
}

static int welcome(struct net_session *s, const struct proto_frame *f, int fd, char *err,
                   size_t errlen)
{
    struct mclient *c = s->owner;
    if (fd >= 0)
        close(fd);
    if (f->type == PROTO_HELLO_ERR) {
        struct proto_error e;
        if (proto_get_error(f, &e) < 0)
            snprintf(e.message, sizeof(e.message), "(unreadable)");
        snprintf(err, errlen, "the master refused us: %s", e.message);
        snprintf(c->last_error, sizeof(c->last_error), "%s", err);
        if (c->watch) /* a standby, say: who leads now? */
            leader_watch_poke(c->watch);
        return -EACCES;
    }
    struct proto_welcome w;
    char why[PROTO_ERRMSG_MAX] = "";
    if (proto_get_welcome(f, &w, why, sizeof(why)) < 0 || w.version != PROTO_VERSION) {
        snprintf(err, errlen, "HELLO_OK: %s", why[0] ? why : "another protocol version");
        return -EPROTO;
    }
    return check_epoch(c, w.pool_id, err, errlen);
}

static int on_frame(struct net_session *s, const struct proto_frame *f, char *err,
                    size_t errlen)
{
    struct mclient *c = s->owner;
    if (f->type != PROTO_ERROR)
        return 0;
    struct proto_error e;
    if (proto_get_error(f, &e) < 0)
        snprintf(e.message, sizeof(e.message), "(unreadable)");
    snprintf(err, errlen, "the master's ERROR: %s", e.message);
    snprintf(c->last_error, sizeof(c->last_error), "%s", err);
    return -EPROTO;
}

static void on_up(struct net_session *s, uint64_t down_ms, bool by_dir)
{
    struct mclient *c = s->owner;
    (void)down_ms;
    (void)by_dir;
    if (c->cfg.loop && c->cfg.on_up)
        c->cfg.on_up(c->cfg.arg);
}

static void on_down(struct net_session *s, const char *why, bool was_connected, bool news)
{
    struct mclient *c = s->owner;
    (void)was_connected;
    (void)news;
    /* The node list's epoch is the master's counter, which starts again at a
     * restart: a kept epoch can equal the new master's, which then never
     * sends its list, and node refs resolve against the old one.  The next
     * connection starts with none. */
    c->epoch = 0;
    c->master_epoch = 0;
    if (c->watch) /* gone, or a dial refused: who leads now?  (paced by the backoff) */
        leader_watch_poke(c->watch);
    if (strncmp(c->last_error, "the master", 10) != 0 || was_connected)
        snprintf(c->last_error, sizeof(c->last_error), "%s", why);
    if (c->cfg.loop && c->cfg.on_down && (was_connected || news))
        c->cfg.on_down(c->cfg.arg, c->last_error);
}

static const struct net_session_ops session_ops = {
    .hello = hello, .welcome = welcome, .on_frame = on_frame, .on_up = on_up,
    .on_down = on_down,
};

/* ---- the leader, when the address is a lease store ---------------------------------- */

int mclient_check_address(const char *address, bool have_secret, char *err, size_t errlen)
{
    char host[NET_TCP_HOST_MAX];
    uint16_t port;
    int rc;
    if (!address || !address[0]) {
        snprintf(err, errlen, "master_address: distributed mode needs umbp-master's host:port, "
                 "or redis://host:port/<cluster> where the masters elect a leader (see "
                 "docs/distributed.md)");
        return -EINVAL;
    }
    if (lease_is_url(address)) {
        struct lease_url u;
        if ((rc = lease_url_parse(address, "master_address", &u, err, errlen)) < 0)
            return rc;
#ifndef UMBP_HAVE_HIREDIS
        snprintf(err, errlen, "master_address %s: this build has no Redis client: install "
                 "libhiredis-dev (scripts/setup.sh) and rebuild", address);
        return -ENOTSUP;
#endif
#ifndef UMBP_HAVE_OPENSSL
        if (u.tls) {
            snprintf(err, errlen, "master_address %s: this build has no TLS (rediss://): "
                     "install libssl-dev (scripts/setup.sh) and rebuild", address);
            return -ENOTSUP;
        }
#endif
        char hp[NET_TCP_HOST_MAX + 16];
        snprintf(hp, sizeof(hp), strchr(u.host, ':') ? "[%s]:%u" : "%s:%u", u.host, u.port);
        if (!have_secret && !net_tcp_is_loopback(hp)) {
            snprintf(err, errlen, "master_address %s: the masters it names may be on other "
                     "hosts: set secret_file to the cluster's secret", address);
            return -EINVAL;
        }
        return 0;
    }
    if ((rc = net_tcp_split(address, "master_address", host, sizeof(host), &port, err,
                            errlen)) < 0)
        return rc;
    if (port == 0) {
        snprintf(err, errlen, "master_address %s: port 0; give the master's port", address);
        return -EINVAL;
    }
    if (!have_secret && !net_tcp_is_loopback(address)) {
        snprintf(err, errlen, "master_address %s is not on this host: set secret_file to the "
                 "cluster's secret (a master reachable from other hosts requires it)", address);
        return -EINVAL;
    }
    return 0;
}

/* A driver's dial: the leader's address, or why there is none. */
static int resolve(void *ctx, char *addr, size_t addrlen, char *why, size_t whylen)
{
    struct mclient *c = ctx;
    struct lease_holder h;
    if (leader_watch_get(c->watch, &h, why, whylen) != 1) {
        leader_watch_poke(c->watch);
        return -ENOENT;
    }
    if (!c->cfg.auth && !net_tcp_is_loopback(h.address)) {
        snprintf(why, whylen, "the leader %s is not on this host and no secret_file is set",
                 h.address);
        return -EACCES;
    }
    snprintf(addr, addrlen, "%s", h.address);
    c->dialled_epoch = h.epoch;
    return 0;
}

/* Connected to a master below the leader the store names now (or to
 * another address): leave it; disconnected: dial at once. */
static void follow_leader(struct mclient *c)
{
    struct lease_holder h;
    if (leader_watch_get(c->watch, &h, NULL, 0) != 1)
        return;
    uint64_t now = umbp_now_ns();
    const char *dialled = c->cfg.loop ? c->ev.tcp_address : c->d.tcp_address;
    if (c->s.state == NET_CONNECTED || c->s.state == NET_HELLO) {
        if (c->s.state == NET_CONNECTED ? h.epoch <= c->master_epoch
                                        : strcmp(h.address, dialled) == 0)
            return;
        char why[256];
        snprintf(why, sizeof(why), "the lease store names a new leader: %s (epoch %llu)",
                 h.address, (unsigned long long)h.epoch);
        umbp_log(UMBP_LOG_INFO, "master: %s", why);
        net_session_lost(&c->s, now, why);
    }
    /* a new leader is worth a dial now; the same one waits for the backoff */
    if (c->s.state == NET_DISCONNECTED && c->tried && h.epoch != c->dialled_epoch)
        net_session_retry_now(&c->s, now);
}

/* The watch's thread: a doorbell only. */
static void leader_changed(void *arg)
{
    struct mclient *c = arg;
    ev_async_send(c->cfg.loop, &c->change_w);
}

static void on_change_async(struct ev_loop *loop, ev_async *w, int revents)
{
    struct mclient *c = w->data;
    (void)loop;
    (void)revents;
    follow_leader(c);
    net_ev_sync(&c->ev);
}

/* ---- life ----------------------------------------------------------------------------- */

int mclient_create(const struct mclient_config *cfg, struct mclient **out)
{
    struct mclient *c = calloc(1, sizeof(*c));
    if (!c || !(c->nodes = calloc(PROTO_MAX_NODES_FRAME, sizeof(*c->nodes))) ||
        !(c->by_ref = calloc(NODE_SLOTS, sizeof(*c->by_ref)))) {
        if (c)
            free(c->nodes);
        free(c);
        return -ENOMEM;
    }
    c->cfg = *cfg;
    snprintf(c->address, sizeof(c->address), "%s", cfg->address);
    snprintf(c->engine_id, sizeof(c->engine_id), "%s", cfg->engine_id ? cfg->engine_id : "");
    c->cfg.address = c->address;
    struct net_session_config sc = {
        .peer = "the master", .backoff_max_ms = 1000,
        .hello_timeout_ms = cfg->hello_timeout_ms ? cfg->hello_timeout_ms : 5000,
        .hello_timeout_name = "the handshake timeout", .stall_ms = 0, .auth = cfg->auth,
    };
    net_session_init(&c->s, &sc, &session_ops, c);
    bool by_store = lease_is_url(c->address);
    if (by_store) {
        char err[512];
        struct leader_watch_config wc = {.url = c->address, .poll_ms = cfg->discovery_poll_ms,
                                         .timeout_ms = cfg->discovery_timeout_ms,
                                         .on_change = cfg->loop ? leader_changed : NULL,
                                         .arg = c};
        int rc = leader_watch_start(&wc, &c->watch, err, sizeof(err));
        if (rc < 0) {
            umbp_log(UMBP_LOG_ERROR, "master_address: %s", err);
            net_session_destroy(&c->s);
            free(c->by_ref);
            free(c->nodes);
            free(c);
            return rc;
        }
    }
    if (cfg->loop) {
        struct net_ev_config ec = {.tcp_address = by_store ? "" : c->address,
                                   .name = "the master", .resolve = by_store ? resolve : NULL,
                                   .ctx = c};
        net_ev_init(&c->ev, &c->s, cfg->loop, &ec);
        ev_async_init(&c->change_w, on_change_async);
        c->change_w.data = c;
        ev_async_start(cfg->loop, &c->change_w);
    } else {
        struct net_poll_config pc = {.tcp_address = by_store ? "" : c->address,
                                     .resolve = by_store ? resolve : NULL, .ctx = c};
        net_poll_init(&c->d, &c->s, &pc);
    }
    *out = c;
    return 0;
}

void mclient_start(struct mclient *c)
{
    if (!c->cfg.loop || c->tried)
        return;
    c->tried = true;
    net_session_retry_now(&c->s, umbp_now_ns());
    net_ev_sync(&c->ev);
}

bool mclient_connected(const struct mclient *c) { return c->s.state == NET_CONNECTED; }

void mclient_destroy(struct mclient *c)
{
    if (!c)
        return;
    leader_watch_stop(c->watch); /* no doorbell after this */
    net_session_stop(&c->s);
    if (c->cfg.loop) {
        ev_async_stop(c->cfg.loop, &c->change_w);
        net_ev_stop(&c->ev);
    }
    net_session_destroy(&c->s);
    if (!c->cfg.loop)
        net_poll_close(&c->d);
    free(c->by_ref);
    free(c->nodes);
    free(c);
}

const char *mclient_last_error(const struct mclient *c) { return c->last_error; }

uint64_t mclient_master_epoch(const struct mclient *c) { return c->master_epoch; }

int mclient_health(struct mclient *c) { return net_session_health(&c->s, umbp_now_ns()); }

/* ---- driving ----------------------------------------------------------------------------- */

static bool settled(void *arg)
{
    const struct mclient *c = arg;
    return c->s.state == NET_CONNECTED || c->s.state == NET_DISCONNECTED ||
           c->s.state == NET_STOPPED;
}

static bool call_done(void *arg) { return ((const struct mcall *)arg)->done; }

/* Connected, or an attempt begun (when its backoff is over) and run to its
 * end by until_ns. */
static int ensure_up(struct mclient *c, uint64_t until_ns)
{
    struct net_poll *dp = &c->d;
    if (c->watch)
        follow_leader(c);
    uint64_t now = umbp_now_ns();
    if (c->s.state == NET_DISCONNECTED) {
        if (!c->tried)
            net_session_retry_now(&c->s, now);
        c->tried = true;
        net_session_tick(&c->s, now);
    }
    if (!settled(c))
        net_poll_run(&dp, 1, c->pfd, until_ns, settled, c);
    return c->s.state == NET_CONNECTED ? 0 : UMBP_E_NOT_ATTEMPTED;
}

/* Pushes m (frames already in `frames`) and runs until it is done or its
 * deadline passed. */
static int run_call(struct mclient *c, struct mcall *m, struct proto_buf *frames,
                    uint32_t nframes, uint64_t first_seq, uint64_t deadline,
                    struct proto_ack *ack)
{
    struct net_poll *dp = &c->d;
    m->c = c;
    m->refs = 2;
    if (proto_buf_move(&c->s.out, frames) < 0) {
        free(m);
        return -ENOMEM;
    }
    net_session_push(&c->s, &m->nc, &call_ops, nframes, first_seq, umbp_now_ns(), deadline);
    if (!m->done)
        net_poll_run(&dp, 1, c->pfd, deadline + ms_ns(1), call_done, m);
    int rc = m->done ? m->status : UMBP_E_TIMEOUT;
    if (rc == 0 && ack)
        *ack = m->ack;
    m->locs = NULL; /* the caller leaves */
    if (--m->refs == 0)
        free(m);
    return rc;
}

/* With a loop: push the call if connected; done comes from the loop. */
static int call_async(struct mclient *c, struct mcall *m,
                      int (*build)(struct mclient *, void *, struct proto_buf *, uint32_t *),
                      void *arg, uint64_t deadline)
{
    struct proto_buf b = {0};
    uint32_t nframes = 0;
    if (c->s.state != NET_CONNECTED) {
        free(m);
        return UMBP_E_NOT_ATTEMPTED;
    }
    uint64_t first = c->s.next_seq;
    int rc = build(c, arg, &b, &nframes);
    if (rc == 0 && proto_buf_move(&c->s.out, &b) < 0)
        rc = -ENOMEM;
    proto_buf_free(&b);
    if (rc < 0) {
        c->s.next_seq = first;
        free(m);
        return rc;
    }
    m->c = c;
    m->refs = 1; /* the session's alone: the caller is called back */
    net_session_push(&c->s, &m->nc, &call_ops, nframes, first, umbp_now_ns(), deadline);
    return 0;
}

/* One call of the frames built by build(), after ensure_up. */
static int call(struct mclient *c, struct mcall *m, int (*build)(struct mclient *, void *,
                                                                struct proto_buf *, uint32_t *),
                void *arg, uint64_t timeout_ms, struct proto_ack *ack)
{
    uint64_t deadline = umbp_now_ns() + ms_ns(timeout_ms);
    struct proto_buf b = {0};
    uint32_t nframes = 0;
    if (m->cb)
        return call_async(c, m, build, arg, deadline);
    if (c->cfg.loop) { /* a loop's client does not block */
        free(m);
        return -EINVAL;
    }
    int rc = ensure_up(c, deadline);
    if (rc < 0) {
        free(m);
        return rc;
    }
    uint64_t first = c->s.next_seq;
    if ((rc = build(c, arg, &b, &nframes)) < 0) {
        proto_buf_free(&b);
        c->s.next_seq = first;
        free(m);
        return rc;
    }
    rc = run_call(c, m, &b, nframes, first, deadline, ack);
    proto_buf_free(&b);
    return rc;
}

static struct mcall *new_call(void) { return calloc(1, sizeof(struct mcall)); }

/* ---- REGISTER, HEARTBEAT, RESYNC -------------------------------------------------------- */

static int build_register(struct mclient *c, void *arg, struct proto_buf *b, uint32_t *n)
{
    int rc = proto_begin(b, PROTO_REGISTER, c->s.next_seq++, 1, 0);
    if (rc == 0)
        rc = proto_put_register(b, arg);
    if (rc == 0)
        rc = proto_end(b);
    *n = 1;
    return rc;
}

int mclient_register(struct mclient *c, const struct proto_register *r, struct proto_ack *ack)
{
    struct mcall *m = new_call();
    return m ? call(c, m, build_register, (void *)r, c->cfg.timeout_ms, ack) : -ENOMEM;
}

struct events {
    uint64_t seq, used;
    const struct proto_node_event *ev;
    size_t n;
};

static int build_heartbeat(struct mclient *c, void *arg, struct proto_buf *b, uint32_t *n)
{
    const struct events *e = arg;
    struct proto_node_event st = {.seq = e->seq, .kind = PROTO_NODE_STATUS, .size = e->used};
    if (e->n >= PROTO_MAX_RECORDS)
        return -E2BIG;
    int rc = proto_begin(b, PROTO_HEARTBEAT, c->s.next_seq++, (uint32_t)e->n + 1, 0);
    if (rc == 0)
        rc = proto_put_node_event(b, &st);
    for (size_t i = 0; rc == 0 && i < e->n; i++)
        rc = proto_put_node_event(b, &e->ev[i]);
    if (rc == 0)
        rc = proto_end(b);
    *n = 1;
    return rc;
}

int mclient_heartbeat(struct mclient *c, uint64_t seq, uint64_t used,
                      const struct proto_node_event *ev, size_t n, struct proto_ack *ack)
{
    struct events e = {.seq = seq, .used = used, .ev = ev, .n = n};
    struct mcall *m = new_call();
    return m ? call(c, m, build_heartbeat, &e, c->cfg.timeout_ms, ack) : -ENOMEM;
}

struct snapshot {
    uint64_t seq, used;
    const umbp_key_t *keys;
    const uint64_t *sizes;
    size_t n, per;
};

static int build_resync(struct mclient *c, void *arg, struct proto_buf *b, uint32_t *nframes)
{
    const struct snapshot *sn = arg;
    size_t frames = sn->n ? (sn->n + sn->per - 1) / sn->per : 1;
    struct proto_node_event st = {.seq = sn->seq, .kind = PROTO_NODE_STATUS, .size = sn->used};
    int rc = 0;
    for (size_t f = 0; rc == 0 && f < frames; f++) {
        size_t lo = f * sn->per, hi = lo + sn->per < sn->n ? lo + sn->per : sn->n;
        uint32_t arg_ = (f == 0 ? PROTO_RESYNC_FIRST : 0) |
                        (f + 1 == frames ? PROTO_RESYNC_LAST : 0);
        rc = proto_begin(b, PROTO_RESYNC, c->s.next_seq++, (uint32_t)(hi - lo + 1), arg_);
        if (rc == 0)
            rc = proto_put_node_event(b, &st);
        for (size_t i = lo; rc == 0 && i < hi; i++) {
            struct proto_node_event e = {.kind = PROTO_NODE_STORED, .key = sn->keys[i],
                                         .size = sn->sizes[i]};
            rc = proto_put_node_event(b, &e);
        }
        if (rc == 0)
            rc = proto_end(b);
    }
    *nframes = (uint32_t)frames;
    return rc;
}

int mclient_resync(struct mclient *c, uint64_t seq, uint64_t used, const umbp_key_t *keys,
                   const uint64_t *sizes, size_t n, size_t per_frame, struct proto_ack *ack)
{
    struct snapshot sn = {.seq = seq, .used = used, .keys = keys, .sizes = sizes, .n = n,
                          .per = per_frame && per_frame < PROTO_MAX_RECORDS
                                     ? per_frame : PROTO_MAX_RECORDS - 1};
    struct mcall *m = new_call();
    return m ? call(c, m, build_resync, &sn, c->cfg.timeout_ms, ack) : -ENOMEM;
}

/* ---- LOCATE and NODES ----------------------------------------------------------------- */

struct keys {
    const umbp_key_t *k;
    size_t n;
};

static int build_locate(struct mclient *c, void *arg, struct proto_buf *b, uint32_t *n)
{
    const struct keys *k = arg;
    int rc = proto_begin(b, PROTO_LOCATE, c->s.next_seq++, (uint32_t)k->n, 0);
    for (size_t i = 0; rc == 0 && i < k->n; i++)
        rc = proto_put_key(b, &k->k[i]);
    if (rc == 0)
        rc = proto_end(b);
    if (rc == 0) /* the node list rides along: sent only when it changed */
        rc = proto_put_empty(b, PROTO_NODES, c->s.next_seq++, c->epoch);
    *n = 2;
    return rc;
}

int mclient_locate(struct mclient *c, const umbp_key_t *keys, size_t n,
                   struct proto_location *out)
{
    struct net_poll *dp = &c->d;
    if (c->cfg.loop)
        return -EINVAL; /* mclient_locate_async */
    if (n > PROTO_MAX_RECORDS)
        return -E2BIG;
    memset(out, 0, n * sizeof(*out));
    if (c->s.orphans) /* take in a late reply without waiting, then decide */
        net_poll_run(&dp, 1, c->pfd, umbp_now_ns(), NULL, NULL);
    if (c->s.state == NET_CONNECTED && net_session_health(&c->s, umbp_now_ns()) < 0)
        return UMBP_E_NOT_ATTEMPTED; /* single flight: one lookup is overdue */
    struct mcall *m = new_call();
    if (!m)
        return -ENOMEM;
    m->locs = out;
    m->nkeys = n;
    struct keys k = {keys, n};
    int rc = call(c, m, build_locate, &k, c->cfg.timeout_ms, NULL);
    if (rc < 0)
        memset(out, 0, n * sizeof(*out)); /* a part answer is no answer */
    return rc;
}

static int build_nodes(struct mclient *c, void *arg, struct proto_buf *b, uint32_t *n)
{
    (void)arg;
    *n = 1;
    return proto_put_empty(b, PROTO_NODES, c->s.next_seq++, c->epoch);
}

int mclient_nodes(struct mclient *c)
{
    struct mcall *m = new_call();
    return m ? call(c, m, build_nodes, NULL, c->cfg.timeout_ms, NULL) : -ENOMEM;
}

const struct proto_node_info *mclient_node(const struct mclient *c, uint32_t ref)
{
    for (size_t h = ref_slot(ref); c->by_ref[h]; h = (h + 1) % NODE_SLOTS)
        if (c->nodes[c->by_ref[h] - 1].ref == ref)
            return &c->nodes[c->by_ref[h] - 1];
    return NULL;
}

size_t mclient_node_list(const struct mclient *c, const struct proto_node_info **out)
{
    *out = c->nodes;
    return c->nnodes;
}

/* ---- with a loop: the async calls ------------------------------------------------------- */

static struct mcall *new_async(struct mclient *c, mclient_done_fn done, void *arg)
{
    if (!c->cfg.loop || !done)
        return NULL;
    struct mcall *m = new_call();
    if (m) {
        m->cb = done;
        m->cb_arg = arg;
    }
    return m;
}

#define ASYNC_CALL(c, done, arg, build, barg, timeout)                                  \
    do {                                                                               \
        if (!(c)->cfg.loop || !(done))                                                 \
            return -EINVAL;                                                            \
        struct mcall *m_ = new_async((c), (done), (arg));                              \
        return m_ ? call((c), m_, (build), (barg), (timeout), NULL) : -ENOMEM;         \
    } while (0)

int mclient_register_async(struct mclient *c, const struct proto_register *r,
                           mclient_done_fn done, void *arg)
{
    ASYNC_CALL(c, done, arg, build_register, (void *)r, c->cfg.timeout_ms);
}

int mclient_heartbeat_async(struct mclient *c, uint64_t seq, uint64_t used,
                            const struct proto_node_event *ev, size_t n, mclient_done_fn done,
                            void *arg)
{
    struct events e = {.seq = seq, .used = used, .ev = ev, .n = n};
    ASYNC_CALL(c, done, arg, build_heartbeat, &e, c->cfg.timeout_ms);
}

int mclient_resync_async(struct mclient *c, uint64_t seq, uint64_t used, const umbp_key_t *keys,
                         const uint64_t *sizes, size_t n, size_t per_frame, mclient_done_fn done,
                         void *arg)
{
    struct snapshot sn = {.seq = seq, .used = used, .keys = keys, .sizes = sizes, .n = n,
                          .per = per_frame && per_frame < PROTO_MAX_RECORDS
                                     ? per_frame : PROTO_MAX_RECORDS - 1};
    ASYNC_CALL(c, done, arg, build_resync, &sn, c->cfg.timeout_ms);
}

int mclient_locate_async(struct mclient *c, const umbp_key_t *keys, size_t n,
                         struct proto_location *out, mclient_done_fn done, void *arg)
{
    if (!c->cfg.loop || !done)
        return -EINVAL;
    if (n == 0 || n > PROTO_MAX_RECORDS)
        return -E2BIG;
    if (c->s.state != NET_CONNECTED || net_session_health(&c->s, umbp_now_ns()) < 0)
        return UMBP_E_NOT_ATTEMPTED; /* single flight: one lookup is overdue */
    memset(out, 0, n * sizeof(*out));
    struct mcall *m = new_async(c, done, arg);
    if (!m)
        return -ENOMEM;
    m->locs = out;
    m->nkeys = n;
    struct keys k = {keys, n};
    return call(c, m, build_locate, &k,
                c->cfg.locate_timeout_ms ? c->cfg.locate_timeout_ms : c->cfg.timeout_ms, NULL);
}

int mclient_suspect(struct mclient *c, const uint32_t *refs, size_t n)
{
    if (n == 0 || n > PROTO_MAX_NODES_FRAME)
        return -EINVAL;
    if (c->s.state != NET_CONNECTED)
        return UMBP_E_NOT_ATTEMPTED;
    int rc = proto_begin(&c->s.out, PROTO_SUSPECT, c->s.next_seq++, (uint32_t)n, 0);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = proto_put_status(&c->s.out, (int32_t)refs[i]);
    if (rc == 0)
        rc = proto_end(&c->s.out);
    if (rc < 0)
        return rc;
    net_session_flush(&c->s);
    return 0;
}
