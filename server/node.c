/*
 * node.c - umbp-server as a node of a distributed cluster: with
 * master_address in its config, the server hosts the rdma tier (the same
 * code a worker runtime runs in "distributed" mode) over its own shared
 * pool.  The server's store is the rdma tier's local slice, through a
 * small tier (this file's `slice`, named "dram" because the rdma tier
 * composes a dram slice) whose members call the store-ops table inline.
 * So every object any engine on the host stores through the server is
 * announced to umbp-master (the store's STORED / REMOVED events reach the
 * rdma tier here) and served to peers over UCX from the pool (a peer's
 * read takes a lease of the store, as a local reader's does), and the
 * host is one node with one set of connections, whatever its engines.
 *
 * The server keeps running the pool itself (housekeeping: lease expiry,
 * watermark eviction; quotas; its clients' sessions), so the slice tier
 * declares no eviction or lease expiry of its own.
 *
 * Threads: the server's loop thread for everything but create and destroy
 * (the caller's, while the loop does not run), as in a runtime.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node.h"
#include "srv.h"

#ifdef UMBP_HAVE_RDMA

#include "rdma.h"

struct srv_node {
    struct umbp_server *s;
    struct umbp_tier slice; /* the server's store as the rdma tier's slice */
    struct umbp_tier *rdma;
    /* stopping: the tier takes no call from now on (its stop completes the
     * calls in flight, whose sessions may then ask again: they miss) */
    bool stopped;
};

static struct srv_node *node_of(struct umbp_tier *t)
{
    return umbp_container_of(t, struct srv_node, slice);
}

static void region_set(const struct umbp_server *s, const struct srv_region *r,
                       struct umbp_region *out)
{
    memset(out, 0, sizeof(*out));
    out->addr = (char *)s->pool->base + r->offset;
    out->size = r->size;
    out->token = r->token;
}

/* ---- the slice: the server's store, every call inline ---------------------------------- */

static void slice_lookup(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                         uint8_t *present, bool touch, umbp_tier_done_fn done, void *arg)
{
    struct umbp_server *s = node_of(t)->s;
    for (size_t i = 0; i < n; i++)
        present[i] = srv_store_lookup(&s->st, &reqs[i]->key, touch);
    done(arg, 0);
}

/* The rdma tier reserves for what it fetches from peers (replicas, or a
 * reader's private copy), in the default namespace, evicting inline as a
 * client's reserve does.  The writer is this process: the tier aborts the
 * reservation itself once UCX has ended the fetch (timeout_ms after it
 * started, a force-close later at worst), so the store's own deadline is
 * only for a server that dies meanwhile, and is far past that: a region
 * must never be handed to another writer while a fetch may land in it. */
static void slice_reserve(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                          umbp_tier_done_fn done, void *arg)
{
    struct umbp_server *s = node_of(t)->s;
    uint64_t until = umbp_now_ns() + 4 * (uint64_t)s->cfg->core.timeout_ms * 1000000ull +
                     1000000000ull;
    bool may_evict = true;
    for (size_t i = 0; i < n; i++) {
        struct srv_region r;
        reqs[i]->status = srv_reserve_evicting(s, 0, &reqs[i]->key, reqs[i]->size, until, false,
                                               &r, &may_evict);
        if (reqs[i]->status == 0)
            region_set(s, &r, &reqs[i]->region);
    }
    done(arg, 0);
}

static void slice_publish(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                          umbp_tier_done_fn done, void *arg)
{
    struct umbp_server *s = node_of(t)->s;
    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == 0)
            reqs[i]->status = srv_store_publish(&s->st, &reqs[i]->key, reqs[i]->region.token);
    done(arg, 0);
}

static void slice_abort(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n)
{
    struct umbp_server *s = node_of(t)->s;
    for (size_t i = 0; i < n; i++)
        srv_store_abort(&s->st, &reqs[i]->key, reqs[i]->region.token);
}

