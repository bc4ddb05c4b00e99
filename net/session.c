/*
 * session.c - one client connection, sans I/O (session.h): the FIFO of
 * calls, deadlines and orphans, the reconnect state machine and its
 * backoff, health.
 *
 * Owns: the connection's input and output bytes, the FIFO, the state.  The
 * driver owns the socket and tells this core what happened; the owner owns
 * each call's payload and tells the core nothing but frames and deadlines.
 * Every entry point takes the time as an argument (CLOCK_MONOTONIC ns), so
 * tests advance it by hand.
 *
 * Reentrancy: owner callbacks may push calls, flush or stop the session.
 * Each connection dropped bumps `gen`, and a walk over the FIFO or the input
 * stops when gen moved under it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inbuf.h"
#include "session.h"
#include "umbp/tier.h"

#define IN_CHUNK (64u * 1024u)
/* Output made ready, pages touched, each time a connection comes up: a
 * frame of 1,600 32-byte keys (a 25,600-token prefix's ACQUIRE) grows no
 * buffer and faults no page in under the request that sends it. */
#define OUT_WARM (64u * 1024u)

static uint64_t ms_ns(uint64_t ms) { return ms * 1000000ull; }

void net_session_init(struct net_session *s, const struct net_session_config *cfg,
                      const struct net_session_ops *ops, void *owner)
{
    memset(s, 0, sizeof(*s));
    s->cfg = *cfg;
    if (s->cfg.backoff_max_ms < NET_BACKOFF_MIN_MS)
        s->cfg.backoff_max_ms = NET_BACKOFF_MIN_MS;
    s->ops = ops;
    s->owner = owner;
    s->state = NET_DISCONNECTED;
    s->next_seq = 1;
    s->pending_fd = -1;
    s->backoff_ms = NET_BACKOFF_MIN_MS;
}

void net_session_destroy(struct net_session *s)
{
    struct net_call *c = s->head;
    s->head = s->tail = NULL;
    while (c) {
        struct net_call *next = c->next;
        c->ops->on_free(c);
        c = next;
    }
    if (s->pending_fd >= 0)
        close(s->pending_fd);
    s->pending_fd = -1;
    proto_buf_free(&s->out);
    free(s->in);
    s->in = NULL;
}

static void io_update(struct net_session *s)
{
    if (s->io.update)
        s->io.update(s->io.drv);
}

/* ---- the FIFO ----------------------------------------------------------------- */

static void call_finish(struct net_call *c, int status)
{
    if (!c->orphan)
        c->ops->on_done(c, status);
    c->ops->on_free(c);
}

static void fail_all(struct net_session *s, int rc)
{
    struct net_call *c = s->head;
    s->head = s->tail = NULL;
    s->orphans = 0;
    s->call_deadline_ns = 0;
    while (c) {
        struct net_call *next = c->next;
        call_finish(c, rc); /* may push calls: they see the new state */
        c = next;
    }
}

void net_session_push(struct net_session *s, struct net_call *c,
                      const struct net_call_ops *ops, uint32_t frames, uint64_t first_seq,
                      uint64_t now, uint64_t deadline_ns)
{
    *c = (struct net_call){.ops = ops, .s = s, .first_seq = first_seq, .frames = frames,
                           .sent_ns = now, .deadline_ns = deadline_ns};
    bool up = s->state == NET_CONNECTED || (s->state == NET_HELLO && s->cfg.queue_in_hello);
    if (!up || frames == 0) {
        call_finish(c, up ? 0 : UMBP_E_NOT_ATTEMPTED);
        return;
    }
    if (s->tail)
        s->tail->next = c;
    else
        s->head = c;
    s->tail = c;
    if (deadline_ns && (!s->call_deadline_ns || deadline_ns < s->call_deadline_ns))
        s->call_deadline_ns = deadline_ns;
    io_update(s);
}

void net_session_flush(struct net_session *s) { io_update(s); }

static struct net_call *fifo_pop(struct net_session *s)
{
    struct net_call *c = s->head;
    s->head = c->next;
    if (!s->head)
        s->tail = NULL;
    c->next = NULL;
    if (c->orphan)
        s->orphans--;
    return c;
}

/* ---- losing and regaining the connection ------------------------------------------ */

