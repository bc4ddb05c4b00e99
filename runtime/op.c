/*
 * op.c - operation handles: a fixed pool, completion and waiting.
 *
 * Ops are allocated once at runtime creation (max_inflight_ops of them) and
 * recycled through a last-in-first-out free list (rt.h: struct op_free), so
 * submitting never allocates; per-key arrays grow only when a batch is
 * larger than any the op has seen.
 *
 * Ownership: an op carries two references, the caller's handle and the
 * runtime's.  op_complete() drops the runtime's after publishing the result;
 * umbp_op_release() drops the caller's.  Whoever drops the last returns the
 * op to the free list.  Waiting is a futex on `done`.
 */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt.h"
#include "sync.h"

struct umbp_op *op_get(struct umbp_runtime *rt, enum op_kind kind)
{
    bool control = kind != OP_PUT && kind != OP_GET;
    struct op_free *fl = control ? &rt->free_ctl : &rt->free_data;
    struct umbp_op *op = NULL;
    pthread_mutex_lock(&fl->lock);
    if (fl->n)
        op = fl->v[--fl->n];
    pthread_mutex_unlock(&fl->lock);
    if (!op) {
        CNT_ADD(rt, mailbox_full, 1);
        return NULL;
    }
    /* pairs with the acq_rel decrement that dropped the last reference:
     * the previous user's writes happen before ours */
    (void)atomic_load_explicit(&op->refs, memory_order_acquire);
    op->kind = kind;
    op->rc = 0;
    op->n = 0;
    op->num_ok = 0;
    op->prefix = 0;
    op->flags = 0;
    op->prev = op->next = NULL;
    op->kv_layout = NULL;
    op->kv_busy = NULL;
    op->kv_xfer = false;
    op->warm = false;
    op->parent = NULL;
    op->xfer = NULL;
    op->gpu_rc = 0;
    op->kv_launch_ns = op->kv_launched_ns = op->kv_done_ns = 0;
    op->arrive_ns = op->tier_done_ns = 0;
    op->cancelled = op->cut_by_release = op->cut_by_loss = false;
    atomic_store_explicit(&op->cancel, false, memory_order_relaxed);
    atomic_store_explicit(&op->write_expired, false, memory_order_relaxed);
    atomic_store_explicit(&op->released, false, memory_order_relaxed);
    op->cprev = op->cnext = NULL;
    op->submit_ns = umbp_now_ns();
    op->deadline_ns = op->submit_ns + ms_to_ns(rt->core->timeout_ms);
    atomic_store_explicit(&op->done, 0, memory_order_relaxed);
    atomic_store_explicit(&op->refs, 2, memory_order_relaxed);
    atomic_fetch_add(&rt->inflight, 1);
    return op;
}

