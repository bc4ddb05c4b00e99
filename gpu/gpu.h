/*
 * gpu.h (private) - the portability layer under the copy engine: one ops
 * table per device runtime (CUDA, HIP, host-only), each a file-scope
 * `static const struct gpu_ops` in gpu_cuda.c, gpu_hip.c, gpu_host.c.
 *
 * Only the calls the engine, its tests and its benchmark need, with our own
 * types: streams and events are opaque pointers (cudaStream_t, hipStream_t,
 * ... are pointers in both runtimes).  Every member returns 0 or a negative
 * errno value (-ENODEV no device/driver, -ENOMEM, -EINVAL, -EIO for anything
 * else) and, on failure, leaves a message for umbp_gpu_last_error() naming
 * the call and the runtime's own error string.
 *
 * Device calls act on the calling thread's current device: callers bracket
 * them with gpu_device_enter() / gpu_device_leave().  Callers go through the
 * static inline wrappers below, never through ops->fn directly; a member a
 * runtime lacks (memcpy_batch_async) has a default here.
 */
#ifndef UMBP_GPU_PRIVATE_H
#define UMBP_GPU_PRIVATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "copy_args.h"
#include "umbp/gpu.h"

typedef void *gpu_stream_t;
typedef void *gpu_event_t;

struct gpu_ops {
    const char *name;
    umbp_gpu_backend_t kind;
    /* Every operation is done when its call returns (the host backend,
     * gpu_host.c): streams order nothing and every event is complete, so
     * the engine skips them.  false for a device, and for gpu_host_async.c,
     * which keeps streams apart as a device does. */
    bool synchronous;

    int (*device_count)(int *n); /* -ENODEV (with the reason) if none */
    int (*device_enter)(int dev, int *prev);
    void (*device_leave)(int dev, int prev);
    int (*num_sms)(int dev, int *n);
    int (*device_name)(int dev, char *buf, size_t len);

    int (*dev_alloc)(size_t n, void **p);
    void (*dev_free)(void *p);
    int (*host_alloc)(size_t n, void **p); /* pinned, mapped, portable */
    void (*host_free)(void *p);
    int (*host_register)(void *p, size_t n); /* mapped, portable */
    int (*host_unregister)(void *p);
    int (*host_dev_ptr)(void *p, void **dptr); /* registered or host_alloc memory */

    int (*stream_create)(gpu_stream_t *s); /* non-blocking, low priority */
    void (*stream_destroy)(gpu_stream_t s);
    int (*stream_sync)(gpu_stream_t s);
    int (*event_create)(gpu_event_t *e); /* no timing */
    int (*event_create_timed)(gpu_event_t *e);
    void (*event_destroy)(gpu_event_t e);
    int (*event_record)(gpu_event_t e, gpu_stream_t s);
    int (*event_query)(gpu_event_t e); /* 0, UMBP_E_INPROGRESS, or error */
    int (*event_sync)(gpu_event_t e);
    int (*event_elapsed_ms)(float *ms, gpu_event_t start, gpu_event_t end);
    int (*stream_wait_event)(gpu_stream_t s, gpu_event_t e);

    /* Any direction (unified addressing); host memory must be registered. */
    int (*memcpy_async)(void *dst, const void *src, size_t n, gpu_stream_t s);
    /* Optional: many copies in one call.  NULL: the wrapper loops. */
    int (*memcpy_batch_async)(void *const *dst, const void *const *src, const size_t *n,
                              size_t count, gpu_stream_t s);
    /* Complete (visible to every stream) when they return. */
    int (*memcpy_sync)(void *dst, const void *src, size_t n);
    int (*memset_sync)(void *dst, int v, size_t n);

    /* The gather/scatter kernel (copy_args.h), vec in {4, 8, 16}. */
    int (*launch_copy)(const struct gpu_copy_args *a, unsigned ctas, unsigned threads,
                       unsigned vec, gpu_stream_t s);
};

/* The ops of a backend, or NULL if it was not built. */
const struct gpu_ops *gpu_backend_ops(umbp_gpu_backend_t b);

/* Records the message umbp_gpu_last_error() returns on this thread. */
void gpu_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The host backends (gpu_host.c; gpu_host_async.c, its device thread and
 * stream queues, chosen with UMBP_GPU_HOST_ASYNC=1) and what they share. */
extern const struct gpu_ops gpu_host_ops, gpu_host_async_ops;
int gpu_host_memcpy_sync(void *dst, const void *src, size_t n);
int gpu_host_memset_sync(void *dst, int v, size_t n);
/* Tests: while held, gpu_host_async.c's device thread runs nothing queued,
 * so that work submitted meanwhile finds the earlier work still in progress
 * (a hold longer than 10 s without new work is let go, with a message, so
 * that a test waiting for the device fails instead of hanging). */
void gpu_host_async_hold(bool on);

