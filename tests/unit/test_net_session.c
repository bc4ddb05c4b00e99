/*
 * test_net_session - the client session core (net/session.h) with no
 * socket: frames are built here and fed as bytes, time is advanced by
 * hand.  Every call's on_done runs exactly once (answered, UMBP_E_TIMEOUT,
 * -ECONNRESET, UMBP_E_NOT_ATTEMPTED), late replies go to on_late_reply,
 * the backoff doubles from 10 ms to its cap and quick retries follow the
 * socket appearing, health follows the connection and overdue replies, and
 * a broken stream drops the connection with the reason named.
 *
 * The poll() driver (net/session_poll.h) runs over real Unix sockets with a
 * fake server in a child process (stopped with SIGSTOP to stall it): calls
 * queued behind HELLO (queue_in_hello) answered, sessions run together
 * until done, a stalled peer's calls time out and its late replies are read
 * by a later run, a run begins no new attempt, and the blocking use (dial,
 * write all, read) meets a missing socket, a silent peer and EOF.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "session.h"
#include "session_poll.h"
#include "test_util.h"
#include "umbp/tier.h" /* umbp_now_ns */

#define MS 1000000ull
#define T0 (1000 * MS)

/* ---- a fake owner ---------------------------------------------------------------- */

struct owner {
    int hellos, ups, downs, events;
    bool last_was_connected, last_news, last_by_dir;
    char last_why[384];
    int welcome_rc;
    bool stop_on_timeout;       /* a done callback stops the session */
};

static int o_hello(struct net_session *s, char *err, size_t errlen)
{
    struct owner *o = s->owner;
    o->hellos++;
    return proto_put_empty(&s->out, PROTO_PING, s->next_seq++, 0); /* stands for HELLO */
}

static int o_welcome(struct net_session *s, const struct proto_frame *f, int fd, char *err,
                     size_t errlen)
{
    struct owner *o = s->owner;
    if (fd >= 0)
        close(fd);
    if (f->type == PROTO_HELLO_ERR) {
        snprintf(err, errlen, "refused");
        return -EACCES;
    }
    if (o->welcome_rc)
        snprintf(err, errlen, "welcome refused");
    return o->welcome_rc;
}

static int o_frame(struct net_session *s, const struct proto_frame *f, char *err, size_t errlen)
{
    struct owner *o = s->owner;
    if (f->type == PROTO_EVENTS) {
        o->events++;
        return 1;
    }
    if (f->type == PROTO_ERROR) {
        snprintf(err, errlen, "the server sent ERROR");
        return -ECONNRESET;
    }
    return 0;
}

static void o_up(struct net_session *s, uint64_t down_ms, bool by_dir)
{
    struct owner *o = s->owner;
    o->ups++;
    o->last_by_dir = by_dir;
}

static void o_down(struct net_session *s, const char *why, bool was_connected, bool news)
{
    struct owner *o = s->owner;
    o->downs++;
    o->last_was_connected = was_connected;
    o->last_news = news;
    snprintf(o->last_why, sizeof(o->last_why), "%s", why);
}

static const struct net_session_ops owner_ops = {
    .hello = o_hello, .welcome = o_welcome, .on_frame = o_frame, .on_up = o_up,
    .on_down = o_down,
};

/* ---- calls -------------------------------------------------------------------------- */

struct tcall {
    struct net_call nc;
    struct owner *o;
    int dones, status, replies, late, frees;
};

static int c_reply(struct net_call *nc, const struct proto_frame *f, char *err, size_t errlen)
{
    struct tcall *c = (struct tcall *)nc;
    cr_assert(!nc->orphan);
    c->replies++;
    return 0;
}

static int c_late(struct net_call *nc, const struct proto_frame *f, char *err, size_t errlen)
{
    struct tcall *c = (struct tcall *)nc;
    cr_assert(nc->orphan);
    c->late++;
    return 0;
}

static void c_done(struct net_call *nc, int status)
{
    struct tcall *c = (struct tcall *)nc;
    c->dones++;
    c->status = status;
    cr_assert_eq(c->frees, 0, "on_done after on_free");
    if (status == UMBP_E_TIMEOUT && c->o && c->o->stop_on_timeout)
        net_session_stop(nc->s);
}

static void c_free(struct net_call *nc) { ((struct tcall *)nc)->frees++; }

static const struct net_call_ops call_ops = {
    .on_reply = c_reply, .on_late_reply = c_late, .on_done = c_done, .on_free = c_free,
};

/* Pushes c: `frames` PING frames (requests) and a deadline ms from now. */
static void push(struct net_session *s, struct tcall *c, uint32_t frames, uint64_t now,
                 uint64_t deadline_ms)
{
    uint64_t first = s->next_seq;
    for (uint32_t i = 0; i < frames; i++)
        cr_assert_eq(proto_put_empty(&s->out, PROTO_PING, s->next_seq++, 0), 0);
    net_session_push(s, &c->nc, &call_ops, frames, first, now,
                     deadline_ms ? now + deadline_ms * MS : 0);
}

/* ---- feeding bytes ------------------------------------------------------------------------ */

