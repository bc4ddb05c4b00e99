/*
 * session.c - one connected client: its socket, its input and output
 * buffers and the loop that turns bytes into frames into replies.
 *
 * Input is read without blocking into `in` (grown up to one largest frame)
 * and cut into frames by proto_frame_parse; whole frames are handled in
 * order (requests.c), up to SRV_SLICE_RECORDS records per loop turn, and
 * their replies appended to `out`, so replies leave in request order.  A
 * session with more to do than one turn allows (a large frame part
 * handled, or many frames) goes on the server's run queue and is not read
 * until the queue has given it turns enough (see Fairness in srv.h).
 * Output is written without blocking; the write watcher runs only while
 * some is left.  A client that sends faster than it reads is paused (its
 * socket is not read) while its output is above SRV_OUT_PAUSE, so its
 * replies cannot grow without bound.
 *
 * Its deadline timer (see Timeouts in srv.h) ends a session that has not
 * sent a whole HELLO within handshake_timeout_ms of connecting, or whose
 * partial frame has not completed within frame_timeout_ms.
 *
 * A session ends on EOF, a socket error, a malformed frame (an ERROR frame
 * naming the field goes out first, best effort), a backlog over SRV_OUT_MAX,
 * a refused HELLO or a deadline.  Whatever it still holds ends with it:
 * leases are released at once; reservations are orphaned - the key is free
 * again at once, the region only when its writer has provably stopped (its
 * declared write deadline, counted from the grant, has passed: the client
 * may be alive and still copying after its connection dropped), so a
 * client killed with -9 leaks nothing for longer than its deadline and a
 * live one never writes into a region handed to someone else.
 *
 * Loop thread only.  The libev callbacks here are the only callers of
 * session_close for I/O failures (see srv.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "inbuf.h"
#include "srv.h"
#include "util.h"


static void read_cb(struct ev_loop *loop, ev_io *w, int revents);
static void write_cb(struct ev_loop *loop, ev_io *w, int revents);
static void deadline_cb(struct ev_loop *loop, ev_timer *w, int revents);

size_t session_backlog(const struct srv_session *ss) { return ss->out.len - ss->out_off; }

/* ---- opening and closing ----------------------------------------------------- */

struct srv_session *session_open(struct umbp_server *s, int fd, pid_t pid, uid_t uid,
                                 gid_t gid)
{
    struct srv_session *ss = calloc(1, sizeof(*ss));
    if (!ss || !(ss->in = malloc(SRV_IN_INITIAL)) || track_init(&ss->reservations, true) < 0 ||
        track_init(&ss->leases, false) < 0)
        goto fail;
    ss->srv = s;
    ss->fd = fd;
    ss->pid = pid;
    ss->uid = uid;
    ss->gid = gid;
    ss->in_cap = SRV_IN_INITIAL;
    ss->id = ++s->next_session_id;
    ev_io_init(&ss->rio, read_cb, fd, EV_READ);
    ev_io_init(&ss->wio, write_cb, fd, EV_WRITE);
    ev_io_start(s->loop, &ss->rio);
    ev_timer_init(&ss->deadline_w, deadline_cb,
                  (double)s->cfg->opt.handshake_timeout_ms / 1000.0, 0.0);
    ev_timer_start(s->loop, &ss->deadline_w);
    ss->next = s->sessions;
    if (s->sessions)
        s->sessions->prev = ss;
    s->sessions = ss;
    s->nsessions++;
    umbp_log(UMBP_LOG_INFO, SESSION_FMT ": connected (uid %u gid %u)", SESSION_ARGS(ss),
             (unsigned)uid, (unsigned)gid);
    return ss;
fail:
    if (ss) {
        track_fini(&ss->leases);
        track_fini(&ss->reservations);
        free(ss->in);
        free(ss);
    }
    return NULL;
}

/* ---- the run queue ----------------------------------------------------------------- */

static void runq_push(struct srv_session *ss)
{
    struct umbp_server *s = ss->srv;
    ss->queued = true;
    ss->run_next = NULL;
    *s->runq_tail = ss;
    s->runq_tail = &ss->run_next;
    s->nrunq++;
    ev_idle_start(s->loop, &s->run_w);
}

