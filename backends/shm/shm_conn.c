/*
 * shm_conn.c - the tier's side of its connection to the umbp-server: what a
 * client session (net/session.h) asks of its owner, and the session's
 * driver on the runtime's loop (net/session_ev.h).
 *
 * Loop thread only (shm_conn_init and shm_conn_start run on the creating
 * thread, before the loop does).  The session owns the FIFO, deadlines,
 * reconnecting (a non-blocking connect, then HELLO and HELLO_OK on the same
 * watchers, bounded by startup_timeout_ms, retried with a backoff from 10 ms
 * to reconnect_max_ms) and the watch on socket_dir that finds a restarted
 * server within milliseconds of its socket appearing.  This file supplies
 * the HELLO, adopts HELLO_OK (the pool fd, shm_attach.c), logs the server
 * going and coming back, revokes the regions it granted when it goes, and
 * resumes the periodic STATS when it is back.  Losing the connection
 * completes every outstanding call with -ECONNRESET; the pool mapping
 * stays.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "shm.h"

#define STATS_PERIOD_S 0.2

/* ---- what the session asks of its owner --------------------------------------- */

static int conn_hello(struct net_session *s, char *err, size_t errlen)
{
    struct shm_tier *st = s->owner;
    int rc = shm_send_hello(st);
    if (rc < 0)
        snprintf(err, errlen, "cannot build HELLO");
    return rc;
}

static int conn_welcome(struct net_session *s, const struct proto_frame *f, int fd, char *err,
                        size_t errlen)
{
    struct shm_tier *st = s->owner;
    return shm_hello_reply(st, f, fd, &st->same_pool, err, errlen);
}

static void conn_up(struct net_session *s, uint64_t down_ms, bool by_dir)
{
    struct shm_tier *st = s->owner;
    st->epoch++;
    umbp_log(UMBP_LOG_WARN, "reconnected to umbp-server at %s after %llu ms (%s%s)", st->path,
             (unsigned long long)down_ms,
             !st->worker ? "no pool" : st->same_pool ? "same pool" : "new pool",
             by_dir ? "; socket appeared" : "");
    st->stats_timer.repeat = STATS_PERIOD_S;
    ev_timer_again(st->base.env.loop, &st->stats_timer);
    shm_stats_request(st, true);
    shm_ahead_kick(st);
}

static void conn_down(struct net_session *s, const char *why, bool was_connected, bool news)
{
    struct shm_tier *st = s->owner;
    ev_timer_stop(st->base.env.loop, &st->stats_timer);
    st->stats_inflight = 0;
    shm_ahead_drop(st, false); /* they were this session's */
    if (was_connected) {
        umbp_log(UMBP_LOG_WARN, "lost umbp-server at %s: %s; reconnecting", st->path, why);
        /* the server holds what it granted us only until our declared write
         * deadline; stop writing into it now (shm.h, SHM_WRITE_SLACK_MS) */
        if (st->worker && st->base.env.regions_revoked)
            st->base.env.regions_revoked(st->base.env.ctx);
    } else {
        umbp_log(news ? UMBP_LOG_WARN : UMBP_LOG_DEBUG,
                 "umbp-server at %s: reconnect failed: %s; retrying every %llu ms at most",
                 st->path, why, (unsigned long long)st->cfg.reconnect_max_ms);
    }
}

static const struct net_session_ops conn_ops = {
    .hello = conn_hello,
    .welcome = conn_welcome,
    .on_frame = shm_on_frame,
    .on_up = conn_up,
    .on_down = conn_down,
};

/* ---- what the driver asks ------------------------------------------------------------ */

static int conn_check_peer(void *ctx, int fd, char *err, size_t errlen)
{
    struct shm_tier *st = ctx;
    return shm_check_peer(fd, st->path, err, errlen);
}

static int conn_denied(void *ctx, int why, char *err, size_t errlen)
{
    return shm_denied(ctx, why, err, errlen);
}

/* ---- polling for replies ---------------------------------------------------------------- */

/* Polls while calls are outstanding and answers are quick; a call older
 * than POLL_MAX_NS means a slow or stalled server, which the loop waits for
 * asleep (the watcher starts again with the next call). */
#define POLL_MAX_NS 2000000ull

static void on_poll(struct ev_loop *loop, ev_idle *w, int revents)
{
    struct shm_tier *st = w->data;
    const struct net_call *c = net_session_oldest(&st->sess);
    (void)revents;
    if (!c || umbp_now_ns() - c->sent_ns > POLL_MAX_NS)
        ev_idle_stop(loop, w);
}

void shm_conn_poll(struct shm_tier *st)
{
    if (st->may_spin && !ev_is_active(&st->poll_w))
        ev_idle_start(st->base.env.loop, &st->poll_w);
}

/* ---- setup ---------------------------------------------------------------------------------- */

void shm_conn_init(struct shm_tier *st)
{
    const struct umbp_core_config *core = st->base.env.core;
    struct net_session_config sc = {
        .peer = "the server",
        .backoff_max_ms = (uint64_t)st->cfg.reconnect_max_ms,
        .hello_timeout_ms = (uint64_t)st->cfg.startup_timeout_ms,
        .hello_timeout_name = "startup_timeout_ms",
        /* the oldest unanswered frame (orphans too) says whether the server
         * keeps up: past lookup_timeout_ms it is stalled */
        .stall_ms = (uint64_t)core->lookup_timeout_ms,
    };
    net_session_init(&st->sess, &sc, &conn_ops, st);
    ev_idle_init(&st->poll_w, on_poll);
    st->poll_w.data = st;
    st->may_spin = umbp_poll_wait_spins(core->poll_wait);
    ev_init(&st->stats_timer, shm_on_stats_timer);
    st->stats_timer.data = st;
    st->drv.fd = -1;
}

/* The driver needs the socket's path (known after the config is read). */
static void driver_init(struct shm_tier *st)
{
    char dir[SHM_PATH_MAX];
    shm_config_socket_dir(&st->cfg, dir, sizeof(dir));
    snprintf(st->name, sizeof(st->name), "umbp-server at %s", st->path);
    struct net_ev_config dc = {
        .path = st->path,
        .dir = dir,
        .name = st->name,
        .check_peer = conn_check_peer,
        .denied = conn_denied,
        .ctx = st,
    };
    int fd = st->drv.fd;
    net_ev_init(&st->drv, &st->sess, st->base.env.loop, &dc);
    st->drv.fd = fd;
}

void shm_conn_start(struct shm_tier *st)
{
    int fd = st->drv.fd;
    driver_init(st);
    net_session_adopt(&st->sess, umbp_now_ns());
    net_ev_start(&st->drv, fd);
    st->stats_timer.repeat = STATS_PERIOD_S;
    ev_timer_again(st->base.env.loop, &st->stats_timer);
}

void shm_conn_stop_watchers(struct shm_tier *st)
{
    struct ev_loop *loop = st->base.env.loop;
    ev_timer_stop(loop, &st->stats_timer);
    ev_idle_stop(loop, &st->poll_w);
    if (st->drv.loop)
        net_ev_stop(&st->drv);
}
