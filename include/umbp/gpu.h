/*
 * gpu.h - the GPU copy engine of umbp: moves KV-cache blocks between an
 * engine's GPU tensors and host objects (one contiguous object per block, all
 * layers laid end to end), many blocks per call, on streams of its own.
 *
 * The pieces:
 *   - an engine (umbp_gpu_engine_t) bound to one device of one backend
 *     (CUDA, HIP, or the host-only backend, where "device memory" is plain
 *     host memory so everything builds and tests without a GPU);
 *   - host memory registered with the engine once, off the critical path
 *     (umbp_gpu_host_register: cudaHostRegister / hipHostRegister);
 *   - a KV layout (umbp_kv_layout_t): the engine's KV tensors described by
 *     base pointer, shape, strides and element size, per layer or as one
 *     cross-layer tensor;
 *   - transfers (umbp_gpu_xfer_t): a store gathers GPU blocks into host
 *     objects, a restore scatters host objects into GPU blocks.  Both return
 *     at once; completion is polled (umbp_gpu_xfer_test never blocks) or
 *     waited for with a timeout.
 *
 * Object layout.  For a layout of L layers whose chunks (one of K or V of one
 * block of one layer) are c_l bytes and nkv = 2 (K and V) or 1 (MLA), the
 * object of a block holds layer 0's K chunk, layer 0's V chunk, layer 1's K
 * chunk, ... in that order, with no padding: object_size = nkv * sum(c_l).
 * A transfer of a layer subset [first_layer, first_layer + num_layers) touches
 * only that subset's bytes, at their usual offsets in the object.
 *
 * Threads.  Every function may be called from any thread.  Submissions on one
 * engine are serialised by the engine's lock (short: no waiting on the device
 * inside it); umbp_gpu_xfer_test only queries an event, so the runtime's loop
 * thread may poll it.  The calling thread's current device is left as found.
 *
 * Return values: 0, a negative errno value, one of the UMBP_E_* codes of
 * umbp.h (UMBP_E_INPROGRESS, UMBP_E_TIMEOUT) or the UMBP_E_KV_* / UMBP_E_GPU_*
 * codes below.  umbp_gpu_strerror() names any of them; umbp_gpu_last_error()
 * gives the message of the last failure on the calling thread.
 */
#ifndef UMBP_GPU_H
#define UMBP_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "umbp/umbp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ----------------------------------------------------------- */

/* Shape errors of layout registration and transfers are the UMBP_E_KV_* and
 * UMBP_E_GPU_UNREGISTERED codes of umbp.h's one error list:
 *   UMBP_E_KV_NDIM      ndim outside [2, UMBP_KV_MAX_DIMS]
 *   UMBP_E_KV_ROLE      block_dim / kv_dim / layer_dim out of range or equal;
 *                       layer_dim set on one of several per-layer tensors, or
 *                       a cross-layer tensor given with others
 *   UMBP_E_KV_SHAPE     a size < 1, a kv dim whose size is not 2, elem_size 0,
 *                       a chunk of 0 bytes, or a tensor past 2^63 bytes
 *   UMBP_E_KV_STRIDE    the dims of a chunk are not dense in any order, or a
 *                       block/kv/layer stride is not positive (chunks alias)
 *   UMBP_E_KV_MISMATCH  per-layer tensors disagree on the number of blocks or
 *                       on having a kv dim
 *   UMBP_E_KV_RANGE     a block index or layer range outside the layout
 *   UMBP_E_GPU_UNREGISTERED  a host object is not inside host memory
 *                       registered with the engine */

/* Names any return value of this API (errno values and umbp.h codes too).
 * Never NULL; the string is static. */
UMBP_API const char *umbp_gpu_strerror(int err);

/* The message of the last failure on this thread ("tensor 3: kv_dim 1 has
 * size 4; it must be 2"), or "" if none. */
UMBP_API const char *umbp_gpu_last_error(void);

/* ---- backends --------------------------------------------------------- */

typedef enum umbp_gpu_backend {
    UMBP_GPU_BACKEND_AUTO = 0, /* configuration only: CUDA, then HIP, then host */
    UMBP_GPU_BACKEND_HOST = 1, /* host-only: "device" memory is host memory */
    UMBP_GPU_BACKEND_CUDA = 2,
    UMBP_GPU_BACKEND_HIP = 3,
} umbp_gpu_backend_t;

/* Bit (1u << backend) set for each backend compiled into this build; the
 * host backend is always there. */