static int feed(struct net_session *s, uint64_t now, const struct proto_buf *b, size_t off,
                size_t len, int fd)
{
    uint8_t *p;
    size_t room;
    cr_assert_eq(net_session_in_space(s, &p, &room), 0);
    cr_assert(room >= len);
    memcpy(p, b->data + off, len);
    return net_session_input(s, now, len, fd);
}

static int feed_pong(struct net_session *s, uint64_t now, uint64_t seq)
{
    struct proto_buf b = {0};
    cr_assert_eq(proto_put_empty(&b, PROTO_PONG, seq, 0), 0);
    int rc = feed(s, now, &b, 0, b.len, -1);
    proto_buf_free(&b);
    return rc;
}

static int feed_hello_ok(struct net_session *s, uint64_t now, uint64_t seq)
{
    struct proto_buf b = {0};
    struct proto_welcome w = {.version = PROTO_VERSION, .lease_ttl_ms = 1000, .pool_size = 4096,
                              .capacity_bytes = 4096};
    cr_assert_eq(proto_begin(&b, PROTO_HELLO_OK, seq, 1, 0), 0);
    cr_assert_eq(proto_put_welcome(&b, &w), 0);
    cr_assert_eq(proto_end(&b), 0);
    int rc = feed(s, now, &b, 0, b.len, -1);
    proto_buf_free(&b);
    return rc;
}

static void init(struct net_session *s, struct owner *o, uint64_t stall_ms, bool in_hello)
{
    memset(o, 0, sizeof(*o));
    struct net_session_config cfg = {.peer = "the server", .backoff_max_ms = 100,
                                     .hello_timeout_ms = 500,
                                     .hello_timeout_name = "startup_timeout_ms",
                                     .stall_ms = stall_ms, .queue_in_hello = in_hello};
    net_session_init(s, &cfg, &owner_ops, o);
}

static void setup(struct net_session *s, struct owner *o, uint64_t stall_ms)
{
    init(s, o, stall_ms, false);
    net_session_adopt(s, T0);
}

/* Drives one attempt that ends connected (HELLO out, HELLO_OK in). */
static void reconnect(struct net_session *s, uint64_t now)
{
    struct net_want w;
    net_session_want(s, &w);
    cr_assert(w.dial);
    net_session_dialing(s, now);
    net_session_connected(s, now);
    cr_assert_eq(s->state, NET_HELLO);
    net_session_want(s, &w);
    cr_assert(w.write && w.read);
    uint64_t hello_seq = s->next_seq - 1;
    net_session_wrote(s, s->out.len);
    cr_assert_eq(feed_hello_ok(s, now, hello_seq), 0);
    cr_assert_eq(s->state, NET_CONNECTED);
}

/* ---- tests ---------------------------------------------------------------------------------- */

Test(net_session, every_done_exactly_once)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 0);
    struct tcall a = {0}, b = {0}, c = {0}, d = {0}, e = {0};
    push(&s, &a, 2, T0, 100);       /* answered in two frames */
    push(&s, &b, 1, T0, 50);        /* times out, answered late */
    push(&s, &c, 1, T0, 1000);      /* connection lost */
    struct net_want w;
    net_session_want(&s, &w);
    cr_assert(w.write);
    cr_assert_eq(w.deadline_ns, T0 + 50 * MS, "the earliest deadline");
    net_session_wrote(&s, s.out.len);

    /* a's first reply split across two reads, then its second */
    struct proto_buf r = {0};
    cr_assert_eq(proto_put_empty(&r, PROTO_PONG, a.nc.first_seq, 0), 0);
    cr_assert_eq(feed(&s, T0 + MS, &r, 0, 5, -1), 0);
    cr_assert_eq(a.replies, 0, "half a frame is no reply");
    cr_assert_eq(feed(&s, T0 + MS, &r, 5, r.len - 5, -1), 0);
    proto_buf_free(&r);
    cr_assert_eq(a.replies, 1);
    cr_assert_eq(a.dones, 0);
    cr_assert_eq(feed_pong(&s, T0 + 2 * MS, a.nc.first_seq + 1), 0);
    cr_assert_eq(a.dones, 1);
    cr_assert_eq(a.status, 0);
    cr_assert_eq(a.frees, 1);

    /* b past its deadline: done(TIMEOUT) once, kept as an orphan */
    net_session_tick(&s, T0 + 49 * MS);
    cr_assert_eq(b.dones, 0);
    net_session_tick(&s, T0 + 50 * MS);
    cr_assert_eq(b.dones, 1);
    cr_assert_eq(b.status, UMBP_E_TIMEOUT);
    cr_assert_eq(b.frees, 0, "an orphan stays queued for its late reply");
    net_session_tick(&s, T0 + 60 * MS);
    cr_assert_eq(b.dones, 1);
    net_session_want(&s, &w);
    cr_assert_eq(w.deadline_ns, T0 + 1000 * MS, "an orphan's deadline is gone");
    cr_assert_eq(net_session_health(&s, T0 + 60 * MS), UMBP_E_NOT_ATTEMPTED,
                 "single flight while a reply is overdue");

    /* its late reply: on_late_reply, not on_reply nor on_done */
    cr_assert_eq(feed_pong(&s, T0 + 70 * MS, b.nc.first_seq), 0);
    cr_assert_eq(b.late, 1);
    cr_assert_eq(b.replies, 0);
    cr_assert_eq(b.dones, 1);
    cr_assert_eq(b.frees, 1);
    cr_assert_eq(net_session_health(&s, T0 + 70 * MS), 0);

    /* c: the connection is lost */
    net_session_lost(&s, T0 + 80 * MS, "Connection reset by peer");
    cr_assert_eq(c.dones, 1);
    cr_assert_eq(c.status, -ECONNRESET);
    cr_assert_eq(c.frees, 1);
    cr_assert(o.last_was_connected);

    /* pushed while disconnected: refused at once */
    push(&s, &d, 1, T0 + 81 * MS, 100);
    cr_assert_eq(d.dones, 1);
    cr_assert_eq(d.status, UMBP_E_NOT_ATTEMPTED);
    cr_assert_eq(d.frees, 1);

    /* back, then stopped with e outstanding */
    net_session_tick(&s, T0 + 90 * MS);
    reconnect(&s, T0 + 90 * MS);
    push(&s, &e, 1, T0 + 91 * MS, 100);
    net_session_stop(&s);
    cr_assert_eq(e.dones, 1);
    cr_assert_eq(e.status, UMBP_E_NOT_ATTEMPTED);
    cr_assert_eq(e.frees, 1);
    /* nothing runs twice afterwards */
    net_session_tick(&s, T0 + 500 * MS);
    net_session_lost(&s, T0 + 500 * MS, "late");
    cr_assert_eq(a.dones + b.dones + c.dones + d.dones + e.dones, 5);
    cr_assert_eq(a.frees + b.frees + c.frees + d.frees + e.frees, 5);
    net_session_destroy(&s);
}

