/*
 * fuzz_service.h - the near side of a service fuzz target (a service of
 * ours on its own libev loop, run by the fuzzer's thread, fed a client's
 * byte stream through a real connected socket): fuzz_lookup_serve.c,
 * fuzz_master_session.c, and the stream prefix of fuzz_server_session.c.
 *
 *   - fz_stream_after: the stream is valid frames the target builds (a
 *     HELLO, so the fuzzer reaches the handlers behind the handshake at
 *     once), then the input's bytes, raw;
 *   - fz_serve_stream: writes the stream, ends the writing side, turns the
 *     loop and reads every answer until the service closes, with a bound on
 *     the turns (nothing hangs); each answer must parse as a server frame,
 *     and is handed to the target's check.
 *
 * Header only.  Test code: every failure aborts.
 */
#ifndef UMBP_FUZZ_SERVICE_H
#define UMBP_FUZZ_SERVICE_H

#include <errno.h>
#include <ev.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fuzz_check.h"
#include "proto.h"

#define FZ_SERVICE_MAX_TURNS 200000

/* prefix's frames (may be empty), then rest[0 .. n): a malloc'd stream. */
static inline size_t fz_stream_after(const struct proto_buf *prefix, const uint8_t *rest,
                                     size_t n, uint8_t **out)
{
    size_t len = prefix->len + n;
    uint8_t *s = malloc(len ? len : 1);
    FZ_CHECK(s);
    if (prefix->len)
        memcpy(s, prefix->data, prefix->len);
    if (n)
        memcpy(s + prefix->len, rest, n);
    *out = s;
    return len;
}

/* The service's frames in in[0 .. *len): each parses as a server frame and
 * goes to check (may be NULL); consumed frames are dropped. */
static inline void fz_service_replies(uint8_t *in, size_t *len, const char *who,
                                      void (*check)(const struct proto_frame *))
{
    size_t pos = 0;
    for (;;) {
        struct proto_frame f;
        char err[256];
        long n = proto_frame_parse(in + pos, *len - pos, true, &f, err, sizeof(err));
        if (n == 0)
            break;
        if (n < 0) {
            fprintf(stderr, "%s sent a frame its clients refuse: %s\n", who, err);
            abort();
        }
        if (check)
            check(&f);
        pos += (size_t)n;
    }
    memmove(in, in + pos, *len - pos);
    *len -= pos;
}

/* fd: non-blocking, connected to the service that loop runs. */
static inline void fz_serve_stream(int fd, struct ev_loop *loop, const uint8_t *stream,
                                   size_t len, const char *who,
                                   void (*check)(const struct proto_frame *))
{
    static uint8_t in[PROTO_HDR_SIZE + PROTO_MAX_BODY + 65536];
    size_t sent = 0, got = 0;
    bool shut = false, eof = false;
    for (long turn = 0; !eof; turn++) {
        if (turn >= FZ_SERVICE_MAX_TURNS) {
            fprintf(stderr, "%s neither answered nor closed in %d loop turns\n", who,
                    FZ_SERVICE_MAX_TURNS);
            abort();
        }
        if (sent < len) {
            ssize_t n = send(fd, stream + sent, len - sent, MSG_NOSIGNAL);
            if (n > 0)
                sent += (size_t)n;
            else if (errno != EAGAIN)
                sent = len; /* it hung up: the rest is moot */
        }
        if (sent == len && !shut) {
            shutdown(fd, SHUT_WR);
            shut = true;
        }
        ev_run(loop, EVRUN_NOWAIT);
        for (;;) {
            ssize_t n = recv(fd, in + got, sizeof(in) - got, 0);
            if (n > 0) {
                got += (size_t)n;
                fz_service_replies(in, &got, who, check);
                FZ_CHECK(got < sizeof(in));
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EINTR))
                eof = true;
            break;
        }
    }
}

#endif /* UMBP_FUZZ_SERVICE_H */