UMBP_API unsigned umbp_gpu_backends_built(void);

/* Whether a backend can run here: 0 and *num_devices (>= 1) if it can,
 * -ENOTSUP if it was not built, -ENODEV if no device or driver was found
 * (umbp_gpu_last_error() says why).  Cheap after the first call. */
UMBP_API int umbp_gpu_backend_probe(umbp_gpu_backend_t b, int *num_devices);

/* "host", "cuda", "hip", "auto"; "?" otherwise. */
UMBP_API const char *umbp_gpu_backend_name(umbp_gpu_backend_t b);

/* ---- engine ----------------------------------------------------------- */

/* How a transfer moves bytes (docs/gpu-copy-engine.md has the measurements
 * behind AUTO's choice). */
typedef enum umbp_gpu_method {
    UMBP_GPU_METHOD_AUTO = 0,   /* by backend, direction and DMA size */
    UMBP_GPU_METHOD_KERNEL = 1, /* a few SMs copy GPU chunks straight to or
                                   from mapped host memory (zero-copy) */
    UMBP_GPU_METHOD_STAGED = 2, /* a few SMs gather/scatter chunks in a device
                                   staging buffer; the copy engine moves one
                                   contiguous piece per object, pipelined */
    UMBP_GPU_METHOD_DMA = 3,    /* the copy engine moves every chunk
                                   (cudaMemcpyBatchAsync where available) */
} umbp_gpu_method_t;

/* umbp_gpu_config.flags */
enum umbp_gpu_flags {
    UMBP_GPU_RECORD_SMS = 1u << 0, /* kernels record which SMs they ran on
                                      (umbp_gpu_engine_sms_used); diagnostic */
    UMBP_GPU_NO_BATCH_MEMCPY = 1u << 1, /* DMA method: one memcpy call per
                                           chunk instead of batched calls */
    UMBP_GPU_SORT_BY_HOST = 1u << 2, /* STAGED: sort each transfer's blocks
                                        by host address, so that objects
                                        adjacent in host memory but not in
                                        the request merge into one DMA (costs
                                        a sort on the submitting thread;
                                        objects adjacent in request order
                                        merge anyway) */
    UMBP_GPU_L2_DISCARD_STAGING = 1u << 3, /* STAGED restores: once a warp has
                                        read a chunk from the staging slot,
                                        drop the slot's lines from the GPU's
                                        L2 (CUDA, sm_80+), so the copy
                                        engine's dirty bytes are not written
                                        back to HBM: one pass through HBM
                                        instead of three */
    UMBP_GPU_EVICT_FIRST_RESTORE = 1u << 4, /* restores: the kernel writes the
                                        KV blocks evict-first in L2
                                        (streaming stores), so the engine's
                                        own working set there stays */
    UMBP_GPU_RAMP_OVERLAPPED = 1u << 5, /* STAGED: ramp the groups at every
                                        transfer's ends, also where other
                                        copies overlap them (the engine's
                                        default; the runtime clears it
                                        unless gpu_ramp_overlapped).
                                        Off: a transfer that finds its lane
                                        still copying starts with whole
                                        slots, and one flagged
                                        UMBP_KV_XFER_FOLLOWED ends with them:
                                        fewer, larger copies (faster stores
                                        on an H100 host:
                                        docs/benchmarks.md) */
};

typedef struct umbp_gpu_config {
    umbp_gpu_backend_t backend;   /* AUTO */
    int device;                   /* ordinal within the backend; 0 */
    umbp_gpu_method_t store_method;   /* AUTO */
    umbp_gpu_method_t restore_method; /* AUTO */
    uint32_t max_ctas;        /* thread blocks per copy kernel, at most one SM
                                 each; 0 = default (32), at most 1024 */
    uint32_t threads_per_cta; /* 0 = default (128); a multiple of 32, <= 512 */
    uint32_t vec_per_lane;    /* 16-byte loads in flight per thread: 4, 8 or 16;
                                 0 = default (8) */
    uint64_t staging_bytes;   /* device staging buffer of the STAGED method,
                                 split into 4 slots per direction (stores,
                                 restores); 0 = default (256 MiB: 32 MiB
                                 slots, fewer and larger scatter kernels);
                                 allocated only if a method is AUTO or STAGED
                                 at creation (else STAGED acts as KERNEL) */
    uint32_t max_inflight;    /* transfers in flight at once; 0 = default (64) */
    uint32_t copy_streams;    /* STAGED: streams sharing each group's DMAs,
                                 1..4; 0 = default (1) */
    uint32_t kernel_share_pct; /* STAGED: percent of the objects (0..90) that a
                                  concurrent zero-copy kernel moves while the
                                  copy engine moves the rest; 0 = default (0) */
    uint32_t flags;           /* umbp_gpu_flags; 0 is none (not a default):
                                 umbp_gpu_config_default sets
                                 L2_DISCARD_STAGING | EVICT_FIRST_RESTORE */
} umbp_gpu_config_t;

