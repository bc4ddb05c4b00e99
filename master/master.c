/*
 * master.c - umbp-master (master.h): the directory (directory.h) behind a
 * TCP service (net/service.h) with the shared-secret handshake, a sweep
 * timer that moves silent nodes to suspect and dead, and /metrics.
 *
 * A connection is a node's once it REGISTERs (mconn.node); the node
 * outlives its connection (a node that reconnects with the same id and seq
 * keeps its keys) until the sweep forgets it, which unbinds the connection
 * (dir on_gone).  A connection that ends leaves its node to the sweep.
 *
 * Malformed input: an ERROR frame naming the field, a log line, the
 * connection closed (net/service.c for what the codec refuses, bad_frame
 * here for what the directory refuses); nobody else notices.
 *
 * Threads: the loop thread owns everything but the metrics snapshot
 * (master_metrics.c) and stop_w.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ev.h>

#include "directory.h"
#include "ha.h"
#include "master.h"
#include "master_int.h"
#include "util.h"

struct mconn {
    struct net_conn conn;      /* first: container_of */
    struct dir_node *node;     /* bound by REGISTER; NULL when forgotten */
    struct proto_hello hello;
};

static struct mconn *to_mconn(struct net_conn *c) { return (struct mconn *)c; }
static struct umbp_master *master_of(struct net_conn *c) { return c->svc->p.owner; }

static uint64_t ms_ns(int64_t ms) { return (uint64_t)ms * 1000000ull; }

/* ---- replies ----------------------------------------------------------------------- */

static int reply_end(struct net_conn *c, int rc)
{
    if (rc == 0)
        rc = proto_end(&c->out);
    else if (c->out.open)
        proto_end(&c->out);
    if (rc < 0) {
        snprintf(c->why, sizeof(c->why), "cannot build a reply: %s", strerror(-rc));
        return rc;
    }
    return 0;
}

/* What the directory refuses: the same as net/service.c does for what the
 * codec refuses. */
static int bad_frame(struct net_conn *c, const char *what)
{
    char name[96];
    master_conn_name(c, name, sizeof(name));
    umbp_log(UMBP_LOG_WARN, "%s: malformed frame: %s; disconnected", name, what);
    master_of(c)->cnt.malformed++;
    proto_put_error_frame(&c->out, PROTO_ERROR, 0, -EPROTO, what);
    snprintf(c->why, sizeof(c->why), "malformed frame");
    return NET_CLOSE;
}

static int send_ack(struct net_conn *c, uint16_t type, uint64_t seq, const struct proto_ack *a)
{
    int rc = proto_begin(&c->out, type, seq, 1, 0);
    if (rc == 0)
        rc = proto_put_ack(&c->out, a);
    return reply_end(c, rc);
}

/* ---- handlers ---------------------------------------------------------------------- */

static void log_node(const struct dir_node *n, char *buf, size_t len)
{
    snprintf(buf, len, "node %u (%s pid %u)", n->ref, n->reg.host, n->reg.pid);
}

static int handle_register(struct net_conn *c, const struct proto_frame *f)
{
    struct umbp_master *m = master_of(c);
    struct mconn *mc = to_mconn(c);
    struct proto_register r;
    char what[PROTO_ERRMSG_MAX] = "", name[96], nn[128];
    if (proto_get_register(f, &r, what, sizeof(what)) < 0)
        return bad_frame(c, what);
    struct dir_node *n;
    struct proto_ack a;
    int rc = dir_register(m->dir, &r, umbp_now_ns(), &n, &a);
    if (rc == -ENOSPC) {
        snprintf(what, sizeof(what), "REGISTER: max_nodes (%lld) nodes are registered; "
                 "raise max_nodes", (long long)m->o.max_nodes);
        master_conn_name(c, name, sizeof(name));
        umbp_log(UMBP_LOG_WARN, "%s: refused: %s", name, what);
        proto_put_error_frame(&c->out, PROTO_ERROR, 0, -ENOSPC, what);
        snprintf(c->why, sizeof(c->why), "max_nodes reached");
        return NET_CLOSE;
    }
    if (rc < 0) {
        snprintf(c->why, sizeof(c->why), "no memory for a node");
        return rc;
    }
    if (mc->node && mc->node != n)
        mc->node->owner = NULL; /* this connection now speaks for another node */
    if (n->owner && n->owner != mc)
        ((struct mconn *)n->owner)->node = NULL; /* the node reconnected */
    n->owner = mc;
    mc->node = n;
    master_conn_name(c, name, sizeof(name));
    log_node(n, nn, sizeof(nn));
    umbp_log(UMBP_LOG_INFO, "%s: %s registered (capacity %llu, seq %llu)%s", name, nn,
             (unsigned long long)r.capacity_bytes, (unsigned long long)r.seq,
             a.action == PROTO_ACK_RESYNC ? "; resync asked" : "");
    return send_ack(c, PROTO_REGISTER_R, f->seq, &a);
}

