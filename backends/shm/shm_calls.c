/*
 * shm_calls.c - the calls outstanding at the server: building their request
 * frames, applying their replies, and undoing late replies.
 *
 * Loop thread only.  A call is one tier member invocation: its items are
 * split into frames of at most PROTO_MAX_RECORDS, sent back to back with
 * consecutive sequence numbers, and usually followed by one STATS frame, so
 * usage() is fresh when done fires (it reports the server's counters with
 * no round trip of its own).  The session (net/session.h) matches replies
 * to calls in order and keeps the deadlines; each reply must be of the
 * expected type and count here, or the connection is dropped as broken.
 *
 * A call past its deadline completes at once (UMBP_E_TIMEOUT) and the
 * session keeps it as an orphan: its requests are forgotten (the runtime
 * may reuse them), its late replies consumed; a late grant is undone here
 * (ABORT of the reservations, RELEASE of the leases), using a copy of the
 * keys taken when it was orphaned.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shm.h"

#define FAST_STATS_S 0.01
#define SLOW_STATS_S 0.2

static uint64_t ms_ns(int64_t ms) { return (uint64_t)ms * 1000000ull; }

/* ---- calls ------------------------------------------------------------------ */

struct shm_call *shm_call_new(struct shm_tier *st, enum shm_kind kind,
                              struct umbp_tier_req *const *reqs, size_t n, umbp_tier_done_fn done,
                              void *arg)
{
    struct shm_call *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    if (n && !(c->reqs = malloc(n * sizeof(*c->reqs)))) {
        free(c);
        return NULL;
    }
    if (n && reqs)
        memcpy(c->reqs, reqs, n * sizeof(*c->reqs));
    c->st = st;
    c->kind = kind;
    c->n = n;
    c->done = done;
    c->arg = arg;
    return c;
}

void shm_call_free(struct shm_call *c)
{
    if (!c)
        return;
    free(c->reqs);
    free(c->keys);
    free(c->tokens);
    free(c);
}

/* A call whose frames could not be built: never queued. */
static void finish_unsent(struct shm_call *c, int rc)
{
    umbp_tier_done_fn done = c->done;
    void *arg = c->arg;
    shm_call_free(c);
    if (done)
        done(arg, rc);
}

/* ---- frames out -------------------------------------------------------------- */

static uint16_t request_type(enum shm_kind k)
{
    static const uint16_t t[] = {
        [SHM_LOOKUP] = PROTO_LOOKUP,   [SHM_RESERVE] = PROTO_RESERVE,
        [SHM_PUBLISH] = PROTO_PUBLISH, [SHM_ACQUIRE] = PROTO_ACQUIRE,
        [SHM_RELEASE] = PROTO_RELEASE, [SHM_CLEAR] = PROTO_CLEAR,
        [SHM_STATS] = PROTO_STATS,     [SHM_UNDO] = PROTO_RELEASE,
        [SHM_PUBLISH_AS] = PROTO_PUBLISH_AS,
    };
    return t[k];
}

static uint16_t reply_type(enum shm_kind k)
{
    static const uint16_t t[] = {
        [SHM_LOOKUP] = PROTO_LOOKUP_R,   [SHM_RESERVE] = PROTO_RESERVE_R,
        [SHM_PUBLISH] = PROTO_PUBLISH_R, [SHM_ACQUIRE] = PROTO_ACQUIRE_R,
        [SHM_RELEASE] = PROTO_RELEASE_R, [SHM_CLEAR] = PROTO_CLEAR_R,
        [SHM_STATS] = PROTO_STATS_R,     [SHM_UNDO] = PROTO_RELEASE_R,
        [SHM_PUBLISH_AS] = PROTO_PUBLISH_R,
    };
    return t[k];
}

static int put_item(struct proto_buf *b, const struct shm_call *c, size_t i)
{
    switch (c->kind) {
    case SHM_LOOKUP:
    case SHM_ACQUIRE:
        return proto_put_key(b, &c->reqs[i]->key);
    case SHM_RESERVE: {
        struct proto_reserve_item it = {c->reqs[i]->key, c->reqs[i]->size};
        return proto_put_reserve_item(b, &it);
    }
    case SHM_PUBLISH:
    case SHM_RELEASE: {
        struct proto_token_item it = {c->reqs[i]->key, c->reqs[i]->region.token};
        return proto_put_token_item(b, &it);
    }
    case SHM_UNDO: {
        struct proto_token_item it = {c->keys[i], c->tokens[i]};
        return proto_put_token_item(b, &it);
    }
    case SHM_PUBLISH_AS: {
        const struct umbp_tier_req *r = c->reqs[i];
        struct proto_rename_item it = {r->key, r->region.token, r->key};
        if (r->region.aux[1]) /* made ahead: reserved under its placeholder */
            shm_ahead_key(c->st, r->region.aux[1], &it.from);
        return proto_put_rename_item(b, &it);
    }
    default:
        return -EINVAL;
    }
}

