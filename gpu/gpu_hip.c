/*
 * gpu_hip.c - the ROCm HIP runtime backend: gpu_runtime.inc over the HIP C
 * API, AMD platform only (HIP's NVIDIA headers do not build against CUDA 13;
 * CUDA has gpu_cuda.c).
 */
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>

#define RT(x) hip##x
#define RT_NAME "hip"
#define RT_KIND UMBP_GPU_BACKEND_HIP
#define RT_OPS gpu_hip_ops
#define RT_HOST_ALLOC(p, n) hipHostMalloc((p), (n), hipHostMallocMapped | hipHostMallocPortable)
#define RT_HOST_FREE(p) hipHostFree(p)
#define RT_ATTR_SMS hipDeviceAttributeMultiprocessorCount
#define RT_ERR_OOM hipErrorOutOfMemory
#define RT_LAUNCH umbp_hip_launch_copy
#define RT_PROP_T hipDeviceProp_t

#include "gpu_runtime.inc"
