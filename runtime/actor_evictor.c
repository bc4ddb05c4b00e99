/*
 * actor_evictor.c - the evictor actor: keeps usage between the watermarks.
 *
 * Loop thread only.  Anyone may kick it (a single static message guarded by
 * an atomic flag, so kicks never fill its mailbox).  Each kick evicts one
 * slice (at most EVICT_SLICE objects) and kicks itself again if more is
 * needed, so a large eviction never holds the loop for long.
 *
 * Targets: above the high watermark, evict down to the low one.  While puts
 * wait for space, evict until they fit: the bytes of every waiting key free
 * in total and one free run as large as the largest of them, so no more of
 * the LRU order is evicted than makes room.  The tier chooses victims: least
 * recently used, never leased or pending.  Only tiers that evict locally
 * (UMBP_TIER_CAP_EVICTS_LOCALLY) are driven; a server evicts on its own.
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

/* The byte target and free run the tier should evict to, from usage and the
 * puts waiting for space; false if nothing needs evicting. */
static bool evict_target(struct umbp_runtime *rt, const struct umbp_tier_usage *u,
                         uint64_t *target, uint64_t *run)
{
    *target = UINT64_MAX;
    *run = 0;
    if (u->high_watermark_bytes && u->used_bytes > u->high_watermark_bytes)
        *target = u->low_watermark_bytes;
    if (rt->space_wanted) {
        /* Evict only the LRU prefix that makes room: enough free bytes in
         * total for every waiting key, and one free run for the largest
         * (the tier checks that against its allocator). */
        uint64_t fit = u->capacity_bytes > rt->space_wanted ? u->capacity_bytes - rt->space_wanted : 0;
        if (fit < *target)
            *target = fit;
        *run = rt->space_wanted_run;
    }
    return *target != UINT64_MAX || *run;
}

uint64_t evictor_make_room(struct umbp_runtime *rt, size_t max_objects, bool *more)
{
    *more = false;
    if (!(tier_caps(rt->tier) & UMBP_TIER_CAP_EVICTS_LOCALLY))
        return 0; /* the tier (its server) evicts on its own */
    struct umbp_tier_usage u;
    tier_usage(rt->tier, &u);
    uint64_t target, run;
    if (!evict_target(rt, &u, &target, &run))
        return 0;
    return tier_evict(rt->tier, target, run, max_objects, more);
}

static void evict_slice(struct umbp_runtime *rt)
{
    bool more = false;
    evictor_make_room(rt, EVICT_SLICE, &more);
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