Test(net_session, a_done_callback_may_stop_the_session)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 0);
    o.stop_on_timeout = true;
    struct tcall c[4];
    memset(c, 0, sizeof(c));
    for (int i = 0; i < 4; i++) {
        c[i].o = &o;
        push(&s, &c[i], 1, T0, i == 1 ? 10 : 100);
    }
    net_session_tick(&s, T0 + 10 * MS); /* c[1] times out, its done stops */
    cr_assert_eq(s.state, NET_STOPPED);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(c[i].dones, 1, "call %d: %d dones", i, c[i].dones);
        cr_assert_eq(c[i].frees, 1, "call %d: %d frees", i, c[i].frees);
        cr_assert_eq(c[i].status, i == 1 ? UMBP_E_TIMEOUT : UMBP_E_NOT_ATTEMPTED);
    }
    net_session_destroy(&s);
}

/* The time from now of the next attempt, after a failed one. */
static uint64_t next_retry_ms(struct net_session *s, uint64_t now)
{
    struct net_want w;
    net_session_want(s, &w);
    cr_assert_eq(s->state, NET_DISCONNECTED);
    cr_assert(w.deadline_ns > now);
    return (w.deadline_ns - now) / MS;
}

Test(net_session, backoff_doubles_to_its_cap_and_resets)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 0);
    uint64_t now = T0;
    net_session_lost(&s, now, "the server closed the connection");
    const uint64_t want[] = {10, 20, 40, 80, 100, 100};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        uint64_t ms = next_retry_ms(&s, now);
        cr_assert_eq(ms, want[i], "attempt %zu after %llu ms, want %llu", i,
                     (unsigned long long)ms, (unsigned long long)want[i]);
        net_session_tick(&s, now + ms * MS - 1);
        struct net_want w;
        net_session_want(&s, &w);
        cr_assert(!w.dial, "no attempt before the backoff is over");
        now += ms * MS;
        net_session_tick(&s, now);
        net_session_want(&s, &w);
        cr_assert(w.dial);
        cr_assert(w.watch_dir, "the directory is watched while disconnected");
        net_session_dialing(&s, now);
        net_session_lost(&s, now, strerror(ECONNREFUSED));
        cr_assert(!o.last_was_connected);
        cr_assert(!o.last_news, "no server there is not news");
    }
    /* a new reason is news, the same one again is not */
    now += next_retry_ms(&s, now) * MS;
    net_session_tick(&s, now);
    net_session_dialing(&s, now);
    net_session_lost(&s, now, "refused: uid");
    cr_assert(o.last_news);
    now += next_retry_ms(&s, now) * MS;
    net_session_tick(&s, now);
    net_session_dialing(&s, now);
    net_session_lost(&s, now, "refused: uid");
    cr_assert(!o.last_news);
    /* connected again: the backoff starts over */
    now += next_retry_ms(&s, now) * MS;
    net_session_tick(&s, now);
    reconnect(&s, now);
    cr_assert_eq(o.ups, 1);
    cr_assert(!o.last_by_dir);
    struct net_want w;
    net_session_want(&s, &w);
    cr_assert(!w.watch_dir);
    net_session_lost(&s, now, "the server closed the connection");
    cr_assert_eq(next_retry_ms(&s, now), 10);
    net_session_destroy(&s);
}

