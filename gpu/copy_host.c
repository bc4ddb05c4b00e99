/*
 * copy_host.c - the copy kernel of the host backend: the chunk walk of
 * copy_kernel.inc done with memcpy on the calling thread.  Keeping the walk
 * identical means the CI tests (no GPU) check the same offset arithmetic the
 * device kernels run.
 */
#include <stdatomic.h>
#include <string.h>

#include "gpu.h"

/* What a device's discard.global.L2 allows: the lines wholly inside the
 * chunk read back as anything.  Poisoned here, so that a discard hint on
 * bytes someone still reads (a pool's object, a slot not yet scattered)
 * corrupts what the tests compare. */
static void discard_lines(char *o, uint64_t n)
{
    uintptr_t lo = ((uintptr_t)o + 127u) & ~(uintptr_t)127u;
    uintptr_t hi = ((uintptr_t)o + n) & ~(uintptr_t)127u;
    if (hi > lo)
        memset((void *)lo, 0xD5, hi - lo);
}

_Atomic uint32_t gpu_host_hints_seen;

void gpu_copy_run_host(const struct gpu_copy_args *a)
{
    atomic_fetch_or(&gpu_host_hints_seen, a->hints);
    for (uint32_t b = 0; b < a->num_blocks; b++) {
        const struct gpu_copy_block *B = &a->blocks[b];
        for (uint32_t l = a->first_layer; l < a->first_layer + a->num_layers; l++) {
            const struct gpu_copy_layer *L = &a->layers[l];
            for (uint32_t kv = 0; kv < a->nkv; kv++) {
                char *g = (char *)(uintptr_t)(L->base + B->gpu_block * L->block_stride +
                                              kv * L->kv_stride);
                char *o = (char *)(uintptr_t)(B->obj + L->obj_off + kv * L->chunk_bytes);
                if (a->to_gpu)
                    memcpy(g, o, L->chunk_bytes);
                else
                    memcpy(o, g, L->chunk_bytes);
                if (a->hints & GPU_HINT_DISCARD_OBJ)
                    discard_lines(o, L->chunk_bytes);
            }
        }
    }
    if (a->sm_mask != NULL)
        a->sm_mask[0] |= 1u;
}
