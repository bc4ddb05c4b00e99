/*
 * listen.c - where clients find the server, and who may come in.
 *
 *  - The socket directory (socket_dir, default /tmp/umbp-<euid>) is created
 *    0700, or 0770 owned by socket_group.  An existing one must be a real
 *    directory owned by the server's euid that nobody else can write to
 *    (the group may, with socket_group): otherwise someone else could
 *    replace the socket under the clients, and the server refuses to start.
 *  - One server per socket path: the server holds flock(LOCK_EX) on
 *    "<socket>.lock" for its lifetime (the file holds its pid; the lock
 *    file is net/lockfile.c, shared with the lookup service), so a second
 *    server fails naming the live one, while a socket file nobody holds the
 *    lock for (a server that was killed) is stale and simply replaced.
 *  - The socket is 0600 (0660 with socket_group), and every connection is
 *    checked with SO_PEERCRED: the server's own uid, allowed_uids, or a
 *    primary or supplementary group in allowed_gids; and at most
 *    max_sessions at once.  Refusals are logged (one line) and counted, and
 *    the client gets a HELLO_ERR naming the option before the close.
 *
 * create runs this on the creating thread; accept_cb on the loop thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "inbuf.h"
#include "lockfile.h"
#include "srv.h"
#include "util.h"

#define ACCEPT_BATCH 64
#define ACCEPT_RETRY_S 0.1 /* after EMFILE: try again this much later */

/* ---- the directory ------------------------------------------------------------- */

static int dir_share_with_group(struct umbp_server *s, const struct stat *st, char *err,
                                size_t errlen)
{
    const struct srv_config *c = s->cfg;
    if (st->st_gid != c->sock_gid && chown(s->dir, (uid_t)-1, c->sock_gid) < 0) {
        int e = errno;
        snprintf(err, errlen, "socket_group=%s: cannot give socket_dir %s to group %u "
                 "(chown: %s); run umbp-server as a member of that group, or as root",
                 c->opt.socket_group, s->dir, (unsigned)c->sock_gid, strerror(e));
        return -e;
    }
    if ((st->st_mode & 07777) != 0770 && chmod(s->dir, 0770) < 0) {
        int e = errno;
        snprintf(err, errlen, "socket_dir=%s: cannot make it 0770 for socket_group (chmod: "
                 "%s)", s->dir, strerror(e));
        return -e;
    }
    return 0;
}

static int dir_check(struct umbp_server *s, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(s->dir, &st) < 0) {
        int e = errno;
        snprintf(err, errlen, "socket_dir=%s: %s; create it, or choose another socket_dir",
                 s->dir, strerror(e));
        return -e;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "socket_dir=%s: is a %s, not a directory; remove it, or choose "
                 "another socket_dir", s->dir, S_ISLNK(st.st_mode) ? "symbolic link" : "file");
        return -ENOTDIR;
    }
    if (st.st_uid != geteuid()) {
        snprintf(err, errlen, "socket_dir=%s: owned by uid %u, not by this server's uid %u, "
                 "so another user could replace the socket; remove it, or choose a "
                 "socket_dir of your own", s->dir, (unsigned)st.st_uid, (unsigned)geteuid());
        return -EPERM;
    }
    if (s->cfg->has_group)
        return dir_share_with_group(s, &st, err, errlen);
    if (st.st_mode & 0022) {
        snprintf(err, errlen, "socket_dir=%s: writable by %s (mode %03o), so another user "
                 "could replace the socket; chmod go-w it, or set socket_group to share it "
                 "with one group", s->dir, st.st_mode & 0020 ? "its group" : "others",
                 (unsigned)(st.st_mode & 0777));
        return -EPERM;
    }
    return 0;
}

static int dir_open(struct umbp_server *s, char *err, size_t errlen)
{
    if (mkdir(s->dir, s->cfg->has_group ? 0770 : 0700) < 0 && errno != EEXIST) {
        int e = errno;
        snprintf(err, errlen, "socket_dir=%s: cannot create it (mkdir: %s); create its "
                 "parent, or choose another socket_dir", s->dir, strerror(e));
        return -e;
    }
    return dir_check(s, err, errlen);
}

/* ---- the lock ------------------------------------------------------------------- */