Test(net_session, the_socket_appearing_retries_quickly)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 0);
    uint64_t now = T0;
    net_session_lost(&s, now, "the server closed the connection");
    cr_assert_eq(next_retry_ms(&s, now), 10);
    net_session_appeared(&s, now + MS);
    struct net_want w;
    net_session_want(&s, &w);
    cr_assert(w.dial, "an attempt at once");
    now += MS;
    const uint64_t quick[] = {1, 2, 4, 20}; /* then the backoff where it was */
    for (size_t i = 0; i < 4; i++) {
        net_session_dialing(&s, now);
        net_session_lost(&s, now, strerror(ECONNREFUSED));
        uint64_t ms = next_retry_ms(&s, now);
        cr_assert_eq(ms, quick[i], "retry %zu after %llu ms", i, (unsigned long long)ms);
        now += ms * MS;
        net_session_tick(&s, now);
    }
    /* an attempt after the socket appeared that connects says so */
    net_session_dialing(&s, now);
    net_session_lost(&s, now, strerror(ECONNREFUSED));
    net_session_appeared(&s, now);
    reconnect(&s, now);
    cr_assert(o.last_by_dir);
    net_session_destroy(&s);
}

Test(net_session, health)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 50);
    cr_assert_eq(net_session_health(&s, T0), 0);
    struct tcall a = {0};
    push(&s, &a, 1, T0, 1000);
    cr_assert_eq(net_session_health(&s, T0 + 50 * MS), 0);
    cr_assert_eq(net_session_health(&s, T0 + 51 * MS), UMBP_E_NOT_ATTEMPTED,
                 "the oldest reply is overdue past stall_ms, before the call's deadline");
    cr_assert_eq(feed_pong(&s, T0 + 60 * MS, a.nc.first_seq), 0);
    cr_assert_eq(net_session_health(&s, T0 + 60 * MS), 0);
    net_session_lost(&s, T0 + 70 * MS, "gone");
    cr_assert_eq(net_session_health(&s, T0 + 70 * MS), UMBP_E_NOT_ATTEMPTED);
    net_session_stop(&s);
    cr_assert_eq(net_session_health(&s, T0 + 70 * MS), UMBP_E_NOT_ATTEMPTED);
    net_session_destroy(&s);
}

static int feed_waiting(struct net_session *s, uint64_t now, uint64_t seq, uint32_t ms)
{
    struct proto_buf b = {0};
    cr_assert_eq(proto_put_empty(&b, PROTO_WAITING, seq, ms), 0);
    int rc = feed(s, now, &b, 0, b.len, -1);
    proto_buf_free(&b);
    return rc;
}

/* A server that holds a request for the cluster says so (WAITING, its
 * bound in ms): the call counts as keeping up until stall_ms past that
 * bound, not stall_ms past its sending; WAITING is not a reply. */
Test(net_session, waiting_extends_health_to_the_servers_bound)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 50);
    struct tcall a = {0}, b = {0};
    push(&s, &a, 2, T0, 5000);
    push(&s, &b, 1, T0, 5000);
    cr_assert_eq(feed_pong(&s, T0 + 1 * MS, a.nc.first_seq), 0);
    /* the second frame of a waits: 300 ms from T0 + 10 ms */
    cr_assert_eq(feed_waiting(&s, T0 + 10 * MS, a.nc.first_seq + 1, 300), 0);
    cr_assert_eq(a.dones, 0, "WAITING answered the call");
    cr_assert_eq(net_session_health(&s, T0 + 200 * MS), 0, "stalled while the server waits");
    cr_assert_eq(net_session_health(&s, T0 + 360 * MS), 0);
    cr_assert_eq(net_session_health(&s, T0 + 361 * MS), UMBP_E_NOT_ATTEMPTED,
                 "stall_ms past the server's bound, still unanswered");
    cr_assert_eq(feed_pong(&s, T0 + 370 * MS, a.nc.first_seq + 1), 0);
    cr_assert_eq(a.dones, 1);
    cr_assert_eq(a.status, 0);
    /* b, the head now, was sent at T0 and never waited */
    cr_assert_eq(net_session_health(&s, T0 + 370 * MS), UMBP_E_NOT_ATTEMPTED);
    cr_assert_eq(feed_pong(&s, T0 + 371 * MS, b.nc.first_seq), 0);
    cr_assert_eq(net_session_health(&s, T0 + 371 * MS), 0);
    net_session_destroy(&s);
}

Test(net_session, a_waiting_about_another_reply_drops_the_connection)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 50);
    struct tcall a = {0}, b = {0};
    push(&s, &a, 1, T0, 1000);
    push(&s, &b, 1, T0, 1000);
    cr_assert_eq(feed_waiting(&s, T0, b.nc.first_seq, 100), -1, "b's reply is not due next");
    cr_assert(strstr(o.last_why, "WAITING has seq"), "%s", o.last_why);
    cr_assert_eq(a.status, -ECONNRESET);
    cr_assert_eq(b.status, -ECONNRESET);
    reconnect(&s, (net_session_tick(&s, T0 + 10 * MS), T0 + 10 * MS));
    cr_assert_eq(feed_waiting(&s, T0 + 11 * MS, 99, 100), -1);
    cr_assert(strstr(o.last_why, "nothing is outstanding"), "%s", o.last_why);
    /* a bound of 0 ms is malformed */
    reconnect(&s, (net_session_tick(&s, T0 + 40 * MS), T0 + 40 * MS));
    a = (struct tcall){0};
    push(&s, &a, 1, T0 + 41 * MS, 1000);
    struct proto_buf pb = {0};
    cr_assert_eq(proto_put_empty(&pb, PROTO_WAITING, a.nc.first_seq, 0), -EINVAL,
                 "the codec builds a WAITING of 0 ms");
    cr_assert_eq(proto_put_empty(&pb, PROTO_PONG, a.nc.first_seq, 0), 0);
    pb.data[4] = PROTO_WAITING; /* frame.type: a WAITING whose arg is 0 */
    cr_assert_eq(feed(&s, T0 + 42 * MS, &pb, 0, pb.len, -1), -1);
    cr_assert(strstr(o.last_why, "WAITING.arg"), "%s", o.last_why);
    proto_buf_free(&pb);
    net_session_destroy(&s);
}

