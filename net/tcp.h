/*
 * tcp.h - the TCP transport of the wire protocol: host:port addresses
 * (IPv4 "10.0.0.1:7390", IPv6 "[::1]:7390", or a name), a listening
 * socket, a non-blocking connect, and the peer's address for log lines.
 * No fd passing (that is the Unix transport's, fdpass.h) and no peer
 * credentials: a TCP peer is checked by the shared-secret handshake
 * (auth.h) instead.  Sockets are non-blocking, close-on-exec, and have
 * TCP_NODELAY set (frames are small and answered at once).
 *
 * Threads: stateless functions; any thread.  Name resolution
 * (getaddrinfo) may block: numeric addresses never do.
 */
#ifndef UMBP_NET_TCP_H
#define UMBP_NET_TCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NET_TCP_HOST_MAX 256
#define NET_TCP_NAME_MAX 64 /* "[ffff:...]:65535" */

/* Splits "host:port" or "[v6]:port" (port 0 .. 65535, numeric).  -EINVAL
 * and err says what is wrong, naming `option`. */
int net_tcp_split(const char *addr, const char *option, char *host, size_t hostlen,
                  uint16_t *port, char *err, size_t errlen);

/* True for an address only this host can reach (127.0.0.0/8, ::1,
 * "localhost"). */
bool net_tcp_is_loopback(const char *addr);

/* A listening socket on addr (SO_REUSEADDR; an IPv6 wildcard also takes
 * IPv4).  *port_out: the port bound (addr may say port 0).  0, or -errno
 * with err naming `option`, the address and the fix. */
int net_tcp_listen(const char *addr, const char *option, int backlog, int *fd_out,
                   uint16_t *port_out, char *err, size_t errlen);

/* Starts a non-blocking connect to addr: 0 connected, -EINPROGRESS (wait
 * for POLLOUT, then SO_ERROR), or -errno (no socket left open).  *fd_out is
 * set unless -errno. */
int net_tcp_connect(const char *addr, int *fd_out);

/* "192.0.2.7:5555" or "[::1]:5555" of fd's peer; "?" if unknown. */
void net_tcp_peer_name(int fd, char *buf, size_t len);

#endif /* UMBP_NET_TCP_H */
