/*
 * lockfile.h - one live owner per Unix socket path, by a lock file beside
 * it: "<path>.lock", flock(LOCK_EX)ed for the owner's lifetime and holding
 * its pid.  A second owner finds it held and fails naming the live one; a
 * socket file whose lock nobody holds (an owner that was killed) is stale.
 *
 * Shared by umbp-server (server/listen.c) and a worker's lookup service
 * (lookup/lookup_serve.c).  The outcome is returned, not worded: each
 * caller writes its own error messages and log lines (they name its own
 * options), so this file has no strings.
 *
 * Threads: the caller's; no state.
 */
#ifndef UMBP_NET_LOCKFILE_H
#define UMBP_NET_LOCKFILE_H

#include <stdbool.h>

enum net_lock_outcome {
    NET_LOCK_TAKEN,        /* fd holds the lock (pid_failed: our pid was not written) */
    NET_LOCK_HELD,         /* a live owner holds it (holder_pid, if holder_known) */
    NET_LOCK_OPEN_FAILED,  /* err: open's errno */
    NET_LOCK_FLOCK_FAILED, /* err: flock's errno, other than EWOULDBLOCK */
    NET_LOCK_REPLACED,     /* the file kept being replaced under us (8 attempts) */
};

struct net_lock_result {
    enum net_lock_outcome outcome;
    int fd;            /* NET_LOCK_TAKEN: the locked file; else -1 */
    int err;           /* NET_LOCK_OPEN_FAILED, NET_LOCK_FLOCK_FAILED */
    long holder_pid;   /* NET_LOCK_HELD: the pid in the file ... */
    bool holder_known; /* ... if it could be read */
    bool pid_failed;   /* NET_LOCK_TAKEN: writing our pid failed (the lock */
    int pid_errno;     /* is held anyway); errno then */
};

/* Opens (creating, 0600, never through a symlink) and locks lock_path
 * without waiting, checks that the locked file is still the one at
 * lock_path (a stopping owner unlinks it while locked, and a lock on an
 * unlinked inode would keep nobody out: then it tries again), and writes
 * our pid into it. */
void net_lock_take(const char *lock_path, struct net_lock_result *r);

/* Unlinks lock_path while still holding the lock (see net_lock_take), then
 * closes fd.  fd < 0: nothing. */
void net_lock_release(const char *lock_path, int fd);

#endif /* UMBP_NET_LOCKFILE_H */
