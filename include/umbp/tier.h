/*
 * tier.h - the contract between the umbp runtime and a tier backend.
 *
 * A tier stores objects somewhere (this process's DRAM, a shared-memory pool
 * owned by umbp-server, peers reached over RDMA) and keeps their index,
 * allocation, eviction and read leases.  The runtime owns the actors and the
 * data movement: it asks a tier to reserve space, copies the bytes itself
 * (memcpy, the GPU copy engine) into the region the tier handed out, then asks
 * the tier to publish.  Reads are the mirror image: acquire a lease, copy,
 * release (the release says whether the bytes read are still valid).
 *
 * A mode is a composition of tiers (embedded = dram; standalone = shm;
 * distributed = dram + rdma).  Each tier lives in backends/<name>/ and is
 * registered by one line of CMake, `umbp_tier(<name> <sources...>)`, which
 * links it into libumbp and adds `umbp_tier_<name>_ops` to the registry.
 * The runtime holds one tier; a composite creates the others as its
 * children (ops->uses, env->create_child) and answers for them.  An
 * instance's capabilities are its own (struct umbp_tier's caps), and its
 * regions may be mapped (the runtime copies) or not (the tier's read/write
 * move the bytes), key by key.
 *
 * Threads.  Unless a member says otherwise it is called on the runtime's loop
 * thread, must not block, and completes by calling its `done` callback exactly
 * once on the loop thread - inline before returning (a local tier) or later
 * from a watcher the tier added to env->loop (a tier that talks to a server).
 * Everything a tier owns is therefore touched by one thread and needs no lock.
 *
 * Batches.  Batched members take an array of request pointers, so the runtime
 * can hand a subset of a batch without copying; a remote tier must make one
 * round trip per batch, never one per key.
 *
 * Remote tiers (UMBP_TIER_CAP_REMOTE).  done fires exactly once per call,
 * also when the peer disappears or stalls: by the call's deadline at the
 * latest (lookup_timeout_ms after the call for lookup, timeout_ms for every
 * other member), with UMBP_E_TIMEOUT; a lost connection completes every
 * outstanding call at once (-ECONNRESET).  After done the tier never touches
 * that call's requests again; a reply that arrives late is the tier's to
 * undo (abort a reservation, release a lease it no longer reports).  health
 * says UMBP_E_NOT_ATTEMPTED while the peer is unreachable or a call is
 * overdue, so new transfers fail fast instead of queueing behind it; the
 * runtime asks health when an op arrives and before each tier round.
 *
 * Optional members may be NULL in the ops table; the runtime's wrappers
 * (runtime/tier_call.h) substitute a default that returns -ENOTSUP or does
 * nothing, so no NULL slot is ever called.
 */
#ifndef UMBP_TIER_H
#define UMBP_TIER_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/umbp.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ev_loop;
struct umbp_tier;

/* ---- options ---------------------------------------------------------- */

/* Options are declared in tables: the runtime's core table and one table per
 * tier.  The runtime parses the JSON config and UMBP_* environment against all
 * of them, refuses unknown names, checks types and bounds, and stores values
 * into plain structs at the given offsets. */
enum umbp_opt_type {
    UMBP_OPT_BOOL,   /* bool */
    UMBP_OPT_INT,    /* int64_t, bounds min..max */
    UMBP_OPT_SIZE,   /* uint64_t bytes; accepts 4096, "64KiB", "2MiB", "1GiB", "4G" */
    UMBP_OPT_DOUBLE, /* double, bounds min..max */
    UMBP_OPT_STRING, /* char[str_cap], NUL-terminated; choices if non-NULL */
};

struct umbp_option {
    const char *name;
    enum umbp_opt_type type;
    size_t offset;             /* into the config struct the table describes */
    const char *def;           /* default, written as a user would */
    double min, max;           /* inclusive bounds for INT, SIZE and DOUBLE */
    size_t str_cap;            /* STRING: size of the char array */
    const char *const *choices;/* STRING: NULL-terminated allowed values */
    const char *help;          /* one line for docs and error messages */
};

