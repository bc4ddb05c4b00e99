/*
 * actor_load.c - the load actor: acquire lease -> copy -> release + validate.
 *
 * Loop thread only.  Owns the quarantine of keys whose load failed.
 *
 * The lease keeps the region from being evicted or reused while the copy
 * workers read it.  Leases can expire (lease_ttl_ms) under a reader that is
 * too slow, so the tier's release reports whether the region survived; a key
 * whose region was reclaimed gets UMBP_E_STALE, never the bytes of another
 * object.  A range past the end of the object fails its key (UMBP_E_SHAPE)
 * after the lease is taken, since only then is the object's size known.
 */
#include <errno.h>

#include "rt.h"
#include "tier_call.h"

enum { KEY_HELD = KEY_DONE + 1 }; /* leased, not copied (bad range), release */

static void get_finish(struct umbp_runtime *rt, struct umbp_op *op)
{
    if (op->warm) { /* umbp_kv_warm_load: nothing counted or remembered */
        op_complete(op);
        return;
    }
    uint64_t q_ms = (uint64_t)rt->core->load_failure_quarantine_ms;
    uint64_t now = umbp_now_ns();
    for (size_t k = 0; k < op->n; k++) {
        int s = op->status[k];
        if (s == 0)
            continue;
        if (s == -ENOENT || s == UMBP_E_QUARANTINED) {
            CNT_ADD(rt, gets_miss, 1);
            continue;
        }
        CNT_ADD(rt, gets_failed, 1);
        /* A data failure is remembered so the engine stops counting the key
         * as a hit; "not attempted" says nothing about the key itself. */
        if (q_ms && s != UMBP_E_NOT_ATTEMPTED && s != UMBP_E_TIMEOUT && s != UMBP_E_SHAPE &&
            s != -ENOTSUP && s != UMBP_E_GPU_UNREGISTERED /* a pool not pinned yet */)
            quarantine_add(rt->quarantine, &op->reqs[k].key, now + ms_to_ns((int64_t)q_ms));
    }
    op_complete(op);
}

static void get_released(void *arg, int rc)
{
    struct umbp_op *op = arg;
    struct umbp_runtime *rt = op->rt;
    for (size_t k = 0; k < op->n; k++) {
        if (op->state[k] == KEY_COPYING) {
            int s = rc < 0 ? rc : op->reqs[k].status;
            op->status[k] = s;
            if (s == 0) {
                CNT_ADD(rt, gets_ok, 1);
                for (uint32_t r = op->range_first[k]; r < op->range_first[k + 1]; r++)
                    CNT_ADD(rt, bytes_read, op->ranges[r].len);
            }
        }
        if (op->state[k] == KEY_COPYING || op->state[k] == KEY_HELD)
            op->state[k] = KEY_DONE;
    }
    get_finish(rt, op);
}

/* The release of a load that completed first: nothing left to report. */
static void get_released_after(void *arg, int rc)
{
    struct umbp_op *op = arg;
    for (size_t k = 0; k < op->n && rc == 0; k++)
        if (op->state[k] == KEY_DONE && op->status[k] == 0 && op->reqs[k].status != 0)
            rc = op->reqs[k].status;
    if (rc < 0) /* cannot happen: see leases_certain */
        umbp_log(UMBP_LOG_ERROR, "load actor: a lease ended before its release (%s)",
                 umbp_strerror(rc));
    op_put_ref(op);
}

/* Whether no lease of op can have ended: the tier's leases end only by
 * expiry, which the lease actor runs on this thread with a clock that has
 * not yet reached the earliest deadline.  Then the release cannot report
 * UMBP_E_STALE and the load completes before it. */
static bool leases_certain(const struct umbp_runtime *rt, const struct umbp_op *op)
{
    unsigned caps = tier_caps(rt->tier);
    return (caps & UMBP_TIER_CAP_EXPIRES_LEASES) && !(caps & UMBP_TIER_CAP_REMOTE) &&
           umbp_now_ns() < op->leases_until_ns;
}

static void get_release(struct umbp_runtime *rt, struct umbp_op *op)
{
    size_t m = 0;
    for (size_t k = 0; k < op->n; k++)
        if (op->state[k] == KEY_COPYING || op->state[k] == KEY_HELD)
            op->req_ptrs[m++] = &op->reqs[k];
    if (m == 0) {
        get_finish(rt, op);
        return;
    }
    if (!leases_certain(rt, op)) {
        tier_release(rt->tier, op->req_ptrs, m, get_released, op);
        return;
    }
    /* every copied key is good: complete, then end the leases (the extra
     * reference keeps op's requests until the release is done with them) */
    atomic_fetch_add_explicit(&op->refs, 1, memory_order_relaxed);
    for (size_t k = 0; k < op->n; k++) {
        if (op->state[k] == KEY_COPYING) {
            op->status[k] = 0;
            CNT_ADD(rt, gets_ok, 1);
            for (uint32_t r = op->range_first[k]; r < op->range_first[k + 1]; r++)
                CNT_ADD(rt, bytes_read, op->ranges[r].len);
        }
        if (op->state[k] == KEY_COPYING || op->state[k] == KEY_HELD)
            op->state[k] = KEY_DONE;
    }
    get_finish(rt, op);
    tier_release(rt->tier, op->req_ptrs, m, get_released_after, op);
}