Test(net_session, a_broken_stream_drops_the_connection_naming_why)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 0);
    struct tcall a = {0};
    push(&s, &a, 1, T0, 100);
    cr_assert_eq(feed_pong(&s, T0, a.nc.first_seq + 7), -1);
    cr_assert(strstr(o.last_why, "PONG has seq"), "%s", o.last_why);
    cr_assert_eq(a.dones, 1);
    cr_assert_eq(a.status, -ECONNRESET);

    reconnect(&s, (net_session_tick(&s, T0 + 10 * MS), T0 + 10 * MS));
    cr_assert_eq(feed_pong(&s, T0 + 11 * MS, 99), -1);
    cr_assert(strstr(o.last_why, "answers nothing outstanding"), "%s", o.last_why);

    reconnect(&s, (net_session_tick(&s, T0 + 40 * MS), T0 + 40 * MS));
    struct proto_buf b = {0};
    cr_assert_eq(proto_put_empty(&b, PROTO_PONG, 0, 0), 0);
    b.data[6] = 1; /* frame.flags */
    cr_assert_eq(feed(&s, T0 + 41 * MS, &b, 0, b.len, -1), -1);
    cr_assert(strstr(o.last_why, "malformed frame from the server: "), "%s", o.last_why);
    proto_buf_free(&b);

    reconnect(&s, (net_session_tick(&s, T0 + 90 * MS), T0 + 90 * MS));
    int p[2];
    cr_assert_eq(pipe(p), 0);
    close(p[1]);
    a = (struct tcall){0};
    push(&s, &a, 1, T0 + 91 * MS, 100);
    cr_assert_eq(proto_put_empty(&b, PROTO_PONG, a.nc.first_seq, 0), 0);
    cr_assert_eq(feed(&s, T0 + 91 * MS, &b, 0, b.len, p[0]), -1);
    cr_assert_str_eq(o.last_why, "the server passed an fd outside HELLO_OK");
    cr_assert_eq(fcntl(p[0], F_GETFD), -1, "the stray fd is closed");
    proto_buf_free(&b);

    reconnect(&s, (net_session_tick(&s, T0 + 200 * MS), T0 + 200 * MS));
    cr_assert_eq(net_session_input(&s, T0 + 201 * MS, 0, -1), -1);
    cr_assert_str_eq(o.last_why, "the server closed the connection");
    net_session_destroy(&s);
}

Test(net_session, the_handshake)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 0);
    net_session_lost(&s, T0, "the server closed the connection");
    uint64_t now = T0 + 10 * MS;
    net_session_tick(&s, now);
    net_session_dialing(&s, now);
    net_session_connected(&s, now);
    cr_assert_eq(o.hellos, 1);
    /* EVENTS before HELLO_OK go to the owner; a reply does not */
    struct proto_buf b = {0};
    cr_assert_eq(proto_put_empty(&b, PROTO_EVENTS, 0, 0), 0);
    cr_assert_eq(feed(&s, now, &b, 0, b.len, -1), 0);
    cr_assert_eq(o.events, 1);
    cr_assert_eq(s.state, NET_HELLO);
    proto_buf_free(&b);
    cr_assert_eq(feed_pong(&s, now, 5), -1);
    cr_assert_str_eq(o.last_why, "PONG before HELLO_OK");
    /* no HELLO_OK within the bound */
    now += next_retry_ms(&s, now) * MS;
    net_session_tick(&s, now);
    net_session_dialing(&s, now);
    net_session_connected(&s, now);
    net_session_tick(&s, now + 499 * MS);
    cr_assert_eq(s.state, NET_HELLO);
    net_session_tick(&s, now + 500 * MS);
    cr_assert_eq(s.state, NET_DISCONNECTED);
    cr_assert_str_eq(o.last_why, "no HELLO_OK within startup_timeout_ms");
    /* a refused welcome */
    now += 500 * MS;
    now += next_retry_ms(&s, now) * MS;
    net_session_tick(&s, now);
    o.welcome_rc = -EPROTO;
    net_session_dialing(&s, now);
    net_session_connected(&s, now);
    cr_assert_eq(feed_hello_ok(&s, now, s.next_seq - 1), -1);
    cr_assert_str_eq(o.last_why, "welcome refused");
    cr_assert_eq(o.ups, 0);
    net_session_destroy(&s);
}

/* A connection up - adopted after the caller's own handshake, or after
 * HELLO_OK - has room for a large request and its reply, so the first
 * ones grow no buffer (a realloc and page faults under the first store or
 * restore).  Fails with warm() undone. */