static void slice_acquire(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                          uint64_t lease_ttl_ms, umbp_tier_done_fn done, void *arg)
{
    struct umbp_server *s = node_of(t)->s;
    uint64_t now = umbp_now_ns();
    for (size_t i = 0; i < n; i++) {
        struct srv_region r;
        reqs[i]->status = srv_store_acquire(&s->st, &reqs[i]->key, now,
                                            lease_ttl_ms * 1000000ull, &r);
        if (reqs[i]->status == 0)
            region_set(s, &r, &reqs[i]->region);
    }
    done(arg, 0);
}

static void slice_release(struct umbp_tier *t, struct umbp_tier_req *const *reqs, size_t n,
                          umbp_tier_done_fn done, void *arg)
{
    struct umbp_server *s = node_of(t)->s;
    for (size_t i = 0; i < n; i++)
        if (reqs[i]->status == 0)
            reqs[i]->status = srv_store_release(&s->st, reqs[i]->region.token);
    done(arg, 0);
}

static void slice_clear(struct umbp_tier *t, umbp_tier_done_fn done, void *arg)
{
    srv_store_clear(&node_of(t)->s->st);
    done(arg, 0);
}

/* Without a high watermark: the rdma tier keeps a fetched object as a
 * replica only below it, and hands the others to its reader as private
 * copies; a server's engines can take no private copy (the handler leases
 * what the store holds), so one refused there was fetched for nothing and
 * missed.  The server's own evictor keeps the pool between its marks, and a
 * replica the handler leases at once is not evicted under it. */
static void slice_usage(struct umbp_tier *t, struct umbp_tier_usage *out)
{
    srv_store_usage(&node_of(t)->s->st, out);
    out->high_watermark_bytes = 0;
}

static int slice_mapped_memory(struct umbp_tier *t, void **addr, size_t *len)
{
    const struct dram_pool *p = node_of(t)->s->pool;
    *addr = p->base;
    *len = (size_t)p->size;
    return 0;
}

static void slice_destroy(struct umbp_tier *t) { (void)t; /* the server owns the store */ }

static int slice_create(const struct umbp_tier_env *env, const void *cfg, struct umbp_tier **out,
                        char *err, size_t errlen)
{
    (void)env, (void)cfg, (void)out;
    snprintf(err, errlen, "the server's slice is not created by name");
    return -EINVAL;
}

static const struct umbp_tier_ops slice_ops = {
    .name = "dram",
    .caps = UMBP_TIER_CAP_MAPPED | UMBP_TIER_CAP_SHARED,
    .create = slice_create,
    .destroy = slice_destroy,
    .lookup = slice_lookup,
    .reserve = slice_reserve,
    .publish = slice_publish,
    .abort = slice_abort,
    .acquire = slice_acquire,
    .release = slice_release,
    .clear = slice_clear,
    .usage = slice_usage,
    .mapped_memory = slice_mapped_memory,
};

/* ---- the rdma tier's env: the server's loop; reports it does not need ------------------ */

/* The server sends its store's events to its clients itself, and to the
 * rdma tier with their sizes (srv_node_event): the slice emits none. */
static void env_event(void *ctx, umbp_event_type_t type, const umbp_key_t *key)
{
    (void)ctx, (void)type, (void)key;
}

static void env_events_lost(void *ctx, uint64_t n) { (void)ctx, (void)n; }
static void env_nothing(void *ctx) { (void)ctx; }

/* create_child: the slice is the server's store, whatever the options say */
static int env_create_child(const struct umbp_tier_env *child_env, const char *name,
                            struct umbp_tier **out, char *err, size_t errlen)
{
    if (strcmp(name, "dram") != 0) {
        snprintf(err, errlen, "umbp-server's node has no '%s' tier", name);
        return -EINVAL;
    }
    /* child_env->ctx is the rdma tier's; the node rides in env.options,
     * which a parent passes to its child unchanged */
    struct srv_node *node = (struct srv_node *)child_env->options;
    node->slice.ops = &slice_ops;
    node->slice.env = *child_env;
    umbp_tier_set_caps(&node->slice, slice_ops.caps);
    *out = &node->slice;
    return 0;
}

/* ---- clients' keys the store lacks -------------------------------------------------------- */

