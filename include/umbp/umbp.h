/*
 * umbp.h - the public C API of umbp, a KV-cache offload runtime.
 *
 * One runtime per engine worker rank.  A runtime owns one event-loop thread
 * that hosts the actors (lookup, store, load, evictor, lease) and a few copy
 * worker threads.  Every data operation is submitted from the caller's thread,
 * returns at once with an operation handle, and completes later; callers poll
 * (umbp_op_test) or wait with a timeout (umbp_op_wait).
 *
 * Objects are immutable byte strings named by a fixed-size binary key.  The
 * first writer of a key wins; later puts of the same key succeed without
 * writing.  An object is visible to lookups and gets only after every byte of
 * it is written.
 *
 * Return values: 0 on success, a negative errno value (-EINVAL, -ENOSPC, ...)
 * or one of the UMBP_E_* codes below.  umbp_strerror() names any of them.
 *
 * Thread safety: every function may be called from any thread concurrently,
 * except umbp_runtime_destroy(), which must not race with other calls on the
 * same runtime (like close(2) on a file descriptor).
 */
#ifndef UMBP_UMBP_H
#define UMBP_UMBP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The exported API: libumbp.so is built with hidden visibility (it is
 * loaded into engine processes beside other libraries), so only functions
 * marked UMBP_API are visible to its users. */
#if defined(__GNUC__)
#define UMBP_API __attribute__((visibility("default")))
#else
#define UMBP_API
#endif

#define UMBP_VERSION_MAJOR 0
#define UMBP_VERSION_MINOR 1
#define UMBP_VERSION_PATCH 0

/* ---- keys ------------------------------------------------------------- */

/* A key is an opaque fixed-size digest (the connector derives it from the
 * model namespace, rank identity, cache group and engine block hash). */
#define UMBP_KEY_SIZE 32

typedef struct umbp_key {
    uint8_t bytes[UMBP_KEY_SIZE];
} umbp_key_t;

/* ---- errors ----------------------------------------------------------- */

/* Our own codes live below -4096 so they never collide with errno values.
 * UMBP_ERRORS(X) is the one list: (name, value, what umbp_strerror says). */
#define UMBP_ERRORS(X)                                                                  \
    X(UMBP_E_INPROGRESS, -4097, "operation in progress")                               \
    X(UMBP_E_NOT_ATTEMPTED, -4098,                                                      \
      "not attempted (backend stalled, unreachable or runtime closing); retry later")   \
    X(UMBP_E_TIMEOUT, -4099, "operation timed out")                                     \
    X(UMBP_E_STALE, -4100, "object reclaimed while being read; bytes invalid")          \
    X(UMBP_E_SHAPE, -4101, "ranges do not match the object (tiling or bounds)")         \
    X(UMBP_E_DUPLICATE_KEY, -4102, "key appears twice in one batch")                    \
    X(UMBP_E_QUARANTINED, -4103, "key quarantined after a recent load failure")         \
    /* shape errors of KV registration and transfers (umbp/gpu.h) */                   \
    X(UMBP_E_KV_NDIM, -4201, "KV tensor: ndim out of range")                            \
    X(UMBP_E_KV_ROLE, -4202, "KV tensor: bad block/kv/layer dim")                       \
    X(UMBP_E_KV_SHAPE, -4203, "KV tensor: bad size")                                    \
    X(UMBP_E_KV_STRIDE, -4204, "KV tensor: chunk dims not dense in any order, or strides not positive") \
    X(UMBP_E_KV_MISMATCH, -4205, "KV tensors disagree on blocks or K/V split")          \
    X(UMBP_E_KV_RANGE, -4206, "block index or layer range outside the KV layout")       \
    X(UMBP_E_GPU_UNREGISTERED, -4207, "host object outside registered host memory")

