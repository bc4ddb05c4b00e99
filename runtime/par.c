/*
 * par.c - a small parallel-for for CPU-bound batch work of the API's
 * caller (key derivation: one BLAKE2b compression per key, 512 keys are
 * 90-130 us on one core), so that a scheduler's lookup of a long prompt, or
 * of one prompt for every TP rank, does not pay it serially.
 *
 * Helpers are started on first use: UMBP_PAR_THREADS of them (default: one
 * fewer than the CPUs this process may use (umbp_usable_cpus: affinity and
 * cgroup quota), at most 3, and none below 4 CPUs; 0 turns the pool off).  A job is a
 * range [0, n) cut into chunks; the caller and the helpers take chunks from
 * one atomic ticket until none is left, so a helper that wakes late only
 * takes less.  The ticket carries the job's generation: a helper takes a
 * chunk only of the job whose description it read, and the caller returns
 * only when every chunk it handed out is done, so a description is never
 * rewritten under a helper.  One job at a time: a second concurrent caller
 * runs its job alone.  Helpers poll briefly after a job (back-to-back jobs
 * are common: one per TP rank) and then sleep on a futex.
 *
 * fork: the child has no helpers; an atfork handler resets the pool, which
 * starts again on first use there.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "par.h"
#include "sync.h"
#include "util.h"

#define PAR_MAX_HELPERS 3
#define PAR_POLL_NS 20000ull

struct par_pool {
    pthread_mutex_t lock;             /* one job at a time */
    pthread_once_t once;
    bool started;
    int helpers;
    pthread_t threads[PAR_MAX_HELPERS];
    _Atomic uint32_t gen;             /* bumped per job; helpers futex-wait on it */
    _Atomic uint64_t ticket;          /* gen << 32 | next chunk */
    _Atomic uint32_t done;            /* chunks finished in this job */
    _Atomic uint32_t waiting;         /* the caller sleeps on done */
    /* the job, written before gen is bumped */
    par_fn fn;
    void *ctx;
    size_t n, chunk;
    _Atomic uint32_t nchunks;         /* read before a chunk is taken: atomic */
};

static struct par_pool pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT};

/* Takes and runs chunks of job gen until none is left (or another job
 * started); the number run. */
static uint32_t run_chunks(uint32_t gen)
{
    uint32_t ran = 0;
    uint64_t t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(t >> 32) != gen ||
            (uint32_t)t >= atomic_load_explicit(&pool.nchunks, memory_order_relaxed))
            return ran;
        if (!atomic_compare_exchange_weak_explicit(&pool.ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        /* chunk (uint32_t)t of job gen: not done, so the job's description
         * (read after the ticket's acquire) is still this job's */
        size_t lo = (size_t)(uint32_t)t * pool.chunk;
        size_t hi = lo + pool.chunk < pool.n ? lo + pool.chunk : pool.n;
        pool.fn(pool.ctx, lo, hi);
        uint32_t nchunks = atomic_load_explicit(&pool.nchunks, memory_order_relaxed);
        if (atomic_fetch_add(&pool.done, 1) + 1 == nchunks && atomic_load(&pool.waiting))
            umbp_futex(&pool.done, FUTEX_WAKE_PRIVATE, 1, NULL);
        ran++;
        t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    }
}

static void *helper(void *arg)
{
    (void)arg;
    uint32_t seen = atomic_load_explicit(&pool.gen, memory_order_acquire);
    for (;;) {
        uint64_t until = umbp_now_ns() + PAR_POLL_NS;
        uint32_t g;
        unsigned i = 0;
        while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen) {
            umbp_cpu_relax();
            if ((++i & 63) == 0 && umbp_now_ns() >= until) {
                umbp_futex(&pool.gen, FUTEX_WAIT_PRIVATE, seen, NULL);
                until = umbp_now_ns() + PAR_POLL_NS;
            }
        }
        seen = g;
        run_chunks(g);
    }
    return NULL;
}

static void after_fork_child(void)
{
    /* no helpers here; the parent's may have held the lock */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pool.lock = fresh;
    pool.started = false;
    pool.helpers = 0;
    pool.once = (pthread_once_t)PTHREAD_ONCE_INIT;
}

static void pool_start(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
    /* Below 4 CPUs a helper competes with the runtime's own threads (loop,
     * copy workers) and its wake-up costs more than it saves: on a 2-vCPU VM
     * 512 keys took 103-115 us with one against 91 us without.  The CPUs this
     * process may use (affinity, cgroup quota), not the host's. */
    long cpus = umbp_usable_cpus();
    int want = cpus >= 4 ? (int)(cpus - 1) : 0;
    if (want > PAR_MAX_HELPERS)
        want = PAR_MAX_HELPERS;
    const char *env = getenv("UMBP_PAR_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 0 && v <= PAR_MAX_HELPERS)
            want = (int)v;
        else /* no runtime to refuse it through: say so, keep the default */
            umbp_log(UMBP_LOG_WARN, "UMBP_PAR_THREADS=%s: must be an integer 0..%d; using %d "
                     "derivation helpers", env, PAR_MAX_HELPERS, want);
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (int i = 0; i < want; i++) {
        if (pthread_create(&pool.threads[i], &attr, helper, NULL) != 0)
            break;
        pool.helpers++;
    }
    pthread_attr_destroy(&attr);
    pool.started = true;
}

int par_helpers(void)
{
    pthread_once(&pool.once, pool_start);
    return pool.helpers;
}

void par_for(size_t n, size_t chunk, par_fn fn, void *ctx)
{
    if (chunk == 0)
        chunk = 1;
    uint64_t nchunks = (n + chunk - 1) / chunk;
    if (nchunks < 2 || nchunks > UINT32_MAX || par_helpers() == 0 ||
        pthread_mutex_trylock(&pool.lock) != 0) {
        if (n)
            fn(ctx, 0, n);
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.chunk = chunk;
    atomic_store_explicit(&pool.nchunks, (uint32_t)nchunks, memory_order_relaxed);
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.waiting, 0, memory_order_relaxed);
    uint32_t g = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&pool.ticket, (uint64_t)g << 32, memory_order_release);
    atomic_store_explicit(&pool.gen, g, memory_order_release);
    umbp_futex(&pool.gen, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL);
    run_chunks(g);
    /* the helpers' chunks are a few microseconds each: poll, and sleep only
     * if one was preempted (seq_cst: the helper that finishes the last
     * chunk sees `waiting`, or this thread sees the last `done`) */
    uint64_t until = umbp_now_ns() + PAR_POLL_NS;
    unsigned i = 0;
    uint32_t d;
    while ((d = atomic_load(&pool.done)) != nchunks) {
        umbp_cpu_relax();
        if ((++i & 63) == 0 && umbp_now_ns() >= until) {
            atomic_store(&pool.waiting, 1);
            while ((d = atomic_load(&pool.done)) != nchunks)
                umbp_futex(&pool.done, FUTEX_WAIT_PRIVATE, d, NULL);
            break;
        }
    }
    pthread_mutex_unlock(&pool.lock);
}
