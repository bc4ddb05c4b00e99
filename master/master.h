/*
 * master.h - umbp-master as a library: a soft-state directory of the
 * cluster's objects (directory.h) served over TCP on the net/ service
 * (net/service.h, net/tcp.h, the shared-secret handshake of net/auth.h).
 * tools/umbp_master.c is a thin main over it.
 *
 * Who talks to it: nodes (HELLO role node: REGISTER, HEARTBEAT, RESYNC,
 * and lookups) and lookup clients (role lookup: LOCATE, NODES, PING).
 * Frames and their rules: docs/protocol.md, "umbp-master".
 *
 * Threads: create and destroy on the caller's thread; run on the thread
 * that calls it (the loop thread: everything else is owned by it); stop
 * from any thread or a signal handler (an ev_async).
 */
#ifndef UMBP_MASTER_H
#define UMBP_MASTER_H

#include <stddef.h>
#include <stdint.h>

#include "umbp/tier.h"

/* The option table (master_config.c) and the struct it fills. */
struct master_options {
    char listen[256];
    char secret_file[512];
    int64_t heartbeat_suspect_ms, heartbeat_dead_ms;
    int64_t max_nodes, max_replicas, max_keys, max_connections;
    int64_t handshake_timeout_ms, frame_timeout_ms;
    int64_t metrics_port;
    char metrics_address[64];
    char log_level[16];
    char lease_url[384];          /* "" = one master, no lease */
    char advertise[64];
    int64_t lease_ttl_ms, lease_timeout_ms;
};
extern const struct umbp_option master_options[];

/* The options from JSON (NULL = defaults) and UMBP_* variables, with the
 * cross-option checks.  0, or -EINVAL with err naming the option. */
int master_options_parse(const char *json, struct master_options *o, char *err, size_t errlen);

struct umbp_master;

int umbp_master_create(const char *json, struct umbp_master **out, char *err, size_t errlen);
/* Serves until umbp_master_stop. */
void umbp_master_run(struct umbp_master *m);
void umbp_master_stop(struct umbp_master *m); /* async-signal-safe */
void umbp_master_destroy(struct umbp_master *m);
/* The address it listens on, with the port bound ("127.0.0.1:7390"). */
const char *umbp_master_address(const struct umbp_master *m);
/* lease_url, or NULL when this master runs alone (no lease). */
const char *umbp_master_lease_url(const struct umbp_master *m);

#endif /* UMBP_MASTER_H */
