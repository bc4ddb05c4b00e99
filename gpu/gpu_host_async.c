/*
 * gpu_host_async.c - the host backend with a device of its own: the
 * ordering a GPU gives, and no more.  Selected instead of gpu_host.c's
 * synchronous ops when UMBP_GPU_HOST_ASYNC=1 is set (a test knob:
 * gpu_backend.c).
 *
 * The synchronous host backend runs every copy on the calling thread before
 * the call returns, so a missing stream_wait_event, an event recorded on the
 * wrong stream or a block table rewritten while a kernel may still read it
 * cannot show in CI: all of those are bugs only a real device runs into.
 * Here every queued operation (copy, kernel, event record, stream wait) goes
 * on its stream's FIFO, and one "device" thread runs them: at each step it
 * takes the head of a stream chosen at random among those whose head may
 * run (a wait whose event has not completed may not), after a random pause
 * now and then, so that work of different streams interleaves in orders a
 * GPU could choose and the host's own threads race ahead of it.  Kernel
 * arguments are copied at launch (as a launch copies its parameters); the
 * tables and bytes they point to, and a copy's source, are read when the
 * operation runs, as a device reads them.
 *
 * CUDA's semantics kept: an event's query and sync, and a stream's wait on
 * it, refer to its latest record at the time of the call (an event never
 * recorded is complete), that record and no later one (records on two
 * streams may run out of order); freeing or unregistering memory, and destroying
 * an event or a stream, wait until the device is idle (cudaFree and
 * cudaFreeHost synchronize the device).  Synchronous copies and memsets run
 * at once (the engine's streams are non-blocking: nothing orders them).
 *
 * Threads: any; one mutex guards every queue and event, the device thread
 * runs an operation's bytes without it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"

enum ha_kind { HA_COPY, HA_KERNEL, HA_RECORD, HA_WAIT };

/* An event's records are numbered 1, 2, ... as they are queued.  Records on
 * different streams may run out of that order: `done` is the last of the
 * records that all ran, `later` the ones after it that ran already
 * (ascending), so a wait for record g is satisfied by g itself, never by a
 * later record that ran first. */
struct ha_done {
    uint64_t gen;
    struct ha_done *next;
};

struct ha_event {
    uint64_t recorded;     /* records queued */
    uint64_t done;         /* records 1..done have all run */
    struct ha_done *later; /* records after done+1 that ran */
    struct timespec t;     /* when the last one ran */
};

struct ha_item {
    enum ha_kind kind;
    struct ha_item *next;
    void *dst;
    const void *src;
    size_t n;
    struct gpu_copy_args args; /* HA_KERNEL: as launched */
    struct ha_event *ev;       /* HA_RECORD, HA_WAIT */
    uint64_t gen;
};

struct ha_stream {
    struct ha_item *head, *tail;
    bool running;              /* its head was taken and runs now */
    struct ha_stream *next;    /* every stream */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;     /* something to run */
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER; /* something ran */
static struct ha_stream *streams;
static pthread_once_t started = PTHREAD_ONCE_INIT;
static unsigned seed;
static bool held; /* gpu_host_async_hold */

void gpu_host_async_hold(bool on)
{
    pthread_mutex_lock(&mu);
    held = on;
    pthread_cond_broadcast(&work);
    pthread_mutex_unlock(&mu);
}

/* Under mu: whether record gen of ev ran (0: never recorded, complete). */
static bool reached(const struct ha_event *ev, uint64_t gen)
{
    if (gen <= ev->done)
        return true;
    for (const struct ha_done *d = ev->later; d && d->gen <= gen; d = d->next)
        if (d->gen == gen)
            return true;
    return false;
}

/* Under mu: record gen of ev ran. */
static void record_ran(struct ha_event *ev, uint64_t gen)
{
    clock_gettime(CLOCK_MONOTONIC, &ev->t);
    if (gen == ev->done + 1) {
        ev->done = gen;
        while (ev->later && ev->later->gen == ev->done + 1) {
            struct ha_done *d = ev->later;
            ev->later = d->next;
            ev->done = d->gen;
            free(d);
        }
        return;
    }
    struct ha_done *d = malloc(sizeof(*d)), **p = &ev->later;
    if (!d) {
        fprintf(stderr, "gpu host-async backend: no memory to note an event record\n");
        abort();
    }
    while (*p && (*p)->gen < gen)
        p = &(*p)->next;
    d->gen = gen;
    d->next = *p;
    *p = d;
}

static bool runnable(const struct ha_stream *s)
{
    if (!s->head || s->running)
        return false;
    return s->head->kind != HA_WAIT || reached(s->head->ev, s->head->gen);
}

static void run(struct ha_item *it)
{
    switch (it->kind) {
    case HA_COPY:
        memcpy(it->dst, it->src, it->n);
        break;
    case HA_KERNEL:
        gpu_copy_run_host(&it->args);
        break;
    case HA_RECORD:
    case HA_WAIT:
        break;
    }
}

static void *device_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        if (held) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 10;
            if (pthread_cond_timedwait(&work, &mu, &until) == ETIMEDOUT && held) {
                fprintf(stderr, "gpu host-async backend: held 10 s with nothing new, "
                                "running again\n");
                held = false;
            }
            continue;
        }
        size_t n = 0;
        for (struct ha_stream *s = streams; s; s = s->next)
            n += runnable(s);
        if (!n) {
            pthread_cond_wait(&work, &mu);
            continue;
        }
        size_t k = (size_t)rand_r(&seed) % n;
        struct ha_stream *s = streams;
        for (;; s = s->next)
            if (runnable(s) && k-- == 0)
                break;
        struct ha_item *it = s->head;
        s->running = true;
        unsigned r = (unsigned)rand_r(&seed);
        pthread_mutex_unlock(&mu);
        if (r % 8 == 0) /* now and then late: the host's threads run ahead */
            usleep(r % 200);
        run(it);
        pthread_mutex_lock(&mu);
        if (it->kind == HA_RECORD)
            record_ran(it->ev, it->gen);
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        s->running = false;
        free(it);
        pthread_cond_broadcast(&progress);
    }
    return NULL;
}

