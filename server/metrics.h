/*
 * metrics.h - umbp-server's Prometheus endpoint (metrics.c): GET /metrics
 * on metrics_address:metrics_port, in the text format 0.0.4.  The loop
 * thread renders snapshots; libmicrohttpd's thread only serves them.
 */
#ifndef UMBP_SERVER_METRICS_H
#define UMBP_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct umbp_server;

/* On the thread that creates the server, once its loop exists.  With
 * metrics_port 0 nothing happens (s->metrics stays NULL).  Otherwise binds
 * metrics_address:metrics_port and starts the HTTP thread; 0, or a negative
 * errno with err naming metrics_port, the address and the fix (a port
 * already taken is -EADDRINUSE). */
int srv_metrics_start(struct umbp_server *s, char *err, size_t errlen);

/* Stops the HTTP thread (waiting for it) and frees everything; the port is
 * closed on return.  Not while umbp_server_run runs.  Idempotent. */
void srv_metrics_stop(struct umbp_server *s);

/* Loop thread: one request frame of `type` took ns nanoseconds to handle.
 * Types without a histogram, and a server without metrics, are ignored. */
void srv_metrics_observe(struct umbp_server *s, uint16_t type, uint64_t ns);

#endif /* UMBP_SERVER_METRICS_H */
