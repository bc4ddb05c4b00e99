/*
 * copy.c - moving an op's bytes: one mover per op, and the host copy workers.
 *
 * The mover: the GPU copy engine moves every key of a umbp_kv_* op (chosen
 * once, when the op arrives: mover_choose).  A host put or get chooses per
 * key, by the region the tier handed out: memcpy by the copy workers when
 * the region is mapped (addr != NULL), the tier's own read/write members
 * when it is not (addr == NULL: a peer's memory), so one batch may use both
 * (a composite tier whose keys are partly local, partly remote).  The store
 * and load actors call move_dispatch() and get the op back with the message
 * they named once every key's move has ended; nothing else in the runtime
 * knows how bytes move.
 *
 * A host op's moves end through one count, jobs_left: one per copy job, one
 * for the tier's moves (held until the last read/write completes: inline, or
 * later from the tier's watcher) and one held by move_dispatch itself until
 * everything is submitted, so the op goes back exactly once, after the last
 * of them, whichever thread that is on (a worker or the loop).
 *
 * Copy workers.  The loop thread never copies payload bytes: it splits an
 * op's keys into a few jobs (at most 2 per worker, at least ~1 MiB each) and
 * queues them on one of two MPMC ck rings: gets (the latency-critical
 * restores) on the high ring, puts (bulk offload) on the low one.  Workers
 * copy in chunks of COPY_CHUNK bytes (or one range, if smaller).  Workers
 * sleep on a futex event count when both rings are empty.
 *
 * Priority with a guaranteed share for stores (tests/integration/
 * test_copy_share.c; bench_load_latency --mix measures both latencies).
 * Restores go first: a worker takes a high job before a low one, and between
 * two chunks of a job it runs waiting high jobs (one level deep: those run
 * without yielding).  But
 * strict priority starved stores: with hundreds of gets in flight the high
 * ring never empties, and puts waited until the gets stopped (0.8-1.7 s in
 * a burst).  So each worker counts the high jobs it takes while a low job is
 * waiting (queued on the low ring, or the one it is running), and after
 * COPY_HIGH_BURST of them it copies one chunk of a low job before the next
 * high one; the count restarts at every low chunk it copies.  Guarantees,
 * per worker and whatever the mix:
 *   - stores: while a low job waits, at most COPY_HIGH_BURST high jobs run
 *     (plus the one running when it was queued) before a worker takes it or
 *     copies its next chunk: at least one chunk of stores per
 *     COPY_HIGH_BURST restore jobs, so puts complete while gets keep coming;
 *   - restores: a queued high job waits for the chunk being copied, and
 *     for one store chunk per COPY_HIGH_BURST high jobs the worker runs
 *     before it; with no more than COPY_HIGH_BURST restores ahead of it,
 *     as under strict priority, it waits for at most one store chunk
 *     (512 KiB: ~0.1 ms at host memcpy speed).  One exception: once the
 *     count is reached, a restore job being copied no longer yields to
 *     queued ones (the store chunk comes right after it), so a small
 *     restore may then wait for the rest of a large one.
 * With no low job waiting the count stays at 0: restores alone run exactly
 * as under strict priority (a small one waits behind a large one for at
 * most one chunk).
 *
 * Deadlines.  A job is QUEUED, then TAKEN by a worker (CAS) or CANCELLED by
 * the loop (CAS) when its op passes its deadline or its caller released it
 * in flight; a cancelled op's running jobs stop at the next chunk.  The op
 * goes back to its actor when every job is done or cancelled, with
 * op->cancelled set, so it completes by its deadline unless one chunk is
 * still being copied.  Every queued job holds a reference on its op, so an
 * op whose jobs were cancelled is not recycled while a worker may still
 * dequeue them.
 *
 * Ordering: the dispatcher's release store of job->op publishes everything
 * the loop wrote into the op; the acq_rel decrement of jobs_left orders every
 * worker's copies before the post back; the mailbox ring orders the post
 * before the actor reads the op.  Both rings are sized for every job of every
 * op, so queueing never fails.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"
#include "sync.h"
#include "tier_call.h"

#define JOB_MIN_BYTES (1u << 20)
#define COPY_CHUNK (512u << 10)
/* High jobs a worker runs while a low job waits before it copies one low
 * chunk (see the prose above): the stores' share is at least one chunk in
 * COPY_HIGH_BURST + 1 jobs. */
