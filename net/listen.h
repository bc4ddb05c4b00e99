/*
 * listen.h - a listening Unix socket that only its owner's peers may use:
 * the socket's private directory, the stale-socket rule, bind / chmod /
 * listen, and the peer-credential check on each accepted connection.  The
 * lock that keeps one owner per path is lockfile.h (taken between the
 * directory and the socket).
 *
 * Shared by umbp-server (server/listen.c) and a worker's lookup service
 * (lookup/lookup_serve.c).  As in lockfile.h, outcomes are returned, not
 * worded: each caller writes its own messages, which name its own options
 * (socket_dir, lookup_dir) and which tests and operators match, so this
 * file has no strings.  The two callers differ in policy, passed in:
 *
 *  - the directory: the server's must be owned by it and not writable by
 *    others (or shared 0770 with socket_group); the lookup service checks
 *    that only for its default directory (a lookup_dir given is the
 *    operator's choice, followed through symbolic links);
 *  - a socket file already at the path: the server holds the lock, so any
 *    socket there is a dead server's and is replaced (NET_STALE_REPLACE);
 *    the lookup service first connects to it and never takes over one that
 *    answers (NET_STALE_PROBE), since an engine of an older release may
 *    serve the path without taking the lock;
 *  - who may connect: the owner's euid, listed uids, listed gids (primary
 *    or supplementary), root if allowed.
 *
 * Threads: the caller's; no state beyond the struct net_listener it is
 * handed.
 */
#ifndef UMBP_NET_LISTEN_H
#define UMBP_NET_LISTEN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>

/* ---- the directory ------------------------------------------------------------ */

struct net_dir_rules {
    mode_t mode;          /* mkdir's mode: 0700, or 0770 with share_group */
    bool follow_links;    /* stat (a symbolic link to a directory is fine) or lstat */
    bool check_owner;     /* must be owned by our euid */
    mode_t deny_write;    /* write bits that refuse it (0022, 0002, 0: none); not
                             checked with share_group */
    bool share_group;     /* make it ours: group gid, mode 0770 */
    gid_t gid;
};

enum net_dir_outcome {
    NET_DIR_OK,
    NET_DIR_MKDIR_FAILED,  /* err: mkdir's errno (not EEXIST) */
    NET_DIR_STAT_FAILED,   /* err */
    NET_DIR_NOT_DIR,       /* st says what it is */
    NET_DIR_NOT_OWNER,     /* st.st_uid is not our euid */
    NET_DIR_WRITABLE,      /* st.st_mode has a deny_write bit */
    NET_DIR_CHOWN_FAILED,  /* share_group: err */
    NET_DIR_CHMOD_FAILED,  /* share_group: err */
};

struct net_dir_result {
    enum net_dir_outcome outcome;
    int err;
    struct stat st;        /* from NET_DIR_NOT_DIR on */
};

/* Creates dir (mode) if missing, then checks it by the rules, in the order
 * of the outcomes above. */
void net_dir_prepare(const char *dir, const struct net_dir_rules *rules,
                     struct net_dir_result *r);

/* ---- the socket --------------------------------------------------------------- */

enum net_stale_rule {
    NET_STALE_REPLACE,     /* the lock is held: a socket at the path is stale */
    NET_STALE_PROBE,       /* connect to it first: one that answers is live */
};

struct net_listen_params {
    const char *path;      /* fits sun_path: the caller checked */
    enum net_stale_rule stale;
    mode_t mode;           /* of the socket file: 0600, or 0660 with chown_group */
    bool chown_group;
    gid_t gid;
};

enum net_listen_outcome {
    NET_LISTEN_OK,
    NET_LISTEN_NOT_SOCKET,     /* a file that is not a socket is at the path (left alone) */
    NET_LISTEN_LIVE,           /* NET_STALE_PROBE: a live listener answered (left alone) */
    NET_LISTEN_UNLINK_FAILED,  /* err; probe_err: what connect said (NET_STALE_PROBE) */
    NET_LISTEN_SOCKET_FAILED,  /* err: socket(AF_UNIX) */
    NET_LISTEN_BIND_FAILED,    /* err */
    NET_LISTEN_CHOWN_FAILED,   /* err */
    NET_LISTEN_CHMOD_FAILED,   /* err */
    NET_LISTEN_LISTEN_FAILED,  /* err */
};

struct net_listen_result {
    enum net_listen_outcome outcome;
    int err;
    bool replaced;             /* a stale socket was removed (log it) */
    int probe_err;             /* NET_STALE_PROBE: connect's errno on the stale one */
};

/* The listening socket and the file it created. */
struct net_listener {
    int fd;                    /* -1: none */
    bool bound;                /* the socket file is ours (dev, ino) */
    dev_t dev;
    ino_t ino;
};

#define NET_LISTENER_INIT {.fd = -1}

/* The stale-socket rule, then a non-blocking close-on-exec socket bound at
 * path, its file given the mode (and group), listening.  On failure what
 * was made stays in *l for net_listen_close. */
void net_listen_open(const struct net_listen_params *p, struct net_listener *l,
                     struct net_listen_result *r);

/* Closes the socket and removes its file if it is still the one we bound
 * (never another owner's that replaced it).  Idempotent. */
void net_listen_close(const char *path, struct net_listener *l);

/* ---- the peer ----------------------------------------------------------------- */

struct net_peer_rules {
    const unsigned *uids;      /* allowed besides our euid */
    size_t nuids;
    const unsigned *gids;      /* allowed primary or supplementary groups */
    size_t ngids;
    bool allow_root;
};

/* SO_PEERCRED of an accepted connection into *cr, checked by the rules:
 * 0 allowed, -EACCES not allowed (*cr set), or -errno of getsockopt. */
int net_peer_check(int fd, const struct net_peer_rules *rules, struct ucred *cr);

#endif /* UMBP_NET_LISTEN_H */
