/*
 * rdma_tier.c - the rdma tier: distributed mode's composition.  A local
 * slice (a `dram` child tier, created with env->create_child) holds this
 * node's objects; the node serves them to peers over UCX (net/ucx.h) and
 * tells umbp-master which keys it holds (master/master_client.h, on the
 * runtime's loop); keys the slice lacks are located through the master and
 * fetched from a live owner into the slice.  README.md beside this file
 * and docs/distributed.md describe it; this header is the map.
 *
 * Regions.  Every region is in the slice's pool, so every region is mapped
 * and the runtime (memcpy, the GPU copy engine) moves the bytes as in
 * embedded mode.  A remote object lands in a reservation of the slice:
 * under its own key when it is admitted as a replica (cache_remote_fetches,
 * size <= remote_cache_max_bytes, pool below its high watermark): it is
 * then published, leased like any local object, and the master learns the
 * replica from the STORED event; otherwise under a private key that is
 * never published, handed to the reader as the region and aborted at
 * release (RDMA_TEMP in region.aux[1]).
 *
 * Events.  The slice's STORED and REMOVED events pass through here: each
 * gets the next seq and waits in a queue for the master's ack; the live key
 * set (key -> size) is kept for a RESYNC.  A heartbeat goes every
 * heartbeat_ms, sooner once RDMA_HB_EVENTS events wait.  The master's ack
 * says REGISTER (it does not know us: a restarted master) or RESYNC (a gap);
 * a lost connection means REGISTER again.  Only one master call is in
 * flight for the node side; lookups are the master client's single flight.
 *
 * Reads.  acquire and lookup ask the slice first; the keys it lacks go to
 * the master in one LOCATE (lookup_timeout_ms); each located key is fetched
 * from its first owner that is not this node and not in its failure
 * backoff, one UCX batch per owner (timeout_ms).  A failed fetch leaves a
 * status the runtime understands: -ENOENT (the owner no longer has it, or
 * its size changed), UMBP_E_TIMEOUT (a stalled or cut-off owner: not
 * quarantined), -ECONNRESET (the owner died: quarantined by the runtime for
 * load_failure_quarantine_ms).  An owner that failed is skipped for
 * peer_failure_backoff_ms.  The local reservation is aborted only once UCX
 * has ended the batch (net/ucx.h's bound), so a late reply never lands in
 * reused memory.
 *
 * Serving.  The UCX node's lease_take is the slice's acquire of one key
 * (inline: dram completes its calls inline), lease_release its release.
 * ucx_serve_timeout_ms (< lease_ttl_ms) bounds a send, so a lease never
 * outlives its send.
 *
 * Threads: the runtime's loop thread for every member (create and destroy
 * on the creating thread while the loop does not run).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "auth.h"
#include "options.h"
#include "master_client.h"
#include "proto.h"
#include "rdma.h"
#include "tcp.h"
#include "ucx.h"
#include "ucx_wire.h"
#include "umbp/tier.h"

extern const struct umbp_tier_ops umbp_tier_rdma_ops;

#define RDMA_TEMP 0x726d6154454d5031ull /* region.aux[1] of a private reservation */
#define RDMA_HB_EVENTS 128              /* a heartbeat goes once this many wait */
#define RDMA_EVQ_MAX (1u << 20)         /* queued events past this: resync instead */

/* ---- options ------------------------------------------------------------------------ */

struct rdma_config {
    char master_address[256];
    char secret_file[512];
    char node_host[PROTO_NAME_MAX];
    int64_t heartbeat_ms;
    bool cache_remote_fetches;
    uint64_t remote_cache_max_bytes;
    int64_t peer_failure_backoff_ms;
    int64_t ucx_serve_timeout_ms;
};

#define OFF(f) offsetof(struct rdma_config, f)
static const struct umbp_option rdma_options[] = {
    {"master_address", UMBP_OPT_STRING, OFF(master_address), "", 0, 0, 256, NULL,
     "distributed: umbp-master's host:port (IPv6: [addr]:port), or redis://host:port/<cluster>"
     " (or redis+sentinel://h:p,h:p/<service>/<cluster>; rediss:// and rediss+sentinel:// "
     "over TLS)[?password_file=PATH[&user=NAME]]"
     "[&tls_ca_file=PATH][&tls_cert_file=PATH&tls_key_file=PATH][&tls_server_name=NAME] where several masters "
     "elect a leader (lease_url): the node follows it (required)"},
    {"secret_file", UMBP_OPT_STRING, OFF(secret_file), "", 0, 0, 512, NULL,
     "distributed: file holding the cluster's shared secret (16 .. 4096 bytes, mode 0600), "
     "the same as umbp-master's: it authenticates this node to the master and every fetch "
     "between nodes (no answer to a peer without it); empty = none (a master on loopback "
     "only)"},
    {"node_host", UMBP_OPT_STRING, OFF(node_host), "", 0, 0, PROTO_NAME_MAX, NULL,
     "distributed: this node's name at the master (with its pid and start time, its id); "
     "empty = the hostname"},
    {"heartbeat_ms", UMBP_OPT_INT, OFF(heartbeat_ms), "1000", 20, 10000, 0, NULL,
     "distributed: a node's heartbeat period; its stored/removed events reach the master "
     "within it (sooner every 128 events); keep it below the master's heartbeat_suspect_ms"},
    {"cache_remote_fetches", UMBP_OPT_BOOL, OFF(cache_remote_fetches), "true", 0, 0, 0, NULL,
     "distributed: an object fetched from a peer stays in the local slice as a replica "
     "(published, announced to the master) when it passes remote_cache_max_bytes and the "
     "slice is below its high watermark"},
    {"remote_cache_max_bytes", UMBP_OPT_SIZE, OFF(remote_cache_max_bytes), "64MiB", 1,
     (double)(1ull << 32), 0, NULL,
     "distributed: largest fetched object kept as a replica"},
    {"peer_failure_backoff_ms", UMBP_OPT_INT, OFF(peer_failure_backoff_ms), "3000", 0, 600000,
     0, NULL,
     "distributed: a peer whose fetch failed (reset, timeout) is not fetched from for this "
     "long (its keys miss), so a dead or stalled owner costs one timeout, not one per get"},
    {"ucx_serve_timeout_ms", UMBP_OPT_INT, OFF(ucx_serve_timeout_ms), "10000", 10, 3600000, 0,
     NULL,
     "distributed: a send to a peer still pending this long (the peer stopped) is ended by "
     "closing its endpoint, which frees the lease; at most half of lease_ttl_ms (lowered to "
     "it), so a lease always outlives its send"},
    {.name = NULL},
};
#undef OFF

static int rdma_validate_config(const void *cfgp, const struct umbp_core_config *core, char *err,
                                size_t errlen)
{
    const struct rdma_config *cfg = cfgp;
    (void)core;
    return mclient_check_address(cfg->master_address, cfg->secret_file[0] != 0, err, errlen);
}

/* ---- the live key set: key -> size ------------------------------------------------------ */

struct kslot {
    umbp_key_t key;
    uint64_t size; /* 0: empty; UINT64_MAX: removed (a tombstone) */
};

struct kmap {
    struct kslot *v;
    size_t cap, used, live; /* used: live + tombstones */
};

static struct kslot *kmap_find(struct kmap *m, const umbp_key_t *k, bool for_insert)
{
    if (!m->cap)
        return NULL;
    size_t i = umbp_key_hash(k) & (m->cap - 1);
    struct kslot *tomb = NULL;
    for (;;) {
        struct kslot *s = &m->v[i];
        if (s->size == 0)
            return for_insert ? (tomb ? tomb : s) : NULL;
        if (s->size == UINT64_MAX) {
            if (!tomb)
                tomb = s;
        } else if (memcmp(&s->key, k, sizeof(*k)) == 0) {
            return s;
        }
        i = (i + 1) & (m->cap - 1);
    }
}

static int kmap_grow(struct kmap *m)
{
    size_t cap = m->cap ? m->cap : 1024;
    while ((m->live + 1) * 2 > cap)
        cap *= 2;
    struct kslot *v = calloc(cap, sizeof(*v)), *old = m->v;
    if (!v)
        return -ENOMEM;
    size_t ocap = m->cap;
    m->v = v;
    m->cap = cap;
    m->used = m->live = 0;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].size && old[i].size != UINT64_MAX) {
            *kmap_find(m, &old[i].key, true) = old[i];
            m->used++;
            m->live++;
        }
    free(old);
    return 0;
}

