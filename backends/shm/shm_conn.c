/*
 * shm_conn.c - the tier's socket on the runtime's loop: the read and write
 * watchers, the input buffer, and losing and regaining the server.
 *
 * Loop thread only (shm_in_* also serve the blocking handshake at creation,
 * before the loop thread exists).  The loop never blocks here: the socket
 * is non-blocking, a reconnect is a non-blocking connect then HELLO sent and
 * HELLO_OK read by the same watchers, bounded by startup_timeout_ms, retried
 * with exponential backoff from 10 ms to reconnect_max_ms.
 *
 * While disconnected the socket's directory is watched with inotify (an
 * ev_io on the inotify fd): the socket's name created, moved in or its
 * attributes changed (a new server binds, then chmods, then listens)
 * starts an attempt at once, and a failed one is retried after 1, 2 and
 * 4 ms before the backoff takes over again.  So a restarted server is
 * found within milliseconds of creating its socket, not at the next
 * backoff step (up to reconnect_max_ms later), and nothing polls.  The
 * watch goes when connected.  Without inotify (no fd, a full watch table)
 * or with the directory removed (its watch is re-added at each backoff
 * attempt) the backoff alone reconnects, as before.
 *
 * States: CONNECTED -(EOF, reset, malformed frame, ERROR)-> DISCONNECTED
 * -(backoff timer)-> CONNECTING (rarely: a Unix connect completes at once)
 * -> HELLO -(HELLO_OK)-> CONNECTED; any failure on the way goes back to
 * DISCONNECTED with a longer backoff.  Losing the connection completes
 * every outstanding call with -ECONNRESET; the pool mapping stays.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "options.h"
#include "shm.h"

#define IN_CHUNK (64u * 1024u)
#define READS_PER_WAKEUP 16
#define BACKOFF_MIN_MS 10
#define STATS_PERIOD_S 0.2
#define QUICK_RETRIES 3     /* after the socket appeared: 1, 2, 4 ms */

static double ms_to_s(uint64_t ms) { return (double)ms / 1000.0; }

/* ---- the input buffer --------------------------------------------------- */

static int in_room(struct shm_tier *st)
{
    return proto_in_reserve(&st->in, &st->in_off, &st->in_len, &st->in_cap, IN_CHUNK);
}

long shm_in_read(struct shm_tier *st)
{
    if (in_room(st) < 0)
        return -ENOMEM;
    int fd = -1;
    long r = proto_recv_with_fd(st->fd, st->in + st->in_len, st->in_cap - st->in_len, &fd);
    if (r > 0)
        st->in_len += (size_t)r;
    if (fd >= 0 && st->pending_fd >= 0) {
        close(fd); /* only HELLO_OK carries an fd, once */
        return -EPROTO;
    }
    if (fd >= 0)
        st->pending_fd = fd;
    return r;
}

long shm_in_next(struct shm_tier *st, struct proto_frame *f, char *err, size_t errlen)
{
    return proto_frame_parse(st->in + st->in_off, st->in_len - st->in_off, true, f, err, errlen);
}

void shm_in_consume(struct shm_tier *st, long bytes) { st->in_off += (size_t)bytes; }

/* ---- closing and losing ---------------------------------------------------- */

void shm_conn_close(struct shm_tier *st)
{
    struct ev_loop *loop = st->base.env.loop;
    ev_io_stop(loop, &st->rio);
    ev_io_stop(loop, &st->wio);
    ev_timer_stop(loop, &st->fail_timer);
    ev_timer_stop(loop, &st->stats_timer);
    if (st->fd >= 0)
        close(st->fd);
    st->fd = -1;
    if (st->pending_fd >= 0)
        close(st->pending_fd);
    st->pending_fd = -1;
    st->out.len = 0; /* frames not yet written die with the connection */
    st->in_off = st->in_len = 0;
}

