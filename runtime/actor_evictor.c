/*
 * actor_evictor.c - the evictor actor: keeps usage between the watermarks.
 *
 * Loop thread only.  Anyone may kick it (a single static message guarded by
 * an atomic flag, so kicks never fill its mailbox).  Each kick evicts one
 * slice (at most EVICT_SLICE objects) and kicks itself again if more is
 * needed, so a large eviction never holds the loop for long.
 *
 * Targets: above the high watermark, evict down to the low one.  While puts
 * wait for space, evict until they fit (and at least down to low).  The tier
 * chooses victims: least recently used, never leased or pending.
 */
#include "rt.h"
#include "tier_call.h"

#define EVICT_SLICE 256

void evictor_kick(struct umbp_runtime *rt)
{
    if (atomic_exchange(&rt->evict_kick_queued, true))
        return;
    if (rt_post(rt, &rt->evict_kick) < 0)
        atomic_store(&rt->evict_kick_queued, false);
}

static uint64_t evict_target(struct umbp_runtime *rt, const struct umbp_tier_usage *u)
{
    uint64_t target = UINT64_MAX;
    if (!u->high_watermark_bytes)
        return target; /* this tier evicts on its own */
    if (u->used_bytes > u->high_watermark_bytes)
        target = u->low_watermark_bytes;
    if (rt->space_wanted) {
        uint64_t fit = u->capacity_bytes > rt->space_wanted ? u->capacity_bytes - rt->space_wanted : 0;
        if (fit > u->low_watermark_bytes)
            fit = u->low_watermark_bytes;
        /* Enough free bytes in total but still no room: the free space is
         * fragmented.  Free the waiting bytes again from LRU order; the
         * allocator merges neighbours, and each retry that still fails asks
         * for more until the put fits or its deadline passes. */
        if (u->used_bytes <= fit)
            fit = u->used_bytes > rt->space_wanted ? u->used_bytes - rt->space_wanted : 0;
        if (fit < target)
            target = fit;
    }
    return target;
}

static void evict_slice(struct umbp_runtime *rt)
{
    struct umbp_tier_usage u;
    tier_usage(rt->tier, &u);
    uint64_t target = evict_target(rt, &u);
    if (target == UINT64_MAX || u.used_bytes <= target)
        return;
    bool more = false;
    tier_evict(rt->tier, target, EVICT_SLICE, &more);
    if (more)
        evictor_kick(rt);
}

void evictor_actor_handle(struct umbp_runtime *rt, struct msg_hdr *m)
{
    atomic_store(&rt->evict_kick_queued, false);
    if (!rt->stopping)
        evict_slice(rt);
}

void evictor_init(struct umbp_runtime *rt)
{
    rt->evict_kick.type = MSG_EVICT_KICK;
}

void evictor_stop(struct umbp_runtime *rt) { (void)rt; }
