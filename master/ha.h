/*
 * ha.h - umbp-master's high availability: the leader lease (net/leader_lease.h)
 * kept by a thread of its own, so the loop never waits on the store.
 * Private to master/.
 *
 * Roles.  A master with lease_url starts as a standby: it listens, and
 * refuses every HELLO naming the leader.  The lease thread tries to take
 * the lease every lease_ttl_ms / 10 (50 .. 500 ms) with the highest epoch
 * it has seen as the floor; once taken, the master leads: it renews every
 * lease_ttl_ms / 3 and its HELLO_OK carries its epoch.  It steps down (every
 * connection closed, the directory emptied: soft state) only when the
 * store names another holder or its counter has passed our epoch (a
 * takeover happened while we were away); a store it cannot reach deposes
 * nobody (nobody else can take the lease either), so it keeps serving.
 * A clean stop releases the lease, so a standby takes over at once.
 *
 * Threads: the lease thread calls the store and writes the shared state
 * under mu, then rings the loop (role_w); the loop thread applies role
 * changes (ha_apply) and reads the rest under mu.
 */
#ifndef UMBP_MASTER_HA_H
#define UMBP_MASTER_HA_H

#include <stdbool.h>
#include <stdint.h>

#include "leader_lease.h"

struct umbp_master;
struct master_ha;

/* What the loop and /metrics read. */
struct ha_view {
    bool leader;
    uint64_t epoch;                 /* ours while leading, else 0 */
    struct lease_holder holder;     /* the last holder read (epoch 0: none) */
    uint64_t takeovers;             /* times this master took the lease */
    uint64_t renews, renew_ns_sum, renew_ns_max, errors;
    char why[512];                  /* the last store error, "" if none */
};

/* Opens the store and starts the thread (standby).  address: what the
 * lease publishes (advertise, or the listen address).  0, or -errno with
 * err. */
int ha_start(struct umbp_master *m, const char *address, struct master_ha **out, char *err,
             size_t errlen);
/* Stops the thread; releases the lease if held (a clean stop). */
void ha_stop(struct master_ha *h);
void ha_view(struct master_ha *h, struct ha_view *out);

/* master.c: the loop thread, when the lease thread rang (role_w). */
void master_role_changed(struct umbp_master *m);

#endif /* UMBP_MASTER_HA_H */
