/*
 * ucx.h - remote fetch over UCX (UCP): one worker on the caller's libev
 * loop, endpoints to peers by worker address, the local pool registered
 * once, and FETCH by active message (ucx_wire.h has the bytes;
 * docs/distributed.md the design; docs/protocol.md the messages).
 *
 * A node (struct ucx_node) is one UCP context and worker.  The loop drives
 * it from the worker's event fd: an ev_io on ucp_worker_get_efd() wakes the
 * loop, and an ev_prepare progresses the worker (at most UCX_PROGRESS_BATCH
 * calls per loop iteration, then ucp_worker_arm) before the loop sleeps;
 * when arm says more is pending an ev_idle keeps the loop from sleeping
 * until it does not.  No busy polling: an idle node costs nothing.  Which
 * transport carries the bytes is UCX's choice (UCX_TLS, UCX_NET_DEVICES):
 * there is no transport-specific branch here; ucx_node_transports and
 * ucx_peer_transport name what UCX chose, for logs, benchmarks and
 * /metrics.
 *
 * Serving (the owner): a node created with serve ops answers FETCH.  Per
 * key it takes the owner's read lease (lease_take), sends the bytes with
 * ucp_am_send_nbx (UCX picks eager or rendezvous; on RDMA the requester's
 * NIC reads the leased region) and releases the lease when UCX reports the
 * send complete, failed or cancelled: never before, so the region is not
 * reused while UCX may still read it.  A miss is answered as a miss.  The
 * owner bounds its sends too (serve_timeout_ms, below), so a requester that
 * stops or goes away cannot pin its leases.
 *
 * Fetching (the requester): ucx_fetch sends one FETCH per batch to a peer
 * and lands each key's bytes in the buffer the caller names (its local
 * pool: pass it to ucx_mem_map once, at startup).  The batch ends exactly
 * once, in done, on the loop thread, never from inside ucx_fetch: each key
 * 0 (its bytes are in dst[0, size)), -ENOENT (the owner has no such key),
 * -EMSGSIZE (larger than the key's cap), UMBP_E_TIMEOUT (timeout_ms passed),
 * -ECONNRESET (the peer failed or its endpoint was force-closed: a
 * stalled batch of the same peer) or -EPROTO (a malformed reply).
 *
 * The bound.  UCX reports a dead peer (connection reset) within a fraction
 * of a second, but a stopped or cut-off one never (measured:
 * docs/distributed.md).  So every batch has a timer; past timeout_ms the
 * peer's endpoint is force-closed (ucp_ep_close_nbx with
 * UCP_EP_CLOSE_FLAG_FORCE), which cancels everything UCX still has on it,
 * receives into the caller's buffers that are under way are cancelled
 * (ucp_request_cancel), and only when the close has completed and no
 * receive into any of the batch's buffers is outstanding is done called.
 * A DATA message for a batch that has ended finds no batch (req_ids are
 * never reused) and is dropped: a late reply never lands in a buffer the
 * caller has reused.  The next fetch to the peer opens a new endpoint.
 *
 * Threads: everything on the loop's thread (create and destroy while the
 * loop is not running in another thread).  Errors: 0 or negative errno;
 * create and connect failures are also reported with umbp_set_error,
 * naming the UCX call and its status.
 */
#ifndef UMBP_NET_UCX_H
#define UMBP_NET_UCX_H

#include <ev.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "umbp/umbp.h"

struct ucx_node;
struct ucx_peer;

/* The owner's leases.  lease_take: 0 with the object's bytes in
 * [*addr, *addr + *size) and *lease set, held until lease_release(lease);
 * -ENOENT when absent.  Both on the loop thread; they must not block. */
struct ucx_serve_ops {
    int (*lease_take)(void *ctx, const umbp_key_t *key, const void **addr, uint64_t *size,
                      uint64_t *lease);
    void (*lease_release)(void *ctx, uint64_t lease);
    void *ctx;
};

#define UCX_SERVE_TIMEOUT_MS 10000

