/*
 * server.c - umbp-server's life cycle and housekeeping.
 *
 * create: parse the config (server_config.c), take the socket path (the
 * directory and the lock, listen.c) before mapping anything, so a second
 * server fails fast; map the pool as a shared object store (the dram tier's
 * store and options, always on shared memory: memfd, or /dev/shm/<name>
 * with dram_shm_name, adopted if it exists), whose id is 64 random bits
 * kept across restarts of a named pool; then listen.
 *
 * run: one libev loop on the calling thread owns the store and every
 * session, so nothing is locked.  Besides the sessions' watchers it runs a
 * timer every lease_ttl_ms / 10 (5 ms .. 1 s) that expires leases and
 * starts eviction above the high watermark, an idle watcher that keeps
 * evicting in slices down to the low one, an ev_prepare that sends the
 * iteration's events, the run queue's ev_idle that gives sessions with
 * large frames their next slice (session.c), and the ev_async that
 * umbp_server_stop pokes.
 *
 * populate_pool: a thread started when the server starts running allocates
 * every page of the pool (MADV_POPULATE_WRITE, 64 MiB at a time, contents
 * untouched) and ends; destroy stops it between chunks and joins it.  A
 * worker that maps the pool then pins pages that exist: its registration
 * with the GPU does not fault 4 GiB in (1.5-2.2 s against 0.4-0.5 on an
 * H200 host), and its first transfers do not meet unallocated pages (first
 * stores 0.950-0.955x against 0.926-0.952x there: docs/benchmarks.md).
 *
 * destroy: every session ends (its leases released; its reservations
 * orphaned, never freed: their writers may still be copying), the socket
 * and its lock file go, the pool is unmapped.  A named pool (dram_shm_name)
 * stays in /dev/shm with its journal, and the next server on it adopts
 * every published object (store/journal.h) and holds the region of
 * every put left unfinished until its writer's declared deadline (the
 * record's hold time; adopt_grace_ms for records without one).
 *
 * The rule behind it: a reserved region is handed out again only when every
 * writer granted it has provably stopped - it published or aborted, or its
 * write deadline (declared at HELLO, counted from the grant) has passed -
 * whichever way its session ended.  The tick frees such regions
 * (dram_store_expire_writers), in memory and after a restart alike.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "dram_options.h"
#include "metrics.h"
#include "node.h"
#include "options.h"
#include "server.h"
#include "srv.h"
#include "util.h"

/* ---- housekeeping ---------------------------------------------------------------- */

/* One slice of background eviction; keeps the idle watcher running while
 * there is more to do. */
static void evict_slice(struct umbp_server *s)
{
    struct umbp_tier_usage u;
    bool more = false;
    dram_store_usage(s->store, &u);
    if (u.used_bytes > u.low_watermark_bytes)
        dram_store_evict(s->store, u.low_watermark_bytes, 0, SRV_EVICT_SLICE, &more);
    dram_store_usage(s->store, &u);
    /* !more below low: done; !more above it: the rest is leased or pending,
     * so wait for the next tick instead of spinning */
    s->evicting = more && u.used_bytes > u.low_watermark_bytes;
    if (s->evicting)
        ev_idle_start(s->loop, &s->evict_w);
    else
        ev_idle_stop(s->loop, &s->evict_w);
}

void srv_evict_check(struct umbp_server *s)
{
    struct umbp_tier_usage u;
    if (s->evicting)
        return;
    dram_store_usage(s->store, &u);
    if (u.used_bytes > u.high_watermark_bytes)
        evict_slice(s);
}

static void evict_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
    (void)loop;
    (void)revents;
    evict_slice(umbp_container_of(w, struct umbp_server, evict_w));
}

static void tick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct umbp_server *s = umbp_container_of(w, struct umbp_server, tick_w);
    (void)loop;
    (void)revents;
    uint64_t now = umbp_now_ns();
    dram_store_expire_leases(s->store, now);
    dram_store_expire_writers(s->store, now);
    if (s->evicting)
        evict_slice(s); /* progress even when the loop is never idle */
    else
        srv_evict_check(s);
}

static void flush_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
    (void)loop;
    (void)revents;
    srv_events_flush(umbp_container_of(w, struct umbp_server, flush_w));
}