void shm_conn_stop_watchers(struct shm_tier *st)
{
    struct ev_loop *loop = st->base.env.loop;
    ev_io_stop(loop, &st->rio);
    ev_io_stop(loop, &st->wio);
    ev_timer_stop(loop, &st->fail_timer);
    ev_timer_stop(loop, &st->stats_timer);
    ev_timer_stop(loop, &st->deadline_timer);
    ev_timer_stop(loop, &st->reconnect_timer);
    ev_idle_stop(loop, &st->poll_w);
    if (st->ino_fd >= 0) { /* stop or destroy: no reconnecting after this */
        ev_io_stop(loop, &st->ino_w);
        close(st->ino_fd);
    }
    st->ino_fd = -2;
    st->ino_wd = -1;
}

static void arm_reconnect(struct shm_tier *st, uint64_t delay_ms)
{
    ev_timer_stop(st->base.env.loop, &st->reconnect_timer);
    ev_timer_set(&st->reconnect_timer, ms_to_s(delay_ms), 0.0);
    ev_timer_start(st->base.env.loop, &st->reconnect_timer);
}

/* ---- watching the socket's directory ------------------------------------------ */

/* Adds the directory's watch (creating the inotify fd the first time);
 * failures leave the backoff alone to reconnect. */
static void dir_watch(struct shm_tier *st)
{
    if (st->ino_wd >= 0)
        return;
    if (st->ino_fd < 0) {
        st->ino_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (st->ino_fd < 0) {
            umbp_log(UMBP_LOG_DEBUG, "umbp-server at %s: no inotify (%s); reconnecting by "
                     "backoff alone", st->path, strerror(errno));
            st->ino_fd = -2; /* do not ask again */
            return;
        }
        ev_io_set(&st->ino_w, st->ino_fd, EV_READ);
        ev_io_start(st->base.env.loop, &st->ino_w);
    }
    if (st->ino_fd < 0)
        return;
    const char *slash = strrchr(st->path, '/');
    st->sock_name = slash ? slash + 1 : st->path;
    char dir[SHM_PATH_MAX];
    shm_config_socket_dir(&st->cfg, dir, sizeof(dir));
    st->ino_wd = inotify_add_watch(st->ino_fd, dir, IN_CREATE | IN_MOVED_TO | IN_ATTRIB |
                                   IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR);
    if (st->ino_wd < 0)
        umbp_log(UMBP_LOG_DEBUG, "umbp-server at %s: cannot watch %s (%s); reconnecting by "
                 "backoff", st->path, dir, strerror(errno));
}

static void dir_unwatch(struct shm_tier *st)
{
    if (st->ino_wd >= 0)
        inotify_rm_watch(st->ino_fd, st->ino_wd); /* its IN_IGNORED is drained */
    st->ino_wd = -1;
    st->quick_left = 0;
    st->quick_armed = false;
}

static void attempt(struct shm_tier *st);

static void on_dir_event(struct ev_loop *loop, ev_io *w, int revents)
{
    struct shm_tier *st = w->data;
    (void)loop, (void)revents;
    bool appeared = false;
    _Alignas(struct inotify_event) char buf[4096];
    for (;;) {
        ssize_t n = read(st->ino_fd, buf, sizeof(buf));
        if (n <= 0)
            break;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *e = (const struct inotify_event *)p;
            p += sizeof(*e) + e->len;
            if (e->wd != st->ino_wd || st->ino_wd < 0)
                continue; /* a watch removed since */
            if (e->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) {
                if (!(e->mask & IN_IGNORED))
                    inotify_rm_watch(st->ino_fd, st->ino_wd);
                st->ino_wd = -1; /* gone: re-added at the next backoff attempt */
                continue;
            }
            if (e->len && strcmp(e->name, st->sock_name) == 0)
                appeared = true;
        }
    }
    if (!appeared || st->state != SHM_DISCONNECTED)
        return;
    st->quick_left = QUICK_RETRIES;
    st->quick_ms = 1;
    st->by_dir = true;
    ev_timer_stop(st->base.env.loop, &st->reconnect_timer);
    attempt(st);
}

