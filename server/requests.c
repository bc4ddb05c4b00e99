/*
 * requests.c - what the server does with each request frame: the tier
 * contract (include/umbp/tier.h) over the store the server was handed
 * (store_ops.h: s->st), one reply frame per request frame (ABORT has
 * none), records in request order.
 *
 * A session may publish, abort and release only the tokens the server gave
 * it (track.c): a token of another session, or one already used, is
 * -ENOENT for publish, UMBP_E_STALE for release and nothing for abort, so
 * one client can never end another's reservation or lease.  Everything it
 * still holds is ended when it disconnects (session.c).
 *
 * The first frame must be HELLO; after it, each role may send only its own
 * types (the role tables at the end, which net/service.c dispatches through);
 * anything else is malformed.
 *
 * The batch types (LOOKUP .. RELEASE) do records [batch.from, batch.to)
 * per call and write into batch.out (see Fairness in srv.h):
 * batch_begin opens the reply on the first slice, batch_end closes it
 * after the last, or says SRV_MORE.  Loop thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdpass.h"
#include "metrics.h"
#include "srv.h"
#include "util.h"

static const char *const role_names[] = {"worker", "lookup", "admin"};

/* What each role may send: the tables at the end, after the handlers. */
static const struct net_role roles[PROTO_ROLE_ADMIN + 1];

/* A reply appended whole (proto_put_empty), or rc of its failure: out of
 * memory ends the session. */
static int reply_done(struct srv_session *ss, int rc)
{
    if (rc == 0)
        return 0;
    umbp_log(UMBP_LOG_WARN, SESSION_FMT ": cannot build a reply (%s); disconnected",
             SESSION_ARGS(ss), strerror(-rc));
    snprintf(ss->conn.why, sizeof(ss->conn.why), "no memory for a reply");
    return SRV_CLOSE;
}

/* Ends a reply frame; rc is the first failure of its proto_begin or puts.
 * proto_end completes the frame, or drops a partial one (and says -EINVAL
 * when proto_begin failed, so nothing is open). */
static int reply_end(struct srv_session *ss, int rc)
{
    int erc = proto_end(&ss->conn.out);
    return reply_done(ss, rc ? rc : erc);
}

/* ---- slices ---------------------------------------------------------------------- */

/* The reply frame, opened by the first slice. */
static int batch_begin(struct srv_session *ss, const struct proto_frame *f, uint16_t type)
{
    struct srv_batch *b = &ss->batch;
    return b->from ? 0 : proto_begin(b->out, type, f->seq, f->n, 0);
}

/* After a slice: SRV_MORE while records are left; else the reply ends
 * (reply_end) and, when it was built in `reply`, goes out. */
static int batch_end(struct srv_session *ss, const struct proto_frame *f, int rc)
{
    struct srv_batch *b = &ss->batch;
    if (rc == 0 && b->to < f->n)
        return SRV_MORE;
    int erc = proto_end(b->out);
    if (!rc && !erc && b->out == &ss->reply)
        erc = session_reply_done(ss);
    return reply_done(ss, rc ? rc : erc);
}

/* ---- a node's server: keys the store lacks ------------------------------------- */

static void node_answered(void *arg)
{
    struct srv_session *ss = arg;
    if (net_conn_resume(&ss->conn) < 0)
        net_conn_close(&ss->conn);
}

/* The end of a slice that asked the cluster (or did not). */
void srv_node_slice_done(struct srv_session *ss)
{
    srv_node_call_free(ss->node_call);
    free(ss->node_idx);
    ss->node_call = NULL;
    ss->node_idx = NULL;
    ss->node_asked = false;
}

/* WAITING ahead of the reply: the client's session counts this request as
 * answered in time until the cluster's bound for it (a LOCATE, maybe a
 * node-list refresh; a fetch adds an endpoint's warm-up and the batch), not
 * as a stalled server (net/session.h).  Without room for it the client may
 * call the server stalled meanwhile: nothing worse. */