static int kmap_put(struct kmap *m, const umbp_key_t *k, uint64_t size)
{
    if ((m->used + 1) * 4 > m->cap * 3 && kmap_grow(m) < 0)
        return -ENOMEM;
    struct kslot *s = kmap_find(m, k, true);
    if (s->size == 0 || s->size == UINT64_MAX) {
        if (s->size == 0)
            m->used++;
        m->live++;
        s->key = *k;
    }
    s->size = size;
    return 0;
}

static bool kmap_del(struct kmap *m, const umbp_key_t *k)
{
    struct kslot *s = kmap_find(m, k, false);
    if (!s)
        return false;
    s->size = UINT64_MAX;
    m->live--;
    return true;
}

/* ---- the tier ----------------------------------------------------------------------------- */

struct rfetch;

/* A peer's endpoint is warmed up before a real batch goes to it: a FETCH of
 * one key nobody has (answered as a miss) completes UCX's wireup, started
 * as soon as a lookup names the peer, so the batch that follows does not
 * pay the wireup's round trips.  Batches for a cold peer wait in `held`
 * until then; a peer that dies meanwhile fails them all (warm_done).
 * A death during wireup once aborted the process: net/ucx.c closed the
 * endpoint from inside UCX's purge of it; it now closes after the
 * callback (test_ucx_fetch, owner_killed_while_the_endpoint_is_in_wireup). */
#define RDMA_PEER_CACHE 1024

struct rpeer {
    struct rpeer *next;
    struct rdma_tier *rt;
    uint32_t ref;                  /* the master's number; 0: retired */
    /* the node it was made for: refs are the master's, and a new master
     * (a restart, a failover) numbers the nodes afresh */
    uint32_t pid;
    uint64_t start_ns;
    char host[PROTO_NAME_MAX];
    struct ucx_peer *p;
    uint64_t fail_until_ns;
    unsigned inflight;             /* batches, held ones and the warm-up */
    bool named;                    /* its transport was logged */
    bool warm, warming;
    struct rfetch *held;           /* batches waiting for the warm-up */
    struct ucx_fetch_item warm_item;
    uint8_t warm_buf[8];
};

struct rdma_tier {
    struct umbp_tier base;
    struct rdma_config cfg;
    struct umbp_tier *local;       /* the dram slice */
    struct umbp_tier_env child_env;
    struct ucx_node *ucx;
    struct ucx_serve_ops serve;    /* the slice's leases, for peers */
    struct mclient *mc;
    struct net_auth_key key;
    bool have_key, stopped;
    char engine_id[PROTO_NAME_MAX];
    struct proto_register reg;     /* our id and worker address */
    /* the node side */
    struct kmap live;
    struct proto_node_event *evq;  /* events after `acked`, in seq order */
    size_t evq_n, evq_cap;
    uint64_t seq, acked;           /* the last event's seq; the last the master applied */
    bool registered, need_resync, busy;
    size_t hb_events;              /* events in the heartbeat in flight */
    umbp_key_t *snap_keys;         /* a RESYNC in flight: its snapshot */
    uint64_t *snap_sizes, snap_seq;
    uint32_t self_ref;
    ev_timer hb, kick;
    /* publish in progress: sizes of STORED events, by the cursor */
    struct umbp_tier_req *const *pub_reqs;
    size_t pub_n, pub_at;
    /* reads */
    struct rpeer *peers;
    /* peer_of's first look: direct-mapped by ref (a hit is checked against
     * the ref and the node); the list stays the owner of every peer */
    struct rpeer *peer_cache[RDMA_PEER_CACHE];
    uint64_t temp_ctr;
    uint64_t pruned_ns;            /* the last peers_prune */
    /* counters */
    uint64_t remote_hits, remote_misses, remote_failed, remote_bytes, replicas, locates;
    uint64_t remote_retries, retry_logged_ns;
    uint64_t heartbeats, resyncs, registers, reports;
};

static struct rdma_tier *to_rdma(struct umbp_tier *t)
{
    return umbp_container_of(t, struct rdma_tier, base);
}

static uint64_t ms_ns(int64_t ms) { return (uint64_t)ms * 1000000ull; }

/* ---- what the slice reports --------------------------------------------------------------- */

static void ev_push(struct rdma_tier *rt, uint32_t kind, const umbp_key_t *k, uint64_t size)
{
    if (rt->need_resync)
        return; /* the snapshot will carry it */
    if (rt->evq_n == rt->evq_cap) {
        size_t cap = rt->evq_cap ? rt->evq_cap * 2 : 256;
        struct proto_node_event *q;
        if (cap > RDMA_EVQ_MAX || !(q = realloc(rt->evq, cap * sizeof(*q)))) {
            /* too far behind the master: send the whole set instead */
            rt->evq_n = 0;
            rt->need_resync = true;
            return;
        }
        rt->evq = q;
        rt->evq_cap = cap;
    }
    rt->evq[rt->evq_n++] = (struct proto_node_event){.seq = rt->seq, .kind = kind, .key = *k,
                                                     .size = size};
    if (rt->evq_n - rt->hb_events >= RDMA_HB_EVENTS && !rt->busy && !ev_is_active(&rt->kick))
        ev_timer_start(rt->base.env.loop, &rt->kick);
}

/* The size of key k being published: the publish batch's req, found from a
 * cursor (the slice emits in request order). */
static uint64_t pub_size(struct rdma_tier *rt, const umbp_key_t *k)
{
    for (size_t i = 0; i < rt->pub_n; i++) {
        size_t j = (rt->pub_at + i) % rt->pub_n;
        if (memcmp(&rt->pub_reqs[j]->key, k, sizeof(*k)) == 0) {
            rt->pub_at = j + 1;
            return rt->pub_reqs[j]->region.size ? rt->pub_reqs[j]->region.size
                                                : rt->pub_reqs[j]->size;
        }
    }
    return 0;
}

static void slice_event(struct rdma_tier *rt, umbp_event_type_t type, const umbp_key_t *k,
                        uint64_t size)
{
    if (type == UMBP_EVENT_STORED) {
        if (size && kmap_put(&rt->live, k, size) == 0) {
            rt->seq++;
            ev_push(rt, PROTO_NODE_STORED, k, size);
        }
    } else if (type == UMBP_EVENT_REMOVED) {
        if (kmap_del(&rt->live, k)) {
            rt->seq++;
            ev_push(rt, PROTO_NODE_REMOVED, k, 0);
        }
    }
    if (rt->base.env.emit_event)
        rt->base.env.emit_event(rt->base.env.ctx, type, k);
}

static void child_event(void *ctx, umbp_event_type_t type, const umbp_key_t *k)
{
    struct rdma_tier *rt = ctx;
    slice_event(rt, type, k, type == UMBP_EVENT_STORED ? pub_size(rt, k) : 0);
}

void umbp_rdma_stats(struct umbp_tier *t, struct umbp_rdma_stats *out)
{
    struct rdma_tier *rt = to_rdma(t);
    *out = (struct umbp_rdma_stats){
        .remote_hits = rt->remote_hits, .remote_misses = rt->remote_misses,
        .remote_failed = rt->remote_failed, .remote_bytes = rt->remote_bytes,
        .remote_retries = rt->remote_retries,
        .replicas = rt->replicas, .locates = rt->locates, .heartbeats = rt->heartbeats,
        .resyncs = rt->resyncs, .registers = rt->registers, .reports = rt->reports,
        .live_keys = rt->live.live, .node_ref = rt->self_ref, .registered = rt->registered,
        .transports = rt->ucx ? ucx_node_transports(rt->ucx) : "",
    };
    if (rt->ucx) {
        struct ucx_node_stats u;
        ucx_node_stats(rt->ucx, &u);
        out->data_eager = u.data_eager;
        out->data_rndv = u.data_rndv;
        out->served_keys = u.served_keys;
        out->served_bytes = u.served_bytes;
    }
}

void umbp_rdma_slice_event(struct umbp_tier *t, umbp_event_type_t type, const umbp_key_t *k,
                           uint64_t size)
{
    slice_event(to_rdma(t), type, k, size);
}