/* Items per frame: PUBLISH_AS records are larger. */
static size_t frame_max(const struct shm_call *c)
{
    return c->kind == SHM_PUBLISH_AS ? PROTO_MAX_RENAME_RECORDS : PROTO_MAX_RECORDS;
}

static size_t frame_items(const struct shm_call *c, uint32_t frame)
{
    size_t base = (size_t)frame * frame_max(c);
    size_t left = c->n > base ? c->n - base : 0;
    return left < frame_max(c) ? left : frame_max(c);
}

/* Appends the call's frames to the session's output: how many. */
static int put_frames(struct shm_tier *st, struct shm_call *c, uint32_t arg, bool stats,
                      uint32_t *frames)
{
    struct proto_buf *out = &st->sess.out;
    bool items = c->kind != SHM_CLEAR && c->kind != SHM_STATS;
    c->data_frames = c->kind == SHM_STATS ? 0
                     : items ? (uint32_t)((c->n + frame_max(c) - 1) / frame_max(c))
                             : 1;
    *frames = c->data_frames + (stats ? 1 : 0);
    c->reply_type = reply_type(c->kind);
    for (uint32_t f = 0; f < c->data_frames; f++) {
        size_t cnt = frame_items(c, f), base = (size_t)f * frame_max(c);
        int rc = proto_begin(out, request_type(c->kind), st->sess.next_seq++, (uint32_t)cnt,
                             arg);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < cnt; i++)
            put_item(out, c, base + i); /* a failure sticks: proto_end says it */
        if ((rc = proto_end(out)) < 0)
            return rc;
    }
    return stats ? proto_put_empty(out, PROTO_STATS, st->sess.next_seq++, 0) : 0;
}

static const struct net_call_ops call_ops;

void shm_call_send(struct shm_tier *st, struct shm_call *c, uint32_t arg, bool trailing_stats)
{
    size_t len0 = st->sess.out.len;
    uint64_t seq0 = st->sess.next_seq;
    uint32_t frames = 0;
    int rc = put_frames(st, c, arg, trailing_stats, &frames);
    if (rc < 0) {
        st->sess.out.len = len0; /* drop the frames of this call built so far */
        st->sess.next_seq = seq0;
        umbp_log(UMBP_LOG_ERROR, "shm tier: cannot build a %s request of %zu items: %s",
                 proto_type_name(request_type(c->kind)), c->n, umbp_strerror(rc));
        finish_unsent(c, rc);
        return;
    }
    uint64_t now = umbp_now_ns(), deadline = 0;
    const struct umbp_core_config *core = st->base.env.core;
    if (c->done)
        deadline = now + ms_ns(c->kind == SHM_LOOKUP || c->kind == SHM_STATS
                                   ? core->lookup_timeout_ms
                                   : core->timeout_ms);
    if (trailing_stats && st->sess.state == NET_CONNECTED)
        st->stats_inflight++;
    shm_conn_poll(st);
    net_session_push(&st->sess, &c->nc, &call_ops, frames, seq0, now, deadline);
}

void shm_send_abort(struct shm_tier *st, const umbp_key_t *keys, const uint64_t *tokens,
                    size_t n)
{
    for (size_t base = 0; base < n; base += PROTO_MAX_RECORDS) {
        size_t cnt = n - base < PROTO_MAX_RECORDS ? n - base : PROTO_MAX_RECORDS;
        struct proto_buf *out = &st->sess.out;
        size_t len0 = out->len;
        int rc = proto_begin(out, PROTO_ABORT, st->sess.next_seq++, (uint32_t)cnt, 0);
        for (size_t i = 0; rc == 0 && i < cnt; i++) {
            struct proto_token_item it = {keys[base + i], tokens[base + i]};
            proto_put_token_item(out, &it); /* a failure sticks */
        }
        if (rc == 0)
            rc = proto_end(out);
        if (rc < 0) {
            out->len = len0;
            umbp_log(UMBP_LOG_WARN, "shm tier: cannot send ABORT of %zu reservations (%s); "
                     "the server drops them when this session ends", cnt, umbp_strerror(rc));
        }
    }
    net_session_flush(&st->sess);
}