static void tell_waiting(struct srv_session *ss, const struct proto_frame *f, bool fetch)
{
    const struct umbp_core_config *core = &ss->srv->cfg->core;
    uint64_t ms = 2 * (uint64_t)core->lookup_timeout_ms;
    if (fetch)
        ms += 2 * (uint64_t)core->timeout_ms;
    if (ms > PROTO_WAIT_MAX_MS)
        ms = PROTO_WAIT_MAX_MS;
    if (proto_begin(&ss->conn.out, PROTO_WAITING, f->seq, 0, (uint32_t)ms) == 0)
        proto_end(&ss->conn.out);
}

/* Where the server is a node (node.h), a LOOKUP's or ACQUIRE's keys of
 * this slice that the store lacks go to the cluster first (fetch: into the
 * pool as replicas); the slice waits (SRV_WAIT) and runs again once the
 * cluster answered, or at once when it answered inline.  0: go on (the
 * answer, if any, is in ss->node_call; no memory: those keys miss). */
static int node_first(struct srv_session *ss, const struct proto_frame *f, bool fetch,
                      uint64_t ttl_ms)
{
    struct umbp_server *s = ss->srv;
    struct srv_batch *b = &ss->batch;
    if (!s->node || ss->node_asked || b->to == b->from)
        return 0;
    ss->node_asked = true;
    uint32_t n = b->to - b->from, m = 0;
    umbp_key_t *keys = malloc(n * sizeof(*keys));
    if (!keys || !(ss->node_idx = malloc(n * sizeof(*ss->node_idx)))) {
        free(keys);
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        proto_get_key(f, b->from + i, &keys[m]);
        bool miss = !srv_store_lookup(&s->st, &keys[m], false);
        ss->node_idx[i] = miss ? m : UINT32_MAX;
        m += miss;
    }
    int rc = m ? srv_node_call(s->node, fetch, keys, m, ttl_ms, node_answered, ss,
                               &ss->node_call) : 1;
    free(keys);
    if (rc != 0)
        return 0; /* nothing to ask, answered inline, or no memory */
    b->rewind = true;
    tell_waiting(ss, f, fetch);
    return SRV_WAIT;
}

/* ---- lookup, reserve, publish, abort ------------------------------------------- */

static int handle_lookup(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    const struct srv_batch *b = &ss->batch;
    bool touch = f->arg & PROTO_LOOKUP_TOUCH;
    if (node_first(ss, f, false, 0) == SRV_WAIT)
        return SRV_WAIT;
    int rc = batch_begin(ss, f, PROTO_LOOKUP_R);

    for (uint32_t i = b->from; rc == 0 && i < b->to; i++) {
        umbp_key_t key;
        proto_get_key(f, i, &key);
        bool hit = srv_store_lookup(&s->st, &key, touch);
        if (!hit && ss->node_call && ss->node_idx[i - b->from] != UINT32_MAX)
            hit = srv_node_call_present(ss->node_call, ss->node_idx[i - b->from]);
        s->c.lookup_hits += hit;
        rc = proto_put_u8(b->out, hit);
    }
    s->c.lookups += b->to == f->n;
    s->c.lookup_keys += b->to - b->from;
    srv_node_slice_done(ss);
    return batch_end(ss, f, rc);
}

/* The store's reserve, evicting for this key once when the pool is full.
 * An eviction that freed nothing (everything leased or pending) clears
 * *may_evict, so the rest of the batch does not scan the LRU list again. */
int srv_reserve_evicting(struct umbp_server *s, unsigned ns, const umbp_key_t *key,
                         uint64_t size, uint64_t until, bool ahead, struct srv_region *r,
                         bool *may_evict)
{
    /* a namespace over its quota evicts its own objects inside the store
     * (-EDQUOT when they are held); -ENOSPC is the whole pool's */
    int rc = srv_store_reserve(&s->st, key, size, ns, until, ahead, r);
    if (rc != -ENOSPC || !*may_evict)
        return rc;
    struct umbp_tier_usage u;
    srv_store_usage(&s->st, &u);
    uint64_t target = u.capacity_bytes > size ? u.capacity_bytes - size : 0;
    if (srv_store_evict(&s->st, target, size, SRV_EVICT_INLINE_MAX) == 0)
        *may_evict = false;
    return srv_store_reserve(&s->st, key, size, ns, until, ahead, r);
}