Test(net_session, a_connection_up_has_room_for_its_first_requests)
{
    struct net_session s;
    struct owner o;
    setup(&s, &o, 0);
    cr_expect_geq(s.out.cap - s.out.len, 64 * 1024, "adopted: output room %zu", s.out.cap);
    cr_expect_geq(s.in_cap - s.in_len, 64 * 1024, "adopted: input room %zu", s.in_cap);
    net_session_destroy(&s);

    setup(&s, &o, 0);
    net_session_lost(&s, T0, "the server closed the connection");
    proto_buf_free(&s.out); /* as a session that never warmed */
    uint64_t now = T0 + next_retry_ms(&s, T0) * MS;
    net_session_tick(&s, now);
    reconnect(&s, now);
    cr_expect_geq(s.out.cap - s.out.len, 64 * 1024, "after HELLO_OK: output room %zu",
                  s.out.cap);
    net_session_destroy(&s);
}

Test(net_session, calls_queued_behind_hello)
{
    struct net_session s;
    struct owner o;
    for (int in_hello = 0; in_hello < 2; in_hello++) {
        init(&s, &o, 0, in_hello);
        net_session_retry_now(&s, T0);
        net_session_tick(&s, T0);
        net_session_dialing(&s, T0);
        net_session_connected(&s, T0);
        cr_assert_eq(s.state, NET_HELLO);
        cr_assert_eq(net_session_health(&s, T0), in_hello ? 0 : UMBP_E_NOT_ATTEMPTED);
        uint64_t hello_seq = s.next_seq - 1;
        struct tcall a = {0}, b = {0};
        push(&s, &a, 1, T0, 50);
        cr_assert_eq(a.dones, in_hello ? 0 : 1);
        if (!in_hello) {
            cr_assert_eq(a.status, UMBP_E_NOT_ATTEMPTED, "pushed only while connected");
            net_session_destroy(&s);
            continue;
        }
        struct net_want w;
        net_session_want(&s, &w);
        cr_assert_eq(w.deadline_ns, T0 + 50 * MS, "the call's deadline, before HELLO's");
        net_session_tick(&s, T0 + 50 * MS);
        cr_assert_eq(a.status, UMBP_E_TIMEOUT, "a call's deadline runs in HELLO too");
        cr_assert_eq(net_session_health(&s, T0 + 50 * MS), UMBP_E_NOT_ATTEMPTED);
        push(&s, &b, 1, T0 + 51 * MS, 100);
        cr_assert_eq(feed_hello_ok(&s, T0 + 60 * MS, hello_seq), 0);
        cr_assert_eq(s.state, NET_CONNECTED);
        cr_assert_eq(feed_pong(&s, T0 + 60 * MS, a.nc.first_seq), 0);
        cr_assert_eq(a.late, 1);
        cr_assert_eq(feed_pong(&s, T0 + 60 * MS, b.nc.first_seq), 0);
        cr_assert_eq(b.status, 0);
        cr_assert_eq(b.replies, 1);
        /* refused: what waits behind HELLO fails with the connection */
        net_session_lost(&s, T0 + 70 * MS, "gone");
        net_session_tick(&s, T0 + 80 * MS);
        net_session_dialing(&s, T0 + 80 * MS);
        net_session_connected(&s, T0 + 80 * MS);
        struct tcall c = {0};
        push(&s, &c, 1, T0 + 80 * MS, 100);
        struct proto_buf e = {0};
        cr_assert_eq(proto_put_error_frame(&e, PROTO_HELLO_ERR, s.next_seq - 2, -EACCES, "no"),
                     0);
        cr_assert_eq(feed(&s, T0 + 81 * MS, &e, 0, e.len, -1), -1);
        proto_buf_free(&e);
        cr_assert_eq(c.dones, 1);
        cr_assert_eq(c.status, -ECONNRESET);
        net_session_destroy(&s);
    }
}

/* ---- the poll driver over a real socket ---------------------------------------------- */

/* A server in a child process: the first frame of a connection is its
 * HELLO (answered HELLO_OK), every later one is answered PONG. */
struct fake {
    pid_t pid;
    char dir[64], path[108];
};

static void fake_answer(int fd, const struct proto_frame *f, bool first)
{
    struct proto_buf b = {0};
    struct proto_welcome w = {.version = PROTO_VERSION, .lease_ttl_ms = 1000, .pool_size = 4096,
                              .capacity_bytes = 4096};
    if (first && (proto_begin(&b, PROTO_HELLO_OK, f->seq, 1, 0) < 0 ||
                  proto_put_welcome(&b, &w) < 0 || proto_end(&b) < 0))
        _exit(3);
    if (!first && proto_put_empty(&b, PROTO_PONG, f->seq, 0) < 0)
        _exit(3);
    if (write(fd, b.data, b.len) != (ssize_t)b.len)
        _exit(4);
    proto_buf_free(&b);
}