static void stop_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    struct umbp_server *s = umbp_container_of(w, struct umbp_server, stop_w);
    (void)revents;
    srv_listen_close(s, false); /* new clients are refused from now on */
    srv_node_stop(s->node);     /* its calls end, its watchers stop */
    ev_break(loop, EVBREAK_ALL);
}

#define SRV_POLL_NS 200000ull
/* While a session holds reservations its publish is coming, after a copy
 * of up to a few ms (a GPU slice): keep polling that long, so the publish
 * that ends a store is not delayed by a wake-up. */
#define SRV_POLL_PENDING_NS 5000000ull
#define SRV_POLL_RECHECK_NS 50000ull

static bool reservations_held(const struct umbp_server *s)
{
    for (SESSIONS_EACH(s, ss))
        if (ss->reservations.n)
            return true;
    return false;
}

static void poll_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
    struct umbp_server *s = umbp_container_of(w, struct umbp_server, poll_w);
    (void)revents;
    uint64_t now = umbp_now_ns(), quiet = now - s->last_request_ns;
    if (quiet <= SRV_POLL_NS || now < s->poll_recheck_ns)
        return;
    if (now - s->last_data_ns <= SRV_POLL_PENDING_NS && reservations_held(s)) {
        s->poll_recheck_ns = now + SRV_POLL_RECHECK_NS; /* walk the sessions rarely */
        return;
    }
    ev_idle_stop(loop, w);
}

void srv_note_request(struct umbp_server *s)
{
    if (!s->may_spin)
        return;
    s->last_request_ns = umbp_now_ns();
    s->poll_recheck_ns = 0;
    if (!ev_is_active(&s->poll_w))
        ev_idle_start(s->loop, &s->poll_w);
}

static double tick_period_s(int64_t lease_ttl_ms)
{
    double ms = (double)lease_ttl_ms / 10.0;
    return (ms < 5.0 ? 5.0 : ms > 1000.0 ? 1000.0 : ms) / 1000.0;
}

static void watchers_start(struct umbp_server *s)
{
    double period = tick_period_s(s->cfg->core.lease_ttl_ms);
    ev_async_init(&s->stop_w, stop_cb);
    ev_async_start(s->loop, &s->stop_w);
    ev_timer_init(&s->tick_w, tick_cb, period, period);
    ev_timer_start(s->loop, &s->tick_w);
    ev_idle_init(&s->evict_w, evict_cb);
    ev_idle_init(&s->poll_w, poll_cb);
    s->may_spin = umbp_poll_wait_spins(s->cfg->core.poll_wait);
    ev_prepare_init(&s->flush_w, flush_cb);
    ev_prepare_start(s->loop, &s->flush_w);
    session_runq_init(s);
}

/* ---- the pool ---------------------------------------------------------------------- */

static void log_adoption(struct umbp_server *s)
{
    struct dram_store_adoption a;
    dram_store_adoption(s->store, &a);
    if (!a.adopted)
        return;
    umbp_log(UMBP_LOG_WARN, "adopted the pool /dev/shm%s of a previous server: %llu objects "
             "(%llu bytes) restorable, %llu unfinished puts held until their writers' "
             "deadlines, %llu records dropped", s->pool->shm_path, (unsigned long long)a.objects,
             (unsigned long long)a.bytes, (unsigned long long)a.held_pending,
             (unsigned long long)a.dropped);
}

/* The store's namespaces by name (store.h): the journal of a named pool
 * records names, so an adopted object counts in its namespace whatever
 * number this server gives it. */
static const char *store_ns_name(void *ctx, unsigned ns)
{
    struct umbp_server *s = ctx;
    return ns < s->nns ? s->ns_names[ns] : NULL;
}

static unsigned store_ns_of_name(void *ctx, const char *name)
{
    return srv_namespace_id(ctx, name);
}

/* A named pool (dram_shm_name) is persistent: it and its journal stay in
 * /dev/shm when the server ends, and a server that starts on them adopts
 * every published object, each in its namespace, and keeps the pool's id,
 * so clients that still map it keep their mapping and their GPU
 * registration.  The quotas' namespaces are numbered first (1..), then
 * those of adopted objects. */
