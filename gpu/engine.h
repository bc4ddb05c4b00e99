/*
 * engine.h (private) - the state behind umbp_gpu_engine_t, umbp_kv_layout_t
 * and umbp_gpu_xfer_t, shared by engine.c and kv_layout.c.
 *
 * Ownership: everything in an engine is guarded by eng->lock except the
 * immutable fields (ops, cfg, device, num_sms, streams, staging) and a
 * transfer's `status`, which umbp_gpu_xfer_test updates lock-free (an atomic
 * int: several pollers may race to store the same final value).
 */
#ifndef UMBP_GPU_ENGINE_H
#define UMBP_GPU_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "gpu.h"

#define GPU_STAGING_SLOTS 4
#define GPU_COPY_STREAMS_MAX 4

/* A piece of host memory registered with the engine. */
struct gpu_region {
    uintptr_t addr;
    size_t len;
    uintptr_t dev; /* device-visible address of addr (mapped) */
    bool owned;    /* allocated by umbp_gpu_host_alloc */
};

enum xfer_state { XFER_FREE, XFER_BUSY, XFER_ORPHAN };

struct umbp_gpu_xfer {
    struct umbp_gpu_engine *eng;
    gpu_event_t done;       /* recorded after the transfer's last device work */
    enum xfer_state state;  /* under eng->lock */
    atomic_int status;      /* UMBP_E_INPROGRESS until known done/failed */
    uint64_t bytes;
    umbp_gpu_method_t method;
    uint32_t groups;             /* STAGED: the copy groups it ran in (tests) */
    size_t cap;                  /* entries of the three tables below */
    struct gpu_copy_block *htab; /* pinned host copy of the block table */
    struct gpu_copy_block *dtab; /* device copy the restore lane's kernels read */
    /* htab as the device sees it (mapped): the store lane's kernels read
     * their table there, so a store never queues a host-to-device upload
     * behind a restore's DMAs (engine.c: table_of) */
    const struct gpu_copy_block *htab_dev;
    uintptr_t *hsel;             /* host address of each object's selected bytes */
    umbp_kv_block_io_t *sorted;  /* STAGED: the blocks by host address */
    struct umbp_gpu_xfer *next;  /* free list / orphan list */
};

enum { LANE_STORE = 0, LANE_RESTORE = 1 };

struct gpu_lane {
    gpu_stream_t kstream; /* kernels, table uploads, DMA-method copies */
    /* The staged method's copy-engine transfers; cfg.copy_streams of them
     * share each group's DMAs, so that one copy's setup overlaps another's
     * transfer.  cstream[0] joins the others at the end of every group. */
    gpu_stream_t cstream[GPU_COPY_STREAMS_MAX];
    gpu_stream_t zstream;  /* STAGED with kernel_share_pct: the zero-copy part */
    /* A restore's block-table upload, and the event kstream waits for
     * after it: on an idle stream of its own the upload is queued to the
     * copy engine before the transfer's DMAs, not behind them (engine.c:
     * upload_table) */
    gpu_stream_t tstream;
    gpu_event_t table_up;
    gpu_event_t table_ready, zero_copy_done; /* kstream -> zstream -> the end */
    /* recorded after each staged transfer's last copy: while it has not
     * fired, the lane's copy engine has work queued, and the next staged
     * transfer needs no ramp-up (engine.c: run_staged) */
    gpu_event_t last_end;
    /* The lane's half of the staging buffer: GPU_STAGING_SLOTS slots of
     * eng->slot_bytes, used in turn (a store's pipeline never waits for a
     * restore's slots, nor the other way round). */
    char *staging;
    unsigned next_slot;
    gpu_event_t slot_filled[GPU_STAGING_SLOTS];
    gpu_event_t slot_free[GPU_STAGING_SLOTS];
    gpu_event_t slot_join[GPU_STAGING_SLOTS][GPU_COPY_STREAMS_MAX];
};

struct umbp_gpu_engine {
    const struct gpu_ops *ops;
    umbp_gpu_config_t cfg; /* defaults filled in */
    int device;
    int num_sms;
    pthread_mutex_t lock;

    /* One lane of streams per direction (LANE_STORE, LANE_RESTORE), so a
     * restore's host-to-device copies run beside a store's device-to-host
     * ones (the link is full duplex) instead of queueing behind them. */
    struct gpu_lane lane[2];

    char *staging; /* NULL unless a method may be STAGED; both lanes' slots */
    uint64_t slot_bytes;

    struct gpu_region *regions; /* sorted by addr, disjoint */
    size_t nregions, regions_cap, last_region;

    struct umbp_gpu_xfer *xfers; /* cfg.max_inflight of them */
    struct umbp_gpu_xfer *free_list, *orphans;

    uint32_t *sm_mask; /* device, GPU_SM_MASK_WORDS, with UMBP_GPU_RECORD_SMS */

    /* Scratch for the copy lists of DMA calls (under lock). */
    void **dma_dst;
    const void **dma_src;
    size_t *dma_len;
    size_t dma_cap;

    atomic_int num_layouts;
};

struct umbp_kv_layout {
    struct umbp_gpu_engine *eng;
    uint32_t num_layers;
    uint32_t nkv;
    uint64_t num_blocks;
    uint64_t object_size;
    struct gpu_copy_layer *layers;  /* host copy */
    struct gpu_copy_layer *dlayers; /* device copy the kernels read */
};

#endif /* UMBP_GPU_ENGINE_H */