enum umbp_error {
    UMBP_OK = 0,
#define UMBP_ERROR_ENUM_(name, value, text) name = value,
    UMBP_ERRORS(UMBP_ERROR_ENUM_)
#undef UMBP_ERROR_ENUM_
};
/* UMBP_E_INPROGRESS: the operation has not completed yet.
 * UMBP_E_NOT_ATTEMPTED: refused before any work (backend stalled or
 *   unreachable, runtime shutting down); safe to retry.
 * UMBP_E_TIMEOUT: the operation ran past timeout_ms.
 * UMBP_E_STALE: the object was reclaimed while being read; the destination
 *   bytes are not valid.
 * UMBP_E_SHAPE: ranges do not describe the object: they must tile
 *   [0, object_size) for a put, be disjoint and in bounds for a get.
 * UMBP_E_DUPLICATE_KEY: the same key appears twice in one batch.
 * UMBP_E_QUARANTINED: the key failed recently; counted as a miss.
 * UMBP_E_KV_*: umbp_kv_register shapes (umbp/gpu.h says which is which). */

/* Names any return value of this API (negative errno values included).
 * Never returns NULL; the string is static. */
UMBP_API const char *umbp_strerror(int err);

/* The message of the last failed umbp_runtime_create() or option error on
 * this thread ("capacity_bytes: must be ..."), or "" if none. */
UMBP_API const char *umbp_last_error(void);

/* ---- runtime ---------------------------------------------------------- */

typedef struct umbp_runtime umbp_runtime_t;

/* Checks a config exactly as umbp_runtime_create would (every option table,
 * UMBP_* variables, the rules between options, the mode's tier) and creates
 * nothing: 0, or a negative code with umbp_last_error() naming the option.
 * With resolved non-NULL it receives, NUL-terminated, a JSON object of the
 * value every option of the core and of the mode's tier would have
 * (defaults and UMBP_* variables applied); -ENOSPC if len is too small.
 * Connectors check an engine's options with it before any rank starts, and
 * read the values they need from it instead of repeating defaults. */
UMBP_API int umbp_config_check(const char *json_config, char *resolved, size_t len);

/* What a mode (the `mode` option's values) means for the processes around
 * a runtime.  One table (UMBP_MODES, common/options.h) has a row per mode;
 * connectors read these instead of comparing mode names. */
#define UMBP_MODE_SHARED_POOL (1u << 0)   /* one pool for every rank and engine attached:
                                           * a clear by one rank clears everyone's */
#define UMBP_MODE_SESSIONS (1u << 1)      /* runtimes are sessions of a server process;
                                           * option `role` says worker or lookup */
#define UMBP_MODE_SHARED_LOOKUP (1u << 2) /* a scheduler looks up in the shared index
                                           * with a runtime of its own (role lookup);
                                           * without it each rank serves its pool's
                                           * lookups (umbp_lookup_serve) and the lookup
                                           * client asks every rank */
/* The UMBP_MODE_* flags of mode (>= 0); -EINVAL for a name that is not a
 * mode, -ENOTSUP for a mode whose tier this library lacks, with
 * umbp_last_error() naming the mode and the modes there are. */
UMBP_API int umbp_mode_flags(const char *mode);

/* Whether a runtime of mode takes option name: 0 if the core or the mode's
 * tier declares it; -EINVAL if another tier does (a runtime of this mode
 * refuses it, naming that tier); -ENOENT if no table does (umbp_last_error
 * names the closest option, if a typo or two away); the errors of
 * umbp_mode_flags for mode.  Connectors pass runtime options through to C
 * and ask this instead of keeping lists of names. */
UMBP_API int umbp_option_lookup(const char *name, const char *mode);

/*
 * Creates a per-rank runtime from a JSON object of options (see
 * docs/configuration.md).  NULL or "" means all defaults.  Every option may
 * be overridden by an environment variable UMBP_<OPTION> in upper case
 * (UMBP_CAPACITY_BYTES=8GiB); the environment wins over the JSON.
 *
 * Returns 0 and sets *out, or a negative code with umbp_last_error() naming
 * the bad option and the accepted range.  Unknown options are refused.
 */
UMBP_API int umbp_runtime_create(const char *json_config, umbp_runtime_t **out);

/* Completes every in-flight operation (with an error where it cannot finish),
 * stops the threads and frees everything, outstanding op handles included.
 * Never hangs: copies already running are finished, nothing else is waited
 * for.  NULL is a no-op. */
UMBP_API void umbp_runtime_destroy(umbp_runtime_t *rt);

/* ---- memory registration ---------------------------------------------- */

typedef enum umbp_mem_kind {
    UMBP_MEM_HOST = 0,   /* ordinary (pageable or pinned) host memory */
    UMBP_MEM_DEVICE = 1, /* GPU memory of device `device` */
} umbp_mem_kind_t;

