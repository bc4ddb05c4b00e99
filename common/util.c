/*
 * util.c - the services every part of umbp uses (the runtime, tiers,
 * umbp-server, the umbp tool): logging, time, key hashing, error strings.
 * Stateless apart from the process-wide log level and the per-thread last
 * error message; safe on any thread.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <xxhash.h>

#include "util.h"

static _Atomic int log_level = UMBP_LOG_WARN;
static _Thread_local char last_error[512];

void umbp_log_set_level(enum umbp_log_level l) { atomic_store(&log_level, (int)l); }

int umbp_log_level_parse(const char *s, enum umbp_log_level *out)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (enum umbp_log_level)i;
            return 0;
        }
    return -EINVAL;
}

void umbp_log(enum umbp_log_level lvl, const char *fmt, ...)
{
    static const char *const tags[] = {"error", "warn", "info", "debug"};
    if ((int)lvl > atomic_load_explicit(&log_level, memory_order_relaxed))
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "umbp %s: %s\n", tags[lvl], line);
}

void umbp_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    umbp_log(UMBP_LOG_ERROR, "%s", last_error);
}

void umbp_set_answer(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
}

const char *umbp_last_error(void) { return last_error; }

void umbp_touch_pages(void *p, size_t len)
{
    /* the first byte of the range, then the start of each later page: every
     * page the range overlaps, however it is aligned */
    uintptr_t a = (uintptr_t)p, end = a + len;

    for (; a < end; a = (a | 4095u) + 1)
        *(volatile char *)a = 0;
}

uint64_t umbp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t umbp_key_hash(const umbp_key_t *key) { return XXH3_64bits(key->bytes, UMBP_KEY_SIZE); }

const char *umbp_strerror(int err)
{
    switch (err) {
    case UMBP_OK: return "success";
#define X(name, value, text) case name: return text;
    UMBP_ERRORS(X)
#undef X
    case -ENOSPC: return "no space in the pool within put_wait_ms";
    case -ENOENT: return "no such object";
    case -EAGAIN: return "too many operations in flight; retry later";
    case -EFBIG: return "object larger than the pool";
    default: break;
    }
    if (err < 0 && err > -4096) {
        static _Thread_local char buf[128];
        /* strerror_r (GNU) returns a pointer that may not be buf */
        const char *s = strerror_r(-err, buf, sizeof(buf));
        return s;
    }
    return "unknown umbp error";
}


int umbp_accept_batch(int listen_fd, int batch, void (*one)(void *ctx, int fd), void *ctx)
{
    for (int i = 0; i < batch; i++) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            one(ctx, fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
            return -errno;
        return 0; /* EAGAIN: drained */
    }
    return 0;
}
