/*
 * gpu_cuda.c - the CUDA runtime backend: gpu_runtime.inc over the CUDA C API
 * (cudart, linked statically, so a binary starts on a machine without a
 * driver and cudaGetDeviceCount reports it).
 */
#include <cuda_runtime_api.h>

#define RT(x) cuda##x
#define RT_NAME "cuda"
#define RT_KIND UMBP_GPU_BACKEND_CUDA
#define RT_OPS gpu_cuda_ops
#define RT_HOST_ALLOC(p, n) cudaHostAlloc((p), (n), cudaHostAllocMapped | cudaHostAllocPortable)
#define RT_HOST_FREE(p) cudaFreeHost(p)
#define RT_ATTR_SMS cudaDevAttrMultiProcessorCount
#define RT_ERR_OOM cudaErrorMemoryAllocation
#define RT_LAUNCH umbp_cuda_launch_copy
#define RT_PROP_T struct cudaDeviceProp
#if CUDART_VERSION >= 12080
#define RT_HAVE_BATCH 1
#endif

#include "gpu_runtime.inc"
