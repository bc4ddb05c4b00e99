/*
 * events.c - STORED / REMOVED events of every session, to every session
 * whose HELLO asked for them (PROTO_HELLO_EVENTS).
 *
 * The store calls srv_events_emit while a request is handled (publish,
 * eviction, clear); the events of one loop iteration are queued here and
 * sent by srv_events_flush from an ev_prepare watcher, i.e. once per
 * iteration, as EVENTS frames of at most PROTO_MAX_RECORDS records (seq 0).
 * A subscriber whose unsent output is above event_backlog_bytes gets none
 * of them: they are counted in its events_lost and the count rides in the
 * arg of its next EVENTS frame (an empty one if nothing else is due), so
 * its engine knows its view is incomplete.  Nothing is queued while no
 * session subscribes.  While a subscriber's frame is handled in slices its
 * EVENTS frames wait in its `held` buffer and follow that frame's reply
 * (session_reply_done), so an engine still sees a reply before the events
 * it caused.  Loop thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node.h"
#include "srv.h"
#include "util.h"

void srv_events_subscribe(struct srv_session *ss)
{
    ss->events = true;
    ss->srv->subscribers++;
}

void srv_events_unsubscribe(struct srv_session *ss)
{
    ss->events = false;
    ss->srv->subscribers--;
}

void srv_events_emit(void *ctx, umbp_event_type_t type, const umbp_key_t *key, uint64_t size)
{
    struct umbp_server *s = ctx;
    srv_node_event(s->node, type, key, size); /* the master learns it (a node) */
    if (!s->subscribers)
        return;
    if (s->nevents == s->events_cap) {
        size_t cap = s->events_cap ? s->events_cap * 2 : 1024;
        struct proto_event_item *e = realloc(s->events, cap * sizeof(*e));
        if (!e) {
            s->events_unqueued++; /* every subscriber loses it */
            return;
        }
        s->events = e;
        s->events_cap = cap;
    }
    s->events[s->nevents++] = (struct proto_event_item){.type = type, .key = *key};
}

/* One EVENTS frame of events[from, from + n) carrying `lost`. */
static int put_events(struct srv_session *ss, size_t from, uint32_t n, uint32_t lost)
{
    struct proto_buf *b = ss->batch.open ? &ss->held : &ss->conn.out;
    int rc = proto_begin(b, PROTO_EVENTS, 0, n, lost);
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        rc = proto_put_event_item(b, &ss->srv->events[from + i]);
    int erc = proto_end(b);
    return rc ? rc : erc;
}

/* This iteration's events (and any lost count) to one subscriber.  < 0:
 * end the session (why set). */
static int events_to(struct srv_session *ss)
{
    struct umbp_server *s = ss->srv;
    size_t n = s->nevents;

    if (n == 0 && ss->events_lost == 0)
        return 0;
    if (session_backlog(ss) + ss->held.len > s->cfg->opt.event_backlog_bytes) {
        ss->events_lost += n;
        return 0;
    }
    size_t from = 0;
    do {
        uint32_t chunk = n - from > PROTO_MAX_RECORDS ? PROTO_MAX_RECORDS : (uint32_t)(n - from);
        uint32_t lost = ss->events_lost > UINT32_MAX ? UINT32_MAX : (uint32_t)ss->events_lost;
        int rc = put_events(ss, from, chunk, lost);
        if (rc < 0) {
            snprintf(ss->conn.why, sizeof(ss->conn.why), "no memory for its events");
            return rc;
        }
        ss->events_lost -= lost;
        from += chunk;
    } while (from < n || ss->events_lost);
    return session_flush(ss);
}

void srv_events_flush(struct umbp_server *s)
{
    if (!s->nevents && !s->any_lost && !s->events_unqueued)
        return;
    bool any_lost = false;
    for (struct srv_session *ss = (struct srv_session *)s->svc.conns, *next; ss; ss = next) {
        next = (struct srv_session *)ss->conn.next;
        if (!ss->events)
            continue;
        ss->events_lost += s->events_unqueued;
        if (events_to(ss) < 0) {
            session_close(ss);
            continue;
        }
        any_lost = any_lost || ss->events_lost;
    }
    s->any_lost = any_lost;
    s->nevents = 0;
    s->events_unqueued = 0;
    if (s->events_cap > (1u << 20)) { /* a burst (a clear) grew it: give it back */
        free(s->events);
        s->events = NULL;
        s->events_cap = 0;
    }
}