void shm_conn_lost(struct shm_tier *st, const char *why)
{
    if (st->state == SHM_STOPPED || st->state == SHM_DISCONNECTED)
        return;
    bool was_connected = st->state == SHM_CONNECTED;
    shm_conn_close(st);
    st->state = SHM_DISCONNECTED;
    if (was_connected) {
        umbp_log(UMBP_LOG_WARN, "lost umbp-server at %s: %s; reconnecting", st->path, why);
        /* the server holds what it granted us only until our declared write
         * deadline; stop writing into it now (shm.h, SHM_WRITE_SLACK_MS) */
        if (st->worker && st->base.env.regions_revoked)
            st->base.env.regions_revoked(st->base.env.ctx);
        st->lost_ns = umbp_now_ns();
        st->backoff_ms = BACKOFF_MIN_MS;
        st->last_why[0] = 0;
    } else {
        /* a new reason is news (a refusing server, say); the same one again,
         * or no server there yet, is only the outage going on */
        bool news = strncmp(why, st->last_why, sizeof(st->last_why) - 1) != 0 &&
                    strcmp(why, strerror(ENOENT)) != 0 && strcmp(why, strerror(ECONNREFUSED)) != 0;
        umbp_log(news ? UMBP_LOG_WARN : UMBP_LOG_DEBUG,
                 "umbp-server at %s: reconnect failed: %s; retrying every %llu ms at most",
                 st->path, why, (unsigned long long)st->cfg.reconnect_max_ms);
        snprintf(st->last_why, sizeof(st->last_why), "%s", why);
    }
    if (was_connected)
        dir_watch(st);
    if (st->quick_left > 0) { /* the socket appeared: the server may not listen yet */
        st->quick_left--;
        st->quick_armed = true;
        arm_reconnect(st, st->quick_ms);
        st->quick_ms *= 2;
    } else {
        st->quick_armed = false;
        arm_reconnect(st, st->backoff_ms);
        st->backoff_ms *= 2;
        if (st->backoff_ms > (uint64_t)st->cfg.reconnect_max_ms)
            st->backoff_ms = (uint64_t)st->cfg.reconnect_max_ms;
    }
    shm_calls_fail_all(st, -ECONNRESET);
}

/* ---- writing ----------------------------------------------------------------- */

static void fail_soon(struct shm_tier *st, int e)
{
    st->fail_errno = e;
    ev_io_stop(st->base.env.loop, &st->wio);
    if (!ev_is_active(&st->fail_timer)) {
        ev_timer_set(&st->fail_timer, 0.0, 0.0);
        ev_timer_start(st->base.env.loop, &st->fail_timer);
    }
}

void shm_conn_flush(struct shm_tier *st)
{
    if (st->fd < 0 || (st->state != SHM_HELLO && st->state != SHM_CONNECTED))
        return;
    size_t sent = 0;
    int rc = proto_out_send(st->fd, &st->out, &sent);
    proto_buf_consume(&st->out, sent);
    if (rc < 0 && st->state == SHM_HELLO && (rc == -EPIPE || rc == -ECONNRESET)) {
        /* a server that refuses this peer closes at once, after a HELLO_ERR
         * saying why: the read watcher takes it (or the EOF) */
        st->out.len = 0;
        ev_io_stop(st->base.env.loop, &st->wio);
        return;
    }
    if (rc < 0) {
        fail_soon(st, -rc); /* never torn down inside a member */
        return;
    }
    if (st->out.len) { /* the socket is full: the write watcher sends the rest */
        if (!ev_is_active(&st->wio)) {
            ev_io_set(&st->wio, st->fd, EV_WRITE);
            ev_io_start(st->base.env.loop, &st->wio);
        }
        return;
    }
    ev_io_stop(st->base.env.loop, &st->wio);
}

static void on_fail_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct shm_tier *st = w->data;
    shm_conn_lost(st, strerror(st->fail_errno));
}

