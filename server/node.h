/*
 * node.h - umbp-server as a node of a distributed cluster (node.c): with
 * master_address in its config the server hosts the rdma tier over its own
 * pool, announces its objects to umbp-master and serves them to peers.
 * The options are the rdma tier's (docs/configuration.md, distributed).
 * Loop thread, except create and destroy (while the loop does not run).
 */
#ifndef UMBP_SERVER_NODE_H
#define UMBP_SERVER_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/tier.h"

struct umbp_server;
struct srv_node;

/* The node's option table and its config struct's size; NULL and 0 in a
 * server built without UCX. */
const struct umbp_option *srv_node_options(size_t *config_size);
/* The config names a master: the server is a node. */
bool srv_node_wanted(const void *cfg);
/* Cross-option checks of a config with master_address set. */
int srv_node_validate(const void *cfg, const struct umbp_core_config *core, char *err,
                      size_t errlen);
/* Starts the node (UCX worker, the pool registered with it, the master's
 * client) on the server's loop; the pool must exist.  err names the cause. */
int srv_node_create(struct umbp_server *s, const void *cfg, struct srv_node **out, char *err,
                    size_t errlen);
/* The store's STORED / REMOVED events (the node tells the master). */
void srv_node_event(struct srv_node *n, umbp_event_type_t type, const umbp_key_t *key,
                    uint64_t size);
/*
 * Keys a client asked for that the store lacks, taken to the cluster (not
 * once the node is stopping: -ESHUTDOWN, they miss): a
 * LOOKUP learns which of them a live owner holds (the master's LOCATE); an
 * ACQUIRE also fetches them into the pool as replicas (published: the
 * handler then leases them from the store as any other object).  A fetched
 * object the pool cannot keep as a replica (above its high watermark, or
 * larger than remote_cache_max_bytes) is dropped: that key misses.  Every
 * call is bounded by lookup_timeout_ms and timeout_ms.
 *
 * srv_node_call returns 1 when it completed inline (the results are in the
 * call, done is not called), 0 when done(arg) will run later, or a
 * negative code (no memory: the keys miss).  A call whose client went away
 * is cancelled: done is never called, and the call is freed when the
 * cluster answers.
 */
struct srv_node_call;
typedef void (*srv_node_done_fn)(void *arg);
int srv_node_call(struct srv_node *n, bool fetch, const umbp_key_t *keys, size_t nkeys,
                  uint64_t ttl_ms, srv_node_done_fn done, void *arg,
                  struct srv_node_call **out);
/* A lookup's answer for key i of the call (false for a fetch). */
bool srv_node_call_present(const struct srv_node_call *c, size_t i);
/* Frees a completed call. */
void srv_node_call_free(struct srv_node_call *c);
/* The client went away: done is not called; freed once the cluster answers. */
void srv_node_call_cancel(struct srv_node_call *c);

/* The node's counters for /metrics (metrics.c); false without a node. */
struct srv_node_stats {
    uint64_t remote_hits, remote_misses, remote_failed, remote_retries, remote_bytes, replicas;
    uint64_t locates;
    uint64_t heartbeats, resyncs, registers, reports, live_keys;
    uint64_t data_eager, data_rndv, served_keys, served_bytes;
    uint32_t node_ref;
    bool registered;
    char transports[64];
};
bool srv_node_stats(struct srv_node *n, struct srv_node_stats *out);

/* Loop thread, as the server stops: outstanding calls end, watchers stop. */
void srv_node_stop(struct srv_node *n);
void srv_node_destroy(struct srv_node *n);

#endif /* UMBP_SERVER_NODE_H */
