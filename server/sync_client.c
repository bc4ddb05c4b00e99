/*
 * sync_client.c - the blocking client of sync_client.h.  Reads go through
 * proto_recv_with_fd so that the pool descriptor riding on a worker's
 * HELLO_OK is caught; a descriptor arriving at any other time is closed.
 * Caller's thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "fdpass.h"
#include "inbuf.h"
#include "sync_client.h"

#define IN_INITIAL (64u << 10)

static void set_timeouts(int fd, int timeout_ms)
{
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    if (timeout_ms <= 0)
        return;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

int sync_client_dial(struct sync_client *c, const char *path, int timeout_ms, char *err,
                     size_t errlen)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memset(c, 0, sizeof(*c));
    c->fd = c->pool_fd = -1;
    c->next_seq = 1;
    if (strlen(path) >= sizeof(addr.sun_path)) {
        snprintf(err, errlen, "socket path %s is too long for a Unix socket", path);
        return -ENAMETOOLONG;
    }
    memcpy(addr.sun_path, path, strlen(path) + 1);
    if (!(c->in = malloc(IN_INITIAL))) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    c->in_cap = IN_INITIAL;
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        int e = errno;
        snprintf(err, errlen, "no umbp-server answers at %s (connect: %s); start one with "
                 "the same socket_dir, dp_rank and lookup_instance, or point at the right "
                 "socket", path, strerror(e));
        sync_client_close(c);
        return -e;
    }
    set_timeouts(c->fd, timeout_ms);
    return 0;
}

int sync_client_send(struct sync_client *c, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* One read into the buffer (growing it when full). */
static int read_more(struct sync_client *c, char *err, size_t errlen)
{
    int rc = proto_in_room(&c->in, c->in_len, &c->in_cap, IN_INITIAL);
    if (rc < 0)
        return rc;
    int fd = -1;
    long n = proto_recv_with_fd(c->fd, c->in + c->in_len, c->in_cap - c->in_len, &fd);
    if (fd >= 0) {
        if (c->pool_fd < 0 && c->welcome.session_id == 0)
            c->pool_fd = fd; /* HELLO_OK's */
        else
            close(fd);
    }
    if (n > 0) {
        c->in_len += (size_t)n;
        return 0;
    }
    if (n == 0 || n == -ECONNRESET) {
        snprintf(err, errlen, "the server closed the connection");
        return -ECONNRESET;
    }
    if (n == -EAGAIN || n == -EWOULDBLOCK) {
        snprintf(err, errlen, "the server did not answer in time");
        return -ETIMEDOUT;
    }
    snprintf(err, errlen, "recv: %s", strerror((int)-n));
    return (int)n;
}

int sync_client_recv(struct sync_client *c, struct proto_frame *f, char *err, size_t errlen)
{
    memmove(c->in, c->in + c->in_used, c->in_len - c->in_used);
    c->in_len -= c->in_used;
    c->in_used = 0;
    for (;;) {
        long n = proto_frame_parse(c->in, c->in_len, true, f, err, errlen);
        if (n > 0) {
            c->in_used = (size_t)n;
            return 0;
        }
        if (n < 0)
            return (int)n;
        int rc = read_more(c, err, errlen);
        if (rc < 0)
            return rc;
    }
}

static int hello_answer(struct sync_client *c, const struct proto_hello *h, char *err,
                        size_t errlen)
{
    struct proto_frame f;
    struct proto_error e = {0};
    int rc = sync_client_recv(c, &f, err, errlen);
    if (rc < 0)
        return rc;
    if (f.type == PROTO_HELLO_ERR || f.type == PROTO_ERROR) {
        if (proto_get_error(&f, &e) < 0)
            snprintf(e.message, sizeof(e.message), "(unreadable %s)", proto_type_name(f.type));
        snprintf(err, errlen, "the server refused the handshake: %s", e.message);
        return e.status < 0 ? e.status : -EPROTO;
    }
    if (f.type != PROTO_HELLO_OK || proto_get_welcome(&f, &c->welcome, err, errlen) < 0) {
        snprintf(err, errlen, "the server answered HELLO with %s", proto_type_name(f.type));
        return -EPROTO;
    }
    if (h->role == PROTO_ROLE_WORKER && c->pool_fd < 0) {
        snprintf(err, errlen, "HELLO_OK came without the pool descriptor");
        return -EPROTO;
    }
    return 0;
}

int sync_client_connect(struct sync_client *c, const char *path, const struct proto_hello *h,
                        int timeout_ms, char *err, size_t errlen)
{
    struct proto_buf b = {0};
    int rc = sync_client_dial(c, path, timeout_ms, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = proto_begin(&b, PROTO_HELLO, c->next_seq++, 1, 0)) == 0 &&
        (rc = proto_put_hello(&b, h)) == 0 && (rc = proto_end(&b)) == 0)
        rc = sync_client_send(c, b.data, b.len);
    proto_buf_free(&b);
    /* a server that refuses this peer sends HELLO_ERR and closes, maybe
     * before the HELLO arrives: read on after EPIPE / ECONNRESET */
    int sent = rc;
    if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET)
        snprintf(err, errlen, "sending HELLO to %s: %s", path, strerror(-rc));
    else if ((rc = hello_answer(c, h, err, errlen)) == -ECONNRESET && sent < 0) {
        snprintf(err, errlen, "sending HELLO to %s: %s", path, strerror(-sent));
        rc = sent;
    }
    if (rc < 0)
        sync_client_close(c);
    return rc;
}

int sync_client_call(struct sync_client *c, uint16_t type, struct proto_frame *f, char *err,
                     size_t errlen)
{
    struct proto_buf b = {0};
    uint64_t seq = c->next_seq++;
    int rc = proto_put_empty(&b, type, seq, 0);
    if (rc == 0)
        rc = sync_client_send(c, b.data, b.len);
    proto_buf_free(&b);
    if (rc < 0) {
        snprintf(err, errlen, "sending %s: %s", proto_type_name(type), strerror(-rc));
        return rc;
    }
    do
        rc = sync_client_recv(c, f, err, errlen);
    while (rc == 0 && f->type == PROTO_EVENTS);
    if (rc < 0)
        return rc;
    if (f->type == PROTO_ERROR) {
        struct proto_error e = {0};
        proto_get_error(f, &e);
        snprintf(err, errlen, "the server refused %s: %s", proto_type_name(type), e.message);
        return -EPROTO;
    }
    if (f->seq != seq) {
        snprintf(err, errlen, "%s: a reply with seq %llu, expected %llu",
                 proto_type_name(f->type), (unsigned long long)f->seq,
                 (unsigned long long)seq);
        return -EPROTO;
    }
    return 0;
}

void sync_client_close(struct sync_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    if (c->pool_fd >= 0)
        close(c->pool_fd);
    free(c->in);
    memset(c, 0, sizeof(*c));
    c->fd = c->pool_fd = -1;
}