/* Fills *cfg with the defaults above. */
UMBP_API void umbp_gpu_config_default(umbp_gpu_config_t *cfg);

typedef struct umbp_gpu_engine umbp_gpu_engine_t;

/*
 * Creates an engine on cfg->device of cfg->backend (NULL cfg: defaults).
 * With AUTO it takes the first backend that finds a device, else the host
 * backend.  Allocates its streams, events and staging buffer here, so that
 * transfers allocate nothing in steady state.  -ENODEV when the backend named
 * finds no device, -EINVAL for a bad option (umbp_gpu_last_error() names it).
 */
UMBP_API int umbp_gpu_engine_create(const umbp_gpu_config_t *cfg, umbp_gpu_engine_t **out);

/* Waits for the engine's transfers to finish and frees everything; layouts
 * must be destroyed first.  NULL is a no-op. */
UMBP_API void umbp_gpu_engine_destroy(umbp_gpu_engine_t *eng);

UMBP_API umbp_gpu_backend_t umbp_gpu_engine_backend(const umbp_gpu_engine_t *eng);
UMBP_API int umbp_gpu_engine_device(const umbp_gpu_engine_t *eng);
/* Multiprocessors (CUDA SMs, HIP CUs) of the engine's device; 1 on host. */
UMBP_API int umbp_gpu_engine_num_sms(const umbp_gpu_engine_t *eng);
/* The method a transfer of this direction (0 store, 1 restore) would use
 * for objects of object_bytes (of the selected layers), none of them adjacent
 * in host memory, AUTO resolved. */
UMBP_API umbp_gpu_method_t umbp_gpu_engine_method(const umbp_gpu_engine_t *eng, int restore,
                                         uint64_t object_bytes);
/* The device's name ("NVIDIA H200", "host"), NUL-terminated in buf. */
UMBP_API void umbp_gpu_engine_device_name(const umbp_gpu_engine_t *eng, char *buf, size_t len);
/* The engine's configuration, defaults filled in and AUTO backend resolved. */
UMBP_API void umbp_gpu_engine_get_config(const umbp_gpu_engine_t *eng, umbp_gpu_config_t *cfg);
/*
 * Changes the tunables for transfers submitted afterwards: store_method,
 * restore_method, max_ctas, threads_per_cta, vec_per_lane, copy_streams,
 * kernel_share_pct and the flags UMBP_GPU_NO_BATCH_MEMCPY,
 * UMBP_GPU_SORT_BY_HOST, UMBP_GPU_L2_DISCARD_STAGING,
 * UMBP_GPU_EVICT_FIRST_RESTORE and UMBP_GPU_RAMP_OVERLAPPED (0 fields but flags take defaults).  backend, device,
 * staging_bytes, max_inflight and UMBP_GPU_RECORD_SMS are fixed at creation:
 * -EINVAL if cfg asks to change them (start from umbp_gpu_engine_get_config).
 */
UMBP_API int umbp_gpu_engine_set_tuning(umbp_gpu_engine_t *eng, const umbp_gpu_config_t *cfg);
/* With UMBP_GPU_RECORD_SMS: how many distinct SMs ran copy kernels since the
 * last call (which resets the record); waits for the engine to go idle.
 * -ENOTSUP without the flag. */
UMBP_API int umbp_gpu_engine_sms_used(umbp_gpu_engine_t *eng);

/*
 * Does now what the first transfers of a process would otherwise do on the
 * critical path: sizes the block tables of the `xfers` transfers taken first
 * for `blocks` blocks each, loads the copy kernel (lazy module loading loads
 * it at its first launch) and makes each stream's first copy, then waits for
 * the device.  Call it off the critical path (the runtime does, at the first
 * umbp_kv_register) and before the engine's first transfer: its copies use
 * the staging slots without the transfers' ordering, so one running beside
 * them could overwrite their staged bytes.  0 for blocks or xfers does
 * nothing.
 */