static int handle_heartbeat(struct net_conn *c, const struct proto_frame *f)
{
    struct umbp_master *m = master_of(c);
    struct proto_ack a;
    char what[PROTO_ERRMSG_MAX] = "";
    bool had = to_mconn(c)->node && to_mconn(c)->node->need_resync;
    if (dir_heartbeat(m->dir, to_mconn(c)->node, f, umbp_now_ns(), &a, what, sizeof(what)) < 0)
        return bad_frame(c, what);
    if (a.action == PROTO_ACK_RESYNC && !had) {
        char nn[128];
        log_node(to_mconn(c)->node, nn, sizeof(nn));
        umbp_log(UMBP_LOG_INFO, "%s: a gap in its events after seq %llu; resync asked", nn,
                 (unsigned long long)a.seq);
    }
    return send_ack(c, PROTO_HEARTBEAT_R, f->seq, &a);
}

static int handle_resync(struct net_conn *c, const struct proto_frame *f)
{
    struct umbp_master *m = master_of(c);
    struct proto_ack a;
    char what[PROTO_ERRMSG_MAX] = "";
    if (dir_resync(m->dir, to_mconn(c)->node, f, umbp_now_ns(), &a, what, sizeof(what)) < 0)
        return bad_frame(c, what);
    struct dir_node *n = to_mconn(c)->node;
    if (n && (f->arg & PROTO_RESYNC_LAST)) {
        char nn[128];
        log_node(n, nn, sizeof(nn));
        umbp_log(UMBP_LOG_INFO, "%s: resynced: %llu keys as of seq %llu", nn,
                 (unsigned long long)n->keys, (unsigned long long)n->seq);
    }
    return send_ack(c, PROTO_RESYNC_R, f->seq, &a);
}

static int handle_locate(struct net_conn *c, const struct proto_frame *f)
{
    struct umbp_master *m = master_of(c);
    uint64_t t0 = umbp_now_ns();
    int rc = proto_begin(&c->out, PROTO_LOCATE_R, f->seq, f->n, dir_epoch(m->dir));
    for (uint32_t i = 0; rc == 0 && i < f->n; i++) {
        umbp_key_t k;
        struct proto_location l;
        proto_get_key(f, i, &k);
        dir_locate(m->dir, &k, &l);
        rc = proto_put_location(&c->out, &l);
    }
    m->cnt.locates++;
    master_metrics_observe(m, umbp_now_ns() - t0);
    return reply_end(c, rc);
}

static int handle_nodes(struct net_conn *c, const struct proto_frame *f)
{
    struct umbp_master *m = master_of(c);
    uint32_t epoch = dir_epoch(m->dir);
    size_t n = 0;
    if (f->arg != epoch) /* the client's list is stale (or it has none) */
        n = dir_nodes(m->dir, umbp_now_ns(), m->nodes_buf, (size_t)m->o.max_nodes);
    int rc = proto_begin(&c->out, PROTO_NODES_R, f->seq, (uint32_t)n, epoch);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = proto_put_node_info(&c->out, &m->nodes_buf[i]);
    return reply_end(c, rc);
}

