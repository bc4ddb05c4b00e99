/*
 * sync_client.h - a small blocking client of umbp-server: connect, HELLO
 * (keeping the pool descriptor a worker is given), send frames, read reply
 * frames one by one.  For the `umbp` tool and the server's tests; the
 * engine-side client is the shm tier (backends/shm), which never blocks.
 *
 * The blocking use of a client session (net/session.h): the session holds
 * the connection's input and output bytes and the HELLO_OK's descriptor,
 * its poll() driver (net/session_poll.h) dials, writes and reads, each wait
 * bounded by timeout_ms (0: none).  This file keeps the handshake's
 * wording, the call of a request without records, and the frame last read.
 *
 * One thread per client; no shared state.
 */
#ifndef UMBP_SERVER_SYNC_CLIENT_H
#define UMBP_SERVER_SYNC_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "session.h"
#include "session_poll.h"

struct sync_client {
    int fd;                      /* the driver's socket (the tests read it raw); -1 */
    int pool_fd;                 /* worker: the pool's descriptor; else -1 */
    struct proto_welcome welcome;
    uint64_t next_seq;
    struct net_session s;        /* input and output bytes */
    struct net_poll d;           /* the socket */
    bool open;                   /* s and d are initialised */
    int timeout_ms;
    long in_used;                /* the frame last returned, still in s's input */
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
 * returns its reply in *f, skipping EVENTS: 0 only for a frame of the
 * request's reply type and seq.  An ERROR frame, or another reply: -EPROTO
 * and err says which. */
int sync_client_call(struct sync_client *c, uint16_t type, struct proto_frame *f, char *err,
                     size_t errlen);

void sync_client_close(struct sync_client *c);

#endif /* UMBP_SERVER_SYNC_CLIENT_H */
