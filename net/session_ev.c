/*
 * session_ev.c - the libev driver of a client session (session_ev.h).
 *
 * Owns the socket, its watchers, the deadline timer and the inotify watch;
 * the session core owns everything else.  After every event it feeds the
 * core, then makes the watchers match net_session_want (net_ev_sync).
 * Loop thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fdpass.h"
#include "inbuf.h"
#include "session_ev.h"
#include "tcp.h"
#include "umbp/tier.h" /* umbp_log, umbp_now_ns */

#define READS_PER_WAKEUP 16

/* ---- the socket ---------------------------------------------------------------- */

static void drv_close(void *arg)
{
    struct net_ev *d = arg;
    ev_io_stop(d->loop, &d->rio);
    ev_io_stop(d->loop, &d->wio);
    ev_timer_stop(d->loop, &d->fail_timer);
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
}

static void fail_soon(struct net_ev *d, int e)
{
    d->fail_errno = e;
    ev_io_stop(d->loop, &d->wio);
    if (!ev_is_active(&d->fail_timer)) {
        ev_timer_set(&d->fail_timer, 0.0, 0.0);
        ev_timer_start(d->loop, &d->fail_timer);
    }
}

/* Writes what the socket takes now; false when the socket is dead (the
 * loss is reported on the next iteration). */
static bool flush(struct net_ev *d)
{
    struct net_session *s = d->s;
    if (d->fd < 0 || (s->state != NET_HELLO && s->state != NET_CONNECTED) || !s->out.len ||
        ev_is_active(&d->fail_timer))
        return true;
    size_t sent = 0;
    int rc = proto_out_send(d->fd, &s->out, &sent);
    net_session_wrote(s, sent);
    if (rc < 0 && s->state == NET_HELLO && (rc == -EPIPE || rc == -ECONNRESET)) {
        /* a server that refuses this peer closes at once, after a HELLO_ERR
         * saying why: the read watcher takes it (or the EOF) */
        s->out.len = 0;
        return true;
    }
    if (rc < 0) {
        fail_soon(d, -rc); /* never torn down inside the owner's call */
        return false;
    }
    return true;
}

static void watch(struct net_ev *d, ev_io *w, bool on, int events)
{
    if (on && d->fd >= 0) {
        if (ev_is_active(w) && w->fd == d->fd)
            return;
        ev_io_stop(d->loop, w);
        ev_io_set(w, d->fd, events);
        ev_io_start(d->loop, w);
    } else {
        ev_io_stop(d->loop, w);
    }
}

/* ---- watching the socket's directory ------------------------------------------------ */

static void dir_watch(struct net_ev *d)
{
    if (d->ino_wd >= 0 || d->ino_fd == -2)
        return;
    if (d->ino_fd < 0) {
        d->ino_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (d->ino_fd < 0) {
            umbp_log(UMBP_LOG_DEBUG, "%s: no inotify (%s); reconnecting by backoff alone",
                     d->name, strerror(errno));
            d->ino_fd = -2; /* do not ask again */
            return;
        }
        ev_io_set(&d->ino_w, d->ino_fd, EV_READ);
        ev_io_start(d->loop, &d->ino_w);
    }
    d->ino_wd = inotify_add_watch(d->ino_fd, d->dir, IN_CREATE | IN_MOVED_TO | IN_ATTRIB |
                                  IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR);
    if (d->ino_wd < 0)
        umbp_log(UMBP_LOG_DEBUG, "%s: cannot watch %s (%s); reconnecting by backoff", d->name,
                 d->dir, strerror(errno));
}

static void dir_unwatch(struct net_ev *d)
{
    if (d->ino_wd >= 0)
        inotify_rm_watch(d->ino_fd, d->ino_wd); /* its IN_IGNORED is drained */
    d->ino_wd = -1;
}

