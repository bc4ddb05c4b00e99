/*
 * rt.h - the runtime's private structures.
 *
 * Threads and ownership:
 *  - caller threads (the engine's) validate arguments, take an op from the
 *    free list, fill it and post it to an actor's mailbox; they wait on the
 *    op's futex word.  They touch only the op they hold and atomics.
 *  - the loop thread runs libev and the actors (lookup, store, load and
 *    evictor, each with a mailbox; lease, a timer).  It owns the tiers, the actors' lists and timers and
 *    every op between its arrival in a mailbox and its completion, except
 *    while the op's bytes are being copied.
 *  - copy workers run memcpy jobs for put and get ops; while an op has jobs
 *    outstanding the loop thread does not touch its per-key data, and the
 *    worker that finishes the last job posts the op back to its actor.
 *
 * An op is in exactly one place at a time (a mailbox, the copy queue, a wait
 * list), so every mailbox sized to the op pool can never overflow from an
 * internal post; only caller submissions can meet a full pool (-EAGAIN).
 */
#ifndef UMBP_RT_H
#define UMBP_RT_H

#include <ck_ring.h>
#include <ev.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "msg.h"
#include "util.h"
#include "umbp/gpu.h"
#include "umbp/tier.h"
#include "umbp/umbp.h"

/* ---- mailbox: bounded MPSC ck ring + ev_async doorbell ----------------- */

struct umbp_runtime;
typedef void (*mailbox_handler)(struct umbp_runtime *rt, struct msg_hdr *m);

struct mailbox {
    ck_ring_t ring;
    ck_ring_buffer_t *buf;
    unsigned size;
    ev_async doorbell;
    mailbox_handler handle;
    struct umbp_runtime *rt;
    enum actor_id actor;
};

int mailbox_init(struct mailbox *mb, struct umbp_runtime *rt, enum actor_id a,
                 unsigned size, mailbox_handler h);
void mailbox_fini(struct mailbox *mb);
/* Any thread.  0, or -EAGAIN when the ring is full (back-pressure). */
int mailbox_post(struct mailbox *mb, struct msg_hdr *m);
/* Posts to the actor that receives m->type. */
int rt_post(struct umbp_runtime *rt, struct msg_hdr *m);
/* Runs the lookup actor's handling of a posted-equivalent op on the
 * caller's thread when the loop sleeps and the tier is local (true), or
 * does nothing (false: post it).  actor_lookup.c. */
bool lookup_run_inline(struct umbp_runtime *rt, struct umbp_op *op);
/* Posts n messages for one actor with one doorbell: 0, or -EAGAIN when the
 * ring filled (the messages from the first that did not fit are not
 * posted) or one is for another actor (the same). */
int rt_post_many(struct umbp_runtime *rt, struct msg_hdr **m, size_t n);

/* ---- operations -------------------------------------------------------- */

enum op_kind { OP_PUT, OP_GET, OP_LOOKUP, OP_STATS, OP_CLEAR, OP_FLUSH };

/* How bytes move (copy.c).  An op's mover is chosen when it arrives:
 * MOVER_GPU for umbp_kv_* ops, else MOVER_HOST, whose keys each move by
 * their region (move_key_mover): MOVER_MEMCPY when it is mapped, MOVER_TIER
 * when it is not (addr == NULL), so one batch may use both. */
enum mover {
    MOVER_MEMCPY, /* copy workers, between caller memory and mapped regions */
    MOVER_GPU,    /* the GPU copy engine (umbp_kv_store / umbp_kv_load) */
    MOVER_TIER,   /* the tier's read/write, for regions it does not map */
    MOVER_HOST,   /* an op's: MOVER_MEMCPY or MOVER_TIER per key */
};

/* Per-key state of a put or get, beside the tier request. */
enum key_state {
    KEY_TODO,      /* not yet asked of the tier (or waiting for space) */
    KEY_COPYING,   /* region reserved / leased, bytes moving */
    KEY_DONE,      /* final status known */
};

struct umbp_op {
    struct msg_hdr hdr; /* first: the op is its own message */
    struct umbp_runtime *rt;
    enum op_kind kind;
    bool control;             /* from the control pool (fixed per op) */
    _Atomic uint32_t done;    /* futex word: 0 in flight, 1 complete */
    _Atomic uint32_t waiters; /* threads sleeping on done */
    _Atomic uint32_t refs;    /* caller handle + runtime */
    int rc;                   /* overall result of lookup/stats/clear/flush */
    uint64_t submit_ns, deadline_ns, space_deadline_ns;
    uint64_t leases_until_ns; /* get: every lease it was granted lasts until then */
    uint64_t arrival;         /* store actor's arrival number (flush) */
    uint64_t space_gen;       /* put: rt->space_freed_gen when its last round reserved */

