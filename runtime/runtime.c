/*
 * runtime.c - creating and destroying a runtime; the loop thread.
 *
 * Creation (caller's thread): parse options, create the composition's tier,
 * allocate the op pool, the mailboxes and the copy workers, then start the
 * loop thread.  Everything the loop uses is set up before the thread starts,
 * so pthread_create orders it.
 *
 * Destruction: refuse new work (closing), ring the stop doorbell; the loop
 * thread closes the lookup service (lookup/lookup_serve.c), fails waiting
 * puts, keeps serving mailboxes (handlers fail new arrivals with
 * UMBP_E_NOT_ATTEMPTED) until every in-flight op has completed or timeout_ms
 * has passed, then breaks.  Copy workers finish the jobs already
 * queued (bounded memcpy) before they exit; only then is the tier destroyed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "lookup_int.h"
#include "options.h"
#include "rt.h"
#include "tier_call.h"

static void loop_release(struct ev_loop *loop)
{
    struct umbp_runtime *rt = ev_userdata(loop);
    pthread_mutex_unlock(&rt->loop_lock);
}

static void loop_acquire(struct ev_loop *loop)
{
    struct umbp_runtime *rt = ev_userdata(loop);
    /* callers stop taking the lock while the loop waits for it, so lookups
     * in a tight loop cannot starve the loop (a mutex is not fair) */
    atomic_store_explicit(&rt->loop_waiting, true, memory_order_relaxed);
    pthread_mutex_lock(&rt->loop_lock);
    atomic_store_explicit(&rt->loop_waiting, false, memory_order_relaxed);
}

static void *loop_main(void *arg)
{
    struct umbp_runtime *rt = arg;
    /* held while the loop works; released only around the backend poll */
    pthread_mutex_lock(&rt->loop_lock);
    ev_set_userdata(rt->loop, rt);
    ev_set_loop_release_cb(rt->loop, loop_release, loop_acquire);
    ev_run(rt->loop, 0);
    pthread_mutex_unlock(&rt->loop_lock);
    return NULL;
}

static void on_drain_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct umbp_runtime *rt = w->data;
    size_t inflight = atomic_load(&rt->inflight);
    bool tier_busy = tier_drain(rt->tier); /* the tier's own calls (shm: a refill) */
    if ((inflight || tier_busy) && umbp_now_ns() < rt->drain_deadline_ns)
        return;
    /* A remote tier completes what it still has outstanding now (its ops
     * fail and finish inline); no tier call comes after this. */
    tier_stop(rt->tier);
    inflight = atomic_load(&rt->inflight);
    if (inflight)
        umbp_log(UMBP_LOG_WARN, "shutdown: %zu operations still in flight after timeout_ms; "
                 "abandoning them", inflight);
    ev_timer_stop(loop, w);
    lease_actor_stop(rt);
    for (int a = 0; a < ACTOR_COUNT; a++)
        ev_async_stop(loop, &rt->mb[a].doorbell);
    ev_async_stop(loop, &rt->stop_async);
    ev_async_stop(loop, &rt->prewake);
    ev_idle_stop(loop, &rt->prewake_poll);
    ev_break(loop, EVBREAK_ALL);
}

static void on_stop(struct ev_loop *loop, ev_async *w, int revents)
{
    struct umbp_runtime *rt = w->data;
    if (rt->stopping)
        return;
    rt->stopping = true;
    rt->drain_deadline_ns = umbp_now_ns() + ms_to_ns(rt->core->timeout_ms);
    lookup_service_stop(rt); /* its connections close and its socket goes now */
    store_actor_stop(rt);
    ev_timer_init(&rt->drain_timer, on_drain_timer, 0.0, 0.001);
    rt->drain_timer.data = rt;
    ev_timer_start(loop, &rt->drain_timer);
}

/* umbp_prewake: poll (an idle watcher keeps the loop from sleeping) until a
 * batch has had time to arrive. */
#define PREWAKE_POLL_NS 1000000ull

static void on_prewake_poll(struct ev_loop *loop, ev_idle *w, int revents)
{
    struct umbp_runtime *rt = w->data;
    if (umbp_now_ns() >= rt->prewake_until_ns)
        ev_idle_stop(loop, w);
}

static void on_prewake(struct ev_loop *loop, ev_async *w, int revents)
{
    struct umbp_runtime *rt = w->data;
    if (rt->stopping)
        return;
    rt->prewake_until_ns = umbp_now_ns() + PREWAKE_POLL_NS;
    CNT_ADD(rt, prewakes, 1);
    if (!ev_is_active(&rt->prewake_poll))
        ev_idle_start(loop, &rt->prewake_poll);
}