UMBP_API int umbp_gpu_engine_warm(umbp_gpu_engine_t *eng, size_t blocks, unsigned xfers);

/* ---- host memory -------------------------------------------------------- */

/*
 * Registers host memory that host objects live in (pins and maps it for the
 * device: cudaHostRegister with the mapped and portable flags).  Slow (it
 * pins every page): call it once per pool, off the critical path.  -EEXIST if
 * it overlaps a registered region, -EINVAL for len 0, -ENOMEM or -EIO when
 * the runtime refuses.
 */
UMBP_API int umbp_gpu_host_register(umbp_gpu_engine_t *eng, void *addr, size_t len);
/* -ENOENT unless addr is the start of a registered region.  No transfer may
 * still use it. */
UMBP_API int umbp_gpu_host_unregister(umbp_gpu_engine_t *eng, void *addr);

/* Allocates len bytes of pinned, mapped host memory that is registered with
 * the engine already (cudaHostAlloc); for pools and tests.  -ENOMEM. */
UMBP_API int umbp_gpu_host_alloc(umbp_gpu_engine_t *eng, size_t len, void **out);
UMBP_API void umbp_gpu_host_free(umbp_gpu_engine_t *eng, void *p);

/* ---- KV layouts ------------------------------------------------------- */

#define UMBP_KV_MAX_DIMS 8

/*
 * One KV tensor as the engine holds it, described the way torch describes a
 * tensor: element [i0, i1, ...] lives at base + sum(i_d * stride[d]) *
 * elem_size.  Three dims have roles: block_dim indexes KV blocks; kv_dim
 * (size 2) picks K or V, -1 when there is none (MLA's latent cache);
 * layer_dim indexes layers of a cross-layer tensor, -1 for a tensor of one
 * layer.  The other dims make up one chunk and must be dense in some order
 * (row-major, or permuted like vLLM's HND view of (2, nb, bs, H, D) whose
 * memory is (2, nb, H, bs, D)); a chunk's bytes are stored as they lie.
 * Padding between blocks, K/V or layers is fine.
 *
 *   FlashAttention   (2, num_blocks, block_size, H, D)  block_dim 1, kv_dim 0
 *   FlashInfer       (num_blocks, 2, block_size, H, D)  block_dim 0, kv_dim 1
 *   MLA              (num_blocks, block_size, 576)      block_dim 0, kv_dim -1
 *   cross-layer      (num_blocks, L, 2, block_size, H, D)
 *                                         block_dim 0, layer_dim 1, kv_dim 2
 */
typedef struct umbp_kv_tensor {
    void *base;                        /* device address of element [0, ...] */
    uint32_t ndim;
    int64_t shape[UMBP_KV_MAX_DIMS];
    int64_t stride[UMBP_KV_MAX_DIMS];  /* in elements, like Tensor.stride() */
    uint32_t elem_size;                /* bytes per element (2 for bf16) */
    int32_t block_dim;
    int32_t kv_dim;                    /* -1: no K/V split */
    int32_t layer_dim;                 /* -1: one layer */
} umbp_kv_tensor_t;

/* Sets t->stride to the dense row-major strides of t->shape. */
UMBP_API void umbp_kv_tensor_set_contiguous(umbp_kv_tensor_t *t);

typedef struct umbp_kv_layout umbp_kv_layout_t;

/*
 * Registers the engine's KV cache: num_tensors tensors of one layer each
 * (layer i = tensors[i]), or one tensor with a layer_dim.  Checks every shape
 * (UMBP_E_KV_* with umbp_gpu_last_error() naming the tensor and dim) and
 * copies a small table to the device.  The tensors must outlive the layout.
 */
UMBP_API int umbp_kv_layout_create(umbp_gpu_engine_t *eng, const umbp_kv_tensor_t *tensors,
                          uint32_t num_tensors, umbp_kv_layout_t **out);
/* No transfer may still use it.  NULL is a no-op. */
UMBP_API void umbp_kv_layout_destroy(umbp_kv_layout_t *layout);

UMBP_API uint32_t umbp_kv_layout_num_layers(const umbp_kv_layout_t *layout);
UMBP_API uint64_t umbp_kv_layout_num_blocks(const umbp_kv_layout_t *layout);
UMBP_API uint32_t umbp_kv_layout_num_kv(const umbp_kv_layout_t *layout); /* 2 or 1 */
/* Bytes of one block's object (all layers). */
UMBP_API uint64_t umbp_kv_layout_object_size(const umbp_kv_layout_t *layout);
/* Where layers [first, first + count) lie in an object (count 0 = to the
 * last layer); for ranged puts and gets.  UMBP_E_KV_RANGE if outside. */
