/*
 * events.c - the stored/removed event queue for the engine's KV-event stream.
 *
 * Produced on the loop thread (tiers call env->emit_event), consumed by any
 * caller thread through umbp_events_drain; a mutex guards the ring.  When the
 * queue is full the oldest event is dropped and counted, and the next drain
 * reports the loss so the engine can resynchronise instead of trusting a
 * stream with holes.
 */
#include "rt.h"

void tier_emit_event(void *ctx, umbp_event_type_t type, const umbp_key_t *key)
{
    struct umbp_runtime *rt = ctx;
    struct event_queue *q = &rt->events;
    if (!q->v)
        return;
    pthread_mutex_lock(&q->lock);
    if (q->count == q->cap) {
        q->head = (q->head + 1) % q->cap;
        q->count--;
        q->lost++;
        CNT_ADD(rt, events_dropped, 1);
    }
    size_t tail = (q->head + q->count) % q->cap;
    q->v[tail].type = type;
    q->v[tail].key = *key;
    q->count++;
    pthread_mutex_unlock(&q->lock);
}

void tier_events_lost(void *ctx, uint64_t n)
{
    struct umbp_runtime *rt = ctx;
    struct event_queue *q = &rt->events;
    if (!q->v || !n)
        return;
    pthread_mutex_lock(&q->lock);
    q->lost += n;
    pthread_mutex_unlock(&q->lock);
    CNT_ADD(rt, events_dropped, n);
}

size_t umbp_events_drain(umbp_runtime_t *rt, umbp_event_t *out, size_t max, uint64_t *lost)
{
    if (lost)
        *lost = 0;
    if (!rt || !out || !max)
        return 0;
    struct event_queue *q = &rt->events;
    if (!q->v)
        return 0;
    pthread_mutex_lock(&q->lock);
    size_t n = 0;
    while (n < max && q->count) {
        out[n++] = q->v[q->head];
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    if (lost)
        *lost = q->lost;
    q->lost = 0;
    pthread_mutex_unlock(&q->lock);
    return n;
}