/* ---- STATS --------------------------------------------------------------------- */

void shm_stats_request(struct shm_tier *st, bool force)
{
    if (st->sess.state != NET_CONNECTED || (st->stats_inflight && !force))
        return;
    struct shm_call *c = shm_call_new(st, SHM_STATS, NULL, 0, NULL, NULL);
    if (c)
        shm_call_send(st, c, 0, true);
}

void shm_on_stats_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct shm_tier *st = w->data;
    bool fast = umbp_now_ns() < st->fast_stats_until_ns;
    shm_stats_request(st, false);
    w->repeat = fast ? FAST_STATS_S : SLOW_STATS_S;
    ev_timer_again(loop, w);
}

/* A reserve met a full pool: the server evicts on its own, so puts waiting
 * for room learn of freed space only from STATS; ask often for a while. */
static void want_fast_stats(struct shm_tier *st)
{
    st->fast_stats_until_ns = umbp_now_ns() + ms_ns(st->base.env.core->put_wait_ms);
    if (st->stats_timer.repeat > FAST_STATS_S && ev_is_active(&st->stats_timer)) {
        st->stats_timer.repeat = FAST_STATS_S;
        ev_timer_again(st->base.env.loop, &st->stats_timer);
    }
}

static int apply_stats(struct shm_tier *st, const struct proto_frame *f, char *err,
                       size_t errlen)
{
    struct proto_stats s;
    if (proto_get_stats(f, &s) < 0) {
        snprintf(err, errlen, "STATS_R unreadable");
        return -EPROTO;
    }
    bool freed = st->have_stats &&
                 (s.used_bytes < st->stats.used_bytes || s.evictions > st->stats.evictions);
    st->stats = s;
    st->have_stats = true;
    if (st->stats_inflight)
        st->stats_inflight--;
    if (freed && st->base.env.space_freed)
        st->base.env.space_freed(st->base.env.ctx);
    return 0;
}

/* ---- replies in ---------------------------------------------------------------- */

/* region.aux[1] of a lease: a time before which the server's lease is
 * certainly still active (it began after the request was sent and lasts
 * the ttl asked for, capped by the server's), less a tenth as a margin. */
static uint64_t lease_valid_until(const struct shm_tier *st, const struct shm_call *c)
{
    if (c->kind != SHM_ACQUIRE)
        return 0;
    uint64_t ms = c->lease_ns / 1000000ull;
    if (st->server_lease_ms && st->server_lease_ms < ms)
        ms = st->server_lease_ms;
    uint64_t ns = ms * 1000000ull;
    return c->nc.sent_ns + ns - ns / 10;
}

static void set_region(struct shm_tier *st, struct umbp_tier_req *r,
                       const struct proto_region_item *it, uint64_t valid_until)
{
    r->status = it->status;
    if (it->status != 0)
        return;
    const struct shm_map *m = shm_current_map(st);
    r->region = (struct umbp_region){
        .addr = (uint8_t *)m->addr + it->offset,
        .size = it->size,
        .token = it->token,
        .aux = {st->epoch, valid_until},
    };
}

/* Ends leases without waiting for the reply: an internal call whose
 * RELEASE_R is consumed and ignored. */
struct shm_call *shm_release_new(struct shm_tier *st, size_t n)
{
    struct shm_call *u = shm_call_new(st, SHM_UNDO, NULL, 0, NULL, NULL);
    if (u && (!(u->keys = malloc(n * sizeof(*u->keys))) ||
              !(u->tokens = malloc(n * sizeof(*u->tokens))))) {
        shm_call_free(u);
        u = NULL;
    }
    if (!u) {
        umbp_log(UMBP_LOG_WARN, "shm tier: cannot release %zu leases (out of memory); "
                 "they expire on the server", n);
        return NULL;
    }
    u->n = n;
    return u;
}

void shm_send_release(struct shm_tier *st, const umbp_key_t *keys, const uint64_t *tokens,
                      size_t n)
{
    struct shm_call *u = shm_release_new(st, n);
    if (!u)
        return;
    memcpy(u->keys, keys, n * sizeof(*keys));
    memcpy(u->tokens, tokens, n * sizeof(*tokens));
    shm_call_send(st, u, 0, false);
}