static struct srv_session *runq_pop(struct umbp_server *s)
{
    struct srv_session *ss = s->runq;
    s->runq = ss->run_next;
    if (!s->runq)
        s->runq_tail = &s->runq;
    s->nrunq--;
    ss->queued = false;
    return ss;
}

/* Off the run queue (a walk: the queue is short, and a queued session
 * rarely closes), its deadline stopped, its partial reply and held events
 * freed: what session_close needs besides the rest. */
static void session_unschedule(struct srv_session *ss)
{
    struct umbp_server *s = ss->srv;
    if (ss->queued) {
        struct srv_session **p = &s->runq;
        while (*p != ss)
            p = &(*p)->run_next;
        *p = ss->run_next;
        if (s->runq_tail == &ss->run_next)
            s->runq_tail = p;
        s->nrunq--;
        ss->queued = false;
    }
    ev_timer_stop(s->loop, &ss->deadline_w);
    proto_buf_free(&ss->reply);
    proto_buf_free(&ss->held);
}

static int session_process(struct srv_session *ss);

/* One more slice for every session queued before this turn, in order;
 * those with work left queue again at the tail. */
static void run_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
    struct umbp_server *s = umbp_container_of(w, struct umbp_server, run_w);
    (void)revents;
    for (size_t n = s->nrunq; n && s->runq; n--) {
        struct srv_session *ss = runq_pop(s);
        if (session_process(ss) < 0)
            session_close(ss);
    }
    if (!s->runq)
        ev_idle_stop(loop, w);
}

void session_runq_init(struct umbp_server *s)
{
    s->runq = NULL;
    s->runq_tail = &s->runq;
    ev_idle_init(&s->run_w, run_cb);
    /* idle watchers of the highest priority run every turn, before the
     * sessions' I/O, and keep the loop from blocking while work is queued */
    ev_set_priority(&s->run_w, EV_MAXPRI);
}

void session_runq_stop(struct umbp_server *s) { ev_idle_stop(s->loop, &s->run_w); }

static void release_one(void *arg, uint64_t token, const umbp_key_t *key)
{
    uint64_t freed = 0;
    (void)key;
    dram_store_release(arg, token, &freed);
}

struct orphan_ctx {
    struct dram_store *store;
    uint64_t now;
};

static void orphan_one(void *arg, uint64_t token, const umbp_key_t *key)
{
    struct orphan_ctx *o = arg;
    dram_store_orphan(o->store, key, token, o->now);
}

void session_close(struct srv_session *ss)
{
    struct umbp_server *s = ss->srv;
    uint64_t leases = ss->leases.n, reservations = ss->reservations.n;

    struct orphan_ctx o = {s->store, umbp_now_ns()};
    track_drain(&ss->leases, release_one, s->store);
    track_drain(&ss->reservations, orphan_one, &o);
    umbp_log(UMBP_LOG_INFO, SESSION_FMT ": %s; released %llu leases; %llu unfinished "
             "reservations held until their writer's deadline (%llu ms after each grant)",
             SESSION_ARGS(ss), ss->why[0] ? ss->why : "closed", (unsigned long long)leases,
             (unsigned long long)reservations,
             (unsigned long long)(ss->write_deadline_ns / 1000000ull));
    if (ss->events)
        srv_events_unsubscribe(ss);
    ev_io_stop(s->loop, &ss->rio);
    ev_io_stop(s->loop, &ss->wio);
    session_unschedule(ss);
    close(ss->fd);
    if (ss->prev)
        ss->prev->next = ss->next;
    else
        s->sessions = ss->next;
    if (ss->next)
        ss->next->prev = ss->prev;
    s->nsessions--;
    track_fini(&ss->leases);
    track_fini(&ss->reservations);
    proto_buf_free(&ss->out);
    free(ss->in);
    free(ss);
}

/* ---- output ---------------------------------------------------------------------- */

/* Drops what was sent from the front of `out` once that is at least half
 * of it (so every byte moves at most about once), and gives a large
 * buffer back once it is empty. */