static void start(void)
{
    const char *e = getenv("UMBP_GPU_HOST_ASYNC_SEED");
    seed = e ? (unsigned)strtoul(e, NULL, 0) : (unsigned)time(NULL) ^ (unsigned)getpid();
    fprintf(stderr, "gpu host-async backend: seed %u (UMBP_GPU_HOST_ASYNC_SEED)\n", seed);
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, device_thread, NULL) != 0) {
        fprintf(stderr, "gpu host-async backend: cannot start its device thread\n");
        abort();
    }
    pthread_attr_destroy(&a);
}

/* Under mu: until no stream holds work. */
static void idle_locked(void)
{
    for (;;) {
        bool busy = false;
        for (struct ha_stream *s = streams; s && !busy; s = s->next)
            busy = s->head != NULL;
        if (!busy)
            return;
        pthread_cond_wait(&progress, &mu);
    }
}

static void device_idle(void)
{
    pthread_mutex_lock(&mu);
    idle_locked();
    pthread_mutex_unlock(&mu);
}

static int push(gpu_stream_t st, struct ha_item *it)
{
    struct ha_stream *s = st;
    pthread_mutex_lock(&mu);
    if (it->kind == HA_RECORD)
        it->gen = ++it->ev->recorded;
    else if (it->kind == HA_WAIT)
        it->gen = it->ev->recorded; /* its latest record now (0: none, complete) */
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    pthread_cond_signal(&work);
    pthread_mutex_unlock(&mu);
    return 0;
}

static struct ha_item *item(enum ha_kind kind)
{
    struct ha_item *it = calloc(1, sizeof(*it));
    if (it)
        it->kind = kind;
    else
        gpu_set_error("host-async backend: no memory for an operation");
    return it;
}

/* ---- the ops ---------------------------------------------------------------------- */

static int ha_device_count(int *n) { return gpu_host_ops.device_count(n); }
static int ha_device_enter(int dev, int *prev) { return gpu_host_ops.device_enter(dev, prev); }
static void ha_device_leave(int dev, int prev) { gpu_host_ops.device_leave(dev, prev); }
static int ha_num_sms(int dev, int *n) { return gpu_host_ops.num_sms(dev, n); }
static int ha_device_name(int dev, char *buf, size_t len)
{
    snprintf(buf, len, "host (no GPU, asynchronous)");
    (void)dev;
    return 0;
}
static int ha_alloc(size_t n, void **p) { return gpu_host_ops.dev_alloc(n, p); }
static void ha_free(void *p)
{
    device_idle(); /* cudaFree / cudaFreeHost synchronize the device */
    gpu_host_ops.dev_free(p);
}
static int ha_register(void *p, size_t n) { return gpu_host_ops.host_register(p, n); }
static int ha_unregister(void *p)
{
    device_idle();
    return gpu_host_ops.host_unregister(p);
}
static int ha_dev_ptr(void *p, void **d) { return gpu_host_ops.host_dev_ptr(p, d); }

static int ha_stream_create(gpu_stream_t *out)
{
    pthread_once(&started, start);
    struct ha_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    pthread_mutex_lock(&mu);
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&mu);
    *out = s;
    return 0;
}