static int handle_reserve(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    struct srv_batch *b = &ss->batch;
    /* the client writes into what it is granted for at most its declared
     * deadline from now (session.c, store.h), or, for reservations made
     * ahead of their keys, from the end of the hold it asked for (arg) */
    uint64_t until = umbp_now_ns() + ss->write_deadline_ns + (uint64_t)f->arg * 1000000ull;
    int rc = batch_begin(ss, f, PROTO_RESERVE_R);

    for (uint32_t i = b->from; rc == 0 && i < b->to; i++) {
        struct proto_reserve_item it;
        struct srv_region r;
        struct proto_region_item out = {0};
        proto_get_reserve_item(f, i, &it);
        out.status = srv_reserve_evicting(s, ss->ns, &it.key, it.size, until, f->arg != 0, &r,
                                          &b->may_evict);
        if (out.status == 0 && track_add(&ss->reservations, r.token, &it.key) < 0) {
            srv_store_abort(&s->st, &it.key, r.token);
            out.status = -ENOMEM;
        }
        if (out.status == 0) {
            out.offset = r.offset;
            out.size = r.size;
            out.token = r.token;
        }
        rc = proto_put_region_item(b->out, &out);
    }
    s->c.reserves += b->to - b->from;
    srv_evict_check(s);
    return batch_end(ss, f, rc);
}

static int handle_publish(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    const struct srv_batch *b = &ss->batch;
    int rc = batch_begin(ss, f, PROTO_PUBLISH_R);

    for (uint32_t i = b->from; rc == 0 && i < b->to; i++) {
        struct proto_token_item it;
        proto_get_token_item(f, i, &it);
        int st = -ENOENT;
        if (track_take(&ss->reservations, it.token, &it.key))
            st = srv_store_publish(&s->st, &it.key, it.token);
        s->c.publishes += st == 0;
        rc = proto_put_status(b->out, st);
    }
    return batch_end(ss, f, rc);
}

/* A reservation made ahead (RESERVE.arg) published under the key it was
 * written for. */
static int handle_publish_as(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    const struct srv_batch *b = &ss->batch;
    int rc = batch_begin(ss, f, PROTO_PUBLISH_R);

    for (uint32_t i = b->from; rc == 0 && i < b->to; i++) {
        struct proto_rename_item it;
        proto_get_rename_item(f, i, &it);
        int st = -ENOENT;
        if (track_take(&ss->reservations, it.token, &it.from))
            st = srv_store_publish_as(&s->st, &it.from, it.token, &it.key);
        s->c.publishes += st == 0;
        rc = proto_put_status(b->out, st);
    }
    return batch_end(ss, f, rc);
}

static int handle_abort(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    const struct srv_batch *b = &ss->batch;
    for (uint32_t i = b->from; i < b->to; i++) {
        struct proto_token_item it;
        proto_get_token_item(f, i, &it);
        if (track_take(&ss->reservations, it.token, &it.key))
            srv_store_abort(&ss->srv->st, &it.key, it.token);
    }
    return b->to < f->n ? SRV_MORE : 0; /* ABORT has no reply */
}

/* ---- leases -------------------------------------------------------------------------- */

static int handle_acquire(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    uint64_t ttl_ms = f->arg < s->lease_ttl_ms ? f->arg : s->lease_ttl_ms;
    if (node_first(ss, f, true, ttl_ms) == SRV_WAIT)
        return SRV_WAIT;
    uint64_t now = umbp_now_ns(), ttl_ns = ttl_ms * 1000000ull;
    const struct srv_batch *b = &ss->batch;
    int rc = batch_begin(ss, f, PROTO_ACQUIRE_R);

    for (uint32_t i = b->from; rc == 0 && i < b->to; i++) {
        umbp_key_t key;
        struct srv_region r;
        struct proto_region_item out = {0};
        proto_get_key(f, i, &key);
        out.status = srv_store_acquire(&s->st, &key, now, ttl_ns, &r);
        if (out.status == 0 && track_add(&ss->leases, r.token, NULL) < 0) {
            srv_store_release(&s->st, r.token);
            out.status = -ENOMEM;
        }
        if (out.status == 0) {
            out.offset = r.offset;
            out.size = r.size;
            out.token = r.token;
        }
        s->c.acquire_hits += out.status == 0;
        rc = proto_put_region_item(b->out, &out);
    }
    s->c.acquires += b->to - b->from;
    srv_node_slice_done(ss);
    return batch_end(ss, f, rc);
}