static void close_conn(struct net_session *s)
{
    s->gen++;
    if (s->io.close)
        s->io.close(s->io.drv);
    if (s->pending_fd >= 0)
        close(s->pending_fd);
    s->pending_fd = -1;
    s->out.len = 0; /* frames not yet written die with the connection */
    s->in_off = s->in_len = 0;
    s->dialing = false;
    s->hello_deadline_ns = 0;
    s->auth_wait = NET_AUTH_NONE;
}

static void schedule_retry(struct net_session *s, uint64_t now)
{
    if (s->quick_left > 0) { /* the socket appeared: the server may not listen yet */
        s->quick_left--;
        s->quick_armed = true;
        s->retry_ns = now + ms_ns(s->quick_ms);
        s->quick_ms *= 2;
        return;
    }
    s->quick_armed = false;
    s->retry_ns = now + ms_ns(s->backoff_ms);
    s->backoff_ms *= 2;
    if (s->backoff_ms > s->cfg.backoff_max_ms)
        s->backoff_ms = s->cfg.backoff_max_ms;
}

void net_session_lost(struct net_session *s, uint64_t now, const char *why)
{
    if (s->state == NET_STOPPED || s->state == NET_DISCONNECTED)
        return;
    bool was_connected = s->state == NET_CONNECTED, news = false;
    close_conn(s);
    s->state = NET_DISCONNECTED;
    if (was_connected) {
        s->lost_ns = now;
        s->backoff_ms = NET_BACKOFF_MIN_MS;
        s->last_why[0] = 0;
    } else {
        /* a new reason is news (a refusing server, say); the same one again,
         * or no server there yet, is only the outage going on */
        news = strncmp(why, s->last_why, sizeof(s->last_why) - 1) != 0 &&
               strcmp(why, strerror(ENOENT)) != 0 && strcmp(why, strerror(ECONNREFUSED)) != 0;
        snprintf(s->last_why, sizeof(s->last_why), "%s", why);
    }
    s->ops->on_down(s, why, was_connected, news);
    schedule_retry(s, now);
    fail_all(s, -ECONNRESET);
}

static void begin_attempt(struct net_session *s, bool by_dir)
{
    s->state = NET_CONNECTING;
    s->dialing = false;
    s->retry_ns = 0;
    s->by_dir = by_dir;
}

void net_session_appeared(struct net_session *s, uint64_t now)
{
    if (s->state != NET_DISCONNECTED)
        return;
    s->quick_left = NET_QUICK_RETRIES;
    s->quick_ms = 1;
    s->quick_armed = false;
    begin_attempt(s, true);
}

void net_session_retry_now(struct net_session *s, uint64_t now)
{
    if (s->state != NET_DISCONNECTED)
        return;
    s->retry_ns = now;
    io_update(s);
}

void net_session_dialing(struct net_session *s, uint64_t now)
{
    if (s->state != NET_CONNECTING)
        return;
    s->dialing = true;
    s->hello_deadline_ns = now + ms_ns(s->cfg.hello_timeout_ms);
}

void net_session_connected(struct net_session *s, uint64_t now)
{
    if (s->state != NET_CONNECTING)
        return;
    char err[256] = "cannot build HELLO";
    s->out.len = 0; /* nothing from before this connection goes out on it */
    if (s->cfg.auth) { /* HELLO waits for the server's challenge */
        s->auth_wait = NET_AUTH_CHALLENGE;
        s->state = NET_HELLO;
        s->hello_deadline_ns = now + ms_ns(s->cfg.hello_timeout_ms);
        return;
    }
    if (s->ops->hello(s, err, sizeof(err)) < 0) {
        net_session_lost(s, now, err);
        return;
    }
    s->state = NET_HELLO;
    s->hello_deadline_ns = now + ms_ns(s->cfg.hello_timeout_ms); /* the handshake's bound */
}

/* A connection is up: the output made ready (OUT_WARM) and the input's
 * room touched, so that the first requests fault no buffer page in.
 * Without memory they grow when needed instead. */
static void warm(struct net_session *s)
{
    proto_out_warm(&s->out, OUT_WARM);
    if (s->in)
        umbp_touch_pages(s->in + s->in_len, s->in_cap - s->in_len);
}

static void session_up(struct net_session *s, uint64_t now)
{
    warm(s);
    s->state = NET_CONNECTED;
    s->hello_deadline_ns = 0;
    s->was_up = true;
    bool by_dir = s->by_dir;
    s->by_dir = false;
    s->backoff_ms = NET_BACKOFF_MIN_MS;
    s->quick_left = 0;
    s->quick_armed = false;
    s->ops->on_up(s, (now - s->lost_ns) / 1000000ull, by_dir);
}

