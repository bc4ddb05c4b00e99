/*
 * service.c - one listening service of the wire protocol (see service.h):
 * accepting, each connection's buffers, deadlines and frame loop.
 *
 * Loop thread of the service's loop only.  The libev callbacks here are
 * the tops of the call chains: only they (and the owner's own callbacks)
 * call net_conn_close.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inbuf.h"
#include "service.h"
#include "util.h"

static void read_cb(struct ev_loop *loop, ev_io *w, int revents);
static void write_cb(struct ev_loop *loop, ev_io *w, int revents);
static void deadline_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void accept_cb(struct ev_loop *loop, ev_io *w, int revents);
static void accept_retry_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void read_update(struct net_conn *c);
static void deadline_update(struct net_conn *c, bool frame_done);
static void budget_leave(struct net_conn *c);

#define LOOP(c) ((c)->svc->p.loop)

size_t net_conn_backlog(const struct net_conn *c) { return c->out.len - c->out_off; }

static const char *conn_name(const struct net_conn *c, char *buf, size_t len)
{
    c->svc->p.ops->name(c, buf, len);
    return buf;
}

/* ---- the service ------------------------------------------------------------------- */

void net_service_init(struct net_service *s, const struct net_service_params *p)
{
    memset(s, 0, sizeof(*s));
    s->p = *p;
    s->listen_fd = -1;
    ev_io_init(&s->accept_w, accept_cb, -1, EV_READ);
    ev_timer_init(&s->accept_retry_w, accept_retry_cb, p->accept_retry_s, 0.0);
}

void net_service_start(struct net_service *s, int listen_fd)
{
    s->listen_fd = listen_fd;
    ev_io_set(&s->accept_w, listen_fd, EV_READ);
    ev_io_start(s->p.loop, &s->accept_w);
}

void net_service_stop_accepting(struct net_service *s)
{
    if (s->listen_fd < 0)
        return;
    ev_io_stop(s->p.loop, &s->accept_w);
    ev_timer_stop(s->p.loop, &s->accept_retry_w);
    s->listen_fd = -1;
}

void net_service_close_all(struct net_service *s, const char *why)
{
    while (s->conns) {
        snprintf(s->conns->why, sizeof(s->conns->why), "%s", why);
        net_conn_close(s->conns);
    }
}

/* ---- the shared-secret handshake (auth.h) -------------------------------------------- */

/* At accept: our nonce, the first bytes on the connection.  A failure to
 * send shows at the first read. */
static void challenge(struct net_conn *c)
{
    net_auth_nonce(c->auth_nonce);
    umbp_key_t sn;
    memcpy(sn.bytes, c->auth_nonce, NET_AUTH_BYTES);
    if (proto_begin(&c->out, PROTO_AUTH_CHALLENGE, 0, 1, 0) == 0) {
        proto_put_key(&c->out, &sn);
        proto_end(&c->out);
    }
    net_conn_flush(c);
}

static int refuse_auth(struct net_conn *c, const struct proto_frame *f, const char *msg)
{
    char name[96];
    umbp_log(UMBP_LOG_WARN, "%s: refused: %s", conn_name(c, name, sizeof(name)), msg);
    proto_put_error_frame(&c->out, PROTO_HELLO_ERR, f->seq, -EACCES, msg);
    snprintf(c->why, sizeof(c->why), "failed the shared-secret handshake");
    if (c->svc->p.ops->on_auth_failed)
        c->svc->p.ops->on_auth_failed(c);
    return NET_CLOSE;
}

/* The first frame of a connection to a service with a secret: AUTH with
 * the client's MAC over both nonces; AUTH_OK with ours back. */