static void child_events_lost(void *ctx, uint64_t n)
{
    struct rdma_tier *rt = ctx;
    if (rt->base.env.events_lost)
        rt->base.env.events_lost(rt->base.env.ctx, n);
}

static void child_space_freed(void *ctx)
{
    struct rdma_tier *rt = ctx;
    if (rt->base.env.space_freed)
        rt->base.env.space_freed(rt->base.env.ctx);
}

static void child_mapping_changed(void *ctx)
{
    struct rdma_tier *rt = ctx;
    if (rt->base.env.mapping_changed)
        rt->base.env.mapping_changed(rt->base.env.ctx);
}

static void child_regions_revoked(void *ctx)
{
    struct rdma_tier *rt = ctx;
    if (rt->base.env.regions_revoked)
        rt->base.env.regions_revoked(rt->base.env.ctx);
}

/* ---- the node side: REGISTER, HEARTBEAT, RESYNC ------------------------------------------ */

static void node_tick(struct rdma_tier *rt);

static uint64_t used_bytes(struct rdma_tier *rt)
{
    struct umbp_tier_usage u = {0};
    if (rt->local->ops->usage)
        rt->local->ops->usage(rt->local, &u);
    return u.used_bytes;
}

/* The master applied every event up to seq. */
static void drop_acked(struct rdma_tier *rt, uint64_t seq)
{
    size_t k = 0;
    while (k < rt->evq_n && rt->evq[k].seq <= seq)
        k++;
    if (k && k < rt->evq_n)
        memmove(rt->evq, rt->evq + k, (rt->evq_n - k) * sizeof(*rt->evq));
    rt->evq_n -= k;
    if (seq > rt->acked)
        rt->acked = seq;
}

static void take_ack(struct rdma_tier *rt, int status, const struct proto_ack *a)
{
    rt->busy = false;
    rt->hb_events = 0;
    if (status < 0 || !a) {
        rt->registered = false; /* a new connection starts with REGISTER */
        if (status != UMBP_E_NOT_ATTEMPTED)
            umbp_log(UMBP_LOG_DEBUG, "rdma: the master did not answer: %s (%s)",
                     umbp_strerror(status), mclient_last_error(rt->mc));
        return;
    }
    switch (a->action) {
    case PROTO_ACK_REGISTER:
        rt->registered = false;
        break;
    case PROTO_ACK_RESYNC:
        rt->need_resync = true;
        rt->evq_n = 0;
        break;
    default:
        drop_acked(rt, a->seq);
        break;
    }
}

static void on_registered(void *arg, int status, const struct proto_ack *a)
{
    struct rdma_tier *rt = arg;
    if (status == 0 && a) {
        rt->registered = true;
        rt->self_ref = a->node_ref;
        rt->registers++;
        umbp_log(UMBP_LOG_INFO, "rdma: registered with the master at %s as node %u (%s pid %u)",
                 rt->cfg.master_address, a->node_ref, rt->reg.host, rt->reg.pid);
    }
    take_ack(rt, status, a);
    if (rt->registered && !rt->stopped)
        node_tick(rt); /* a resync, or the events, now */
}

static void on_resynced(void *arg, int status, const struct proto_ack *a)
{
    struct rdma_tier *rt = arg;
    uint64_t snap = rt->snap_seq;
    free(rt->snap_keys);
    free(rt->snap_sizes);
    rt->snap_keys = NULL;
    rt->snap_sizes = NULL;
    bool ok = status == 0 && a && a->action == PROTO_ACK_OK;
    take_ack(rt, status, a);
    if (ok) {
        rt->resyncs++;
        drop_acked(rt, snap); /* events after the snapshot stay queued */
        if (!rt->stopped)
            node_tick(rt);
    } else {
        rt->need_resync = true; /* again, once registered */
        rt->evq_n = 0;
    }
}

static void on_heartbeat(void *arg, int status, const struct proto_ack *a)
{
    struct rdma_tier *rt = arg;
    if (status == 0)
        rt->heartbeats++;
    take_ack(rt, status, a);
    if (!rt->stopped && rt->evq_n >= RDMA_HB_EVENTS)
        node_tick(rt);
}

static int send_resync(struct rdma_tier *rt)
{
    size_t n = rt->live.live, k = 0;
    rt->snap_keys = malloc((n ? n : 1) * sizeof(*rt->snap_keys));
    rt->snap_sizes = malloc((n ? n : 1) * sizeof(*rt->snap_sizes));
    if (!rt->snap_keys || !rt->snap_sizes) {
        free(rt->snap_keys);
        free(rt->snap_sizes);
        rt->snap_keys = NULL;
        rt->snap_sizes = NULL;
        return -ENOMEM;
    }
    for (size_t i = 0; i < rt->live.cap; i++)
        if (rt->live.v[i].size && rt->live.v[i].size != UINT64_MAX) {
            rt->snap_keys[k] = rt->live.v[i].key;
            rt->snap_sizes[k++] = rt->live.v[i].size;
        }
    rt->snap_seq = rt->seq;
    rt->evq_n = 0; /* the snapshot carries them */
    int rc = mclient_resync_async(rt->mc, rt->snap_seq, used_bytes(rt), rt->snap_keys,
                                  rt->snap_sizes, k, 0, on_resynced, rt);
    if (rc == 0) /* events from now on queue behind the snapshot */
        rt->need_resync = false;
    return rc;
}

static void node_tick(struct rdma_tier *rt)
{
    if (rt->stopped || rt->busy || !mclient_connected(rt->mc))
        return;
    int rc;
    if (!rt->registered) {
        rt->reg.used_bytes = used_bytes(rt);
        rt->reg.seq = rt->need_resync ? 0 : rt->seq;
        rc = mclient_register_async(rt->mc, &rt->reg, on_registered, rt);
    } else if (rt->need_resync) {
        rc = send_resync(rt);
        if (rc < 0 && rt->snap_keys) {
            free(rt->snap_keys);
            free(rt->snap_sizes);
            rt->snap_keys = NULL;
            rt->snap_sizes = NULL;
        }
    } else {
        size_t n = rt->evq_n < PROTO_MAX_RECORDS - 2 ? rt->evq_n : PROTO_MAX_RECORDS - 2;
        uint64_t last = n ? rt->evq[n - 1].seq : rt->acked;
        rt->hb_events = n;
        rc = mclient_heartbeat_async(rt->mc, last, used_bytes(rt), rt->evq, n, on_heartbeat, rt);
        if (rc < 0)
            rt->hb_events = 0;
    }
    if (rc == 0)
        rt->busy = true;
}

static void on_hb_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop, (void)revents;
    node_tick(w->data);
}

static void on_kick(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop, (void)revents;
    node_tick(w->data);
}

static void master_up(void *arg)
{
    struct rdma_tier *rt = arg;
    umbp_log(UMBP_LOG_INFO, "rdma: connected to the master at %s", rt->cfg.master_address);
    rt->registered = false;
    node_tick(rt);
}

static void master_down(void *arg, const char *why)
{
    struct rdma_tier *rt = arg;
    umbp_log(UMBP_LOG_WARN, "rdma: the master at %s: %s (remote keys miss until it is back)",
             rt->cfg.master_address, why);
    rt->registered = false;
}

/* ---- peers ---------------------------------------------------------------------------------- */

static bool same_node(const struct rpeer *p, const struct proto_node_info *ni)
{
    return p->pid == ni->pid && p->start_ns == ni->start_ns && !strcmp(p->host, ni->host);
}

/* The endpoint to node ref as the master numbers it now.  A new master (a
 * restart, a failover) numbers the nodes afresh: an endpoint made for
 * another node under this ref is retired (ref 0: matched by no number,
 * freed by peers_prune once idle, unless its node shows up under another
 * number), and the endpoint already made to this node under another number
 * is renumbered and kept.  A second endpoint to the same peer, and the
 * force-close of the first, left the peer's next fetch back to this node
 * timing out or reset (UCX pairs the two sides' endpoints): its keys
 * missed for peer_failure_backoff_ms, again and again. */