static void fake_serve(int lfd)
{
    struct pollfd p[9] = {{lfd, POLLIN, 0}};
    static uint8_t in[8][1 << 16];
    size_t len[8] = {0}, frames[8] = {0};
    nfds_t n = 1;
    for (;;) {
        if (poll(p, n, -1) < 0)
            continue;
        for (nfds_t i = 1; i < n; i++) {
            if (!p[i].revents)
                continue;
            ssize_t r = read(p[i].fd, in[i - 1] + len[i - 1], sizeof(in[0]) - len[i - 1]);
            if (r <= 0) {
                close(p[i].fd);
                p[i].fd = -1; /* ignored by poll from now on */
                continue;
            }
            len[i - 1] += (size_t)r;
            struct proto_frame f;
            char err[128];
            long used;
            while ((used = proto_frame_parse(in[i - 1], len[i - 1], false, &f, err,
                                             sizeof(err))) > 0) {
                fake_answer(p[i].fd, &f, frames[i - 1]++ == 0);
                memmove(in[i - 1], in[i - 1] + used, len[i - 1] - (size_t)used);
                len[i - 1] -= (size_t)used;
            }
        }
        if (p[0].revents && n < 9) {
            int fd = accept(lfd, NULL, NULL);
            if (fd >= 0)
                p[n++] = (struct pollfd){fd, POLLIN, 0};
        }
    }
}

static void fake_start(struct fake *f)
{
    snprintf(f->dir, sizeof(f->dir), "/tmp/umbp-ns-XXXXXX");
    cr_assert_not_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/s.sock", f->dir);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", f->path);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(lfd >= 0);
    cr_assert_eq(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(lfd, 16), 0);
    f->pid = fork();
    cr_assert(f->pid >= 0);
    if (f->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a failed test */
        fake_serve(lfd);
        _exit(0);
    }
    close(lfd);
}

static void fake_kill(struct fake *f)
{
    if (f->pid > 0) {
        kill(f->pid, SIGKILL);
        waitpid(f->pid, NULL, 0);
    }
    f->pid = 0;
}

static void fake_end(struct fake *f)
{
    fake_kill(f);
    unlink(f->path);
    rmdir(f->dir);
}

static void t_failed(void *ctx, enum net_poll_step step, int e, char *why, size_t whylen)
{
    (void)ctx;
    static const char *const steps[] = {"socket", "connect", "send", "recv"};
    snprintf(why, whylen, "%s: %s", steps[step], strerror(e));
}

struct many {
    struct tcall *c[2];
    struct net_session *s[2];
    enum net_state until_state;
};

static bool calls_done(void *arg)
{
    struct many *m = arg;
    return (!m->c[0] || m->c[0]->dones) && (!m->c[1] || m->c[1]->dones);
}

static bool states_reached(void *arg)
{
    struct many *m = arg;
    return m->s[0]->state == m->until_state && m->s[1]->state == m->until_state;
}

#define HANG_NS (20000 * MS) /* a bound against hanging only, never reached */

