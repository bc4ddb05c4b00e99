/*
 * test_net_service - a handler's NET_WAIT (net/service.h): a connection
 * whose frame waits on its owner's own work is not read and not handled
 * further, its frame deadline does not run, replies still leave in
 * request order once net_conn_resume runs the handler again, and a client
 * that goes away meanwhile reaches on_close, where the owner drops its
 * work.  A real service on one end of a Unix socket pair, its loop run
 * here; the other end is the client, whose frames are built with proto.h.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ev.h>

#include "proto.h"
#include "service.h"
#include "umbp/tier.h" /* umbp_now_ns */

struct conn {
    struct net_conn c; /* first */
};

/* the owner: one piece of work at a time, finished by a timer */
struct owner {
    struct ev_loop *loop;
    struct net_service svc;
    ev_timer work;            /* the work a LOOKUP waits for */
    struct net_conn *waiting; /* whose LOOKUP waits, NULL: none */
    bool work_done;
    int lookups_started, lookups_answered, pings, closes, timeouts;
    bool ping_before_work_done; /* a PING behind the LOOKUP was handled early */
};

static struct owner O;

static void o_name(const struct net_conn *c, char *buf, size_t len)
{
    snprintf(buf, len, "test connection %llu", (unsigned long long)c->id);
}

static void on_work(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
    struct net_conn *c = O.waiting;
    O.work_done = true;
    if (c && net_conn_resume(c) < 0)
        net_conn_close(c);
}

/* LOOKUP: starts the work and waits for it; once it is done, answers with
 * every key present. */
static int h_lookup(struct net_conn *c, const struct proto_frame *f)
{
    if (!O.work_done) {
        O.lookups_started++;
        O.waiting = c;
        ev_timer_set(&O.work, 0.2, 0.0);
        ev_timer_start(O.loop, &O.work);
        return NET_WAIT;
    }
    O.waiting = NULL;
    O.lookups_answered++;
    int rc = proto_begin(&c->out, PROTO_LOOKUP_R, f->seq, f->n, 0);
    for (uint32_t i = 0; rc == 0 && i < f->n; i++)
        rc = proto_put_u8(&c->out, 1);
    return rc ? rc : proto_end(&c->out);
}

static int h_ping(struct net_conn *c, const struct proto_frame *f)
{
    O.pings++;
    if (O.waiting || !O.work_done)
        O.ping_before_work_done = true;
    return proto_put_empty(&c->out, PROTO_PONG, f->seq, 0);
}

static const struct net_role role = {
    .name = "test", .handlers = {[PROTO_LOOKUP] = h_lookup, [PROTO_PING] = h_ping}};

static int o_hello(struct net_conn *c, const struct proto_frame *f, char *what, size_t len)
{
    (void)what;
    (void)len;
    c->role = &role;
    return proto_put_empty(&c->out, PROTO_PONG, f->seq, 0);
}

static void o_timeout(struct net_conn *c, bool handshake)
{
    (void)handshake;
    O.timeouts++;
    snprintf(c->why, sizeof(c->why), "frame timeout");
}

static void o_close(struct net_conn *c)
{
    O.closes++;
    if (O.waiting == c) { /* its work ends with it */
        ev_timer_stop(O.loop, &O.work);
        O.waiting = NULL;
    }
}

static void o_refuse(struct net_service *s, int fd, const struct ucred *cr, enum net_refusal why,
                     int err)
{
    (void)s, (void)fd, (void)cr, (void)why, (void)err;
}

static const struct net_service_ops ops = {
    .name = o_name, .on_hello = o_hello, .on_timeout = o_timeout, .on_close = o_close,
    .on_refuse = o_refuse};

static size_t out_pause_override; /* a test's out_pause (0: 1 MiB) */