#define COPY_HIGH_BURST 4u

enum { JOB_QUEUED, JOB_TAKEN, JOB_CANCELLED };

/* ---- workers -------------------------------------------------------------- */

/* One worker's state; only its thread touches it. */
struct worker {
    struct copy_pool *cp;
    unsigned high_run; /* high jobs taken while a low job waited, since the
                          last low chunk this worker copied */
};

static bool dequeue_high(struct copy_pool *cp, struct copy_job **j)
{
    return ck_ring_dequeue_mpmc(&cp->ring_hi, cp->buf_hi, (void **)j);
}

static bool dequeue_low(struct copy_pool *cp, struct copy_job **j)
{
    return ck_ring_dequeue_mpmc(&cp->ring_lo, cp->buf_lo, (void **)j);
}

static bool dequeue_any(struct copy_pool *cp, struct copy_job **j)
{
    return dequeue_high(cp, j) || dequeue_low(cp, j);
}

/* A job on the low ring.  Approximate (another worker may take it next),
 * which only decides whose turn it is, never whether a job runs. */
static bool low_queued(struct copy_pool *cp) { return ck_ring_size(&cp->ring_lo) != 0; }

static void run_entry(struct worker *w, struct copy_job *j, bool may_yield);

/* Counts a high job about to run; low_waits: a low job waits meanwhile. */
static void count_high(struct worker *w, bool low_waits)
{
    w->high_run = low_waits ? w->high_run + 1 : 0;
}

/* Between chunks: restores waiting on the high ring go first, unless the
 * stores' turn has come (in_low: the job being copied is a store, so one
 * waits). */
static void yield_to_high(struct worker *w, bool in_low)
{
    struct copy_job *h;
    for (;;) {
        bool low_waits = in_low || low_queued(w->cp);
        if (low_waits && w->high_run >= COPY_HIGH_BURST)
            return;
        if (!dequeue_high(w->cp, &h))
            return;
        count_high(w, low_waits);
        run_entry(w, h, false);
    }
}

static bool op_cancelled(struct umbp_op *op)
{
    return atomic_load_explicit(&op->cancel, memory_order_relaxed);
}

/* A put writes into a region only before its deadline: the server that
 * granted it may hand the region to another writer once the deadline this
 * client declared has passed (backends/shm/shm.h), so a worker checks the
 * clock itself before every chunk instead of waiting for the loop's timer,
 * which a busy or stalled loop thread could delay. */
static bool put_expired(struct umbp_op *op)
{
    if (umbp_now_ns() < op->deadline_ns)
        return false;
    atomic_store_explicit(&op->write_expired, true, memory_order_relaxed);
    return true;
}

/* Copies one range in chunks, letting waiting restores go first after each
 * chunk; false if the op was cancelled meanwhile (or, a put, passed its
 * deadline). */
static bool copy_range(struct worker *w, struct umbp_op *op, uint8_t *obj,
                       const umbp_range_t *rg, bool to_object, bool may_yield)
{
    bool low = op->kind != OP_GET; /* the ring copy_dispatch queued it on */
    for (uint64_t done = 0; done < rg->len;) {
        if (op_cancelled(op) || (to_object && put_expired(op)))
            return false;
        uint64_t n = rg->len - done < COPY_CHUNK ? rg->len - done : COPY_CHUNK;
        if (to_object)
            memcpy(obj + rg->offset + done, (const uint8_t *)rg->ptr + done, n);
        else
            memcpy((uint8_t *)rg->ptr + done, obj + rg->offset + done, n);
        done += n;
        if (low)
            w->high_run = 0; /* a low chunk copied: the stores had their turn */
        if (may_yield)
            yield_to_high(w, low);
    }
    return true;
}