/* The host backend's copy "kernel": the same chunk walk as copy_kernel.inc,
 * with memcpy (copy_host.c).  Also the reference the tests trust least. */
void gpu_copy_run_host(const struct gpu_copy_args *a);

/* Every hint a host-backend kernel was given since the tests last cleared
 * it (OR'ed): how a test sees the hints the host cannot act on
 * (GPU_HINT_EVICT_FIRST_GPU, a device's streaming store). */
extern _Atomic uint32_t gpu_host_hints_seen;

/* ---- wrappers --------------------------------------------------------- */

static inline int gpu_device_count(const struct gpu_ops *o, int *n) { return o->device_count(n); }
static inline int gpu_device_enter(const struct gpu_ops *o, int dev, int *prev)
{
    return o->device_enter(dev, prev);
}
static inline void gpu_device_leave(const struct gpu_ops *o, int dev, int prev)
{
    o->device_leave(dev, prev);
}
static inline int gpu_num_sms(const struct gpu_ops *o, int dev, int *n) { return o->num_sms(dev, n); }
static inline int gpu_device_name(const struct gpu_ops *o, int dev, char *buf, size_t len)
{
    return o->device_name(dev, buf, len);
}
static inline int gpu_dev_alloc(const struct gpu_ops *o, size_t n, void **p) { return o->dev_alloc(n, p); }
static inline void gpu_dev_free(const struct gpu_ops *o, void *p) { o->dev_free(p); }
static inline int gpu_host_alloc(const struct gpu_ops *o, size_t n, void **p) { return o->host_alloc(n, p); }
static inline void gpu_host_free(const struct gpu_ops *o, void *p) { o->host_free(p); }
static inline int gpu_host_register(const struct gpu_ops *o, void *p, size_t n)
{
    return o->host_register(p, n);
}
static inline int gpu_host_unregister(const struct gpu_ops *o, void *p) { return o->host_unregister(p); }
static inline int gpu_host_dev_ptr(const struct gpu_ops *o, void *p, void **d)
{
    return o->host_dev_ptr(p, d);
}
static inline int gpu_stream_create(const struct gpu_ops *o, gpu_stream_t *s) { return o->stream_create(s); }
static inline void gpu_stream_destroy(const struct gpu_ops *o, gpu_stream_t s) { o->stream_destroy(s); }
static inline int gpu_stream_sync(const struct gpu_ops *o, gpu_stream_t s) { return o->stream_sync(s); }
static inline int gpu_event_create(const struct gpu_ops *o, gpu_event_t *e) { return o->event_create(e); }
static inline int gpu_event_create_timed(const struct gpu_ops *o, gpu_event_t *e)
{
    return o->event_create_timed(e);
}
static inline void gpu_event_destroy(const struct gpu_ops *o, gpu_event_t e) { o->event_destroy(e); }
static inline int gpu_event_record(const struct gpu_ops *o, gpu_event_t e, gpu_stream_t s)
{
    return o->event_record(e, s);
}
static inline int gpu_event_query(const struct gpu_ops *o, gpu_event_t e) { return o->event_query(e); }
static inline int gpu_event_sync(const struct gpu_ops *o, gpu_event_t e) { return o->event_sync(e); }
static inline int gpu_event_elapsed_ms(const struct gpu_ops *o, float *ms, gpu_event_t a, gpu_event_t b)
{
    return o->event_elapsed_ms(ms, a, b);
}
static inline int gpu_stream_wait_event(const struct gpu_ops *o, gpu_stream_t s, gpu_event_t e)
{
    return o->stream_wait_event(s, e);
}
static inline int gpu_memcpy_async(const struct gpu_ops *o, void *dst, const void *src, size_t n,
                                   gpu_stream_t s)
{
    return o->memcpy_async(dst, src, n, s);
}
static inline int gpu_memcpy_batch_async(const struct gpu_ops *o, void *const *dst,
                                         const void *const *src, const size_t *n, size_t count,
                                         gpu_stream_t s)
{
    if (o->memcpy_batch_async != NULL && count > 1)
        return o->memcpy_batch_async(dst, src, n, count, s);
    for (size_t i = 0; i < count; i++) {
        int rc = o->memcpy_async(dst[i], src[i], n[i], s);
        if (rc < 0)
            return rc;
    }
    return 0;
}
static inline int gpu_memcpy_sync(const struct gpu_ops *o, void *dst, const void *src, size_t n)
{
    return o->memcpy_sync(dst, src, n);
}
static inline int gpu_memset_sync(const struct gpu_ops *o, void *dst, int v, size_t n)
{
    return o->memset_sync(dst, v, n);
}
static inline int gpu_launch_copy(const struct gpu_ops *o, const struct gpu_copy_args *a,
                                  unsigned ctas, unsigned threads, unsigned vec, gpu_stream_t s)
{
    return o->launch_copy(a, ctas, threads, vec, s);
}

#endif /* UMBP_GPU_PRIVATE_H */
