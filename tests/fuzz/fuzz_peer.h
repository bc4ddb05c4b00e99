/*
 * fuzz_peer.h - the far side of a client fuzz target (fuzz_lookup_client.c,
 * fuzz_master_client.c): a service's socket that accepts one connection per
 * input on a thread of its own, reads and parses what the client sends (as
 * the real service parses it: proto_frame_parse, from_server = false), and
 * answers with bytes the target builds from the fuzz input, then ends its
 * side (shutdown for writing) and reads until the client closes.  The client
 * under test runs on the fuzzer's thread, through its public calls, exactly
 * as in an engine: dialling, polling and parsing replies itself.
 *
 * Properties checked here, each an abort() when broken:
 *   - every frame the client sends parses as a request (a client that sends
 *     bytes its own server would refuse is a bug too; a peer of another
 *     protocol, on_bytes, checks what it reads itself);
 *   - nothing hangs: the client dials, sends what the target waits for and
 *     closes each within FZ_PEER_WAIT_MS (its own deadlines are far shorter).
 *
 * Header only; one peer per target.  Test code: no error is recovered from.
 */
#ifndef UMBP_FUZZ_PEER_H
#define UMBP_FUZZ_PEER_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fuzz_check.h"
#include "proto.h"

#define FZ_PEER_WAIT_MS 10000

struct fz_peer {
    int lfd;                       /* listening; the target makes it */
    /* Each frame the client sent, in order: may append an answer to out
     * (written at once); returns true when the exchange is over (out is
     * written, then this side ends).  Peer thread. */
    bool (*on_frame)(struct fz_peer *p, const struct proto_frame *f, struct proto_buf *out);
    /* Or, for a peer of another protocol (Redis: fuzz_redis_reply.c), the
     * bytes the client sent so far, unframed: returns how many it used (a
     * whole request: 0 waits for more), may append an answer to out, and
     * sets *over when the exchange is over.  Peer thread. */
    size_t (*on_bytes)(struct fz_peer *p, const uint8_t *in, size_t len, struct proto_buf *out,
                       bool *over);
    void *arg;
    pthread_t th;
    bool ended_by_client;          /* the client closed before on_frame said over */
};

/* One frame with raw records: a header and body header that frame exactly
 * `nrec` records of record_size bytes, whatever those bytes are, so that a
 * client's record decoders see fuzz bytes behind a frame it accepts. */
static inline void fz_raw_frame(struct proto_buf *b, uint16_t type, uint64_t seq, uint32_t nrec,
                                uint32_t arg, const uint8_t *rec, size_t rec_bytes)
{
    uint8_t h[PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE];
    uint32_t len = (uint32_t)(PROTO_BODY_HDR_SIZE + rec_bytes);
    uint16_t flags = 0;
    memcpy(h, &len, 4); /* little-endian, as the hosts this runs on */
    memcpy(h + 4, &type, 2);
    memcpy(h + 6, &flags, 2);
    memcpy(h + 8, &seq, 8);
    memcpy(h + 16, &nrec, 4);
    memcpy(h + 20, &arg, 4);
    FZ_CHECK(proto_buf_reserve(b, sizeof(h) + rec_bytes) == 0);
    memcpy(b->data + b->len, h, sizeof(h));
    if (rec_bytes)
        memcpy(b->data + b->len + sizeof(h), rec, rec_bytes);
    b->len += sizeof(h) + rec_bytes;
}

static inline void fz_append(struct proto_buf *b, const uint8_t *p, size_t n)
{
    FZ_CHECK(proto_buf_reserve(b, n ? n : 1) == 0);
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
}

static inline bool fz_peer_wait(int fd, short ev)
{
    struct pollfd q = {.fd = fd, .events = ev};
    int r;
    while ((r = poll(&q, 1, FZ_PEER_WAIT_MS)) < 0 && errno == EINTR)
        ;
    return r == 1;
}