/* ---- reconnecting ------------------------------------------------------------ */

static void begin_hello(struct shm_tier *st)
{
    char err[256] = "cannot build HELLO";
    ev_io_stop(st->base.env.loop, &st->wio);
    if (shm_check_peer(st->fd, st->path, err, sizeof(err)) < 0 || shm_send_hello(st) < 0) {
        shm_conn_lost(st, err);
        return;
    }
    st->state = SHM_HELLO;
    ev_io_set(&st->rio, st->fd, EV_READ);
    ev_io_start(st->base.env.loop, &st->rio);
    arm_reconnect(st, (uint64_t)st->cfg.startup_timeout_ms); /* the handshake's bound */
    shm_conn_flush(st);
}

static void attempt(struct shm_tier *st)
{
    dir_watch(st); /* again, if the directory was removed and is back */
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", st->path);
    st->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    st->state = SHM_CONNECTING;
    if (st->fd >= 0 && connect(st->fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        begin_hello(st);
    } else if (st->fd >= 0 && errno == EINPROGRESS) {
        ev_io_set(&st->wio, st->fd, EV_WRITE);
        ev_io_start(st->base.env.loop, &st->wio);
        arm_reconnect(st, (uint64_t)st->cfg.startup_timeout_ms);
    } else if (st->fd >= 0 && (errno == EACCES || errno == EPERM)) {
        char why[512];
        shm_denied(st, -errno, why, sizeof(why));
        shm_conn_lost(st, why);
    } else {
        shm_conn_lost(st, strerror(errno));
    }
}

static void on_reconnect_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct shm_tier *st = w->data;
    if (st->state == SHM_DISCONNECTED) {
        st->by_dir = st->quick_armed; /* a backoff step, or a quick retry */
        st->quick_armed = false;
        attempt(st);
    } else if (st->state == SHM_CONNECTING || st->state == SHM_HELLO)
        shm_conn_lost(st, "no HELLO_OK within startup_timeout_ms");
}

static void on_writable(struct ev_loop *loop, ev_io *w, int revents)
{
    struct shm_tier *st = w->data;
    if (st->state != SHM_CONNECTING) {
        shm_conn_flush(st);
        return;
    }
    int e = 0;
    socklen_t len = sizeof(e);
    getsockopt(st->fd, SOL_SOCKET, SO_ERROR, &e, &len);
    if (e)
        shm_conn_lost(st, strerror(e));
    else
        begin_hello(st);
}

static void connected(struct shm_tier *st, bool same_pool)
{
    st->state = SHM_CONNECTED;
    st->epoch++;
    ev_timer_stop(st->base.env.loop, &st->reconnect_timer);
    uint64_t ms = (umbp_now_ns() - st->lost_ns) / 1000000ull;
    umbp_log(UMBP_LOG_WARN, "reconnected to umbp-server at %s after %llu ms (%s%s)", st->path,
             (unsigned long long)ms, !st->worker ? "no pool" : same_pool ? "same pool" : "new pool",
             st->by_dir ? "; socket appeared" : "");
    dir_unwatch(st);
    st->by_dir = false;
    st->backoff_ms = BACKOFF_MIN_MS;
    st->stats_timer.repeat = STATS_PERIOD_S;
    ev_timer_again(st->base.env.loop, &st->stats_timer);
    shm_stats_request(st, true);
}

/* A frame while HELLO_OK is awaited. */
static int hello_frame(struct shm_tier *st, const struct proto_frame *f, char *err,
                       size_t errlen)
{
    if (f->type == PROTO_EVENTS)
        return 0; /* from before this session counted; nothing to do */
    if (f->type != PROTO_HELLO_OK && f->type != PROTO_HELLO_ERR) {
        snprintf(err, errlen, "%s before HELLO_OK", proto_type_name(f->type));
        return -EPROTO;
    }
    bool same;
    int rc = shm_hello_reply(st, f, &same, err, errlen);
    if (rc == 0)
        connected(st, same);
    return rc;
}