int umbp_prewake(umbp_runtime_t *rt)
{
    if (!rt)
        return -EINVAL;
    if (atomic_load_explicit(&rt->closing, memory_order_acquire))
        return UMBP_E_NOT_ATTEMPTED;
    if (rt->may_spin)
        ev_async_send(rt->loop, &rt->prewake);
    return 0;
}

static const mailbox_handler handlers[ACTOR_COUNT] = {
    [ACTOR_LOOKUP] = lookup_actor_handle,
    [ACTOR_STORE] = store_actor_handle,
    [ACTOR_LOAD] = load_actor_handle,
    [ACTOR_EVICTOR] = evictor_actor_handle,
};

static int create_tier(struct umbp_runtime *rt)
{
    const struct umbp_tier_ops *ops = rt->cfg->primary;
    struct umbp_tier_env env = {
        .loop = rt->loop,
        .core = rt->core,
        .capacity_bytes = rt->cfg->rank_capacity,
        .emit_event = tier_emit_event,
        .events_lost = tier_events_lost,
        .space_freed = tier_space_freed,
        .mapping_changed = tier_mapping_changed,
        .regions_revoked = tier_regions_revoked,
        .ctx = rt,
        .create_child = config_create_child,
        .options = rt->cfg,
    };
    char err[512] = "";
    int rc = ops->create(&env, config_tier(rt->cfg, ops), &rt->tier, err, sizeof(err));
    if (rc < 0) {
        umbp_set_error("%s tier: %s", ops->name, err[0] ? err : umbp_strerror(rc));
        return rc;
    }
    tier_instance_init(rt->tier, ops, &env);
    rt->tier_name = ops->name;
    return 0;
}

static int create_ops(struct umbp_runtime *rt)
{
    size_t ndata = (size_t)rt->core->max_inflight_ops, n = ndata + CONTROL_OPS;
    rt->ops = calloc(n, sizeof(*rt->ops));
    rt->free_data.v = calloc(ndata, sizeof(*rt->free_data.v));
    rt->free_ctl.v = calloc(CONTROL_OPS, sizeof(*rt->free_ctl.v));
    if (!rt->ops || !rt->free_data.v || !rt->free_ctl.v)
        return -ENOMEM;
    rt->num_ops = n;
    /* pushed in reverse, so ops[0] is taken first */
    for (size_t i = n; i-- > 0;) {
        struct op_free *fl = i >= ndata ? &rt->free_ctl : &rt->free_data;
        rt->ops[i].rt = rt;
        rt->ops[i].control = i >= ndata;
        fl->v[fl->n++] = &rt->ops[i];
    }
    return 0;
}

static int create_events(struct umbp_runtime *rt)
{
    pthread_mutex_init(&rt->events.lock, NULL);
    pthread_mutex_init(&rt->memreg.lock, NULL);
    if (!rt->core->enable_events)
        return 0;
    rt->events.cap = (size_t)rt->core->event_queue_size;
    rt->events.v = calloc(rt->events.cap, sizeof(umbp_event_t));
    return rt->events.v ? 0 : -ENOMEM;
}

static int create_actors(struct umbp_runtime *rt)
{
    int rc;
    for (int a = 0; a < ACTOR_COUNT; a++)
        if ((rc = mailbox_init(&rt->mb[a], rt, (enum actor_id)a, (unsigned)rt->num_ops + 8,
                               handlers[a])) < 0)
            return rc;
    ev_async_init(&rt->stop_async, on_stop);
    rt->stop_async.data = rt;
    ev_async_start(rt->loop, &rt->stop_async);
    ev_async_init(&rt->prewake, on_prewake);
    rt->prewake.data = rt;
    ev_async_start(rt->loop, &rt->prewake);
    ev_idle_init(&rt->prewake_poll, on_prewake_poll);
    rt->prewake_poll.data = rt;
    evictor_init(rt);
    copy_timer_init(rt);
    if ((rc = store_actor_init(rt)) < 0 || (rc = lease_actor_init(rt)) < 0)
        return rc;
    rt->quarantine = quarantine_new();
    return rt->quarantine ? 0 : -ENOMEM;
}

