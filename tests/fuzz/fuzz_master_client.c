/*
 * fuzz_master_client.c - libFuzzer target: the client of umbp-master
 * (net/master_client.c over net/session.c and its poll() driver), as a node
 * and as a lookup client use it, reading a master's answers built from the
 * input through a real TCP connection on 127.0.0.1 (fuzz_peer.h plays the
 * master).  Each input makes a fresh client and one or two calls of one
 * kind: LOCATE (with its NODES), NODES, REGISTER or HEARTBEAT.
 *
 * The input: byte 0 is flags, then the number of keys, the node counts and
 * epochs of the two answers, then the records and the rest:
 *   - bit 0: the HELLO is answered by a valid HELLO_OK (epoch 0), else by
 *     the whole rest of the input, raw;
 *   - bits 1-2: the kind of call (LOCATE, NODES, REGISTER, HEARTBEAT);
 *   - bit 3: the answers' records are made valid from the input's values
 *     (through the proto_put_* encoders), else they are raw input bytes in
 *     frames of the right type, seq and n;
 *   - bit 4: a second call on the same connection when the first succeeded;
 *   - bit 5: the last record of the last call's NODES_R is spoiled (ref 0),
 *     so that a list with one bad record behind good ones is read after a
 *     good list.
 * After the last answer, every remaining input byte, raw.
 *
 * Properties, each an abort() when broken (besides ASan / UBSan and those of
 * fuzz_peer.h):
 *   - the client's frames are a HELLO of the client's role, then per call
 *     the request of that kind (LOCATE of the call's keys, then NODES with
 *     the epoch of the list it holds);
 *   - a call returns 0 or a negative code; a failed LOCATE leaves every
 *     location zero (a part answer is no answer); a successful one gives
 *     each key exactly the record sent for it; an acknowledged REGISTER or
 *     HEARTBEAT returns exactly the ack sent;
 *   - the node list is replaced only by a NODES_R of another epoch in a call
 *     that succeeded, and then holds exactly its records, each found by its
 *     ref; a call that failed leaves the list as it was (a NODES_R with one
 *     bad record changes nothing);
 *   - valid answers (bits 0 and 3) make every call succeed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_peer.h"
#include "master_client.h"
#include "umbp/umbp.h"
#include "util.h"

#define MAX_KEYS 8
#define MAX_NODES 4
#define TIMEOUT_MS 5000

enum kind { K_LOCATE, K_NODES, K_REGISTER, K_HEARTBEAT };

static struct fz_peer peer;
static char address[64];

/* The input as the peer consumes it. */
static struct {
    const uint8_t *p;
    size_t n, pos;
} in;

static uint8_t in_u8(void) { return in.pos < in.n ? in.p[in.pos++] : 0; }

static uint64_t in_bytes(void *dst, size_t len)
{
    size_t take = in.n - in.pos < len ? in.n - in.pos : len;
    memset(dst, 0, len);
    memcpy(dst, in.p + in.pos, take);
    in.pos += take;
    return take;
}

static uint32_t in_u32(void)
{
    uint32_t v;
    in_bytes(&v, 4);
    return v;
}

/* What the harness asked and the peer answered (read after each call). */
static struct {
    uint8_t flags;
    enum kind kind;
    uint32_t nkeys;
    uint8_t nodes_k[2], epoch[2];
    int call;                      /* answers given so far */
    int calls;                     /* calls the harness will make (1 or 2) */
    uint64_t hello_seq, next_seq;  /* the client's seqs, checked in order */
    uint32_t sent_epoch;           /* the epoch the client's NODES named */
    umbp_key_t keys[MAX_KEYS];     /* the LOCATE's */
    bool hello_ok;
    bool locate_seen;
    /* the answer given, as the client must have read it */
    struct proto_buf answer;       /* the frames of the current call's answer */
} x;

/* Records, valid or raw, appended to the open answer. */
static void location_record(struct proto_buf *out, uint32_t i)
{
    (void)i;
    if (!(x.flags & 8)) {
        uint8_t raw[PROTO_LOCATION_SIZE];
        in_bytes(raw, sizeof(raw));
        FZ_CHECK(proto_buf_reserve(out, sizeof(raw)) == 0);
        memcpy(out->data + out->len, raw, sizeof(raw));
        out->len += sizeof(raw);
        return;
    }
    struct proto_location l = {0};
    l.nrep = in_u8() % (PROTO_MAX_REPLICAS + 1);
    if (l.nrep)
        l.size = (uint64_t)in_u32() + 1;
    for (uint32_t r = 0; r < l.nrep; r++)
        l.refs[r] = (in_u8() % 8) + 1;
    FZ_CHECK(proto_put_location(out, &l) == 0);
}

