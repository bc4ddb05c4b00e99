/*
 * actor_lookup.c - the lookup actor: exists + consecutive prefix, and the
 * control messages (stats, clear).
 *
 * Loop thread only.  A lookup is one tier call for the whole batch; it has no
 * side effects unless the caller asked to touch (refresh LRU).  Quarantined
 * keys (load actor's table, same thread) count as misses.  It also starts
 * the lookup service (lookup/lookup_serve.c), which answers a scheduler's
 * lookups on this thread with the same tier call and accounting.
 */
#include <errno.h>
#include <string.h>

#include "lookup_int.h"
#include "rt.h"
#include "tier_call.h"

size_t lookup_account(struct umbp_runtime *rt, const struct umbp_tier_req *reqs,
                      uint8_t *present, size_t n)
{
    if (rt->core->load_failure_quarantine_ms > 0) {
        uint64_t now = umbp_now_ns();
        for (size_t k = 0; k < n; k++)
            if (present[k] && quarantine_has(rt->quarantine, &reqs[k].key, now))
                present[k] = 0;
    }
    size_t prefix = 0, hits = 0;
    while (prefix < n && present[prefix])
        prefix++;
    for (size_t k = 0; k < n; k++)
        hits += present[k] != 0;
    CNT_ADD(rt, lookups, 1);
    CNT_ADD(rt, lookup_keys, n);
    CNT_ADD(rt, lookup_hits, hits);
    return prefix;
}

static void lookup_done(void *arg, int rc)
{
    struct umbp_op *op = arg;
    struct umbp_runtime *rt = op->rt;
    if (rc < 0)
        memset(op->present, 0, op->n);
    op->prefix = lookup_account(rt, op->reqs, op->present, op->n);
    op->rc = rc < 0 ? rc : 0;
    op_complete(op);
    /* an answered lookup means the backend responds again */
    atomic_store(&rt->lookup_stuck, false);
}

static void lookup_arrive(struct umbp_runtime *rt, struct umbp_op *op)
{
    int h = rt->stopping ? UMBP_E_NOT_ATTEMPTED : tier_health(rt->tier);
    if (h < 0) {
        lookup_done(op, h);
        return;
    }
    for (size_t k = 0; k < op->n; k++)
        op->req_ptrs[k] = &op->reqs[k];
    tier_lookup(rt->tier, op->req_ptrs, op->n, op->present, op->flags & UMBP_LOOKUP_TOUCH,
                lookup_done, op);
}

bool lookup_run_inline(struct umbp_runtime *rt, struct umbp_op *op)
{
    /* a local tier answers inside its call; a remote one would complete on
     * the loop thread from its socket watcher, so it is posted */
    if (tier_caps(rt->tier) & UMBP_TIER_CAP_REMOTE)
        return false;
    /* the loop is waking up (it goes first) or working: it takes the
     * message soon */
    if (atomic_load_explicit(&rt->loop_waiting, memory_order_relaxed) ||
        pthread_mutex_trylock(&rt->loop_lock) != 0)
        return false;
    /* the loop thread sleeps in its poll and cannot run before the unlock:
     * this thread is the loop thread meanwhile (a stopping runtime is
     * refused here, as lookup_arrive would) */
    lookup_arrive(rt, op);
    pthread_mutex_unlock(&rt->loop_lock);
    return true;
}

#define LOAD(f) atomic_load_explicit(&rt->cnt.f, memory_order_relaxed)

static void stats_fill(struct umbp_runtime *rt, struct umbp_op *op)
{
    struct umbp_tier_usage u;
    tier_usage(rt->tier, &u);
    umbp_stats_t *s = &op->stats;
    memset(s, 0, sizeof(*s));
    s->capacity_bytes = u.capacity_bytes;
    s->used_bytes = u.used_bytes;
    s->num_objects = u.num_objects;
    s->num_pending = u.num_pending;
    s->num_leased = u.num_leased;
    s->evictions = u.evictions;
    s->evicted_bytes = u.evicted_bytes;
    s->leases_expired = u.leases_expired;
    s->puts_ok = LOAD(puts_ok);
    s->puts_existing = LOAD(puts_existing);
    s->puts_failed = LOAD(puts_failed);
    s->gets_ok = LOAD(gets_ok);
    s->gets_miss = LOAD(gets_miss);
    s->gets_failed = LOAD(gets_failed);
    s->bytes_written = LOAD(bytes_written);
    s->bytes_read = LOAD(bytes_read);
    s->lookups = LOAD(lookups);
    s->lookup_keys = LOAD(lookup_keys);
    s->lookup_hits = LOAD(lookup_hits);
    s->puts_waited_for_space = LOAD(puts_waited_for_space);
    s->ops_timed_out = LOAD(ops_timed_out);
    s->mailbox_full = LOAD(mailbox_full);
    s->events_dropped = LOAD(events_dropped);
    s->kv_transfers = LOAD(kv_transfers);
    s->kv_prepare_ns = LOAD(kv_prepare_ns);
    s->kv_launch_ns = LOAD(kv_launch_ns);
    s->kv_gpu_ns = LOAD(kv_gpu_ns);
    s->kv_finish_ns = LOAD(kv_finish_ns);
    s->kv_queue_ns = LOAD(kv_queue_ns);
    s->kv_tier_ns = LOAD(kv_tier_ns);
    s->prewakes = LOAD(prewakes);
    s->reserved_ahead = u.reserved_ahead;
    s->reserved_ahead_used = u.reserved_ahead_used;
    op->rc = 0;
    op_complete(op);
}

/* usage() is fresh now (a remote tier asked its server) */
static void stats_refreshed(void *arg, int rc)
{
    struct umbp_op *op = arg;
    (void)rc; /* a failed refresh leaves the last known usage: still a snapshot */
    stats_fill(op->rt, op);
}

static void clear_done(void *arg, int rc)
{
    struct umbp_op *op = arg;
    op->rc = rc;
    op_complete(op);
}

void lookup_actor_handle(struct umbp_runtime *rt, struct msg_hdr *m)
{
    struct umbp_op *op = (struct umbp_op *)m;
    switch ((enum msg_type)m->type) {
    case MSG_LOOKUP: lookup_arrive(rt, op); break;
    case MSG_STATS:
        if (rt->stopping)
            stats_fill(rt, op);
        else
            tier_refresh_usage(rt->tier, stats_refreshed, op);
        break;
    case MSG_CLEAR:
        if (rt->stopping)
            clear_done(op, UMBP_E_NOT_ATTEMPTED);
        else
            tier_clear(rt->tier, clear_done, op);
        break;
    case MSG_LOOKUP_SERVE: lookup_service_start(rt, m); break;
    default: umbp_log(UMBP_LOG_ERROR, "lookup actor: unexpected message %s", msg_name(m->type));
    }
}