static int handle_release(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    const struct srv_batch *b = &ss->batch;
    int rc = batch_begin(ss, f, PROTO_RELEASE_R);

    for (uint32_t i = b->from; rc == 0 && i < b->to; i++) {
        struct proto_token_item it;
        proto_get_token_item(f, i, &it);
        int st = UMBP_E_STALE; /* not a lease of this session (any more) */
        if (track_take(&ss->leases, it.token, NULL))
            st = srv_store_release(&s->st, it.token);
        rc = proto_put_status(b->out, st);
    }
    return batch_end(ss, f, rc);
}

/* ---- clear, stats, sessions, ping ----------------------------------------------------- */

static int handle_clear(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    srv_store_clear(&ss->srv->st);
    umbp_log(UMBP_LOG_INFO, SESSION_FMT ": cleared the pool (for every engine)",
             SESSION_ARGS(ss));
    return reply_done(ss, proto_put_empty(&ss->conn.out, PROTO_CLEAR_R, f->seq, 0));
}

static int handle_stats(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    struct umbp_tier_usage u;
    uint64_t held, expired;
    srv_store_usage(&s->st, &u);
    srv_store_writer_counts(&s->st, &held, &expired);
    struct proto_stats st = {
        .capacity_bytes = u.capacity_bytes, .used_bytes = u.used_bytes,
        .num_objects = u.num_objects, .num_pending = u.num_pending,
        .num_leased = u.num_leased, .evictions = u.evictions,
        .evicted_bytes = u.evicted_bytes, .leases_expired = u.leases_expired,
        .sessions = s->svc.nconns,
        .lookups = s->c.lookups, .lookup_keys = s->c.lookup_keys,
        .lookup_hits = s->c.lookup_hits, .reserves = s->c.reserves,
        .publishes = s->c.publishes, .acquires = s->c.acquires,
        .acquire_hits = s->c.acquire_hits, .protocol_errors = s->c.protocol_errors,
        .refused_connections = s->c.refused_connections,
        .held_regions = held, .reservations_expired = expired,
    };
    int rc = proto_begin(&ss->conn.out, PROTO_STATS_R, f->seq, 1, 0);
    if (rc == 0)
        rc = proto_put_stats(&ss->conn.out, &st);
    return reply_end(ss, rc);
}

static struct proto_session_item session_item(const struct srv_session *o)
{
    struct proto_session_item it = {
        .session_id = o->conn.id, .pid = (uint32_t)o->conn.pid, .uid = o->conn.uid,
        .role = o->hello.role, .dp_rank = o->hello.dp_rank, .tp_rank = o->hello.tp_rank,
        .leases = o->leases.n, .reservations = o->reservations.n, .requests = o->requests,
    };
    memcpy(it.engine_id, o->hello.engine_id, PROTO_NAME_MAX);
    memcpy(it.name_space, o->hello.name_space, PROTO_NAME_MAX);
    return it;
}

static int handle_sessions(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    struct umbp_server *s = ss->srv;
    uint32_t n = 0;
    for (SESSIONS_EACH(s, o))
        n += session_greeted(o);
    /* max_sessions <= SRV_MAX_SESSIONS, SESSIONS_R's record limit */
    int rc = proto_begin(&ss->conn.out, PROTO_SESSIONS_R, f->seq, n, 0);
    for (SESSIONS_EACH(s, o))
        if (rc == 0 && session_greeted(o)) {
            struct proto_session_item it = session_item(o);
            rc = proto_put_session_item(&ss->conn.out, &it);
        }
    return reply_end(ss, rc);
}

static int handle_ping(struct net_conn *c, const struct proto_frame *f)
{
    struct srv_session *ss = to_session(c);
    return reply_done(ss, proto_put_empty(&ss->conn.out, PROTO_PONG, f->seq, 0));
}