/* Options every mode shares (runtime/config.c owns the table). */
struct umbp_core_config {
    char mode[32];                   /* "embedded" ... */
    char tier[32];                   /* "" or a tier name replacing the mode's
                                        primary tier (conformance tests) */
    int64_t rank, world_size;
    uint64_t capacity_bytes;         /* per rank; 0 = unset */
    uint64_t total_capacity_bytes;   /* per engine, split over world_size */
    int64_t timeout_ms;
    int64_t lookup_timeout_ms;
    int64_t put_wait_ms;
    int64_t lease_ttl_ms;
    int64_t load_failure_quarantine_ms;
    int64_t max_inflight_ops;
    int64_t copy_threads;
    bool enable_events;
    int64_t event_queue_size;
    char log_level[16];
    char gpu_backend[16];            /* auto, cuda, hip, host */
    int64_t gpu_device;
    int64_t gpu_max_ctas;
    int64_t gpu_threads_per_cta;
    uint64_t gpu_staging_bytes;
    int64_t gpu_store_slice_blocks;
    int64_t gpu_load_head_blocks;
    int64_t gpu_warm_transfers;
    char gpu_store_method[8];        /* auto, kernel, staged, dma */
    char gpu_restore_method[8];
    bool gpu_l2_discard_staging;     /* UMBP_GPU_L2_DISCARD_STAGING */
    bool gpu_evict_first_restore;    /* UMBP_GPU_EVICT_FIRST_RESTORE */
    bool gpu_ramp_overlapped;        /* UMBP_GPU_RAMP_OVERLAPPED */
    bool gpu_wait_poll;              /* waiters poll through KV transfers */
    bool gpu_warm_store;             /* a store aborted before publish at registration */
    char poll_wait[8];               /* auto, on, off */
};

/* ---- what the runtime gives a tier ------------------------------------ */

struct umbp_tier_env {
    struct ev_loop *loop;                 /* add watchers from the loop thread */
    const struct umbp_core_config *core;
    uint64_t capacity_bytes;              /* this rank's resolved capacity */
    /* Report that a key became visible (STORED) or went away (REMOVED).
     * Loop thread only. */
    void (*emit_event)(void *ctx, umbp_event_type_t type, const umbp_key_t *key);
    /* Report that n events were lost before reaching this tier (a server
     * dropped them), so umbp_events_drain tells the engine to resync.
     * Loop thread only. */
    void (*events_lost)(void *ctx, uint64_t n);
    /* Report that space was freed, so puts waiting for room retry.
     * Loop thread only. */
    void (*space_freed)(void *ctx);
    /* Report that mapped_memory() changed (a new pool, e.g. a restarted
     * server's), so the runtime registers it with the GPU before the next
     * KV transfer.  The old mapping must stay valid.  Loop thread only. */
    void (*mapping_changed)(void *ctx);
    /* Report that the regions this tier handed out for writing may no
     * longer be written (the server that granted them is gone, and may
     * hand them to others once the writer's declared deadline passes): the
     * runtime stops every host copy into them at its next chunk (a GPU
     * transfer already queued runs to its end).  Loop thread only. */
    void (*regions_revoked)(void *ctx);
    void *ctx;
    /* Child tiers (a composite: a local slice plus a remote tier).  Creates
     * the registered tier `name`, which the caller's ops->uses declares,
     * from the options the runtime parsed (and validated) for it, with
     * child_env: the caller's env with its own callbacks and ctx interposed
     * (the child's events and space reports go to the parent, which passes
     * on what it wants) and the child's share in capacity_bytes; the
     * child's caps are its instance's.  Caller's thread, in the parent's
     * create only.  The parent owns the child: it calls it through the ops
     * table, stops it in its stop and destroys it in its destroy.  Writes a
     * message naming the child into err.  Keep create_child and options as
     * they are in child_env. */
    int (*create_child)(const struct umbp_tier_env *child_env, const char *name,
                        struct umbp_tier **out, char *err, size_t errlen);
    const void *options; /* the runtime's parsed options: create_child's */
};

/* ---- regions and requests --------------------------------------------- */

/* Where one object's bytes are, as seen by this process. */
struct umbp_region {
    void *addr;      /* locally mapped bytes, or NULL if the tier must move
                        them itself (ops->read / ops->write) */
    uint64_t size;   /* object size */
    uint64_t token;  /* the tier's handle for the reservation or lease */
    uint64_t aux[2]; /* tier-private (remote address, rkey, node, ...) */
};

/* One key of a batched call.  `size` is an input of reserve; `status` and
 * `region` are outputs of reserve and acquire.  publish and release act only
 * on requests whose status is 0 on input (the runtime passes exactly the
 * reserved / leased ones) and overwrite it with their result; abort drops the
 * reservation named by region.token whatever the status. */