UMBP_API int umbp_kv_layout_layer_span(const umbp_kv_layout_t *layout, uint32_t first,
                              uint32_t count, uint64_t *offset, uint64_t *len);

/* ---- transfers -------------------------------------------------------- */

/* One block of a transfer: the GPU block and its host object. */
typedef struct umbp_kv_block_io {
    uint64_t block; /* index along block_dim */
    void *host;     /* start of the object (object_size bytes), inside
                       registered host memory */
} umbp_kv_block_io_t;

typedef struct umbp_kv_xfer_desc {
    const umbp_kv_layout_t *layout;
    const umbp_kv_block_io_t *blocks; /* copied at submission */
    size_t num_blocks;
    uint32_t first_layer;
    uint32_t num_layers;  /* 0 = every layer from first_layer on */
    /* An event of the backend's runtime (cudaEvent_t, hipEvent_t; ignored by
     * the host backend) that the transfer waits for on the device before it
     * touches GPU memory: for a store, the compute stream's writes of the
     * blocks; for a restore, the last reads of the blocks being overwritten.
     * NULL: no wait.  Only the record made before submission counts. */
    void *wait_event;
    uint32_t flags; /* UMBP_KV_XFER_*; 0: none */
} umbp_kv_xfer_desc_t;

/* umbp_kv_xfer_desc_t.flags.  FOLLOWED: another transfer in the same
 * direction is submitted right behind this one (a slice of a larger store),
 * so the staged method may keep its last groups whole (where the engine's
 * UMBP_GPU_RAMP_OVERLAPPED is off): their smaller copies pay only where the
 * link would otherwise go idle after them.  A hint; a wrong one costs time,
 * never bytes. */
#define UMBP_KV_XFER_FOLLOWED 1u

typedef struct umbp_gpu_xfer umbp_gpu_xfer_t;

/*
 * Store: copies the blocks' chunks of the selected layers from the GPU into
 * their host objects.  Restore: the reverse.  Both return at once with *out.
 * A store's GPU source and a restore's host source must stay unchanged until
 * the transfer completes.  Errors (nothing submitted): -EINVAL, UMBP_E_KV_RANGE,
 * UMBP_E_GPU_UNREGISTERED, -EAGAIN when max_inflight transfers are in flight
 * (back-pressure: poll, release, retry), -EIO when the device runtime fails.
 * Transfers of one engine may overlap and complete out of submission order.
 */
UMBP_API int umbp_gpu_store(umbp_gpu_engine_t *eng, const umbp_kv_xfer_desc_t *desc,
                   umbp_gpu_xfer_t **out);
UMBP_API int umbp_gpu_restore(umbp_gpu_engine_t *eng, const umbp_kv_xfer_desc_t *desc,
                     umbp_gpu_xfer_t **out);

/* 0 when the transfer has completed (all bytes in place), UMBP_E_INPROGRESS
 * if not, -EIO if the device failed it.  Never blocks. */
UMBP_API int umbp_gpu_xfer_test(umbp_gpu_xfer_t *x);
/* Waits up to timeout_ms (< 0: without bound) for completion.  Returns as
 * umbp_gpu_xfer_test, UMBP_E_TIMEOUT past the timeout. */
UMBP_API int umbp_gpu_xfer_wait(umbp_gpu_xfer_t *x, int timeout_ms);
/* The backend event recorded when the transfer completes (cudaEvent_t,
 * hipEvent_t; NULL on the host backend), so a compute stream can wait for a
 * restore on the device (cudaStreamWaitEvent).  Valid until release. */
UMBP_API void *umbp_gpu_xfer_event(umbp_gpu_xfer_t *x);
/* Bytes the transfer moves and the method it used. */
UMBP_API uint64_t umbp_gpu_xfer_bytes(const umbp_gpu_xfer_t *x);
UMBP_API umbp_gpu_method_t umbp_gpu_xfer_method(const umbp_gpu_xfer_t *x);
/* Returns the handle to the engine; an unfinished transfer still runs to its
 * end and is recycled afterwards.  NULL is a no-op. */
UMBP_API void umbp_gpu_xfer_release(umbp_gpu_xfer_t *x);

#ifdef __cplusplus
}
#endif
#endif /* UMBP_GPU_H */