typedef struct umbp_mem_desc {
    void *addr;
    size_t len;
    umbp_mem_kind_t kind;
    int device; /* GPU ordinal for UMBP_MEM_DEVICE; ignored for host */
} umbp_mem_desc_t;

typedef uint64_t umbp_mem_handle_t;

/*
 * Registers a host region that ranges of puts and gets will point into.
 * Ranges of umbp_put / umbp_get are always host memory, registered or not;
 * GPU memory is not given as ranges but registered by shape with
 * umbp_kv_register and moved with umbp_kv_store / umbp_kv_load, so
 * UMBP_MEM_DEVICE is refused here with -ENOTSUP (the kind and device fields
 * are kept for a future ranged device path).  Regions must not overlap
 * (-EEXIST).  The runtime's tier is told (mem_register in umbp/tier.h): a
 * tier that moves bytes with a NIC registers the region there once, so
 * register long-lived buffers before moving them; the tier's failure fails
 * this call with its code.
 */
UMBP_API int umbp_mem_register(umbp_runtime_t *rt, const umbp_mem_desc_t *desc,
                      umbp_mem_handle_t *out);
/* -ENOENT for an unknown handle.  The caller must not deregister a region that
 * an in-flight operation still uses. */
UMBP_API int umbp_mem_deregister(umbp_runtime_t *rt, umbp_mem_handle_t handle);

/* ---- data operations -------------------------------------------------- */

/* One contiguous piece of caller memory and where it sits in the object. */
typedef struct umbp_range {
    void *ptr;       /* caller memory: source of a put, destination of a get */
    uint64_t len;    /* bytes, > 0 */
    uint64_t offset; /* byte offset inside the object */
} umbp_range_t;

/* A put of one object: its ranges must tile [0, object_size) exactly:
 * sorted by offset, contiguous, none empty, none overlapping. */
typedef struct umbp_put_item {
    umbp_key_t key;
    uint64_t object_size;
    const umbp_range_t *ranges;
    uint32_t num_ranges;
} umbp_put_item_t;

/* A get of one object: ranges disjoint (any order) and inside the object. */
typedef struct umbp_get_item {
    umbp_key_t key;
    const umbp_range_t *ranges;
    uint32_t num_ranges;
} umbp_get_item_t;

typedef struct umbp_op umbp_op_t;

/*
 * Submits a batch of puts.  Returns at once.
 *
 * Whole-batch errors are returned here and nothing is submitted (no *op):
 * bad arguments (-EINVAL), a range set that does not tile its object
 * (UMBP_E_SHAPE), a key twice in the batch (UMBP_E_DUPLICATE_KEY), too many
 * operations in flight (-EAGAIN: back-pressure, retry later), shutting down
 * or a stalled backend (UMBP_E_NOT_ATTEMPTED).
 *
 * On 0, *op completes later with one status per key (umbp_op_key_status):
 * 0 stored or already present (first writer wins), -ENOSPC no space within
 * put_wait_ms (a full pool first evicts the least recently used objects that
 * make room; -ENOSPC when leases or pending puts hold the space), -EFBIG
 * larger than the whole pool, UMBP_E_TIMEOUT past timeout_ms.  A failed key
 * leaves the previous state untouched.  A put of a key whose first put is
 * still being written also completes with 0 without writing: 0 means "stored
 * or being stored by an earlier put", and if that earlier put fails the key
 * is absent (a later lookup tells).  timeout_ms bounds the whole op: queued,
 * waiting for space or copying (a host copy is cut at its next 512 KiB chunk;
 * a GPU transfer, once submitted, runs to its end); the caller's memory is
 * never touched after the op completes.
 * Item and range arrays are copied; the bytes the ranges point to must stay
 * valid and unchanged until the op completes.
 */
UMBP_API int umbp_put(umbp_runtime_t *rt, const umbp_put_item_t *items, size_t n,
             umbp_op_t **op);