static void run_job(struct worker *w, struct umbp_op *op, struct copy_job *j,
                    bool may_yield)
{
    bool to_object = op->kind == OP_PUT;
    for (uint32_t k = j->first; k < j->last; k++) {
        uint8_t *obj = op->reqs[k].region.addr;
        if (op->state[k] != KEY_COPYING || !obj)
            continue; /* not moving, or the tier moves it (tier_dispatch) */
        for (uint32_t r = op->range_first[k]; r < op->range_first[k + 1]; r++)
            if (!copy_range(w, op, obj, &op->ranges[r], to_object, may_yield))
                return;
    }
}

static void job_finished(struct umbp_op *op)
{
    if (atomic_fetch_sub_explicit(&op->jobs_left, 1, memory_order_acq_rel) == 1)
        rt_post(op->rt, &op->hdr); /* cannot fail: see rt.h */
}

static void run_entry(struct worker *w, struct copy_job *j, bool may_yield)
{
    /* pairs with the dispatcher's release store of j->op: the job and
     * everything the loop thread wrote into the op before queueing it are
     * visible here */
    struct umbp_op *op = atomic_load_explicit(&j->op, memory_order_acquire);
    uint32_t queued = JOB_QUEUED;
    if (atomic_compare_exchange_strong(&j->state, &queued, JOB_TAKEN)) {
        run_job(w, op, j, may_yield);
        job_finished(op);
    }
    op_put_ref(op); /* the queue's reference (see copy_dispatch) */
}

/* The next job by the rule in the prose above: high first, unless a low
 * job has waited through COPY_HIGH_BURST high ones. */
static bool next_job(struct worker *w, struct copy_job **j)
{
    bool low_waits = low_queued(w->cp);
    if (low_waits && w->high_run >= COPY_HIGH_BURST && dequeue_low(w->cp, j))
        return true;
    if (dequeue_high(w->cp, j)) {
        count_high(w, low_waits);
        return true;
    }
    return dequeue_low(w->cp, j);
}

static void *copy_worker(void *arg)
{
    struct umbp_runtime *rt = arg;
    struct copy_pool *cp = &rt->copy;
    struct worker w = {.cp = cp};
    for (;;) {
        struct copy_job *j;
        if (next_job(&w, &j)) {
            run_entry(&w, j, true);
            continue;
        }
        uint32_t seq = atomic_load(&cp->seq);
        atomic_fetch_add(&cp->sleepers, 1);
        /* Re-check after announcing ourselves: a producer that enqueued
         * before reading `sleepers` bumped seq, so the futex wait returns. */
        if (next_job(&w, &j)) {
            atomic_fetch_sub(&cp->sleepers, 1);
            run_entry(&w, j, true);
            continue;
        }
        if (atomic_load(&cp->quit)) {
            atomic_fetch_sub(&cp->sleepers, 1);
            return NULL;
        }
        umbp_futex(&cp->seq, FUTEX_WAIT_PRIVATE, seq, NULL);
        atomic_fetch_sub(&cp->sleepers, 1);
    }
}

static void wake_workers(struct copy_pool *cp, int n)
{
    atomic_fetch_add(&cp->seq, 1);
    if (atomic_load(&cp->sleepers))
        umbp_futex(&cp->seq, FUTEX_WAKE_PRIVATE, n, NULL);
}