static struct rpeer *peer_of(struct rdma_tier *rt, uint32_t ref)
{
    const struct proto_node_info *ni = mclient_node(rt->mc, ref);
    struct rpeer **slot = &rt->peer_cache[ref % RDMA_PEER_CACHE];
    if (*slot && (*slot)->ref == ref && ni && same_node(*slot, ni))
        return *slot;
    for (struct rpeer *p = rt->peers; p; p = p->next) {
        if (p->ref != ref)
            continue;
        if (ni && same_node(p, ni))
            return *slot = p;
        p->ref = 0;
        break;
    }
    if (!ni || !ni->addr_len)
        return NULL;
    for (struct rpeer *p = rt->peers; p; p = p->next) {
        if (same_node(p, ni)) {
            p->ref = ref;
            return *slot = p;
        }
    }
    struct rpeer *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    if (ucx_peer_create(rt->ucx, ni->addr, ni->addr_len, &p->p) < 0) {
        umbp_log(UMBP_LOG_WARN, "rdma: no endpoint to node %u (%s pid %u): %s", ref, ni->host,
                 ni->pid, umbp_last_error());
        free(p);
        return NULL;
    }
    p->ref = ref;
    p->pid = ni->pid;
    p->start_ns = ni->start_ns;
    snprintf(p->host, sizeof(p->host), "%s", ni->host);
    p->rt = rt;
    p->next = rt->peers;
    rt->peers = p;
    return *slot = p;
}

/* p failed (reset or timeout): skip it for peer_failure_backoff_ms, and tell
 * the master, so that other readers skip it too until its next heartbeat
 * (a node that is alive after all sends one within its heartbeat_ms). */
static void peer_failed(struct rdma_tier *rt, struct rpeer *p)
{
    if (rt->stopped)
        return;
    uint64_t now = umbp_now_ns();
    bool news = now >= p->fail_until_ns;
    p->fail_until_ns = now + ms_ns(rt->cfg.peer_failure_backoff_ms);
    if (news && p->ref && rt->registered && mclient_suspect(rt->mc, &p->ref, 1) == 0) {
        rt->reports++;
        umbp_log(UMBP_LOG_INFO, "rdma: reported node %u to the master as failing", p->ref);
    }
}

/* UCX reported the endpoint to up failed, perhaps with nothing in flight
 * (the ucx node's idle watcher): the peer fails as after a reset, so it is
 * skipped and reported, and no read makes a new endpoint to a dead peer
 * meanwhile (each would cost a refused connect). */
static void on_peer_failed(void *arg, struct ucx_peer *up)
{
    struct rdma_tier *rt = arg;
    for (struct rpeer *p = rt->peers; p; p = p->next)
        if (p->p == up) {
            peer_failed(rt, p);
            return;
        }
}

/* Endpoints to nodes the master no longer lists, with nothing in flight. */
/* p's node is in the master's list under a number p does not have (it was
 * renumbered): keep p for peer_of to renumber. */
static bool listed_elsewhere(struct rdma_tier *rt, const struct rpeer *p)
{
    const struct proto_node_info *list;
    size_t n = mclient_node_list(rt->mc, &list);
    for (size_t i = 0; i < n; i++)
        if (list[i].ref != p->ref && same_node(p, &list[i]))
            return true;
    return false;
}

static void peers_prune(struct rdma_tier *rt)
{
    for (struct rpeer **pp = &rt->peers; *pp;) {
        struct rpeer *p = *pp;
        const struct proto_node_info *ni = p->ref ? mclient_node(rt->mc, p->ref) : NULL;
        if (!p->inflight && (!ni || !same_node(p, ni)) && !listed_elsewhere(rt, p)) {
            *pp = p->next;
            for (size_t i = 0; i < RDMA_PEER_CACHE; i++) /* at most once a second */
                if (rt->peer_cache[i] == p)
                    rt->peer_cache[i] = NULL;
            ucx_peer_destroy(p->p);
            free(p);
        } else {
            pp = &p->next;
        }
    }
}

/* ---- reads: the slice first, then the master and a peer ----------------------------------- */

struct rread;

struct rfetch {
    struct rread *rr;
    struct rpeer *peer;
    struct rfetch *held_next;    /* the peer's held batches */
    struct ucx_fetch_item *items;
    struct umbp_tier_req **reqs; /* the caller's, per item */
    uint64_t *temp;              /* 0, or the private key's number */
    size_t *mi;                  /* per item: its index in the read's misses */
    uint32_t timeout_ms;         /* the batch's bound (a later round: what is left) */
    uint32_t n;
};

struct rread {
    struct rdma_tier *rt;
    uint64_t t0_ns, located_ns;     /* for the debug log */
    bool lookup;
    struct umbp_tier_req *const *all;
    size_t nall;
    uint8_t *present;               /* lookup's */
    uint64_t ttl_ms;
    umbp_tier_done_fn done;
    void *arg;
    struct umbp_tier_req **miss;    /* the keys the slice lacks */
    umbp_key_t *keys;
    struct proto_location *locs;
    size_t nmiss;
    size_t *miss_idx;               /* lookup: index in all */
    struct rfetch *fetches;
    size_t nfetch, fetch_left;
    /* Another owner: a key whose fetch failed at once (the owner reset, or
     * no longer has it) is fetched again from an owner not tried yet, in a
     * round of its own once every batch of this one has ended. */
    uint8_t *tried;                 /* per miss: the replicas asked (bit r: refs[r]) */
    uint8_t *again;                 /* per miss: to be asked again */
    uint8_t *outcome;               /* per miss: its counter so far (OUT_*), so a key
                                       counts once, as its last owner answered */
    size_t nagain;
    unsigned round;                 /* 0: the first */
    uint64_t deadline_ns;           /* no round starts past it; a later one's batches
                                       and warm-ups end by it (the bound umbp-server
                                       announces: 2 x lookup_timeout_ms + 2 x timeout_ms) */
};

enum { OUT_NONE, OUT_MISS, OUT_FAILED };

/* Key i's outcome is now o (OUT_*; a hit: OUT_NONE after remote_hits++):
 * the counter of its previous outcome, if any, gives it back. */
static void count_outcome(struct rread *rr, size_t i, uint8_t o)
{
    struct rdma_tier *rt = rr->rt;
    if (rr->outcome[i] == OUT_MISS)
        rt->remote_misses--;
    else if (rr->outcome[i] == OUT_FAILED)
        rt->remote_failed--;
    if (o == OUT_MISS)
        rt->remote_misses++;
    else if (o == OUT_FAILED)
        rt->remote_failed++;
    rr->outcome[i] = o;
}

/* The batches of a round, once each has ended (UCX is done with them). */
static void fetches_free(struct rread *rr)
{
    for (size_t i = 0; i < rr->nfetch; i++) {
        free(rr->fetches[i].items);
        free(rr->fetches[i].reqs);
        free(rr->fetches[i].temp);
        free(rr->fetches[i].mi);
    }
    rr->nfetch = 0;
}

static void rread_free(struct rread *rr)
{
    fetches_free(rr);
    free(rr->fetches);
    free(rr->tried);
    free(rr->again);
    free(rr->outcome);
    free(rr->miss);
    free(rr->keys);
    free(rr->locs);
    free(rr->miss_idx);
    free(rr);
}

static void rread_finish(struct rread *rr)
{
    if (rr->located_ns && !rr->lookup)
        umbp_log(UMBP_LOG_DEBUG, "rdma: %zu keys not in the slice: located in %.3f ms, fetched "
                 "in %.3f ms", rr->nmiss, (double)(rr->located_ns - rr->t0_ns) / 1e6,
                 (double)(umbp_now_ns() - rr->located_ns) / 1e6);
    umbp_tier_done_fn done = rr->done;
    void *arg = rr->arg;
    rread_free(rr);
    done(arg, 0);
}

static void inline_done(void *arg, int rc)
{
    int *p = arg;
    *p = rc;
}

/* The first owner of loc worth asking that is not in the mask tried (bit
 * r: refs[r]), or NULL; *which = its r. */
static struct rpeer *owner_of(struct rdma_tier *rt, const struct proto_location *loc,
                              uint64_t now, unsigned tried, unsigned *which)
{
    for (uint32_t r = 0; r < loc->nrep && r < PROTO_MAX_REPLICAS; r++) {
        if ((tried >> r) & 1 || (loc->refs[r] == rt->self_ref && rt->self_ref))
            continue;
        struct rpeer *p = peer_of(rt, loc->refs[r]);
        if (p && now >= p->fail_until_ns) {
            if (which)
                *which = r;
            return p;
        }
    }
    return NULL;
}