/*
 * Submits a batch of gets.  Whole-batch errors as for umbp_put (UMBP_E_SHAPE
 * for overlapping or empty ranges).  Per key: 0 restored, -ENOENT missing,
 * UMBP_E_SHAPE a range past the end of the object, UMBP_E_STALE object
 * reclaimed under the reader (destination undefined), UMBP_E_TIMEOUT when
 * the op ran past timeout_ms (queued or copying: the copy is cut),
 * UMBP_E_QUARANTINED (a miss) with load_failure_quarantine_ms.
 * The destination of a key whose status is not 0 holds undefined bytes.
 * Gets are copied before puts, with a share kept for puts: a copy worker
 * that has run 4 gets' jobs while a put waited copies one 512 KiB chunk of
 * puts next.  A restore waits behind bulk offload for the chunk being
 * copied plus one chunk per 4 gets ahead of it (docs/architecture.md).
 */
UMBP_API int umbp_get(umbp_runtime_t *rt, const umbp_get_item_t *items, size_t n,
             umbp_op_t **op);

/* Flags for umbp_lookup. */
enum umbp_lookup_flags {
    UMBP_LOOKUP_TOUCH = 1u << 0, /* refresh LRU position of present keys */
};

/*
 * Which keys exist, and how many leading keys are present consecutively
 * (the cached prefix).  present[i] is set to 1 or 0 (present may be NULL).
 * Synchronous but bounded: waits at most lookup_timeout_ms, then reports
 * UMBP_E_TIMEOUT with everything absent.  Lookups, stats, clear and flush use
 * their own small pool of ops, so data operations in flight (even
 * max_inflight_ops of them) never make them fail; -EAGAIN only when more
 * than 64 of these calls are in flight at once.  While that timed-out lookup is
 * still unanswered, later calls return UMBP_E_NOT_ATTEMPTED at once (all
 * absent) instead of queueing behind it.  No side effects unless
 * UMBP_LOOKUP_TOUCH is given.  One round trip per batch.
 */
UMBP_API int umbp_lookup(umbp_runtime_t *rt, const umbp_key_t *keys, size_t n,
                uint8_t *present, size_t *prefix_len, unsigned flags);

/* Removes every object that no reader holds; held objects are removed as
 * their readers finish.  Bounded by timeout_ms. */
UMBP_API int umbp_clear(umbp_runtime_t *rt);

/* Waits until every put submitted before this call has completed (published
 * or failed).  Returns 0 or UMBP_E_TIMEOUT after timeout_ms (< 0: the
 * runtime's timeout_ms; 0 only polls, so it may time out even when nothing
 * is outstanding). */
UMBP_API int umbp_flush(umbp_runtime_t *rt, int timeout_ms);

/* ---- GPU KV cache ------------------------------------------------------ */

/*
 * The engine's KV cache on the GPU, described by shape and strides
 * (umbp_kv_tensor_t in umbp/gpu.h: FlashAttention, FlashInfer, MLA, per-layer
 * or cross-layer).  Blocks move between the GPU and pool objects with the GPU
 * copy engine (gpu_backend, gpu_device), without going through host buffers
 * of the caller.
 */
typedef uint64_t umbp_kv_handle_t;
struct umbp_kv_tensor; /* umbp/gpu.h */

/*
 * Registers KV tensors (num_tensors of one layer each, or one cross-layer
 * tensor) and returns a handle.  The first call creates the GPU copy engine
 * and pins the pool for it, which is slow (every page): call it at startup.
 * It also warms the transfer path (gpu_warm_transfers) and runs one store of
 * the cache's block 0 that is never published (gpu_warm_store, at the first
 * registration of each object size: the block is
 * only read; it waits for it a second at most, and its failure is logged,
 * not returned).  Shape errors name the tensor and dimension in
 * umbp_last_error().  -ENODEV when no GPU backend finds a device.  The
 * tensors must outlive the handle.
 */
UMBP_API int umbp_kv_register(umbp_runtime_t *rt, const struct umbp_kv_tensor *tensors,
                     uint32_t num_tensors, umbp_kv_handle_t *out);
/* -ENOENT for an unknown handle; -EBUSY (umbp_last_error() says how many)
 * while a transfer submitted on it has not completed, waited for or not,
 * released or not: wait for their ops first.  The tensors may be freed
 * once it returned 0. */
UMBP_API int umbp_kv_deregister(umbp_runtime_t *rt, umbp_kv_handle_t kv);
/* Bytes of one block's object (all layers end to end); 0 if unknown. */
UMBP_API uint64_t umbp_kv_object_size(umbp_runtime_t *rt, umbp_kv_handle_t kv);