int copy_pool_start(struct umbp_runtime *rt, int nthreads, unsigned ops)
{
    struct copy_pool *cp = &rt->copy;
    unsigned cap = 2;
    while (cap < ops * (unsigned)(2 * nthreads) + 1)
        cap <<= 1;
    cp->buf_hi = calloc(cap, sizeof(ck_ring_buffer_t));
    cp->buf_lo = calloc(cap, sizeof(ck_ring_buffer_t));
    cp->threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (!cp->buf_hi || !cp->buf_lo || !cp->threads)
        return -ENOMEM;
    ck_ring_init(&cp->ring_hi, cap);
    ck_ring_init(&cp->ring_lo, cap);
    cp->size = cap;
    for (int i = 0; i < nthreads; i++) {
        int rc = pthread_create(&cp->threads[i], NULL, copy_worker, rt);
        if (rc) {
            copy_pool_stop(rt);
            return -rc;
        }
        cp->nthreads++;
    }
    return 0;
}

void copy_pool_stop(struct umbp_runtime *rt)
{
    struct copy_pool *cp = &rt->copy;
    atomic_store(&cp->quit, true);
    wake_workers(cp, INT_MAX);
    /* quit is stored before seq is bumped: a worker either saw the old seq
     * (its futex wait returns at once) or sees quit on its re-check. */
    for (int i = 0; i < cp->nthreads; i++)
        pthread_join(cp->threads[i], NULL);
    /* jobs still queued (their ops were cancelled) hold op references */
    struct copy_job *j;
    while (dequeue_any(cp, &j))
        op_put_ref(atomic_load_explicit(&j->op, memory_order_acquire));
    free(cp->threads);
    free(cp->buf_hi);
    free(cp->buf_lo);
    cp->threads = NULL;
    cp->buf_hi = cp->buf_lo = NULL;
    cp->nthreads = 0;
}

/* ---- dispatch (loop thread) -------------------------------------------------- */

/* A host key the copy workers move: its region is mapped. */
static bool key_by_memcpy(const struct umbp_op *op, size_t k)
{
    return op->state[k] == KEY_COPYING && op->reqs[k].region.addr;
}

/* A host key the tier moves with read/write: its region is not mapped. */
static bool key_by_tier(const struct umbp_op *op, size_t k)
{
    return op->state[k] == KEY_COPYING && !op->reqs[k].region.addr;
}

static uint64_t key_bytes(const struct umbp_op *op, size_t k)
{
    uint64_t b = 0;
    for (uint32_t r = op->range_first[k]; r < op->range_first[k + 1]; r++)
        b += op->ranges[r].len;
    return b;
}

static void copying_link(struct umbp_runtime *rt, struct umbp_op *op)
{
    op->cprev = NULL;
    op->cnext = rt->copying_head;
    if (rt->copying_head)
        rt->copying_head->cprev = op;
    rt->copying_head = op;
    if (!ev_is_active(&rt->copy_timer))
        ev_timer_again(rt->loop, &rt->copy_timer);
}

void copying_unlink(struct umbp_runtime *rt, struct umbp_op *op)
{
    if (op->cprev)
        op->cprev->cnext = op->cnext;
    else if (rt->copying_head == op)
        rt->copying_head = op->cnext;
    else
        return; /* not linked */
    if (op->cnext)
        op->cnext->cprev = op->cprev;
    op->cprev = op->cnext = NULL;
    if (!rt->copying_head)
        ev_timer_stop(rt->loop, &rt->copy_timer);
}

/* How many copy jobs the op's mapped keys make (0 if none) and the bytes
 * each takes: at most 2 per worker, at least JOB_MIN_BYTES each. */
static uint32_t copy_jobs_plan(struct umbp_op *op, uint64_t *per_job)
{
    struct copy_pool *cp = &op->rt->copy;
    uint64_t total = 0;
    bool any = false;
    for (size_t k = 0; k < op->n; k++)
        if (key_by_memcpy(op, k)) {
            any = true;
            total += key_bytes(op, k);
        }
    if (!any)
        return 0;
    uint32_t max_jobs = (uint32_t)(2 * cp->nthreads);
    uint32_t njobs = (uint32_t)(total / JOB_MIN_BYTES);
    if (njobs < 1)
        njobs = 1;
    if (njobs > max_jobs)
        njobs = max_jobs;
    if (njobs > op->cap_jobs)
        njobs = op->cap_jobs;
    *per_job = (total + njobs - 1) / njobs;
    return njobs;
}

