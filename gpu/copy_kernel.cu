/* copy_kernel.cu - the copy kernel built for CUDA (see copy_kernel.inc). */
#include <cuda_runtime.h>
#include <stdint.h>

#define GPU_STREAM_T cudaStream_t
#define GPU_LAST_ERROR() ((int)cudaGetLastError())
#define GPU_LAUNCH_NAME umbp_cuda_launch_copy

static __device__ __forceinline__ unsigned umbp_smid(void)
{
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
#define GPU_SMID() umbp_smid()
#define GPU_STORE_CS(p, v) __stcs((p), (v))

/* The staging slot's lines, once read, are dropped from L2 without being
 * written back to HBM (PTX ISA 7.4, sm_80+; older targets keep them). */
static __device__ __forceinline__ void umbp_discard_l2(uintptr_t p)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(p) : "memory");
#else
    (void)p;
#endif
}
#define GPU_DISCARD_L2(p) umbp_discard_l2(p)

#include "copy_kernel.inc"