struct umbp_tier_req {
    umbp_key_t key;
    uint64_t size;
    int status;
    struct umbp_region region;
};

/* reserve() status: the key is already present or being written by another
 * put; the put succeeds without writing (first writer wins). */
#define UMBP_TIER_EXISTS 1

typedef void (*umbp_tier_done_fn)(void *arg, int rc);

struct umbp_tier_usage {
    uint64_t capacity_bytes, used_bytes;
    /* Evictor thresholds in bytes: above high the evictor asks the tier to
     * evict down to low.  0 and 0: the tier needs no evictor (a server
     * evicts on its own). */
    uint64_t high_watermark_bytes, low_watermark_bytes;
    uint64_t num_objects, num_pending, num_leased;
    uint64_t evictions, evicted_bytes, leases_expired;
    /* Caller memory registered now (mem_register minus mem_deregister), for
     * tiers that implement mem_register; 0 otherwise. */
    uint64_t mem_registered_bytes, mem_registered_regions;
    /* Tiers that reserve ahead of keys (reserve_ahead): reservations held
     * now, and reserves answered from them (keys). */
    uint64_t reserved_ahead, reserved_ahead_used;
};

struct umbp_tier;

/* Capabilities: what a tier does, so shared code and the conformance suite
 * gate on a property instead of a tier's name. */
enum umbp_tier_cap {
    UMBP_TIER_CAP_MAPPED = 1u << 0,         /* every region has addr != NULL */
    UMBP_TIER_CAP_EVICTS_LOCALLY = 1u << 1, /* the runtime's evictor drives
                                               ops->evict at its watermarks */
    UMBP_TIER_CAP_EXPIRES_LEASES = 1u << 2, /* the runtime's lease actor drives
                                               ops->expire_leases */
    UMBP_TIER_CAP_REMOTE = 1u << 3,         /* calls complete later from a
                                               watcher; a peer can vanish */
    UMBP_TIER_CAP_SHARED = 1u << 4,         /* other processes see its objects */
};

struct umbp_tier_ops {
    const char *name;                       /* required: "dram" */
    uint32_t caps;                          /* enum umbp_tier_cap bits: every
                                               instance's, unless its create
                                               says otherwise (struct
                                               umbp_tier's caps) */
    /* Modes this tier is the primary tier of ("embedded", ...), NULL-
     * terminated; NULL for none.  A mode is declared by exactly one tier. */
    const char *const *modes;
    /* Tiers this one creates as children (env->create_child), NULL-
     * terminated; NULL for none.  The runtime validates their options with
     * this tier's, and create_child refuses a tier not named here. */
    const char *const *uses;
    const struct umbp_option *options;      /* optional: tier options table,
                                               terminated by a NULL name */
    size_t config_size;                     /* size of the tier's config struct */

    /* optional; caller's thread during runtime creation.  Cross-option checks
     * (low < high, ...).  Writes a message naming the options into err. */
    int (*validate_config)(const void *cfg, const struct umbp_core_config *core,
                           char *err, size_t errlen);

    /* required; caller's thread during runtime creation, before the loop
     * thread starts; may block (maps memory, connects).  On failure writes a
     * message naming the cause into err and returns a negative code. */
    int (*create)(const struct umbp_tier_env *env, const void *cfg,
                  struct umbp_tier **out, char *err, size_t errlen);

    /* required; after the loop thread has stopped; may block.  Frees all. */
    void (*destroy)(struct umbp_tier *t);

    /* optional (default: nothing); loop thread, when the runtime shuts down,
     * before it stops the loop.  A tier with calls still outstanding (a
     * remote tier) completes each of them now, with UMBP_E_NOT_ATTEMPTED,
     * and stops its watchers; no call arrives after it. */
    void (*stop)(struct umbp_tier *t);

    /* optional (default: nothing outstanding); loop thread, when the runtime
     * begins to shut down and then at each tick of its drain, until it
     * returns false or timeout_ms has passed; stop comes after.  From the
     * first call on the tier starts no work of its own (not asked by the
     * runtime); true while some of it is still unanswered, so that stop
     * finds it answered and can undo it (shm: a refill of reservations
     * made ahead, or any call that timed out with replies still due, whose
     * regions the server would otherwise grant to a session that is gone
     * and hold until their deadline). */
    bool (*drain)(struct umbp_tier *t);

