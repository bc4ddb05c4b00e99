/*
 * session_poll.c - the poll() driver of a client session (session_poll.h).
 *
 * Owns the socket; the session core owns everything else.  A run feeds the
 * core what happened (ticks at its deadlines, a dial, bytes, a loss), then
 * looks at net_session_want again, as the ev driver does after each event.
 * A failure met while writing is reported to the core at once: the poll
 * driver runs between the owner's calls, never inside one.  Caller's thread.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fdpass.h"
#include "inbuf.h"
#include "session_poll.h"
#include "tcp.h"
#include "umbp/tier.h" /* umbp_now_ns */

#define READS_PER_WAKEUP 16

static void drv_close(void *arg) { net_poll_close(arg); }

void net_poll_close(struct net_poll *d)
{
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
}

void net_poll_init(struct net_poll *d, struct net_session *s, const struct net_poll_config *cfg)
{
    memset(d, 0, sizeof(*d));
    d->s = s;
    d->cfg = *cfg;
    snprintf(d->path, sizeof(d->path), "%s", cfg->path ? cfg->path : "");
    snprintf(d->tcp_address, sizeof(d->tcp_address), "%s",
             cfg->tcp_address ? cfg->tcp_address : "");
    d->fd = -1;
    d->slot = -1;
    s->io = (struct net_session_io){.close = drv_close, .update = NULL, .drv = d};
}

static void word(struct net_poll *d, enum net_poll_step step, int e, char *why, size_t len)
{
    if (d->cfg.failed)
        d->cfg.failed(d->cfg.ctx, step, e, why, len);
    else
        snprintf(why, len, "%s", strerror(e));
}

static void lose(struct net_poll *d, uint64_t now, enum net_poll_step step, int e)
{
    char why[512];
    word(d, step, e, why, sizeof(why));
    net_session_lost(d->s, now, why);
}

/* ---- dialling ----------------------------------------------------------------------- */

/* socket() and connect(): 0 connected, -EINPROGRESS, or -errno with *step
 * the one that failed (the socket closed). */