static void node_record(struct proto_buf *out)
{
    if (!(x.flags & 8)) {
        static uint8_t raw[PROTO_NODE_INFO_SIZE];
        in_bytes(raw, sizeof(raw));
        FZ_CHECK(proto_buf_reserve(out, sizeof(raw)) == 0);
        memcpy(out->data + out->len, raw, sizeof(raw));
        out->len += sizeof(raw);
        return;
    }
    struct proto_node_info n = {0};
    n.ref = (in_u8() % 8) + 1; /* duplicates too: the first one is found by its ref */
    n.state = in_u8() & 1;
    snprintf(n.host, sizeof(n.host), "host-%u", (unsigned)in_u8());
    n.pid = in_u32();
    n.addr_len = in_u8() % 17;
    in_bytes(n.addr, n.addr_len);
    n.capacity_bytes = in_u32();
    n.used_bytes = in_u32();
    FZ_CHECK(proto_put_node_info(out, &n) == 0);
}

/* A frame of n records of the given writer, built as proto_begin frames it
 * (raw records get the same header: proto_end is not asked to check them). */
static void records_frame(struct proto_buf *out, uint16_t type, uint64_t seq, uint32_t n,
                          uint32_t arg, void (*rec)(struct proto_buf *, uint32_t))
{
    if (x.flags & 8) {
        FZ_CHECK(proto_begin(out, type, seq, n, arg) == 0);
        for (uint32_t i = 0; i < n; i++)
            rec(out, i);
        FZ_CHECK(proto_end(out) == 0);
        return;
    }
    struct proto_buf body = {0};
    for (uint32_t i = 0; i < n; i++)
        rec(&body, i);
    fz_raw_frame(out, type, seq, n, arg, body.data, body.len);
    proto_buf_free(&body);
}

static void node_rec(struct proto_buf *out, uint32_t i)
{
    (void)i;
    node_record(out);
}

/* Bit 5 spoils the NODES_R of the last call only: a first call's good list
 * is then followed by one with a bad record. */
static bool spoiled(int call) { return (x.flags & 32) && call == x.calls - 1; }

/* A NODES_R of this call's nodes and epoch; spoiled, its last record's ref
 * is 0 after the others were encoded valid. */
static void nodes_frame(struct proto_buf *out, uint64_t seq)
{
    uint32_t k = x.nodes_k[x.call];
    records_frame(out, PROTO_NODES_R, seq, k, x.epoch[x.call], node_rec);
    if (spoiled(x.call) && k)
        memset(out->data + out->len - PROTO_NODE_INFO_SIZE, 0, 4);
}

static void ack_frame(struct proto_buf *out, uint16_t type, uint64_t seq)
{
    if (x.flags & 8) {
        struct proto_ack a = {.seq = in_u32(), .action = in_u8() % 3};
        a.node_ref = a.action == PROTO_ACK_REGISTER ? 0 : (in_u8() % 8) + 1;
        FZ_CHECK(proto_begin(out, type, seq, 1, 0) == 0 && proto_put_ack(out, &a) == 0 &&
                 proto_end(out) == 0);
        return;
    }
    uint8_t raw[PROTO_ACK_SIZE];
    in_bytes(raw, sizeof(raw));
    fz_raw_frame(out, type, seq, 1, 0, raw, sizeof(raw));
}

static void expect_seq(const struct proto_frame *f)
{
    FZ_CHECK(f->seq == x.next_seq);
    x.next_seq++;
}

/* The answer to this call is complete in out: the peer keeps a copy. */
static bool answered(struct proto_buf *out)
{
    x.answer.len = 0;
    fz_append(&x.answer, out->data, out->len);
    bool last = ++x.call == x.calls;
    if (last)
        fz_append(out, in.p + in.pos, in.n - in.pos);
    return last;
}