/* Splits the op's keys into at most copy_jobs_plan's number of jobs of
 * about per_job bytes of mapped keys each (a large key may make fewer);
 * returns how many. */
static uint32_t copy_jobs_split(struct umbp_op *op)
{
    uint64_t per_job = 0;
    uint32_t njobs = copy_jobs_plan(op, &per_job);
    if (!njobs)
        return 0;
    uint32_t nj = 0;
    uint64_t acc = 0;
    uint32_t first = 0;
    for (size_t k = 0; k < op->n; k++) {
        if (key_by_memcpy(op, k))
            acc += key_bytes(op, k);
        bool last_key = k + 1 == op->n;
        if ((acc >= per_job && nj + 1 < njobs) || last_key) {
            op->jobs[nj].first = first;
            op->jobs[nj].last = (uint32_t)k + 1;
            atomic_store_explicit(&op->jobs[nj].state, JOB_QUEUED, memory_order_relaxed);
            nj++;
            first = (uint32_t)k + 1;
            acc = 0;
        }
    }
    return nj;
}

/* Queues the op's jobs [0, nj); jobs_left already holds one count for each
 * besides the others (host_dispatch). */
static void copy_dispatch(struct umbp_op *op, uint32_t nj)
{
    struct umbp_runtime *rt = op->rt;
    struct copy_pool *cp = &rt->copy;
    op->num_jobs = nj;
    atomic_fetch_add_explicit(&op->refs, nj, memory_order_relaxed); /* one per queued job */
    copying_link(rt, op);
    bool high = op->kind == OP_GET;
    for (uint32_t j = 0; j < nj; j++) {
        atomic_store_explicit(&op->jobs[j].op, op, memory_order_release);
        if (high)
            ck_ring_enqueue_mpmc(&cp->ring_hi, cp->buf_hi, &op->jobs[j]);
        else
            ck_ring_enqueue_mpmc(&cp->ring_lo, cp->buf_lo, &op->jobs[j]);
    }
    wake_workers(cp, (int)nj);
}

/* Loop thread: stops an op's copy.  Running jobs stop at their next chunk;
 * queued ones are cancelled here, and if that ends the op's copy the op is
 * posted back now (a worker never will). */
void copy_cancel(struct umbp_op *op, bool by_release)
{
    if (atomic_exchange(&op->cancel, true))
        return;
    op->cancelled = true;
    op->cut_by_release = by_release;
    for (uint32_t j = 0; j < op->num_jobs; j++) {
        uint32_t queued = JOB_QUEUED;
        if (atomic_compare_exchange_strong(&op->jobs[j].state, &queued, JOB_CANCELLED))
            job_finished(op);
    }
}

static void on_copy_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct umbp_runtime *rt = w->data;
    uint64_t now = umbp_now_ns();
    for (struct umbp_op *op = rt->copying_head; op; op = op->cnext) {
        if (op->cancelled)
            continue;
        if (op->kind == OP_GET && atomic_load_explicit(&op->released, memory_order_relaxed))
            copy_cancel(op, true); /* nobody waits for these bytes */
        else if (now >= op->deadline_ns)
            copy_cancel(op, false);
    }
}

void tier_regions_revoked(void *ctx)
{
    struct umbp_runtime *rt = ctx;
    for (struct umbp_op *op = rt->copying_head; op; op = op->cnext)
        if (op->kind == OP_PUT && !op->cancelled) {
            copy_cancel(op, false);
            op->cut_by_loss = true;
        }
}

void copy_timer_init(struct umbp_runtime *rt)
{
    ev_init(&rt->copy_timer, on_copy_timer);
    rt->copy_timer.repeat = 0.002;
    rt->copy_timer.data = rt;
}

/* ---- the tier's own read/write (regions it does not map) ---------------------- */

/* Loop thread: the tier's moves of the op have all ended (their count in
 * jobs_left goes). */