/* A service with one connection: the server end of a socket pair. */
static int setup_service(int64_t frame_timeout_ms)
{
    memset(&O, 0, sizeof(O));
    O.loop = ev_loop_new(EVFLAG_AUTO);
    ev_timer_init(&O.work, on_work, 0.2, 0.0);
    struct net_service_params p = {
        .loop = O.loop, .ops = &ops, .owner = &O, .conn_size = sizeof(struct conn),
        .max_conns = 4, .accept_batch = 1, .accept_retry_s = 1, .in_initial = 4096,
        .out_pause = out_pause_override ? out_pause_override : 1 << 20,
        .out_resume = out_pause_override ? out_pause_override / 2 : 1 << 19, .out_keep = 1 << 16,
        .frame_timeout_ms = frame_timeout_ms};
    net_service_init(&O.svc, &p);
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    struct ucred cr = {getpid(), getuid(), getgid()};
    cr_assert_not_null(net_service_adopt(&O.svc, sv[0], &cr));
    return sv[1];
}

static void teardown_service(void)
{
    net_service_close_all(&O.svc, "test over");
    ev_timer_stop(O.loop, &O.work);
    ev_loop_destroy(O.loop);
}

static void send_all(int fd, struct proto_buf *b)
{
    size_t off = 0;
    while (off < b->len) {
        ssize_t n = write(fd, b->data + off, b->len - off);
        if (n < 0 && errno == EAGAIN) {
            poll(&(struct pollfd){fd, POLLOUT, 0}, 1, 100);
            continue;
        }
        cr_assert_gt(n, 0, "write: %s", strerror(errno));
        off += (size_t)n;
    }
    proto_buf_free(b);
}

/* Runs the loop until `want` reply frames arrived (or 5 s), recording
 * their types and seqs in order. */
static size_t collect(int fd, size_t want, uint16_t *types, uint64_t *seqs)
{
    static uint8_t in[1 << 16];
    static size_t len;
    size_t got = 0;
    uint64_t until = umbp_now_ns() + 5000000000ull;
    while (got < want && umbp_now_ns() < until) {
        ev_run(O.loop, EVRUN_NOWAIT);
        ssize_t n = read(fd, in + len, sizeof(in) - len);
        if (n > 0)
            len += (size_t)n;
        for (;;) {
            struct proto_frame f;
            char err[128];
            long m = proto_frame_parse(in, len, true, &f, err, sizeof(err));
            cr_assert_geq(m, 0, "a bad reply: %s", err);
            if (m == 0)
                break;
            types[got] = f.type;
            seqs[got] = f.seq;
            got++;
            memmove(in, in + m, len - (size_t)m);
            len -= (size_t)m;
        }
        poll(NULL, 0, 1);
    }
    return got;
}

static void put_lookup(struct proto_buf *b, uint64_t seq)
{
    umbp_key_t k;
    memset(&k, 7, sizeof(k));
    cr_assert_eq(proto_begin(b, PROTO_LOOKUP, seq, 1, 0), 0);
    cr_assert_eq(proto_put_key(b, &k), 0);
    cr_assert_eq(proto_end(b), 0);
}

