/*
 * session_ev.h - the libev driver of a client session (session.h): a Unix
 * socket (or a TCP connection), its read and write watchers, one timer for the core's next
 * deadline, and the inotify watch on the socket's directory, all on the
 * owner's loop.
 *
 * The loop never blocks here: the socket is non-blocking, a connect that
 * does not complete at once is finished by the write watcher.  A write that
 * meets a dead socket is reported on the next loop iteration (a zero timer),
 * never from inside the owner's call.  Without inotify (no fd, a full
 * watch table) or with the directory removed (its watch is re-added at each
 * attempt) the backoff alone reconnects.
 *
 * Threads: the loop's thread only (net_ev_init and net_ev_start before the
 * loop runs, from the creating thread).
 */
#ifndef UMBP_NET_SESSION_EV_H
#define UMBP_NET_SESSION_EV_H

#include <ev.h>
#include <stdint.h>

#include "session.h"

struct net_ev_config {
    const char *path;    /* the server's socket */
    const char *dir;     /* its directory, watched while disconnected */
    /* Or the server's TCP "host:port" (tcp.h; path and dir then unused, and
     * no directory is watched: the backoff alone reconnects).  A name is
     * resolved at each dial and may block: give numeric addresses. */
    const char *tcp_address;
    const char *name;    /* in log lines: "umbp-server at <path>" */
    /* Optional: a connected socket's peer is acceptable (0), or err says
     * why not; connect() met EACCES/EPERM (why): err says what keeps this
     * process out; returns why. */
    int (*check_peer)(void *ctx, int fd, char *err, size_t errlen);
    int (*denied)(void *ctx, int why, char *err, size_t errlen);
    /* Optional, TCP only: the address to dial now, asked before each dial
     * (umbp-master's clients: the leader published in Redis).  0 and addr;
     * or < 0 and why: the dial fails at once (backoff, as a refused one).
     * Must not block (the loop thread). */
    int (*resolve)(void *ctx, char *addr, size_t addrlen, char *why, size_t whylen);
    void *ctx;
};

#define NET_EV_PATH_MAX 108
#define NET_EV_NAME_MAX 192

struct net_ev {
    struct net_session *s;
    struct ev_loop *loop;
    struct net_ev_config cfg;
    char path[NET_EV_PATH_MAX], dir[NET_EV_PATH_MAX], name[NET_EV_NAME_MAX];
    char tcp_address[NET_EV_NAME_MAX];
    const char *sock_name;   /* the socket's name within dir */
    int fd;                  /* the connection; -1: none */
    ev_io rio, wio;
    ev_timer timer;          /* the session's next deadline (may fire early, never late) */
    uint64_t timer_ns;       /* the deadline it is armed for */
    ev_timer fail_timer;     /* a write met a dead socket */
    int fail_errno;
    int ino_fd;              /* -1: not yet needed; -2: unavailable or stopped */
    int ino_wd;              /* -1: none */
    uint64_t ino_gen;        /* the session's gen at the last add attempt */
    ev_io ino_w;
};

/* Binds d to s (s->io) on loop; no watcher starts. */
void net_ev_init(struct net_ev *d, struct net_session *s, struct ev_loop *loop,
                 const struct net_ev_config *cfg);
/* A connected socket (non-blocking) adopted with net_session_adopt:
 * watchers on; bytes already in the session's input are handled on the
 * loop's first iteration. */
void net_ev_start(struct net_ev *d, int fd);
/* Every watcher and timer off, the directory watch closed (stop, destroy:
 * no reconnecting after this).  The socket stays for net_session_stop. */
void net_ev_stop(struct net_ev *d);
/* Looks at net_session_want again (also the session's io.update). */
void net_ev_sync(struct net_ev *d);

#endif /* UMBP_NET_SESSION_EV_H */