    /* required.  present[i] = 1 if reqs[i]->key is published.  Must not
     * change LRU order unless touch is set. */
    void (*lookup)(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                   size_t n, uint8_t *present, bool touch,
                   umbp_tier_done_fn done, void *arg);

    /* required.  For each req: 0 and a writable region of req->size bytes,
     * hidden from lookups until published; UMBP_TIER_EXISTS; -ENOSPC when no
     * room now (the runtime retries after space_freed, up to put_wait_ms);
     * another negative code for a hard failure.  Never evicts inline. */
    void (*reserve)(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                    size_t n, umbp_tier_done_fn done, void *arg);

    /* optional (default: nothing).  Objects of size bytes will be reserved
     * often (the runtime says so before each KV store's reservation): a
     * remote tier may reserve regions of that size ahead of their keys, so
     * that a later reserve of such objects completes without a round trip
     * (shm: backends/shm/shm_ahead.c).  Must not delay the reserve that
     * follows. */
    void (*reserve_ahead)(struct umbp_tier *t, uint64_t size);

    /* required.  Makes reserved regions visible; per-req status 0 or error
     * (the reservation is then gone), or UMBP_TIER_EXISTS from a tier that
     * reserves ahead of keys: another put stored the key since, the put
     * succeeds without this object (first writer wins) and the reservation
     * is gone.  Emits STORED events. */
    void (*publish)(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                    size_t n, umbp_tier_done_fn done, void *arg);

    /* required.  Drops reservations without publishing; the previous state of
     * each key is untouched.  Completes inline, no callback. */
    void (*abort)(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                  size_t n);

    /* required.  For each req: 0 and a readable region under a read lease
     * that lasts until release or lease_ttl_ms, whichever is first; -ENOENT.
     * A leased object is never evicted or reused while the lease lasts. */
    void (*acquire)(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                    size_t n, uint64_t lease_ttl_ms, umbp_tier_done_fn done,
                    void *arg);

    /* required.  Ends leases.  Per-req status 0 if the bytes copied under the
     * lease are valid (the lease did not expire into a reuse of the region),
     * UMBP_E_STALE otherwise. */
    void (*release)(struct umbp_tier *t, struct umbp_tier_req *const *reqs,
                    size_t n, umbp_tier_done_fn done, void *arg);

    /* required.  Removes every object; leased ones go when released. */
    void (*clear)(struct umbp_tier *t, umbp_tier_done_fn done, void *arg);

    /* optional (default: no eviction, e.g. the server evicts); required with
     * UMBP_TIER_CAP_EVICTS_LOCALLY.  Called by the evictor actor when usage
     * is above the high watermark or puts wait for room, and by the store
     * actor when a reservation met a full pool.  Evicts least recently used
     * objects that are neither leased nor pending, at most max_objects of
     * them, while used_bytes > target_bytes or (want_free_run != 0 and no
     * free run of want_free_run bytes exists), so it never evicts more than
     * the LRU prefix that makes room.  Returns bytes freed; *more is set when
     * it stopped on max_objects. */
    uint64_t (*evict)(struct umbp_tier *t, uint64_t target_bytes,
                      uint64_t want_free_run, size_t max_objects, bool *more);

    /* optional (default: zeros).  Inline, no callback.  A remote tier
     * answers from what it last heard from its server. */
    void (*usage)(struct umbp_tier *t, struct umbp_tier_usage *out);

    /* optional (default: completes at once).  Completes when usage()
     * reflects every call made before this one (a remote tier asks its
     * server, in order behind those calls); umbp_get_stats waits for it. */
    void (*refresh_usage)(struct umbp_tier *t, umbp_tier_done_fn done, void *arg);

    /* optional (default: nothing).  The lease actor calls this periodically:
     * leases older than their TTL end now (their readers' release then
     * reports UMBP_E_STALE if the region was reused). */
    void (*expire_leases)(struct umbp_tier *t, uint64_t now_ns);

    /* optional (default: 0, healthy).  UMBP_E_NOT_ATTEMPTED while the backend
     * is stalled, so new transfers fail fast. */
    int (*health)(struct umbp_tier *t);