struct ucx_node_config {
    struct ev_loop *loop;
    const char *name;                 /* in log lines */
    const struct ucx_serve_ops *serve; /* NULL: this node only fetches */
    /* The owner's bound: DATA sends to one requester still pending after
     * this long (it stopped, or force-closed its endpoint: over tcp UCX
     * then fails nothing here) are ended by force-closing the endpoint to
     * it, which releases their leases.  0: UCX_SERVE_TIMEOUT_MS. */
    uint32_t serve_timeout_ms;
    /* With work in flight (a batch awaiting its DATA, a send pending), the
     * loop progresses the worker for up to this long before it sleeps on
     * the event fd, saving the wake-up's latency; 0: never (the default;
     * the rdma tier sets it where poll_wait says this process may spin:
     * at least 8 usable CPUs). */
    uint32_t spin_us;
    /* Optional: UCX reported the endpoint to p failed (the peer died, or its
     * network did), with or without a batch in flight; called from the
     * loop's idle watcher after the endpoint is closed, never from inside
     * UCX.  A later fetch to p makes a new endpoint: an owner that wants no
     * reconnection to a dead peer stops asking it (the rdma tier backs off
     * and reports the peer to the master). */
    void (*on_peer_failed)(void *arg, struct ucx_peer *p);
    void *arg;
    /* The cluster's secret (auth.h's key, copied), or NULL: FETCH and DATA
     * carry macs under it (ucx_wire.h); with it this node serves no FETCH
     * whose mac is wrong and takes no DATA whose mac is wrong. */
    const struct net_auth_key *auth;
};

int ucx_node_create(const struct ucx_node_config *cfg, struct ucx_node **out);
/* Fails every batch still in flight (-ECONNRESET, done called), closes every
 * endpoint, unmaps, destroys the worker. */
void ucx_node_destroy(struct ucx_node *n);
/* This worker's address, to hand to peers (the master will carry it).
 * Valid until destroy. */
void ucx_node_address(const struct ucx_node *n, const void **addr, size_t *len);
/* UCX_TLS as UCX read it ("tcp", "all", ...). */
const char *ucx_node_transports(const struct ucx_node *n);
/* Registers [addr, addr + len) with every transport (ucp_mem_map), once: the
 * local pool.  Sends from it and receives into it then use the handle. */
int ucx_mem_map(struct ucx_node *n, void *addr, size_t len);

/* An endpoint to the node whose worker address is addr (copied). */
int ucx_peer_create(struct ucx_node *n, const void *addr, size_t len, struct ucx_peer **out);
/* Force-closes, fails its batches (done called), frees. */
void ucx_peer_destroy(struct ucx_peer *p);
/* The lanes UCX chose for this endpoint ("tcp/lo"; several joined by ','),
 * "" before the endpoint is connected; from ucp_ep_print_info. */
const char *ucx_peer_transport(struct ucx_peer *p);

struct ucx_fetch_item {
    umbp_key_t key;
    void *dst;     /* where the bytes land */
    uint64_t cap;  /* bytes available at dst (1 .. UCX_OBJ_MAX) */
    uint64_t size; /* out: the object's size (when status is 0 or -EMSGSIZE) */
    int status;    /* out, see above */
};

typedef void (*ucx_fetch_done_fn)(void *arg, struct ucx_fetch_item *items, uint32_t n);

/* Fetches items[0, n) (n <= UCX_FETCH_MAX_KEYS, timeout_ms >= 1) from p.
 * The caller keeps items and every dst untouched until done.  0: done will
 * be called exactly once; negative errno: nothing was sent, done is never
 * called (-EINVAL shape, -ENOMEM, -ECONNREFUSED endpoint creation failed). */
int ucx_fetch(struct ucx_peer *p, struct ucx_fetch_item *items, uint32_t n, uint32_t timeout_ms,
              ucx_fetch_done_fn done, void *arg);

/* Counters, for logs and /metrics. */
struct ucx_node_stats {
    uint64_t fetches, fetch_keys, fetch_bytes; /* requester: batches, keys landed, bytes */
    uint64_t timeouts, peer_errors, force_closes;
    uint64_t late_dropped, bad_messages;       /* DATA for no live batch; malformed */
    uint64_t data_eager, data_rndv; /* requester: objects UCX delivered eager (in the
                                       message) or by rendezvous (received after) */
    uint64_t served_keys, served_bytes, served_misses; /* owner */
    uint64_t serve_timeouts; /* owner: requester endpoints force-closed by the bound */
    uint64_t bad_macs;       /* FETCHes refused, DATA dropped: a mac that was wrong */
    uint64_t refused;        /* requester: keys an owner refused (-EACCES: its secret differs) */
};
void ucx_node_stats(const struct ucx_node *n, struct ucx_node_stats *out);

/* For benchmarks comparing one-sided get (the variant kept for RDMA hosts):
 * the UCP handles, opaque here so this header needs no UCX include. */
void *ucx_node_worker(struct ucx_node *n);   /* ucp_worker_h */
void *ucx_node_context(struct ucx_node *n);  /* ucp_context_h */
void *ucx_node_memh(struct ucx_node *n);     /* ucp_mem_h of ucx_mem_map, or NULL */
void *ucx_peer_ep(struct ucx_peer *p);       /* ucp_ep_h, connecting if needed; NULL on failure */

#endif
