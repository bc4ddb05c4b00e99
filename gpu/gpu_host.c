/*
 * gpu_host.c - the host-only backend: "device memory" is host memory, every
 * copy happens on the calling thread before the call returns, so streams
 * have nothing to order and every event is complete once recorded.
 *
 * It exists so that the engine, its layouts and its offset arithmetic build
 * and run (and are tested in CI) with no GPU toolchain or device, and so that
 * a CPU-only engine can use the same code path.  No state beyond what the
 * handles point to.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"

struct host_event {
    struct timespec t; /* when it was last recorded */
};

static int host_device_count(int *n)
{
    *n = 1;
    return 0;
}
static int host_device_enter(int dev, int *prev)
{
    if (dev != 0) {
        gpu_set_error("host backend: device %d does not exist; it has device 0 only", dev);
        return -ENODEV;
    }
    *prev = 0;
    return 0;
}
static void host_device_leave(int dev, int prev) { (void)dev, (void)prev; }
static int host_num_sms(int dev, int *n)
{
    (void)dev;
    *n = 1;
    return 0;
}

static int host_device_name(int dev, char *buf, size_t len)
{
    (void)dev;
    snprintf(buf, len, "host (no GPU)");
    return 0;
}

static int host_alloc_aligned(size_t n, void **p)
{
    /* 4 KiB alignment, like a device allocation, so 16-byte paths apply. */
    void *q = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    if (q == NULL) {
        gpu_set_error("host backend: cannot allocate %zu bytes", n);
        return -ENOMEM;
    }
    *p = q;
    return 0;
}
static void host_free_any(void *p) { free(p); }
/* Pinning is slow on a GPU (every page: seconds for hundreds of GiB) and can
 * fail (pinned memory short); tests that need it slow here set
 * UMBP_GPU_HOST_PIN_MS (each registration takes that long), and
 * UMBP_GPU_HOST_PIN_FAIL for it to fail. */
static int host_register(void *p, size_t n)
{
    (void)p, (void)n;
    const char *e = getenv("UMBP_GPU_HOST_PIN_MS");
    long ms = e ? strtol(e, NULL, 10) : 0;
    if (ms > 0)
        usleep((useconds_t)(ms > 60000 ? 60000 : ms) * 1000);
    if (getenv("UMBP_GPU_HOST_PIN_FAIL")) { /* and tests that need it to fail */
        gpu_set_error("host backend: pinning refused (UMBP_GPU_HOST_PIN_FAIL)");
        return -ENOMEM;
    }
    return 0;
}
static int host_unregister(void *p) { (void)p; return 0; }
static int host_dev_ptr(void *p, void **d)
{
    *d = p;
    return 0;
}

/* A stream is a dummy handle: work runs inline. */
static char host_stream_tag;
static int host_stream_create(gpu_stream_t *s)
{
    *s = &host_stream_tag;
    return 0;
}
static void host_stream_destroy(gpu_stream_t s) { (void)s; }
static int host_stream_sync(gpu_stream_t s) { (void)s; return 0; }

static int host_event_create(gpu_event_t *e)
{
    struct host_event *ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        return -ENOMEM;
    *e = ev;
    return 0;
}
static void host_event_destroy(gpu_event_t e) { free(e); }
static int host_event_record(gpu_event_t e, gpu_stream_t s)
{
    (void)s;
    clock_gettime(CLOCK_MONOTONIC, &((struct host_event *)e)->t);
    return 0;
}
static int host_event_query(gpu_event_t e) { (void)e; return 0; }
static int host_event_sync(gpu_event_t e) { (void)e; return 0; }
static int host_event_elapsed_ms(float *ms, gpu_event_t a, gpu_event_t b)
{
    const struct host_event *x = a, *y = b;
    *ms = (float)((double)(y->t.tv_sec - x->t.tv_sec) * 1e3 +
                  (double)(y->t.tv_nsec - x->t.tv_nsec) / 1e6);
    return 0;
}
static int host_stream_wait_event(gpu_stream_t s, gpu_event_t e) { (void)s, (void)e; return 0; }

static int host_memcpy_async(void *dst, const void *src, size_t n, gpu_stream_t s)
{
    (void)s;
    memcpy(dst, src, n);
    return 0;
}
int gpu_host_memcpy_sync(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
    return 0;
}
int gpu_host_memset_sync(void *dst, int v, size_t n)
{
    memset(dst, v, n);
    return 0;
}
static int host_launch_copy(const struct gpu_copy_args *a, unsigned ctas, unsigned threads,
                            unsigned vec, gpu_stream_t s)
{
    (void)ctas, (void)threads, (void)vec, (void)s;
    gpu_copy_run_host(a);
    return 0;
}

const struct gpu_ops gpu_host_ops = {
    .name = "host",
    .kind = UMBP_GPU_BACKEND_HOST,
    .synchronous = true,
    .device_count = host_device_count,
    .device_enter = host_device_enter,
    .device_leave = host_device_leave,
    .num_sms = host_num_sms,
    .device_name = host_device_name,
    .dev_alloc = host_alloc_aligned,
    .dev_free = host_free_any,
    .host_alloc = host_alloc_aligned,
    .host_free = host_free_any,
    .host_register = host_register,
    .host_unregister = host_unregister,
    .host_dev_ptr = host_dev_ptr,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_sync = host_stream_sync,
    .event_create = host_event_create,
    .event_create_timed = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_query = host_event_query,
    .event_sync = host_event_sync,
    .event_elapsed_ms = host_event_elapsed_ms,
    .stream_wait_event = host_stream_wait_event,
    .memcpy_async = host_memcpy_async,
    .memcpy_batch_async = NULL,
    .memcpy_sync = gpu_host_memcpy_sync,
    .memset_sync = gpu_host_memset_sync,
    .launch_copy = host_launch_copy,
};