/* A late grant of an orphaned call: give it back. */
static void undo_grants(struct shm_tier *st, const struct shm_call *c, umbp_key_t *keys,
                        uint64_t *tokens, size_t n)
{
    if (!n)
        return;
    if (c->kind == SHM_RESERVE) {
        shm_send_abort(st, keys, tokens, n);
        return;
    }
    shm_send_release(st, keys, tokens, n);
}

static int apply_regions(struct shm_tier *st, struct shm_call *c, const struct proto_frame *f,
                         size_t base, char *err, size_t errlen)
{
    bool reserve = c->kind == SHM_RESERVE, full = false;
    uint64_t pool = shm_current_map(st) ? shm_current_map(st)->size : 0;
    umbp_key_t *keys = NULL;
    uint64_t *tokens = NULL;
    size_t nundo = 0;
    if (c->nc.orphan && c->keys && (!(keys = malloc(f->n * sizeof(*keys))) ||
                                 !(tokens = malloc(f->n * sizeof(*tokens)))))
        umbp_log(UMBP_LOG_WARN, "shm tier: out of memory undoing a late %s",
                 proto_type_name(f->type));
    int rc = 0;
    for (uint32_t j = 0; j < f->n && rc == 0; j++) {
        struct proto_region_item it;
        const struct umbp_tier_req *r = c->nc.orphan ? NULL : c->reqs[base + j];
        if (proto_get_region_item(f, j, &it) < 0) {
            snprintf(err, errlen, "%s item %u unreadable", proto_type_name(f->type), j);
            rc = -EPROTO;
        } else if ((rc = proto_region_check(&it, reserve && r ? r->size : 0, pool, reserve, err,
                                            errlen)) == 0) {
            full |= it.status == -ENOSPC;
            if (!c->nc.orphan) {
                set_region(st, c->reqs[base + j], &it, lease_valid_until(st, c));
            } else if (it.status == 0 && keys && tokens) {
                keys[nundo] = c->keys[base + j];
                tokens[nundo++] = it.token;
            }
        }
    }
    if (rc == 0)
        undo_grants(st, c, keys, tokens, nundo);
    free(keys);
    free(tokens);
    if (full)
        want_fast_stats(st);
    return rc;
}

static int apply_statuses(struct shm_call *c, const struct proto_frame *f, size_t base,
                          char *err, size_t errlen)
{
    for (uint32_t j = 0; j < f->n; j++) {
        int32_t s;
        if (proto_get_status(f, j, &s) < 0) {
            snprintf(err, errlen, "%s item %u unreadable", proto_type_name(f->type), j);
            return -EPROTO;
        }
        if (!c->nc.orphan && c->kind != SHM_UNDO)
            c->reqs[base + j]->status = s;
    }
    return 0;
}

static int apply_present(struct shm_call *c, const struct proto_frame *f, size_t base,
                         char *err, size_t errlen)
{
    for (uint32_t j = 0; j < f->n; j++) {
        uint8_t v;
        if (proto_get_u8(f, j, &v) < 0) {
            snprintf(err, errlen, "LOOKUP_R item %u is not 0 or 1", j);
            return -EPROTO;
        }
        if (!c->nc.orphan)
            c->present[base + j] = v;
    }
    return 0;
}

static int apply_data(struct shm_tier *st, struct shm_call *c, const struct proto_frame *f,
                      char *err, size_t errlen)
{
    size_t want = frame_items(c, c->nc.answered);
    size_t base = (size_t)c->nc.answered * frame_max(c);
    if (f->type != c->reply_type || f->n != want) {
        snprintf(err, errlen, "%s with %u items answered a %s of %zu", proto_type_name(f->type),
                 f->n, proto_type_name(request_type(c->kind)), want);
        return -EPROTO;
    }
    switch (c->kind) {
    case SHM_LOOKUP: return apply_present(c, f, base, err, errlen);
    case SHM_RESERVE:
    case SHM_ACQUIRE: return apply_regions(st, c, f, base, err, errlen);
    case SHM_CLEAR: c->status = (int32_t)f->arg; return 0;
    default: return apply_statuses(c, f, base, err, errlen);
    }
}

/* A reply of c, live or orphaned (apply_* look at nc.orphan). */
static int call_reply(struct net_call *nc, const struct proto_frame *f, char *err,
                      size_t errlen)
{
    struct shm_call *c = umbp_container_of(nc, struct shm_call, nc);
    if (nc->answered < c->data_frames)
        return apply_data(c->st, c, f, err, errlen);
    if (f->type != PROTO_STATS_R) {
        snprintf(err, errlen, "%s where STATS_R was due", proto_type_name(f->type));
        return -EPROTO;
    }
    return apply_stats(c->st, f, err, errlen);
}

