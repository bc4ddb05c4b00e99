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
 *   - every frame it sends parses as a server frame (proto_frame_parse);
 *   - every answer but an ERROR or HELLO_ERR (after which it closes) answers
 *     the next request of the stream, parsed as the service parses it: its
 *     type (HELLO_OK, LOOKUP_R, STATS_R, PONG), its seq, and for a LOOKUP_R
 *     one answer per key, each the stand-in's (1 exactly for a key whose
 *     first byte is odd).
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

#include "fuzz_service.h"
#include "lookup_serve.h"
#include "proto.h"
#include "util.h"

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

/* A valid HELLO of role lookup first when bit 0 of the first byte says so,
 * then the rest of the input. */
static size_t build_stream(const uint8_t *data, size_t size, uint8_t **out)
{
    struct proto_buf b = {0};
    if (size && (data[0] & 1)) {
        struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                                .role = PROTO_ROLE_LOOKUP};
        FZ_CHECK(proto_begin(&b, PROTO_HELLO, 1, 1, 0) == 0 && proto_put_hello(&b, &h) == 0 &&
                 proto_end(&b) == 0);
    }
    size_t len = fz_stream_after(&b, data + (size ? 1 : 0), size ? size - 1 : 0, out);
    proto_buf_free(&b);
    return len;
}

/* The stream sent, and how far its requests have been answered. */
static struct {
    const uint8_t *s;
    size_t len, pos;
} sent;

static uint16_t reply_type(uint16_t request)
{
    switch (request) {
    case PROTO_HELLO: return PROTO_HELLO_OK;
    case PROTO_LOOKUP: return PROTO_LOOKUP_R;
    case PROTO_STATS: return PROTO_STATS_R;
    case PROTO_PING: return PROTO_PONG;
    default: return 0;
    }
}

/* f answers the next request of the stream, with the stand-in's answers. */
static void check_reply(const struct proto_frame *f)
{
    struct proto_frame q;
    char err[256];
    if (f->type == PROTO_ERROR || f->type == PROTO_HELLO_ERR)
        return; /* a refusal: the service closes after it */
    long n = proto_frame_parse(sent.s + sent.pos, sent.len - sent.pos, false, &q, err,
                               sizeof(err));
    if (n <= 0) {
        fprintf(stderr, "the lookup service sent %s (seq %llu) with no request left\n",
                proto_type_name(f->type), (unsigned long long)f->seq);
        abort();
    }
    sent.pos += (size_t)n;
    FZ_CHECK(f->type == reply_type(q.type) && f->seq == q.seq);
    if (f->type != PROTO_LOOKUP_R)
        return;
    FZ_CHECK(f->n == q.n);
    for (uint32_t i = 0; i < f->n; i++) {
        uint8_t v;
        umbp_key_t k;
        FZ_CHECK(proto_get_u8(f, i, &v) == 0 && proto_get_key(&q, i, &k) == 0);
        FZ_CHECK(v == (k.bytes[0] & 1));
    }
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
    size_t len = build_stream(data, size, &stream);
    sent.s = stream;
    sent.len = len;
    sent.pos = 0;
    fz_serve_stream(fd, loop, stream, len, "the lookup service", check_reply);
    close(fd);
    free(stream);
    ev_run(loop, EVRUN_NOWAIT); /* the service sees the close */
    return 0;
}