    size_t n;                 /* keys in the batch */
    size_t cap_keys, cap_ranges;
    struct umbp_tier_req *reqs;
    struct umbp_tier_req **req_ptrs; /* scratch subset passed to the tier */
    uint8_t *state;           /* enum key_state per key */
    int *status;              /* final status per key */
    uint32_t *range_first;    /* n + 1 indices into ranges */
    umbp_range_t *ranges;
    uint8_t *present;         /* lookup */
    size_t num_ok;

    /* moving the bytes (copy.c): the op's mover chosen on arrival (GPU or
     * host, whose keys choose by region); copy jobs (written by the loop
     * before dispatch, by workers after); jobs_left counts the copy jobs,
     * the tier's moves and move_dispatch's own hold */
    enum mover mover;
    _Atomic uint32_t jobs_left;
    uint32_t num_jobs;
    struct copy_job *jobs;
    uint32_t cap_jobs;
    _Atomic bool cancel;      /* loop -> workers: stop at the next chunk */
    bool cancelled;           /* loop: the deadline or a release cut the move */
    bool cut_by_release;      /* ... a release (not counted as a time-out) */
    bool cut_by_loss;         /* ... the tier lost what granted its regions */
    _Atomic bool write_expired; /* a worker saw the put's deadline pass and
                                   stopped writing (copy.c) */
    _Atomic bool released;    /* caller released the handle in flight */
    struct umbp_op *cprev, *cnext; /* the loop's list of ops being copied */
    struct key_move *moves;   /* MOVER_TIER: per-key result of read/write */
    uint32_t *dup_tab;        /* the duplicate-key check's hash table */
    size_t dup_cap;           /* its slots: a power of two >= 2 * cap_keys */
    uint32_t tier_moves_left;

    /* GPU KV transfers (umbp_kv_store / umbp_kv_load): the layout, the GPU
     * block of each key, the layer subset and the caller's event */
    umbp_kv_layout_t *kv_layout;
    /* a KV transfer the caller submitted (the parent of sliced ones): the
     * layout it counts as busy until it completes, so deregistration cannot
     * free it under the transfer (kv.c) */
    umbp_kv_layout_t *kv_busy;
    uint64_t *kv_block;
    umbp_kv_block_io_t *kv_io;
    uint32_t kv_first_layer, kv_num_layers;
    void *kv_wait_event;
    umbp_gpu_xfer_t *xfer;
    int gpu_rc;               /* result of the last GPU transfer round */
    /* where its time went (umbp_stats_t kv_*): the first GPU submission's
     * start and end, and when the waiter saw the last one finish */
    uint64_t kv_launch_ns, kv_launched_ns, kv_done_ns;
    uint64_t arrive_ns;       /* the store or load actor took it */
    uint64_t tier_done_ns;    /* its first reserve or acquire returned */
    /* A large KV store is split into child ops (gpu_store_slice_blocks keys
     * each) so the store actor reserves and publishes one slice while the GPU
     * copies another; the caller holds the parent, whose statuses the children fill
     * in as they complete. */
    struct umbp_op *parent;
    size_t parent_base;       /* index of this child's first key in parent */
    _Atomic uint32_t children_left;
    struct umbp_op *gnext;    /* GPU waiter queue */
    bool warm;                /* a warm-up: a store aborted, not published (gpu_warm_store);
                                 a load that copies nothing (umbp_kv_warm_load); counts nothing */
    bool kv_xfer;             /* a KV transfer, its parent or a slice of it:
                                 waiters poll through it (op_wait_ns), and its
                                 reservation names the object size to the tier
                                 (reserve_ahead) */

    /* lookup / stats / flush */
    size_t prefix;
    unsigned flags;
    umbp_stats_t stats;
    uint64_t flush_upto;

    /* intrusive links: prev/next for the store actor's list of incomplete
     * puts (and flushes), wnext for the space-waiter list */
    struct umbp_op *prev, *next, *wnext;
};

struct copy_job {
    uint32_t first, last;        /* keys [first, last) */
    _Atomic uint32_t state;      /* QUEUED, TAKEN by a worker, CANCELLED */
    _Atomic(struct umbp_op *) op; /* stored last, with release: the job's
                                     publication edge (see copy.c) */
};

/* MOVER_TIER: one key's tier_read / tier_write in flight. */
struct key_move {
    struct umbp_op *op;
    int rc;
};

#define CONTROL_OPS 64

