/*
 * fdpass.c - what is particular to the Unix socket the protocol runs on:
 * where a server's socket lives (proto_socket_path) and passing an fd
 * beside the bytes (SCM_RIGHTS), which is how a worker gets the pool's
 * memfd with its HELLO_OK.  Declared in fdpass.h.
 *
 * Threads: no state but the caller's; any thread.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* MSG_CMSG_CLOEXEC */
#endif
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fdpass.h"
#include "seterr.h"

/* ---- the socket path ------------------------------------------------------------ */

static bool instance_valid(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9') || *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

int proto_socket_path(const char *dir, unsigned dp_index, const char *instance, char *out,
                      size_t outlen, char *err, size_t errlen)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    bool inst = instance && instance[0];
    const char *sep;
    int n;

    if (!dir || !dir[0]) {
        net_seterr(err, errlen, "socket_dir is empty; set it to the directory of the server's "
               "socket, e.g. /run/umbp");
        return -EINVAL;
    }
    if (inst && !instance_valid(instance)) {
        net_seterr(err, errlen, "lookup_instance=%s: only letters, digits, '.', '_' and '-' "
               "may appear (it becomes part of the socket's file name)", instance);
        return -EINVAL;
    }
    sep = dir[strlen(dir) - 1] == '/' ? "" : "/";
    n = snprintf(path, sizeof(path), "%s%sumbp-dp%u%s%s.sock", dir, sep, dp_index,
                 inst ? "-" : "", inst ? instance : "");
    if (n < 0 || (size_t)n >= sizeof(path)) {
        net_seterr(err, errlen, "socket path %s%sumbp-dp%u%s%s.sock: %d bytes, over the %zu a "
               "Unix socket address holds; shorten socket_dir or lookup_instance", dir,
               sep, dp_index, inst ? "-" : "", inst ? instance : "", n, sizeof(path) - 1);
        return -ENAMETOOLONG;
    }
    if ((size_t)n >= outlen) {
        net_seterr(err, errlen, "socket path %s: %d bytes, the output buffer holds %zu", path,
               n, outlen ? outlen - 1 : 0);
        return -ENAMETOOLONG;
    }
    memcpy(out, path, (size_t)n + 1);
    return 0;
}

/* ---- passing an fd ------------------------------------------------------------- */

/* Control-message room for the one fd we send; a receiver takes up to
 * RECV_FDS so that extras are seen (and closed), not silently cut. */
#define RECV_FDS 8

union fd_control {
    struct cmsghdr hdr; /* aligns the buffer for CMSG_* */
    char buf[CMSG_SPACE(sizeof(int) * RECV_FDS)];
};

/* One sendmsg; the fd (if >= 0) rides on it.  Bytes sent or -errno. */
static ssize_t send_chunk(int sock, const uint8_t *p, size_t len, int fd)
{
    union fd_control ctl;
    struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t r;

    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    do
        r = sendmsg(sock, &msg, MSG_NOSIGNAL); /* a dead peer is -EPIPE, not SIGPIPE */
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

int proto_send_with_fd(int sock, const void *buf, size_t len, int fd)
{
    const uint8_t *p = buf;

    if (fd >= 0 && len == 0)
        return -EINVAL; /* an fd needs a byte to ride on */
    while (len) {
        ssize_t r = send_chunk(sock, p, len, fd);
        if (r < 0)
            return (int)r;
        fd = -1; /* sent with the first chunk */
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

/* Takes every fd out of the control messages: the first into *fd, the
 * others closed.  -EPROTO (and nothing kept) if there was more than one or
 * the kernel had to cut some. */
static int take_fds(struct msghdr *msg, int *fd)
{
    int first = -1, count = 0;

    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int v;
            memcpy(&v, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (count++ == 0)
                first = v;
            else
                close(v);
        }
    }
    if (count > 1 || (msg->msg_flags & MSG_CTRUNC)) {
        if (first >= 0)
            close(first);
        return -EPROTO;
    }
    *fd = first;
    return 0;
}

long proto_recv_with_fd(int sock, void *buf, size_t len, int *fd)
{
    union fd_control ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    ssize_t r;
    int rc;

    *fd = -1;
    if (len == 0)
        return -EINVAL; /* 0 would read as EOF */
    do
        r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return -errno;
    rc = take_fds(&msg, fd);
    return rc ? rc : (long)r;
}