/* ---- the handshake ------------------------------------------------------------------ */

/* The version a HELLO announces, read before the rest of the record is
 * checked: a client of another release may set flags or roles this one
 * does not know, and deserves HELLO_ERR rather than "malformed".  The
 * record starts u32 magic, u16 version in every version. */
static bool hello_version(const struct proto_frame *f, uint16_t *version)
{
    const uint8_t *p = f->records;
    if (f->n != 1 || f->record_size < 6)
        return false;
    uint32_t magic = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24;
    *version = (uint16_t)(p[4] | p[5] << 8);
    return magic == PROTO_MAGIC;
}

static int refuse_version(struct srv_session *ss, const struct proto_frame *f,
                          uint16_t version)
{
    char msg[PROTO_ERRMSG_MAX];
    snprintf(msg, sizeof(msg), "HELLO.version: this umbp-server speaks protocol version %d, "
             "not %u; use a client and a server of the same release", PROTO_VERSION,
             version);
    proto_put_error_frame(&ss->conn.out, PROTO_HELLO_ERR, f->seq, -EPROTO, msg);
    umbp_log(UMBP_LOG_WARN, SESSION_FMT ": refused: %s", SESSION_ARGS(ss), msg);
    snprintf(ss->conn.why, sizeof(ss->conn.why), "refused protocol version %u", version);
    return SRV_CLOSE;
}

/* HELLO_OK; a worker's carries the pool descriptor.  The welcome is the
 * session's first output and a few dozen bytes, so one sendmsg on the
 * empty socket takes it whole. */
static int welcome(struct srv_session *ss, const struct proto_frame *f)
{
    struct umbp_server *s = ss->srv;
    struct umbp_tier_usage u;
    srv_store_usage(&s->st, &u);
    struct proto_welcome w = {
        .version = PROTO_VERSION, .lease_ttl_ms = (uint32_t)s->lease_ttl_ms,
        .session_id = ss->conn.id, .pool_id = s->pool_id, .pool_size = s->pool->size,
        .capacity_bytes = u.capacity_bytes,
    };
    int rc = proto_begin(&ss->conn.out, PROTO_HELLO_OK, f->seq, 1, 0);
    if (rc == 0)
        rc = proto_put_welcome(&ss->conn.out, &w);
    if ((rc = reply_end(ss, rc)) != 0 || ss->hello.role != PROTO_ROLE_WORKER)
        return rc;
    rc = proto_send_with_fd(ss->conn.fd, ss->conn.out.data + ss->conn.out_off,
                            session_backlog(ss), s->pool->fd);
    if (rc < 0) {
        snprintf(ss->conn.why, sizeof(ss->conn.why), "sending the pool descriptor: %s", strerror(-rc));
        return SRV_CLOSE;
    }
    ss->conn.out_off = ss->conn.out.len;
    return 0;
}

static int handle_hello(struct srv_session *ss, const struct proto_frame *f, char *what,
                        size_t whatlen)
{
    struct proto_hello h;
    if (f->type != PROTO_HELLO) {
        snprintf(what, whatlen, "frame.type: %s before HELLO; a session's first frame must "
                 "be HELLO", proto_type_name(f->type));
        return -EPROTO;
    }
    uint16_t version;
    if (hello_version(f, &version) && version != PROTO_VERSION)
        return refuse_version(ss, f, version);
    if (proto_get_hello(f, &h, what, whatlen) < 0)
        return -EPROTO;
    if (h.role > PROTO_ROLE_ADMIN) {
        snprintf(what, whatlen, "HELLO.role: node (%u) is umbp-master's role; umbp-server "
                 "takes worker (0), lookup (1) and admin (2)", h.role);
        return -EPROTO;
    }
    ss->hello = h;
    ss->write_deadline_ns = (uint64_t)h.write_deadline_ms * 1000000ull;
    ss->ns = srv_namespace_id(ss->srv, h.name_space);
    ss->conn.role = &roles[h.role];
    int rc = welcome(ss, f);
    if (rc)
        return rc;
    if (h.role == PROTO_ROLE_WORKER)
        session_warm(ss);
    if (h.flags & PROTO_HELLO_EVENTS)
        srv_events_subscribe(ss);
    umbp_log(UMBP_LOG_INFO, SESSION_FMT ": %s, dp %u tp %u, engine '%s', namespace '%s'%s",
             SESSION_ARGS(ss), role_names[h.role], h.dp_rank, h.tp_rank, h.engine_id,
             h.name_space, ss->events ? ", events" : "");
    return 0;
}

