/*
 * actor_store.c - the store actor: reserve -> copy -> publish.
 *
 * Loop thread only.  Owns the list of incomplete puts (by arrival, for
 * flush), the list of puts waiting for space, the flush waiters and the
 * space-wait timer.
 *
 * A put proceeds in rounds.  Each round asks the tier to reserve every key
 * still to do; keys that got a region are copied by the copy workers and then
 * published together; keys that met a full pool (-ENOSPC) first get an
 * inline eviction of the LRU prefix that makes room for them (then another
 * round), and otherwise wait, holding no reservation, until the evictor
 * frees space (space_freed -> store_retry) or their deadline (put_wait_ms,
 * then timeout_ms) passes.  A key is never
 * visible before its bytes are written, and a failed key never changes what
 * the tier held before.
 */
#include <errno.h>

#include "rt.h"
#include "tier_call.h"

/* Objects one inline eviction may free before the put waits for the
 * evictor actor instead (which works in slices between other messages). */
#define INLINE_EVICT_MAX 256

static void put_reserve_round(struct umbp_runtime *rt, struct umbp_op *op);

/* ---- lists ---------------------------------------------------------------- */

static void puts_append(struct umbp_runtime *rt, struct umbp_op *op)
{
    op->prev = rt->puts_tail;
    op->next = NULL;
    if (rt->puts_tail)
        rt->puts_tail->next = op;
    else
        rt->puts_head = op;
    rt->puts_tail = op;
}

static void puts_remove(struct umbp_runtime *rt, struct umbp_op *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        rt->puts_head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        rt->puts_tail = op->prev;
    op->prev = op->next = NULL;
}

static void waiters_append(struct umbp_runtime *rt, struct umbp_op *op)
{
    op->wnext = NULL;
    if (rt->space_waiters_tail)
        rt->space_waiters_tail->wnext = op;
    else
        rt->space_waiters_head = op;
    rt->space_waiters_tail = op;
}

/* ---- flush ----------------------------------------------------------------- */

static void flush_check(struct umbp_runtime *rt)
{
    uint64_t oldest = rt->puts_head ? rt->puts_head->arrival : UINT64_MAX;
    struct umbp_op **pp = &rt->flush_head;
    rt->flush_tail = NULL;
    while (*pp) {
        struct umbp_op *f = *pp;
        if (oldest > f->flush_upto) {
            *pp = f->wnext;
            f->rc = 0;
            op_complete(f);
        } else {
            rt->flush_tail = f;
            pp = &f->wnext;
        }
    }
}

static void flush_arrive(struct umbp_runtime *rt, struct umbp_op *op)
{
    op->flush_upto = rt->arrivals;
    op->wnext = NULL;
    if (rt->flush_tail)
        rt->flush_tail->wnext = op;
    else
        rt->flush_head = op;
    rt->flush_tail = op;
    flush_check(rt);
}

/* ---- finishing ------------------------------------------------------------- */

static void fail_todo(struct umbp_op *op, int status)
{
    for (size_t k = 0; k < op->n; k++)
        if (op->state[k] == KEY_TODO) {
            op->state[k] = KEY_DONE;
            op->status[k] = status;
        }
}

static void put_finish(struct umbp_runtime *rt, struct umbp_op *op)
{
    size_t failed = 0;
    for (size_t k = 0; k < op->n; k++)
        failed += op->status[k] != 0;
    if (!op->warm)
        CNT_ADD(rt, puts_failed, failed);
    puts_remove(rt, op);
    op_complete(op);
    flush_check(rt);
}

/* Bytes of the keys still to do, and the largest of them. */
static uint64_t todo_bytes(const struct umbp_op *op, uint64_t *largest)
{
    uint64_t b = 0, max = 0;
    for (size_t k = 0; k < op->n; k++)
        if (op->state[k] == KEY_TODO) {
            b += op->reqs[k].size;
            if (op->reqs[k].size > max)
                max = op->reqs[k].size;
        }
    if (largest)
        *largest = max;
    return b;
}

static void want_space(struct umbp_runtime *rt, const struct umbp_op *op)
{
    uint64_t largest;
    rt->space_wanted += todo_bytes(op, &largest);
    if (largest > rt->space_wanted_run)
        rt->space_wanted_run = largest;
}

/* A round met a full pool: evict for this op's keys now, on the loop thread,
 * instead of failing or waiting for the evictor's next turn (with
 * put_wait_ms 0 there would be no next turn for this put).  True if space
 * was freed, so another round may fit. */
static bool make_room_now(struct umbp_runtime *rt, const struct umbp_op *op)
{
    uint64_t wanted = rt->space_wanted, run = rt->space_wanted_run;
    want_space(rt, op);
    bool more;
    uint64_t freed = evictor_make_room(rt, INLINE_EVICT_MAX, &more);
    rt->space_wanted = wanted;
    rt->space_wanted_run = run;
    return freed > 0;
}

