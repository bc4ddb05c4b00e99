/*
 * gpu_backend.c - which device runtimes this build has, the per-thread error
 * message, and names for our error codes.
 *
 * The backends are chosen at build time (CMake defines UMBP_GPU_HAVE_CUDA and
 * UMBP_GPU_HAVE_HIP when it built them) and probed at run time: a build with
 * CUDA still runs, on the host backend, on a machine with no GPU or driver.
 * No state here but the thread-local message buffer.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#ifdef UMBP_GPU_HAVE_CUDA
extern const struct gpu_ops gpu_cuda_ops;
#endif
#ifdef UMBP_GPU_HAVE_HIP
extern const struct gpu_ops gpu_hip_ops;
#endif

static _Thread_local char last_error[256];

void gpu_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
}

const char *umbp_gpu_last_error(void) { return last_error; }

const struct gpu_ops *gpu_backend_ops(umbp_gpu_backend_t b)
{
    switch (b) {
    case UMBP_GPU_BACKEND_HOST: {
        /* a test knob: the host backend with a device thread that keeps
         * streams apart as a GPU does (gpu_host_async.c) */
        const char *a = getenv("UMBP_GPU_HOST_ASYNC");
        return a && strcmp(a, "1") == 0 ? &gpu_host_async_ops : &gpu_host_ops;
    }
#ifdef UMBP_GPU_HAVE_CUDA
    case UMBP_GPU_BACKEND_CUDA:
        return &gpu_cuda_ops;
#endif
#ifdef UMBP_GPU_HAVE_HIP
    case UMBP_GPU_BACKEND_HIP:
        return &gpu_hip_ops;
#endif
    default:
        return NULL;
    }
}

unsigned umbp_gpu_backends_built(void)
{
    unsigned m = 1u << UMBP_GPU_BACKEND_HOST;
#ifdef UMBP_GPU_HAVE_CUDA
    m |= 1u << UMBP_GPU_BACKEND_CUDA;
#endif
#ifdef UMBP_GPU_HAVE_HIP
    m |= 1u << UMBP_GPU_BACKEND_HIP;
#endif
    return m;
}

int umbp_gpu_backend_probe(umbp_gpu_backend_t b, int *num_devices)
{
    const struct gpu_ops *o = gpu_backend_ops(b);
    if (o == NULL) {
        gpu_set_error("%s backend: not built into this umbp (no %s toolchain at build time)",
                      umbp_gpu_backend_name(b), b == UMBP_GPU_BACKEND_HIP ? "hipcc" : "nvcc");
        return -ENOTSUP;
    }
    int n = 0;
    int rc = gpu_device_count(o, &n);
    if (rc < 0)
        return rc;
    if (num_devices != NULL)
        *num_devices = n;
    return 0;
}

const char *umbp_gpu_backend_name(umbp_gpu_backend_t b)
{
    switch (b) {
    case UMBP_GPU_BACKEND_AUTO:
        return "auto";
    case UMBP_GPU_BACKEND_HOST:
        return "host";
    case UMBP_GPU_BACKEND_CUDA:
        return "cuda";
    case UMBP_GPU_BACKEND_HIP:
        return "hip";
    }
    return "?";
}

/* The same words as umbp_strerror: both come from umbp.h's UMBP_ERRORS. */
const char *umbp_gpu_strerror(int err)
{
    switch (err) {
    case UMBP_OK:
        return "success";
#define X(name, value, text) case name: return text;
    UMBP_ERRORS(X)
#undef X
    default:
        break;
    }
    if (err < 0 && err > -4096)
        return strerror(-err);
    return "unknown error";
}