static int grow(void **p, size_t want, size_t elem)
{
    void *q = realloc(*p, want * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    return 0;
}

int op_reserve_keys(struct umbp_op *op, size_t n, size_t nranges)
{
    if (n > op->cap_keys) {
        size_t want = n < 64 ? 64 : n;
        if (grow((void **)&op->reqs, want, sizeof(*op->reqs)) ||
            grow((void **)&op->req_ptrs, want, sizeof(*op->req_ptrs)) ||
            grow((void **)&op->state, want, sizeof(*op->state)) ||
            grow((void **)&op->status, want, sizeof(*op->status)) ||
            grow((void **)&op->present, want, sizeof(*op->present)) ||
            grow((void **)&op->range_first, want + 1, sizeof(*op->range_first)) ||
            grow((void **)&op->jobs, want, sizeof(*op->jobs)) ||
            grow((void **)&op->kv_block, want, sizeof(*op->kv_block)) ||
            grow((void **)&op->kv_io, want, sizeof(*op->kv_io)) ||
            grow((void **)&op->moves, want, sizeof(*op->moves)))
            return -ENOMEM;
        size_t slots = 128;
        while (slots < 2 * want)
            slots *= 2;
        if (grow((void **)&op->dup_tab, slots, sizeof(*op->dup_tab)))
            return -ENOMEM;
        op->dup_cap = slots;
        op->cap_keys = want;
        op->cap_jobs = (uint32_t)want;
    }
    if (nranges > op->cap_ranges) {
        size_t want = nranges < 256 ? 256 : nranges;
        if (grow((void **)&op->ranges, want, sizeof(*op->ranges)))
            return -ENOMEM;
        op->cap_ranges = want;
    }
    op->n = n;
    return 0;
}

int op_pool_warm(struct umbp_runtime *rt, size_t nops, size_t n)
{
    struct op_free *fl = &rt->free_data;
    int rc = 0;
    pthread_mutex_lock(&fl->lock);
    for (size_t i = 0; rc == 0 && i < nops && i < fl->n; i++) {
        struct umbp_op *op = fl->v[fl->n - 1 - i]; /* op_get pops from the end */
        if (op->cap_keys >= n)
            continue;
        rc = op_reserve_keys(op, n, 0);
        if (rc < 0)
            break;
        size_t c = op->cap_keys;
        memset(op->reqs, 0, c * sizeof(*op->reqs));
        memset(op->req_ptrs, 0, c * sizeof(*op->req_ptrs));
        memset(op->state, 0, c * sizeof(*op->state));
        memset(op->status, 0, c * sizeof(*op->status));
        memset(op->present, 0, c * sizeof(*op->present));
        memset(op->range_first, 0, (c + 1) * sizeof(*op->range_first));
        memset(op->jobs, 0, c * sizeof(*op->jobs));
        memset(op->kv_block, 0, c * sizeof(*op->kv_block));
        memset(op->kv_io, 0, c * sizeof(*op->kv_io));
        memset(op->moves, 0, c * sizeof(*op->moves));
        memset(op->dup_tab, 0xff, op->dup_cap * sizeof(*op->dup_tab));
        op->n = 0;
    }
    pthread_mutex_unlock(&fl->lock);
    return rc;
}

static void op_recycle(struct umbp_op *op)
{
    struct umbp_runtime *rt = op->rt;
    /* Each free list has room for every op of its pool: this cannot fail. */
    struct op_free *fl = op->control ? &rt->free_ctl : &rt->free_data;
    pthread_mutex_lock(&fl->lock);
    fl->v[fl->n++] = op;
    pthread_mutex_unlock(&fl->lock);
}

void op_put_ref(struct umbp_op *op)
{
    if (atomic_fetch_sub_explicit(&op->refs, 1, memory_order_acq_rel) != 1)
        return;
    op_recycle(op);
}

void op_abandon(struct umbp_op *op)
{
    struct umbp_runtime *rt = op->rt;
    atomic_fetch_sub(&rt->inflight, 1);
    atomic_store(&op->refs, 0);
    op_recycle(op);
}

void op_complete(struct umbp_op *op)
{
    struct umbp_runtime *rt = op->rt;
    if (op->kind == OP_PUT || op->kind == OP_GET) {
        size_t ok = 0;
        for (size_t i = 0; i < op->n; i++)
            ok += op->status[i] == 0;
        op->num_ok = ok;
        if (op->kv_done_ns && !op->warm) { /* a GPU transfer ran: where its time went */
            CNT_ADD(rt, kv_transfers, 1);
            CNT_ADD(rt, kv_prepare_ns, op->kv_launch_ns - op->submit_ns);
            CNT_ADD(rt, kv_launch_ns, op->kv_launched_ns - op->kv_launch_ns);
            CNT_ADD(rt, kv_gpu_ns, op->kv_done_ns - op->kv_launched_ns);
            CNT_ADD(rt, kv_finish_ns, umbp_now_ns() - op->kv_done_ns);
            if (op->arrive_ns && op->tier_done_ns) {
                CNT_ADD(rt, kv_queue_ns, op->arrive_ns - op->submit_ns);
                CNT_ADD(rt, kv_tier_ns, op->tier_done_ns - op->arrive_ns);
            }
        }
    }
    if (op->kv_busy) /* before done: its waiter may deregister the cache next */
        kv_unbusy(rt, op->kv_busy);
    op->kv_busy = NULL;
    /* seq_cst store pairs with the waiter's seq_cst increment of `waiters`
     * followed by its load of `done`: one of the two sides sees the other. */
    atomic_store(&op->done, 1);
    if (atomic_load(&op->waiters))
        umbp_futex(&op->done, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
    atomic_fetch_sub(&rt->inflight, 1);
    struct umbp_op *parent = op->parent;
    if (parent) {
        /* a child: hand its results to the parent, then drop both of its
         * references (the parent stood in for the caller) */
        memcpy(&parent->status[op->parent_base], op->status, op->n * sizeof(*op->status));
        op_put_ref(op);
        op_put_ref(op);
        if (atomic_fetch_sub_explicit(&parent->children_left, 1, memory_order_acq_rel) == 1)
            op_complete(parent);
        return;
    }
    op_put_ref(op);
}

/* How long a waiter polls before it sleeps: a futex wake costs tens of
 * microseconds (more in a VM), a GPU batch completes in a few milliseconds,
 * so a short poll saves a wake-up on the critical path for little CPU. */
#define WAIT_SPIN_NS 50000ull

/* A waiter on a KV transfer polls through it, yielding the core at every
 * turn, as CUDA's own synchronize does by default where cores are plenty:
 * the wake-up after a futex sleep cost 80-140 us on an H200 host (a VM),
 * 1.3-2.3 % of a 10,000-token restore (docs/benchmarks.md).  At most this
 * long (a prefix's transfer takes 1-30 ms), then it sleeps. */
#define KV_WAIT_SPIN_NS 50000000ull

uint64_t op_spin_ns(const struct umbp_op *op)
{
    if (!op->rt->may_spin)
        return 0;
    return op->kv_xfer && op->rt->core->gpu_wait_poll ? KV_WAIT_SPIN_NS : WAIT_SPIN_NS;
}

int op_wait_ns(struct umbp_op *op, uint64_t timeout_ns)
{
    if (atomic_load_explicit(&op->done, memory_order_acquire))
        return 0;
    uint64_t start = umbp_now_ns();
    uint64_t deadline = timeout_ns == UINT64_MAX ? UINT64_MAX : start + timeout_ns;
    uint64_t spin = op_spin_ns(op);
    bool kv = spin > WAIT_SPIN_NS;
    uint64_t spin_until = start + spin < deadline ? start + spin : deadline;
    for (unsigned i = 1; spin; i++) {
        if (atomic_load_explicit(&op->done, memory_order_acquire))
            return 0;
        if (kv && start + WAIT_SPIN_NS < umbp_now_ns())
            sched_yield(); /* past the short poll: leave the core to others */
        else
            umbp_cpu_relax();
        if ((i & 63) == 0 && umbp_now_ns() >= spin_until)
            break;
    }
    atomic_fetch_add(&op->waiters, 1);
    int rc = UMBP_E_INPROGRESS;
    for (;;) {
        if (atomic_load(&op->done)) {
            rc = 0;
            break;
        }
        uint64_t now = umbp_now_ns();
        if (now >= deadline)
            break;
        struct timespec ts, *tsp = NULL;
        if (deadline != UINT64_MAX) {
            uint64_t left = deadline - now;
            ts.tv_sec = (time_t)(left / 1000000000ull);
            ts.tv_nsec = (long)(left % 1000000000ull);
            tsp = &ts;
        }
        umbp_futex(&op->done, FUTEX_WAIT_PRIVATE, 0, tsp);
    }
    atomic_fetch_sub(&op->waiters, 1);
    return rc;
}

/* ---- public completion API ---------------------------------------------- */

int umbp_op_test(umbp_op_t *op)
{
    if (!op)
        return -EINVAL;
    return atomic_load_explicit(&op->done, memory_order_acquire) ? 0 : UMBP_E_INPROGRESS;
}

int umbp_op_wait(umbp_op_t *op, int timeout_ms)
{
    if (!op)
        return -EINVAL;
    int64_t ms = timeout_ms < 0 ? op->rt->core->timeout_ms : timeout_ms;
    return op_wait_ns(op, ms_to_ns(ms));
}

size_t umbp_op_num_keys(const umbp_op_t *op) { return op ? op->n : 0; }

int umbp_op_key_status(const umbp_op_t *op, size_t i)
{
    if (!op || i >= op->n || (op->kind != OP_PUT && op->kind != OP_GET))
        return -EINVAL;
    if (!atomic_load_explicit(&((umbp_op_t *)op)->done, memory_order_acquire))
        return UMBP_E_INPROGRESS;
    return op->status[i];
}

int umbp_op_statuses(const umbp_op_t *op, int32_t *out, size_t n)
{
    if (!op || (n && !out) || (op->kind != OP_PUT && op->kind != OP_GET))
        return -EINVAL;
    if (!atomic_load_explicit(&((umbp_op_t *)op)->done, memory_order_acquire))
        return UMBP_E_INPROGRESS;
    size_t m = n < op->n ? n : op->n;
    for (size_t i = 0; i < m; i++)
        out[i] = op->status[i];
    return (int)m;
}

size_t umbp_op_num_ok(const umbp_op_t *op)
{
    if (!op || !atomic_load_explicit(&((umbp_op_t *)op)->done, memory_order_acquire))
        return 0;
    return op->num_ok;
}

void umbp_op_release(umbp_op_t *op)
{
    if (!op)
        return;
    /* a get released in flight stops copying at its next chunk (the loop
     * notices within a couple of ms); its destination may be written until
     * then, so a caller that reuses it waits for the op instead */
    atomic_store_explicit(&op->released, true, memory_order_relaxed);
    op_put_ref(op);
}
