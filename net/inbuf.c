/*
 * inbuf.c - the buffers of a frame stream: the two shapes every reader of
 * frames keeps its input in, and the non-blocking send that drains an
 * output buffer.  Declared in inbuf.h.
 *
 * Threads: no state but the caller's; any thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "inbuf.h"
#include "umbp/tier.h" /* umbp_touch_pages */

int proto_out_send(int sock, const struct proto_buf *b, size_t *off)
{
    while (*off < b->len) {
        ssize_t n = send(sock, b->data + *off, b->len - *off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            *off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return n < 0 ? -errno : -EPIPE;
    }
    return 0;
}

void proto_out_warm(struct proto_buf *b, size_t bytes)
{
    if (proto_buf_reserve(b, bytes) == 0)
        umbp_touch_pages(b->data + b->len, b->cap - b->len);
}

int proto_in_room(uint8_t **buf, size_t len, size_t *cap, size_t initial)
{
    const size_t max = (size_t)PROTO_HDR_SIZE + PROTO_MAX_BODY;
    size_t want = *cap;
    if (len == 0 && want > initial)
        want = initial;
    else if (len == want)
        want = want * 2 > max ? max : want * 2;
    if (want == *cap)
        return len < want ? 0 : -ENOBUFS;
    uint8_t *p = realloc(*buf, want);
    if (!p)
        return len < *cap ? 0 : -ENOMEM;
    *buf = p;
    *cap = want;
    return 0;
}

int proto_in_reserve(uint8_t **buf, size_t *off, size_t *len, size_t *cap, size_t chunk)
{
    if (*off == *len)
        *off = *len = 0;
    if (*cap - *len >= chunk)
        return 0;
    if (*off) {
        memmove(*buf, *buf + *off, *len - *off);
        *len -= *off;
        *off = 0;
    }
    if (*cap - *len >= chunk)
        return 0;
    size_t want = *cap ? *cap * 2 : 2 * chunk;
    while (want - *len < chunk)
        want *= 2;
    uint8_t *p = realloc(*buf, want);
    if (!p)
        return -ENOMEM;
    *buf = p;
    *cap = want;
    return 0;
}
