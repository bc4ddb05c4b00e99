/*
 * shm_tier.c - the shm tier: objects in the shared-memory pool of the
 * host's umbp-server (standalone mode).
 *
 * The server owns the index, allocation, eviction and leases; this tier
 * forwards each batched call as request frames (proto.h) over a Unix socket
 * and completes it on the loop thread when the replies arrive.  Bytes never
 * cross the socket: the runtime copies them into and out of the pool, which
 * the server handed over once (SCM_RIGHTS) and this process maps.
 *
 * Threads: every member runs on the runtime's loop thread and never blocks,
 * except create and destroy (the creating thread, loop not running) and
 * mapped_memory (a caller's thread; it reads the mapping under map_lock).
 *
 * Failure (tier.h "Remote tiers"): done fires exactly once per call, by its
 * deadline at the latest; a lost server fails every outstanding call at once
 * (-ECONNRESET) and the tier reconnects in the background; while the server
 * is away or a reply is overdue, health() says UMBP_E_NOT_ATTEMPTED so new
 * transfers fail fast.  A reservation or lease lives in one session: after a
 * reconnect its token means nothing, so publish fails it (-ECONNRESET) and
 * release reports UMBP_E_STALE without asking (region.aux[0] holds the
 * session epoch that granted it).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shm.h"

/* ---- refusing calls ----------------------------------------------------- */

static bool needs_pool(enum shm_kind k) { return k != SHM_LOOKUP; }

/* 0, or the status a call of kind k completes with without asking. */
static int refusal(const struct shm_tier *st, enum shm_kind k)
{
    if (!st->worker && needs_pool(k))
        return -ENOTSUP; /* role lookup: an engine's scheduler owns no pool */
    if (st->sess.state == NET_STOPPED)
        return UMBP_E_NOT_ATTEMPTED;
    if (st->sess.state != NET_CONNECTED)
        /* a reservation or lease died with the session it was made in */
        return k == SHM_PUBLISH || k == SHM_RELEASE ? -ECONNRESET : UMBP_E_NOT_ATTEMPTED;
    return 0;
}

/* Queues a call over reqs[0..n); done(arg, 0) at once for an empty batch. */
static void submit(struct shm_tier *st, enum shm_kind k, struct umbp_tier_req *const *reqs,
                   size_t n, uint8_t *present, uint32_t arg, umbp_tier_done_fn done, void *a)
{
    if (n == 0 && k != SHM_CLEAR) {
        done(a, 0);
        return;
    }
    struct shm_call *c = shm_call_new(st, k, reqs, n, done, a);
    if (!c) {
        done(a, -ENOMEM);
        return;
    }
    c->present = present;
    /* usage() is refreshed by refresh_usage (umbp_get_stats), the periodic
     * STATS and, while puts wait for room, fast STATS polls; only a clear
     * changes it enough to ask at once */
    shm_call_send(st, c, arg, k == SHM_CLEAR);
}

/* ---- the members ---------------------------------------------------------- */

static void shm_lookup(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                       uint8_t *present, bool touch, umbp_tier_done_fn done, void *arg)
{
    struct shm_tier *st = to_shm_tier(t);
    int rc = refusal(st, SHM_LOOKUP);
    if (rc) {
        memset(present, 0, n);
        done(arg, rc);
        return;
    }
    submit(st, SHM_LOOKUP, reqs, n, present, touch ? PROTO_LOOKUP_TOUCH : 0, done, arg);
}

static void shm_reserve(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                        umbp_tier_done_fn done, void *arg)
{
    struct shm_tier *st = to_shm_tier(t);
    int rc = refusal(st, SHM_RESERVE);
    if (rc)
        done(arg, rc);
    else if (shm_ahead_take(st, reqs, n)) /* no round trip (shm_ahead.c) */
        done(arg, 0);
    else
        submit(st, SHM_RESERVE, reqs, n, NULL, 0, done, arg);
}

static void shm_acquire(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                        uint64_t lease_ttl_ms, umbp_tier_done_fn done, void *arg)
{
    struct shm_tier *st = to_shm_tier(t);
    int rc = refusal(st, SHM_ACQUIRE);
    uint32_t ttl = lease_ttl_ms == 0 ? 1 : lease_ttl_ms > UINT32_MAX ? UINT32_MAX
                                                                       : (uint32_t)lease_ttl_ms;
    if (rc) {
        done(arg, rc);
        return;
    }
    if (n == 0) {
        done(arg, 0);
        return;
    }
    struct shm_call *c = shm_call_new(st, SHM_ACQUIRE, reqs, n, done, arg);
    if (!c) {
        done(arg, -ENOMEM);
        return;
    }
    c->lease_ns = (uint64_t)ttl * 1000000ull;
    shm_call_send(st, c, ttl, false);
}