/* Caller side. */
struct umbp_op *op_get(struct umbp_runtime *rt, enum op_kind kind);
int op_reserve_keys(struct umbp_op *op, size_t n, size_t nranges);
/* Sizes the per-key arrays of the `nops` data ops taken first (the top of
 * the free list) for `n` keys and writes them once, so that the first large
 * batches of a process neither grow them nor fault their pages in; -ENOMEM
 * if an array cannot grow (the ops keep what they had). */
int op_pool_warm(struct umbp_runtime *rt, size_t nops, size_t n);
/* Loop side: finishes the op, wakes waiters, drops the runtime's ref. */
void op_complete(struct umbp_op *op);
void op_put_ref(struct umbp_op *op);
/* Caller side: gives back an op that was never posted. */
void op_abandon(struct umbp_op *op);
/* Blocks up to timeout_ns (UINT64_MAX: forever). 0 done, INPROGRESS not. */
int op_wait_ns(struct umbp_op *op, uint64_t timeout_ns);
/* How long op_wait_ns polls before it sleeps: 0 where poll_wait is off, 50 ms
 * through a KV transfer with gpu_wait_poll, else 50 us. */
uint64_t op_spin_ns(const struct umbp_op *op);

/* ---- copy workers ------------------------------------------------------ */

struct copy_pool {
    pthread_t *threads;
    int nthreads;
    ck_ring_t ring_hi, ring_lo;  /* gets first, then puts */
    ck_ring_buffer_t *buf_hi, *buf_lo;
    unsigned size;
    _Atomic uint32_t seq;     /* futex event count: bumped on every enqueue */
    _Atomic uint32_t sleepers;
    _Atomic bool quit;
};

int copy_pool_start(struct umbp_runtime *rt, int nthreads, unsigned size);
void copy_pool_stop(struct umbp_runtime *rt);
void copy_timer_init(struct umbp_runtime *rt);

/* Loop thread.  mover_choose picks the op's mover (on arrival);
 * move_dispatch moves the bytes of its COPYING keys (a put into the
 * regions, a get out of them) and posts the op back with message `then`;
 * move_finished, first thing when it is back, ends the bookkeeping.  After
 * it, op->cancelled says the move was cut short (deadline or release),
 * op->gpu_rc < 0 that the GPU failed, op->moves[k].rc < 0 that a tier
 * read/write failed. */
void mover_choose(struct umbp_op *op);
/* After the tier handed out key k's region: how its bytes move. */
enum mover move_key_mover(const struct umbp_op *op, size_t k);
void move_dispatch(struct umbp_op *op, enum msg_type then);
void move_finished(struct umbp_op *op);
/* After move_finished: 0 if key k's bytes moved, else the key's status. */
int move_key_rc(const struct umbp_op *op, size_t k);
void copy_cancel(struct umbp_op *op, bool by_release);
/* The tier's env->regions_revoked (loop thread): every put being copied
 * stops writing at its next chunk and fails with -ECONNRESET. */
void tier_regions_revoked(void *ctx);

/* ---- GPU KV path (kv.c) ------------------------------------------------ */

struct kv_entry {
    uint64_t handle;
    umbp_kv_layout_t *layout;
    uint32_t busy;                 /* transfers on it not completed (kv->lock) */
};

struct kv_state {
    pthread_mutex_t lock;          /* engine creation, the layout table */
    /* loop thread: GPU transfers in flight; while any is, an idle watcher
     * keeps the loop polling instead of sleeping, so the waiter's completion
     * is picked up without a wake-up (a core spins for milliseconds at most) */
    uint32_t inflight;
    ev_idle poll;
    umbp_gpu_engine_t *engine;
    void *pool_addr;               /* registered with the engine */
    /* pools the tier mapped later (a new server pool), registered too;
     * the tier never unmaps a mapping while it lives */
    void *more_pools[8];
    size_t nmore;
    _Atomic bool remap;            /* loop -> callers: mapped_memory changed */
    uint64_t remap_retry_ns;       /* a failed registration of it: next try (kv->lock) */
    struct kv_entry *v;
    size_t n, cap;
    uint64_t next_handle;
    bool warmed;                   /* umbp_gpu_engine_warm ran (gpu_warm_transfers) */
    /* object sizes a warm-up store ran for (gpu_warm_store: once per size) */
    uint64_t warm_sizes[8];
    size_t nwarm;
    int warm_store_rc;             /* how the last one went: its key's status (1: none ran) */
    /* a warm-up store registration stopped waiting for (a stalled server):
     * it still reads its cache's layout and block 0 until it completes, so
     * deregistration of that handle, the next warm-up and kv_fini wait for
     * it (kv_warm_reap) */
    umbp_op_t *warm_op;
    umbp_kv_handle_t warm_handle;
    /* waiter thread: waits for transfers, posts their ops back */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    struct umbp_op *qhead, *qtail;
    bool quit;
};