static void free_runtime(struct umbp_runtime *rt)
{
    kv_fini(rt); /* GPU transfers end and the pool is unpinned before unmap */
    lookup_service_free(rt);
    memreg_fini(rt); /* the tier's registrations end before the tier */
    if (rt->tier)
        rt->tier->ops->destroy(rt->tier);
    for (int a = 0; a < ACTOR_COUNT; a++)
        mailbox_fini(&rt->mb[a]);
    if (rt->loop)
        ev_loop_destroy(rt->loop);
    for (size_t i = 0; i < rt->num_ops; i++) {
        struct umbp_op *op = &rt->ops[i];
        free(op->reqs);
        free(op->req_ptrs);
        free(op->state);
        free(op->status);
        free(op->present);
        free(op->range_first);
        free(op->jobs);
        free(op->ranges);
        free(op->kv_block);
        free(op->kv_io);
        free(op->moves);
        free(op->dup_tab);
    }
    free(rt->ops);
    free(rt->free_data.v);
    free(rt->free_ctl.v);
    pthread_mutex_destroy(&rt->free_data.lock);
    pthread_mutex_destroy(&rt->free_ctl.lock);
    free(rt->events.v);
    free(rt->memreg.v);
    quarantine_free(rt->quarantine);
    if (rt->loop_lock_ready)
        pthread_mutex_destroy(&rt->loop_lock);
    pthread_mutex_destroy(&rt->events.lock);
    pthread_mutex_destroy(&rt->memreg.lock);
    config_free(rt->cfg);
    free(rt);
}

int umbp_runtime_create(const char *json_config, umbp_runtime_t **out)
{
    if (!out) {
        umbp_set_error("umbp_runtime_create: out must not be NULL");
        return -EINVAL;
    }
    struct rt_config *cfg;
    int rc = config_parse(json_config, &cfg);
    if (rc < 0)
        return rc;
    enum umbp_log_level lvl;
    if (umbp_log_level_parse(cfg->core.log_level, &lvl) == 0)
        umbp_log_set_level(lvl);
    struct umbp_runtime *rt = calloc(1, sizeof(*rt));
    if (!rt) {
        config_free(cfg);
        umbp_set_error("out of memory creating the runtime");
        return -ENOMEM;
    }
    rt->cfg = cfg;
    rt->core = &cfg->core;
    /* Polling briefly instead of sleeping (waiters, the loop during GPU
     * transfers) pays only where cores are to spare: with few, the poller
     * steals the core the thread it waits for needs. */
    rt->may_spin = umbp_poll_wait_spins(cfg->core.poll_wait);
    kv_init(rt);
    /* before anything can fail: free_runtime destroys them */
    pthread_mutex_init(&rt->free_data.lock, NULL);
    pthread_mutex_init(&rt->free_ctl.lock, NULL);
    if (pthread_mutex_init(&rt->loop_lock, NULL) != 0) {
        umbp_set_error("cannot create the loop lock");
        rc = -ENOMEM;
        goto fail;
    }
    rt->loop_lock_ready = true;
    rt->loop = ev_loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK);
    if (!rt->loop) {
        umbp_set_error("libev: cannot create an event loop");
        rc = -ENOMEM;
        goto fail;
    }
    if ((rc = create_tier(rt)) < 0)
        goto fail;
    if ((rc = create_ops(rt)) < 0 || (rc = create_events(rt)) < 0 ||
        (rc = create_actors(rt)) < 0) {
        umbp_set_error("out of memory creating the runtime (max_inflight_ops=%lld)",
                       (long long)rt->core->max_inflight_ops);
        goto fail;
    }
    if ((rc = copy_pool_start(rt, (int)rt->core->copy_threads, (unsigned)rt->num_ops)) < 0) {
        umbp_set_error("cannot start %lld copy threads: %s", (long long)rt->core->copy_threads,
                       umbp_strerror(rc));
        goto fail;
    }
    if ((rc = -pthread_create(&rt->loop_thread, NULL, loop_main, rt)) < 0) {
        umbp_set_error("cannot start the loop thread: %s", umbp_strerror(rc));
        copy_pool_stop(rt);
        goto fail;
    }
    umbp_log(UMBP_LOG_INFO, "runtime up: mode %s, tier %s, rank %lld/%lld, capacity %llu bytes",
             rt->core->mode, rt->tier_name, (long long)rt->core->rank,
             (long long)rt->core->world_size, (unsigned long long)cfg->rank_capacity);
    *out = rt;
    return 0;
fail:
    free_runtime(rt);
    return rc;
}

void umbp_runtime_destroy(umbp_runtime_t *rt)
{
    if (!rt)
        return;
    atomic_store(&rt->closing, true);
    ev_async_send(rt->loop, &rt->stop_async);
    pthread_join(rt->loop_thread, NULL);
    copy_pool_stop(rt);
    free_runtime(rt);
}
