/*
 * actor_lease.c - the lease sweep: ends read leases past their TTL.
 *
 * Not a mailbox actor (nothing posts to it): loop thread only.  A periodic
 * timer (a tenth of lease_ttl_ms, between 5 ms
 * and 1 s) asks the tier to expire old leases, so a reader that died or
 * stalled cannot pin memory forever; its late release is then validated by
 * the tier (UMBP_E_STALE if the region was reused).  Expired leases make
 * objects evictable again, so waiting puts get a kick to the evictor.
 */
#include "rt.h"
#include "tier_call.h"

static void lease_on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct umbp_runtime *rt = w->data;

    tier_expire_leases(rt->tier, umbp_now_ns());
    if (rt->space_waiters_head)
        evictor_kick(rt);
}

int lease_actor_init(struct umbp_runtime *rt)
{
    double period = (double)rt->core->lease_ttl_ms / 10000.0;
    if (period < 0.005)
        period = 0.005;
    if (period > 1.0)
        period = 1.0;
    ev_timer_init(&rt->lease_timer, lease_on_timer, period, period);
    rt->lease_timer.data = rt;
    ev_timer_start(rt->loop, &rt->lease_timer);
    return 0;
}

void lease_actor_stop(struct umbp_runtime *rt)
{
    ev_timer_stop(rt->loop, &rt->lease_timer);
}
