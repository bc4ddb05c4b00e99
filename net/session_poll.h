/*
 * session_poll.h - the poll() driver of a client session (session.h): a
 * Unix socket driven on the caller's thread, with no event loop.  Two uses:
 *
 *   - Many sessions at once, bounded by the caller's deadline
 *     (net_poll_run): the scheduler's lookup client (lookup/lookup_client.c)
 *     pushes one call per rank, then waits on every rank's socket in one
 *     poll() until each call is done or the deadline passed.  Nothing
 *     happens between runs: a backoff that ends, a deadline that passes or
 *     bytes that arrive are seen at the next run (the first thing a run
 *     does is tick the sessions and read, without waiting, what is there).
 *   - One blocking connection, no deadline or the caller's
 *     (net_poll_dial, net_poll_write_all, net_poll_read): the umbp tool and
 *     the server's tests (server/sync_client.c), which read the frames
 *     themselves from the session's input (net_session_in_next).
 *
 * The socket is non-blocking in both uses; the only waits are poll()
 * bounded by the given deadline (0: none).  The driver words the failures
 * of its own steps through the owner's `failed` hook, so each owner keeps
 * the wording its operators know.  It does not watch the socket's
 * directory: an owner that wants to (the lookup client: one watch for every
 * rank's socket) calls net_session_appeared itself.
 *
 * Threads: the caller's, one at a time per session.
 */
#ifndef UMBP_NET_SESSION_POLL_H
#define UMBP_NET_SESSION_POLL_H

#include <poll.h>
#include <stdint.h>

#include "session.h"

/* A step of the transport that failed. */
enum net_poll_step {
    NET_POLL_SOCKET,   /* socket() */
    NET_POLL_CONNECT,  /* connect(), or its completion */
    NET_POLL_SEND,
    NET_POLL_RECV,
};

struct net_poll_config {
    const char *path;  /* the peer's Unix socket; or NULL and tcp_address */
    const char *tcp_address; /* "host:port" (tcp.h): a TCP peer, dialled without blocking
                                (a host name is resolved, blocking, at each dial) */
    /* Optional: a connected socket's peer is acceptable (0), or err says
     * why not. */
    int (*check_peer)(void *ctx, int fd, char *err, size_t errlen);
    /* Optional: words why `step` failed with errno e (default: strerror). */
    void (*failed)(void *ctx, enum net_poll_step step, int e, char *why, size_t whylen);
    /* Optional, TCP only: the address to dial now, asked before each dial
     * (umbp-master's clients: the leader published in Redis).  0 and addr;
     * or < 0 and why: the dial fails at once.  Must not block long. */
    int (*resolve)(void *ctx, char *addr, size_t addrlen, char *why, size_t whylen);
    void *ctx;
};

#define NET_POLL_PATH_MAX 108

struct net_poll {
    struct net_session *s;
    struct net_poll_config cfg;
    char path[NET_POLL_PATH_MAX];
    char tcp_address[NET_POLL_PATH_MAX + 160];
    int fd;            /* the connection; -1: none */
    int slot;          /* net_poll_run: its pollfd; -1: none */
};

/* Binds d to s (s->io: close only; a push is written by the next run). */
void net_poll_init(struct net_poll *d, struct net_session *s, const struct net_poll_config *cfg);

/* ---- many sessions, the caller's deadline ------------------------------------------- */

/* Drives the n sessions until done(arg) says so (checked after every
 * round; NULL: never) or until_ns passes (0: no bound): ticks each at its
 * deadline, dials what wants dialling, writes, reads and hands the bytes
 * to the core.  A run begins no new attempt: a session that is
 * disconnected stays so until its owner ticks it (the lookup client: at
 * the next query that asks its rank, once the backoff is over).  until_ns at or before now: one round without waiting.
 * pfd: room for n entries.  0 (done), -ETIMEDOUT (until_ns passed), or
 * -errno (poll failed; with nothing to wait for and no bound, -ENOTCONN). */
int net_poll_run(struct net_poll *const *d, size_t n, struct pollfd *pfd, uint64_t until_ns,
                 bool (*done)(void *arg), void *arg);

/* ---- one blocking connection --------------------------------------------------------- */

/* Connects (waiting for room in the listener's backlog up to until_ns, as a
 * blocking connect would) and checks the peer; the session is not told
 * (net_session_adopt it after a handshake of the owner's).  0, or -errno
 * with why worded by the failed hook (or check_peer). */
int net_poll_dial(struct net_poll *d, uint64_t until_ns, char *why, size_t whylen);
/* Writes all of the session's output.  0, -ETIMEDOUT, or -errno (what was
 * not written stays in the output). */
int net_poll_write_all(struct net_poll *d, uint64_t until_ns);
/* Writes all of buf[0, len) (bytes of the owner's, not framed here: the
 * server's tests send broken frames).  0, -ETIMEDOUT, or -errno. */
int net_poll_write(struct net_poll *d, const void *buf, size_t len, uint64_t until_ns);
/* One read into the session's input (waiting for bytes up to until_ns),
 * not handled (net_session_in_next reads them): bytes read, 0 at EOF,
 * -ETIMEDOUT, -EPROTO (an fd too many), -ENOMEM or -errno. */
long net_poll_read(struct net_poll *d, uint64_t until_ns);
/* Closes the socket (the session does, through io.close, when it drops
 * the connection). */
void net_poll_close(struct net_poll *d);

#endif /* UMBP_NET_SESSION_POLL_H */