/* ---- reading ------------------------------------------------------------------ */

/* Handles every whole frame in the buffer; -1 once the connection is gone. */
static int process_input(struct shm_tier *st)
{
    char err[320];
    for (;;) {
        struct proto_frame f;
        err[0] = 0;
        long r = shm_in_next(st, &f, err, sizeof(err));
        if (r == 0)
            return 0;
        char why[384];
        snprintf(why, sizeof(why), "malformed frame from the server: %s", err);
        int rc = r < 0 ? -EPROTO
                 : st->state == SHM_HELLO ? hello_frame(st, &f, why, sizeof(why))
                                          : shm_handle_frame(st, &f, why, sizeof(why));
        if (rc < 0) {
            shm_conn_lost(st, why);
            return -1;
        }
        if (st->state != SHM_CONNECTED)
            return -1; /* stopped from a done callback */
        shm_in_consume(st, r);
        if (st->pending_fd >= 0) {
            shm_conn_lost(st, "the server passed an fd outside HELLO_OK");
            return -1;
        }
    }
}

static void on_readable(struct ev_loop *loop, ev_io *w, int revents)
{
    struct shm_tier *st = w->data;
    if (process_input(st) < 0) /* bytes left over from the handshake */
        return;
    for (int i = 0; i < READS_PER_WAKEUP; i++) {
        long r = shm_in_read(st);
        if (r == -EAGAIN || r == -EINTR)
            return;
        if (r <= 0) {
            shm_conn_lost(st, r == 0 ? "the server closed the connection" : strerror((int)-r));
            return;
        }
        if (process_input(st) < 0)
            return;
    }
}

/* ---- setup ---------------------------------------------------------------------- */

/* Polls while calls are outstanding and answers are quick; a call older
 * than POLL_MAX_NS means a slow or stalled server, which the loop waits for
 * asleep (the watcher starts again with the next call). */
#define POLL_MAX_NS 2000000ull

static void on_poll(struct ev_loop *loop, ev_idle *w, int revents)
{
    struct shm_tier *st = w->data;
    (void)revents;
    if (!st->head || umbp_now_ns() - st->head->sent_ns > POLL_MAX_NS)
        ev_idle_stop(loop, w);
}

void shm_conn_init(struct shm_tier *st)
{
    ev_idle_init(&st->poll_w, on_poll);
    st->poll_w.data = st;
    st->may_spin = umbp_poll_wait_spins(st->base.env.core->poll_wait);
    st->fd = -1;
    st->pending_fd = -1;
    st->backoff_ms = BACKOFF_MIN_MS;
    st->ino_fd = st->ino_wd = -1;
    ev_io_init(&st->ino_w, on_dir_event, -1, EV_READ);
    st->ino_w.data = st;
    ev_io_init(&st->rio, on_readable, -1, EV_READ);
    ev_io_init(&st->wio, on_writable, -1, EV_WRITE);
    ev_init(&st->deadline_timer, shm_on_deadline);
    ev_init(&st->stats_timer, shm_on_stats_timer);
    ev_init(&st->reconnect_timer, on_reconnect_timer);
    ev_init(&st->fail_timer, on_fail_timer);
    st->rio.data = st->wio.data = st;
    st->deadline_timer.data = st->stats_timer.data = st;
    st->reconnect_timer.data = st->fail_timer.data = st;
}

void shm_conn_start(struct shm_tier *st)
{
    struct ev_loop *loop = st->base.env.loop;
    ev_io_set(&st->rio, st->fd, EV_READ);
    ev_io_start(loop, &st->rio);
    st->stats_timer.repeat = STATS_PERIOD_S;
    ev_timer_again(loop, &st->stats_timer);
    if (st->in_len > st->in_off)
        ev_feed_event(loop, &st->rio, EV_READ);
    shm_conn_flush(st);
}