static bool has_todo(const struct umbp_op *op)
{
    for (size_t k = 0; k < op->n; k++)
        if (op->state[k] == KEY_TODO)
            return true;
    return false;
}

/* Decides what happens to keys still TODO after a round: wait or fail. */
static void put_after_round(struct umbp_runtime *rt, struct umbp_op *op)
{
    if (!has_todo(op)) {
        put_finish(rt, op);
        return;
    }
    if (op->warm) { /* a warm-up neither waits for space nor makes it */
        fail_todo(op, -ENOSPC);
        put_finish(rt, op);
        return;
    }
    uint64_t now = umbp_now_ns();
    /* another round if this one's eviction freed space, or if anything
     * freed space since this op last reserved (the evictor, a release):
     * that wake-up came while the op copied, before it could wait, and
     * waiting now would wait for a free that has already happened */
    if (!rt->stopping && now < op->deadline_ns &&
        (make_room_now(rt, op) || op->space_gen != rt->space_freed_gen)) {
        put_reserve_round(rt, op);
        return;
    }
    if (rt->stopping) {
        fail_todo(op, UMBP_E_NOT_ATTEMPTED);
    } else if (now >= op->deadline_ns) {
        CNT_ADD(rt, ops_timed_out, 1);
        fail_todo(op, UMBP_E_TIMEOUT);
    } else if (now >= op->space_deadline_ns) {
        fail_todo(op, -ENOSPC);
    } else {
        CNT_ADD(rt, puts_waited_for_space, 1);
        want_space(rt, op);
        waiters_append(rt, op);
        if (!ev_is_active(&rt->store_timer))
            ev_timer_again(rt->loop, &rt->store_timer);
        evictor_kick(rt);
        return;
    }
    put_finish(rt, op);
}

/* ---- the round ------------------------------------------------------------ */

static void put_published(void *arg, int rc)
{
    struct umbp_op *op = arg;
    struct umbp_runtime *rt = op->rt;
    for (size_t k = 0; k < op->n; k++) {
        if (op->state[k] != KEY_COPYING)
            continue;
        int s = rc < 0 ? rc : op->reqs[k].status;
        op->state[k] = KEY_DONE;
        if (s == UMBP_TIER_EXISTS) { /* a reservation made ahead of its key, and
                                        another put stored the key first */
            s = 0;
            if (!op->warm)
                CNT_ADD(rt, puts_existing, 1);
        } else if (s == 0) {
            CNT_ADD(rt, puts_ok, 1);
            CNT_ADD(rt, bytes_written, op->reqs[k].size);
        }
        op->status[k] = s;
    }
    evictor_kick(rt);
    put_after_round(rt, op);
}

/* The round's bytes are in place, or not: keys whose move failed (the
 * deadline cut it, the GPU or the tier failed) drop their reservations and
 * fail; the others are published together.  A warm-up (op->warm) drops
 * every reservation: its key never becomes an object, and it reports how
 * its copy went. */
static void put_copied(struct umbp_runtime *rt, struct umbp_op *op)
{
    move_finished(op);
    if (op->cancelled && !op->cut_by_release && !op->cut_by_loss && !op->warm)
        CNT_ADD(rt, ops_timed_out, 1);
    size_t nfail = 0;
    for (size_t k = 0; k < op->n; k++) {
        int rc = op->state[k] == KEY_COPYING ? move_key_rc(op, k) : 0;
        if (rc < 0 || (op->warm && op->state[k] == KEY_COPYING)) {
            op->req_ptrs[nfail++] = &op->reqs[k];
            op->state[k] = KEY_DONE;
            op->status[k] = rc;
        }
    }
    if (nfail)
        tier_abort(rt->tier, op->req_ptrs, nfail);
    size_t m = 0;
    for (size_t k = 0; k < op->n; k++)
        if (op->state[k] == KEY_COPYING)
            op->req_ptrs[m++] = &op->reqs[k];
    if (m == 0) {
        put_after_round(rt, op);
        return;
    }
    tier_publish(rt->tier, op->req_ptrs, m, put_published, op);
}

static void put_reserved(void *arg, int rc)
{
    struct umbp_op *op = arg;
    if (!op->tier_done_ns) /* a put that waited for space reserves again */
        op->tier_done_ns = umbp_now_ns();
    struct umbp_runtime *rt = op->rt;
    size_t ncopy = 0;
    for (size_t k = 0; k < op->n; k++) {
        if (op->state[k] != KEY_TODO)
            continue;
        struct umbp_tier_req *r = &op->reqs[k];
        int s = rc < 0 ? rc : r->status;
        if (s == 0) {
            op->state[k] = KEY_COPYING;
            ncopy++;
        } else if (s == UMBP_TIER_EXISTS) {
            op->state[k] = KEY_DONE;
            op->status[k] = 0;
            if (!op->warm)
                CNT_ADD(rt, puts_existing, 1);
        } else if (s != -ENOSPC) {
            op->state[k] = KEY_DONE;
            op->status[k] = s;
        }
    }
    if (ncopy)
        move_dispatch(op, MSG_PUT_COPIED);
    else
        put_after_round(rt, op);
}

