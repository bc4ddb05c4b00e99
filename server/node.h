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
/* Loop thread, as the server stops: outstanding calls end, watchers stop. */
void srv_node_stop(struct srv_node *n);
void srv_node_destroy(struct srv_node *n);

#endif /* UMBP_SERVER_NODE_H */