static int auth_frame(struct net_conn *c, const struct proto_frame *f, char *what,
                      size_t whatlen)
{
    const struct net_auth_key *key = c->svc->p.auth;
    struct proto_auth a;
    if (f->type != PROTO_AUTH)
        return refuse_auth(c, f, "AUTH: missing; this service takes the shared-secret "
                           "handshake before HELLO (give the client the service's secret)");
    if (proto_get_auth(f, &a, what, whatlen) < 0)
        return -EPROTO;
    if (!net_auth_verify(key, false, c->auth_nonce, a.nonce, a.mac))
        return refuse_auth(c, f, "AUTH.mac: wrong shared secret (the client's secret file "
                           "differs from the service's)");
    umbp_key_t mac;
    net_auth_mac(key, true, c->auth_nonce, a.nonce, mac.bytes);
    int rc = proto_begin(&c->out, PROTO_AUTH_OK, f->seq, 1, 0);
    if (rc == 0)
        proto_put_key(&c->out, &mac);
    if (rc || (rc = proto_end(&c->out)) < 0) {
        snprintf(c->why, sizeof(c->why), "no memory for AUTH_OK");
        return rc;
    }
    c->authed = true;
    return 0;
}

/* ---- the input budget (in_budget) ------------------------------------------------------ */

static size_t in_over(const struct net_conn *c)
{
    size_t initial = c->svc->p.in_initial;
    return c->in_cap > initial ? c->in_cap - initial : 0;
}

/* The capacity the head frame needs, once its input is full: all of it at
 * once (so a connection that holds budget never needs more to finish its
 * frame, and waiting ones hold none of it: nobody waits on a waiter). */
static size_t frame_need(const struct net_conn *c)
{
    const size_t max = (size_t)PROTO_HDR_SIZE + PROTO_MAX_BODY;
    size_t need = c->in_cap * 2;
    if (c->in_len >= 4) {
        const uint8_t *h = c->in; /* the header's len: little-endian on the wire */
        uint32_t len = h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        if ((size_t)PROTO_HDR_SIZE + len > c->in_cap)
            need = (size_t)PROTO_HDR_SIZE + len;
    }
    return need > max ? max : need;
}

/* Connections waiting for budget, first come first served, get what they
 * need as long as it lasts (reserved: taken when they read next). */
static void budget_wake(struct net_service *s)
{
    struct net_conn *c;
    while ((c = s->starved_head)) {
        size_t extra = frame_need(c) - c->in_cap;
        if (s->in_over + extra > s->p.in_budget)
            return;
        s->starved_head = c->starved_next;
        if (!s->starved_head)
            s->starved_tail = NULL;
        c->starved_next = NULL;
        c->starved = false;
        c->in_reserved = extra;
        s->in_over += extra;
        read_update(c);
        deadline_update(c, false);
    }
}

/* c's input changed capacity from old_cap: the account, and waiters when
 * it shrank. */
static void in_account(struct net_conn *c, size_t old_cap)
{
    struct net_service *s = c->svc;
    size_t initial = s->p.in_initial, was = old_cap > initial ? old_cap - initial : 0;
    s->in_over = s->in_over - was + in_over(c);
    if (in_over(c) < was && s->starved_head)
        budget_wake(s);
}

/* A full input under in_budget: grows to what its frame needs (1), or the
 * connection waits for budget (0), or -ENOMEM. */
static int budget_grow(struct net_conn *c)
{
    struct net_service *s = c->svc;
    size_t need = frame_need(c), extra = need - c->in_cap;
    if (c->in_reserved) {
        s->in_over -= c->in_reserved; /* granted at its wake: now taken */
        c->in_reserved = 0;
    } else if (s->starved_head || s->in_over + extra > s->p.in_budget) {
        char name[96];
        uint64_t now = umbp_now_ns();
        c->starved = true;
        if (s->starved_tail)
            s->starved_tail->starved_next = c;
        else
            s->starved_head = c;
        s->starved_tail = c;
        s->starved_total++;
        if (!s->starved_logged_ns || now - s->starved_logged_ns > 60000000000ull) {
            s->starved_logged_ns = now;
            umbp_log(UMBP_LOG_WARN, "%s: its frame of %zu bytes waits: %s (%zu MiB) is held by "
                     "other connections' unfinished frames (%llu waited so far; logged at most "
                     "once a minute)", conn_name(c, name, sizeof(name)), need,
                     s->p.in_budget_option ? s->p.in_budget_option : "the input budget",
                     s->p.in_budget >> 20, (unsigned long long)s->starved_total);
        }
        read_update(c);
        deadline_update(c, false);
        return 0;
    }
    uint8_t *p = realloc(c->in, need);
    if (!p) {
        snprintf(c->why, sizeof(c->why), "no memory for its input");
        return -ENOMEM;
    }
    size_t old = c->in_cap;
    c->in = p;
    c->in_cap = need;
    in_account(c, old);
    return 1;
}