/* One block: the object's key and the block's index in the KV tensors. */
typedef struct umbp_kv_block {
    umbp_key_t key;
    uint64_t block;
} umbp_kv_block_t;

typedef struct umbp_kv_xfer_opts {
    uint32_t first_layer; /* loads only: restore layers [first_layer, */
    uint32_t num_layers;  /* first_layer + num_layers); 0 = to the last */
    /* cudaEvent_t / hipEvent_t the copy waits for on the device before it
     * touches GPU memory: the compute stream's writes of the blocks (store),
     * or its last reads of the blocks being overwritten (load).  NULL: none. */
    void *wait_event;
} umbp_kv_xfer_opts_t;

/*
 * Stores whole blocks (every layer) as objects of their keys; loads objects
 * back into blocks (optionally a layer subset).  Return at once; the op
 * completes per key like umbp_put / umbp_get, and only after the GPU copy
 * has finished: a store's blocks may be overwritten, and a load's blocks
 * read, once the op is complete.  Whole-batch errors: -EINVAL, -ENOENT (no
 * such handle), UMBP_E_SHAPE (block index out of range, a store of part of
 * the layers), UMBP_E_DUPLICATE_KEY, -EAGAIN, UMBP_E_NOT_ATTEMPTED.  Per key,
 * besides the put/get statuses: UMBP_E_SHAPE for an object stored under a
 * different layout, -EIO when the device failed the copy.  blocks is read
 * during the call only: the caller may reuse it once the call returns.
 */
UMBP_API int umbp_kv_store(umbp_runtime_t *rt, umbp_kv_handle_t kv, const umbp_kv_block_t *blocks,
                  size_t n, const umbp_kv_xfer_opts_t *opts, umbp_op_t **op);
UMBP_API int umbp_kv_load(umbp_runtime_t *rt, umbp_kv_handle_t kv, const umbp_kv_block_t *blocks,
                 size_t n, const umbp_kv_xfer_opts_t *opts, umbp_op_t **op);

/*
 * A warm-up of the load path, for a binding that runs its own submit, wait
 * and status code once before an engine's first batch (the Python package
 * does, at registration): as umbp_kv_load, with the same checks and an op
 * of the same kind, but no key is ever copied (one the tier holds is given
 * back at once and fails -ENOENT like an absent one), so no byte of the
 * cache is written, and nothing is counted in umbp_stats_t nor quarantined.
 * The tier sees the request as any (a server counts its ACQUIRE).  Keys no
 * engine uses (random ones) are the usual batch.
 */
UMBP_API int umbp_kv_warm_load(umbp_runtime_t *rt, umbp_kv_handle_t kv,
                               const umbp_kv_block_t *blocks, size_t n,
                               const umbp_kv_xfer_opts_t *opts, umbp_op_t **op);

/* ---- completion ------------------------------------------------------- */

/* 0 when complete (whatever the per-key results), UMBP_E_INPROGRESS if not. */
UMBP_API int umbp_op_test(umbp_op_t *op);

/* Waits up to timeout_ms (< 0 means the runtime's timeout_ms) for the op to
 * complete.  0 when complete, UMBP_E_INPROGRESS if the wait timed out. */
UMBP_API int umbp_op_wait(umbp_op_t *op, int timeout_ms);

/* A batch is about to be submitted (its caller builds it first, in Python or
 * in an engine's hook): where poll_wait is on, the runtime's loop thread
 * wakes now and polls for the batch, at most 1 ms, instead of waking when the
 * batch arrives.  A sleeping loop thread took 30-90 us to wake on an H200
 * host (a VM), on the critical path of the batch's first copy.  Returns 0
 * (also where poll_wait is off, which makes it a no-op), -EINVAL without a
 * runtime, UMBP_E_NOT_ATTEMPTED once the runtime is closing.  Never blocks;
 * any thread. */
UMBP_API int umbp_prewake(umbp_runtime_t *rt);

/* Number of keys in the op's batch and per-key status (valid once complete;
 * UMBP_E_INPROGRESS before).  -EINVAL for an index out of range. */