static void handle_events(struct shm_tier *st, const struct proto_frame *f)
{
    const struct umbp_tier_env *env = &st->base.env;
    if (f->arg) {
        umbp_log(UMBP_LOG_WARN, "umbp-server at %s dropped %u events for this engine (its "
                 "queue was full); umbp_events_drain reports them lost", st->path, f->arg);
        if (env->events_lost)
            env->events_lost(env->ctx, f->arg);
    }
    for (uint32_t j = 0; j < f->n; j++) {
        struct proto_event_item it;
        if (proto_get_event_item(f, j, &it) == 0 && env->emit_event)
            env->emit_event(env->ctx, (umbp_event_type_t)it.type, &it.key);
    }
}

int shm_on_frame(struct net_session *s, const struct proto_frame *f, char *err, size_t errlen)
{
    struct shm_tier *st = s->owner;
    struct proto_error e;
    if (s->state == NET_HELLO) /* EVENTS from before this session counted: dropped */
        return f->type == PROTO_EVENTS;
    switch (f->type) {
    case PROTO_EVENTS:
        handle_events(st, f);
        return 1;
    case PROTO_ERROR:
        if (proto_get_error(f, &e) < 0)
            snprintf(e.message, sizeof(e.message), "(unreadable)");
        snprintf(err, errlen, "the server sent ERROR: %s", e.message);
        return -ECONNRESET;
    case PROTO_HELLO_OK:
    case PROTO_HELLO_ERR:
    case PROTO_PONG:
    case PROTO_SESSIONS_R:
        snprintf(err, errlen, "unexpected %s", proto_type_name(f->type));
        return -EPROTO;
    default:
        return 0; /* a reply: the session matches it to its call */
    }
}

/* ---- deadlines ------------------------------------------------------------------ */

/* A reserve or acquire split over several frames timed out after some of
 * them were answered: those grants are in the requests, and done(TIMEOUT)
 * tells the runtime nothing was granted, so give them back now. */
static void undo_answered(struct shm_tier *st, const struct shm_call *c)
{
    size_t done = (size_t)c->nc.answered * PROTO_MAX_RECORDS, m = 0;
    if (done > c->n)
        done = c->n;
    umbp_key_t *keys = done ? malloc(done * sizeof(*keys)) : NULL;
    uint64_t *tokens = done ? malloc(done * sizeof(*tokens)) : NULL;
    for (size_t i = 0; keys && tokens && i < done; i++)
        if (c->reqs[i]->status == 0) {
            keys[m] = c->reqs[i]->key;
            tokens[m++] = c->reqs[i]->region.token;
        }
    undo_grants(st, c, keys, tokens, m);
    free(keys);
    free(tokens);
}

/* c became an orphan: done now with UMBP_E_TIMEOUT, late replies consumed
 * later. */
static void call_expire(struct shm_tier *st, struct shm_call *c)
{
    if ((c->kind == SHM_RESERVE || c->kind == SHM_ACQUIRE) && c->nc.answered)
        undo_answered(st, c);
    if (c->kind == SHM_RESERVE || c->kind == SHM_ACQUIRE) {
        c->keys = malloc(c->n * sizeof(*c->keys));
        for (size_t i = 0; c->keys && i < c->n; i++)
            c->keys[i] = c->reqs[i]->key;
    }
    free(c->reqs);
    c->reqs = NULL;
    c->present = NULL;
    umbp_log(UMBP_LOG_DEBUG, "umbp-server at %s: %s of %zu items timed out", st->path,
             proto_type_name(request_type(c->kind)), c->n);
    c->done(c->arg, UMBP_E_TIMEOUT);
}

/* Exactly once per call (net/session.h). */
static void call_done(struct net_call *nc, int status)
{
    struct shm_call *c = umbp_container_of(nc, struct shm_call, nc);
    if (!c->done)
        return; /* internal: STATS, UNDO */
    if (status == UMBP_E_TIMEOUT) {
        call_expire(c->st, c);
        return;
    }
    c->done(c->arg, status == 0 && c->kind == SHM_CLEAR ? c->status : status);
}

static void call_free(struct net_call *nc)
{
    shm_call_free(umbp_container_of(nc, struct shm_call, nc));
}

static const struct net_call_ops call_ops = {
    .on_reply = call_reply,
    .on_late_reply = call_reply,
    .on_done = call_done,
    .on_free = call_free,
};