static bool ranges_fit(const struct umbp_op *op, size_t k)
{
    uint64_t size = op->reqs[k].region.size;
    for (uint32_t r = op->range_first[k]; r < op->range_first[k + 1]; r++)
        if (op->ranges[r].offset > size || op->ranges[r].len > size - op->ranges[r].offset)
            return false;
    return true;
}

static void get_acquired(void *arg, int rc)
{
    struct umbp_op *op = arg;
    if (!op->tier_done_ns)
        op->tier_done_ns = umbp_now_ns();
    struct umbp_runtime *rt = op->rt;
    size_t ncopy = 0;
    for (size_t k = 0; k < op->n; k++) {
        if (op->state[k] != KEY_TODO)
            continue;
        int s = rc < 0 ? rc : op->reqs[k].status;
        if (s != 0) {
            op->state[k] = KEY_DONE;
            op->status[k] = s;
        } else if (op->warm) { /* a warm-up copies nothing: the lease goes back */
            op->state[k] = KEY_HELD;
            op->status[k] = -ENOENT;
        } else if (op->kv_layout &&
                   op->reqs[k].region.size != umbp_kv_layout_object_size(op->kv_layout)) {
            op->state[k] = KEY_HELD; /* stored under another layout */
            op->status[k] = UMBP_E_SHAPE;
        } else if (!ranges_fit(op, k)) {
            op->state[k] = KEY_HELD;
            op->status[k] = UMBP_E_SHAPE;
        } else {
            op->state[k] = KEY_COPYING;
            ncopy++;
        }
    }
    if (ncopy)
        move_dispatch(op, MSG_GET_COPIED);
    else
        get_release(rt, op);
}

/* Keys whose move failed (deadline, GPU, tier) fail; every lease ends. */
static void get_copied(struct umbp_runtime *rt, struct umbp_op *op)
{
    move_finished(op);
    if (op->cancelled && !op->cut_by_release && !op->cut_by_loss)
        CNT_ADD(rt, ops_timed_out, 1);
    for (size_t k = 0; k < op->n; k++) {
        int rc = op->state[k] == KEY_COPYING ? move_key_rc(op, k) : 0;
        if (rc < 0) {
            op->state[k] = KEY_HELD;
            op->status[k] = rc;
        }
    }
    get_release(rt, op);
}

static void get_arrive(struct umbp_runtime *rt, struct umbp_op *op)
{
    op->arrive_ns = umbp_now_ns();
    int h = rt->stopping ? UMBP_E_NOT_ATTEMPTED : tier_health(rt->tier);
    uint64_t now = umbp_now_ns();
    if (h == 0 && now >= op->deadline_ns) { /* queued past timeout_ms */
        if (!op->warm)
            CNT_ADD(rt, ops_timed_out, 1);
        h = UMBP_E_TIMEOUT;
    }
    bool quarantine = rt->core->load_failure_quarantine_ms > 0;
    mover_choose(op);
    size_t m = 0;
    for (size_t k = 0; k < op->n; k++) {
        if (op->state[k] != KEY_TODO)
            continue;
        if (h < 0) {
            op->state[k] = KEY_DONE;
            op->status[k] = h;
        } else if (quarantine && quarantine_has(rt->quarantine, &op->reqs[k].key, now)) {
            op->state[k] = KEY_DONE;
            op->status[k] = UMBP_E_QUARANTINED;
        } else {
            op->reqs[k].status = 0;
            op->req_ptrs[m++] = &op->reqs[k];
        }
    }
    if (m == 0) {
        get_finish(rt, op);
        return;
    }
    op->leases_until_ns = umbp_now_ns() + ms_to_ns(rt->core->lease_ttl_ms);
    tier_acquire(rt->tier, op->req_ptrs, m, (uint64_t)rt->core->lease_ttl_ms, get_acquired, op);
}

void load_actor_handle(struct umbp_runtime *rt, struct msg_hdr *m)
{
    struct umbp_op *op = (struct umbp_op *)m;
    switch ((enum msg_type)m->type) {
    case MSG_GET_SUBMIT: get_arrive(rt, op); break;
    case MSG_GET_COPIED: get_copied(rt, op); break;
    default: umbp_log(UMBP_LOG_ERROR, "load actor: unexpected message %s", msg_name(m->type));
    }
}