/* SUSPECT: refs of nodes the sender failed to fetch from.  Each alive one
 * becomes suspect now (lookups skip it) until its next heartbeat; no
 * reply.  Only a registered node reports, and never about itself. */
static int handle_suspect(struct net_conn *c, const struct proto_frame *f)
{
    struct umbp_master *m = master_of(c);
    struct dir_node *me = to_mconn(c)->node;
    if (!me)
        return 0;
    for (uint32_t i = 0; i < f->n; i++) {
        int32_t v;
        proto_get_status(f, i, &v);
        if ((uint32_t)v == me->ref)
            continue;
        m->reporter = me;
        dir_report(m->dir, (uint32_t)v);
        m->reporter = NULL;
    }
    return 0;
}

static int handle_ping(struct net_conn *c, const struct proto_frame *f)
{
    return reply_end(c, proto_begin(&c->out, PROTO_PONG, f->seq, 0, 0));
}

static const struct net_role role_node = {
    .name = "node",
    .handlers = {[PROTO_REGISTER] = handle_register, [PROTO_HEARTBEAT] = handle_heartbeat,
                 [PROTO_RESYNC] = handle_resync, [PROTO_LOCATE] = handle_locate,
                 [PROTO_NODES] = handle_nodes, [PROTO_SUSPECT] = handle_suspect,
                 [PROTO_PING] = handle_ping},
};
static const struct net_role role_lookup = {
    .name = "lookup",
    .handlers = {[PROTO_LOCATE] = handle_locate, [PROTO_NODES] = handle_nodes,
                 [PROTO_PING] = handle_ping},
};
static const struct net_role role_admin = {
    .name = "admin",
    .handlers = {[PROTO_NODES] = handle_nodes, [PROTO_PING] = handle_ping},
};

/* ---- the handshake ----------------------------------------------------------------- */

static int refuse_hello(struct net_conn *c, const struct proto_frame *f, const char *msg)
{
    char name[96];
    master_conn_name(c, name, sizeof(name));
    umbp_log(UMBP_LOG_WARN, "%s: refused: %s", name, msg);
    proto_put_error_frame(&c->out, PROTO_HELLO_ERR, f->seq, -EPROTO, msg);
    snprintf(c->why, sizeof(c->why), "refused at HELLO");
    return NET_CLOSE;
}