/* The lock file itself is net/lockfile.c; the words are ours. */
static int lock_take(struct umbp_server *s, char *err, size_t errlen)
{
    struct net_lock_result r;
    net_lock_take(s->lock_path, &r);
    switch (r.outcome) {
    case NET_LOCK_TAKEN:
        if (r.pid_failed)
            umbp_log(UMBP_LOG_WARN, "socket lock %s: cannot record the pid (%s)",
                     s->lock_path, strerror(r.pid_errno));
        s->lock_fd = r.fd;
        return 0;
    case NET_LOCK_OPEN_FAILED:
        snprintf(err, errlen, "socket lock %s: cannot open it (%s); remove it, or check "
                 "socket_dir", s->lock_path, strerror(r.err));
        return -r.err;
    case NET_LOCK_HELD:
        snprintf(err, errlen, "socket %s is served by a live umbp-server (pid %ld); "
                 "give this one another lookup_instance or dp_rank", s->sock_path,
                 r.holder_known ? r.holder_pid : -1L);
        return -EADDRINUSE;
    case NET_LOCK_FLOCK_FAILED:
        snprintf(err, errlen, "socket lock %s: flock: %s", s->lock_path, strerror(r.err));
        return -r.err;
    case NET_LOCK_REPLACED:
        break;
    }
    snprintf(err, errlen, "socket lock %s keeps being replaced; is another umbp-server "
             "starting and stopping on this socket?", s->lock_path);
    return -EAGAIN;
}

int srv_listen_open(struct umbp_server *s, char *err, size_t errlen)
{
    int rc = dir_open(s, err, errlen);
    if (rc < 0)
        return rc;
    snprintf(s->lock_path, sizeof(s->lock_path), "%s.lock", s->sock_path);
    return lock_take(s, err, errlen);
}

/* ---- the socket ----------------------------------------------------------------- */

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents);
static void accept_retry_cb(struct ev_loop *loop, ev_timer *w, int revents);

/* A file at the socket path while we hold the lock is a dead server's. */
static int remove_stale(struct umbp_server *s, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(s->sock_path, &st) < 0)
        return 0;
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "socket %s: a file that is not a socket is in the way; remove "
                 "it", s->sock_path);
        return -EEXIST;
    }
    if (unlink(s->sock_path) < 0) {
        int e = errno;
        snprintf(err, errlen, "socket %s: cannot remove the stale socket (%s)", s->sock_path,
                 strerror(e));
        return -e;
    }
    umbp_log(UMBP_LOG_INFO, "replaced the stale socket %s (no server held its lock)",
             s->sock_path);
    return 0;
}

static int socket_permissions(struct umbp_server *s, char *err, size_t errlen)
{
    const struct srv_config *c = s->cfg;
    if (c->has_group && chown(s->sock_path, (uid_t)-1, c->sock_gid) < 0) {
        int e = errno;
        snprintf(err, errlen, "socket_group=%s: cannot give socket %s to group %u (chown: %s)",
                 c->opt.socket_group, s->sock_path, (unsigned)c->sock_gid, strerror(e));
        return -e;
    }
    if (chmod(s->sock_path, c->has_group ? 0660 : 0600) < 0) {
        int e = errno;
        snprintf(err, errlen, "socket %s: chmod: %s", s->sock_path, strerror(e));
        return -e;
    }
    return 0;
}

int srv_listen_bind(struct umbp_server *s, char *err, size_t errlen)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int rc = remove_stale(s, err, errlen);
    if (rc < 0)
        return rc;
    memcpy(addr.sun_path, s->sock_path, strlen(s->sock_path) + 1); /* fits: proto checked */
    s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->listen_fd < 0) {
        int e = errno;
        snprintf(err, errlen, "socket(AF_UNIX): %s", strerror(e));
        return -e;
    }
    if (bind(s->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        int e = errno;
        snprintf(err, errlen, "socket %s: bind: %s; check socket_dir", s->sock_path,
                 strerror(e));
        return -e;
    }
    s->socket_created = true;
    if ((rc = socket_permissions(s, err, errlen)) < 0)
        return rc;
    if (listen(s->listen_fd, SOMAXCONN) < 0) {
        int e = errno;
        snprintf(err, errlen, "socket %s: listen: %s", s->sock_path, strerror(e));
        return -e;
    }
    ev_io_init(&s->accept_w, accept_cb, s->listen_fd, EV_READ);
    ev_io_start(s->loop, &s->accept_w);
    ev_timer_init(&s->accept_retry_w, accept_retry_cb, ACCEPT_RETRY_S, 0.0);
    return 0;
}