static void on_dir_event(struct ev_loop *loop, ev_io *w, int revents)
{
    struct net_ev *d = w->data;
    (void)loop, (void)revents;
    bool appeared = false;
    _Alignas(struct inotify_event) char buf[4096];
    for (;;) {
        ssize_t n = read(d->ino_fd, buf, sizeof(buf));
        if (n <= 0)
            break;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *e = (const struct inotify_event *)p;
            p += sizeof(*e) + e->len;
            if (e->wd != d->ino_wd || d->ino_wd < 0)
                continue; /* a watch removed since */
            if (e->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) {
                if (!(e->mask & IN_IGNORED))
                    inotify_rm_watch(d->ino_fd, d->ino_wd);
                d->ino_wd = -1; /* gone: re-added at the next attempt */
                continue;
            }
            if (e->len && strcmp(e->name, d->sock_name) == 0)
                appeared = true;
        }
    }
    if (appeared)
        net_session_appeared(d->s, umbp_now_ns());
    net_ev_sync(d);
}

/* ---- dialling ------------------------------------------------------------------------ */

static void begin(struct net_ev *d, uint64_t now)
{
    char err[256];
    if (d->cfg.check_peer && d->cfg.check_peer(d->cfg.ctx, d->fd, err, sizeof(err)) < 0) {
        net_session_lost(d->s, now, err);
        return;
    }
    net_session_connected(d->s, now);
}

static void dial(struct net_ev *d, uint64_t now)
{
    struct net_session *s = d->s;
    if (s->was_up && s->gen != d->ino_gen && !d->tcp_address[0]) { /* again, if the directory was removed */
        d->ino_gen = s->gen;
        dir_watch(d);
    }
    net_session_dialing(s, now);
    if (d->cfg.resolve) {
        char why[256];
        if (d->cfg.resolve(d->cfg.ctx, d->tcp_address, sizeof(d->tcp_address), why,
                           sizeof(why)) < 0) {
            net_session_lost(s, now, why);
            return;
        }
    }
    if (d->tcp_address[0]) {
        int rc = net_tcp_connect(d->tcp_address, &d->fd);
        if (rc == 0)
            begin(d, now);
        else if (rc != -EINPROGRESS) /* else the write watcher sees it complete */
            net_session_lost(s, now, strerror(-rc));
        return;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", d->path);
    d->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (d->fd >= 0 && connect(d->fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        begin(d, now);
    } else if (d->fd >= 0 && errno == EINPROGRESS) {
        return; /* the write watcher sees it complete */
    } else if (d->fd >= 0 && (errno == EACCES || errno == EPERM) && d->cfg.denied) {
        char why[512];
        d->cfg.denied(d->cfg.ctx, -errno, why, sizeof(why));
        net_session_lost(s, now, why);
    } else {
        net_session_lost(s, now, strerror(errno));
    }
}

void net_ev_sync(struct net_ev *d)
{
    struct net_session *s = d->s;
    struct net_want w;
    /* a dial may fail at once and schedule the next attempt: bounded */
    for (int i = 0; i < 4; i++) {
        net_session_want(s, &w);
        if (!w.dial)
            break;
        dial(d, umbp_now_ns());
    }
    if (w.write && !flush(d))
        net_session_want(s, &w);
    else if (w.write)
        net_session_want(s, &w); /* what is left after writing */
    watch(d, &d->rio, w.read, EV_READ);
    watch(d, &d->wio, w.write && !ev_is_active(&d->fail_timer), EV_WRITE);
    if (w.watch_dir && !d->tcp_address[0]) {
        if (d->ino_gen != s->gen) {
            d->ino_gen = s->gen;
            dir_watch(d);
        }
    } else if (d->ino_wd >= 0) {
        dir_unwatch(d);
    }
    if (w.deadline_ns == d->timer_ns && ev_is_active(&d->timer))
        return; /* armed for it already (the common case: a call pushed) */
    ev_timer_stop(d->loop, &d->timer);
    d->timer_ns = w.deadline_ns;
    if (w.deadline_ns) {
        uint64_t now = umbp_now_ns();
        double in = w.deadline_ns > now ? (double)(w.deadline_ns - now) / 1e9 : 0.0;
        ev_timer_set(&d->timer, in, 0.0);
        ev_timer_start(d->loop, &d->timer);
    }
}

static void drv_update(void *arg) { net_ev_sync(arg); }

/* ---- events --------------------------------------------------------------------------- */

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct net_ev *d = w->data;
    (void)loop, (void)revents;
    net_session_tick(d->s, umbp_now_ns());
    net_ev_sync(d);
}

static void on_fail_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct net_ev *d = w->data;
    (void)loop, (void)revents;
    net_session_lost(d->s, umbp_now_ns(), strerror(d->fail_errno));
    net_ev_sync(d);
}

