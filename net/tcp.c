/*
 * tcp.c - the TCP transport (tcp.h).  Stateless; any thread.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "seterr.h"
#include "tcp.h"

int net_tcp_split(const char *addr, const char *option, char *host, size_t hostlen,
                  uint16_t *port, char *err, size_t errlen)
{
    const char *colon, *h = addr;
    size_t hl;
    if (!addr || !*addr) {
        net_seterr(err, errlen, "%s: empty; give host:port (\"10.0.0.1:7390\", \"[::1]:7390\")",
                   option);
        return -EINVAL;
    }
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':') {
            net_seterr(err, errlen, "%s: '%s': an IPv6 address is written [addr]:port", option,
                       addr);
            return -EINVAL;
        }
        h = addr + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon || strchr(addr, ':') != colon) {
            net_seterr(err, errlen, "%s: '%s' is not host:port (an IPv6 address is written "
                       "[addr]:port)", option, addr);
            return -EINVAL;
        }
        hl = (size_t)(colon - addr);
    }
    char *end;
    errno = 0;
    unsigned long p = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || p > 65535) {
        net_seterr(err, errlen, "%s: '%s': the port must be a number 0 .. 65535", option, addr);
        return -EINVAL;
    }
    if (hl == 0 || hl >= hostlen) {
        net_seterr(err, errlen, "%s: '%s': the host is %s", option, addr,
                   hl ? "too long" : "missing");
        return -EINVAL;
    }
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = (uint16_t)p;
    return 0;
}

bool net_tcp_is_loopback(const char *addr)
{
    char host[NET_TCP_HOST_MAX];
    uint16_t port;
    struct in_addr a4;
    struct in6_addr a6;
    if (net_tcp_split(addr, "", host, sizeof(host), &port, NULL, 0) < 0)
        return false;
    if (!strcmp(host, "localhost"))
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

static int resolve(const char *addr, bool passive, struct addrinfo **out, char *err,
                   size_t errlen, const char *option)
{
    char host[NET_TCP_HOST_MAX], port_s[8];
    uint16_t port;
    int rc = net_tcp_split(addr, option, host, sizeof(host), &port, err, errlen);
    if (rc < 0)
        return rc;
    snprintf(port_s, sizeof(port_s), "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    int g = getaddrinfo(host, port_s, &hints, out);
    if (g) {
        net_seterr(err, errlen, "%s: cannot resolve '%s': %s", option, host, gai_strerror(g));
        return g == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
    }
    return 0;
}

static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int net_tcp_listen(const char *addr, const char *option, int backlog, int *fd_out,
                   uint16_t *port_out, char *err, size_t errlen)
{
    struct addrinfo *ai;
    int rc = resolve(addr, true, &ai, err, errlen, option);
    if (rc < 0)
        return rc;
    int e = EADDRNOTAVAIL, fd = -1;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (a->ai_family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
        tune(fd); /* accepted sockets inherit TCP_NODELAY */
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0)
            break;
        e = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        net_seterr(err, errlen, "%s: cannot listen on %s: %s%s", option, addr, strerror(e),
                   e == EADDRINUSE ? " (another process has the port: stop it or choose "
                                     "another port)" : "");
        return -e;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    uint16_t port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    if (port_out)
        *port_out = port;
    return 0;
}

int net_tcp_connect(const char *addr, int *fd_out)
{
    struct addrinfo *ai;
    int rc = resolve(addr, false, &ai, NULL, 0, "");
    if (rc < 0)
        return rc;
    int e = EADDRNOTAVAIL;
    rc = -e;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        tune(fd);
        int c = connect(fd, a->ai_addr, a->ai_addrlen);
        if (c == 0 || errno == EINPROGRESS) {
            rc = c == 0 ? 0 : -EINPROGRESS;
            *fd_out = fd;
            break;
        }
        rc = -errno;
        close(fd);
    }
    freeaddrinfo(ai);
    return rc;
}

void net_tcp_peer_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0) {
        snprintf(buf, len, "?");
        return;
    }
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, ntohs(a->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        snprintf(buf, len, "[%s]:%u", host, ntohs(a->sin6_port));
    } else {
        snprintf(buf, len, "?");
    }
}
