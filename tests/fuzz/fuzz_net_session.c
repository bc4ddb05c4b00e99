/*
 * fuzz_net_session.c - libFuzzer target: a client session (net/session.c)
 * driven by a script that the input spells, with the server's bytes taken
 * from the input too: calls pushed with deadlines, raw bytes fed as the
 * server's stream (any bytes: frames, halves of frames, garbage), well-formed
 * replies and WAITING frames for the oldest call, time passing, the connection lost and made
 * again, the session stopped.  Properties, each an abort() when broken:
 *   - a call's on_done runs at most once while the session lives, and
 *     exactly once by the end of a stop; never after its on_free;
 *   - on_free runs exactly once per call (at the latest at destroy), and a
 *     call is never used after it;
 *   - on_reply only for a live call, on_late_reply only for an orphan;
 *   - a reply goes to the call whose seq range holds it (the FIFO head);
 *   - health is 0 or UMBP_E_NOT_ATTEMPTED after every step.
 * The owner's hooks are a minimal client's: HELLO is a PING, HELLO_OK is
 * accepted, EVENTS are consumed, ERROR drops the connection.
 *
 *   cmake -B build-fuzz -DCMAKE_C_COMPILER=clang -DUMBP_BUILD_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_net_session
 *   build-fuzz/tests/fuzz/fuzz_net_session -max_total_time=60 /tmp/c tests/fuzz/corpus/session
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "session.h"
#include "fuzz_check.h"


#define MS 1000000ull
#define MAX_CALLS 48

struct fcall {
    struct net_call nc;
    int dones, frees, replies, lates;
    bool pushed;
};

static struct fcall calls[MAX_CALLS];

/* ---- the owner ----------------------------------------------------------------- */

static int o_hello(struct net_session *s, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    return proto_put_empty(&s->out, PROTO_PING, s->next_seq++, 0);
}

static int o_welcome(struct net_session *s, const struct proto_frame *f, int fd, char *err,
                     size_t errlen)
{
    (void)s;
    if (fd >= 0)
        close(fd);
    if (f->type != PROTO_HELLO_OK) {
        snprintf(err, errlen, "refused");
        return -EACCES;
    }
    return 0;
}

static int o_frame(struct net_session *s, const struct proto_frame *f, char *err, size_t errlen)
{
    (void)s;
    if (f->type == PROTO_EVENTS)
        return 1;
    if (f->type == PROTO_ERROR) {
        snprintf(err, errlen, "ERROR from the server");
        return -ECONNRESET;
    }
    return 0;
}

static void o_up(struct net_session *s, uint64_t down_ms, bool by_dir)
{
    (void)s, (void)down_ms, (void)by_dir;
}

static void o_down(struct net_session *s, const char *why, bool was_connected, bool news)
{
    (void)s, (void)why, (void)was_connected, (void)news;
}

static const struct net_session_ops owner_ops = {
    .hello = o_hello, .welcome = o_welcome, .on_frame = o_frame, .on_up = o_up,
    .on_down = o_down,
};

/* ---- calls ------------------------------------------------------------------------ */

static int c_reply(struct net_call *nc, const struct proto_frame *f, char *err, size_t errlen)
{
    struct fcall *c = (struct fcall *)nc;
    (void)err, (void)errlen;
    FZ_CHECK(!nc->orphan && c->dones == 0 && c->frees == 0);
    FZ_CHECK(f->seq >= nc->first_seq && f->seq < nc->first_seq + nc->frames);
    c->replies++;
    return 0;
}

static int c_late(struct net_call *nc, const struct proto_frame *f, char *err, size_t errlen)
{
    struct fcall *c = (struct fcall *)nc;
    (void)err, (void)errlen;
    FZ_CHECK(nc->orphan && c->dones == 1 && c->frees == 0);
    FZ_CHECK(f->seq >= nc->first_seq && f->seq < nc->first_seq + nc->frames);
    c->lates++;
    return 0;
}

static void c_done(struct net_call *nc, int status)
{
    struct fcall *c = (struct fcall *)nc;
    FZ_CHECK(c->frees == 0);
    FZ_CHECK(status == 0 || status == UMBP_E_TIMEOUT || status == -ECONNRESET ||
          status == UMBP_E_NOT_ATTEMPTED);
    c->dones++;
    FZ_CHECK(c->dones == 1);
}

static void c_free(struct net_call *nc)
{
    struct fcall *c = (struct fcall *)nc;
    c->frees++;
    FZ_CHECK(c->frees == 1);
}

static const struct net_call_ops call_ops = {
    .on_reply = c_reply, .on_late_reply = c_late, .on_done = c_done, .on_free = c_free,
};

/* ---- the script ----------------------------------------------------------------- */

struct in {
    const uint8_t *p;
    size_t n;
};

static int take(struct in *in)
{
    if (!in->n)
        return -1;
    in->n--;
    return *in->p++;
}