static void ha_stream_destroy(gpu_stream_t st)
{
    pthread_mutex_lock(&mu);
    idle_locked();
    for (struct ha_stream **p = &streams; *p; p = &(*p)->next)
        if (*p == st) {
            *p = ((struct ha_stream *)st)->next;
            break;
        }
    pthread_mutex_unlock(&mu);
    free(st);
}

static int ha_stream_sync(gpu_stream_t st)
{
    struct ha_stream *s = st;
    pthread_mutex_lock(&mu);
    while (s->head)
        pthread_cond_wait(&progress, &mu);
    pthread_mutex_unlock(&mu);
    return 0;
}

static int ha_event_create(gpu_event_t *e)
{
    struct ha_event *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return -ENOMEM;
    *e = ev;
    return 0;
}

static void ha_event_destroy(gpu_event_t e)
{
    device_idle(); /* no queued record or wait may still name it: every record ran */
    free(e);        /* so `later` is empty */
}

/* A record of e on s, or a wait of s for e's latest record. */
static int push_event(enum ha_kind kind, gpu_event_t e, gpu_stream_t s)
{
    struct ha_item *it = item(kind);
    if (!it)
        return -ENOMEM;
    it->ev = e;
    return push(s, it);
}

static int ha_event_record(gpu_event_t e, gpu_stream_t s) { return push_event(HA_RECORD, e, s); }

static int ha_event_query(gpu_event_t e)
{
    struct ha_event *ev = e;
    pthread_mutex_lock(&mu);
    int rc = reached(ev, ev->recorded) ? 0 : UMBP_E_INPROGRESS;
    pthread_mutex_unlock(&mu);
    return rc;
}

static int ha_event_sync(gpu_event_t e)
{
    struct ha_event *ev = e;
    pthread_mutex_lock(&mu);
    uint64_t want = ev->recorded;
    while (!reached(ev, want))
        pthread_cond_wait(&progress, &mu);
    pthread_mutex_unlock(&mu);
    return 0;
}

static int ha_event_elapsed_ms(float *ms, gpu_event_t a, gpu_event_t b)
{
    const struct ha_event *x = a, *y = b;
    pthread_mutex_lock(&mu);
    *ms = (float)((double)(y->t.tv_sec - x->t.tv_sec) * 1e3 +
                  (double)(y->t.tv_nsec - x->t.tv_nsec) / 1e6);
    pthread_mutex_unlock(&mu);
    return 0;
}

static int ha_stream_wait_event(gpu_stream_t s, gpu_event_t e)
{
    return push_event(HA_WAIT, e, s);
}

static int ha_memcpy_async(void *dst, const void *src, size_t n, gpu_stream_t s)
{
    struct ha_item *it = item(HA_COPY);
    if (!it)
        return -ENOMEM;
    it->dst = dst;
    it->src = src;
    it->n = n;
    return push(s, it);
}

static int ha_launch_copy(const struct gpu_copy_args *a, unsigned ctas, unsigned threads,
                          unsigned vec, gpu_stream_t s)
{
    (void)ctas, (void)threads, (void)vec;
    struct ha_item *it = item(HA_KERNEL);
    if (!it)
        return -ENOMEM;
    it->args = *a;
    return push(s, it);
}

const struct gpu_ops gpu_host_async_ops = {
    .name = "host",
    .kind = UMBP_GPU_BACKEND_HOST,
    .synchronous = false, /* the point of it: AUTO stages, events are real */
    .device_count = ha_device_count,
    .device_enter = ha_device_enter,
    .device_leave = ha_device_leave,
    .num_sms = ha_num_sms,
    .device_name = ha_device_name,
    .dev_alloc = ha_alloc,
    .dev_free = ha_free,
    .host_alloc = ha_alloc,
    .host_free = ha_free,
    .host_register = ha_register,
    .host_unregister = ha_unregister,
    .host_dev_ptr = ha_dev_ptr,
    .stream_create = ha_stream_create,
    .stream_destroy = ha_stream_destroy,
    .stream_sync = ha_stream_sync,
    .event_create = ha_event_create,
    .event_create_timed = ha_event_create,
    .event_destroy = ha_event_destroy,
    .event_record = ha_event_record,
    .event_query = ha_event_query,
    .event_sync = ha_event_sync,
    .event_elapsed_ms = ha_event_elapsed_ms,
    .stream_wait_event = ha_stream_wait_event,
    .memcpy_async = ha_memcpy_async,
    .memcpy_batch_async = NULL,
    .memcpy_sync = gpu_host_memcpy_sync,
    .memset_sync = gpu_host_memset_sync,
    .launch_copy = ha_launch_copy,
};