static void budget_leave(struct net_conn *c)
{
    struct net_service *s = c->svc;
    if (c->starved) {
        struct net_conn **pp = &s->starved_head, *prev = NULL;
        while (*pp != c) {
            prev = *pp;
            pp = &(*pp)->starved_next;
        }
        *pp = c->starved_next;
        if (s->starved_tail == c)
            s->starved_tail = prev;
        c->starved = false;
    }
    s->in_over -= in_over(c) + c->in_reserved;
    c->in_reserved = 0;
    if (s->starved_head)
        budget_wake(s);
}

/* ---- opening and closing ------------------------------------------------------------ */

struct net_conn *net_service_adopt(struct net_service *s, int fd, const struct ucred *cr)
{
    struct net_conn *c = calloc(1, s->p.conn_size);
    if (!c || !(c->in = malloc(s->p.in_initial))) {
        free(c);
        return NULL;
    }
    c->svc = s;
    c->fd = fd;
    c->pid = cr->pid;
    c->uid = cr->uid;
    c->gid = cr->gid;
    c->in_cap = s->p.in_initial;
    c->id = ++s->next_id;
    if (s->p.ops->on_open && s->p.ops->on_open(c) < 0) {
        free(c->in);
        free(c);
        return NULL;
    }
    ev_io_init(&c->rio, read_cb, fd, EV_READ);
    ev_io_init(&c->wio, write_cb, fd, EV_WRITE);
    ev_io_start(s->p.loop, &c->rio);
    ev_timer_init(&c->deadline_w, deadline_cb, (double)s->p.handshake_timeout_ms / 1000.0,
                  0.0);
    if (s->p.handshake_timeout_ms > 0)
        ev_timer_start(s->p.loop, &c->deadline_w);
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    if (s->p.tcp)
        net_tcp_peer_name(fd, c->peer, sizeof(c->peer));
    if (s->p.auth)
        challenge(c);
    return c;
}

void net_conn_close(struct net_conn *c)
{
    struct net_service *s = c->svc;
    s->p.ops->on_close(c);
    ev_io_stop(s->p.loop, &c->rio);
    budget_leave(c); /* may wake others: c is no longer read */
    ev_io_stop(s->p.loop, &c->wio);
    ev_timer_stop(s->p.loop, &c->deadline_w);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    proto_buf_free(&c->out);
    free(c->in);
    free(c);
}

/* ---- output -------------------------------------------------------------------------- */

/* Drops what was sent from the front of `out` once that is at least half
 * of it (so every byte moves at most about once), and gives a large
 * buffer back once it is empty. */
static void out_compact(struct net_conn *c)
{
    if (c->out_off == 0)
        return;
    if (c->out_off == c->out.len) {
        c->out_off = 0;
        if (c->out.cap > c->svc->p.out_keep)
            proto_buf_free(&c->out);
        else
            proto_buf_consume(&c->out, c->out.len);
    } else if (c->out_off >= c->out.len / 2) {
        proto_buf_consume(&c->out, c->out_off);
        c->out_off = 0;
    }
}

