/*
 * session_io.c - what every driver of a net/session does with a connected
 * socket's input: read into the core until the socket would block, the core
 * is full or the connection goes.  The core itself stays sans I/O; the libev
 * driver (session_ev.c) and the poll() driver (session_poll.c) call this.
 * Their thread (the session's).
 */
#include <errno.h>
#include <string.h>

#include "fdpass.h"
#include "session.h"
#include "umbp/tier.h" /* umbp_now_ns */

int net_session_read(struct net_session *s, const int *fdp, int max_reads)
{
    for (int i = 0; i < max_reads && *fdp >= 0; i++) {
        uint8_t *p;
        size_t room;
        int fd = -1;
        if (net_session_in_space(s, &p, &room) < 0) {
            net_session_lost(s, umbp_now_ns(), strerror(ENOMEM));
            return 0;
        }
        long r = proto_recv_with_fd(*fdp, p, room, &fd);
        if (r == -EAGAIN || r == -EINTR)
            return 0;
        if (r < 0)
            return (int)r;
        if (net_session_input(s, umbp_now_ns(), (size_t)r, fd) < 0)
            return 0;
    }
    return 0;
}
