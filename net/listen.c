/*
 * listen.c - a listening Unix socket, its directory and who may connect
 * (see listen.h).  Outcomes only: the callers word them.
 * Threads: the caller's; no state.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* struct ucred, SO_PEERCRED */
#endif
#include <errno.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "listen.h"

/* ---- the directory ------------------------------------------------------------ */

static void dir_share_with_group(const char *dir, const struct net_dir_rules *rules,
                                 struct net_dir_result *r)
{
    if (r->st.st_gid != rules->gid && chown(dir, (uid_t)-1, rules->gid) < 0) {
        r->outcome = NET_DIR_CHOWN_FAILED;
        r->err = errno;
    } else if ((r->st.st_mode & 07777) != 0770 && chmod(dir, 0770) < 0) {
        r->outcome = NET_DIR_CHMOD_FAILED;
        r->err = errno;
    }
}

void net_dir_prepare(const char *dir, const struct net_dir_rules *rules,
                     struct net_dir_result *r)
{
    memset(r, 0, sizeof(*r));
    if (mkdir(dir, rules->mode) < 0 && errno != EEXIST) {
        r->outcome = NET_DIR_MKDIR_FAILED;
        r->err = errno;
        return;
    }
    if ((rules->follow_links ? stat(dir, &r->st) : lstat(dir, &r->st)) < 0) {
        r->outcome = NET_DIR_STAT_FAILED;
        r->err = errno;
    } else if (!S_ISDIR(r->st.st_mode)) {
        r->outcome = NET_DIR_NOT_DIR;
    } else if (rules->check_owner && r->st.st_uid != geteuid()) {
        r->outcome = NET_DIR_NOT_OWNER;
    } else if (rules->share_group) {
        dir_share_with_group(dir, rules, r);
    } else if (r->st.st_mode & rules->deny_write) {
        r->outcome = NET_DIR_WRITABLE;
    }
}

/* ---- the socket --------------------------------------------------------------- */

static void fill_addr(struct sockaddr_un *a, const char *path)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    memcpy(a->sun_path, path, strlen(path) + 1); /* fits: the caller checked */
}

/* 1: a listener answers a connect (EAGAIN: one whose backlog is full);
 * 0: nobody does (*err: connect's errno); -1: no socket to ask with
 * (*err: socket's errno). */
static int probe_live(const char *path, int *err)
{
    struct sockaddr_un a;
    fill_addr(&a, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    int rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
    *err = rc < 0 ? errno : 0;
    close(fd);
    return rc == 0 || *err == EAGAIN || *err == EINPROGRESS;
}

/* Whatever is at the path, by the stale rule.  false: r says why not. */
static bool clear_path(const struct net_listen_params *p, struct net_listen_result *r)
{
    struct stat st;
    if (lstat(p->path, &st) < 0)
        return true;
    if (!S_ISSOCK(st.st_mode)) {
        r->outcome = NET_LISTEN_NOT_SOCKET;
        return false;
    }
    if (p->stale == NET_STALE_PROBE) {
        int perr = 0, live = probe_live(p->path, &perr);
        if (live != 0) {
            r->outcome = live > 0 ? NET_LISTEN_LIVE : NET_LISTEN_SOCKET_FAILED;
            r->err = perr;
            return false;
        }
        r->probe_err = perr;
    }
    if (unlink(p->path) < 0) {
        r->outcome = NET_LISTEN_UNLINK_FAILED;
        r->err = errno;
        return false;
    }
    r->replaced = true;
    return true;
}

static void fail(struct net_listen_result *r, enum net_listen_outcome o)
{
    r->outcome = o;
    r->err = errno;
}

void net_listen_open(const struct net_listen_params *p, struct net_listener *l,
                     struct net_listen_result *r)
{
    struct sockaddr_un a;
    struct stat st;
    memset(r, 0, sizeof(*r));
    if (!clear_path(p, r))
        return;
    fill_addr(&a, p->path);
    l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0)
        return fail(r, NET_LISTEN_SOCKET_FAILED);
    if (bind(l->fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        fail(r, NET_LISTEN_BIND_FAILED);
        close(l->fd);
        l->fd = -1;
        return;
    }
    if (lstat(p->path, &st) == 0) {
        l->bound = true;
        l->dev = st.st_dev;
        l->ino = st.st_ino;
    }
    /* the file's mode is the first gate (the peer check on accept the second) */
    if (p->chown_group && chown(p->path, (uid_t)-1, p->gid) < 0)
        return fail(r, NET_LISTEN_CHOWN_FAILED);
    if (chmod(p->path, p->mode) < 0)
        return fail(r, NET_LISTEN_CHMOD_FAILED);
    if (listen(l->fd, SOMAXCONN) < 0)
        return fail(r, NET_LISTEN_LISTEN_FAILED);
}

void net_listen_close(const char *path, struct net_listener *l)
{
    if (l->fd >= 0) {
        close(l->fd);
        l->fd = -1;
    }
    if (l->bound) {
        struct stat st;
        if (lstat(path, &st) == 0 && st.st_dev == l->dev && st.st_ino == l->ino)
            unlink(path);
        l->bound = false;
    }
}

/* ---- the peer ----------------------------------------------------------------- */

static bool id_in(const unsigned *ids, size_t n, unsigned id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

/* A supplementary group of the peer (SO_PEERGROUPS) in the list. */
static bool peer_group_allowed(const struct net_peer_rules *rules, int fd)
{
#ifdef SO_PEERGROUPS
    gid_t groups[1024];
    socklen_t len = sizeof(groups);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
        return false;
    for (size_t i = 0; i < len / sizeof(gid_t); i++)
        if (id_in(rules->gids, rules->ngids, groups[i]))
            return true;
#endif
    return false;
}

int net_peer_check(int fd, const struct net_peer_rules *rules, struct ucred *cr)
{
    socklen_t len = sizeof(*cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cr, &len) < 0)
        return -errno;
    if (cr->uid == geteuid() || (rules->allow_root && cr->uid == 0) ||
        id_in(rules->uids, rules->nuids, cr->uid))
        return 0;
    if (rules->ngids && (id_in(rules->gids, rules->ngids, cr->gid) ||
                         peer_group_allowed(rules, fd)))
        return 0;
    return -EACCES;
}
