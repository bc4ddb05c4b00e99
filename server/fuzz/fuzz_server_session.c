/*
 * fuzz_server_session.c - libFuzzer target: a whole umbp-server session
 * (session.c, requests.c, events.c, track.c over the real store) fed an
 * arbitrary byte stream as a client would send it, through a socketpair
 * on the server's own loop.  The first input byte picks a prefix: bit 0
 * sends a valid worker HELLO first (so the fuzzer reaches the request
 * handlers at once), bit 1 asks it for events.
 *
 * Properties, each an abort() when broken (besides ASan / UBSan):
 *   - the session ends (EOF after the input, or a malformed frame) within a
 *     bounded number of loop iterations: nothing hangs;
 *   - once it has ended nothing is pending or leased: whatever a client
 *     held ends with it;
 *   - after a clear the pool's used bytes are 0: no space leaked.
 *
 * Built with -DUMBP_BUILD_FUZZ=ON and clang (server/CMakeLists.txt):
 *   build-fuzz/server/fuzz_server_session -max_total_time=120 /tmp/corpus-srv
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fdpass.h"
#include "server.h"
#include "srv.h"
#include "fuzz_service.h"


#define MAX_ITERATIONS 1000000

static struct umbp_server *srv;
static char dir[64];

static void teardown(void)
{
    umbp_server_destroy(srv);
    rmdir(dir);
}

static void setup(void)
{
    char json[256], err[512];
    snprintf(dir, sizeof(dir), "/tmp/umbp-fuzz-%d", (int)getpid());
    FZ_CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST);
    snprintf(json, sizeof(json), "{\"socket_dir\": \"%s\", \"capacity_bytes\": \"2MiB\", "
             "\"log_level\": \"error\", \"lease_ttl_ms\": 600000, \"session_warm_keys\": 16}", dir);
    if (umbp_server_create(json, &srv, err, sizeof(err)) < 0) {
        fprintf(stderr, "umbp_server_create: %s\n", err);
        abort();
    }
    atexit(teardown);
}

/* The prefix chosen by the first byte, then the rest of the input. */
static size_t build_stream(const uint8_t *data, size_t size, uint8_t **out)
{
    struct proto_buf b = {0};
    if (size && (data[0] & 1)) {
        struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                                .role = PROTO_ROLE_WORKER,
                                .flags = data[0] & 2 ? PROTO_HELLO_EVENTS : 0,
                                .write_deadline_ms = 1000};
        FZ_CHECK(proto_begin(&b, PROTO_HELLO, 1, 1, 0) == 0 && proto_put_hello(&b, &h) == 0 &&
              proto_end(&b) == 0);
    }
    size_t len = fz_stream_after(&b, data + (size ? 1 : 0), size ? size - 1 : 0, out);
    proto_buf_free(&b);
    return len;
}

/* Reads and drops what the server sent (closing a pool descriptor). */
static void drain(int fd)
{
    uint8_t buf[65536];
    int pool_fd;
    while (proto_recv_with_fd(fd, buf, sizeof(buf), &pool_fd) > 0)
        if (pool_fd >= 0)
            close(pool_fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!srv)
        setup();
    int sv[2];
    FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    FZ_CHECK(session_open(srv, sv[0], getpid(), geteuid(), getegid()));
    uint8_t *stream;
    size_t len = build_stream(data, size, &stream), sent = 0;
    bool shut = false;
    for (long i = 0; srv->svc.nconns; i++) {
        FZ_CHECK(i < MAX_ITERATIONS);
        if (sent < len) {
            ssize_t n = send(sv[1], stream + sent, len - sent, MSG_NOSIGNAL);
            if (n > 0)
                sent += (size_t)n;
            else
                FZ_CHECK(errno == EAGAIN || errno == EPIPE || errno == ECONNRESET);
            if (n < 0 && errno != EAGAIN)
                sent = len; /* the server hung up: the rest is moot */
        }
        if (sent == len && !shut) {
            shutdown(sv[1], SHUT_WR);
            shut = true;
        }
        drain(sv[1]);
        ev_run(srv->loop, EVRUN_NOWAIT);
    }
    drain(sv[1]);
    close(sv[1]);
    free(stream);

    struct umbp_tier_usage u;
    dram_store_usage(srv->store, &u);
    FZ_CHECK(u.num_pending == 0);
    FZ_CHECK(u.num_leased == 0);
    /* what the session reserved and left is held until its writer's
     * deadline (1 s here): once that has passed, all of it comes back */
    uint64_t held, expired;
    dram_store_expire_writers(srv->store, UINT64_MAX);
    dram_store_writer_counts(srv->store, &held, &expired);
    FZ_CHECK(held == 0);
    dram_store_clear(srv->store);
    dram_store_usage(srv->store, &u);
    FZ_CHECK(u.used_bytes == 0);
    return 0;
}