void net_session_adopt(struct net_session *s, uint64_t now)
{
    /* the handshake was the caller's: no input room yet */
    if (proto_in_reserve(&s->in, &s->in_off, &s->in_len, &s->in_cap, IN_CHUNK) == 0)
        warm(s);
    s->state = NET_CONNECTED;
    s->was_up = true;
    s->hello_deadline_ns = 0;
    s->retry_ns = 0;
    s->backoff_ms = NET_BACKOFF_MIN_MS;
    (void)now;
}

void net_session_stop(struct net_session *s)
{
    if (s->state == NET_STOPPED)
        return;
    close_conn(s);
    s->state = NET_STOPPED;
    fail_all(s, UMBP_E_NOT_ATTEMPTED);
}

/* ---- time --------------------------------------------------------------------------- */

static void expire_calls(struct net_session *s, uint64_t now)
{
    uint64_t gen = s->gen, next = 0;
    /* on_done may append calls (lowering call_deadline_ns itself) but
     * removes none unless the connection drops, which moves gen */
    s->call_deadline_ns = 0;
    for (struct net_call *c = s->head; c && s->gen == gen; c = c->next) {
        if (c->orphan || !c->deadline_ns)
            continue;
        if (c->deadline_ns > now) {
            next = !next || c->deadline_ns < next ? c->deadline_ns : next;
            continue;
        }
        c->orphan = true;
        s->orphans++;
        c->ops->on_done(c, UMBP_E_TIMEOUT);
    }
    if (s->gen == gen && next && (!s->call_deadline_ns || next < s->call_deadline_ns))
        s->call_deadline_ns = next;
}

void net_session_tick(struct net_session *s, uint64_t now)
{
    if (s->state == NET_DISCONNECTED && s->retry_ns && now >= s->retry_ns) {
        bool quick = s->quick_armed;
        s->quick_armed = false;
        begin_attempt(s, quick); /* a backoff step, or a quick retry */
    } else if ((s->state == NET_CONNECTING || s->state == NET_HELLO) && s->hello_deadline_ns &&
               now >= s->hello_deadline_ns) {
        char why[128];
        snprintf(why, sizeof(why), "no HELLO_OK within %s", s->cfg.hello_timeout_name);
        net_session_lost(s, now, why);
    } else if (s->state == NET_CONNECTED || s->state == NET_HELLO) {
        expire_calls(s, now); /* in HELLO: calls queued behind it (queue_in_hello) */
    }
}

void net_session_want(const struct net_session *s, struct net_want *w)
{
    bool live = s->state == NET_HELLO || s->state == NET_CONNECTED;
    *w = (struct net_want){
        .dial = s->state == NET_CONNECTING && !s->dialing,
        .read = live,
        .write = (s->state == NET_CONNECTING && s->dialing) ||
                 (live && s->out.len > 0 && s->auth_wait != NET_AUTH_CHALLENGE),
        .watch_dir = s->was_up && s->state != NET_CONNECTED && s->state != NET_STOPPED,
    };
    switch (s->state) {
    case NET_DISCONNECTED: w->deadline_ns = s->retry_ns; break;
    case NET_CONNECTING:
    case NET_HELLO:
        w->deadline_ns = s->hello_deadline_ns;
        if (s->call_deadline_ns && s->call_deadline_ns < w->deadline_ns)
            w->deadline_ns = s->call_deadline_ns; /* calls queued behind HELLO */
        break;
    case NET_CONNECTED: w->deadline_ns = s->call_deadline_ns; break;
    default: break;
    }
}

int net_session_health(const struct net_session *s, uint64_t now)
{
    if (s->state != NET_CONNECTED && !(s->state == NET_HELLO && s->cfg.queue_in_hello))
        return UMBP_E_NOT_ATTEMPTED;
    if (!s->cfg.stall_ms) /* single flight: nothing new while a reply is overdue */
        return s->orphans ? UMBP_E_NOT_ATTEMPTED : 0;
    /* the oldest unanswered frame (orphans too) says whether the peer keeps up */
    if (s->head) {
        const struct net_call *c = s->head;
        uint64_t from = c->wait_until_ns > c->sent_ns ? c->wait_until_ns : c->sent_ns;
        if (now > from && now - from > ms_ns(s->cfg.stall_ms))
            return UMBP_E_NOT_ATTEMPTED;
    }
    return 0;
}