/* The private key number ctr of this node: a reservation that is never
 * published (no engine key has this prefix: engine keys are hashes, and a
 * collision would cost a miss, never wrong bytes: the key is never looked
 * up). */
static void temp_key(const struct rdma_tier *rt, uint64_t ctr, umbp_key_t *k)
{
    memset(k, 0, sizeof(*k));
    memcpy(k->bytes, "umbp-rdma-tmp", 13);
    memcpy(k->bytes + 16, &ctr, sizeof(ctr));
    memcpy(k->bytes + 24, &rt->reg.start_ns, sizeof(rt->reg.start_ns));
}

/* Drops q's reservation in the slice (under its private key temp, if not
 * 0); the req keeps its key. */
static void give_back(struct rdma_tier *rt, struct umbp_tier_req *q, uint64_t temp)
{
    struct umbp_tier_req *one = q;
    umbp_key_t real = q->key;
    if (temp)
        temp_key(rt, temp, &q->key);
    rt->local->ops->abort(rt->local, &one, 1);
    q->key = real;
    q->region = (struct umbp_region){0};
}

static bool admit_replica(struct rdma_tier *rt, uint64_t size)
{
    if (!rt->cfg.cache_remote_fetches || size > rt->cfg.remote_cache_max_bytes)
        return false;
    struct umbp_tier_usage u = {0};
    if (rt->local->ops->usage)
        rt->local->ops->usage(rt->local, &u);
    return !u.high_watermark_bytes || u.used_bytes + size <= u.high_watermark_bytes;
}

static void round_over(struct rread *rr);

static void fetch_done(void *arg, struct ucx_fetch_item *items, uint32_t n)
{
    struct rfetch *f = arg;
    struct rread *rr = f->rr;
    struct rdma_tier *rt = rr->rt;
    struct umbp_tier *loc = rt->local;
    bool failed_peer = false;
    f->peer->inflight--;
    if (!f->peer->named && f->peer->p) {
        f->peer->named = true;
        umbp_log(UMBP_LOG_INFO, "rdma: fetching from node %u over %s", f->peer->ref,
                 ucx_peer_transport(f->peer->p));
    }
    for (uint32_t i = 0; i < n; i++) {
        struct umbp_tier_req *q = f->reqs[i];
        int st = items[i].status;
        size_t mi = f->mi[i];
        /* another owner is worth asking at once when this one reset, or
         * says it no longer has the key (evicted since its heartbeat); not
         * after a timeout (it has cost timeout_ms), nor for a size the
         * master has wrong (every replica has the same) */
        bool ask_again = st == -ECONNRESET || st == -ENOENT || st == -EACCES;
        if (st == -EACCES)
            st = -ENOENT; /* refused (a secret that differs): a miss for the caller */
        if (st == 0 && items[i].size != q->region.size)
            st = -ENOENT; /* the master's size was stale: not this object */
        if (st == -ECONNRESET || st == UMBP_E_TIMEOUT)
            failed_peer = true;
        if (st != 0) {
            give_back(rt, q, f->temp[i]);
            if (rt->stopped)
                st = UMBP_E_NOT_ATTEMPTED;
            else if (st == -EMSGSIZE || st == -EPROTO)
                st = -ENOENT;
            q->status = st; /* unless another owner has it (round_over) */
            if (ask_again && !rt->stopped && !rr->again[mi]) {
                rr->again[mi] = 1;
                rr->nagain++;
            }
            count_outcome(rr, mi, st == -ENOENT ? OUT_MISS : OUT_FAILED);
            continue;
        }
        rt->remote_hits++;
        count_outcome(rr, mi, OUT_NONE);
        rt->remote_bytes += items[i].size;
        if (f->temp[i]) { /* the reservation is the reader's region until release */
            q->region.aux[0] = f->temp[i];
            q->region.aux[1] = RDMA_TEMP;
            q->status = 0;
            continue;
        }
        /* a replica: publish, then lease it like any local object */
        struct umbp_tier_req *one = q;
        int rc = 1;
        q->status = 0;
        rt->pub_reqs = &f->reqs[i];
        rt->pub_n = 1;
        rt->pub_at = 0;
        loc->ops->publish(loc, &one, 1, inline_done, &rc);
        rt->pub_n = 0;
        if (rc == 1 || q->status != 0) {
            q->status = rc == 1 ? -EIO : (q->status ? q->status : -EIO);
            continue;
        }
        rt->replicas++;
        rc = 1;
        loc->ops->acquire(loc, &one, 1, rr->ttl_ms, inline_done, &rc);
        if (rc == 1)
            q->status = -EIO;
    }
    if (failed_peer)
        peer_failed(rt, f->peer);
    if (--rr->fetch_left == 0)
        round_over(rr);
}

/* f could not be sent: its reservations go back, its keys miss. */
static void fetch_not_sent(struct rfetch *f)
{
    struct rread *rr = f->rr;
    for (uint32_t i = 0; i < f->n; i++) {
        give_back(rr->rt, f->reqs[i], f->temp[i]);
        f->reqs[i]->status = -ENOENT;
    }
    f->peer->inflight--;
    if (--rr->fetch_left == 0)
        round_over(rr);
}

static void fail_fetch(struct rfetch *f, int status);

/* An endpoint that cannot be made (the peer refuses: it died, and UCX
 * closed the old endpoint) is the peer failing, as a reset is: the batch
 * fails like one, so the peer is skipped and reported to the master. */
static void send_fetch(struct rfetch *f)
{
    struct rdma_tier *rt = f->rr->rt;
    int rc = rt->stopped ? UMBP_E_NOT_ATTEMPTED
                         : ucx_fetch(f->peer->p, f->items, f->n, f->timeout_ms, fetch_done, f);
    if (rc == -ECONNREFUSED)
        fail_fetch(f, -ECONNRESET);
    else if (rc < 0)
        fetch_not_sent(f);
}

/* The warm-up failed (the peer is dead or unreachable): every held batch
 * ends with its status, as if UCX had failed it. */
static void fail_fetch(struct rfetch *f, int status)
{
    for (uint32_t i = 0; i < f->n; i++)
        f->items[i].status = status;
    fetch_done(f, f->items, f->n);
}

static void warm_done(void *arg, struct ucx_fetch_item *it, uint32_t n)
{
    struct rpeer *p = arg;
    struct rdma_tier *rt = p->rt;
    int st = n ? it[0].status : -EPROTO;
    /* -EACCES: the peer refused our mac (its secret differs), or a forger
     * said so; either way the endpoint works, its batches' keys fail alone
     * (asked of another owner), and nothing is reported to the master */
    bool ok = !rt->stopped && (st == 0 || st == -ENOENT || st == -EMSGSIZE || st == -EACCES);
    p->warming = false;
    p->inflight--;
    if (ok)
        p->warm = true;
    else
        peer_failed(rt, p);
    /* the batches held so far: one of them may end its read's round, whose
     * next round may hold new batches on p (and warm it up again) */
    struct rfetch *held = p->held;
    p->held = NULL;
    while (held) {
        struct rfetch *f = held;
        held = f->held_next;
        if (ok)
            send_fetch(f);
        else
            fail_fetch(f, rt->stopped ? UMBP_E_NOT_ATTEMPTED
                          : st == UMBP_E_TIMEOUT ? UMBP_E_TIMEOUT : -ECONNRESET);
    }
}

static void warm_up(struct rpeer *p, uint32_t timeout_ms)
{
    memset(&p->warm_item, 0, sizeof(p->warm_item)); /* the zero key: nobody's */
    p->warm_item.dst = p->warm_buf;
    p->warm_item.cap = sizeof(p->warm_buf);
    p->warming = true;
    p->inflight++;
    if (ucx_fetch(p->p, &p->warm_item, 1, timeout_ms, warm_done, p) < 0) {
        p->warm_item.status = -ECONNRESET;
        warm_done(p, &p->warm_item, 1);
    }
}