static int start_connect(struct net_poll *d, enum net_poll_step *step)
{
    if (d->tcp_address[0]) {
        *step = NET_POLL_CONNECT;
        int rc = net_tcp_connect(d->tcp_address, &d->fd);
        if (rc < 0 && rc != -EINPROGRESS)
            d->fd = -1;
        return rc;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", d->path);
    *step = NET_POLL_SOCKET;
    d->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (d->fd < 0)
        return -errno;
    *step = NET_POLL_CONNECT;
    if (connect(d->fd, (struct sockaddr *)&a, sizeof(a)) == 0)
        return 0;
    int e = errno;
    if (e == EINPROGRESS)
        return -EINPROGRESS;
    close(d->fd);
    d->fd = -1;
    return -e;
}

static void begin(struct net_poll *d, uint64_t now)
{
    char err[512];
    if (d->cfg.check_peer && d->cfg.check_peer(d->cfg.ctx, d->fd, err, sizeof(err)) < 0) {
        net_session_lost(d->s, now, err);
        return;
    }
    net_session_connected(d->s, now);
}

static void dial(struct net_poll *d, uint64_t now)
{
    enum net_poll_step step;
    net_session_dialing(d->s, now);
    if (d->cfg.resolve) {
        char why[256];
        if (d->cfg.resolve(d->cfg.ctx, d->tcp_address, sizeof(d->tcp_address), why,
                           sizeof(why)) < 0) {
            net_session_lost(d->s, now, why);
            return;
        }
    }
    int rc = start_connect(d, &step);
    if (rc == 0)
        begin(d, now);
    else if (rc != -EINPROGRESS)
        lose(d, now, step, -rc);
}

/* ---- a run ---------------------------------------------------------------------------- */

static void flush(struct net_poll *d, uint64_t now)
{
    struct net_session *s = d->s;
    if (d->fd < 0 || (s->state != NET_HELLO && s->state != NET_CONNECTED) || !s->out.len)
        return;
    size_t sent = 0;
    int rc = proto_out_send(d->fd, &s->out, &sent);
    net_session_wrote(s, sent);
    if (rc < 0 && s->state == NET_HELLO && (rc == -EPIPE || rc == -ECONNRESET)) {
        /* a peer that refuses us closes at once, after a HELLO_ERR saying
         * why: read on (as the ev driver does) */
        s->out.len = 0;
        return;
    }
    if (rc < 0)
        lose(d, now, NET_POLL_SEND, -rc);
}

/* What needs no waiting: a tick at the deadline, dials, writes.  A
 * disconnected session is not ticked: its owner starts the next attempt
 * (net_session_tick when it next needs the peer). */
static void sync_one(struct net_poll *d, uint64_t now)
{
    struct net_want w;
    net_session_want(d->s, &w);
    if (w.deadline_ns && now >= w.deadline_ns && d->s->state != NET_DISCONNECTED)
        net_session_tick(d->s, now);
    /* a dial may fail at once and schedule the next attempt: bounded */
    for (int i = 0; i < 4; i++) {
        net_session_want(d->s, &w);
        if (!w.dial)
            break;
        dial(d, now);
    }
    if (w.write)
        flush(d, now);
}

static void on_writable(struct net_poll *d, uint64_t now)
{
    if (d->s->state != NET_CONNECTING) {
        flush(d, now);
        return;
    }
    int e = 0;
    socklen_t len = sizeof(e);
    if (getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
        e = errno;
    if (e)
        lose(d, now, NET_POLL_CONNECT, e);
    else
        begin(d, now);
}

static void on_readable(struct net_poll *d)
{
    struct net_session *s = d->s;
    if (net_session_process(s, umbp_now_ns()) < 0) /* bytes left from a handshake */
        return;
    int r = net_session_read(s, &d->fd, READS_PER_WAKEUP);
    if (r < 0)
        lose(d, umbp_now_ns(), NET_POLL_RECV, -r);
}

int net_poll_run(struct net_poll *const *d, size_t n, struct pollfd *pfd, uint64_t until_ns,
                 bool (*done)(void *arg), void *arg)
{
    for (bool waited = false;; waited = true) {
        uint64_t now = umbp_now_ns(), wake = until_ns;
        nfds_t k = 0;
        for (size_t i = 0; i < n; i++) {
            struct net_want w;
            sync_one(d[i], now);
            net_session_want(d[i]->s, &w);
            if (d[i]->s->state == NET_DISCONNECTED)
                w.deadline_ns = 0; /* its next attempt is the owner's to start */
            if (w.deadline_ns && (!wake || w.deadline_ns < wake))
                wake = w.deadline_ns;
            short ev = (short)((w.read ? POLLIN : 0) | (w.write ? POLLOUT : 0));
            d[i]->slot = -1;
            if (d[i]->fd >= 0 && ev) {
                d[i]->slot = (int)k;
                pfd[k++] = (struct pollfd){d[i]->fd, ev, 0};
            }
        }
        if (done && done(arg))
            return 0;
        if (until_ns && now >= until_ns && waited)
            return -ETIMEDOUT;
        int ms = -1;
        if (until_ns && now >= until_ns)
            ms = 0; /* one round without waiting */
        else if (wake)
            ms = wake > now ? (int)((wake - now + 999999) / 1000000) : 0;
        if (k == 0 && ms < 0)
            return -ENOTCONN; /* nothing can happen */
        int r = poll(pfd, k, ms);
        if (r < 0 && errno != EINTR)
            return -errno;
        now = umbp_now_ns();
        for (size_t i = 0; r > 0 && i < n; i++) {
            if (d[i]->slot < 0 || !pfd[d[i]->slot].revents)
                continue;
            short ev = pfd[d[i]->slot].revents;
            if (ev & POLLOUT || (d[i]->s->state == NET_CONNECTING && ev & (POLLERR | POLLHUP)))
                on_writable(d[i], now);
            if (d[i]->fd >= 0 && d[i]->s->state != NET_CONNECTING &&
                ev & (POLLIN | POLLHUP | POLLERR))
                on_readable(d[i]);
        }
    }
}

/* ---- one blocking connection ---------------------------------------------------------- */

static int wait_fd(int fd, short events, uint64_t until_ns)
{
    for (;;) {
        int ms = -1;
        if (until_ns) {
            uint64_t now = umbp_now_ns();
            if (now >= until_ns)
                return -ETIMEDOUT;
            ms = (int)((until_ns - now + 999999) / 1000000);
        }
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, ms);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -errno;
    }
}

int net_poll_dial(struct net_poll *d, uint64_t until_ns, char *why, size_t whylen)
{
    enum net_poll_step step;
    int rc;
    net_poll_close(d);
    /* a listener's full backlog: EAGAIN on a non-blocking Unix connect,
     * where a blocking one waits */
    while ((rc = start_connect(d, &step)) == -EAGAIN && step == NET_POLL_CONNECT &&
           (!until_ns || umbp_now_ns() < until_ns))
        poll(NULL, 0, 1);
    if (rc == -EINPROGRESS) {
        int e = 0;
        socklen_t len = sizeof(e);
        if ((rc = wait_fd(d->fd, POLLOUT, until_ns)) == 0 &&
            getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0)
            rc = -e;
        if (rc < 0)
            net_poll_close(d);
    }
    if (rc < 0) {
        word(d, step, -rc, why, whylen);
        return rc;
    }
    if (d->cfg.check_peer && (rc = d->cfg.check_peer(d->cfg.ctx, d->fd, why, whylen)) < 0) {
        net_poll_close(d);
        return rc;
    }
    return 0;
}

/* b's bytes [*off, len), waiting for room up to until_ns. */
static int write_from(struct net_poll *d, const struct proto_buf *b, size_t *off,
                      uint64_t until_ns)
{
    while (*off < b->len) {
        int rc = proto_out_send(d->fd, b, off);
        if (rc < 0)
            return rc;
        if (*off < b->len && (rc = wait_fd(d->fd, POLLOUT, until_ns)) < 0)
            return rc;
    }
    return 0;
}

int net_poll_write_all(struct net_poll *d, uint64_t until_ns)
{
    size_t off = 0;
    int rc = write_from(d, &d->s->out, &off, until_ns);
    net_session_wrote(d->s, off);
    return rc;
}

int net_poll_write(struct net_poll *d, const void *buf, size_t len, uint64_t until_ns)
{
    const struct proto_buf view = {.data = (uint8_t *)buf, .len = len, .cap = len};
    size_t off = 0;
    return write_from(d, &view, &off, until_ns);
}

long net_poll_read(struct net_poll *d, uint64_t until_ns)
{
    for (;;) {
        uint8_t *p;
        size_t room;
        int fd = -1;
        if (net_session_in_space(d->s, &p, &room) < 0)
            return -ENOMEM;
        long r = proto_recv_with_fd(d->fd, p, room, &fd);
        if (r == -EAGAIN || r == -EINTR) {
            int rc = wait_fd(d->fd, POLLIN, until_ns);
            if (rc < 0)
                return rc;
            continue;
        }
        if (r < 0)
            return r;
        if (net_session_in_commit(d->s, (size_t)r, fd) < 0)
            return -EPROTO;
        return r;
    }
}
