/*
 * master_int.h - what master.c and master_metrics.c share: the master's
 * struct and its counters.  Private to master/.
 */
#ifndef UMBP_MASTER_INT_H
#define UMBP_MASTER_INT_H

#include <ev.h>
#include <pthread.h>
#include <stdbool.h>

#include "directory.h"
#include "master.h"
#include "service.h"

struct master_metrics;

struct umbp_master {
    struct master_options o;
    struct ev_loop *loop;
    struct net_service svc;
    bool serving;                 /* svc initialised and accepting */
    int listen_fd;
    char address[NET_TCP_HOST_MAX + 16];
    struct net_auth_key key;
    bool have_key;
    struct directory *dir;
    struct proto_node_info *nodes_buf; /* max_nodes: NODES_R */
    ev_timer sweep_w;
    ev_async stop_w;
    const struct dir_node *reporter; /* SUSPECT being handled: its sender */
    struct {
        uint64_t refused, auth_failed, malformed, timeouts, locates;
    } cnt;                        /* loop thread */
    struct master_metrics *metrics; /* NULL: metrics_port 0 */
    /* High availability (ha.h): NULL without lease_url.  leading and
     * epoch are the loop thread's copy of the lease thread's view, applied
     * when role_w rings; without a lease the master always leads, epoch 0. */
    struct master_ha *ha;
    ev_async role_w;
    bool leading;
    uint64_t epoch;
    uint64_t standby_refused;     /* HELLOs refused while standing by */
    struct dir_config dc;         /* to empty the directory at a step-down */
};

void master_conn_name(const struct net_conn *c, char *buf, size_t len);

/* master_metrics.c: /metrics on metrics_address:metrics_port. */
int master_metrics_start(struct umbp_master *m, char *err, size_t errlen);
void master_metrics_stop(struct umbp_master *m);
/* Loop thread: a LOCATE frame took ns to handle. */
void master_metrics_observe(struct umbp_master *m, uint64_t ns);
/* Loop thread, each sweep: the snapshot the HTTP thread serves. */
void master_metrics_render(struct umbp_master *m);

#endif /* UMBP_MASTER_INT_H */