Test(net_session_poll, sessions_run_together_until_done_or_deadline, .timeout = 60)
{
    struct fake f;
    fake_start(&f);
    struct net_session s[2];
    struct owner o[2];
    struct net_poll d[2];
    struct net_poll *run[2] = {&d[0], &d[1]};
    struct pollfd pfd[2];
    uint64_t now = umbp_now_ns();
    for (int i = 0; i < 2; i++) {
        init(&s[i], &o[i], 0, i == 0); /* s[0] queues calls behind HELLO */
        struct net_poll_config pc = {.path = f.path, .failed = t_failed};
        net_poll_init(&d[i], &s[i], &pc);
        net_session_retry_now(&s[i], now);
        net_session_tick(&s[i], now);
    }
    /* the server stalled: the kernel accepts, HELLO_OK cannot come yet */
    tu_kill_wait(f.pid, SIGSTOP);
    cr_assert_eq(net_poll_run(run, 2, pfd, now, NULL, NULL), -ETIMEDOUT,
                 "until now: one round, no wait");
    cr_assert_eq(s[0].state, NET_HELLO);
    cr_assert_eq(s[1].state, NET_HELLO);
    struct tcall a = {0}, b = {0};
    push(&s[0], &a, 1, now, 0);
    /* an owner appends frames only where health allows; the push alone here */
    cr_assert_eq(net_session_health(&s[1], now), UMBP_E_NOT_ATTEMPTED);
    net_session_push(&s[1], &b.nc, &call_ops, 1, s[1].next_seq, now, 0);
    cr_assert_eq(a.dones, 0, "queued behind HELLO");
    cr_assert_eq(b.status, UMBP_E_NOT_ATTEMPTED, "refused: not connected");
    kill(f.pid, SIGCONT);
    struct many m = {{&a, NULL}, {&s[0], &s[1]}, NET_CONNECTED};
    cr_assert_eq(net_poll_run(run, 2, pfd, umbp_now_ns() + HANG_NS, calls_done, &m), 0);
    cr_assert_eq(a.status, 0);
    cr_assert_eq(a.replies, 1, "answered on the connection its HELLO opened");
    cr_assert_eq(net_poll_run(run, 2, pfd, umbp_now_ns() + HANG_NS, states_reached, &m), 0,
                 "%s / %s", o[0].last_why, o[1].last_why);
    cr_assert_eq(o[0].ups + o[1].ups, 2);

    /* both asked at once; the server stalls: both time out in one run */
    a = (struct tcall){0};
    b = (struct tcall){0};
    tu_kill_wait(f.pid, SIGSTOP);
    now = umbp_now_ns();
    push(&s[0], &a, 1, now, 30);
    push(&s[1], &b, 1, now, 30);
    m = (struct many){{&a, &b}, {&s[0], &s[1]}, NET_CONNECTED};
    cr_assert_eq(net_poll_run(run, 2, pfd, umbp_now_ns() + HANG_NS, calls_done, &m), 0);
    cr_assert_eq(a.status, UMBP_E_TIMEOUT);
    cr_assert_eq(b.status, UMBP_E_TIMEOUT);
    cr_assert_eq(net_session_health(&s[0], umbp_now_ns()), UMBP_E_NOT_ATTEMPTED,
                 "single flight while the late reply is due");
    /* resumed: runs that do not wait read the late replies */
    kill(f.pid, SIGCONT);
    uint64_t end = umbp_now_ns() + HANG_NS;
    while (a.late + b.late < 2) {
        cr_assert_lt(umbp_now_ns(), end, "the late replies never came: %d %d, states %d %d, orphans %zu %zu, out %zu %zu; %s", a.late, b.late, s[0].state, s[1].state, s[0].orphans, s[1].orphans, s[0].out.len, s[1].out.len, o[1].last_why);
        net_poll_run(run, 2, pfd, umbp_now_ns(), NULL, NULL);
        poll(NULL, 0, 1);
    }
    cr_assert_eq(a.dones + b.dones, 2, "a late reply is no second done");
    cr_assert_eq(net_session_health(&s[0], umbp_now_ns()), 0);

    /* the server dies: the call fails; a run then dials no more (the
     * owner ticks the next attempt) */
    fake_kill(&f);
    a = (struct tcall){0};
    push(&s[0], &a, 1, umbp_now_ns(), 0);
    m = (struct many){{&a, NULL}, {&s[0], &s[1]}, NET_CONNECTED};
    cr_assert_eq(net_poll_run(run, 1, pfd, umbp_now_ns() + HANG_NS, calls_done, &m), 0);
    cr_assert_eq(a.status, -ECONNRESET);
    cr_assert_eq(s[0].state, NET_DISCONNECTED);
    int hellos = o[0].hellos, downs = o[0].downs;
    cr_assert_eq(net_poll_run(run, 1, pfd, umbp_now_ns() + 50 * MS, NULL, NULL), -ETIMEDOUT);
    cr_assert_eq(o[0].downs, downs, "a run began an attempt by itself");
    cr_assert_eq(s[0].state, NET_DISCONNECTED);
    net_session_tick(&s[0], umbp_now_ns());
    cr_assert_eq(s[0].state, NET_CONNECTING);
    net_poll_run(run, 1, pfd, umbp_now_ns(), NULL, NULL);
    cr_assert_eq(s[0].state, NET_DISCONNECTED);
    cr_assert_eq(o[0].hellos, hellos);
    cr_assert_str_eq(o[0].last_why, "connect: Connection refused", "worded by the owner");
    for (int i = 0; i < 2; i++) {
        net_session_destroy(&s[i]);
        net_poll_close(&d[i]);
    }
    fake_end(&f);
}

Test(net_session_poll, the_blocking_use, .timeout = 60)
{
    struct fake f;
    fake_start(&f);
    struct net_session s;
    struct owner o;
    struct net_poll d;
    char why[256] = "";
    init(&s, &o, 0, false);
    struct net_poll_config pc = {.path = "/nonexistent/umbp/s.sock", .failed = t_failed};
    net_poll_init(&d, &s, &pc);
    cr_assert_eq(net_poll_dial(&d, 0, why, sizeof(why)), -ENOENT);
    cr_assert_str_eq(why, "connect: No such file or directory");
    pc.path = f.path;
    net_poll_init(&d, &s, &pc);
    cr_assert_eq(net_poll_dial(&d, 0, why, sizeof(why)), 0, "%s", why);
    for (int i = 0; i < 2; i++) {
        uint64_t seq = s.next_seq++;
        cr_assert_eq(proto_put_empty(&s.out, PROTO_PING, seq, 0), 0);
        cr_assert_eq(net_poll_write_all(&d, 0), 0);
        struct proto_frame fr;
        long used;
        char err[128];
        while ((used = net_session_in_next(&s, &fr, err, sizeof(err))) == 0)
            cr_assert_gt(net_poll_read(&d, 0), 0);
        cr_assert_gt(used, 0, "%s", err);
        cr_assert_eq(fr.type, i == 0 ? PROTO_HELLO_OK : PROTO_PONG);
        cr_assert_eq(fr.seq, seq);
        net_session_in_consume(&s, used);
    }
    tu_kill_wait(f.pid, SIGSTOP);
    cr_assert_eq(proto_put_empty(&s.out, PROTO_PING, s.next_seq++, 0), 0);
    cr_assert_eq(net_poll_write_all(&d, 0), 0);
    cr_assert_eq(net_poll_read(&d, umbp_now_ns() + 20 * MS), -ETIMEDOUT, "a silent peer");
    fake_kill(&f);
    long r = net_poll_read(&d, 0);
    cr_assert(r == 0 || r == -ECONNRESET, "the peer gone: %ld", r); /* RST: a PING unread */
    net_session_destroy(&s);
    net_poll_close(&d);
    fake_end(&f);
}