/* The requests publish or release acts on: status 0 and granted in this
 * session; the others of status 0 get `stale` (their grant is gone). */
static struct umbp_tier_req **granted(struct shm_tier *st, struct umbp_tier_req *const *reqs,
                                      size_t n, int stale, size_t *m)
{
    struct umbp_tier_req **sel = malloc((n ? n : 1) * sizeof(*sel));
    *m = 0;
    for (size_t i = 0; sel && i < n; i++) {
        if (reqs[i]->status != 0)
            continue;
        if (reqs[i]->region.aux[0] != st->epoch)
            reqs[i]->status = stale;
        else
            sel[(*m)++] = reqs[i];
    }
    return sel;
}

static void finish_granted(struct shm_tier *st, enum shm_kind k, int stale,
                           struct umbp_tier_req *const *reqs, size_t n, umbp_tier_done_fn done,
                           void *arg)
{
    int rc = refusal(st, k);
    if (rc) {
        done(arg, rc);
        return;
    }
    size_t m;
    struct umbp_tier_req **sel = granted(st, reqs, n, stale, &m);
    for (size_t i = 0; k == SHM_PUBLISH && sel && i < m; i++)
        if (sel[i]->region.aux[1]) /* one made ahead of its key (shm_ahead.c) */
            k = SHM_PUBLISH_AS;
    if (!sel)
        done(arg, -ENOMEM);
    else
        submit(st, k, sel, m, NULL, 0, done, arg);
    free(sel);
}

static void shm_publish(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                        umbp_tier_done_fn done, void *arg)
{
    finish_granted(to_shm_tier(t), SHM_PUBLISH, -ECONNRESET, reqs, n, done, arg);
}

/* The session is alive now: no error and no hang-up from the server (a
 * server that died, even since our last read, has closed its end). */
static bool session_alive(const struct shm_tier *st)
{
    if (st->sess.state != NET_CONNECTED || st->drv.fd < 0)
        return false;
    struct pollfd p = {.fd = st->drv.fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) == 0;
}

/* Whether every lease of the batch is certainly still active: granted in
 * this session, before its lease_valid_until (shm_calls.c), and the
 * session alive now.  The server ends a lease early only when the session
 * ends, and never evicts or reuses a leased object, so the bytes copied
 * under such leases are the objects': the release needs no answer. */
static bool leases_certain(const struct shm_tier *st, struct umbp_tier_req *const *reqs,
                           size_t n)
{
    uint64_t now = umbp_now_ns();
    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == 0 &&
            (reqs[i]->region.aux[0] != st->epoch || now >= reqs[i]->region.aux[1]))
            return false;
    return session_alive(st);
}

/* With certain leases the release completes at once and its frame goes out
 * without a wait: one round trip and the server's work per key less on
 * every load's critical path.  Otherwise the server says, per key, whether
 * the lease held.  (usage() catches up one round trip later; refresh_usage
 * waits for it.) */