/* Reserves a slice region per located key and sends one batch per owner. */
static void start_fetches(struct rread *rr)
{
    struct rdma_tier *rt = rr->rt;
    struct umbp_tier *loc = rt->local;
    uint64_t now = umbp_now_ns();
    struct rpeer **owner = calloc(rr->nmiss ? rr->nmiss : 1, sizeof(*owner));
    size_t retries = 0;
    /* a key that gets no batch: a miss in the first round; in a later one
     * it keeps the outcome its last owner gave it */
    uint8_t missed = rr->round ? 0 : OUT_MISS;
    if (!owner) {
        rread_finish(rr);
        return;
    }
    /* group by owner: one batch per owner and UCX_FETCH_MAX_KEYS keys; a
     * later round asks again only the keys marked, at an owner not asked
     * (a key with none left keeps the status its last fetch gave it) */
    for (size_t i = 0; i < rr->nmiss; i++) {
        if (rr->round && !rr->again[i])
            continue;
        rr->again[i] = 0;
        if (rr->locs[i].nrep == 0 || rr->locs[i].size == 0 ||
            rr->locs[i].size > UCX_OBJ_MAX) {
            count_outcome(rr, i, OUT_MISS);
            continue;
        }
        unsigned r = 0;
        owner[i] = owner_of(rt, &rr->locs[i], now, rr->tried[i], &r);
        if (owner[i])
            rr->tried[i] |= (uint8_t)(1u << r);
        else if (missed)
            count_outcome(rr, i, missed);
    }
    size_t cap = 0;
    for (size_t i = 0; i < rr->nmiss; i++) {
        if (!owner[i])
            continue;
        struct rfetch *f = NULL;
        for (size_t g = 0; g < rr->nfetch && !f; g++)
            if (rr->fetches[g].peer == owner[i] && rr->fetches[g].n < UCX_FETCH_MAX_KEYS)
                f = &rr->fetches[g];
        if (!f) { /* a new batch (nothing points into the array before the sends) */
            if (rr->nfetch == cap) {
                size_t ncap = cap ? 2 * cap : 4;
                struct rfetch *a = realloc(rr->fetches, ncap * sizeof(*a));
                if (!a) {
                    if (missed)
                        count_outcome(rr, i, missed);
                    continue;
                }
                memset(a + cap, 0, (ncap - cap) * sizeof(*a));
                rr->fetches = a;
                cap = ncap;
            }
            f = &rr->fetches[rr->nfetch];
            f->rr = rr;
            f->peer = owner[i];
            f->items = calloc(UCX_FETCH_MAX_KEYS, sizeof(*f->items));
            f->reqs = calloc(UCX_FETCH_MAX_KEYS, sizeof(*f->reqs));
            f->temp = calloc(UCX_FETCH_MAX_KEYS, sizeof(*f->temp));
            f->mi = calloc(UCX_FETCH_MAX_KEYS, sizeof(*f->mi));
            if (!f->items || !f->reqs || !f->temp || !f->mi) { /* this key misses */
                free(f->items);
                free(f->reqs);
                free(f->temp);
                free(f->mi);
                memset(f, 0, sizeof(*f));
                if (missed)
                    count_outcome(rr, i, missed);
                continue;
            }
            rr->nfetch++;
        }
        struct umbp_tier_req *q = rr->miss[i];
        uint64_t size = rr->locs[i].size;
        uint64_t temp = admit_replica(rt, size) ? 0 : ++rt->temp_ctr;
        umbp_key_t real = q->key;
        struct umbp_tier_req r = {.key = real, .size = size};
        if (temp)
            temp_key(rt, temp, &r.key);
        struct umbp_tier_req *one = &r;
        int rc = 1;
        loc->ops->reserve(loc, &one, 1, inline_done, &rc);
        if (rc == 1 || r.status != 0) {
            /* no room now, or a put of the same key under way: a miss */
            if (rc == 1)
                umbp_log(UMBP_LOG_ERROR, "rdma: the local slice did not reserve inline");
            if (missed)
                count_outcome(rr, i, missed);
            continue;
        }
        retries += rr->round > 0;
        q->size = size;
        q->region = r.region;
        q->status = -ENOENT; /* until the bytes are in */
        f->items[f->n] = (struct ucx_fetch_item){.key = real, .dst = r.region.addr,
                                                 .cap = size};
        f->reqs[f->n] = q;
        f->temp[f->n] = temp;
        f->mi[f->n] = i;
        f->n++;
    }
    free(owner);
    rt->remote_retries += retries;
    if (retries && now - rt->retry_logged_ns > 10000000000ull) {
        rt->retry_logged_ns = now;
        umbp_log(UMBP_LOG_INFO, "rdma: %zu keys whose fetch failed at once asked again at "
                 "another owner (%llu so far; logged at most every 10 s)", retries,
                 (unsigned long long)rt->remote_retries);
    }
    /* the first round's batches (and warm-ups) have timeout_ms each; a later
     * round's share what is left until the read's deadline */
    uint64_t t = (uint64_t)rt->base.env.core->timeout_ms;
    uint64_t left_ms = rr->deadline_ns > now ? (rr->deadline_ns - now) / 1000000ull : 0;
    rr->fetch_left = rr->nfetch + 1; /* +1: ours, so no batch finishes us early */
    for (size_t g = 0; g < rr->nfetch; g++) {
        struct rfetch *f = &rr->fetches[g];
        if (!f->n) {
            rr->fetch_left--;
            continue;
        }
        uint64_t bound = !rr->round ? t : f->peer->warm ? left_ms : left_ms / 2;
        f->timeout_ms = (uint32_t)(bound < 1 ? 1 : bound > t ? t : bound);
        umbp_log(UMBP_LOG_DEBUG, "rdma: asking node %u for %u keys (round %u, %u ms)",
                 f->peer->ref, f->n, rr->round, f->timeout_ms);
        f->peer->inflight++;
        if (f->peer->warm) {
            send_fetch(f);
            continue;
        }
        f->held_next = f->peer->held; /* until the endpoint is warm */
        f->peer->held = f;
        if (!f->peer->warming)
            warm_up(f->peer, f->timeout_ms);
    }
    if (--rr->fetch_left == 0)
        round_over(rr);
}

/* Every batch of a round has ended (their reservations given back or
 * published): keys marked again go to another owner, at most one round
 * per replica a LOCATE can name; else the read is done. */
static void round_over(struct rread *rr)
{
    if (!rr->nagain || rr->rt->stopped || rr->round + 1 >= PROTO_MAX_REPLICAS ||
        umbp_now_ns() + 1000000ull >= rr->deadline_ns) {
        rread_finish(rr);
        return;
    }
    fetches_free(rr);
    rr->nagain = 0;
    rr->round++;
    start_fetches(rr);
}

static void on_located(void *arg, int status, const struct proto_ack *a)
{
    struct rread *rr = arg;
    struct rdma_tier *rt = rr->rt;
    (void)a;
    rr->located_ns = umbp_now_ns();
    if (status < 0 || rt->stopped) {
        rt->remote_misses += rr->nmiss;
        rread_finish(rr);
        return;
    }
    if (umbp_now_ns() - rt->pruned_ns > 1000000000ull) { /* O(peers x nodes): once a second */
        rt->pruned_ns = umbp_now_ns();
        peers_prune(rt);
    }
    if (rr->lookup) {
        uint64_t now = umbp_now_ns();
        for (size_t i = 0; i < rr->nmiss; i++) {
            struct rpeer *p = rr->locs[i].nrep ? owner_of(rt, &rr->locs[i], now, 0, NULL)
                                               : NULL;
            if (!p)
                continue;
            rr->present[rr->miss_idx[i]] = 1;
            /* a get is likely to follow: its endpoint is wired up now */
            if (!p->warm && !p->warming)
                warm_up(p, (uint32_t)rt->base.env.core->timeout_ms);
        }
        rread_finish(rr);
        return;
    }
    start_fetches(rr);
}

/* The keys the slice lacks go to the master; false: none or no master (the
 * caller finishes). */
static bool ask_master(struct rread *rr)
{
    struct rdma_tier *rt = rr->rt;
    if (!rr->nmiss || rt->stopped || !rt->registered || !mclient_connected(rt->mc))
        return false;
    if (!(rr->keys = malloc(rr->nmiss * sizeof(*rr->keys))) ||
        !(rr->locs = calloc(rr->nmiss, sizeof(*rr->locs))) ||
        !(rr->tried = calloc(rr->nmiss, 1)) || !(rr->again = calloc(rr->nmiss, 1)) ||
        !(rr->outcome = calloc(rr->nmiss, 1)))
        return false;
    for (size_t i = 0; i < rr->nmiss; i++)
        rr->keys[i] = rr->miss[i]->key;
    size_t n = rr->nmiss < PROTO_MAX_RECORDS ? rr->nmiss : PROTO_MAX_RECORDS;
    rr->nmiss = n;
    rt->locates++;
    return mclient_locate_async(rt->mc, rr->keys, n, rr->locs, on_located, rr) == 0;
}