static int on_hello(struct net_conn *c, const struct proto_frame *f, char *what, size_t whatlen)
{
    struct mconn *mc = to_mconn(c);
    char msg[PROTO_ERRMSG_MAX], name[96];
    if (f->type != PROTO_HELLO) {
        snprintf(what, whatlen, "frame.type: %s before HELLO; a connection's first frame "
                 "must be HELLO", proto_type_name(f->type));
        return -EPROTO;
    }
    /* the version first: a peer of another release deserves HELLO_ERR */
    if (f->records[4] != (PROTO_VERSION & 0xff) || f->records[5] != (PROTO_VERSION >> 8)) {
        snprintf(msg, sizeof(msg), "HELLO.version: this umbp-master speaks protocol version "
                 "%d, not %u; use nodes and a master of the same release", PROTO_VERSION,
                 (unsigned)(f->records[4] | f->records[5] << 8));
        return refuse_hello(c, f, msg);
    }
    if (proto_get_hello(f, &mc->hello, what, whatlen) < 0)
        return -EPROTO;
    struct umbp_master *m = master_of(c);
    if (!m->leading) {
        struct ha_view v;
        ha_view(m->ha, &v);
        if (v.holder.epoch)
            snprintf(msg, sizeof(msg), "this umbp-master is a standby: the leader is %s "
                     "(epoch %llu)", v.holder.address, (unsigned long long)v.holder.epoch);
        else
            snprintf(msg, sizeof(msg), "this umbp-master is a standby; no master leads yet%s%.100s",
                     v.why[0] ? ": " : "", v.why);
        m->standby_refused++;
        master_conn_name(c, name, sizeof(name));
        umbp_log(UMBP_LOG_INFO, "%s: refused: %s", name, msg);
        proto_put_error_frame(&c->out, PROTO_HELLO_ERR, f->seq, -EAGAIN, msg);
        snprintf(c->why, sizeof(c->why), "refused at HELLO (standby)");
        return NET_CLOSE;
    }
    switch (mc->hello.role) {
    case PROTO_ROLE_NODE: c->role = &role_node; break;
    case PROTO_ROLE_LOOKUP: c->role = &role_lookup; break;
    case PROTO_ROLE_ADMIN: c->role = &role_admin; break;
    default:
        return refuse_hello(c, f, "HELLO.role: worker (0) is umbp-server's role; umbp-master "
                            "takes node (3), lookup (1) and admin (2)");
    }
    /* pool_id: a master has no pool; it carries the leader's epoch (0:
     * no lease), which clients check against the highest they have seen */
    struct proto_welcome w = {.version = PROTO_VERSION, .session_id = c->id,
                              .pool_id = m->epoch};
    int rc = proto_begin(&c->out, PROTO_HELLO_OK, f->seq, 1, 0);
    if (rc == 0)
        rc = proto_put_welcome(&c->out, &w);
    master_conn_name(c, name, sizeof(name));
    umbp_log(UMBP_LOG_INFO, "%s: %s, engine '%s', pid %u", name, c->role->name,
             mc->hello.engine_id, mc->hello.pid);
    return reply_end(c, rc);
}

/* ---- the service's hooks ------------------------------------------------------------- */

void master_conn_name(const struct net_conn *c, char *buf, size_t len)
{
    snprintf(buf, len, "connection %llu (%s)", (unsigned long long)c->id, c->peer);
}

static void on_refuse(struct net_service *s, int fd, const struct ucred *cr,
                      enum net_refusal why, int err)
{
    struct umbp_master *m = s->p.owner;
    char peer[NET_TCP_NAME_MAX];
    (void)cr;
    m->cnt.refused++;
    net_tcp_peer_name(fd, peer, sizeof(peer));
    umbp_log(UMBP_LOG_WARN, "umbp-master: refused %s: %s", peer,
             why == NET_REFUSE_FULL ? "max_connections are connected (raise max_connections)"
                                    : strerror(err));
}

static void on_malformed(struct net_conn *c) { master_of(c)->cnt.malformed++; }
static void on_auth_failed(struct net_conn *c) { master_of(c)->cnt.auth_failed++; }

static void on_timeout(struct net_conn *c, bool handshake)
{
    char name[96];
    struct umbp_master *m = master_of(c);
    master_conn_name(c, name, sizeof(name));
    umbp_log(UMBP_LOG_WARN, "%s: %s; disconnected", name,
             handshake ? "did not finish AUTH and HELLO within handshake_timeout_ms"
                       : "a frame did not arrive whole within frame_timeout_ms");
    snprintf(c->why, sizeof(c->why), "%s timeout", handshake ? "handshake" : "frame");
    m->cnt.timeouts++;
}

static void on_accept_error(struct net_service *s, int err, double retry_s)
{
    (void)s;
    umbp_log(UMBP_LOG_ERROR, "umbp-master: accept: %s; retrying in %.1f s", strerror(err),
             retry_s);
}

static void on_close(struct net_conn *c)
{
    struct mconn *mc = to_mconn(c);
    char name[96];
    if (mc->node)
        mc->node->owner = NULL; /* the node lives on until the sweep says otherwise */
    master_conn_name(c, name, sizeof(name));
    umbp_log(c->role ? UMBP_LOG_INFO : UMBP_LOG_DEBUG, "%s: closed (%s)", name,
             c->why[0] ? c->why : "disconnected");
}

