/*
 * sync_client.h - a small blocking client of umbp-server: connect, HELLO
 * (keeping the pool descriptor a worker is given), send frames, read reply
 * frames one by one.  For the `umbp` tool and the server's tests; the
 * engine-side client is the shm tier (backends/shm), which never blocks.
 *
 * One thread per client; no shared state.
 */
#ifndef UMBP_SERVER_SYNC_CLIENT_H
#define UMBP_SERVER_SYNC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

struct sync_client {
    int fd;
    int pool_fd;                 /* worker: the pool's descriptor; else -1 */
    struct proto_welcome welcome;
    uint8_t *in;                 /* received bytes [0, in_len); the frame last
                                    returned occupies [0, in_used) */
    size_t in_len, in_used, in_cap;
    uint64_t next_seq;
};

/* Connects to the socket at path (timeout_ms bounds every later read and
 * write; 0 = none) without the handshake.  0 or -errno; err names the path
 * and the likely fix. */
int sync_client_dial(struct sync_client *c, const char *path, int timeout_ms, char *err,
                     size_t errlen);

/* dial + HELLO + its answer.  HELLO_ERR: -EPROTO (or the status it
 * carries) and its message in err. */
int sync_client_connect(struct sync_client *c, const char *path, const struct proto_hello *h,
                        int timeout_ms, char *err, size_t errlen);

/* Writes all of buf.  0 or -errno. */
int sync_client_send(struct sync_client *c, const void *buf, size_t len);

/* Reads the next frame (any server type, EVENTS and ERROR included); *f
 * stays valid until the next call.  0; -ECONNRESET on EOF; -ETIMEDOUT;
 * -EPROTO (err names the field). */
int sync_client_recv(struct sync_client *c, struct proto_frame *f, char *err, size_t errlen);

/* A request without records (STATS, SESSIONS, CLEAR, PING): sends it and
 * returns its reply in *f, skipping EVENTS.  An ERROR frame: -EPROTO and
 * its message in err. */
int sync_client_call(struct sync_client *c, uint16_t type, struct proto_frame *f, char *err,
                     size_t errlen);

void sync_client_close(struct sync_client *c);

#endif /* UMBP_SERVER_SYNC_CLIENT_H */