static inline void fz_peer_send(int fd, const struct proto_buf *out)
{
    size_t off = 0;
    while (off < out->len) {
        ssize_t n = send(fd, out->data + off, out->len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && errno == EAGAIN) {
            FZ_CHECK(fz_peer_wait(fd, POLLOUT)); /* the client stopped reading */
        } else {
            return; /* it hung up: the rest is moot */
        }
    }
}

static void *fz_peer_main(void *arg)
{
    struct fz_peer *p = arg;
    static uint8_t in[PROTO_HDR_SIZE + PROTO_MAX_BODY + 65536];
    struct proto_buf out = {0};
    size_t got = 0;
    bool over = false;

    if (!fz_peer_wait(p->lfd, POLLIN)) {
        fprintf(stderr, "fuzz peer: the client did not dial within %d ms\n", FZ_PEER_WAIT_MS);
        abort();
    }
    int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
    FZ_CHECK(fd >= 0);
    p->ended_by_client = false;
    while (!over) {
        if (!fz_peer_wait(fd, POLLIN)) {
            fprintf(stderr, "fuzz peer: the client sent nothing more for %d ms\n",
                    FZ_PEER_WAIT_MS);
            abort();
        }
        ssize_t n = recv(fd, in + got, sizeof(in) - got, 0);
        if (n <= 0) {
            p->ended_by_client = true;
            break;
        }
        got += (size_t)n;
        size_t pos = 0;
        while (!over && p->on_bytes && pos < got) {
            out.len = 0;
            size_t used = p->on_bytes(p, in + pos, got - pos, &out, &over);
            fz_peer_send(fd, &out);
            if (!used)
                break;
            pos += used;
        }
        while (!over && !p->on_bytes) {
            struct proto_frame f;
            char err[256];
            long r = proto_frame_parse(in + pos, got - pos, false, &f, err, sizeof(err));
            if (r == 0)
                break;
            if (r < 0) {
                fprintf(stderr, "fuzz peer: the client sent a malformed frame: %s\n", err);
                abort();
            }
            out.len = 0;
            over = p->on_frame(p, &f, &out);
            fz_peer_send(fd, &out);
            pos += (size_t)r;
        }
        memmove(in, in + pos, got - pos);
        got -= pos;
        FZ_CHECK(got < sizeof(in));
    }
    shutdown(fd, SHUT_WR);
    /* read until the client closes (closing with its bytes unread would
     * reset a TCP connection before the client read the answer) */
    for (;;) {
        if (!fz_peer_wait(fd, POLLIN)) {
            fprintf(stderr, "fuzz peer: the client kept the connection %d ms after the "
                    "answer\n", FZ_PEER_WAIT_MS);
            abort();
        }
        ssize_t n = recv(fd, in, sizeof(in), 0);
        if (n <= 0)
            break;
    }
    close(fd);
    proto_buf_free(&out);
    return NULL;
}

/* The peer's listening socket: TCP on 127.0.0.1 (a port the kernel picks;
 * returns it), or Unix at path (replacing what is there). */
static inline uint16_t fz_peer_listen_tcp(struct fz_peer *p)
{
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FZ_CHECK(p->lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    FZ_CHECK(bind(p->lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
    FZ_CHECK(listen(p->lfd, 16) == 0);
    FZ_CHECK(getsockname(p->lfd, (struct sockaddr *)&a, &len) == 0);
    return ntohs(a.sin_port);
}

static inline void fz_peer_listen_unix(struct fz_peer *p, const char *path)
{
    unlink(path);
    p->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FZ_CHECK(p->lfd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    FZ_CHECK(strlen(path) < sizeof(a.sun_path));
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    FZ_CHECK(bind(p->lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
    FZ_CHECK(listen(p->lfd, 16) == 0);
}

static inline void fz_peer_start(struct fz_peer *p)
{
    FZ_CHECK(pthread_create(&p->th, NULL, fz_peer_main, p) == 0);
}

static inline void fz_peer_join(struct fz_peer *p) { FZ_CHECK(pthread_join(p->th, NULL) == 0); }

#endif /* UMBP_FUZZ_PEER_H */
