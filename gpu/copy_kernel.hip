/* copy_kernel.hip - the copy kernel built for ROCm HIP (see copy_kernel.inc).
 * Only AMD's headers: HIP's NVIDIA platform headers do not build against
 * CUDA 13, and CUDA has its own build (copy_kernel.cu). */
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime.h>
#include <stdint.h>

#define GPU_STREAM_T hipStream_t
#define GPU_LAST_ERROR() ((int)hipGetLastError())
#define GPU_LAUNCH_NAME umbp_hip_launch_copy
#define GPU_SMID() ((unsigned)__smid())
/* A plain store: no streaming hint has been measured on AMD yet. */
#define GPU_STORE_CS(p, v) (*(p) = (v))

#include "copy_kernel.inc"
