/*
 * copy_args.h - what a copy kernel launch is told, shared by the C engine,
 * the CUDA and HIP kernels and the host backend's C loop.  Plain C, no
 * pointers to host-only types: the struct is passed by value to the kernel.
 *
 * A launch copies, for each of num_blocks blocks and each selected layer and
 * K/V half, one chunk between the GPU tensor and the block's object:
 *   gpu = layers[l].base + blocks[b].gpu_block * layers[l].block_stride
 *                        + kv * layers[l].kv_stride
 *   obj = blocks[b].obj  + layers[l].obj_off + kv * layers[l].chunk_bytes
 * with l in [first_layer, first_layer + num_layers) and kv in [0, nkv).
 * blocks[b].obj is a device-visible address: the mapped host object (zero-
 * copy) or a place in the staging buffer (it may point before the staging
 * slot when first_layer > 0; only offsets of selected layers are touched).
 */
#ifndef UMBP_GPU_COPY_ARGS_H
#define UMBP_GPU_COPY_ARGS_H

#include <stdint.h>

/* One layer of a registered layout, in bytes and device addresses. */
struct gpu_copy_layer {
    uint64_t base;         /* device address of block 0, K */
    uint64_t block_stride; /* bytes from block b to b + 1 */
    uint64_t kv_stride;    /* bytes from K to V (0 when nkv == 1) */
    uint64_t obj_off;      /* offset of this layer's K chunk in an object */
    uint64_t chunk_bytes;  /* bytes of one chunk (dense) */
};

/* One block of a transfer. */
struct gpu_copy_block {
    uint64_t gpu_block; /* index along the block dim */
    uint64_t obj;       /* device-visible address of the object's start */
};

/* Words of the SM bitmap a kernel may record into (2048 SMs/CUs). */
#define GPU_SM_MASK_WORDS 64

struct gpu_copy_args {
    const struct gpu_copy_layer *layers; /* device table, all layers */
    const struct gpu_copy_block *blocks; /* device table, num_blocks entries */
    uint32_t *sm_mask;                   /* NULL, or GPU_SM_MASK_WORDS words */
    uint32_t num_blocks;
    uint32_t first_layer;
    uint32_t num_layers;
    uint32_t nkv;    /* 1 or 2 */
    uint32_t to_gpu; /* 0: GPU -> objects (store); 1: objects -> GPU (restore) */
    uint32_t hints;  /* GPU_HINT_*: cache behaviour, never what is copied */
};

/* gpu_copy_args.hints.  DISCARD_OBJ says the objects are the engine's own
 * staging slot, read by no one else before the copy engine refills it: a
 * warp drops the L2 lines it read.  A discarded line reads back as any
 * value (PTX discard.global.L2), so it is set for nothing else; the host
 * backend poisons those bytes to make a wrong use visible in the tests.
 * EVICT_FIRST_GPU: streaming stores (st.global.cs) for the GPU side. */
#define GPU_HINT_DISCARD_OBJ 1u
#define GPU_HINT_EVICT_FIRST_GPU 2u

#endif /* UMBP_GPU_COPY_ARGS_H */
