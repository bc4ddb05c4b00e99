/*
 * leader_lease_int.h - what a lease store implements (leader_lease.h is the users'
 * side): an ops table per scheme, its struct embedding struct lease first.
 * leader_lease.c parses URLs and values and dispatches; leader_lease_redis.c is the one
 * store today (over redis_conn.c, plain or TLS).  Private to net/.
 */
#ifndef UMBP_NET_LEADER_LEASE_INT_H
#define UMBP_NET_LEADER_LEASE_INT_H

#include "leader_lease.h"

struct lease_ops {
    void (*close)(struct lease *l);
    /* As leader_lease.h's calls; err already carries nothing, the store writes
     * what failed (leader_lease.c prefixes the URL). */
    int (*acquire)(struct lease *l, const char *address, const char *owner, uint64_t ttl_ms,
                   uint64_t min_epoch, struct lease_holder *out, char *err, size_t errlen);
    int (*renew)(struct lease *l, const struct lease_holder *mine, uint64_t ttl_ms,
                 struct lease_holder *out, char *err, size_t errlen);
    int (*release)(struct lease *l, const struct lease_holder *mine, char *err, size_t errlen);
    int (*leader)(struct lease *l, struct lease_holder *out, char *err, size_t errlen);
};

struct lease {
    const struct lease_ops *ops;
    struct lease_url u;
    char url[LEASE_URL_MAX];
    uint64_t timeout_ms;
};

/* leader_lease_redis.c (built with hiredis): 0, or < 0 with err (rediss:
 * the TLS files and context, redis_conn.h's redis_tls_new; -ENOMEM). */
int lease_redis_open(const struct lease_url *u, struct lease **out, char *err, size_t errlen);

#endif /* UMBP_NET_LEADER_LEASE_INT_H */
