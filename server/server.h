/*
 * server.h - umbp-server as a library: the standalone-mode daemon that owns
 * one host's shared-memory pool and serves every engine process on the host
 * over a Unix socket (the protocol of net/proto.h).  The program
 * tools/umbp_server.c is a thin main over these four calls.
 *
 * Threads: create, run and destroy on one thread; run is the server's loop
 * thread and owns everything (store, sessions) while it runs, so nothing is
 * locked.  stop may be called from any thread and from a signal handler.
 */
#ifndef UMBP_SERVER_H
#define UMBP_SERVER_H

#include <stddef.h>

struct umbp_server;

/* Parses the config (JSON, the same options as the clients' plus the
 * server's own; NULL = defaults), takes the socket path (failing if a live
 * server holds it), maps the pool and listens.  On failure err names the
 * option or the cause and the fix; 0 or a negative errno. */
int umbp_server_create(const char *json, struct umbp_server **out, char *err, size_t errlen);

/* Serves until umbp_server_stop; returns 0.  Listening stops (and the
 * socket is removed) as soon as stop is seen. */
int umbp_server_run(struct umbp_server *s);

/* Asks run to return.  Async-signal-safe; any thread; idempotent. */
void umbp_server_stop(struct umbp_server *s);

/* Disconnects every client (their leases and reservations end), removes
 * the socket and its lock file, unmaps and frees the pool.  NULL is a
 * no-op.  Not while run is running. */
void umbp_server_destroy(struct umbp_server *s);

/* The socket path served and the pool's size, for the start-up line. */
const char *umbp_server_socket_path(const struct umbp_server *s);
unsigned long long umbp_server_pool_bytes(const struct umbp_server *s);

#endif /* UMBP_SERVER_H */
