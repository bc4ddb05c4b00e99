/*
 * master_client.h - a client of umbp-master over TCP: one net/session
 * driven by its poll() driver on the caller's thread (net/session_poll.h),
 * so every call returns by its deadline, and lookups are single flight:
 * while a LOCATE is overdue (an orphan: the master stalled), later ones
 * miss at once without asking (UMBP_E_NOT_ATTEMPTED).  Reconnects with
 * backoff (10 ms doubling to 1 s) when a call finds the connection gone.
 *
 * Used by the tests and bench_master as a node and as a lookup client.
 *
 * Two drivers.  Without a loop in the config every call blocks the caller
 * until its reply or its deadline (poll()).  With a loop (the rdma tier:
 * the runtime's loop) the client runs on it through net/session_ev.h over
 * TCP, reconnecting by backoff on its own, and only the *_async calls are
 * allowed: each returns at once, and 0 means done is called exactly once,
 * later, on the loop thread (with the call's status and, for REGISTER,
 * HEARTBEAT and RESYNC, the ack); a negative code means nothing was sent
 * and done is never called (UMBP_E_NOT_ATTEMPTED: not connected, or a
 * lookup overdue).  out arrays stay the caller's until done; after done
 * the client never writes them.
 *
 * Threads: one caller at a time per client; with a loop, its thread only.
 */
#ifndef UMBP_MASTER_CLIENT_H
#define UMBP_MASTER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "proto.h"

struct ev_loop;

struct mclient_config {
    /* The master's host:port; or the lease store where the masters elect
     * their leader, redis://host:port/<cluster> (leader_lease.h): the client
     * dials whichever master the store names, follows a takeover, and
     * refuses a master whose epoch is below one it has seen. */
    const char *address;
    uint64_t discovery_poll_ms;        /* a store address: its read period (0: 250) */
    uint64_t discovery_timeout_ms;     /* each store read's bound (0: 500) */
    const struct net_auth_key *auth;   /* the cluster's secret, or NULL */
    uint8_t role;                      /* PROTO_ROLE_NODE, _LOOKUP or _ADMIN */
    const char *engine_id;             /* in the master's log lines */
    uint64_t timeout_ms;               /* each call (lookup_timeout_ms for lookups) */
    uint64_t locate_timeout_ms;        /* LOCATE's bound if not 0 (else timeout_ms) */
    uint64_t hello_timeout_ms;         /* dial + AUTH + HELLO */
    struct ev_loop *loop;              /* NULL: blocking calls; else *_async on it */
    /* With a loop: the connection came up (after any outage) or went down;
     * either may be NULL.  Loop thread. */
    void (*on_up)(void *arg);
    void (*on_down)(void *arg, const char *why);
    void *arg;
};

struct mclient;

/* The master_address option of a node or a lookup client: host:port, or a
 * lease store URL (leader_lease.h); without a secret, only this host.  0, or
 * -EINVAL / -ENOTSUP with err naming the option and the fix. */
int mclient_check_address(const char *address, bool have_secret, char *err, size_t errlen);

int mclient_create(const struct mclient_config *cfg, struct mclient **out);
void mclient_destroy(struct mclient *c);

/* Calls.  0; UMBP_E_NOT_ATTEMPTED (not connected and could not connect by
 * the deadline, or a lookup overdue); UMBP_E_TIMEOUT; -ECONNRESET (the
 * connection dropped: mclient_last_error says why, e.g. the master's ERROR
 * or HELLO_ERR text); -EPROTO (a reply that does not parse). */
int mclient_register(struct mclient *c, const struct proto_register *r, struct proto_ack *ack);
/* HEARTBEAT: status (seq, used) then events (seq consecutive). */
int mclient_heartbeat(struct mclient *c, uint64_t seq, uint64_t used,
                      const struct proto_node_event *ev, size_t n, struct proto_ack *ack);
/* The node's whole key set as of seq, in frames of at most per_frame keys
 * (0: 65535), pipelined; *ack is the last frame's. */
int mclient_resync(struct mclient *c, uint64_t seq, uint64_t used, const umbp_key_t *keys,
                   const uint64_t *sizes, size_t n, size_t per_frame, struct proto_ack *ack);
/* One round trip: LOCATE of n keys (<= PROTO_MAX_RECORDS) pipelined with
 * NODES (the list comes only when it changed).  out[i]: key i's owners. */
int mclient_locate(struct mclient *c, const umbp_key_t *keys, size_t n,
                   struct proto_location *out);
/* The node list as last received (after a locate or mclient_nodes). */
int mclient_nodes(struct mclient *c);
const struct proto_node_info *mclient_node(const struct mclient *c, uint32_t ref);
size_t mclient_node_list(const struct mclient *c, const struct proto_node_info **out);

/* With a loop: the *_async calls (see the top).  ack is NULL for LOCATE and
 * NODES, and when status is not 0. */
typedef void (*mclient_done_fn)(void *arg, int status, const struct proto_ack *ack);
/* With a loop: start connecting now (create does not). */
void mclient_start(struct mclient *c);
int mclient_register_async(struct mclient *c, const struct proto_register *r,
                           mclient_done_fn done, void *arg);
int mclient_heartbeat_async(struct mclient *c, uint64_t seq, uint64_t used,
                            const struct proto_node_event *ev, size_t n, mclient_done_fn done,
                            void *arg);
int mclient_resync_async(struct mclient *c, uint64_t seq, uint64_t used, const umbp_key_t *keys,
                         const uint64_t *sizes, size_t n, size_t per_frame, mclient_done_fn done,
                         void *arg);
int mclient_locate_async(struct mclient *c, const umbp_key_t *keys, size_t n,
                         struct proto_location *out, mclient_done_fn done, void *arg);
/* SUSPECT: refs of nodes this node failed to fetch from (n <= 2048); no
 * reply, nothing waits.  0, or UMBP_E_NOT_ATTEMPTED (not connected). */
int mclient_suspect(struct mclient *c, const uint32_t *refs, size_t n);
/* With a loop: whether the connection is up (HELLO_OK received). */
bool mclient_connected(const struct mclient *c);

const char *mclient_last_error(const struct mclient *c);
/* The epoch of the master connected to (0: none, or one without a lease). */
uint64_t mclient_master_epoch(const struct mclient *c);
/* Session health (0 or UMBP_E_NOT_ATTEMPTED): for tests. */
int mclient_health(struct mclient *c);

#endif /* UMBP_MASTER_CLIENT_H */
