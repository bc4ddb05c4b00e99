/*
 * core_options.c - the options every mode shares (struct umbp_core_config
 * in umbp/tier.h): the table and its cross-option checks.  Used by the
 * runtime and by umbp-server, which reads the same config as its clients.
 * Constant table; any thread.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "options.h"
#include "util.h"

#define OFF(f) offsetof(struct umbp_core_config, f)
#define MiB (1024.0 * 1024.0)
#define TiB (1024.0 * 1024.0 * 1024.0 * 1024.0)

#define MODE_NAME(mode, tier, flags) mode,
static const char *const modes[] = {UMBP_MODES(MODE_NAME) NULL};
#undef MODE_NAME
static const char *const levels[] = {"error", "warn", "info", "debug", NULL};
static const char *const gpu_backends[] = {"auto", "cuda", "hip", "host", NULL};
static const char *const auto_on_off[] = {"auto", "on", "off", NULL};
static const char *const gpu_methods[] = {"auto", "kernel", "staged", "dma", NULL};

const struct umbp_option umbp_core_options[] = {
    {"mode", UMBP_OPT_STRING, OFF(mode), "embedded", 0, 0, 32, modes,
     "composition of tiers: embedded (dram), standalone (shm), distributed (dram+rdma)"},
    {"tier", UMBP_OPT_STRING, OFF(tier), "", 0, 0, 32, NULL,
     "run on this registered tier instead of the mode's primary one (tests, experiments)"},
    {"rank", UMBP_OPT_INT, OFF(rank), "0", 0, 65535, 0, NULL, "this worker's rank in its engine"},
    {"world_size", UMBP_OPT_INT, OFF(world_size), "1", 1, 65536, 0, NULL,
     "ranks per engine (total_capacity_bytes is split over them)"},
    {"capacity_bytes", UMBP_OPT_SIZE, OFF(capacity_bytes), "0", 0, 64 * TiB, 0, NULL,
     "pool capacity of this rank (default 1GiB when neither capacity option is set)"},
    {"total_capacity_bytes", UMBP_OPT_SIZE, OFF(total_capacity_bytes), "0", 0, 1024 * TiB, 0,
     NULL, "pool capacity of the whole engine, split evenly over world_size ranks"},
    {"timeout_ms", UMBP_OPT_INT, OFF(timeout_ms), "10000", 1, 3600000, 0, NULL,
     "bound on every data operation; past it the op completes with UMBP_E_TIMEOUT "
     "(standalone: plus 1 s, how long a server holds a region this client left unfinished)"},
    {"lookup_timeout_ms", UMBP_OPT_INT, OFF(lookup_timeout_ms), "100", 1, 60000, 0, NULL,
     "bound on one umbp_lookup call"},
    {"put_wait_ms", UMBP_OPT_INT, OFF(put_wait_ms), "1000", 0, 3600000, 0, NULL,
     "how long a put into a full pool waits for eviction before -ENOSPC"},
    {"lease_ttl_ms", UMBP_OPT_INT, OFF(lease_ttl_ms), "30000", 10, 3600000, 0, NULL,
     "read lease lifetime; a reader that holds a lease longer may see UMBP_E_STALE"},
    {"load_failure_quarantine_ms", UMBP_OPT_INT, OFF(load_failure_quarantine_ms), "0", 0,
     3600000, 0, NULL, "after a failed load, the key counts as a miss this long (0 = off); unset in distributed "
     "mode: 30000"},
    {"max_inflight_ops", UMBP_OPT_INT, OFF(max_inflight_ops), "1024", 4, 1 << 20, 0, NULL,
     "operations in flight per runtime; more are refused with -EAGAIN"},
    {"copy_threads", UMBP_OPT_INT, OFF(copy_threads), "2", 1, 64, 0, NULL,
     "host copy worker threads"},
    {"enable_events", UMBP_OPT_BOOL, OFF(enable_events), "false", 0, 0, 0, NULL,
     "queue stored/removed events for umbp_events_drain"},
    {"event_queue_size", UMBP_OPT_INT, OFF(event_queue_size), "65536", 16, 1 << 24, 0, NULL,
     "events kept before the oldest are dropped (and counted as lost)"},
    {"log_level", UMBP_OPT_STRING, OFF(log_level), "warn", 0, 0, 16, levels,
     "error, warn, info or debug"},
    {"poll_wait", UMBP_OPT_STRING, OFF(poll_wait), "auto", 0, 0, 8, auto_on_off,
     "poll briefly before sleeping (waiters; the loop during GPU transfers): auto = on "
     "where this process may use at least 8 CPUs (affinity and cgroup quota)"},
    {"gpu_backend", UMBP_OPT_STRING, OFF(gpu_backend), "auto", 0, 0, 16, gpu_backends,
     "GPU runtime of umbp_kv_*: auto (CUDA, then HIP), cuda, hip, or host (device memory is "
     "host memory; tests)"},
    {"gpu_device", UMBP_OPT_INT, OFF(gpu_device), "0", 0, 1023, 0, NULL,
     "GPU ordinal (within the backend) that this rank's KV cache lives on"},
    {"gpu_max_ctas", UMBP_OPT_INT, OFF(gpu_max_ctas), "32", 1, 1024, 0, NULL,
     "thread blocks (at most one SM each) a KV copy kernel may occupy"},
    {"gpu_threads_per_cta", UMBP_OPT_INT, OFF(gpu_threads_per_cta), "128", 32, 512, 0, NULL,
     "threads per thread block of a KV copy kernel, a multiple of 32 (small blocks share "
     "their SMs with the engine's kernels)"},
    {"gpu_staging_bytes", UMBP_OPT_SIZE, OFF(gpu_staging_bytes), "256MiB", 1 << 20, 16.0 * (1ull << 30), 0,
     NULL, "device staging buffer of the staged copy method, half for stores and half for restores"},
    {"gpu_store_slice_blocks", UMBP_OPT_INT, OFF(gpu_store_slice_blocks), "256", 0, 1 << 24, 0, NULL,
     "umbp_kv_store batches larger than this run as slices that overlap reservation "
     "and publish with copying, the first one half a slice (0: never split)"},
    {"gpu_load_head_blocks", UMBP_OPT_INT, OFF(gpu_load_head_blocks), "32", 0, 1 << 24, 0, NULL,
     "standalone: an umbp_kv_load of at least 8 times this many blocks, submitted while "
     "nothing else is in flight, copies its first this many while the server grants the "
     "rest (0: one transfer)"},
    {"gpu_warm_transfers", UMBP_OPT_INT, OFF(gpu_warm_transfers), "16", 0, 64, 0, NULL,
     "at the first umbp_kv_register, allocate the block tables of this many GPU transfers, "
     "load the copy kernel, and size the per-key arrays of the first this-many ops, so the "
     "first stores and restores of a process run at full speed (0: on first use)"},
    {"gpu_warm_store", UMBP_OPT_BOOL, OFF(gpu_warm_store), "true", 0, 0, 0, NULL,
     "at the first umbp_kv_register of each object size, store one block of the new cache "
     "under a random key "
     "and abort it before it is published, so the first real store does not pay the store "
     "path's first-time costs (no object, event or counter results; it never waits for "
     "space)"},
    {"gpu_store_method", UMBP_OPT_STRING, OFF(gpu_store_method), "auto", 0, 0, 8, gpu_methods,
     "how the GPU copy engine stores: auto (staged for large DMAs, else kernel), kernel "
     "(zero-copy writes to host memory), staged (gather on the GPU, then the copy engine), "
     "dma (one copy-engine copy per chunk: a baseline)"},
    {"gpu_restore_method", UMBP_OPT_STRING, OFF(gpu_restore_method), "auto", 0, 0, 8, gpu_methods,
     "how the GPU copy engine restores: auto (= staged: the copy engine, then a scatter "
     "kernel), kernel (zero-copy reads of host memory; its blocks hold their SMs for the "
     "whole transfer, which costs a decode beside it more), staged, dma (a baseline)"},
    {"gpu_l2_discard_staging", UMBP_OPT_BOOL, OFF(gpu_l2_discard_staging), "true", 0, 0, 0, NULL,
     "staged restores drop the staging buffer's lines from the GPU's L2 once scattered (CUDA, "
     "sm_80+), so the copy engine's bytes are not written back to HBM"},
    {"gpu_evict_first_restore", UMBP_OPT_BOOL, OFF(gpu_evict_first_restore), "true", 0, 0, 0,
     NULL, "restores write the KV blocks evict-first in the GPU's L2 (streaming stores), so the "
     "engine's own working set there stays"},
    {"gpu_ramp_overlapped", UMBP_OPT_BOOL, OFF(gpu_ramp_overlapped), "false", 0, 0, 0, NULL,
     "the staged method ramps its groups (smaller copies) at every transfer's ends; false: not "
     "where other copies overlap an end (a store slice behind or before another), fewer copies"},
    {"gpu_wait_poll", UMBP_OPT_BOOL, OFF(gpu_wait_poll), "true", 0, 0, 0, NULL,
     "where poll_wait is on, a thread waiting for a KV transfer polls (yielding the core at "
     "every turn) until it completes, at most 50 ms, as CUDA's own synchronize does, instead "
     "of sleeping after the short poll (false: a wake-up's latency for the CPU)"},
    {.name = NULL},
};

int umbp_core_validate(const struct umbp_core_config *k, uint64_t *rank_capacity, char *err,
                       size_t errlen)
{
    if (k->capacity_bytes && k->total_capacity_bytes) {
        snprintf(err, errlen, "capacity_bytes and total_capacity_bytes are mutually exclusive; set one");
        return -EINVAL;
    }
    if (k->rank >= k->world_size) {
        snprintf(err, errlen, "rank: must be below world_size (%lld), got %lld",
                 (long long)k->world_size, (long long)k->rank);
        return -EINVAL;
    }
    if (k->gpu_threads_per_cta % 32) {
        snprintf(err, errlen, "gpu_threads_per_cta: must be a multiple of 32 (a warp), got %lld",
                 (long long)k->gpu_threads_per_cta);
        return -EINVAL;
    }
    uint64_t cap = k->capacity_bytes;
    if (k->total_capacity_bytes)
        cap = k->total_capacity_bytes / (uint64_t)k->world_size;
    if (!k->capacity_bytes && !k->total_capacity_bytes)
        cap = 1ull << 30;
    if (cap < (1u << 20)) {
        snprintf(err, errlen, "%s: the per-rank capacity must be at least 1MiB, got %llu bytes",
                 k->total_capacity_bytes ? "total_capacity_bytes" : "capacity_bytes",
                 (unsigned long long)cap);
        return -EINVAL;
    }
    *rank_capacity = cap;
    return 0;
}


bool umbp_poll_wait_spins(const char *poll_wait)
{
    if (strcmp(poll_wait, "on") == 0)
        return true;
    return strcmp(poll_wait, "auto") == 0 && umbp_usable_cpus() >= UMBP_POLL_MIN_CPUS;
}

const char *umbp_mode_tier(const char *mode)
{
#define MODE_TIER(m, tier, flags) \
    if (strcmp(mode, m) == 0)     \
        return tier;
    UMBP_MODES(MODE_TIER)
#undef MODE_TIER
    return NULL;
}

int umbp_mode_props(const char *mode, unsigned *flags, char *err, size_t errlen)
{
#define MODE_FLAGS(m, tier, f)          \
    if (mode && strcmp(mode, m) == 0) { \
        *flags = (f);                   \
        return 0;                       \
    }
    UMBP_MODES(MODE_FLAGS)
#undef MODE_FLAGS
#define MODE_LIST(m, tier, f) " " m
    snprintf(err, errlen, "mode: must be one of" UMBP_MODES(MODE_LIST) ", got '%s'",
             mode ? mode : "(null)");
#undef MODE_LIST
    return -EINVAL;
}
