/*
 * sync_client.c - the blocking client of sync_client.h, over a client
 * session (its bytes) and its poll() driver (the socket).  A descriptor
 * riding on a worker's HELLO_OK is the pool's; one arriving at any other
 * time is closed.  Caller's thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "sync_client.h"
#include "umbp/tier.h" /* umbp_now_ns */

/* Nothing here runs the session's connection machinery (the handshake is
 * this file's, then net_session_adopt): no member is ever called. */
static const struct net_session_ops no_ops;

static uint64_t until(const struct sync_client *c)
{
    return c->timeout_ms > 0 ? umbp_now_ns() + (uint64_t)c->timeout_ms * 1000000ull : 0;
}

static void dial_failed(void *ctx, enum net_poll_step step, int e, char *why, size_t whylen)
{
    struct sync_client *c = ctx;
    if (step == NET_POLL_SOCKET || step == NET_POLL_CONNECT)
        snprintf(why, whylen, "no umbp-server answers at %s (connect: %s); start one with "
                 "the same socket_dir, dp_rank and lookup_instance, or point at the right "
                 "socket", c->d.path, strerror(e));
    else
        snprintf(why, whylen, "%s", strerror(e));
}

int sync_client_dial(struct sync_client *c, const char *path, int timeout_ms, char *err,
                     size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->fd = c->pool_fd = -1;
    c->next_seq = 1;
    c->timeout_ms = timeout_ms;
    if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        snprintf(err, errlen, "socket path %s is too long for a Unix socket", path);
        return -ENAMETOOLONG;
    }
    struct net_session_config sc = {.peer = "the server"};
    struct net_poll_config pc = {.path = path, .failed = dial_failed, .ctx = c};
    net_session_init(&c->s, &sc, &no_ops, c);
    net_poll_init(&c->d, &c->s, &pc);
    c->open = true;
    int rc = net_poll_dial(&c->d, until(c), err, errlen);
    if (rc < 0) {
        sync_client_close(c);
        return rc;
    }
    c->fd = c->d.fd;
    return 0;
}

int sync_client_send(struct sync_client *c, const void *buf, size_t len)
{
    return net_poll_write(&c->d, buf, len, until(c));
}

/* A descriptor that came with the bytes read: the pool's on the first
 * HELLO_OK, else closed. */
static void take_fd(struct sync_client *c)
{
    int fd = c->s.pending_fd;
    if (fd < 0)
        return;
    c->s.pending_fd = -1;
    if (c->pool_fd < 0 && c->welcome.session_id == 0)
        c->pool_fd = fd; /* HELLO_OK's */
    else
        close(fd);
}

int sync_client_recv(struct sync_client *c, struct proto_frame *f, char *err, size_t errlen)
{
    net_session_in_consume(&c->s, c->in_used);
    c->in_used = 0;
    for (;;) {
        long n = net_session_in_next(&c->s, f, err, errlen);
        if (n > 0) {
            c->in_used = n;
            take_fd(c);
            return 0;
        }
        if (n < 0)
            return (int)n;
        long r = net_poll_read(&c->d, until(c));
        take_fd(c);
        if (r > 0 || r == -EPROTO) /* -EPROTO: a second fd, closed; its bytes are in */
            continue;
        if (r == 0 || r == -ECONNRESET) {
            snprintf(err, errlen, "the server closed the connection");
            return -ECONNRESET;
        }
        if (r == -ETIMEDOUT) {
            snprintf(err, errlen, "the server did not answer in time");
            return -ETIMEDOUT;
        }
        snprintf(err, errlen, "recv: %s", strerror((int)-r));
        return (int)r;
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
    net_session_adopt(&c->s, umbp_now_ns());
    return 0;
}

int sync_client_connect(struct sync_client *c, const char *path, const struct proto_hello *h,
                        int timeout_ms, char *err, size_t errlen)
{
    int rc = sync_client_dial(c, path, timeout_ms, err, errlen);
    if (rc < 0)
        return rc;
    struct proto_buf *b = &c->s.out;
    if ((rc = proto_begin(b, PROTO_HELLO, c->next_seq++, 1, 0)) == 0 &&
        (rc = proto_put_hello(b, h)) == 0 && (rc = proto_end(b)) == 0)
        rc = net_poll_write_all(&c->d, until(c));
    b->len = 0;
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

/* The reply type of a request without records. */
static uint16_t reply_of(uint16_t type)
{
    switch (type) {
    case PROTO_STATS: return PROTO_STATS_R;
    case PROTO_SESSIONS: return PROTO_SESSIONS_R;
    case PROTO_CLEAR: return PROTO_CLEAR_R;
    case PROTO_PING: return PROTO_PONG;
    default: return 0;
    }
}

int sync_client_call(struct sync_client *c, uint16_t type, struct proto_frame *f, char *err,
                     size_t errlen)
{
    uint64_t seq = c->next_seq++;
    int rc = proto_put_empty(&c->s.out, type, seq, 0);
    if (rc == 0)
        rc = net_poll_write_all(&c->d, until(c));
    c->s.out.len = 0;
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
    uint16_t want = reply_of(type);
    if (f->type != want) { /* the caller reads it with want's accessors */
        snprintf(err, errlen, "%s answered with %s, expected %s", proto_type_name(type),
                 proto_type_name(f->type), proto_type_name(want));
        return -EPROTO;
    }
    return 0;
}

void sync_client_close(struct sync_client *c)
{
    if (c->open) {
        net_poll_close(&c->d);
        net_session_destroy(&c->s); /* and a descriptor still pending */
    }
    if (c->pool_fd >= 0)
        close(c->pool_fd);
    memset(c, 0, sizeof(*c));
    c->fd = c->pool_fd = -1;
}