static const struct net_service_ops service_ops = {
    .name = master_conn_name,
    .on_refuse = on_refuse,
    .on_hello = on_hello,
    .on_malformed = on_malformed,
    .on_auth_failed = on_auth_failed,
    .on_timeout = on_timeout,
    .on_accept_error = on_accept_error,
    .on_close = on_close,
};

/* ---- the directory's hooks and the sweep ------------------------------------------------ */

static void on_gone(void *ctx, struct dir_node *n)
{
    struct umbp_master *m = ctx;
    char nn[128];
    log_node(n, nn, sizeof(nn));
    umbp_log(UMBP_LOG_WARN, "%s: dead (no heartbeat for heartbeat_dead_ms = %lld ms); its %llu "
             "keys leave the index", nn, (long long)m->o.heartbeat_dead_ms,
             (unsigned long long)n->keys);
    if (n->owner)
        ((struct mconn *)n->owner)->node = NULL;
}

static void on_suspect(void *ctx, struct dir_node *n)
{
    struct umbp_master *m = ctx;
    char nn[128], rn[128];
    log_node(n, nn, sizeof(nn));
    if (m->reporter) {
        log_node(m->reporter, rn, sizeof(rn));
        umbp_log(UMBP_LOG_WARN, "%s: suspect (%s failed to fetch from it); lookups skip it "
                 "until its next heartbeat", nn, rn);
        return;
    }
    umbp_log(UMBP_LOG_WARN, "%s: suspect (no heartbeat for heartbeat_suspect_ms = %lld ms); "
             "lookups skip it", nn, (long long)m->o.heartbeat_suspect_ms);
}

static void sweep_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct umbp_master *m = umbp_container_of(w, struct umbp_master, sweep_w);
    (void)loop;
    (void)revents;
    dir_sweep(m->dir, umbp_now_ns(), ms_ns(m->o.heartbeat_suspect_ms),
              ms_ns(m->o.heartbeat_dead_ms));
    master_metrics_render(m);
}

/* The lease thread rang: lead, or step down.  A step-down closes every
 * connection and empties the directory (soft state: if this master leads
 * again, nodes re-register and resync). */
void master_role_changed(struct umbp_master *m)
{
    struct ha_view v;
    ha_view(m->ha, &v);
    if (m->leading && (!v.leader || v.epoch != m->epoch)) {
        m->leading = false;
        m->epoch = 0;
        net_service_close_all(&m->svc, "this master lost the lease");
        dir_destroy(m->dir);
        m->dir = NULL;
        if (dir_create(&m->dc, &m->dir) < 0) {
            umbp_log(UMBP_LOG_ERROR, "umbp-master: no memory for an empty directory; stopping");
            ev_break(m->loop, EVBREAK_ALL);
            return;
        }
    }
    if (!m->leading && v.leader) {
        m->leading = true;
        m->epoch = v.epoch;
    }
    master_metrics_render(m);
}

static void role_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)loop;
    (void)revents;
    master_role_changed(umbp_container_of(w, struct umbp_master, role_w));
}

static void stop_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

/* ---- life ------------------------------------------------------------------------------- */

static int setup(struct umbp_master *m, const char *json, char *err, size_t errlen)
{
    int rc = master_options_parse(json, &m->o, err, errlen);
    if (rc < 0)
        return rc;
    enum umbp_log_level lvl;
    if (umbp_log_level_parse(m->o.log_level, &lvl) == 0)
        umbp_log_set_level(lvl);
    if (m->o.secret_file[0]) {
        if ((rc = net_auth_key_load(m->o.secret_file, "secret_file", &m->key, err, errlen)) < 0)
            return rc;
        m->have_key = true;
    }
    m->dc = (struct dir_config){.max_nodes = (uint32_t)m->o.max_nodes,
                                .max_replicas = (uint32_t)m->o.max_replicas,
                                .max_keys = (uint64_t)m->o.max_keys,
                                .on_gone = on_gone, .on_suspect = on_suspect, .ctx = m};
    m->nodes_buf = calloc((size_t)m->o.max_nodes, sizeof(*m->nodes_buf));
    if (!m->nodes_buf || (rc = dir_create(&m->dc, &m->dir)) < 0) {
        snprintf(err, errlen, "no memory for the directory");
        return -ENOMEM;
    }
    uint16_t port;
    rc = net_tcp_listen(m->o.listen, "listen", 1024, &m->listen_fd, &port, err, errlen);
    if (rc < 0)
        return rc;
    char host[NET_TCP_HOST_MAX];
    uint16_t asked;
    net_tcp_split(m->o.listen, "listen", host, sizeof(host), &asked, NULL, 0);
    snprintf(m->address, sizeof(m->address), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
             port);
    m->leading = !m->o.lease_url[0];
    if ((rc = master_metrics_start(m, err, errlen)) < 0)
        return rc;
    if (m->o.lease_url[0])
        rc = ha_start(m, m->o.advertise[0] ? m->o.advertise : m->address, &m->ha, err, errlen);
    return rc;
}

