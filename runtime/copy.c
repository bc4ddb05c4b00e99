/*
 * copy.c - host copy workers.
 *
 * The loop thread never copies payload bytes: it splits an op's keys into a
 * few jobs (at most 2 per worker, at least ~1 MiB each) and queues them on an
 * MPMC ck ring; workers sleep on a futex event count when the ring is empty.
 * A job touches only its own keys' ranges and regions.  The worker that
 * finishes an op's last job posts the op back to its actor (op->hdr.type was
 * set by the dispatcher); the acq_rel decrement of jobs_left orders every
 * worker's copies before that post, and the mailbox ring orders the post
 * before the actor reads the op.
 *
 * The ring is sized for max_inflight_ops * max jobs per op, so queueing a job
 * can never fail.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rt.h"

#define JOB_MIN_BYTES (1u << 20)

static long futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

static void run_job(struct copy_job *j)
{
    /* pairs with the dispatcher's release store of j->op: the job and
     * everything the loop thread wrote into the op before queueing it are
     * visible here */
    struct umbp_op *op = atomic_load_explicit(&j->op, memory_order_acquire);
    bool to_object = op->kind == OP_PUT;
    for (uint32_t k = j->first; k < j->last; k++) {
        if (op->state[k] != KEY_COPYING)
            continue;
        uint8_t *obj = op->reqs[k].region.addr;
        for (uint32_t r = op->range_first[k]; r < op->range_first[k + 1]; r++) {
            const umbp_range_t *rg = &op->ranges[r];
            if (to_object)
                memcpy(obj + rg->offset, rg->ptr, rg->len);
            else
                memcpy(rg->ptr, obj + rg->offset, rg->len);
        }
    }
    if (atomic_fetch_sub_explicit(&op->jobs_left, 1, memory_order_acq_rel) == 1)
        rt_post(op->rt, &op->hdr); /* cannot fail: see rt.h */
}

static void *copy_worker(void *arg)
{
    struct umbp_runtime *rt = arg;
    struct copy_pool *cp = &rt->copy;
    for (;;) {
        void *j;
        if (ck_ring_dequeue_mpmc(&cp->ring, cp->buf, &j)) {
            run_job(j);
            continue;
        }
        uint32_t seq = atomic_load(&cp->seq);
        atomic_fetch_add(&cp->sleepers, 1);
        /* Re-check after announcing ourselves: a producer that enqueued
         * before reading `sleepers` bumped seq, so the futex wait returns. */
        if (ck_ring_dequeue_mpmc(&cp->ring, cp->buf, &j)) {
            atomic_fetch_sub(&cp->sleepers, 1);
            run_job(j);
            continue;
        }
        if (atomic_load(&cp->quit)) {
            atomic_fetch_sub(&cp->sleepers, 1);
            return NULL;
        }
        futex(&cp->seq, FUTEX_WAIT_PRIVATE, seq);
        atomic_fetch_sub(&cp->sleepers, 1);
    }
}

static void wake_workers(struct copy_pool *cp, int n)
{
    atomic_fetch_add(&cp->seq, 1);
    if (atomic_load(&cp->sleepers))
        futex(&cp->seq, FUTEX_WAKE_PRIVATE, n);
}

int copy_pool_start(struct umbp_runtime *rt, int nthreads, unsigned ops)
{
    struct copy_pool *cp = &rt->copy;
    unsigned cap = 2;
    while (cap < ops * (unsigned)(2 * nthreads) + 1)
        cap <<= 1;
    cp->buf = calloc(cap, sizeof(ck_ring_buffer_t));
    cp->threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (!cp->buf || !cp->threads)
        return -ENOMEM;
    ck_ring_init(&cp->ring, cap);
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
    free(cp->threads);
    free(cp->buf);
    cp->threads = NULL;
    cp->buf = NULL;
    cp->nthreads = 0;
}

static uint64_t key_bytes(const struct umbp_op *op, size_t k)
{
    uint64_t b = 0;
    for (uint32_t r = op->range_first[k]; r < op->range_first[k + 1]; r++)
        b += op->ranges[r].len;
    return b;
}

void copy_dispatch(struct umbp_op *op, enum msg_type then)
{
    struct umbp_runtime *rt = op->rt;
    struct copy_pool *cp = &rt->copy;
    uint64_t total = 0;
    for (size_t k = 0; k < op->n; k++)
        if (op->state[k] == KEY_COPYING)
            total += key_bytes(op, k);
    uint32_t max_jobs = (uint32_t)(2 * cp->nthreads);
    uint32_t njobs = (uint32_t)(total / JOB_MIN_BYTES);
    if (njobs < 1)
        njobs = 1;
    if (njobs > max_jobs)
        njobs = max_jobs;
    if (njobs > op->cap_jobs)
        njobs = op->cap_jobs;
    uint64_t per_job = (total + njobs - 1) / njobs;

    op->hdr.type = (uint16_t)then;
    uint32_t nj = 0;
    uint64_t acc = 0;
    uint32_t first = 0;
    for (size_t k = 0; k < op->n; k++) {
        if (op->state[k] == KEY_COPYING)
            acc += key_bytes(op, k);
        bool last_key = k + 1 == op->n;
        if ((acc >= per_job && nj + 1 < njobs) || last_key) {
            op->jobs[nj].first = first;
            op->jobs[nj].last = (uint32_t)k + 1;
            nj++;
            first = (uint32_t)k + 1;
            acc = 0;
        }
    }
    op->num_jobs = nj;
    atomic_store_explicit(&op->jobs_left, nj, memory_order_release);
    for (uint32_t j = 0; j < nj; j++) {
        atomic_store_explicit(&op->jobs[j].op, op, memory_order_release);
        ck_ring_enqueue_mpmc(&cp->ring, cp->buf, &op->jobs[j]);
    }
    wake_workers(cp, (int)nj);
}