static void tier_move_end(struct umbp_op *op)
{
    if (--op->tier_moves_left == 0)
        job_finished(op);
}

static void tier_moved(void *arg, int rc)
{
    struct key_move *m = arg;
    m->rc = rc < 0 ? rc : 0;
    tier_move_end(m->op);
}

/* Loop thread: the tier's read/write of every unmapped key; jobs_left
 * holds one count for all of them. */
static void tier_dispatch(struct umbp_op *op)
{
    struct umbp_runtime *rt = op->rt;
    op->tier_moves_left = 1; /* held until every key is submitted */
    for (size_t k = 0; k < op->n; k++) {
        if (!key_by_tier(op, k))
            continue;
        struct key_move *m = &op->moves[k];
        *m = (struct key_move){.op = op, .rc = 0};
        op->tier_moves_left++;
        const umbp_range_t *rg = &op->ranges[op->range_first[k]];
        size_t nr = op->range_first[k + 1] - op->range_first[k];
        if (op->kind == OP_PUT)
            tier_write(rt->tier, &op->reqs[k].region, rg, nr, tier_moved, m);
        else
            tier_read(rt->tier, &op->reqs[k].region, rg, nr, tier_moved, m);
    }
    tier_move_end(op);
}

/* ---- the one entry point ----------------------------------------------------- */

void mover_choose(struct umbp_op *op)
{
    op->mover = op->kv_layout ? MOVER_GPU : MOVER_HOST;
}

enum mover move_key_mover(const struct umbp_op *op, size_t k)
{
    if (op->mover == MOVER_GPU)
        return MOVER_GPU;
    return op->reqs[k].region.addr ? MOVER_MEMCPY : MOVER_TIER;
}

/* A host op: copy jobs for its mapped keys, the tier's read/write for the
 * others, then the op goes back once all have ended (see the prose atop). */
static void host_dispatch(struct umbp_op *op, enum msg_type then)
{
    uint32_t njobs = copy_jobs_split(op);
    bool by_tier = false;
    for (size_t k = 0; k < op->n && !by_tier; k++)
        by_tier = key_by_tier(op, k);
    op->hdr.type = (uint16_t)then;
    op->num_jobs = 0;
    /* every count before the first job is queued: a worker's decrement must
     * never reach 0 while a later part is still to come.  Release: pairs
     * with the acq_rel decrements, so what the loop wrote is seen by whoever
     * posts the op. */
    atomic_store_explicit(&op->jobs_left, njobs + (by_tier ? 1u : 0u) + 1u,
                          memory_order_release);
    if (njobs)
        copy_dispatch(op, njobs);
    if (by_tier)
        tier_dispatch(op);
    job_finished(op); /* move_dispatch's own count: may post the op now */
}

void move_dispatch(struct umbp_op *op, enum msg_type then)
{
    if (op->mover == MOVER_GPU)
        gpu_dispatch(op, then);
    else
        host_dispatch(op, then);
}

int move_key_rc(const struct umbp_op *op, size_t k)
{
    if (op->cancelled)
        return op->cut_by_release ? UMBP_E_NOT_ATTEMPTED
               : op->cut_by_loss  ? -ECONNRESET
                                  : UMBP_E_TIMEOUT;
    switch (move_key_mover(op, k)) {
    case MOVER_GPU: return op->gpu_rc < 0 ? op->gpu_rc : 0;
    case MOVER_TIER: return op->moves[k].rc < 0 ? op->moves[k].rc : 0;
    default: return 0;
    }
}

void move_finished(struct umbp_op *op)
{
    /* a worker that stopped at the put's deadline did not copy every byte;
     * the jobs_left decrement ordered its store before this load */
    if (atomic_load_explicit(&op->write_expired, memory_order_relaxed) && !op->cancelled)
        op->cancelled = true;
    if (op->mover == MOVER_HOST)
        copying_unlink(op->rt, op); /* nothing if it had no copy jobs */
    else
        kv_transfer_done(op->rt);
}