/* Loop thread (through move_dispatch): submits the op's COPYING keys as one
 * GPU transfer; the op is posted back with `then` when it completes
 * (op->gpu_rc says how). */
void gpu_dispatch(struct umbp_op *op, enum msg_type then);
uint32_t kv_xfer_flags(const struct umbp_op *op); /* umbp_kv_xfer_desc_t.flags */
void kv_init(struct umbp_runtime *rt);
/* Loop thread: a GPU transfer's op came back (PUT_COPIED / GET_COPIED). */
void kv_transfer_done(struct umbp_runtime *rt);
void kv_fini(struct umbp_runtime *rt);
/* A transfer counted busy on layout l (op->kv_busy) completed. */
void kv_unbusy(struct umbp_runtime *rt, umbp_kv_layout_t *l);
/* The tier's env->mapping_changed (loop thread). */
void tier_mapping_changed(void *ctx);

/* ---- memory registry --------------------------------------------------- */

struct memreg_entry {
    uintptr_t start, end;
    umbp_mem_kind_t kind;
    int device;
    umbp_mem_handle_t handle;
    bool in_tier;      /* the tier's mem_register took it */
    void *tier_handle; /* ... and named it so */
};

struct memreg {
    pthread_mutex_t lock;
    struct memreg_entry *v;
    size_t n, cap;
    uint64_t next_handle;
};
/* Destruction, after the loop stopped: the tier's registrations end. */
void memreg_fini(struct umbp_runtime *rt);


/* ---- events ------------------------------------------------------------ */

struct event_queue {
    pthread_mutex_t lock;
    umbp_event_t *v;
    size_t cap, head, count;
    uint64_t lost;
};

/* ---- counters ---------------------------------------------------------- */

struct rt_counters {
    _Atomic uint64_t puts_ok, puts_existing, puts_failed;
    _Atomic uint64_t gets_ok, gets_miss, gets_failed;
    _Atomic uint64_t bytes_written, bytes_read;
    _Atomic uint64_t lookups, lookup_keys, lookup_hits;
    _Atomic uint64_t puts_waited_for_space, ops_timed_out, mailbox_full;
    _Atomic uint64_t events_dropped;
    _Atomic uint64_t kv_transfers, kv_prepare_ns, kv_launch_ns, kv_gpu_ns, kv_finish_ns;
    _Atomic uint64_t kv_queue_ns, kv_tier_ns;
    _Atomic uint64_t prewakes;
};
#define CNT_ADD(rt, f, v) atomic_fetch_add_explicit(&(rt)->cnt.f, (v), memory_order_relaxed)

/* ---- the runtime ------------------------------------------------------- */

struct rt_config;
struct lookup_service;

/* Free ops, last in first out: the op released last is taken next, so its
 * per-key arrays are already grown and warm in the cache.  (A FIFO ring
 * cycled through every op of the pool: each of the first max_inflight_ops
 * submissions grew fresh arrays, and later ones found them cold; a
 * 625-block umbp_kv_store spent ~100 us of its ~140 us there on an H200
 * host.)  A mutex: taken for a few instructions by callers and the loop. */
struct op_free {
    pthread_mutex_t lock;
    struct umbp_op **v;
    size_t n;
};

struct umbp_runtime {
    struct rt_config *cfg;
    const struct umbp_core_config *core;
    struct umbp_tier *tier;      /* the composition's first tier */
    const char *tier_name;

    struct ev_loop *loop;
    pthread_t loop_thread;
    /* The loop lock: the loop thread holds it except while it sleeps in the
     * backend poll (libev's release/acquire callbacks), so a caller that
     * takes it with trylock owns everything the loop thread owns and may run
     * a local tier's lookup itself instead of waking the loop (see
     * umbp_lookup).  Never waited for by a caller. */
    pthread_mutex_t loop_lock;
    bool loop_lock_ready;
    _Atomic bool loop_waiting;  /* the loop thread waits for loop_lock */
    ev_async stop_async;
    struct mailbox mb[ACTOR_COUNT];
    /* umbp_prewake: the caller's async wakes the loop, which then polls (an
     * idle watcher) until prewake_until_ns; loop thread only but the async */
    ev_async prewake;
    ev_idle prewake_poll;
    uint64_t prewake_until_ns;