static int pool_create(struct umbp_server *s, char *err, size_t errlen)
{
    struct dram_store_params p;
    umbp_dram_store_params(s->cfg->dram, s->cfg->capacity, &p);
    p.emit_event = srv_events_emit;
    p.ns_name = store_ns_name;
    p.ns_of_name = store_ns_of_name;
    p.ctx = s;
    p.adopt_grace_ms = (uint64_t)s->cfg->opt.adopt_grace_ms;
    p.pool.persistent = p.pool.shm_name && p.pool.shm_name[0];
    s->nns = 1; /* "" */
    for (size_t i = 0; i < s->cfg->nquotas && s->nns < DRAM_STORE_MAX_NS; i++)
        (void)srv_namespace_id(s, s->cfg->quotas[i].name_space);
    int rc = dram_store_create(&p, &s->store, err, errlen);
    if (rc < 0)
        return rc;
    s->st = (struct srv_store){&srv_dram_store_ops, s->store}; /* the handlers' store */
    s->pool = dram_store_pool(s->store);
    if (s->pool->fd < 0) {
        snprintf(err, errlen, "the pool has no descriptor to share (internal error)");
        return -EINVAL;
    }
    s->pool_id = dram_store_pool_id(s->store);
    log_adoption(s);
    for (size_t i = 0; i < s->cfg->nquotas; i++) {
        unsigned id = srv_namespace_id(s, s->cfg->quotas[i].name_space);
        if (id) /* (0: past DRAM_STORE_MAX_NS, warned) */
            dram_store_set_quota(s->store, id, s->cfg->quotas[i].bytes);
    }
    return 0;
}

unsigned srv_namespace_id(struct umbp_server *s, const char *name)
{
    if (!name[0])
        return 0;
    for (unsigned i = 1; i < s->nns; i++)
        if (strcmp(s->ns_names[i], name) == 0)
            return i;
    if (s->nns == DRAM_STORE_MAX_NS) {
        if (!s->ns_full_warned)
            umbp_log(UMBP_LOG_WARN, "namespace '%s': more than %d namespaces; it shares the "
                     "default one", name, DRAM_STORE_MAX_NS - 1);
        s->ns_full_warned = true;
        return 0;
    }
    snprintf(s->ns_names[s->nns], sizeof(s->ns_names[0]), "%s", name);
    return s->nns++;
}

/* With master_address: the node (node.h), before clients can connect, so
 * every object they store is announced, and so are those of an adopted
 * pool (a restarted server's). */
static void node_learn(void *ctx, const umbp_key_t *key, uint64_t size)
{
    struct umbp_server *s = ctx;
    srv_node_event(s->node, UMBP_EVENT_STORED, key, size);
}

static int node_create(struct umbp_server *s, char *err, size_t errlen)
{
    if (!s->cfg->is_node)
        return 0;
    int rc = srv_node_create(s, s->cfg->node, &s->node, err, errlen);
    if (rc == 0) /* an adopted pool's objects: the node's first heartbeats carry them */
        dram_store_for_each_published(s->store, node_learn, s);
    return rc;
}

/* ---- populating the pool (populate_pool) ---------------------------------------------- */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older glibc lacks the name */
#endif
#define POPULATE_CHUNK (64ull << 20)

/* Its own thread: only the pool's mapping (never unmapped before the join)
 * and populate_stop. */
static void *populate_main(void *arg)
{
    struct umbp_server *s = arg;
    uint8_t *base = s->pool->base;
    uint64_t size = s->pool->size, done = 0, t0 = umbp_now_ns();
    while (done < size && !atomic_load(&s->populate_stop)) {
        uint64_t n = size - done < POPULATE_CHUNK ? size - done : POPULATE_CHUNK;
        if (madvise(base + done, n, MADV_POPULATE_WRITE) < 0) {
            int e = errno;
            umbp_log(e == EINVAL ? UMBP_LOG_INFO : UMBP_LOG_WARN,
                     "populate_pool: stopped after %.0f of %.0f MiB (%s)%s", (double)done / (1 << 20),
                     (double)size / (1 << 20), strerror(e),
                     e == EINVAL ? ": this kernel has no MADV_POPULATE_WRITE (Linux 5.14); "
                                   "workers fault the pool in when they register it"
                                 : "; workers fault the rest in when they register it");
            return NULL;
        }
        done += n;
    }
    if (done == size)
        umbp_log(UMBP_LOG_INFO, "populate_pool: %.0f MiB allocated in %.0f ms",
                 (double)size / (1 << 20), (double)(umbp_now_ns() - t0) / 1e6);
    return NULL;
}