static bool on_frame(struct fz_peer *p, const struct proto_frame *f, struct proto_buf *out)
{
    (void)p;
    if (f->type == PROTO_HELLO) {
        struct proto_hello h;
        FZ_CHECK(x.hello_seq == 0 && proto_get_hello(f, &h, NULL, 0) == 0);
        x.hello_ok = h.role == (x.kind >= K_REGISTER ? PROTO_ROLE_NODE : PROTO_ROLE_LOOKUP) &&
                     h.version == PROTO_VERSION && strcmp(h.engine_id, "fuzz") == 0;
        x.hello_seq = f->seq;
        x.next_seq = f->seq + 1;
        if (!(x.flags & 1)) {
            fz_append(out, in.p + in.pos, in.n - in.pos);
            return true;
        }
        struct proto_welcome w = {.version = PROTO_VERSION, .lease_ttl_ms = 30000};
        FZ_CHECK(proto_begin(out, PROTO_HELLO_OK, f->seq, 1, 0) == 0 &&
                 proto_put_welcome(out, &w) == 0 && proto_end(out) == 0);
        return false;
    }
    FZ_CHECK(x.hello_seq != 0 && x.call < x.calls);
    expect_seq(f);
    switch (x.kind) {
    case K_LOCATE:
        if (f->type == PROTO_LOCATE) {
            FZ_CHECK(!x.locate_seen && f->n == x.nkeys);
            for (uint32_t i = 0; i < f->n; i++)
                FZ_CHECK(proto_get_key(f, i, &x.keys[i]) == 0);
            x.locate_seen = true;
            return false; /* its NODES comes behind it */
        }
        FZ_CHECK(f->type == PROTO_NODES && x.locate_seen && f->n == 0);
        x.locate_seen = false;
        x.sent_epoch = f->arg;
        records_frame(out, PROTO_LOCATE_R, f->seq - 1, x.nkeys, 0, location_record);
        nodes_frame(out, f->seq);
        return answered(out);
    case K_NODES:
        FZ_CHECK(f->type == PROTO_NODES && f->n == 0);
        x.sent_epoch = f->arg;
        nodes_frame(out, f->seq);
        return answered(out);
    case K_REGISTER:
        FZ_CHECK(f->type == PROTO_REGISTER);
        ack_frame(out, PROTO_REGISTER_R, f->seq);
        return answered(out);
    case K_HEARTBEAT:
        FZ_CHECK(f->type == PROTO_HEARTBEAT && f->n == 1);
        ack_frame(out, PROTO_HEARTBEAT_R, f->seq);
        return answered(out);
    }
    abort();
}

/* The frames of the answer just given, as a client parses them. */
static size_t answer_frames(struct proto_frame *fr, size_t max)
{
    size_t pos = 0, k = 0;
    while (pos < x.answer.len && k < max) {
        char err[256];
        long r = proto_frame_parse(x.answer.data + pos, x.answer.len - pos, true, &fr[k], err,
                                   sizeof(err));
        if (r <= 0)
            break; /* a raw frame the parser refuses: the call cannot have succeeded */
        pos += (size_t)r;
        k++;
    }
    return k;
}

static bool nodes_equal(const struct proto_node_info *a, size_t na,
                        const struct proto_node_info *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(*a)) == 0);
}

static void check_list(struct mclient *c, const struct proto_node_info *want, size_t n)
{
    const struct proto_node_info *list;
    size_t got = mclient_node_list(c, &list);
    FZ_CHECK(nodes_equal(list, got, want, n));
    for (size_t i = 0; i < n; i++) {
        const struct proto_node_info *hit = mclient_node(c, want[i].ref);
        size_t first = 0;
        while (want[first].ref != want[i].ref)
            first++;
        FZ_CHECK(hit == &list[first]);
    }
}

static void cleanup(void) { close(peer.lfd); }

