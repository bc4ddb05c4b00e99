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
 * Accepting, the peer check and the cap are net/service.c's (configured in
 * session.c); the words of a refusal are here (srv_listen_refuse).
 *
 * create runs this on the creating thread; the service's hooks on the loop
 * thread.
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
#include "listen.h"
#include "lockfile.h"
#include "srv.h"
#include "util.h"


/* ---- the directory ------------------------------------------------------------- */

/* The rules are net/listen.c's; the words are ours. */
static int dir_open(struct umbp_server *s, char *err, size_t errlen)
{
    const struct srv_config *c = s->cfg;
    struct net_dir_rules rules = {
        .mode = c->has_group ? 0770 : 0700, .check_owner = true, .deny_write = 0022,
        .share_group = c->has_group, .gid = c->sock_gid,
    };
    struct net_dir_result r;
    net_dir_prepare(s->dir, &rules, &r);
    switch (r.outcome) {
    case NET_DIR_OK:
        return 0;
    case NET_DIR_MKDIR_FAILED:
        snprintf(err, errlen, "socket_dir=%s: cannot create it (mkdir: %s); create its "
                 "parent, or choose another socket_dir", s->dir, strerror(r.err));
        return -r.err;
    case NET_DIR_STAT_FAILED:
        snprintf(err, errlen, "socket_dir=%s: %s; create it, or choose another socket_dir",
                 s->dir, strerror(r.err));
        return -r.err;
    case NET_DIR_NOT_DIR:
        snprintf(err, errlen, "socket_dir=%s: is a %s, not a directory; remove it, or choose "
                 "another socket_dir", s->dir,
                 S_ISLNK(r.st.st_mode) ? "symbolic link" : "file");
        return -ENOTDIR;
    case NET_DIR_NOT_OWNER:
        snprintf(err, errlen, "socket_dir=%s: owned by uid %u, not by this server's uid %u, "
                 "so another user could replace the socket; remove it, or choose a "
                 "socket_dir of your own", s->dir, (unsigned)r.st.st_uid,
                 (unsigned)geteuid());
        return -EPERM;
    case NET_DIR_WRITABLE:
        snprintf(err, errlen, "socket_dir=%s: writable by %s (mode %03o), so another user "
                 "could replace the socket; chmod go-w it, or set socket_group to share it "
                 "with one group", s->dir, r.st.st_mode & 0020 ? "its group" : "others",
                 (unsigned)(r.st.st_mode & 0777));
        return -EPERM;
    case NET_DIR_CHOWN_FAILED:
        snprintf(err, errlen, "socket_group=%s: cannot give socket_dir %s to group %u "
                 "(chown: %s); run umbp-server as a member of that group, or as root",
                 c->opt.socket_group, s->dir, (unsigned)c->sock_gid, strerror(r.err));
        return -r.err;
    case NET_DIR_CHMOD_FAILED:
        snprintf(err, errlen, "socket_dir=%s: cannot make it 0770 for socket_group (chmod: "
                 "%s)", s->dir, strerror(r.err));
        return -r.err;
    }
    return -EINVAL;
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

/* The socket by net/listen.c: a file at the path while we hold the lock is
 * a dead server's and is replaced (NET_STALE_REPLACE); the words are ours. */
static int socket_open(struct umbp_server *s, char *err, size_t errlen)
{
    const struct srv_config *c = s->cfg;
    struct net_listen_params p = {
        .path = s->sock_path, .stale = NET_STALE_REPLACE,
        .mode = c->has_group ? 0660 : 0600, .chown_group = c->has_group, .gid = c->sock_gid,
    };
    struct net_listen_result r;
    net_listen_open(&p, &s->listener, &r);
    if (r.replaced)
        umbp_log(UMBP_LOG_INFO, "replaced the stale socket %s (no server held its lock)",
                 s->sock_path);
    switch (r.outcome) {
    case NET_LISTEN_OK:
        return 0;
    case NET_LISTEN_NOT_SOCKET:
    case NET_LISTEN_LIVE: /* not asked for with NET_STALE_REPLACE */
        snprintf(err, errlen, "socket %s: a file that is not a socket is in the way; remove "
                 "it", s->sock_path);
        return -EEXIST;
    case NET_LISTEN_UNLINK_FAILED:
        snprintf(err, errlen, "socket %s: cannot remove the stale socket (%s)", s->sock_path,
                 strerror(r.err));
        break;
    case NET_LISTEN_SOCKET_FAILED:
        snprintf(err, errlen, "socket(AF_UNIX): %s", strerror(r.err));
        break;
    case NET_LISTEN_BIND_FAILED:
        snprintf(err, errlen, "socket %s: bind: %s; check socket_dir", s->sock_path,
                 strerror(r.err));
        break;
    case NET_LISTEN_CHOWN_FAILED:
        snprintf(err, errlen, "socket_group=%s: cannot give socket %s to group %u (chown: %s)",
                 c->opt.socket_group, s->sock_path, (unsigned)c->sock_gid, strerror(r.err));
        break;
    case NET_LISTEN_CHMOD_FAILED:
        snprintf(err, errlen, "socket %s: chmod: %s", s->sock_path, strerror(r.err));
        break;
    case NET_LISTEN_LISTEN_FAILED:
        snprintf(err, errlen, "socket %s: listen: %s", s->sock_path, strerror(r.err));
        break;
    }
    return -r.err;
}

int srv_listen_bind(struct umbp_server *s, char *err, size_t errlen)
{
    int rc = socket_open(s, err, errlen);
    if (rc < 0)
        return rc;
    net_service_start(&s->svc, s->listener.fd);
    return 0;
}

void srv_listen_close(struct umbp_server *s, bool release_lock)
{
    net_service_stop_accepting(&s->svc);
    net_listen_close(s->sock_path, &s->listener); /* the socket, if still ours */
    if (release_lock && s->lock_fd >= 0) {
        net_lock_release(s->lock_path, s->lock_fd);
        s->lock_fd = -1;
    }
}

/* ---- accepting ------------------------------------------------------------------- */

/* The service's on_refuse: logs and counts a refusal, and tells the client
 * why before the service closes it: one HELLO_ERR (seq 0: sent before its
 * HELLO is read; arg = status) written without blocking on the fresh
 * socket (a frame this small fits its empty buffer; if not, the client
 * only sees the close).  The client reads it even though its HELLO may
 * meet the closed socket. */
void srv_listen_refuse(struct net_service *svc, int fd, const struct ucred *cr,
                       enum net_refusal reason, int err)
{
    struct umbp_server *s = svc->p.owner;
    char why[PROTO_ERRMSG_MAX];
    s->c.refused_connections++;
    switch (reason) {
    case NET_REFUSE_CRED:
        umbp_log(UMBP_LOG_WARN, "refused a connection: SO_PEERCRED: %s", strerror(err));
        return;
    case NET_REFUSE_PEER:
        snprintf(why, sizeof(why), "uid %u (gid %u) is not in allowed_uids or allowed_gids "
                 "of umbp-server (pid %ld, uid %u); add it to allowed_uids or allowed_gids",
                 (unsigned)cr->uid, (unsigned)cr->gid, (long)getpid(), (unsigned)geteuid());
        break;
    case NET_REFUSE_FULL:
        snprintf(why, sizeof(why), "max_sessions (%lld) reached on umbp-server (pid %ld); "
                 "raise max_sessions", (long long)s->cfg->opt.max_sessions, (long)getpid());
        break;
    case NET_REFUSE_NOMEM:
        snprintf(why, sizeof(why), "out of memory for a session");
        break;
    }
    umbp_log(UMBP_LOG_WARN, "refused a connection from uid %u gid %u pid %d: %s",
             (unsigned)cr->uid, (unsigned)cr->gid, (int)cr->pid, why);
    struct proto_buf b = {0};
    size_t sent = 0;
    if (proto_put_error_frame(&b, PROTO_HELLO_ERR, 0, -err, why) == 0)
        proto_out_send(fd, &b, &sent);
    proto_buf_free(&b);
}

void srv_listen_accept_error(struct net_service *svc, int err, double retry_s)
{
    (void)svc;
    umbp_log(UMBP_LOG_WARN, "accept: %s; new connections wait %.1f s (raise the "
             "descriptor limit, ulimit -n, or lower max_sessions)", strerror(err), retry_s);
}