static void shm_release(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                        umbp_tier_done_fn done, void *arg)
{
    struct shm_tier *st = to_shm_tier(t);
    if (refusal(st, SHM_RELEASE) || !leases_certain(st, reqs, n)) {
        finish_granted(st, SHM_RELEASE, UMBP_E_STALE, reqs, n, done, arg);
        return;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += reqs[i]->status == 0;
    struct shm_call *u = m ? shm_release_new(st, m) : NULL;
    if (u) {
        m = 0;
        for (size_t i = 0; i < n; i++)
            if (reqs[i]->status == 0) {
                u->keys[m] = reqs[i]->key;
                u->tokens[m++] = reqs[i]->region.token;
            }
    }
    /* The load completes before its RELEASE frame is written: the frame
     * holds copies, and the write is off the load's critical path. */
    done(arg, 0); /* statuses stay 0: every lease held */
    if (u)
        shm_call_send(st, u, 0, false);
}


/* Inline, no callback: ABORT has no reply.  A disconnected session's
 * reservations are already gone. */
static void shm_abort(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n)
{
    struct shm_tier *st = to_shm_tier(t);
    if (refusal(st, SHM_RESERVE) || n == 0)
        return;
    umbp_key_t *keys = malloc(n * sizeof(*keys));
    uint64_t *tokens = malloc(n * sizeof(*tokens));
    size_t m = 0;
    for (size_t i = 0; keys && tokens && i < n; i++)
        if (reqs[i]->region.aux[0] == st->epoch) {
            keys[m] = reqs[i]->key;
            if (reqs[i]->region.aux[1]) /* made ahead: under its placeholder */
                shm_ahead_key(st, reqs[i]->region.aux[1], &keys[m]);
            tokens[m++] = reqs[i]->region.token;
        }
    if (!keys || !tokens)
        umbp_log(UMBP_LOG_WARN, "shm tier: out of memory aborting %zu reservations; the "
                 "server drops them when this session ends", n);
    if (m) {
        shm_send_abort(st, keys, tokens, m);
        shm_stats_request(st, true); /* usage after the abort */
    }
    free(keys);
    free(tokens);
}

/* STATS in order behind every call already sent: when it is answered,
 * usage() reflects them.  Without a server, usage stays as last known. */
static void shm_refresh_usage(struct umbp_tier *t, umbp_tier_done_fn done, void *arg)
{
    struct shm_tier *st = to_shm_tier(t);
    if (st->sess.state != NET_CONNECTED || t->ops->health(t) < 0) { /* stalled: don't queue */
        done(arg, 0);
        return;
    }
    struct shm_call *c = shm_call_new(st, SHM_STATS, NULL, 0, done, arg);
    if (!c) {
        done(arg, -ENOMEM);
        return;
    }
    shm_call_send(st, c, 0, true);
}

static void shm_clear(struct umbp_tier *t, umbp_tier_done_fn done, void *arg)
{
    struct shm_tier *st = to_shm_tier(t);
    int rc = refusal(st, SHM_CLEAR);
    if (rc)
        done(arg, rc);
    else
        submit(st, SHM_CLEAR, NULL, 0, NULL, 0, done, arg);
}

/* The last STATS_R: no round trip.  Watermarks 0: the server evicts. */
static void shm_usage(struct umbp_tier *t, struct umbp_tier_usage *out)
{
    const struct proto_stats *s = &to_shm_tier(t)->stats;
    *out = (struct umbp_tier_usage){
        .capacity_bytes = s->capacity_bytes,
        .used_bytes = s->used_bytes,
        .num_objects = s->num_objects,
        .num_pending = s->num_pending,
        .num_leased = s->num_leased,
        .evictions = s->evictions,
        .evicted_bytes = s->evicted_bytes,
        .leases_expired = s->leases_expired,
        .reserved_ahead = shm_ahead_held(to_shm_tier(t)),
        .reserved_ahead_used = to_shm_tier(t)->ahead.taken,
    };
}

/* Disconnected, or a reply overdue (an orphan, or the oldest unanswered
 * frame older than lookup_timeout_ms: shm_conn_init): not attempted. */
static int shm_health(struct umbp_tier *t)
{
    return net_session_health(&to_shm_tier(t)->sess, umbp_now_ns());
}

/* Caller's thread; the loop may be swapping in a new pool meanwhile. */
static int shm_mapped_memory(struct umbp_tier *t, void **addr, size_t *len)
{
    struct shm_tier *st = to_shm_tier(t);
    int rc = -ENOTSUP;
    pthread_mutex_lock(&st->map_lock);
    if (st->nmaps) {
        *addr = st->maps[st->nmaps - 1].addr;
        *len = (size_t)st->maps[st->nmaps - 1].size;
        st->mapped_out = true;
        rc = 0;
    }
    pthread_mutex_unlock(&st->map_lock);
    return rc;
}

/* Runtime shutdown begins, loop thread: refills of spares stop; the
 * runtime waits while one is unanswered, or while a call that timed out
 * still has replies due (an orphan: a refill's or a store's RESERVE, an
 * ACQUIRE), so that stop finds its late grants undone rather than granted
 * to a closed session, which the server holds to their deadline. */
static bool shm_drain(struct umbp_tier *t)
{
    struct shm_tier *st = to_shm_tier(t);
    bool filling = shm_ahead_drain(st);
    return filling || (st->sess.orphans && st->sess.state == NET_CONNECTED);
}

#define SHM_STOP_FLUSH_MS 200 /* beside a stopped server, at most */

/* Runtime shutdown, loop thread: nothing stays outstanding. */
static void shm_stop(struct umbp_tier *t)
{
    struct shm_tier *st = to_shm_tier(t);
    if (st->sess.state == NET_STOPPED)
        return;
    shm_ahead_drop(st, true); /* the server frees them now, not at their deadline */
    /* the aborts (up to 160 KB) must reach the socket before it closes,
     * which drops what is not written: a server behind on reading this
     * session would otherwise hold the spares to their deadline */
    if (st->sess.state == NET_CONNECTED && st->sess.out.len)
        (void)shm_flush_blocking(st, umbp_now_ns() / 1000000ull + SHM_STOP_FLUSH_MS);
    shm_conn_stop_watchers(st);
    net_session_stop(&st->sess); /* closes the socket, fails every call */
}

/* ---- lifetime ---------------------------------------------------------------- */

static int shm_validate_config(const void *cfg, const struct umbp_core_config *core, char *err,
                               size_t errlen)
{
    (void)core;
    return shm_config_validate(cfg, err, errlen);
}

static void shm_destroy(struct umbp_tier *t)
{
    if (!t)
        return;
    struct shm_tier *st = to_shm_tier(t);
    shm_conn_stop_watchers(st);
    ev_timer_stop(st->base.env.loop, &st->ahead.timer);
    shm_ahead_destroy(st);
    if (st->drv.fd >= 0)
        close(st->drv.fd);
    st->drv.fd = -1;
    /* calls still queued (the runtime abandoned them): freed, never completed */
    net_session_destroy(&st->sess);
    for (size_t i = 0; i < st->nmaps; i++)
        munmap(st->maps[i].addr, st->maps[i].size);
    free(st->maps);
    pthread_mutex_destroy(&st->map_lock);
    free(st);
}

static int shm_create(const struct umbp_tier_env *env, const void *cfg, struct umbp_tier **out,
                      char *err, size_t errlen)
{
    int rc = shm_config_validate(cfg, err, errlen);
    if (rc < 0)
        return rc;
    struct shm_tier *st = calloc(1, sizeof(*st));
    if (!st) {
        snprintf(err, errlen, "shm tier: out of memory");
        return -ENOMEM;
    }
    st->base.ops = &umbp_tier_shm_ops;
    st->base.env = *env;
    st->cfg = *(const struct shm_config *)cfg;
    st->worker = strcmp(st->cfg.role, "lookup") != 0;
    pthread_mutex_init(&st->map_lock, NULL);
    shm_conn_init(st);
    shm_ahead_init(st);
    char dir[SHM_PATH_MAX];
    shm_config_socket_dir(&st->cfg, dir, sizeof(dir));
    if ((rc = proto_socket_path(dir, (unsigned)st->cfg.dp_rank, st->cfg.lookup_instance,
                                st->path, sizeof(st->path), err, errlen)) < 0 ||
        (rc = shm_attach(st, err, errlen)) < 0) {
        shm_destroy(&st->base);
        return rc;
    }
    shm_conn_start(st); /* watchers on env->loop: it runs once the runtime starts it */
    *out = &st->base;
    return 0;
}

/* ---- the vtable --------------------------------------------------------------- */

static const char *const shm_modes[] = {"standalone", NULL};

const struct umbp_tier_ops umbp_tier_shm_ops = {
    .name = "shm",
    .caps = UMBP_TIER_CAP_MAPPED | UMBP_TIER_CAP_REMOTE | UMBP_TIER_CAP_SHARED,
    .modes = shm_modes,
    .options = shm_options,
    .config_size = sizeof(struct shm_config),
    .validate_config = shm_validate_config,
    .create = shm_create,
    .destroy = shm_destroy,
    .stop = shm_stop,
    .drain = shm_drain,
    .lookup = shm_lookup,
    .reserve = shm_reserve,
    .reserve_ahead = shm_ahead_hint,
    .publish = shm_publish,
    .abort = shm_abort,
    .acquire = shm_acquire,
    .release = shm_release,
    .clear = shm_clear,
    .usage = shm_usage,
    .refresh_usage = shm_refresh_usage,
    .health = shm_health,
    .mapped_memory = shm_mapped_memory,
    /* evict, expire_leases: the server does both; read, write: regions are
     * always mapped */
};