int net_conn_flush(struct net_conn *c)
{
    const struct net_service_params *p = &c->svc->p;
    int rc = proto_out_send(c->fd, &c->out, &c->out_off);
    if (rc < 0) {
        snprintf(c->why, sizeof(c->why), "send: %s", strerror(-rc));
        return rc;
    }
    out_compact(c);
    if (!net_conn_backlog(c)) {
        /* A paused connection whose output went out at once (its reader
         * drained it) is resumed by the write watcher (write_cb): with it
         * stopped, nothing would read that client again. */
        if (c->paused)
            ev_io_start(p->loop, &c->wio);
        else
            ev_io_stop(p->loop, &c->wio);
        return 0;
    }
    ev_io_start(p->loop, &c->wio);
    if (p->out_max && net_conn_backlog(c) > p->out_max) {
        char name[96];
        umbp_log(UMBP_LOG_WARN, "%s: output backlog of %zu bytes is over %zu MiB (the client "
                 "is not reading); disconnected", conn_name(c, name, sizeof(name)),
                 net_conn_backlog(c), p->out_max >> 20);
        snprintf(c->why, sizeof(c->why), "output backlog over %zu MiB", p->out_max >> 20);
        return -ENOBUFS;
    }
    return 0;
}

/* ---- deadlines ------------------------------------------------------------------------ */

/* After input was handled: the frame deadline runs while a greeted
 * connection's input holds a partial frame that the service is reading;
 * frame_done (a frame completed) restarts it for the next one.  Before
 * the handshake, the deadline set at connect runs on. */
static void deadline_update(struct net_conn *c, bool frame_done)
{
    const struct net_service_params *p = &c->svc->p;
    ev_timer *w = &c->deadline_w;
    if (!c->role)
        return;
    /* paused (its replies back up) or starved, a connection holding no
     * input budget waits on us; one holding some keeps its deadline, so that
     * a client that stops reading cannot keep the budget forever */
    if (!c->in_len || c->held || c->waiting || p->frame_timeout_ms <= 0 ||
        ((c->paused || c->starved) && !in_over(c))) {
        ev_timer_stop(p->loop, w);
        return;
    }
    if (ev_is_active(w) && !frame_done)
        return; /* the same frame is still arriving */
    ev_timer_stop(p->loop, w);
    ev_timer_set(w, (double)p->frame_timeout_ms / 1000.0, 0.0);
    ev_timer_start(p->loop, w);
}

static void deadline_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct net_conn *c = umbp_container_of(w, struct net_conn, deadline_w);
    (void)loop;
    (void)revents;
    c->svc->p.ops->on_timeout(c, !c->role);
    net_conn_close(c);
}

/* ---- frames ---------------------------------------------------------------------------- */

/* The socket is read unless the connection is paused, held, waiting or
 * starved of input budget. */
static void read_update(struct net_conn *c)
{
    if (c->paused || c->held || c->waiting || c->starved)
        ev_io_stop(LOOP(c), &c->rio);
    else
        ev_io_start(LOOP(c), &c->rio);
}

/* Ends the connection for a bad frame: the log line, the owner's counter,
 * an ERROR frame naming the field (best effort). */
static void malformed(struct net_conn *c, const char *what, int status)
{
    char name[96];
    umbp_log(UMBP_LOG_WARN, "%s: malformed frame: %s; disconnected",
             conn_name(c, name, sizeof(name)), what);
    if (c->svc->p.ops->on_malformed)
        c->svc->p.ops->on_malformed(c);
    proto_put_error_frame(&c->out, PROTO_ERROR, 0, status, what);
    snprintf(c->why, sizeof(c->why), "malformed frame");
}

/* Stops reading while the output is above out_pause. */
static bool pause_if_backlogged(struct net_conn *c)
{
    if (net_conn_backlog(c) <= c->svc->p.out_pause)
        return false;
    if (!c->was_paused) {
        char name[96];
        umbp_log(UMBP_LOG_INFO, "%s: sends faster than it reads; its requests wait while %zu "
                 "bytes of replies are unsent (logged once)", conn_name(c, name, sizeof(name)),
                 net_conn_backlog(c));
    }
    c->was_paused = true;
    c->paused = true;
    read_update(c);
    return true;
}

