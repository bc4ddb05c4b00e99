/*
 * fdpass.h - the Unix socket of the wire protocol: where a server's socket
 * lives, and sending and receiving bytes with one fd attached (SCM_RIGHTS:
 * the pool's memfd on a worker's HELLO_OK).  The codec (proto.h) knows
 * nothing of sockets.
 *
 * Threads: stateless functions; any thread.
 */
#ifndef UMBP_NET_FDPASS_H
#define UMBP_NET_FDPASS_H

#include <stddef.h>

/* The socket path of a server: <dir>/umbp-dp<dp_index>[-<instance>].sock.
 * -ENAMETOOLONG if it does not fit sun_path (err says so, naming the
 * options socket_dir and lookup_instance). */
int proto_socket_path(const char *dir, unsigned dp_index, const char *instance, char *out,
                      size_t outlen, char *err, size_t errlen);

/* sendmsg of a whole buffer with one fd attached to its first byte
 * (SCM_RIGHTS; fd < 0: none); blocking socket; never raises SIGPIPE.  0 or
 * -errno (-EPIPE: the peer is gone); after an error part of buf may have
 * been sent, so the stream is unusable. */
int proto_send_with_fd(int sock, const void *buf, size_t len, int fd);
/* recvmsg of up to len bytes; an attached fd (if any) is stored in *fd,
 * close-on-exec (else -1; more than one fd, or fds the kernel had to cut:
 * every one closed, -EPROTO, and the bytes read are lost with them, so drop
 * the connection).  Returns bytes read, 0 on EOF, or -errno (-EAGAIN on a
 * non-blocking socket; -EINVAL for len 0). */
long proto_recv_with_fd(int sock, void *buf, size_t len, int *fd);

#endif /* UMBP_NET_FDPASS_H */
