/*
 * rdma.h - what a host of the rdma tier other than the runtime needs
 * (umbp-server as a node, server/node.c): the tier's ops, and the events of
 * a slice whose objects others publish.
 */
#ifndef UMBP_RDMA_H
#define UMBP_RDMA_H

#include <stdint.h>

#include "umbp/tier.h"

extern const struct umbp_tier_ops umbp_tier_rdma_ops;

/* Loop thread.  A STORED or REMOVED event of the tier's slice, with the
 * object's size: for a slice whose objects are published by others than
 * this tier (the server's clients), whose env->emit_event the slice does
 * not call.  The tier queues it for the master and passes it on to its
 * own env's emit_event. */
void umbp_rdma_slice_event(struct umbp_tier *t, umbp_event_type_t type, const umbp_key_t *k,
                           uint64_t size);

/* The node's counters, for a host's /metrics (umbp-server).  Loop thread. */
struct umbp_rdma_stats {
    uint64_t remote_hits;    /* keys fetched from peers */
    uint64_t remote_misses;  /* keys no live peer had (or could not be asked) */
    uint64_t remote_failed;  /* fetches that failed (reset, timeout) */
    uint64_t remote_retries; /* keys asked again at another owner after one failed at once */
    uint64_t remote_bytes;   /* bytes fetched */
    uint64_t replicas;       /* fetched objects kept in the slice */
    uint64_t locates;        /* LOCATE calls to the master */
    uint64_t heartbeats, resyncs, registers, reports;
    uint64_t live_keys;      /* the slice's keys, as the master is told */
    uint64_t data_eager, data_rndv;      /* objects fetched: UCX's eager protocol, rendezvous */
    uint64_t served_keys, served_bytes;  /* objects and bytes sent to peers */
    uint32_t node_ref;       /* our number at the master (0: not registered) */
    bool registered;
    const char *transports;  /* UCX_TLS as UCX read it */
};
void umbp_rdma_stats(struct umbp_tier *t, struct umbp_rdma_stats *out);

#endif /* UMBP_RDMA_H */