static void not_allowed(const struct net_conn *c, uint16_t type, char *what, size_t whatlen)
{
    char list[160] = "";
    for (uint16_t t = 0; t < NET_MAX_TYPES; t++)
        if (c->role->handlers[t]) {
            if (list[0])
                strncat(list, ", ", sizeof(list) - strlen(list) - 1);
            strncat(list, proto_type_name(t), sizeof(list) - strlen(list) - 1);
        }
    if (type == PROTO_HELLO)
        snprintf(what, whatlen, "frame.type: HELLO after the handshake (once per session)");
    else
        snprintf(what, whatlen, "frame.type: %s is not allowed for role %s (it may send %s)",
                 proto_type_name(type), c->role->name, list);
}

static int dispatch(struct net_conn *c, const struct proto_frame *f, uint32_t *budget,
                    char *what, size_t whatlen)
{
    const struct net_service_ops *ops = c->svc->p.ops;
    if (!c->role && c->svc->p.auth && !c->authed) {
        *budget -= 1;
        return auth_frame(c, f, what, whatlen);
    }
    if (!c->role) {
        *budget -= 1;
        return ops->on_hello(c, f, what, whatlen);
    }
    net_frame_fn h = f->type < NET_MAX_TYPES ? c->role->handlers[f->type] : NULL;
    if (!h) {
        not_allowed(c, f->type, what, whatlen);
        return -EPROTO;
    }
    if (ops->run)
        return ops->run(c, h, f, budget);
    *budget -= 1;
    return h(c, f);
}

/* A frame larger than what is left of this turn starts next turn, so
 * small frames are never cut. */
static bool turn_over(const struct net_conn *c, const struct proto_frame *f, uint32_t budget)
{
    uint32_t slice = c->svc->p.slice_records;
    return slice && (budget == 0 || (!c->frame_open && f->n > budget && budget < slice));
}

