/*
 * fuzz_master_session.c - libFuzzer target: umbp-master's per-connection
 * handlers (master/master.c over net/service.c: the HELLO and its role, a
 * connection speaking for a node, REGISTER .. SUSPECT, LOCATE, NODES, PING)
 * fed an arbitrary byte stream as a node or a lookup client would send it,
 * through a real TCP connection to the master's listening socket, the
 * master's loop turned here.  One master lives across inputs (max_nodes 8),
 * so nodes registered by one input are met by the next: a connection that
 * registers a node another closed connection spoke for, a node that
 * reconnected, max_nodes reached.
 *
 * The input: byte 0 is flags, byte 1 picks the node; then the rest, raw.
 *   - bit 0: a valid HELLO first, of the role in bits 1-2 (node, lookup,
 *     admin, or worker, which the master refuses);
 *   - bit 3: then a valid REGISTER of node "fz-<byte 1 % 4>" (pid from byte
 *     1 too), so the node's handlers are reached at once.
 *
 * Properties, each an abort() when broken (besides ASan / UBSan: a handler
 * that keeps a freed connection as a node's owner is a use after free at a
 * later input's REGISTER):
 *   - the master closes the connection, or answers and sees its EOF, within
 *     a bounded number of loop turns: nothing hangs;
 *   - every frame it sends parses as a server frame, every LOCATE_R and
 *     NODES_R record decodes, a NODES_R lists at most max_nodes nodes;
 *   - after the close, the master holds no connection and at most max_nodes
 *     nodes.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "directory.h"
#include "fuzz_service.h"
#include "master.h"
#include "master_int.h"

#define MAX_NODES 8

static struct umbp_master *m;
static struct sockaddr_in addr;

static void teardown(void) { umbp_master_destroy(m); }

static void setup(void)
{
    char err[512];
    if (umbp_master_create("{\"listen\": \"127.0.0.1:0\", \"log_level\": \"error\", "
                           "\"max_nodes\": 8, \"max_keys\": 65536, \"max_replicas\": 2}",
                           &m, err, sizeof(err)) < 0) {
        fprintf(stderr, "umbp_master_create: %s\n", err);
        abort();
    }
    const char *a = umbp_master_address(m), *colon = strrchr(a, ':');
    FZ_CHECK(colon);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(colon + 1));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    atexit(teardown);
}

static size_t build_stream(const uint8_t *data, size_t size, uint8_t **out)
{
    static const uint8_t roles[4] = {PROTO_ROLE_NODE, PROTO_ROLE_LOOKUP, PROTO_ROLE_ADMIN,
                                     PROTO_ROLE_WORKER};
    struct proto_buf b = {0};
    uint8_t flags = size ? data[0] : 0, who = size > 1 ? data[1] : 0;
    size_t skip = size < 2 ? size : 2;
    if (flags & 1) {
        struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                                .role = roles[(flags >> 1) & 3], .pid = 7};
        if (h.role == PROTO_ROLE_WORKER)
            h.write_deadline_ms = 1000; /* as umbp-server's workers send it */
        snprintf(h.engine_id, sizeof(h.engine_id), "fuzz");
        FZ_CHECK(proto_begin(&b, PROTO_HELLO, 1, 1, 0) == 0 && proto_put_hello(&b, &h) == 0 &&
                 proto_end(&b) == 0);
    }
    if (flags & 8) {
        struct proto_register r = {.pid = 1 + (who >> 2) % 2, .start_ns = 1,
                                   .capacity_bytes = 1 << 20, .addr_len = 4};
        snprintf(r.host, sizeof(r.host), "fz-%u", (unsigned)(who % 4));
        memcpy(r.addr, "addr", 4);
        FZ_CHECK(proto_begin(&b, PROTO_REGISTER, 2, 1, 0) == 0 &&
                 proto_put_register(&b, &r) == 0 && proto_end(&b) == 0);
    }
    size_t len = fz_stream_after(&b, data + skip, size - skip, out);
    proto_buf_free(&b);
    return len;
}

static void check_reply(const struct proto_frame *f)
{
    char err[256];
    if (f->type == PROTO_LOCATE_R) {
        for (uint32_t i = 0; i < f->n; i++) {
            struct proto_location l;
            FZ_CHECK(proto_get_location(f, i, &l, err, sizeof(err)) == 0);
            FZ_CHECK(l.nrep <= 2); /* max_replicas */
        }
    } else if (f->type == PROTO_NODES_R) {
        FZ_CHECK(f->n <= MAX_NODES);
        for (uint32_t i = 0; i < f->n; i++) {
            struct proto_node_info n;
            FZ_CHECK(proto_get_node_info(f, i, &n, err, sizeof(err)) == 0);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!m)
        setup();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    FZ_CHECK(fd >= 0);
    FZ_CHECK(connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    FZ_CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
    uint8_t *stream;
    size_t len = build_stream(data, size, &stream);
    fz_serve_stream(fd, m->loop, stream, len, "umbp-master", check_reply);
    close(fd);
    free(stream);
    for (int turn = 0; m->svc.nconns && turn < FZ_SERVICE_MAX_TURNS; turn++)
        ev_run(m->loop, EVRUN_NOWAIT); /* the master sees the close */
    FZ_CHECK(m->svc.nconns == 0);
    FZ_CHECK(dir_node_count(m->dir) <= MAX_NODES);
    return 0;
}