int umbp_master_create(const char *json, struct umbp_master **out, char *err, size_t errlen)
{
    struct umbp_master *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "no memory");
        return -ENOMEM;
    }
    m->listen_fd = -1;
    m->loop = ev_loop_new(EVFLAG_AUTO);
    if (m->loop) { /* before setup: the lease thread may ring it at once */
        ev_async_init(&m->role_w, role_cb);
        ev_async_start(m->loop, &m->role_w);
    }
    int rc = m->loop ? setup(m, json, err, errlen) : -ENOMEM;
    if (rc < 0) {
        umbp_master_destroy(m);
        return rc;
    }
    struct net_service_params p = {
        .loop = m->loop, .ops = &service_ops, .owner = m, .conn_size = sizeof(struct mconn),
        .tcp = true, .auth = m->have_key ? &m->key : NULL,
        .max_conns = (unsigned)m->o.max_connections, .accept_batch = 64,
        .accept_retry_s = 0.1, .in_initial = 64 << 10, .out_pause = 8 << 20,
        .out_resume = 4 << 20, .out_keep = 1 << 20, .out_max = 64 << 20,
        .handshake_timeout_ms = m->o.handshake_timeout_ms,
        .frame_timeout_ms = m->o.frame_timeout_ms,
    };
    net_service_init(&m->svc, &p);
    net_service_start(&m->svc, m->listen_fd);
    m->serving = true;
    double period = (double)m->o.heartbeat_suspect_ms / 4000.0;
    period = period < 0.025 ? 0.025 : period > 1.0 ? 1.0 : period;
    ev_timer_init(&m->sweep_w, sweep_cb, period, period);
    ev_timer_start(m->loop, &m->sweep_w);
    ev_async_init(&m->stop_w, stop_cb);
    ev_async_start(m->loop, &m->stop_w);
    *out = m;
    return 0;
}

void umbp_master_run(struct umbp_master *m) { ev_run(m->loop, 0); }

void umbp_master_stop(struct umbp_master *m)
{
    if (m)
        ev_async_send(m->loop, &m->stop_w);
}

void umbp_master_destroy(struct umbp_master *m)
{
    if (!m)
        return;
    ha_stop(m->ha); /* the lease released first: a standby takes over at once */
    master_metrics_stop(m);
    if (m->serving) {
        net_service_stop_accepting(&m->svc);
        net_service_close_all(&m->svc, "the master is stopping");
        ev_timer_stop(m->loop, &m->sweep_w);
        ev_async_stop(m->loop, &m->stop_w);
    }
    if (m->loop)
        ev_async_stop(m->loop, &m->role_w);
    if (m->listen_fd >= 0)
        close(m->listen_fd);
    dir_destroy(m->dir);
    free(m->nodes_buf);
    if (m->loop)
        ev_loop_destroy(m->loop);
    free(m);
}

const char *umbp_master_address(const struct umbp_master *m) { return m->address; }

const char *umbp_master_lease_url(const struct umbp_master *m)
{
    return m->o.lease_url[0] ? m->o.lease_url : NULL;
}