Test(net_service, a_waiting_frame_holds_the_frames_behind_it_and_replies_keep_their_order)
{
    /* a frame deadline far shorter than the work: it must not run while
     * the connection waits */
    int fd = setup_service(50);
    struct proto_buf b = {0};
    cr_assert_eq(proto_put_empty(&b, PROTO_PING, 1, 0), 0); /* the "hello" */
    put_lookup(&b, 2);
    cr_assert_eq(proto_put_empty(&b, PROTO_PING, 3, 0), 0);
    put_lookup(&b, 4); /* a second wait, after the first one's reply */
    cr_assert_eq(proto_put_empty(&b, PROTO_PING, 5, 0), 0);
    send_all(fd, &b);

    uint16_t types[8];
    uint64_t seqs[8];
    /* the hello's reply, then nothing while the work runs */
    cr_assert_eq(collect(fd, 1, types, seqs), 1);
    cr_assert_eq(types[0], PROTO_PONG);
    cr_assert_eq(O.lookups_started, 1);
    cr_assert_eq(O.pings, 0, "a frame behind the waiting one was handled");

    size_t got = collect(fd, 4, types, seqs);
    cr_assert_eq(got, 4, "%zu of 4 replies after the work", got);
    uint16_t want_t[] = {PROTO_LOOKUP_R, PROTO_PONG, PROTO_LOOKUP_R, PROTO_PONG};
    uint64_t want_s[] = {2, 3, 4, 5};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(types[i], want_t[i], "reply %d: type %u", i, types[i]);
        cr_expect_eq(seqs[i], want_s[i], "reply %d: seq %llu", i, (unsigned long long)seqs[i]);
    }
    cr_expect_not(O.ping_before_work_done);
    cr_expect_eq(O.timeouts, 0, "the frame deadline ran while the connection waited");
    cr_expect_eq(O.closes, 0);
    cr_expect_eq(O.lookups_answered, 2);
    close(fd);
    teardown_service();
}

/* A service whose one connection greeted and sent a LOOKUP that waits on
 * the owner's work; the client's end. */
static int one_lookup_waiting(void)
{
    int fd = setup_service(0);
    struct proto_buf b = {0};
    cr_assert_eq(proto_put_empty(&b, PROTO_PING, 1, 0), 0);
    put_lookup(&b, 2);
    send_all(fd, &b);
    uint16_t types[4];
    uint64_t seqs[4];
    cr_assert_eq(collect(fd, 1, types, seqs), 1);
    return fd;
}

/* A client that sends faster than it reads is paused once its output is
 * over out_pause; when the flush at the end of that turn sends all of it
 * at once (the reader keeps up), the connection must still be resumed.
 * Before the fix the write watcher stopped with the connection paused and
 * the frames behind were never answered (test_server's pipelined test hung
 * once in CI). */
Test(net_service, a_paused_client_whose_output_went_out_at_once_is_resumed)
{
    out_pause_override = 64; /* a few replies */
    int fd = setup_service(0);
    struct proto_buf b = {0};
    enum { N = 200 };
    for (uint64_t i = 1; i <= N; i++)
        cr_assert_eq(proto_put_empty(&b, PROTO_PING, i, 0), 0);
    send_all(fd, &b);
    static uint16_t types[N];
    static uint64_t seqs[N];
    size_t got = collect(fd, N, types, seqs);
    cr_assert_eq(got, N, "%zu of %d replies: the paused connection was never resumed", got, N);
    for (size_t i = 0; i < N; i++)
        cr_expect_eq(seqs[i], i + 1, "reply %zu: seq %llu", i, (unsigned long long)seqs[i]);
    close(fd);
    teardown_service();
}

Test(net_service, a_client_gone_while_its_frame_waits_reaches_on_close)
{
    int fd = one_lookup_waiting();
    cr_assert_eq(O.lookups_started, 1);
    close(fd);
    /* the work finishes into a closed socket: the reply's write fails and
     * the connection ends (the service stopped reading it, so the close is
     * seen on the write) */
    uint64_t until = umbp_now_ns() + 5000000000ull;
    while (O.closes == 0 && umbp_now_ns() < until) {
        ev_run(O.loop, EVRUN_NOWAIT);
        poll(NULL, 0, 1);
    }
    cr_assert_eq(O.closes, 1, "the connection did not end");
    cr_assert_null(O.waiting);
    teardown_service();
}

Test(net_service, closing_every_connection_while_one_waits_drops_the_work)
{
    int fd = one_lookup_waiting();
    cr_assert_not_null(O.waiting);
    net_service_close_all(&O.svc, "stopping");
    cr_assert_eq(O.closes, 1);
    cr_assert_null(O.waiting);
    cr_assert_not(ev_is_active(&O.work), "the work outlived its connection");
    close(fd);
    teardown_service();
}