static void feed(struct net_session *s, uint64_t now, const uint8_t *b, size_t len)
{
    while (len && s->state != NET_STOPPED && s->state != NET_DISCONNECTED) {
        uint8_t *p;
        size_t room;
        if (net_session_in_space(s, &p, &room) < 0)
            return;
        size_t m = len < room ? len : room;
        memcpy(p, b, m);
        b += m;
        len -= m;
        if (net_session_input(s, now, m, -1) < 0)
            return;
    }
}

static void feed_frame(struct net_session *s, uint64_t now, uint16_t type, uint64_t seq)
{
    struct proto_buf b = {0};
    if (type == PROTO_HELLO_OK) {
        struct proto_welcome w = {.version = PROTO_VERSION, .lease_ttl_ms = 1000,
                                  .pool_size = 4096, .capacity_bytes = 4096};
        if (proto_begin(&b, PROTO_HELLO_OK, seq, 1, 0) == 0 && proto_put_welcome(&b, &w) == 0 &&
            proto_end(&b) == 0)
            feed(s, now, b.data, b.len);
    } else if (proto_put_empty(&b, type, seq, 0) == 0) {
        feed(s, now, b.data, b.len);
    }
    proto_buf_free(&b);
}

/* Dial, connect, send HELLO, answer it. */
static void connect_again(struct net_session *s, uint64_t now)
{
    if (s->state == NET_DISCONNECTED)
        net_session_retry_now(s, now);
    if (s->state != NET_CONNECTING)
        return;
    net_session_dialing(s, now);
    net_session_connected(s, now);
    if (s->state != NET_HELLO)
        return;
    uint64_t hello_seq = s->next_seq - 1;
    net_session_wrote(s, s->out.len);
    feed_frame(s, now, PROTO_HELLO_OK, hello_seq);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct in in = {data, size};
    struct net_session s;
    struct net_session_config cfg = {.peer = "the server", .backoff_max_ms = 100,
                                     .hello_timeout_ms = 500,
                                     .hello_timeout_name = "startup_timeout_ms",
                                     .stall_ms = (size & 1) ? 50 : 0,
                                     .queue_in_hello = (size & 2) != 0};
    memset(calls, 0, sizeof(calls));
    net_session_init(&s, &cfg, &owner_ops, NULL);
    uint64_t now = 1000 * MS;
    net_session_adopt(&s, now);
    size_t ncalls = 0;
    int op;
    while ((op = take(&in)) >= 0 && s.state != NET_STOPPED) {
        switch (op % 8) {
        case 0: { /* push a call of 1-3 request frames, a deadline or none */
            int a = take(&in), d = take(&in);
            if (a < 0 || d < 0 || ncalls == MAX_CALLS)
                break;
            struct fcall *c = &calls[ncalls++];
            uint32_t frames = 1 + (uint32_t)a % 3;
            uint64_t first = s.next_seq;
            for (uint32_t i = 0; i < frames; i++)
                FZ_CHECK(proto_put_empty(&s.out, PROTO_PING, s.next_seq++, 0) == 0);
            c->pushed = true;
            net_session_push(&s, &c->nc, &call_ops, frames, first, now,
                             d % 4 ? now + (uint64_t)(d % 4) * 10 * MS : 0);
            break;
        }
        case 1: { /* raw bytes from the server */
            int len = take(&in);
            if (len < 0)
                break;
            size_t m = (size_t)len < in.n ? (size_t)len : in.n;
            feed(&s, now, in.p, m);
            in.p += m;
            in.n -= m;
            break;
        }
        case 2: /* a well-formed reply to the oldest call's next frame */
            if (s.head && s.state == NET_CONNECTED)
                feed_frame(&s, now, PROTO_PONG, s.head->first_seq + s.head->answered);
            break;
        case 3: { /* time passes */
            int ms = take(&in);
            if (ms < 0)
                break;
            now += (uint64_t)ms * MS;
            net_session_tick(&s, now);
            if (s.state == NET_CONNECTING && !s.dialing)
                connect_again(&s, now);
            break;
        }
        case 4: /* the connection goes */
            net_session_lost(&s, now, "fuzz: connection lost");
            break;
        case 5: /* and comes back */
            connect_again(&s, now);
            break;
        case 6: /* what the driver would write goes out */
            net_session_wrote(&s, s.out.len);
            break;
        case 7: { /* WAITING about the oldest call's next reply, 1-256 ms */
            int ms = take(&in);
            if (ms < 0 || !s.head || s.state != NET_CONNECTED)
                break;
            struct proto_buf b = {0};
            if (proto_put_empty(&b, PROTO_WAITING, s.head->first_seq + s.head->answered,
                                1 + (uint32_t)ms) == 0)
                feed(&s, now, b.data, b.len);
            proto_buf_free(&b);
            break;
        }
        }
        int h = net_session_health(&s, now);
        FZ_CHECK(h == 0 || h == UMBP_E_NOT_ATTEMPTED);
    }
    net_session_stop(&s);
    for (size_t i = 0; i < ncalls; i++)
        FZ_CHECK(calls[i].dones == 1);
    net_session_destroy(&s);
    for (size_t i = 0; i < ncalls; i++)
        FZ_CHECK(calls[i].frees == 1);
    return 0;
}