static void on_writable(struct ev_loop *loop, ev_io *w, int revents)
{
    struct net_ev *d = w->data;
    (void)loop, (void)revents;
    if (d->s->state == NET_CONNECTING) {
        int e = 0;
        socklen_t len = sizeof(e);
        getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &e, &len);
        if (e)
            net_session_lost(d->s, umbp_now_ns(), strerror(e));
        else
            begin(d, umbp_now_ns());
    }
    net_ev_sync(d);
}

static void on_readable(struct ev_loop *loop, ev_io *w, int revents)
{
    struct net_ev *d = w->data;
    struct net_session *s = d->s;
    (void)loop, (void)revents;
    if (net_session_process(s, umbp_now_ns()) < 0) { /* bytes left from the handshake */
        net_ev_sync(d);
        return;
    }
    int r = net_session_read(s, &d->fd, READS_PER_WAKEUP);
    if (r < 0)
        net_session_lost(s, umbp_now_ns(), strerror(-r));
    net_ev_sync(d);
}

/* ---- setup ------------------------------------------------------------------------------ */

void net_ev_init(struct net_ev *d, struct net_session *s, struct ev_loop *loop,
                 const struct net_ev_config *cfg)
{
    memset(d, 0, sizeof(*d));
    d->s = s;
    d->loop = loop;
    d->cfg = *cfg;
    snprintf(d->path, sizeof(d->path), "%s", cfg->path ? cfg->path : "");
    snprintf(d->dir, sizeof(d->dir), "%s", cfg->dir ? cfg->dir : "");
    snprintf(d->tcp_address, sizeof(d->tcp_address), "%s",
             cfg->tcp_address ? cfg->tcp_address : "");
    snprintf(d->name, sizeof(d->name), "%s", cfg->name);
    const char *slash = strrchr(d->path, '/');
    d->sock_name = slash ? slash + 1 : d->path;
    d->fd = -1;
    d->ino_fd = d->ino_wd = -1;
    d->ino_gen = s->gen;
    ev_io_init(&d->rio, on_readable, -1, EV_READ);
    ev_io_init(&d->wio, on_writable, -1, EV_WRITE);
    ev_io_init(&d->ino_w, on_dir_event, -1, EV_READ);
    ev_init(&d->timer, on_timer);
    ev_init(&d->fail_timer, on_fail_timer);
    d->rio.data = d->wio.data = d->ino_w.data = d;
    d->timer.data = d->fail_timer.data = d;
    s->io = (struct net_session_io){.close = drv_close, .update = drv_update, .drv = d};
}

void net_ev_start(struct net_ev *d, int fd)
{
    d->fd = fd;
    net_ev_sync(d);
    if (d->s->in_len > d->s->in_off)
        ev_feed_event(d->loop, &d->rio, EV_READ);
}

void net_ev_stop(struct net_ev *d)
{
    ev_io_stop(d->loop, &d->rio);
    ev_io_stop(d->loop, &d->wio);
    ev_timer_stop(d->loop, &d->timer);
    ev_timer_stop(d->loop, &d->fail_timer);
    if (d->ino_fd >= 0) { /* no reconnecting after this */
        ev_io_stop(d->loop, &d->ino_w);
        close(d->ino_fd);
    }
    d->ino_fd = -2;
    d->ino_wd = -1;
    d->s->io.update = NULL;
}