void srv_listen_close(struct umbp_server *s, bool release_lock)
{
    if (s->listen_fd >= 0) {
        ev_io_stop(s->loop, &s->accept_w);
        ev_timer_stop(s->loop, &s->accept_retry_w);
        close(s->listen_fd);
        s->listen_fd = -1;
    }
    if (s->socket_created) {
        unlink(s->sock_path);
        s->socket_created = false;
    }
    if (release_lock && s->lock_fd >= 0) {
        net_lock_release(s->lock_path, s->lock_fd);
        s->lock_fd = -1;
    }
}

/* ---- accepting ------------------------------------------------------------------- */

static bool id_in(const unsigned *ids, size_t n, unsigned id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

/* A supplementary group of the peer (SO_PEERGROUPS) in allowed_gids. */
static bool peer_group_allowed(const struct srv_config *c, int fd)
{
#ifdef SO_PEERGROUPS
    gid_t groups[1024];
    socklen_t len = sizeof(groups);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
        return false;
    for (size_t i = 0; i < len / sizeof(gid_t); i++)
        if (id_in(c->gids, c->ngids, groups[i]))
            return true;
#endif
    return false;
}

static bool peer_allowed(const struct srv_config *c, int fd, const struct ucred *cr)
{
    if (cr->uid == geteuid() || id_in(c->uids, c->nuids, cr->uid))
        return true;
    if (c->ngids && (id_in(c->gids, c->ngids, cr->gid) || peer_group_allowed(c, fd)))
        return true;
    return false;
}

/* Logs and counts a refusal, and tells the client why before closing: one
 * HELLO_ERR (seq 0: sent before its HELLO is read; arg = status) written
 * without blocking on the fresh socket (a frame this small fits its empty
 * buffer; if not, the client only sees the close).  The client reads it
 * even though its HELLO may meet the closed socket. */
static void refuse(struct umbp_server *s, int fd, const struct ucred *cr, int status,
                   const char *why)
{
    s->c.refused_connections++;
    umbp_log(UMBP_LOG_WARN, "refused a connection from uid %u gid %u pid %d: %s",
             (unsigned)cr->uid, (unsigned)cr->gid, (int)cr->pid, why);
    struct proto_buf b = {0};
    size_t sent = 0;
    if (proto_put_error_frame(&b, PROTO_HELLO_ERR, 0, status, why) == 0)
        proto_out_send(fd, &b, &sent);
    proto_buf_free(&b);
    close(fd);
}

static void accept_one(void *ctx, int fd)
{
    struct umbp_server *s = ctx;
    struct ucred cr;
    socklen_t len = sizeof(cr);
    char why[PROTO_ERRMSG_MAX];
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
        umbp_log(UMBP_LOG_WARN, "refused a connection: SO_PEERCRED: %s", strerror(errno));
        s->c.refused_connections++;
        close(fd);
        return;
    }
    if (!peer_allowed(s->cfg, fd, &cr)) {
        snprintf(why, sizeof(why), "uid %u (gid %u) is not in allowed_uids or allowed_gids "
                 "of umbp-server (pid %ld, uid %u); add it to allowed_uids or allowed_gids",
                 (unsigned)cr.uid, (unsigned)cr.gid, (long)getpid(), (unsigned)geteuid());
        refuse(s, fd, &cr, -EACCES, why);
    } else if (s->nsessions >= (uint64_t)s->cfg->opt.max_sessions) {
        snprintf(why, sizeof(why), "max_sessions (%lld) reached on umbp-server (pid %ld); "
                 "raise max_sessions", (long long)s->cfg->opt.max_sessions, (long)getpid());
        refuse(s, fd, &cr, -EUSERS, why);
    } else if (!session_open(s, fd, cr.pid, cr.uid, cr.gid)) {
        refuse(s, fd, &cr, -ENOMEM, "out of memory for a session");
    }
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct umbp_server *s = umbp_container_of(w, struct umbp_server, accept_w);
    (void)revents;
    int rc = umbp_accept_batch(s->listen_fd, ACCEPT_BATCH, accept_one, s);
    if (rc < 0) {
        umbp_log(UMBP_LOG_WARN, "accept: %s; new connections wait %.1f s (raise the "
                 "descriptor limit, ulimit -n, or lower max_sessions)", strerror(-rc),
                 ACCEPT_RETRY_S);
        ev_io_stop(loop, &s->accept_w);
        ev_timer_start(loop, &s->accept_retry_w);
    }
}

static void accept_retry_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct umbp_server *s = umbp_container_of(w, struct umbp_server, accept_retry_w);
    (void)revents;
    if (s->listen_fd >= 0)
        ev_io_start(loop, &s->accept_w);
}