static void put_reserve_round(struct umbp_runtime *rt, struct umbp_op *op)
{
    /* health again before every round, not only on arrival: a put that
     * waited for space must not queue behind a backend that stalled since */
    int h = rt->stopping ? UMBP_E_NOT_ATTEMPTED : tier_health(rt->tier);
    if (h < 0) {
        fail_todo(op, h);
        put_finish(rt, op);
        return;
    }
    size_t m = 0;
    for (size_t k = 0; k < op->n; k++)
        if (op->state[k] == KEY_TODO) {
            op->reqs[k].status = 0;
            op->req_ptrs[m++] = &op->reqs[k];
        }
    op->space_gen = rt->space_freed_gen;
    if (op->kv_xfer && m) /* a KV store: objects of one size, stored often */
        tier_reserve_ahead(rt->tier, op->req_ptrs[0]->size);
    tier_reserve(rt->tier, op->req_ptrs, m, put_reserved, op);
}

static void put_arrive(struct umbp_runtime *rt, struct umbp_op *op)
{
    op->arrive_ns = umbp_now_ns();
    op->arrival = ++rt->arrivals;
    puts_append(rt, op);
    mover_choose(op);
    op->space_deadline_ns = op->submit_ns + ms_to_ns(rt->core->put_wait_ms);
    if (op->space_deadline_ns > op->deadline_ns)
        op->space_deadline_ns = op->deadline_ns;
    put_reserve_round(rt, op);
}

/* ---- space waiting ---------------------------------------------------------- */

static void store_on_retry(struct ev_loop *loop, ev_async *w, int revents)
{
    struct umbp_runtime *rt = w->data;
    struct umbp_op *op = rt->space_waiters_head;
    rt->space_waiters_head = rt->space_waiters_tail = NULL;
    rt->space_wanted = rt->space_wanted_run = 0;
    while (op) {
        struct umbp_op *next = op->wnext;
        put_reserve_round(rt, op);
        op = next;
    }
}

void tier_space_freed(void *ctx)
{
    struct umbp_runtime *rt = ctx;
    rt->space_freed_gen++;
    /* Called from inside the tier (evict, release, clear): retry on the next
     * loop iteration, never re-entering the tier from its own call. */
    if (rt->space_waiters_head)
        ev_async_send(rt->loop, &rt->store_retry);
}

/* Fails waiting keys whose deadlines passed; stops when nobody waits. */
static void store_on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct umbp_runtime *rt = w->data;
    struct umbp_op *op = rt->space_waiters_head;
    uint64_t now = umbp_now_ns();
    rt->space_waiters_head = rt->space_waiters_tail = NULL;
    rt->space_wanted = rt->space_wanted_run = 0;
    while (op) {
        struct umbp_op *next = op->wnext;
        if (rt->stopping || now >= op->space_deadline_ns || now >= op->deadline_ns) {
            put_after_round(rt, op); /* fails the keys and finishes */
        } else {
            want_space(rt, op);
            waiters_append(rt, op);
        }
        op = next;
    }
    if (!rt->space_waiters_head)
        ev_timer_stop(loop, w);
    else
        evictor_kick(rt);
}

int store_actor_init(struct umbp_runtime *rt)
{
    ev_init(&rt->store_timer, store_on_timer);
    rt->store_timer.repeat = 0.005;
    rt->store_timer.data = rt;
    ev_async_init(&rt->store_retry, store_on_retry);
    rt->store_retry.data = rt;
    ev_async_start(rt->loop, &rt->store_retry);
    return 0;
}

void store_actor_stop(struct umbp_runtime *rt)
{
    store_on_timer(rt->loop, &rt->store_timer, 0); /* stopping: fails all */
    ev_timer_stop(rt->loop, &rt->store_timer);
    ev_async_stop(rt->loop, &rt->store_retry);
    /* flushes wait only for puts that still run; those finish or fail */
    flush_check(rt);
}

bool store_actor_idle(struct umbp_runtime *rt)
{
    return !rt->puts_head && !rt->flush_head;
}

void store_actor_handle(struct umbp_runtime *rt, struct msg_hdr *m)
{
    struct umbp_op *op = (struct umbp_op *)m;
    switch ((enum msg_type)m->type) {
    case MSG_PUT_SUBMIT: put_arrive(rt, op); break;
    case MSG_PUT_COPIED: put_copied(rt, op); break;
    case MSG_FLUSH: flush_arrive(rt, op); break;
    default: umbp_log(UMBP_LOG_ERROR, "store actor: unexpected message %s", msg_name(m->type));
    }
}