static void out_compact(struct srv_session *ss)
{
    if (ss->out_off == 0)
        return;
    if (ss->out_off == ss->out.len) {
        ss->out_off = 0;
        if (ss->out.cap > SRV_OUT_RESUME)
            proto_buf_free(&ss->out);
        else
            proto_buf_consume(&ss->out, ss->out.len);
    } else if (ss->out_off >= ss->out.len / 2) {
        proto_buf_consume(&ss->out, ss->out_off);
        ss->out_off = 0;
    }
}

int session_flush(struct srv_session *ss)
{
    struct umbp_server *s = ss->srv;

    int rc = proto_out_send(ss->fd, &ss->out, &ss->out_off);
    if (rc < 0) {
        snprintf(ss->why, sizeof(ss->why), "send: %s", strerror(-rc));
        return rc;
    }
    out_compact(ss);
    if (!session_backlog(ss)) {
        ev_io_stop(s->loop, &ss->wio);
        return 0;
    }
    ev_io_start(s->loop, &ss->wio);
    if (session_backlog(ss) > SRV_OUT_MAX) {
        umbp_log(UMBP_LOG_WARN, SESSION_FMT ": output backlog of %zu bytes is over %u MiB "
                 "(the client is not reading); disconnected", SESSION_ARGS(ss),
                 session_backlog(ss), SRV_OUT_MAX >> 20);
        snprintf(ss->why, sizeof(ss->why), "output backlog over %u MiB", SRV_OUT_MAX >> 20);
        return -ENOBUFS;
    }
    return 0;
}

int session_reply_done(struct srv_session *ss)
{
    int rc = proto_buf_move(&ss->out, &ss->reply);
    return rc ? rc : proto_buf_move(&ss->out, &ss->held);
}

/* ---- deadlines ------------------------------------------------------------------- */

/* After input was handled: the frame deadline runs while a greeted
 * session's input holds a partial frame that the server is reading;
 * frame_done (a frame completed) restarts it for the next one.  Before
 * HELLO, the handshake deadline set at connect runs on. */
static void deadline_update(struct srv_session *ss, bool frame_done)
{
    struct umbp_server *s = ss->srv;
    ev_timer *w = &ss->deadline_w;
    if (!ss->greeted)
        return;
    if (!ss->in_len || ss->paused || ss->queued) {
        ev_timer_stop(s->loop, w);
        return;
    }
    if (ev_is_active(w) && !frame_done)
        return; /* the same frame is still arriving */
    ev_timer_stop(s->loop, w);
    ev_timer_set(w, (double)s->cfg->opt.frame_timeout_ms / 1000.0, 0.0);
    ev_timer_start(s->loop, w);
}

static void deadline_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct srv_session *ss = umbp_container_of(w, struct srv_session, deadline_w);
    const struct srv_options *o = &ss->srv->cfg->opt;
    (void)loop;
    (void)revents;
    if (!ss->greeted) {
        umbp_log(UMBP_LOG_WARN, SESSION_FMT ": no HELLO within handshake_timeout_ms (%lld "
                 "ms; %zu bytes came); disconnected", SESSION_ARGS(ss),
                 (long long)o->handshake_timeout_ms, ss->in_len);
        snprintf(ss->why, sizeof(ss->why), "handshake_timeout_ms passed");
    } else {
        umbp_log(UMBP_LOG_WARN, SESSION_FMT ": a frame stayed incomplete for "
                 "frame_timeout_ms (%lld ms; %zu bytes of it came); disconnected",
                 SESSION_ARGS(ss), (long long)o->frame_timeout_ms, ss->in_len);
        snprintf(ss->why, sizeof(ss->why), "frame_timeout_ms passed");
    }
    session_close(ss);
}

/* ---- input ----------------------------------------------------------------------- */

/* The socket is read unless the session is paused or queued. */
static void read_update(struct srv_session *ss)
{
    if (ss->paused || ss->queued)
        ev_io_stop(ss->srv->loop, &ss->rio);
    else
        ev_io_start(ss->srv->loop, &ss->rio);
}

/* Ends the session for a bad frame: an ERROR frame naming the field, the
 * log line, the counter. */
static void malformed(struct srv_session *ss, const char *what)
{
    ss->srv->c.protocol_errors++;
    umbp_log(UMBP_LOG_WARN, SESSION_FMT ": malformed frame: %s; disconnected",
             SESSION_ARGS(ss), what);
    proto_put_error_frame(&ss->out, PROTO_ERROR, 0, -EPROTO, what);
    snprintf(ss->why, sizeof(ss->why), "malformed frame");
}

