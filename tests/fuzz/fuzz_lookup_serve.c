/*
 * fuzz_lookup_serve.c - libFuzzer target: a worker's lookup service
 * (lookup/lookup_serve.c over net/service.c) fed an arbitrary byte stream as
 * a scheduler's lookup client would send it, through its real listening
 * socket on a loop run here.  The host behind it is a stand-in pool that
 * holds every key whose first byte is odd.  The first input byte picks a
 * prefix: bit 0 sends a valid HELLO of role lookup first, so the fuzzer
 * reaches the LOOKUP, STATS and PING handlers at once.
 *
 * Properties, each an abort() when broken (besides ASan / UBSan):
 *   - the service ends the connection, or answers and then sees its EOF,
 *     within a bounded number of loop turns: nothing hangs;
 *   - every frame it sends parses as a server frame (proto_frame_parse),
 *     and a LOOKUP_R's answers are 0 or 1.  (Which keys hit is not checked
 *     against the stand-in: the harness does not parse its own stream.)
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

#include "fuzz_check.h"
#include "lookup_serve.h"
#include "proto.h"
#include "util.h"

#define MAX_TURNS 200000

static struct ev_loop *loop;
static struct lk_service *svc;
static char dir[64];

static int host_lookup(void *ctx, struct umbp_tier_req *reqs, struct umbp_tier_req **ptrs,
                       size_t n, uint8_t *present, bool touch)
{
    (void)ctx, (void)ptrs, (void)touch;
    for (size_t k = 0; k < n; k++)
        present[k] = reqs[k].key.bytes[0] & 1;
    return 0;
}

static void host_usage(void *ctx, struct umbp_tier_usage *u)
{
    (void)ctx;
    memset(u, 0, sizeof(*u));
    u->capacity_bytes = 1 << 20;
}

static void host_counters(void *ctx, struct lookup_host_counters *c)
{
    (void)ctx;
    memset(c, 0, sizeof(*c));
}

static const struct lookup_host_ops host_ops = {host_lookup, host_usage, host_counters};

static void teardown(void)
{
    lookup_serve_stop(svc);
    lookup_serve_free(svc);
    rmdir(dir);
}

static void setup(void)
{
    umbp_log_set_level(UMBP_LOG_ERROR);
    snprintf(dir, sizeof(dir), "/tmp/umbp-fuzz-lookup-%d", (int)getpid());
    FZ_CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST);
    loop = ev_loop_new(EVFLAG_AUTO);
    FZ_CHECK(loop);
    struct lookup_host h = {&host_ops, NULL, loop, "fuzz", 30000};
    svc = lookup_serve_new(&h, 0, 0);
    FZ_CHECK(svc);
    char err[512];
    if (lookup_serve_setup(svc, dir, "0123456789abcdef0123456789abcdef", "", err,
                           sizeof(err)) < 0) {
        fprintf(stderr, "lookup_serve_setup: %s\n", err);
        abort();
    }
    lookup_serve_start(svc);
    atexit(teardown);
}

static size_t build_stream(const uint8_t *data, size_t size, uint8_t **out)
{
    struct proto_buf b = {0};
    if (size && (data[0] & 1)) {
        struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                                .role = PROTO_ROLE_LOOKUP};
        FZ_CHECK(proto_begin(&b, PROTO_HELLO, 1, 1, 0) == 0 && proto_put_hello(&b, &h) == 0 &&
                 proto_end(&b) == 0);
    }
    size_t rest = size ? size - 1 : 0, len = b.len + rest;
    uint8_t *s = malloc(len ? len : 1);
    FZ_CHECK(s);
    if (b.len)
        memcpy(s, b.data, b.len);
    if (rest)
        memcpy(s + b.len, data + 1, rest);
    proto_buf_free(&b);
    *out = s;
    return len;
}

/* The service's frames so far in in[0..*len): each parses as a server
 * frame; a LOOKUP_R's bytes are 0 or 1.  Consumed frames are dropped. */
static void check_replies(uint8_t *in, size_t *len)
{
    size_t pos = 0;
    for (;;) {
        struct proto_frame f;
        char err[256];
        long n = proto_frame_parse(in + pos, *len - pos, true, &f, err, sizeof(err));
        if (n == 0)
            break;
        if (n < 0) {
            fprintf(stderr, "the lookup service sent a frame its clients refuse: %s\n", err);
            abort();
        }
        if (f.type == PROTO_LOOKUP_R)
            for (uint32_t i = 0; i < f.n; i++) {
                uint8_t v;
                FZ_CHECK(proto_get_u8(&f, i, &v) == 0 && v <= 1);
            }
        pos += (size_t)n;
    }
    memmove(in, in + pos, *len - pos);
    *len -= pos;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!svc)
        setup();
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FZ_CHECK(fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", lookup_serve_path(svc));
    FZ_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    FZ_CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
    uint8_t *stream;
    size_t len = build_stream(data, size, &stream), sent = 0, got = 0;
    static uint8_t in[PROTO_HDR_SIZE + PROTO_MAX_BODY + 65536];
    bool shut = false, eof = false;
    for (long turn = 0; !eof; turn++) {
        FZ_CHECK(turn < MAX_TURNS);
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
                check_replies(in, &got);
                FZ_CHECK(got < sizeof(in));
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EINTR))
                eof = true;
            break;
        }
    }
    close(fd);
    free(stream);
    ev_run(loop, EVRUN_NOWAIT); /* the service sees the close */
    return 0;
}