    /* optional (default: -ENOTSUP).  The locally mapped memory every region
     * of this tier lies in, so the runtime can register it with the GPU
     * runtime once (pinning it), off the critical path.  Caller's thread
     * (umbp_kv_register), may block; the loop may be running. */
    int (*mapped_memory)(struct umbp_tier *t, void **addr, size_t *len);

    /* optional (default: -ENOTSUP); required when regions may have addr ==
     * NULL.  Move the bytes of ranges (offsets within the object) between
     * caller memory and such a region: read into the caller's memory, write
     * from it.  Called per key, only for regions with addr == NULL (the
     * runtime copies mapped ones itself, so a batch may mix both), between
     * reserve and publish / acquire and release.  Loop thread, must not
     * block; done once, inline or later from a watcher; r and ranges stay
     * valid until done. */
    void (*read)(struct umbp_tier *t, const struct umbp_region *r,
                 const umbp_range_t *ranges, size_t n, umbp_tier_done_fn done,
                 void *arg);
    void (*write)(struct umbp_tier *t, const struct umbp_region *r,
                  const umbp_range_t *ranges, size_t n, umbp_tier_done_fn done,
                  void *arg);

    /* optional (default: -ENOTSUP, nothing to register); for tiers that
     * register memory with a NIC (ibv_reg_mr, ucp_mem_map).  The engine
     * declared [addr, addr + len) with umbp_mem_register: ranges of its puts
     * and gets will lie in it, so the tier registers it once, here, off the
     * critical path, and sets *handle to its own record of it.  Called on
     * umbp_mem_register's thread (the caller's), for every region it
     * records, before it returns; may block; the loop may be running, so the
     * tier guards what it shares with its loop-thread members; the runtime
     * never makes two mem_register/mem_deregister calls at once.  A
     * negative code other than -ENOTSUP fails umbp_mem_register with it
     * (err: the tier logs why). */
    int (*mem_register)(struct umbp_tier *t, void *addr, size_t len, umbp_mem_kind_t kind,
                        int device, void **handle);
    /* optional (default: nothing); required with mem_register.  The
     * registration of handle ends: on umbp_mem_deregister's thread, or at
     * runtime destruction for regions still registered (after the loop
     * stopped, before destroy).  May block.  No op uses the region any more
     * (umbp_mem_deregister's rule). */
    void (*mem_deregister)(struct umbp_tier *t, void *handle);
};

/* Every tier embeds this as its first member (container_of to get back).
 * create sets ops and env (the runtime sets them again after create). */
struct umbp_tier {
    const struct umbp_tier_ops *ops;
    struct umbp_tier_env env;
    /* This instance's capabilities (enum umbp_tier_cap bits): ops->caps,
     * unless create narrowed or extended them with umbp_tier_set_caps (a
     * tier whose options decide whether its regions are mapped, a composite
     * whose children decide).  Fixed once create returns; the runtime reads
     * them through tier_caps() (runtime/tier_call.h), never ops->caps. */
    uint32_t caps;
    bool caps_set; /* create called umbp_tier_set_caps */
};

/* For create only: this instance's capabilities instead of ops->caps. */
static inline void umbp_tier_set_caps(struct umbp_tier *t, uint32_t caps)
{
    t->caps = caps;
    t->caps_set = true;
}

#define umbp_container_of(ptr, type, member) \
    ((type *)((char *)(ptr) - offsetof(type, member)))

/* The registry generated by CMake from umbp_tier() lines: NULL-terminated. */
extern const struct umbp_tier_ops *const umbp_tier_registry[];
const struct umbp_tier_ops *umbp_tier_find(const char *name);

/* ---- services for tier authors ---------------------------------------- */

enum umbp_log_level { UMBP_LOG_ERROR, UMBP_LOG_WARN, UMBP_LOG_INFO, UMBP_LOG_DEBUG };
void umbp_log(enum umbp_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
uint64_t umbp_now_ns(void); /* CLOCK_MONOTONIC */
/* Hash of a key for index tables (xxh3 of the bytes). */
uint64_t umbp_key_hash(const umbp_key_t *key);
/* Writes one byte per page of [p, p + len) (zeros: the bytes must be the
 * caller's to overwrite), so that each page's first-touch fault - the
 * kernel zeroing it, a few microseconds - happens now and not under a later
 * request.  For tables and buffers made ahead from calloc or malloc, which
 * hand out pages nobody touched yet. */
void umbp_touch_pages(void *p, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* UMBP_TIER_H */