/* ---- dispatch ------------------------------------------------------------------------ */

/* What each role may send (net/service.c refuses the rest as malformed,
 * listing these). */
#define LOOKUP_ROLE_HANDLERS                                                             \
    [PROTO_LOOKUP] = handle_lookup, [PROTO_STATS] = handle_stats, [PROTO_PING] = handle_ping

static const struct net_role roles[PROTO_ROLE_ADMIN + 1] = {
    [PROTO_ROLE_WORKER] = {.name = "worker", .handlers = {
        LOOKUP_ROLE_HANDLERS, [PROTO_RESERVE] = handle_reserve,
        [PROTO_PUBLISH] = handle_publish, [PROTO_PUBLISH_AS] = handle_publish_as,
        [PROTO_ABORT] = handle_abort,
        [PROTO_ACQUIRE] = handle_acquire, [PROTO_RELEASE] = handle_release,
        [PROTO_CLEAR] = handle_clear}},
    [PROTO_ROLE_LOOKUP] = {.name = "lookup", .handlers = {LOOKUP_ROLE_HANDLERS}},
    [PROTO_ROLE_ADMIN] = {.name = "admin", .handlers = {
        [PROTO_STATS] = handle_stats, [PROTO_SESSIONS] = handle_sessions,
        [PROTO_CLEAR] = handle_clear, [PROTO_PING] = handle_ping}},
};

/* The next slice of f: records [from, to), at most *budget of them, and
 * where its reply goes. */
static void batch_next(struct srv_session *ss, const struct proto_frame *f, uint32_t *budget)
{
    struct srv_batch *b = &ss->batch;
    if (b->rewind) { /* the slice that waited for the cluster, again */
        b->rewind = false;
        b->out = &ss->reply;
        *budget -= b->to > b->from ? b->to - b->from : 1;
        return;
    }
    if (!b->open) {
        *b = (struct srv_batch){.may_evict = true};
    }
    b->from = b->to;
    uint32_t left = f->n - b->from, n = left < *budget ? left : *budget;
    b->to = b->from + n;
    b->out = b->open || b->to < f->n ? &ss->reply : &ss->conn.out;
    *budget -= n ? n : 1;
}

int srv_handle_hello(struct net_conn *c, const struct proto_frame *f, char *what,
                     size_t whatlen)
{
    struct srv_session *ss = to_session(c);
    ss->requests++;
    return handle_hello(ss, f, what, whatlen);
}

/* A request of a store or a read in progress, after which more of it is
 * coming (server.c's poll_wait); not housekeeping (STATS, PING, SESSIONS),
 * aborts, or a refill of spares (a RESERVE with a hold). */
static bool data_path(const struct proto_frame *f)
{
    switch (f->type) {
    case PROTO_RESERVE:
        return f->arg == 0;
    case PROTO_PUBLISH:
    case PROTO_PUBLISH_AS:
    case PROTO_ACQUIRE:
    case PROTO_RELEASE:
    case PROTO_LOOKUP:
        return true;
    default:
        return false;
    }
}

int srv_run_frame(struct net_conn *c, net_frame_fn h, const struct proto_frame *f,
                  uint32_t *budget)
{
    struct srv_session *ss = to_session(c);
    struct srv_batch *b = &ss->batch;
    ss->requests += !b->open;
    batch_next(ss, f, budget);
    uint64_t t0 = umbp_now_ns();
    if (data_path(f))
        ss->srv->last_data_ns = t0;
    int rc = h(c, f);
    b->busy_ns += umbp_now_ns() - t0;
    b->open = rc == SRV_MORE || rc == SRV_WAIT;
    if (!b->open) /* the whole frame's handling time, not the wait between slices */
        srv_metrics_observe(ss->srv, f->type, b->busy_ns);
    return rc;
}