struct srv_node_call {
    struct srv_node *n;
    bool fetch;
    bool starting;       /* inside srv_node_call: a completion now is inline */
    bool inline_done;
    bool cancelled;
    size_t nkeys;
    struct umbp_tier_req *reqs;
    struct umbp_tier_req **ptrs;
    uint8_t *present;
    srv_node_done_fn done;
    void *arg;
};

void srv_node_call_free(struct srv_node_call *c)
{
    if (!c)
        return;
    free(c->reqs);
    free(c->ptrs);
    free(c->present);
    free(c);
}

static void call_released(void *arg, int rc)
{
    (void)arg, (void)rc; /* the slice's releases and a private copy's abort: inline */
}

static void call_answered(void *arg, int rc)
{
    struct srv_node_call *c = arg;
    if (c->fetch && rc == 0) {
        /* the fetched objects are the store's now (replicas): the handler
         * leases them itself; private copies go back (those keys miss) */
        size_t m = 0;
        for (size_t i = 0; i < c->nkeys; i++)
            if (c->reqs[i].status == 0)
                c->ptrs[m++] = &c->reqs[i];
        if (m)
            c->n->rdma->ops->release(c->n->rdma, c->ptrs, m, call_released, NULL);
    }
    if (c->starting) {
        c->inline_done = true;
        return;
    }
    if (c->cancelled) {
        srv_node_call_free(c);
        return;
    }
    c->done(c->arg);
}

int srv_node_call(struct srv_node *n, bool fetch, const umbp_key_t *keys, size_t nkeys,
                  uint64_t ttl_ms, srv_node_done_fn done, void *arg, struct srv_node_call **out)
{
    *out = NULL;
    if (n->stopped)
        return -ESHUTDOWN;
    struct srv_node_call *c = calloc(1, sizeof(*c));
    if (!c || !(c->reqs = calloc(nkeys, sizeof(*c->reqs))) ||
        !(c->ptrs = calloc(nkeys, sizeof(*c->ptrs))) ||
        !(c->present = calloc(nkeys, sizeof(*c->present)))) {
        srv_node_call_free(c);
        return -ENOMEM;
    }
    *c = (struct srv_node_call){.n = n, .fetch = fetch, .starting = true, .nkeys = nkeys,
                                .reqs = c->reqs, .ptrs = c->ptrs, .present = c->present,
                                .done = done, .arg = arg};
    for (size_t i = 0; i < nkeys; i++) {
        c->reqs[i].key = keys[i];
        c->ptrs[i] = &c->reqs[i];
    }
    struct umbp_tier *t = n->rdma;
    if (fetch)
        t->ops->acquire(t, c->ptrs, nkeys, ttl_ms, call_answered, c);
    else
        t->ops->lookup(t, c->ptrs, nkeys, c->present, false, call_answered, c);
    c->starting = false;
    *out = c;
    return c->inline_done ? 1 : 0;
}

bool srv_node_call_present(const struct srv_node_call *c, size_t i)
{
    return !c->fetch && i < c->nkeys && c->present[i];
}

void srv_node_call_cancel(struct srv_node_call *c)
{
    if (c)
        c->cancelled = true;
}

/* ---- the node ----------------------------------------------------------------------------- */

const struct umbp_option *srv_node_options(size_t *config_size)
{
    *config_size = umbp_tier_rdma_ops.config_size;
    return umbp_tier_rdma_ops.options;
}

int srv_node_validate(const void *cfg, const struct umbp_core_config *core, char *err,
                      size_t errlen)
{
    return umbp_tier_rdma_ops.validate_config(cfg, core, err, errlen);
}

bool srv_node_wanted(const void *cfg)
{
    for (const struct umbp_option *o = umbp_tier_rdma_ops.options; o->name; o++)
        if (strcmp(o->name, "master_address") == 0)
            return ((const char *)cfg + o->offset)[0] != '\0';
    return false;
}