static struct rread *rread_new(struct rdma_tier *rt, struct umbp_tier_req *const *reqs, size_t n,
                               umbp_tier_done_fn done, void *arg)
{
    struct rread *rr = calloc(1, sizeof(*rr));
    if (!rr || !(rr->miss = calloc(n ? n : 1, sizeof(*rr->miss)))) {
        free(rr);
        return NULL;
    }
    rr->rt = rt;
    rr->t0_ns = umbp_now_ns();
    rr->deadline_ns = rr->t0_ns + 2000000ull * ((uint64_t)rt->base.env.core->lookup_timeout_ms +
                                                (uint64_t)rt->base.env.core->timeout_ms);
    rr->all = reqs;
    rr->nall = n;
    rr->done = done;
    rr->arg = arg;
    return rr;
}

static void rdma_lookup(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                        uint8_t *present, bool touch, umbp_tier_done_fn done, void *arg)
{
    struct rdma_tier *rt = to_rdma(t);
    int rc = 1;
    rt->local->ops->lookup(rt->local, reqs, n, present, touch, inline_done, &rc);
    struct rread *rr = rc == 0 ? rread_new(rt, reqs, n, done, arg) : NULL;
    if (rr && (rr->miss_idx = calloc(n ? n : 1, sizeof(*rr->miss_idx)))) {
        rr->lookup = true;
        rr->present = present;
        for (size_t i = 0; i < n; i++)
            if (!present[i]) {
                rr->miss_idx[rr->nmiss] = i;
                rr->miss[rr->nmiss++] = reqs[i];
            }
        if (ask_master(rr))
            return;
    }
    if (rr)
        rread_free(rr);
    done(arg, rc == 1 ? -EIO : rc);
}

static void rdma_acquire(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                         uint64_t ttl_ms, umbp_tier_done_fn done, void *arg)
{
    struct rdma_tier *rt = to_rdma(t);
    int rc = 1;
    rt->local->ops->acquire(rt->local, reqs, n, ttl_ms, inline_done, &rc);
    struct rread *rr = rc == 0 ? rread_new(rt, reqs, n, done, arg) : NULL;
    if (rr) {
        rr->ttl_ms = ttl_ms;
        for (size_t i = 0; i < n; i++)
            if (reqs[i]->status == -ENOENT)
                rr->miss[rr->nmiss++] = reqs[i];
        if (ask_master(rr))
            return;
        rread_free(rr);
    }
    done(arg, rc == 1 ? -EIO : rc);
}

#define RDMA_HIDDEN 0x72646d61 /* a status the slice does not act on */

static void rdma_release(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                         umbp_tier_done_fn done, void *arg)
{
    struct rdma_tier *rt = to_rdma(t);
    size_t temps = 0;
    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == 0 && reqs[i]->region.aux[1] == RDMA_TEMP) {
            /* a private reservation: its bytes were this reader's alone */
            give_back(rt, reqs[i], reqs[i]->region.aux[0]);
            reqs[i]->status = RDMA_HIDDEN;
            temps++;
        }
    if (!temps) {
        rt->local->ops->release(rt->local, reqs, n, done, arg);
        return;
    }
    int rc = 1;
    rt->local->ops->release(rt->local, reqs, n, inline_done, &rc); /* status 0 only */
    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == RDMA_HIDDEN)
            reqs[i]->status = 0;
    done(arg, rc == 1 ? -EIO : rc);
}

/* ---- the slice's members, passed through ------------------------------------------------ */

static void rdma_reserve(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                         umbp_tier_done_fn done, void *arg)
{
    struct rdma_tier *rt = to_rdma(t);
    rt->local->ops->reserve(rt->local, reqs, n, done, arg);
}

static void rdma_publish(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                         umbp_tier_done_fn done, void *arg)
{
    struct rdma_tier *rt = to_rdma(t);
    rt->pub_reqs = reqs; /* the STORED events' sizes (the slice publishes inline) */
    rt->pub_n = n;
    rt->pub_at = 0;
    rt->local->ops->publish(rt->local, reqs, n, done, arg);
    rt->pub_n = 0;
}

static void rdma_abort(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n)
{
    struct rdma_tier *rt = to_rdma(t);
    rt->local->ops->abort(rt->local, reqs, n);
}

static void rdma_clear(struct umbp_tier *t, umbp_tier_done_fn done, void *arg)
{
    struct rdma_tier *rt = to_rdma(t);
    rt->local->ops->clear(rt->local, done, arg);
}

static uint64_t rdma_evict(struct umbp_tier *t, uint64_t target, uint64_t want_run, size_t max,
                           bool *more)
{
    struct rdma_tier *rt = to_rdma(t);
    *more = false;
    return rt->local->ops->evict ? rt->local->ops->evict(rt->local, target, want_run, max, more)
                                 : 0;
}

static void rdma_usage(struct umbp_tier *t, struct umbp_tier_usage *out)
{
    struct rdma_tier *rt = to_rdma(t);
    memset(out, 0, sizeof(*out));
    if (rt->local->ops->usage)
        rt->local->ops->usage(rt->local, out);
}

static void rdma_expire_leases(struct umbp_tier *t, uint64_t now_ns)
{
    struct rdma_tier *rt = to_rdma(t);
    if (rt->local->ops->expire_leases)
        rt->local->ops->expire_leases(rt->local, now_ns);
}

static int rdma_health(struct umbp_tier *t)
{
    /* the slice is local; a master or peer that is away costs misses */
    struct rdma_tier *rt = to_rdma(t);
    return rt->local->ops->health ? rt->local->ops->health(rt->local) : 0;
}

static int rdma_mapped_memory(struct umbp_tier *t, void **addr, size_t *len)
{
    struct rdma_tier *rt = to_rdma(t);
    return rt->local->ops->mapped_memory ? rt->local->ops->mapped_memory(rt->local, addr, len)
                                         : -ENOTSUP;
}

/* ---- serving peers -------------------------------------------------------------------------- */

static int serve_take(void *ctx, const umbp_key_t *key, const void **addr, uint64_t *size,
                      uint64_t *lease)
{
    struct rdma_tier *rt = ctx;
    if (rt->stopped)
        return -ENOENT;
    struct umbp_tier_req *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOENT;
    q->key = *key;
    int rc = 1;
    rt->local->ops->acquire(rt->local, &q, 1, (uint64_t)rt->base.env.core->lease_ttl_ms,
                            inline_done, &rc);
    if (rc == 1) { /* the slice completes inline (dram): never here */
        umbp_log(UMBP_LOG_ERROR, "rdma: the local slice did not lease inline; not served");
        return -ENOENT; /* q is the slice's until it calls back */
    }
    if (rc < 0 || q->status != 0) {
        free(q);
        return -ENOENT;
    }
    *addr = q->region.addr;
    *size = q->region.size;
    *lease = (uint64_t)(uintptr_t)q;
    return 0;
}

static void serve_release(void *ctx, uint64_t lease)
{
    struct rdma_tier *rt = ctx;
    struct umbp_tier_req *q = (struct umbp_tier_req *)(uintptr_t)lease;
    int rc = 1;
    rt->local->ops->release(rt->local, &q, 1, inline_done, &rc);
    free(q);
}

/* ---- life ------------------------------------------------------------------------------------- */

static bool rdma_drain(struct umbp_tier *t)
{
    struct rdma_tier *rt = to_rdma(t);
    return rt->local->ops->drain ? rt->local->ops->drain(rt->local) : false;
}

static void rdma_stop(struct umbp_tier *t)
{
    struct rdma_tier *rt = to_rdma(t);
    if (rt->stopped)
        return;
    rt->stopped = true;
    ev_timer_stop(t->env.loop, &rt->hb);
    ev_timer_stop(t->env.loop, &rt->kick);
    /* fetches in flight end now (their reservations given back), then the
     * lookups waiting for the master */
    memset(rt->peer_cache, 0, sizeof(rt->peer_cache));
    while (rt->peers) {
        struct rpeer *p = rt->peers;
        rt->peers = p->next;
        ucx_peer_destroy(p->p);
        free(p);
    }
    mclient_destroy(rt->mc);
    rt->mc = NULL;
    if (rt->local->ops->stop)
        rt->local->ops->stop(rt->local);
}

