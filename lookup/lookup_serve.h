/*
 * lookup_serve.h - a worker's lookup service (lookup_serve.c) as a library
 * that knows nothing of the runtime: the runtime hands it a lookup_host
 * (runtime/lookup_host.c), the table of what the service may ask of the
 * rank's pool, and drives its life from the loop thread.
 *
 * So the calls go one way, runtime -> lookup: the service never reads the
 * runtime's tier, counters or options, and a future peer service or
 * master can host the same service over another pool.
 *
 * Threads: lookup_serve_new and lookup_serve_setup on the caller's thread
 * before the service is handed to the loop; the rest on the loop thread
 * (lookup_serve_free after the loop has ended).  The host's ops are called
 * on the loop thread only.
 */
#ifndef UMBP_LOOKUP_SERVE_H
#define UMBP_LOOKUP_SERVE_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/tier.h"

struct lookup_host_counters {
    uint64_t lookups, lookup_keys, lookup_hits;
};

struct lookup_host_ops {
    /* The health check, then one lookup of reqs[0..n) (ptrs[k] is
     * &reqs[k], the tier's argument) answered inline,
     * touching the LRU only with touch; quarantined keys are misses; the
     * lookup is counted as the lookup actor counts its own.  present[k]
     * is 1 for a hit (all 0 when unhealthy or failed).  0, or -ENOTSUP
     * when the tier did not answer inline (present is not written; the
     * tier may still write into reqs and present later). */
    int (*lookup)(void *ctx, struct umbp_tier_req *reqs, struct umbp_tier_req **ptrs,
                  size_t n, uint8_t *present, bool touch);
    void (*usage)(void *ctx, struct umbp_tier_usage *u);
    void (*counters)(void *ctx, struct lookup_host_counters *c);
};

struct lookup_host {
    const struct lookup_host_ops *ops;
    void *ctx;
    struct ev_loop *loop;        /* the loop thread's */
    const char *tier_name;       /* for log lines; outlives the service */
    uint32_t lease_ttl_ms;       /* announced in HELLO_OK */
};

static inline int lookup_host_lookup(const struct lookup_host *h, struct umbp_tier_req *reqs,
                                     struct umbp_tier_req **ptrs, size_t n, uint8_t *present,
                                     bool touch)
{
    return h->ops->lookup(h->ctx, reqs, ptrs, n, present, touch);
}

static inline void lookup_host_usage(const struct lookup_host *h, struct umbp_tier_usage *u)
{
    h->ops->usage(h->ctx, u);
}

static inline void lookup_host_counters(const struct lookup_host *h,
                                        struct lookup_host_counters *c)
{
    h->ops->counters(h->ctx, c);
}

struct lk_service;

/* A service of dp_index/rank over host (copied); no files yet.  NULL: no
 * memory. */
struct lk_service *lookup_serve_new(const struct lookup_host *host, uint32_t dp_index,
                                    uint32_t rank);
/* The path from (dir, ns_hex, instance), its directory, the lock, the
 * socket bound and listening (see lookup_serve.c).  0, or < 0 with err. */
int lookup_serve_setup(struct lk_service *s, const char *dir, const char *ns_hex,
                       const char *instance, char *err, size_t errlen);
/* Loop thread: start accepting (nothing once stopped). */
void lookup_serve_start(struct lk_service *s);
/* Loop thread: every connection closed, the listener, socket and lock
 * files gone.  Idempotent. */
void lookup_serve_stop(struct lk_service *s);
/* Whatever is left (the loop has ended, or it was never started). */
void lookup_serve_free(struct lk_service *s);
const char *lookup_serve_path(const struct lk_service *s);

#endif /* UMBP_LOOKUP_SERVE_H */
