/*
 * session.c - one connected client: its socket, its input and output
 * buffers and the loop that turns bytes into frames into replies.
 *
 * Input is read without blocking into `in` (grown up to one largest frame)
 * and cut into frames by proto_frame_parse; every whole frame is handled at
 * once (requests.c), in order, and its reply appended to `out`, so replies
 * leave in request order.  Output is written without blocking; the write
 * watcher runs only while some is left.  A client that sends faster than
 * it reads is paused (its socket is not read) while its output is above
 * SRV_OUT_PAUSE, so its replies cannot grow without bound.
 *
 * A session ends on EOF, a socket error, a malformed frame (an ERROR frame
 * naming the field goes out first, best effort), a backlog over SRV_OUT_MAX
 * or a refused HELLO.  Whatever it still holds ends with it: leases are
 * released at once; reservations are orphaned - the key is free again at
 * once, the region only when its writer has provably stopped (its declared
 * write deadline, counted from the grant, has passed: the client may be
 * alive and still copying after its connection dropped), so a client
 * killed with -9 leaks nothing for longer than its deadline and a live one
 * never writes into a region handed to someone else.
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

#include "srv.h"
#include "util.h"


static void read_cb(struct ev_loop *loop, ev_io *w, int revents);
static void write_cb(struct ev_loop *loop, ev_io *w, int revents);

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

/* ---- input ----------------------------------------------------------------------- */

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
    ev_io_stop(ss->srv->loop, &ss->rio);
    return true;
}

/* Handles every whole frame in `in`, then flushes.  < 0: end the session. */
static int session_process(struct srv_session *ss)
{
    size_t pos = 0;
    int rc = 0;

    while (rc == 0 && !pause_if_backlogged(ss)) {
        struct proto_frame f;
        char what[PROTO_ERRMSG_MAX] = "";
        long n = proto_frame_parse(ss->in + pos, ss->in_len - pos, false, &f, what,
                                   sizeof(what));
        if (n == 0)
            break;
        if (n > 0) {
            ss->requests++;
            rc = srv_handle_frame(ss, &f, what, sizeof(what));
            pos += (size_t)n;
        } else {
            rc = (int)n;
        }
        if (rc < 0)
            malformed(ss, what[0] ? what : "frame");
    }
    memmove(ss->in, ss->in + pos, ss->in_len - pos);
    ss->in_len -= pos;
    if (pos)
        srv_note_request(ss->srv);
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
    if (rc == 0 && ss->paused && session_backlog(ss) < SRV_OUT_RESUME) {
        ss->paused = false;
        ev_io_start(loop, &ss->rio);
        rc = session_process(ss); /* the frames that waited */
    }
    if (rc < 0)
        session_close(ss);
}
