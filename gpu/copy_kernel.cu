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

#include "copy_kernel.inc"