/* Stops reading while the output is above SRV_OUT_PAUSE. */
static bool pause_if_backlogged(struct srv_session *ss)
{
    if (session_backlog(ss) <= SRV_OUT_PAUSE)
        return false;
    if (!ss->was_paused)
        umbp_log(UMBP_LOG_INFO, SESSION_FMT ": sends faster than it reads; its requests wait "
                 "while %zu bytes of replies are unsent (logged once)", SESSION_ARGS(ss),
                 session_backlog(ss));
    ss->was_paused = true;
    ss->paused = true;
    read_update(ss);
    return true;
}

/* Handles the whole frames in `in`, up to SRV_SLICE_RECORDS records (a
 * frame part handled stays at the front of `in`, which is not read
 * meanwhile), queues the session if any are left, then flushes.  < 0: end
 * the session. */
static int session_process(struct srv_session *ss)
{
    size_t pos = 0;
    uint32_t budget = SRV_SLICE_RECORDS;
    bool more = false;
    int rc = 0;

    while (rc == 0 && !pause_if_backlogged(ss)) {
        struct proto_frame f;
        char what[PROTO_ERRMSG_MAX] = "";
        long n = proto_frame_parse(ss->in + pos, ss->in_len - pos, false, &f, what,
                                   sizeof(what));
        if (n == 0)
            break;
        /* a frame larger than what is left of this turn starts next turn,
         * so small frames are never cut */
        if (n > 0 && (budget == 0 || (!ss->batch.open && f.n > budget &&
                                      budget < SRV_SLICE_RECORDS))) {
            more = true;
            break;
        }
        if (n > 0) {
            ss->requests += !ss->batch.open;
            rc = srv_handle_frame(ss, &f, &budget, what, sizeof(what));
            if (rc == SRV_MORE) {
                rc = 0;
                more = true;
                break;
            }
            pos += (size_t)n;
        } else {
            rc = (int)n;
        }
        if (rc < 0)
            malformed(ss, what[0] ? what : "frame");
    }
    memmove(ss->in, ss->in + pos, ss->in_len - pos);
    ss->in_len -= pos;
    if (pos || more)
        srv_note_request(ss->srv);
    if (more && rc == 0)
        runq_push(ss);
    read_update(ss);
    deadline_update(ss, pos > 0);
    int frc = session_flush(ss);
    if (rc)
        return rc < 0 ? rc : -ECONNRESET; /* SRV_CLOSE: why is set */
    return frc;
}

/* Room for more input (proto_in_room). */
static int in_room(struct srv_session *ss)
{
    return proto_in_room(&ss->in, ss->in_len, &ss->in_cap, SRV_IN_INITIAL);
}

/* One non-blocking read.  1: got bytes; 0: none yet; < 0: end (why set). */
static int session_read(struct srv_session *ss)
{
    int rc = in_room(ss);
    if (rc < 0) {
        snprintf(ss->why, sizeof(ss->why), "no memory for its input");
        return rc;
    }
    ssize_t n = recv(ss->fd, ss->in + ss->in_len, ss->in_cap - ss->in_len, MSG_DONTWAIT);
    if (n > 0) {
        ss->in_len += (size_t)n;
        return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    int e = n == 0 ? ECONNRESET : errno;
    if (n == 0)
        snprintf(ss->why, sizeof(ss->why), "disconnected");
    else
        snprintf(ss->why, sizeof(ss->why), "recv: %s", strerror(e));
    return -e;
}

static void read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct srv_session *ss = umbp_container_of(w, struct srv_session, rio);
    (void)loop;
    (void)revents;
    int rc = session_read(ss);
    if (rc > 0)
        rc = session_process(ss);
    if (rc < 0)
        session_close(ss);
}

static void write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct srv_session *ss = umbp_container_of(w, struct srv_session, wio);
    (void)revents;
    int rc = session_flush(ss);
    (void)loop;
    if (rc == 0 && ss->paused && session_backlog(ss) < SRV_OUT_RESUME) {
        ss->paused = false;
        rc = session_process(ss); /* the frames that waited */
    }
    if (rc < 0)
        session_close(ss);
}