static void populate_start(struct umbp_server *s)
{
    if (!s->cfg->opt.populate_pool)
        return;
    atomic_store(&s->populate_stop, false);
    int rc = pthread_create(&s->populate_thread, NULL, populate_main, s);
    if (rc != 0)
        umbp_log(UMBP_LOG_WARN, "populate_pool: cannot start its thread (%s); workers fault "
                 "the pool in when they register it", strerror(rc));
    s->populate_started = rc == 0;
}

static void populate_join(struct umbp_server *s)
{
    if (!s->populate_started)
        return;
    atomic_store(&s->populate_stop, true);
    pthread_join(s->populate_thread, NULL);
    s->populate_started = false;
}

/* ---- the API ------------------------------------------------------------------------- */

static void apply_log_level(const struct srv_config *c)
{
    enum umbp_log_level lvl;
    if (umbp_log_level_parse(c->core.log_level, &lvl) == 0) /* the table's choices */
        umbp_log_set_level(lvl);
}

int umbp_server_create(const char *json, struct umbp_server **out, char *err, size_t errlen)
{
    struct umbp_server *s = calloc(1, sizeof(*s));
    int rc;
    if (!s) {
        snprintf(err, errlen, "out of memory for the server");
        return -ENOMEM;
    }
    s->lock_fd = -1;
    s->listener = (struct net_listener)NET_LISTENER_INIT;
    if ((rc = srv_config_parse(json, &s->cfg, err, errlen)) < 0)
        goto fail;
    apply_log_level(s->cfg);
    s->lease_ttl_ms = (uint64_t)s->cfg->core.lease_ttl_ms;
    shm_config_socket_dir(&s->cfg->shm, s->dir, sizeof(s->dir));
    if ((rc = srv_config_socket_path(s->cfg, s->sock_path, sizeof(s->sock_path), err,
                                     errlen)) < 0)
        goto fail;
    if (!(s->loop = ev_loop_new(EVFLAG_AUTO))) {
        snprintf(err, errlen, "cannot create the event loop (libev)");
        rc = -ENOMEM;
        goto fail;
    }
    session_service_init(s);
    if ((rc = srv_listen_open(s, err, errlen)) < 0 ||
        (rc = srv_metrics_start(s, err, errlen)) < 0 || /* a taken port fails before the pool */
        (rc = pool_create(s, err, errlen)) < 0 || (rc = node_create(s, err, errlen)) < 0 ||
        (rc = srv_listen_bind(s, err, errlen)) < 0)
        goto fail;
    watchers_start(s);
    *out = s;
    return 0;
fail:
    umbp_server_destroy(s);
    return rc;
}

int umbp_server_run(struct umbp_server *s)
{
    if (!s->populate_started) /* serving from now on; its log lines come after */
        populate_start(s);
    ev_run(s->loop, 0);
    return 0;
}

void umbp_server_stop(struct umbp_server *s)
{
    if (s)
        ev_async_send(s->loop, &s->stop_w);
}

void umbp_server_destroy(struct umbp_server *s)
{
    if (!s)
        return;
    srv_metrics_stop(s); /* first: its HTTP thread pokes the loop */
    populate_join(s);    /* before the pool goes */
    net_service_close_all(&s->svc, "server shutting down");
    srv_node_destroy(s->node); /* before the store it serves */
    s->node = NULL;
    if (s->loop) {
        srv_listen_close(s, true);
        ev_async_stop(s->loop, &s->stop_w);
        ev_timer_stop(s->loop, &s->tick_w);
        ev_idle_stop(s->loop, &s->evict_w);
        ev_idle_stop(s->loop, &s->poll_w);
        ev_prepare_stop(s->loop, &s->flush_w);
        session_runq_stop(s);
    }
    dram_store_destroy(s->store);
    free(s->events);
    if (s->loop)
        ev_loop_destroy(s->loop);
    srv_config_free(s->cfg);
    free(s);
}

const char *umbp_server_socket_path(const struct umbp_server *s) { return s->sock_path; }

unsigned long long umbp_server_pool_bytes(const struct umbp_server *s)
{
    return (unsigned long long)s->pool->size;
}