static void setup(void)
{
    umbp_log_set_level(UMBP_LOG_ERROR);
    snprintf(address, sizeof(address), "127.0.0.1:%u", (unsigned)fz_peer_listen_tcp(&peer));
    peer.on_frame = on_frame;
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!address[0])
        setup();
    proto_buf_free(&x.answer);
    memset(&x, 0, sizeof(x));
    in.p = data;
    in.n = size;
    in.pos = 0;
    x.flags = in_u8();
    x.kind = (enum kind)((x.flags >> 1) & 3);
    x.nkeys = 1 + in_u8() % MAX_KEYS;
    x.nodes_k[0] = in_u8() % (MAX_NODES + 1);
    x.nodes_k[1] = in_u8() % (MAX_NODES + 1);
    x.epoch[0] = in_u8();
    x.epoch[1] = in_u8();
    x.calls = (x.flags & 16) ? 2 : 1;

    struct mclient_config cfg = {
        .address = address, .role = x.kind >= K_REGISTER ? PROTO_ROLE_NODE : PROTO_ROLE_LOOKUP,
        .engine_id = "fuzz", .timeout_ms = TIMEOUT_MS, .hello_timeout_ms = TIMEOUT_MS,
    };
    struct mclient *c = NULL;
    FZ_CHECK(mclient_create(&cfg, &c) == 0);
    fz_peer_start(&peer);

    struct proto_node_info list[MAX_NODES] = {0}; /* what the client's list must be */
    size_t nlist = 0;
    uint32_t epoch = 0;
    for (int k = 0; k < x.calls; k++) {
        umbp_key_t keys[MAX_KEYS];
        struct proto_location out[MAX_KEYS];
        struct proto_ack ack;
        memset(&ack, 0x5a, sizeof(ack));
        for (uint32_t i = 0; i < x.nkeys; i++) {
            memset(&keys[i], 0, sizeof(keys[i]));
            keys[i].bytes[0] = (uint8_t)i;
            keys[i].bytes[1] = (uint8_t)k;
        }
        memset(out, 0xee, sizeof(out));
        int rc;
        if (x.kind == K_LOCATE) {
            rc = mclient_locate(c, keys, x.nkeys, out);
        } else if (x.kind == K_NODES) {
            rc = mclient_nodes(c);
        } else if (x.kind == K_REGISTER) {
            struct proto_register r = {0};
            snprintf(r.host, sizeof(r.host), "fuzz-host");
            r.pid = 1;
            r.start_ns = 1;
            r.capacity_bytes = 1 << 20;
            rc = mclient_register(c, &r, &ack);
        } else {
            rc = mclient_heartbeat(c, (uint64_t)k + 1, 0, NULL, 0, &ack);
        }
        FZ_CHECK(rc <= 0);
        bool all_valid = (x.flags & 9) == 9 &&
                         !(spoiled(k) && x.kind <= K_NODES && x.nodes_k[k]);
        if (all_valid && rc != 0) {
            fprintf(stderr, "call %d (kind %d) failed on valid answers: %d (%s)\n", k,
                    (int)x.kind, rc, mclient_last_error(c));
            abort();
        }
        if (rc != 0 && x.kind == K_LOCATE)
            for (uint32_t i = 0; i < x.nkeys; i++)
                FZ_CHECK(memcmp(&out[i], &(struct proto_location){0}, sizeof(out[i])) == 0);
        if (rc == 0) {
            struct proto_frame fr[2];
            size_t nfr = answer_frames(fr, 2);
            if (x.kind == K_LOCATE) {
                FZ_CHECK(memcmp(x.keys, keys, x.nkeys * sizeof(keys[0])) == 0);
                FZ_CHECK(x.sent_epoch == epoch); /* NODES names the list held */
                FZ_CHECK(nfr == 2 && fr[0].type == PROTO_LOCATE_R);
                for (uint32_t i = 0; i < x.nkeys; i++) {
                    struct proto_location l;
                    FZ_CHECK(proto_get_location(&fr[0], i, &l, NULL, 0) == 0);
                    FZ_CHECK(memcmp(&l, &out[i], sizeof(l)) == 0);
                }
            }
            if (x.kind == K_LOCATE || x.kind == K_NODES) {
                const struct proto_frame *nf = &fr[nfr - 1];
                FZ_CHECK(nfr >= 1 && nf->type == PROTO_NODES_R);
                if (x.kind == K_NODES)
                    FZ_CHECK(x.sent_epoch == epoch);
                if (nf->arg != epoch) {
                    nlist = nf->n;
                    for (uint32_t i = 0; i < nf->n; i++)
                        FZ_CHECK(proto_get_node_info(nf, i, &list[i], NULL, 0) == 0);
                    epoch = nf->arg;
                }
            } else {
                struct proto_ack want;
                FZ_CHECK(nfr == 1 && proto_get_ack(&fr[0], &want, NULL, 0) == 0);
                FZ_CHECK(memcmp(&want, &ack, sizeof(ack)) == 0);
            }
        }
        check_list(c, list, nlist);
        if (rc != 0)
            break; /* a second call would redial (after a backoff) */
    }
    mclient_destroy(c);
    fz_peer_join(&peer);
    FZ_CHECK(x.hello_ok);
    return 0;
}