static void rdma_destroy(struct umbp_tier *t)
{
    if (!t)
        return;
    struct rdma_tier *rt = to_rdma(t);
    rt->stopped = true;
    memset(rt->peer_cache, 0, sizeof(rt->peer_cache));
    while (rt->peers) {
        struct rpeer *p = rt->peers;
        rt->peers = p->next;
        ucx_peer_destroy(p->p);
        free(p);
    }
    mclient_destroy(rt->mc);
    ucx_node_destroy(rt->ucx); /* unmaps the pool before the slice frees it */
    if (rt->local)
        rt->local->ops->destroy(rt->local);
    free(rt->evq);
    free(rt->live.v);
    free(rt->snap_keys);
    free(rt->snap_sizes);
    free(rt);
}

static int rdma_create(const struct umbp_tier_env *env, const void *cfgp, struct umbp_tier **out,
                       char *err, size_t errlen)
{
    const struct rdma_config *cfg = cfgp;
    struct rdma_tier *rt = calloc(1, sizeof(*rt));
    if (!rt) {
        snprintf(err, errlen, "rdma tier: out of memory");
        return -ENOMEM;
    }
    rt->base.ops = &umbp_tier_rdma_ops;
    rt->base.env = *env;
    rt->cfg = *cfg;
    int rc = 0;
    if (cfg->secret_file[0]) {
        if ((rc = net_auth_key_load(cfg->secret_file, "secret_file", &rt->key, err, errlen)) < 0)
            goto fail;
        rt->have_key = true;
    }
    /* the local slice: its events, space and mapping reports come here */
    rt->child_env = *env;
    rt->child_env.emit_event = child_event;
    rt->child_env.events_lost = child_events_lost;
    rt->child_env.space_freed = child_space_freed;
    rt->child_env.mapping_changed = child_mapping_changed;
    rt->child_env.regions_revoked = child_regions_revoked;
    rt->child_env.ctx = rt;
    if ((rc = env->create_child(&rt->child_env, "dram", &rt->local, err, errlen)) < 0)
        goto fail;
    /* the UCX worker on the runtime's loop, serving the slice */
    rt->serve = (struct ucx_serve_ops){.lease_take = serve_take, .lease_release = serve_release,
                                       .ctx = rt};
    int64_t serve_ms = cfg->ucx_serve_timeout_ms; /* a lease outlives its send */
    if (serve_ms > env->core->lease_ttl_ms / 2)
        serve_ms = env->core->lease_ttl_ms / 2 > 0 ? env->core->lease_ttl_ms / 2 : 1;
    struct ucx_node_config nc = {.loop = env->loop, .name = "umbp node", .serve = &rt->serve,
                                 .serve_timeout_ms = (uint32_t)serve_ms,
                                 /* poll_wait's rule (>= 8 usable CPUs, or "on") */
                                 .spin_us = umbp_poll_wait_spins(env->core->poll_wait) ? 50 : 0,
                                 .on_peer_failed = on_peer_failed, .arg = rt,
                                 /* the data plane's macs: the master's secret */
                                 .auth = rt->have_key ? &rt->key : NULL};
    if ((rc = ucx_node_create(&nc, &rt->ucx)) < 0) {
        snprintf(err, errlen, "rdma tier: UCX: %s", umbp_last_error());
        goto fail;
    }
    void *pool = NULL;
    size_t pool_len = 0;
    if ((rc = rdma_mapped_memory(&rt->base, &pool, &pool_len)) < 0 ||
        (rc = ucx_mem_map(rt->ucx, pool, pool_len)) < 0) {
        snprintf(err, errlen, "rdma tier: cannot register the local slice (%zu bytes) with "
                 "UCX: %s", pool_len, umbp_last_error());
        goto fail;
    }
    /* our id at the master: host, pid, start time; the worker's address */
    struct proto_register *r = &rt->reg;
    if (cfg->node_host[0])
        snprintf(r->host, sizeof(r->host), "%s", cfg->node_host);
    else if (gethostname(r->host, sizeof(r->host) - 1) < 0 || !r->host[0])
        snprintf(r->host, sizeof(r->host), "localhost");
    r->pid = (uint32_t)getpid();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->start_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    r->capacity_bytes = env->capacity_bytes ? env->capacity_bytes : 1;
    const void *addr;
    size_t alen;
    ucx_node_address(rt->ucx, &addr, &alen);
    if (alen > PROTO_NODE_ADDR_MAX) {
        snprintf(err, errlen, "rdma tier: the UCX worker's address is %zu bytes, more than the "
                 "master carries (%u): narrow UCX_TLS", alen, PROTO_NODE_ADDR_MAX);
        rc = -E2BIG;
        goto fail;
    }
    memcpy(r->addr, addr, alen);
    r->addr_len = (uint32_t)alen;
    snprintf(rt->engine_id, sizeof(rt->engine_id), "%.40s:%u", r->host, r->pid);
    struct mclient_config mc = {
        .address = cfg->master_address, .auth = rt->have_key ? &rt->key : NULL,
        .role = PROTO_ROLE_NODE, .engine_id = rt->engine_id,
        .timeout_ms = (uint64_t)env->core->timeout_ms,
        .locate_timeout_ms = (uint64_t)env->core->lookup_timeout_ms,
        .hello_timeout_ms = (uint64_t)env->core->timeout_ms,
        .loop = env->loop, .on_up = master_up, .on_down = master_down, .arg = rt,
    };
    if ((rc = mclient_create(&mc, &rt->mc)) < 0) {
        snprintf(err, errlen, "rdma tier: out of memory for the master's client");
        goto fail;
    }
    ev_timer_init(&rt->hb, on_hb_timer, (double)cfg->heartbeat_ms / 1e3,
                  (double)cfg->heartbeat_ms / 1e3);
    ev_timer_init(&rt->kick, on_kick, 0.0, 0.0);
    rt->hb.data = rt->kick.data = rt;
    ev_timer_start(env->loop, &rt->hb);
    mclient_start(rt->mc);
    umbp_tier_set_caps(&rt->base, (rt->local->caps_set ? rt->local->caps : rt->local->ops->caps) |
                                      UMBP_TIER_CAP_REMOTE | UMBP_TIER_CAP_SHARED);
    umbp_log(UMBP_LOG_INFO, "rdma: node %s pid %u, UCX transports %s, master %s%s", r->host,
             r->pid, ucx_node_transports(rt->ucx), cfg->master_address,
             rt->have_key ? " (shared secret)" : "");
    *out = &rt->base;
    return 0;
fail:
    rdma_destroy(&rt->base);
    return rc;
}

static const char *const rdma_modes[] = {"distributed", NULL};
static const char *const rdma_uses[] = {"dram", NULL};

const struct umbp_tier_ops umbp_tier_rdma_ops = {
    .name = "rdma",
    /* every instance: the slice's caps (dram: mapped, evicts, expires
     * leases) plus remote and shared, set in create */
    .caps = UMBP_TIER_CAP_MAPPED | UMBP_TIER_CAP_EVICTS_LOCALLY |
            UMBP_TIER_CAP_EXPIRES_LEASES | UMBP_TIER_CAP_REMOTE | UMBP_TIER_CAP_SHARED,
    .modes = rdma_modes,
    .uses = rdma_uses,
    .options = rdma_options,
    .config_size = sizeof(struct rdma_config),
    .validate_config = rdma_validate_config,
    .create = rdma_create,
    .destroy = rdma_destroy,
    .stop = rdma_stop,
    .drain = rdma_drain,
    .lookup = rdma_lookup,
    .reserve = rdma_reserve,
    .publish = rdma_publish,
    .abort = rdma_abort,
    .acquire = rdma_acquire,
    .release = rdma_release,
    .clear = rdma_clear,
    .evict = rdma_evict,
    .usage = rdma_usage,
    .expire_leases = rdma_expire_leases,
    .health = rdma_health,
    .mapped_memory = rdma_mapped_memory,
};