/* ---- input ------------------------------------------------------------------------- */

int net_session_in_space(struct net_session *s, uint8_t **p, size_t *room)
{
    if (proto_in_reserve(&s->in, &s->in_off, &s->in_len, &s->in_cap, IN_CHUNK) < 0)
        return -ENOMEM;
    *p = s->in + s->in_len;
    *room = s->in_cap - s->in_len;
    return 0;
}

int net_session_in_commit(struct net_session *s, size_t n, int fd)
{
    s->in_len += n;
    if (fd >= 0 && s->pending_fd >= 0) {
        close(fd); /* only HELLO_OK carries an fd, once */
        return -EPROTO;
    }
    if (fd >= 0)
        s->pending_fd = fd;
    return 0;
}

long net_session_in_next(struct net_session *s, struct proto_frame *f, char *err,
                         size_t errlen)
{
    if (s->in_off == s->in_len)
        return 0; /* nothing (in may still be NULL: no pointer arithmetic on it) */
    return proto_frame_parse(s->in + s->in_off, s->in_len - s->in_off, true, f, err, errlen);
}

void net_session_in_consume(struct net_session *s, long bytes) { s->in_off += (size_t)bytes; }

/* AUTH_CHALLENGE: AUTH then HELLO go out ahead of the calls queued
 * behind the handshake (queue_in_hello). */
static int answer_challenge(struct net_session *s, const struct proto_frame *f, char *why,
                            size_t whylen)
{
    umbp_key_t sn;
    struct proto_auth a;
    if (!s->cfg.auth) {
        snprintf(why, whylen, "%s asks for the shared-secret handshake (AUTH_CHALLENGE) and "
                 "this client has no secret: configure the secret file", s->cfg.peer);
        return -EACCES;
    }
    if (s->auth_wait != NET_AUTH_CHALLENGE || proto_get_key(f, 0, &sn) < 0) {
        snprintf(why, whylen, "AUTH_CHALLENGE from %s out of turn", s->cfg.peer);
        return -EPROTO;
    }
    memcpy(s->auth_sn, sn.bytes, NET_AUTH_BYTES);
    net_auth_nonce(s->auth_cn);
    memcpy(a.nonce, s->auth_cn, NET_AUTH_BYTES);
    net_auth_mac(s->cfg.auth, false, s->auth_sn, s->auth_cn, a.mac);
    struct proto_buf queued = s->out;
    s->out = (struct proto_buf){0};
    int rc = proto_begin(&s->out, PROTO_AUTH, 0, 1, 0);
    if (rc == 0)
        proto_put_auth(&s->out, &a);
    if (rc == 0)
        rc = proto_end(&s->out);
    if (rc == 0)
        rc = s->ops->hello(s, why, whylen);
    if (rc == 0)
        rc = proto_buf_move(&s->out, &queued);
    proto_buf_free(&queued);
    if (rc < 0)
        return rc;
    s->auth_wait = NET_AUTH_OK;
    io_update(s);
    return 0;
}

static int check_auth_ok(struct net_session *s, const struct proto_frame *f, char *why,
                         size_t whylen)
{
    umbp_key_t mac;
    if (s->auth_wait != NET_AUTH_OK || proto_get_key(f, 0, &mac) < 0) {
        snprintf(why, whylen, "AUTH_OK from %s out of turn", s->cfg.peer);
        return -EPROTO;
    }
    if (!net_auth_verify(s->cfg.auth, true, s->auth_sn, s->auth_cn, mac.bytes)) {
        snprintf(why, whylen, "AUTH_OK.mac: %s does not hold our shared secret", s->cfg.peer);
        return -EACCES;
    }
    s->auth_wait = NET_AUTH_NONE;
    return 0;
}

