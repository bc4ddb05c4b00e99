/*
 * master_client.h - a client of umbp-master over TCP: one net/session
 * driven by its poll() driver on the caller's thread (net/session_poll.h),
 * so every call returns by its deadline, and lookups are single flight:
 * while a LOCATE is overdue (an orphan: the master stalled), later ones
 * miss at once without asking (UMBP_E_NOT_ATTEMPTED).  Reconnects with
 * backoff (10 ms doubling to 1 s) when a call finds the connection gone.
 *
 * Used by the tests and bench_master as a node and as a lookup client;
 * the runtime's node side will own one the same way.
 *
 * Threads: one caller at a time per client.
 */
#ifndef UMBP_MASTER_CLIENT_H
#define UMBP_MASTER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "proto.h"

struct mclient_config {
    const char *address;               /* the master's host:port */
    const struct net_auth_key *auth;   /* the cluster's secret, or NULL */
    uint8_t role;                      /* PROTO_ROLE_NODE, _LOOKUP or _ADMIN */
    const char *engine_id;             /* in the master's log lines */
    uint64_t timeout_ms;               /* each call (lookup_timeout_ms for lookups) */
    uint64_t hello_timeout_ms;         /* dial + AUTH + HELLO */
};

struct mclient;

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

const char *mclient_last_error(const struct mclient *c);
/* Session health (0 or UMBP_E_NOT_ATTEMPTED): for tests. */
int mclient_health(struct mclient *c);

#endif /* UMBP_MASTER_CLIENT_H */