    /* op pool */
    struct umbp_op *ops;
    /* op pool: max_inflight_ops data ops (puts, gets, KV transfers) and
     * CONTROL_OPS for lookups, stats, clear and flush, in separate free
     * lists, so data ops in flight never starve the control calls */
    size_t num_ops;
    struct op_free free_data, free_ctl;

    struct copy_pool copy;
    struct kv_state kv;
    struct memreg memreg;
    struct event_queue events;
    struct rt_counters cnt;

    bool may_spin;             /* enough cores that short polls beat sleeps */
    _Atomic bool closing;      /* set by destroy: refuse new work */
    _Atomic size_t inflight;   /* ops taken and not yet completed */
    bool stopping;             /* loop thread: drain then break */
    _Atomic bool lookup_stuck; /* a lookup timed out and has not finished */
    /* umbp_lookup_serve's service (lookup/lookup_serve.c): set once by the
     * caller (release), then the loop thread's (acquire in on_stop) */
    _Atomic(struct lookup_service *) lookup_service;

    /* store actor (loop thread) */
    struct umbp_op *space_waiters_head, *space_waiters_tail;
    struct umbp_op *puts_head, *puts_tail; /* incomplete puts, by arrival */
    struct umbp_op *flush_head, *flush_tail;
    uint64_t arrivals;
    ev_timer store_timer;      /* space-wait deadlines */
    ev_async store_retry;      /* space freed: retry waiting puts */
    ev_timer drain_timer;      /* shutdown: wait for in-flight ops */
    uint64_t drain_deadline_ns;
    /* evictor actor */
    struct msg_hdr evict_kick;
    _Atomic bool evict_kick_queued;
    ev_idle evict_idle;
    uint64_t space_wanted;     /* bytes waiting puts need */
    uint64_t space_wanted_run; /* the largest single key among them */
    uint64_t space_freed_gen;  /* loop thread: counts the tier's tier_space_freed calls */
    /* lease sweep (a timer, no mailbox) */
    ev_timer lease_timer;
    /* ops whose bytes the copy workers move, for their deadlines */
    struct umbp_op *copying_head;
    ev_timer copy_timer;
    /* load actor: quarantine of keys whose load failed */
    struct quarantine *quarantine;
};

/* Actor entry points (one file each). */
void store_actor_handle(struct umbp_runtime *rt, struct msg_hdr *m);
void load_actor_handle(struct umbp_runtime *rt, struct msg_hdr *m);
void lookup_actor_handle(struct umbp_runtime *rt, struct msg_hdr *m);
void evictor_actor_handle(struct umbp_runtime *rt, struct msg_hdr *m);
int store_actor_init(struct umbp_runtime *rt);
void store_actor_stop(struct umbp_runtime *rt); /* fail waiters */
bool store_actor_idle(struct umbp_runtime *rt);
int lease_actor_init(struct umbp_runtime *rt);
void lease_actor_stop(struct umbp_runtime *rt);
void evictor_kick(struct umbp_runtime *rt);
/* Loop thread: evicts (at most max_objects) toward the evictor's targets
 * now; returns bytes freed, *more if it stopped on max_objects. */
uint64_t evictor_make_room(struct umbp_runtime *rt, size_t max_objects, bool *more);
void evictor_init(struct umbp_runtime *rt);
void tier_space_freed(void *ctx);
void tier_emit_event(void *ctx, umbp_event_type_t type, const umbp_key_t *key);
void tier_events_lost(void *ctx, uint64_t n);

/* Quarantine (owned by the load actor, read by the lookup actor; both run on
 * the loop thread). */
struct quarantine *quarantine_new(void);
void quarantine_free(struct quarantine *q);
void quarantine_add(struct quarantine *q, const umbp_key_t *k, uint64_t until_ns);
bool quarantine_has(struct quarantine *q, const umbp_key_t *k, uint64_t now_ns);

/* Lookup actor and lookup service (loop thread): after a tier lookup of
 * reqs[0..n), quarantined keys become misses and the lookup is counted in
 * the stats; returns the consecutive present prefix. */
size_t lookup_account(struct umbp_runtime *rt, const struct umbp_tier_req *reqs,
                      uint8_t *present, size_t n);

/* Caller side: UMBP_E_DUPLICATE_KEY if two of op's keys are equal. */
int umbp_check_duplicate_keys(struct umbp_op *op);
/* The same over n keys laid out stride bytes apart from first, with op's
 * table (op_reserve_keys'd for n). */
int umbp_keys_check_duplicates(struct umbp_op *op, const umbp_key_t *first, size_t stride,
                               size_t n);


static inline uint64_t ms_to_ns(int64_t ms) { return (uint64_t)ms * 1000000ull; }

#endif