/* A frame while HELLO_OK is awaited. */
static int hello_frame(struct net_session *s, uint64_t now, const struct proto_frame *f,
                       char *why, size_t whylen)
{
    if (f->type == PROTO_AUTH_CHALLENGE)
        return answer_challenge(s, f, why, whylen);
    if (f->type == PROTO_AUTH_OK)
        return check_auth_ok(s, f, why, whylen);
    if (f->type == PROTO_HELLO_OK && s->auth_wait != NET_AUTH_NONE) {
        snprintf(why, whylen, "HELLO_OK from %s before the shared-secret handshake ended",
                 s->cfg.peer);
        return -EPROTO;
    }
    if (f->type == PROTO_HELLO_OK || f->type == PROTO_HELLO_ERR) {
        int fd = s->pending_fd;
        s->pending_fd = -1;
        int rc = s->ops->welcome(s, f, fd, why, whylen);
        if (rc == 0)
            session_up(s, now);
        return rc;
    }
    int rc = s->ops->on_frame(s, f, why, whylen);
    if (rc == 0) {
        snprintf(why, whylen, "%s before HELLO_OK", proto_type_name(f->type));
        return -EPROTO;
    }
    return rc < 0 ? rc : 0;
}

static int reply(struct net_session *s, const struct proto_frame *f, char *err, size_t errlen)
{
    struct net_call *c = s->head;
    if (!c) {
        snprintf(err, errlen, "%s (seq %llu) answers nothing outstanding",
                 proto_type_name(f->type), (unsigned long long)f->seq);
        return -EPROTO;
    }
    if (f->seq != c->first_seq + c->answered) {
        snprintf(err, errlen, "%s has seq %llu, the next reply due is %llu",
                 proto_type_name(f->type), (unsigned long long)f->seq,
                 (unsigned long long)(c->first_seq + c->answered));
        return -EPROTO;
    }
    int rc = c->orphan ? c->ops->on_late_reply(c, f, err, errlen)
                       : c->ops->on_reply(c, f, err, errlen);
    if (rc < 0)
        return rc;
    if (++c->answered == c->frames)
        call_finish(fifo_pop(s), 0);
    return 0;
}

/* WAITING: the server holds the request whose reply is due next for the
 * cluster and answers it within arg ms. */
static int waiting(struct net_session *s, uint64_t now, const struct proto_frame *f, char *err,
                   size_t errlen)
{
    struct net_call *c = s->head;
    if (!c || f->seq != c->first_seq + c->answered) {
        snprintf(err, errlen, "WAITING has seq %llu, %s", (unsigned long long)f->seq,
                 c ? "not the reply due next" : "and nothing is outstanding");
        return -EPROTO;
    }
    uint64_t until = now + ms_ns(f->arg);
    if (until > c->wait_until_ns)
        c->wait_until_ns = until;
    return 0;
}

static int connected_frame(struct net_session *s, uint64_t now, const struct proto_frame *f,
                           char *why, size_t whylen)
{
    if (f->type == PROTO_WAITING)
        return waiting(s, now, f, why, whylen);
    int rc = s->ops->on_frame(s, f, why, whylen);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    return reply(s, f, why, whylen);
}

int net_session_process(struct net_session *s, uint64_t now)
{
    uint64_t gen = s->gen;
    char err[320];
    while (s->gen == gen && (s->state == NET_HELLO || s->state == NET_CONNECTED)) {
        struct proto_frame f;
        err[0] = 0;
        long r = net_session_in_next(s, &f, err, sizeof(err));
        if (r == 0)
            return 0;
        char why[384];
        snprintf(why, sizeof(why), "malformed frame from %s: %s", s->cfg.peer, err);
        int rc = r < 0 ? -EPROTO
                 : s->state == NET_HELLO ? hello_frame(s, now, &f, why, sizeof(why))
                                         : connected_frame(s, now, &f, why, sizeof(why));
        if (rc < 0) {
            net_session_lost(s, now, why);
            return -1;
        }
        if (s->gen != gen)
            return -1; /* dropped or stopped from a callback */
        net_session_in_consume(s, r);
        if (s->state == NET_CONNECTED && s->pending_fd >= 0) {
            snprintf(why, sizeof(why), "%s passed an fd outside HELLO_OK", s->cfg.peer);
            net_session_lost(s, now, why);
            return -1;
        }
    }
    return -1;
}

int net_session_input(struct net_session *s, uint64_t now, size_t n, int fd)
{
    if (n == 0) {
        char why[128];
        snprintf(why, sizeof(why), "%s closed the connection", s->cfg.peer);
        net_session_lost(s, now, why);
        return -1;
    }
    if (net_session_in_commit(s, n, fd) < 0) {
        net_session_lost(s, now, strerror(EPROTO));
        return -1;
    }
    return net_session_process(s, now);
}

void net_session_wrote(struct net_session *s, size_t n) { proto_buf_consume(&s->out, n); }
