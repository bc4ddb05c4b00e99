/*
 * master_config.c - umbp-master's option table and the parse of its config
 * (master.h): umbp_options_apply over the table, then the cross-option
 * checks.  Messages name the option and the fix.  Caller's thread.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "leader_lease.h"
#include "master.h"
#include "options.h"
#include "proto.h"
#include "tcp.h"

#define OFF(f) offsetof(struct master_options, f)

static const char *const levels[] = {"error", "warn", "info", "debug", NULL};

const struct umbp_option master_options[] = {
    {"listen", UMBP_OPT_STRING, OFF(listen), "127.0.0.1:7390", 0, 0, 256, NULL,
     "master: host:port the nodes and lookup clients connect to (IPv6: [addr]:port); an "
     "address other hosts reach needs secret_file"},
    {"secret_file", UMBP_OPT_STRING, OFF(secret_file), "", 0, 0, 512, NULL,
     "master: file holding the cluster's shared secret (16 .. 4096 bytes, mode 0600): "
     "every peer proves it holds it before HELLO; empty = no handshake (loopback only)"},
    {"heartbeat_suspect_ms", UMBP_OPT_INT, OFF(heartbeat_suspect_ms), "3000", 100, 600000, 0,
     NULL,
     "master: a node without a heartbeat this long is suspect: lookups stop returning it"},
    {"heartbeat_dead_ms", UMBP_OPT_INT, OFF(heartbeat_dead_ms), "10000", 200, 3600000, 0, NULL,
     "master: a node without a heartbeat this long is dead: its keys leave the index and "
     "it must register again (> heartbeat_suspect_ms)"},
    {"max_nodes", UMBP_OPT_INT, OFF(max_nodes), "1024", 1, PROTO_MAX_NODES_FRAME, 0, NULL,
     "master: registered nodes at most; a REGISTER past it is refused"},
    {"max_replicas", UMBP_OPT_INT, OFF(max_replicas), "3", 1, PROTO_MAX_REPLICAS, 0, NULL,
     "master: owners recorded per key; a further node's copy is not indexed (its "
     "readers find the others)"},
    {"max_keys", UMBP_OPT_INT, OFF(max_keys), "16777216", 1024, 1ll << 32, 0, NULL,
     "master: keys indexed at most (about 64 bytes each); a stored event for a new key past "
     "it is dropped and counted (a miss for that key)"},
    {"max_connections", UMBP_OPT_INT, OFF(max_connections), "4096", 1, 65536, 0, NULL,
     "master: connected nodes and clients at most; more are refused"},
    {"handshake_timeout_ms", UMBP_OPT_INT, OFF(handshake_timeout_ms), "5000", 10, 3600000, 0,
     NULL,
     "master: a peer that has not finished AUTH and HELLO this long after connecting is "
     "disconnected"},
    {"frame_timeout_ms", UMBP_OPT_INT, OFF(frame_timeout_ms), "30000", 10, 3600000, 0, NULL,
     "master: a frame whose last byte has not come this long after its first ends its "
     "connection"},
    {"metrics_port", UMBP_OPT_INT, OFF(metrics_port), "0", 0, 65535, 0, NULL,
     "master: TCP port of the Prometheus /metrics endpoint; 0 = off"},
    {"metrics_address", UMBP_OPT_STRING, OFF(metrics_address), "127.0.0.1", 0, 0, 64, NULL,
     "master: address (IPv4 or IPv6) the /metrics endpoint listens on"},
    {"log_level", UMBP_OPT_STRING, OFF(log_level), "info", 0, 0, 16, levels,
     "master: error, warn, info or debug"},
    {"lease_url", UMBP_OPT_STRING, OFF(lease_url), "", 0, 0, 384, NULL,
     "master: redis://host:port/<cluster> (or redis+sentinel://h:p,h:p/<service>/<cluster>; "
     "rediss:// and rediss+sentinel:// over TLS)[?password_file=PATH[&user=NAME]"
     "[&sentinel_password_file=PATH]]"
     "[&tls_ca_file=PATH][&tls_cert_file=PATH&tls_key_file=PATH][&tls_server_name=NAME]: "
     "several masters elect one leader through a lease in "
     "this Redis (or Valkey); the others stand by; nodes and lookup clients given the same URL "
     "as master_address follow the leader; empty = one master, no lease"},
    {"advertise", UMBP_OPT_STRING, OFF(advertise), "", 0, 0, 64, NULL,
     "master: host:port the lease publishes for nodes and clients to dial; empty = the listen "
     "address (which must then not be a wildcard)"},
    {"lease_ttl_ms", UMBP_OPT_INT, OFF(lease_ttl_ms), "3000", 300, 600000, 0, NULL,
     "master: the leader lease's length: the leader renews it every third, a standby takes "
     "it within about this long after the leader dies"},
    {"lease_timeout_ms", UMBP_OPT_INT, OFF(lease_timeout_ms), "0", 0, 60000, 0, NULL,
     "master: each call to the lease store (connect, the TLS handshake with rediss://, then "
     "the command) is bounded by this "
     "(at most lease_ttl_ms / 3); 0 = 500 ms or lease_ttl_ms / 3 if shorter"},
    {.name = NULL},
};

int master_options_parse(const char *json, struct master_options *o, char *err, size_t errlen)
{
    memset(o, 0, sizeof(*o));
    struct umbp_opt_table t = {.opts = master_options, .base = o, .owner = "master"};
    int rc = umbp_options_apply(&t, 1, json, err, errlen);
    if (rc < 0)
        return rc;
    if (o->heartbeat_dead_ms <= o->heartbeat_suspect_ms) {
        snprintf(err, errlen, "heartbeat_dead_ms (%lld) must exceed heartbeat_suspect_ms "
                 "(%lld): a node is suspect before it is dead",
                 (long long)o->heartbeat_dead_ms, (long long)o->heartbeat_suspect_ms);
        return -EINVAL;
    }
    char host[NET_TCP_HOST_MAX];
    uint16_t port;
    if ((rc = net_tcp_split(o->listen, "listen", host, sizeof(host), &port, err, errlen)) < 0)
        return rc;
    if (o->lease_url[0]) {
        struct lease_url u;
        if ((rc = lease_url_parse(o->lease_url, "lease_url", &u, err, errlen)) < 0)
            return rc;
        if (o->lease_timeout_ms == 0)
            o->lease_timeout_ms = o->lease_ttl_ms / 3 < 500 ? o->lease_ttl_ms / 3 : 500;
        if (o->lease_timeout_ms * 3 > o->lease_ttl_ms) {
            snprintf(err, errlen, "lease_timeout_ms (%lld) must be at most lease_ttl_ms / 3 "
                     "(%lld): a renewal must end well before the lease does",
                     (long long)o->lease_timeout_ms, (long long)o->lease_ttl_ms / 3);
            return -EINVAL;
        }
        const char *pub = o->advertise[0] ? o->advertise : o->listen;
        char h2[NET_TCP_HOST_MAX];
        uint16_t p2;
        if ((rc = net_tcp_split(pub, o->advertise[0] ? "advertise" : "listen", h2, sizeof(h2),
                                &p2, err, errlen)) < 0)
            return rc;
        if (!strcmp(h2, "0.0.0.0") || !strcmp(h2, "::") || !h2[0]) {
            if (o->advertise[0])
                snprintf(err, errlen, "advertise %s is a wildcard: set advertise to the "
                         "host:port nodes dial (the lease publishes it)", o->advertise);
            else
                snprintf(err, errlen, "lease_url is set and listen %s is a wildcard: set "
                         "advertise to the host:port nodes dial", o->listen);
            return -EINVAL;
        }
        if (o->advertise[0] && p2 == 0) {
            snprintf(err, errlen, "advertise %s: give the port nodes dial", o->advertise);
            return -EINVAL;
        }
    } else if (o->advertise[0]) {
        snprintf(err, errlen, "advertise is set without lease_url: it is what the lease "
                 "publishes; nodes of a single master dial master_address");
        return -EINVAL;
    }
    if (!o->secret_file[0] && !net_tcp_is_loopback(o->listen)) {
        snprintf(err, errlen, "listen %s is reachable from other hosts: set secret_file (peers "
                 "on other hosts cannot be checked by uid), or listen on 127.0.0.1", o->listen);
        return -EINVAL;
    }
    return 0;
}