int net_conn_process(struct net_conn *c)
{
    const struct net_service_params *p = &c->svc->p;
    size_t pos = 0;
    uint32_t budget = p->slice_records ? p->slice_records : UINT32_MAX;
    bool more = false;
    int rc = 0;

    if (c->waiting) /* (output drained, more input): the open frame waits on */
        return net_conn_flush(c);
    while (rc == 0 && !pause_if_backlogged(c)) {
        struct proto_frame f;
        char what[PROTO_ERRMSG_MAX] = "";
        long n = proto_frame_parse(c->in + pos, c->in_len - pos, false, &f, what,
                                   sizeof(what));
        if (n == 0)
            break;
        if (n > 0 && turn_over(c, &f, budget)) {
            more = true;
            break;
        }
        if (n > 0) {
            rc = dispatch(c, &f, &budget, what, sizeof(what));
            c->frame_open = rc == NET_MORE || rc == NET_WAIT;
            if (rc == NET_WAIT) {
                rc = 0;
                c->waiting = true;
                break;
            }
            if (rc == NET_MORE) {
                rc = 0;
                more = true;
                break;
            }
            pos += (size_t)n;
        } else {
            rc = (int)n;
        }
        if (n < 0 || rc == -EPROTO || rc == -EMSGSIZE)
            /* a frame over PROTO_MAX_BODY says so (-EMSGSIZE), as protocol.md has it */
            malformed(c, what[0] ? what : "frame",
                      n == -EMSGSIZE || rc == -EMSGSIZE ? -EMSGSIZE : -EPROTO);
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    if (p->in_budget && !c->in_len && c->in_cap > p->in_initial) {
        size_t old = c->in_cap; /* given back at once: others may be waiting */
        proto_in_room(&c->in, 0, &c->in_cap, p->in_initial);
        in_account(c, old);
    }
    if ((pos || more) && p->ops->on_processed)
        p->ops->on_processed(c);
    if (more && rc == 0)
        p->ops->on_yield(c);
    read_update(c);
    deadline_update(c, pos > 0);
    int frc = net_conn_flush(c); /* the replies, and an ERROR or HELLO_ERR before a close */
    if (rc)
        return rc < 0 ? rc : -ECONNRESET; /* NET_CLOSE: why is set */
    return frc;
}

int net_conn_resume(struct net_conn *c)
{
    c->waiting = false;
    return net_conn_process(c);
}

/* ---- input ------------------------------------------------------------------------------ */

/* One non-blocking read.  1: got bytes; 0: none yet; < 0: end (why set). */
static int conn_read(struct net_conn *c)
{
    int rc = 0;
    if (c->svc->p.in_budget && c->in_len == c->in_cap) {
        if (!c->role) { /* an AUTH or a HELLO fits in_initial: take no budget for more */
            char what[96];
            snprintf(what, sizeof(what), "frame.len: a frame of more than %zu bytes before "
                     "HELLO", c->in_cap);
            malformed(c, what, -EPROTO);
            net_conn_flush(c); /* the ERROR, best effort */
            return -EPROTO;
        }
        if ((rc = budget_grow(c)) <= 0)
            return rc; /* waits for budget (0), or no memory */
    }
    size_t old = c->in_cap;
    rc = proto_in_room(&c->in, c->in_len, &c->in_cap, c->svc->p.in_initial);
    if (c->in_cap != old)
        in_account(c, old);
    if (rc < 0) {
        snprintf(c->why, sizeof(c->why), "no memory for its input");
        return rc;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (n > 0) {
        c->in_len += (size_t)n;
        return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    int e = n == 0 ? ECONNRESET : errno;
    if (n == 0)
        snprintf(c->why, sizeof(c->why), "disconnected");
    else
        snprintf(c->why, sizeof(c->why), "recv: %s", strerror(e));
    return -e;
}

static void read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct net_conn *c = umbp_container_of(w, struct net_conn, rio);
    (void)loop;
    (void)revents;
    int rc = conn_read(c);
    if (rc > 0)
        rc = net_conn_process(c);
    if (rc < 0)
        net_conn_close(c);
}

static void write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct net_conn *c = umbp_container_of(w, struct net_conn, wio);
    (void)loop;
    (void)revents;
    int rc = net_conn_flush(c);
    if (rc == 0 && c->paused && net_conn_backlog(c) < c->svc->p.out_resume) {
        c->paused = false;
        rc = net_conn_process(c); /* the frames that waited */
    }
    if (rc < 0)
        net_conn_close(c);
}

/* ---- accepting ---------------------------------------------------------------------------- */

static void refuse(struct net_service *s, int fd, const struct ucred *cr,
                   enum net_refusal why, int err)
{
    s->p.ops->on_refuse(s, fd, cr, why, err);
    close(fd);
}

static void accept_one(void *ctx, int fd)
{
    struct net_service *s = ctx;
    struct ucred cr = {.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1};
    int rc = s->p.tcp ? 0 : net_peer_check(fd, &s->p.peer, &cr);
    if (rc < 0 && rc != -EACCES)
        refuse(s, fd, NULL, NET_REFUSE_CRED, -rc);
    else if (rc == -EACCES)
        refuse(s, fd, &cr, NET_REFUSE_PEER, EACCES);
    else if (s->nconns >= s->p.max_conns)
        refuse(s, fd, &cr, NET_REFUSE_FULL, EUSERS);
    else if (!net_service_adopt(s, fd, &cr))
        refuse(s, fd, &cr, NET_REFUSE_NOMEM, ENOMEM);
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct net_service *s = umbp_container_of(w, struct net_service, accept_w);
    (void)revents;
    int rc = umbp_accept_batch(s->listen_fd, s->p.accept_batch, accept_one, s);
    if (rc < 0) {
        s->p.ops->on_accept_error(s, -rc, s->p.accept_retry_s);
        ev_io_stop(loop, &s->accept_w);
        ev_timer_start(loop, &s->accept_retry_w);
    }
}

static void accept_retry_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct net_service *s = umbp_container_of(w, struct net_service, accept_retry_w);
    (void)revents;
    if (s->listen_fd >= 0)
        ev_io_start(loop, &s->accept_w);
}
