/*
 * fuzz_sync_client.c - libFuzzer target: the `umbp` tool's blocking client
 * of umbp-server (server/sync_client.c over net/session.c and its poll()
 * driver) reading a server's answers built from the input, through a real
 * Unix socket (fuzz_peer.h plays the server).  Each input connects as an
 * admin (the tool's role), then makes one call without records (STATS,
 * SESSIONS, CLEAR or PING), as `umbp stats`, `umbp sessions`, `umbp clear`
 * and `umbp ping` do.
 *
 * The input: byte 0 is flags, byte 1 the records of a framed reply, then
 * the records' bytes and the rest.  The peer answers
 *   - the HELLO with a valid HELLO_OK (bit 0), else with every remaining
 *     input byte, raw;
 *   - the call (bits 1-2: STATS, SESSIONS, CLEAR, PING) with, first, an
 *     EVENTS frame when bit 3 says so (the client skips it), then a frame
 *     framed for the call's seq (bit 4: of the call's reply type, else of
 *     the type in the last 6 bits of byte 1) whose records are the input's
 *     next bytes, then the rest, raw.
 *
 * Properties, each an abort() when broken (besides ASan / UBSan and those of
 * fuzz_peer.h):
 *   - the client's frames are a HELLO of role admin, then the call's
 *     request: its type, no records;
 *   - connect and call return 0 or a negative code, and a negative one says
 *     what failed (err not empty);
 *   - a call that returns 0 returns a frame of the call's reply type and
 *     seq (what the tool then reads with that type's accessors);
 *   - a valid HELLO_OK then a framed reply of the call's type and seq (its
 *     records are for the tool's accessors, fuzzed elsewhere) is taken.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fuzz_peer.h"
#include "sync_client.h"
#include "util.h"

static struct fz_peer peer;
static char dir[64], path[128];

static const uint16_t calls[4] = {PROTO_STATS, PROTO_SESSIONS, PROTO_CLEAR, PROTO_PING};
static const uint16_t replies[4] = {PROTO_STATS_R, PROTO_SESSIONS_R, PROTO_CLEAR_R, PROTO_PONG};

static struct {
    const uint8_t *p;
    size_t n, pos;
    uint8_t flags, nrec;
    uint64_t hello_seq;
    bool hello_ok, called;
    uint16_t reply_type;           /* of the framed reply sent */
    uint32_t reply_n;
    uint64_t call_seq;
} x;

static uint32_t record_size(uint16_t type)
{
    /* the framed reply's record size, as the type's table says (a frame of
     * an unknown type, or of a request type, is refused by the parser) */
    switch (type) {
    case PROTO_STATS_R: return PROTO_STATS_SIZE;
    case PROTO_SESSIONS_R: return PROTO_SESSION_ITEM_SIZE;
    case PROTO_LOOKUP_R: return 1;
    case PROTO_PUBLISH_R: case PROTO_RELEASE_R: return 4;
    default: return 0;
    }
}

static bool on_frame(struct fz_peer *p, const struct proto_frame *f, struct proto_buf *out)
{
    (void)p;
    size_t rest = x.n - x.pos;
    if (f->type == PROTO_HELLO) {
        struct proto_hello h;
        FZ_CHECK(x.hello_seq == 0 && proto_get_hello(f, &h, NULL, 0) == 0);
        x.hello_ok = h.role == PROTO_ROLE_ADMIN && h.version == PROTO_VERSION;
        x.hello_seq = f->seq;
        if (!(x.flags & 1)) {
            fz_append(out, x.p + x.pos, rest);
            return true;
        }
        struct proto_welcome w = {.version = PROTO_VERSION, .lease_ttl_ms = 30000,
                                  .session_id = 7, .pool_size = 1 << 20};
        FZ_CHECK(proto_begin(out, PROTO_HELLO_OK, f->seq, 1, 0) == 0 &&
                 proto_put_welcome(out, &w) == 0 && proto_end(out) == 0);
        return false;
    }
    FZ_CHECK(!x.called && f->type == calls[(x.flags >> 1) & 3] && f->n == 0);
    x.called = true;
    x.call_seq = f->seq;
    if (x.flags & 8)
        fz_raw_frame(out, PROTO_EVENTS, 0, 0, 0, NULL, 0);
    x.reply_type = (x.flags & 16) ? replies[(x.flags >> 1) & 3] : (uint16_t)(x.nrec & 63);
    uint32_t rs = record_size(x.reply_type), nrec = rs ? (x.nrec >> 6) + 1 : 0;
    if (x.reply_type == PROTO_STATS_R)
        nrec = 1; /* a one-record type */
    size_t bytes = (size_t)nrec * rs, take = bytes < rest ? bytes : rest;
    uint8_t *rec = calloc(1, bytes ? bytes : 1);
    FZ_CHECK(rec);
    memcpy(rec, x.p + x.pos, take);
    x.pos += take;
    x.reply_n = nrec;
    fz_raw_frame(out, x.reply_type, f->seq, nrec, 0, rec, bytes);
    free(rec);
    fz_append(out, x.p + x.pos, x.n - x.pos);
    return true;
}

static void cleanup(void)
{
    close(peer.lfd);
    unlink(path);
    rmdir(dir);
}

static void setup(void)
{
    umbp_log_set_level(UMBP_LOG_ERROR);
    snprintf(dir, sizeof(dir), "/tmp/umbp-fuzz-sync-%d", (int)getpid());
    FZ_CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST);
    snprintf(path, sizeof(path), "%s/umbp.sock", dir);
    fz_peer_listen_unix(&peer, path);
    peer.on_frame = on_frame;
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0])
        setup();
    memset(&x, 0, sizeof(x));
    x.p = data;
    x.n = size;
    x.flags = size ? data[0] : 0;
    x.nrec = size > 1 ? data[1] : 0;
    x.pos = size < 2 ? size : 2;

    fz_peer_start(&peer);
    struct sync_client c;
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                            .role = PROTO_ROLE_ADMIN, .pid = (uint32_t)getpid()};
    snprintf(h.engine_id, sizeof(h.engine_id), "umbp-tool");
    char err[512] = "";
    int rc = sync_client_connect(&c, path, &h, 5000, err, sizeof(err));
    FZ_CHECK(rc <= 0);
    if (rc < 0) {
        FZ_CHECK(err[0]); /* (connect closed the client) */
    } else {
        struct proto_frame f;
        uint16_t want = replies[(x.flags >> 1) & 3];
        err[0] = 0;
        rc = sync_client_call(&c, calls[(x.flags >> 1) & 3], &f, err, sizeof(err));
        FZ_CHECK(rc <= 0);
        if (rc < 0)
            FZ_CHECK(err[0]);
        else
            FZ_CHECK(f.type == want && f.seq == x.call_seq);
        if ((x.flags & 16) && rc != 0) {
            fprintf(stderr, "a reply of the call's type and seq was refused: %d (%s)\n", rc,
                    err);
            abort();
        }
        sync_client_close(&c);
    }
    fz_peer_join(&peer);
    FZ_CHECK(x.hello_ok);
    return 0;
}