int srv_node_create(struct umbp_server *s, const void *cfg, struct srv_node **out, char *err,
                    size_t errlen)
{
    struct srv_node *n = calloc(1, sizeof(*n));
    if (!n) {
        snprintf(err, errlen, "out of memory for the node");
        return -ENOMEM;
    }
    n->s = s;
    struct umbp_tier_env env = {
        .loop = s->loop,
        .core = &s->cfg->core,
        .capacity_bytes = s->pool->size,
        .emit_event = env_event,
        .events_lost = env_events_lost,
        .space_freed = env_nothing,
        .mapping_changed = env_nothing,
        .regions_revoked = env_nothing,
        .ctx = n,
        .create_child = env_create_child,
        .options = n, /* how env_create_child finds the node */
    };
    int rc = umbp_tier_rdma_ops.create(&env, cfg, &n->rdma, err, errlen);
    if (rc < 0) {
        free(n);
        return rc;
    }
    *out = n;
    return 0;
}

void srv_node_event(struct srv_node *n, umbp_event_type_t type, const umbp_key_t *key,
                    uint64_t size)
{
    if (n)
        umbp_rdma_slice_event(n->rdma, type, key, size);
}

bool srv_node_stats(struct srv_node *n, struct srv_node_stats *out)
{
    if (!n)
        return false;
    struct umbp_rdma_stats r;
    umbp_rdma_stats(n->rdma, &r);
    *out = (struct srv_node_stats){
        .remote_hits = r.remote_hits, .remote_misses = r.remote_misses,
        .remote_failed = r.remote_failed, .remote_retries = r.remote_retries,
        .remote_bytes = r.remote_bytes,
        .replicas = r.replicas, .locates = r.locates, .heartbeats = r.heartbeats,
        .resyncs = r.resyncs, .registers = r.registers, .reports = r.reports,
        .live_keys = r.live_keys, .node_ref = r.node_ref, .registered = r.registered,
        .data_eager = r.data_eager, .data_rndv = r.data_rndv, .served_keys = r.served_keys,
        .served_bytes = r.served_bytes,
    };
    snprintf(out->transports, sizeof(out->transports), "%s", r.transports);
    return true;
}

void srv_node_stop(struct srv_node *n)
{
    if (n)
        n->stopped = true;
    if (n && n->rdma->ops->stop)
        n->rdma->ops->stop(n->rdma);
}

void srv_node_destroy(struct srv_node *n)
{
    if (!n)
        return;
    srv_node_stop(n); /* (a server that never ran: stop is idempotent) */
    n->rdma->ops->destroy(n->rdma);
    free(n);
}

#else /* no UCX: no rdma tier to host */

const struct umbp_option *srv_node_options(size_t *config_size)
{
    *config_size = 0;
    return NULL;
}

int srv_node_validate(const void *cfg, const struct umbp_core_config *core, char *err,
                      size_t errlen)
{
    (void)cfg, (void)core, (void)err, (void)errlen;
    return 0;
}

bool srv_node_wanted(const void *cfg)
{
    (void)cfg;
    return false;
}

int srv_node_create(struct umbp_server *s, const void *cfg, struct srv_node **out, char *err,
                    size_t errlen)
{
    (void)s, (void)cfg, (void)out;
    snprintf(err, errlen, "master_address: this umbp-server was built without UCX "
             "(libucx-dev), so it cannot be a node of a distributed cluster");
    return -ENOTSUP;
}

void srv_node_event(struct srv_node *n, umbp_event_type_t type, const umbp_key_t *key,
                    uint64_t size)
{
    (void)n, (void)type, (void)key, (void)size;
}

bool srv_node_stats(struct srv_node *n, struct srv_node_stats *out)
{
    (void)n, (void)out;
    return false;
}

void srv_node_stop(struct srv_node *n) { (void)n; }
void srv_node_destroy(struct srv_node *n) { (void)n; }

int srv_node_call(struct srv_node *n, bool fetch, const umbp_key_t *keys, size_t nkeys,
                  uint64_t ttl_ms, srv_node_done_fn done, void *arg, struct srv_node_call **out)
{
    (void)n, (void)fetch, (void)keys, (void)nkeys, (void)ttl_ms, (void)done, (void)arg;
    *out = NULL;
    return -ENOTSUP;
}

bool srv_node_call_present(const struct srv_node_call *c, size_t i)
{
    (void)c, (void)i;
    return false;
}

void srv_node_call_free(struct srv_node_call *c) { (void)c; }
void srv_node_call_cancel(struct srv_node_call *c) { (void)c; }

#endif