UMBP_API size_t umbp_op_num_keys(const umbp_op_t *op);
UMBP_API int umbp_op_key_status(const umbp_op_t *op, size_t i);
/* Copies the first min(n, num_keys) statuses into out and returns how many;
 * UMBP_E_INPROGRESS before completion, -EINVAL for a NULL out or an op that
 * is not a put or get (bindings read a batch in one call). */
UMBP_API int umbp_op_statuses(const umbp_op_t *op, int32_t *out, size_t n);
/* Counts of keys whose status is 0 and is not 0, once complete. */
UMBP_API size_t umbp_op_num_ok(const umbp_op_t *op);

/* Returns the handle to the runtime; the caller must not touch it again.
 * An op still in flight is recycled when it completes.  A put released in
 * flight still completes (fire and forget).  A host get released in flight
 * is cut at its next chunk and its leases end (a KV load runs to its end),
 * but until then the runtime may still write its destination: a caller that
 * will reuse the destination memory waits for the op (umbp_op_wait) before
 * releasing it. */
UMBP_API void umbp_op_release(umbp_op_t *op);

/* ---- statistics ------------------------------------------------------- */

typedef struct umbp_stats {
    uint64_t capacity_bytes;  /* this rank's pool capacity */
    uint64_t used_bytes;      /* allocated to objects (published or pending) */
    uint64_t num_objects;     /* published objects */
    uint64_t num_pending;     /* reserved, being written */
    uint64_t num_leased;      /* objects with at least one reader */
    uint64_t puts_ok, puts_existing, puts_failed;
    uint64_t gets_ok, gets_miss, gets_failed;
    uint64_t bytes_written, bytes_read;
    uint64_t lookups, lookup_keys, lookup_hits;
    uint64_t evictions, evicted_bytes;
    uint64_t leases_expired;
    uint64_t puts_waited_for_space;
    uint64_t ops_timed_out;
    uint64_t mailbox_full; /* submissions refused with -EAGAIN */
    uint64_t events_dropped;
    /* GPU KV transfers (umbp_kv_store / umbp_kv_load; a sliced store counts
     * each slice) and where their time went, summed in nanoseconds:
     * prepare: from submission until the copy engine is handed the transfer
     *   (queueing, reservations or leases); launch: inside the copy engine's
     *   submit; gpu: from then until the runtime saw the transfer finish;
     *   finish: from then until the op completed (publish, or the release
     *   of the leases).  Two parts of prepare: queue, from submission until
     *   the loop thread took the batch (its wake-up, other work before it);
     *   tier, from then until the tier had reserved or leased its keys. */
    uint64_t kv_transfers;
    uint64_t kv_prepare_ns, kv_launch_ns, kv_gpu_ns, kv_finish_ns;
    uint64_t kv_queue_ns, kv_tier_ns;
    uint64_t prewakes; /* umbp_prewake calls that set the loop thread polling */
    /* standalone: reservations made ahead of their keys for KV stores,
     * held now (counted in num_pending too), and keys whose reservation was
     * one of them (their store needed no reservation round trip, whether
     * it then succeeded or not); reserve_ahead_bytes */
    uint64_t reserved_ahead, reserved_ahead_used;
} umbp_stats_t;

/* Snapshot of the counters (bounded by lookup_timeout_ms). */
UMBP_API int umbp_get_stats(umbp_runtime_t *rt, umbp_stats_t *out);

/* ---- events ----------------------------------------------------------- */

typedef enum umbp_event_type {
    UMBP_EVENT_STORED = 1,  /* key became visible */
    UMBP_EVENT_REMOVED = 2, /* key was evicted or cleared */
} umbp_event_type_t;

typedef struct umbp_event {
    umbp_event_type_t type;
    umbp_key_t key;
} umbp_event_t;

/*
 * Takes up to max events (oldest first) when the `enable_events` option is
 * on.  Returns the number taken.  If the queue overflowed since the last call,
 * *lost (if not NULL) is set to the number of events dropped, so the engine
 * knows to resynchronise its view; otherwise 0.
 */
UMBP_API size_t umbp_events_drain(umbp_runtime_t *rt, umbp_event_t *out, size_t max,
                         uint64_t *lost);

#ifdef __cplusplus
}
#endif
#endif /* UMBP_UMBP_H */
