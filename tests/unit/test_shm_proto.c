/*
 * test_shm_proto.c - the wire codec of net/proto.c (and net/fdpass.c,
 * net/inbuf.c: fd passing and input buffers).
 *
 * Every message type has a sample (a frame built with proto_put_* from
 * fixed, distinctive values) and a check that parses it back and compares
 * every field; the samples also drive the incomplete-frame and direction
 * tests.  The byte layout itself is pinned twice: a golden HELLO frame
 * written byte by byte here, and the seed corpus that
 * tests/fuzz/make_corpus.py encodes with Python's struct module, all of
 * which must parse.  Malformed cases assert the return code and the field
 * that err names.  The socket tests pass a real file over a socketpair.
 *
 * Built by hand while the shm tier is not registered (from the repo root):
 *   gcc -std=gnu11 -Wall -Wextra -Iinclude -Inet -Itests/common \
 *       tests/unit/test_shm_proto.c net/proto.c net/fdpass.c net/inbuf.c \
 *       -lcriterion -o t && ./t
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fdpass.h"
#include "inbuf.h"
#include "proto.h"
#include "test_util.h"
#include "umbp/tier.h"

#ifndef UMBP_SOURCE_DIR
#define UMBP_SOURCE_DIR "." /* run from the repository root */
#endif

/* The structs have no holes, so a decoded struct compares with memcmp. */
_Static_assert(sizeof(struct proto_hello) == PROTO_HELLO_SIZE + 4, /* + write_deadline_ms (arg) */
               "hello has no holes");
_Static_assert(sizeof(struct proto_welcome) == PROTO_WELCOME_SIZE, "welcome has no holes");
_Static_assert(sizeof(struct proto_region_item) == PROTO_REGION_ITEM_SIZE, "region");
_Static_assert(sizeof(struct proto_event_item) == PROTO_EVENT_ITEM_SIZE, "event");
_Static_assert(sizeof(struct proto_error) == PROTO_ERROR_SIZE, "error");
_Static_assert(sizeof(struct proto_stats) == PROTO_STATS_SIZE, "stats");
_Static_assert(sizeof(struct proto_session_item) == PROTO_SESSION_ITEM_SIZE, "session");
_Static_assert(sizeof(struct proto_reserve_item) == PROTO_RESERVE_ITEM_SIZE, "reserve");

#define NKEYS 5

static char err[512];

/* Parses exactly one whole frame that must be valid. */
static struct proto_frame parse_ok(const struct proto_buf *b, bool from_server)
{
    struct proto_frame f;
    long r;

    err[0] = 0;
    r = proto_frame_parse(b->data, b->len, from_server, &f, err, sizeof(err));
    cr_assert_eq(r, (long)b->len, "parse = %ld for a %zu-byte frame: %s", r, b->len, err);
    return f;
}

static long parse_err(const uint8_t *p, size_t len, bool from_server)
{
    struct proto_frame f;

    err[0] = 0;
    return proto_frame_parse(p, len, from_server, &f, err, sizeof(err));
}

#define assert_err_names(field)                                                    \
    cr_assert(strncmp(err, field, strlen(field)) == 0, "err should name %s: \"%s\"", \
              field, err)

/* Little-endian writers of our own, by shifts, for hand-made frames. */
static void le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static size_t raw_frame(uint8_t *p, uint32_t len, uint16_t type, uint16_t flags,
                        uint64_t seq, uint32_t n, uint32_t arg)
{
    le32(p, len);
    le16(p + 4, type);
    le16(p + 6, flags);
    le64(p + 8, seq);
    le32(p + 16, n);
    le32(p + 20, arg);
    return 24;
}

/* ---- sample records -------------------------------------------------------- */

static struct proto_hello sample_hello(void)
{
    struct proto_hello h;

    memset(&h, 0, sizeof(h));
    h.magic = PROTO_MAGIC;
    h.version = PROTO_VERSION;
    h.role = PROTO_ROLE_LOOKUP;
    h.flags = PROTO_HELLO_EVENTS;
    h.pid = 0x11223344;
    h.dp_rank = 0x55667788;
    h.tp_rank = 0x7fffffff;
    strcpy(h.engine_id, "vllm-engine-0");
    strcpy(h.name_space, "tenant-a");
    return h;
}

static struct proto_welcome sample_welcome(void)
{
    return (struct proto_welcome){.version = PROTO_VERSION, .lease_ttl_ms = 30000,
                                  .session_id = 0x0102030405060708ull,
                                  .pool_id = 0xfedcba9876543210ull,
                                  .pool_size = 1ull << 40, .capacity_bytes = (1ull << 40) - 4096};
}

static struct proto_region_item sample_region(uint32_t i)
{
    if (i == 1)
        return (struct proto_region_item){.status = UMBP_TIER_EXISTS};
    if (i == 2)
        return (struct proto_region_item){.status = -ENOSPC};
    return (struct proto_region_item){.offset = 0x100000000ull + i * 4096, .size = 4096 + i,
                                      .token = 0xabcdef0000000000ull | i};
}

static struct proto_stats sample_stats(void)
{
    struct proto_stats s;
    uint64_t v[PROTO_STATS_FIELDS];

    for (int i = 0; i < PROTO_STATS_FIELDS; i++)
        v[i] = 0x0101010101010101ull * (uint64_t)(i + 1) + (uint64_t)i;
    memcpy(&s, v, sizeof(s));
    return s;
}

static struct proto_session_item sample_session(uint32_t i)
{
    struct proto_session_item s;

    memset(&s, 0, sizeof(s));
    s.session_id = 1000 + i;
    s.pid = 2000 + i;
    s.uid = 3000 + i;
    s.role = i % 3;
    s.dp_rank = i;
    s.tp_rank = i + 1;
    s.leases = 1ull << (40 + i);
    s.reservations = 7 + i;
    s.requests = 0xffffffffffull + i;
    snprintf(s.engine_id, sizeof(s.engine_id), "engine-%u", i);
    snprintf(s.name_space, sizeof(s.name_space), "ns-%u", i);
    return s;
}

static umbp_key_t key(uint32_t i) { return tu_key_id(77, i); }

/* ---- one sample per type --------------------------------------------------- */

static void build_hello(struct proto_buf *b)
{
    struct proto_hello h = sample_hello();

    cr_assert_eq(proto_begin(b, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(b, &h), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_hello(const struct proto_frame *f)
{
    struct proto_hello h, want = sample_hello();

    cr_assert_eq(proto_get_hello(f, &h, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(memcmp(&h, &want, sizeof(h)), 0);
}

static void build_welcome(struct proto_buf *b)
{
    struct proto_welcome w = sample_welcome();

    cr_assert_eq(proto_begin(b, PROTO_HELLO_OK, 1, 1, 0), 0);
    cr_assert_eq(proto_put_welcome(b, &w), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_welcome(const struct proto_frame *f)
{
    struct proto_welcome w, want = sample_welcome();

    cr_assert_eq(proto_get_welcome(f, &w, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(memcmp(&w, &want, sizeof(w)), 0);
}

static void build_hello_err(struct proto_buf *b)
{
    cr_assert_eq(proto_put_error_frame(b, PROTO_HELLO_ERR, 1, -EPROTO, "version 9"), 0);
}

static void check_error_record(const struct proto_frame *f, int32_t status, const char *msg)
{
    struct proto_error e;

    cr_assert_eq(proto_get_error(f, &e), 0);
    cr_assert_eq(e.status, status);
    cr_assert_str_eq(e.message, msg);
}

static void check_hello_err(const struct proto_frame *f)
{
    cr_assert_eq((int32_t)f->arg, -EPROTO, "HELLO_ERR's arg is its status");
    check_error_record(f, -EPROTO, "version 9");
}

static void build_keys(struct proto_buf *b, uint16_t type, uint32_t arg)
{
    cr_assert_eq(proto_begin(b, type, 0x8000000000000001ull, NKEYS, arg), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        umbp_key_t k = key(i);
        cr_assert_eq(proto_put_key(b, &k), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_keys(const struct proto_frame *f, uint32_t arg)
{
    cr_assert_eq(f->n, NKEYS);
    cr_assert_eq(f->arg, arg);
    cr_assert_eq(f->seq, 0x8000000000000001ull);
    for (uint32_t i = 0; i < NKEYS; i++) {
        umbp_key_t k, want = key(i);
        cr_assert_eq(proto_get_key(f, i, &k), 0);
        cr_assert(tu_key_eq(&k, &want), "key %u", i);
    }
}

static void build_lookup(struct proto_buf *b) { build_keys(b, PROTO_LOOKUP, PROTO_LOOKUP_TOUCH); }
static void check_lookup(const struct proto_frame *f) { check_keys(f, PROTO_LOOKUP_TOUCH); }
static void build_acquire(struct proto_buf *b) { build_keys(b, PROTO_ACQUIRE, 30000); }
static void check_acquire(const struct proto_frame *f) { check_keys(f, 30000); }

static void build_lookup_r(struct proto_buf *b)
{
    cr_assert_eq(proto_begin(b, PROTO_LOOKUP_R, 2, NKEYS, 0), 0);
    for (uint32_t i = 0; i < NKEYS; i++)
        cr_assert_eq(proto_put_u8(b, i & 1), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_lookup_r(const struct proto_frame *f)
{
    for (uint32_t i = 0; i < NKEYS; i++) {
        uint8_t v;
        cr_assert_eq(proto_get_u8(f, i, &v), 0);
        cr_assert_eq(v, i & 1);
    }
}

static void build_reserve(struct proto_buf *b)
{
    cr_assert_eq(proto_begin(b, PROTO_RESERVE, 3, NKEYS, 0), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_reserve_item it = {.key = key(i), .size = (1ull << 33) + i};
        cr_assert_eq(proto_put_reserve_item(b, &it), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_reserve(const struct proto_frame *f)
{
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_reserve_item it;
        umbp_key_t want = key(i);
        cr_assert_eq(proto_get_reserve_item(f, i, &it), 0);
        cr_assert(tu_key_eq(&it.key, &want));
        cr_assert_eq(it.size, (1ull << 33) + i);
    }
}

static void build_regions(struct proto_buf *b, uint16_t type)
{
    cr_assert_eq(proto_begin(b, type, 4, NKEYS, 0), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_region_item it = sample_region(i);
        cr_assert_eq(proto_put_region_item(b, &it), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_regions(const struct proto_frame *f)
{
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_region_item it, want = sample_region(i);
        cr_assert_eq(proto_get_region_item(f, i, &it), 0);
        cr_assert_eq(memcmp(&it, &want, sizeof(it)), 0, "region %u", i);
    }
}

static void build_reserve_r(struct proto_buf *b) { build_regions(b, PROTO_RESERVE_R); }
static void build_acquire_r(struct proto_buf *b) { build_regions(b, PROTO_ACQUIRE_R); }

static void build_tokens(struct proto_buf *b, uint16_t type)
{
    cr_assert_eq(proto_begin(b, type, 5, NKEYS, 0), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_token_item it = {.key = key(i), .token = 0x0123456789abcdefull ^ i};
        cr_assert_eq(proto_put_token_item(b, &it), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_tokens(const struct proto_frame *f)
{
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_token_item it;
        umbp_key_t want = key(i);
        cr_assert_eq(proto_get_token_item(f, i, &it), 0);
        cr_assert(tu_key_eq(&it.key, &want));
        cr_assert_eq(it.token, 0x0123456789abcdefull ^ i);
    }
}

static void build_publish(struct proto_buf *b) { build_tokens(b, PROTO_PUBLISH); }

/* PUBLISH_AS: placeholder key i + 100, token, key i. */
static void build_publish_as(struct proto_buf *b)
{
    cr_assert_eq(proto_begin(b, PROTO_PUBLISH_AS, 5, NKEYS, 0), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_rename_item it = {key(i + 100), 0x0123456789abcdefull ^ i, key(i)};
        cr_assert_eq(proto_put_rename_item(b, &it), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_publish_as(const struct proto_frame *f)
{
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_rename_item it;
        umbp_key_t from = key(i + 100), want = key(i);
        cr_assert_eq(proto_get_rename_item(f, i, &it), 0);
        cr_assert(tu_key_eq(&it.from, &from));
        cr_assert(tu_key_eq(&it.key, &want));
        cr_assert_eq(it.token, 0x0123456789abcdefull ^ i);
    }
    struct proto_token_item wrong;
    cr_assert_eq(proto_get_token_item(f, 0, &wrong), -EINVAL, "a rename record is not a token");
}
static void build_abort(struct proto_buf *b) { build_tokens(b, PROTO_ABORT); }
static void build_release(struct proto_buf *b) { build_tokens(b, PROTO_RELEASE); }

static const int32_t statuses[NKEYS] = {0, -ENOENT, UMBP_E_STALE, INT32_MIN, INT32_MAX};

static void build_statuses(struct proto_buf *b, uint16_t type)
{
    cr_assert_eq(proto_begin(b, type, 6, NKEYS, 0), 0);
    for (uint32_t i = 0; i < NKEYS; i++)
        cr_assert_eq(proto_put_status(b, statuses[i]), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_statuses(const struct proto_frame *f)
{
    for (uint32_t i = 0; i < NKEYS; i++) {
        int32_t v;
        cr_assert_eq(proto_get_status(f, i, &v), 0);
        cr_assert_eq(v, statuses[i]);
    }
}

static void build_publish_r(struct proto_buf *b) { build_statuses(b, PROTO_PUBLISH_R); }
static void build_release_r(struct proto_buf *b) { build_statuses(b, PROTO_RELEASE_R); }

static void build_empty(struct proto_buf *b, uint16_t type, uint32_t arg)
{
    cr_assert_eq(proto_put_empty(b, type, 9, arg), 0);
}

static void check_empty(const struct proto_frame *f, uint32_t arg)
{
    cr_assert_eq(f->n, 0);
    cr_assert_eq(f->arg, arg);
    cr_assert_eq(f->seq, 9);
}

static void build_clear(struct proto_buf *b) { build_empty(b, PROTO_CLEAR, 0); }
static void build_clear_r(struct proto_buf *b) { build_empty(b, PROTO_CLEAR_R, (uint32_t)-EBUSY); }
static void check_clear_r(const struct proto_frame *f) { check_empty(f, (uint32_t)-EBUSY); }
static void build_stats(struct proto_buf *b) { build_empty(b, PROTO_STATS, 0); }
static void build_ping(struct proto_buf *b) { build_empty(b, PROTO_PING, 0); }
static void build_pong(struct proto_buf *b) { build_empty(b, PROTO_PONG, 0); }
static void build_sessions(struct proto_buf *b) { build_empty(b, PROTO_SESSIONS, 0); }
static void check_no_arg(const struct proto_frame *f) { check_empty(f, 0); }

static void build_stats_r(struct proto_buf *b)
{
    struct proto_stats s = sample_stats();

    cr_assert_eq(proto_begin(b, PROTO_STATS_R, 10, 1, 0), 0);
    cr_assert_eq(proto_put_stats(b, &s), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_stats_r(const struct proto_frame *f)
{
    struct proto_stats s, want = sample_stats();

    cr_assert_eq(proto_get_stats(f, &s), 0);
    cr_assert_eq(memcmp(&s, &want, sizeof(s)), 0);
}

static void build_events(struct proto_buf *b)
{
    cr_assert_eq(proto_begin(b, PROTO_EVENTS, 0, NKEYS, 123456), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_event_item e = {.type = i & 1 ? UMBP_EVENT_REMOVED : UMBP_EVENT_STORED,
                                     .key = key(i)};
        cr_assert_eq(proto_put_event_item(b, &e), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_events(const struct proto_frame *f)
{
    cr_assert_eq(f->arg, 123456, "EVENTS' arg counts lost events");
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_event_item e;
        umbp_key_t want = key(i);
        cr_assert_eq(proto_get_event_item(f, i, &e), 0);
        cr_assert_eq(e.type, i & 1 ? UMBP_EVENT_REMOVED : UMBP_EVENT_STORED);
        cr_assert(tu_key_eq(&e.key, &want));
    }
}

static void build_error(struct proto_buf *b)
{
    cr_assert_eq(proto_put_error_frame(b, PROTO_ERROR, 0, -EPROTO, "RESERVE.n: too many"), 0);
}

static void check_error(const struct proto_frame *f)
{
    cr_assert_eq(f->arg, 0);
    check_error_record(f, -EPROTO, "RESERVE.n: too many");
}

static void build_sessions_r(struct proto_buf *b)
{
    cr_assert_eq(proto_begin(b, PROTO_SESSIONS_R, 12, NKEYS, 0), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_session_item s = sample_session(i);
        cr_assert_eq(proto_put_session_item(b, &s), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_sessions_r(const struct proto_frame *f)
{
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_session_item s, want = sample_session(i);
        cr_assert_eq(proto_get_session_item(f, i, &s), 0);
        cr_assert_eq(memcmp(&s, &want, sizeof(s)), 0, "session %u", i);
    }
}

/* ---- the TCP handshake's and umbp-master's frames (proto_master.c) ---------- */

static void build_key1(struct proto_buf *b, uint16_t type, uint64_t seq)
{
    umbp_key_t k = key(3);
    cr_assert_eq(proto_begin(b, type, seq, 1, 0), 0);
    cr_assert_eq(proto_put_key(b, &k), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_key1(const struct proto_frame *f)
{
    umbp_key_t k, want = key(3);
    cr_assert_eq(proto_get_key(f, 0, &k), 0);
    cr_assert(tu_key_eq(&k, &want));
}

static void build_challenge(struct proto_buf *b) { build_key1(b, PROTO_AUTH_CHALLENGE, 0); }
static void build_auth_ok(struct proto_buf *b) { build_key1(b, PROTO_AUTH_OK, 13); }

static void build_auth(struct proto_buf *b)
{
    struct proto_auth a;
    memset(a.nonce, 0x11, 32);
    memset(a.mac, 0x22, 32);
    cr_assert_eq(proto_begin(b, PROTO_AUTH, 14, 1, 0), 0);
    cr_assert_eq(proto_put_auth(b, &a), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_auth(const struct proto_frame *f)
{
    struct proto_auth a;
    cr_assert_eq(proto_get_auth(f, &a, err, sizeof(err)), 0, "%s", err);
    cr_assert(a.nonce[0] == 0x11 && a.nonce[31] == 0x11 && a.mac[0] == 0x22 &&
              a.mac[31] == 0x22);
}

static struct proto_register sample_register(void)
{
    struct proto_register r = {.host = "host-7", .pid = 42, .addr_len = 5,
                               .start_ns = 99, .capacity_bytes = 1 << 30,
                               .used_bytes = 12345, .seq = 77};
    memcpy(r.addr, "abcde", 5);
    return r;
}

static void build_register(struct proto_buf *b)
{
    struct proto_register r = sample_register();
    cr_assert_eq(proto_begin(b, PROTO_REGISTER, 15, 1, 0), 0);
    cr_assert_eq(proto_put_register(b, &r), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_register(const struct proto_frame *f)
{
    struct proto_register r, want = sample_register();
    cr_assert_eq(proto_get_register(f, &r, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(memcmp(&r, &want, sizeof(r)), 0);
}

static void build_ack(struct proto_buf *b, uint16_t type)
{
    struct proto_ack a = {.seq = 1234, .action = PROTO_ACK_RESYNC, .node_ref = 9};
    cr_assert_eq(proto_begin(b, type, 16, 1, 0), 0);
    cr_assert_eq(proto_put_ack(b, &a), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_ack(const struct proto_frame *f)
{
    struct proto_ack a;
    cr_assert_eq(proto_get_ack(f, &a, err, sizeof(err)), 0, "%s", err);
    cr_assert(a.seq == 1234 && a.action == PROTO_ACK_RESYNC && a.node_ref == 9);
}

static void build_register_r(struct proto_buf *b) { build_ack(b, PROTO_REGISTER_R); }
static void build_heartbeat_r(struct proto_buf *b) { build_ack(b, PROTO_HEARTBEAT_R); }
static void build_resync_r(struct proto_buf *b) { build_ack(b, PROTO_RESYNC_R); }

static void build_node_events(struct proto_buf *b, uint16_t type, uint32_t arg)
{
    cr_assert_eq(proto_begin(b, type, 17, NKEYS + 1, arg), 0);
    struct proto_node_event st = {.seq = 500, .kind = PROTO_NODE_STATUS, .size = 777};
    cr_assert_eq(proto_put_node_event(b, &st), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        bool rm = type == PROTO_HEARTBEAT && (i & 1);
        struct proto_node_event e = {
            .seq = type == PROTO_HEARTBEAT ? 100 + i : 0,
            .kind = rm ? PROTO_NODE_REMOVED : PROTO_NODE_STORED, .key = key(i),
            .size = rm ? 0 : 4096 + i};
        cr_assert_eq(proto_put_node_event(b, &e), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_node_events(const struct proto_frame *f)
{
    struct proto_node_event e;
    cr_assert_eq(proto_get_node_event(f, 0, &e, err, sizeof(err)), 0, "%s", err);
    cr_assert(e.kind == PROTO_NODE_STATUS && e.seq == 500 && e.size == 777);
    for (uint32_t i = 0; i < NKEYS; i++) {
        umbp_key_t want = key(i);
        cr_assert_eq(proto_get_node_event(f, i + 1, &e, err, sizeof(err)), 0, "%s", err);
        cr_assert(tu_key_eq(&e.key, &want));
    }
}

static void build_heartbeat(struct proto_buf *b) { build_node_events(b, PROTO_HEARTBEAT, 0); }
static void build_resync(struct proto_buf *b)
{
    build_node_events(b, PROTO_RESYNC, PROTO_RESYNC_FIRST | PROTO_RESYNC_LAST);
}

static void build_locate(struct proto_buf *b)
{
    cr_assert_eq(proto_begin(b, PROTO_LOCATE, 18, NKEYS, 0), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        umbp_key_t k = key(i);
        cr_assert_eq(proto_put_key(b, &k), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_locate(const struct proto_frame *f)
{
    for (uint32_t i = 0; i < NKEYS; i++) {
        umbp_key_t k, want = key(i);
        cr_assert_eq(proto_get_key(f, i, &k), 0);
        cr_assert(tu_key_eq(&k, &want));
    }
}

static struct proto_location sample_location(uint32_t i)
{
    struct proto_location l = {.nrep = i % (PROTO_MAX_REPLICAS + 1)};
    for (uint32_t r = 0; r < l.nrep; r++)
        l.refs[r] = 10 + r;
    l.size = l.nrep ? 4096 + i : 0;
    return l;
}

static void build_locate_r(struct proto_buf *b)
{
    cr_assert_eq(proto_begin(b, PROTO_LOCATE_R, 18, NKEYS, 31), 0);
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_location l = sample_location(i);
        cr_assert_eq(proto_put_location(b, &l), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_locate_r(const struct proto_frame *f)
{
    cr_assert_eq(f->arg, 31);
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct proto_location l, want = sample_location(i);
        cr_assert_eq(proto_get_location(f, i, &l, err, sizeof(err)), 0, "%s", err);
        cr_assert_eq(memcmp(&l, &want, sizeof(l)), 0);
    }
}

static void build_nodes(struct proto_buf *b) { build_empty(b, PROTO_NODES, 31); }
static void check_nodes(const struct proto_frame *f) { check_empty(f, 31); }

static struct proto_node_info sample_node(uint32_t i)
{
    struct proto_node_info n = {.ref = i + 1, .state = i & 1, .pid = 100 + i, .addr_len = 3,
                                .start_ns = 5, .capacity_bytes = 6, .used_bytes = 7,
                                .seq = 8, .keys = 9, .heartbeat_age_ms = 10};
    snprintf(n.host, sizeof(n.host), "node-%u", i);
    memcpy(n.addr, "xyz", 3);
    return n;
}

static void build_nodes_r(struct proto_buf *b)
{
    cr_assert_eq(proto_begin(b, PROTO_NODES_R, 19, 3, 32), 0);
    for (uint32_t i = 0; i < 3; i++) {
        struct proto_node_info n = sample_node(i);
        cr_assert_eq(proto_put_node_info(b, &n), 0);
    }
    cr_assert_eq(proto_end(b), 0);
}

static void check_nodes_r(const struct proto_frame *f)
{
    for (uint32_t i = 0; i < 3; i++) {
        struct proto_node_info n, want = sample_node(i);
        cr_assert_eq(proto_get_node_info(f, i, &n, err, sizeof(err)), 0, "%s", err);
        cr_assert_eq(memcmp(&n, &want, sizeof(n)), 0);
    }
}

static void build_suspect(struct proto_buf *b)
{
    cr_assert_eq(proto_begin(b, PROTO_SUSPECT, 20, 3, 0), 0);
    for (int32_t i = 0; i < 3; i++)
        cr_assert_eq(proto_put_status(b, 7 + i), 0);
    cr_assert_eq(proto_end(b), 0);
}

static void check_suspect(const struct proto_frame *f)
{
    cr_assert_eq(f->n, 3);
    for (uint32_t i = 0; i < 3; i++) {
        int32_t v;
        cr_assert_eq(proto_get_status(f, i, &v), 0);
        cr_assert_eq(v, (int32_t)(7 + i));
    }
}

static void build_waiting(struct proto_buf *b)
{
    cr_assert_eq(proto_put_empty(b, PROTO_WAITING, 21, 1500), 0);
}

static void check_waiting(const struct proto_frame *f)
{
    cr_assert_eq(f->n, 0);
    cr_assert_eq(f->arg, 1500);
    cr_assert_eq(f->seq, 21);
}

struct sample {
    uint16_t type;
    bool from_server;
    void (*build)(struct proto_buf *b);
    void (*check)(const struct proto_frame *f);
};

static const struct sample samples[] = {
    {PROTO_HELLO, false, build_hello, check_hello},
    {PROTO_HELLO_OK, true, build_welcome, check_welcome},
    {PROTO_HELLO_ERR, true, build_hello_err, check_hello_err},
    {PROTO_LOOKUP, false, build_lookup, check_lookup},
    {PROTO_LOOKUP_R, true, build_lookup_r, check_lookup_r},
    {PROTO_RESERVE, false, build_reserve, check_reserve},
    {PROTO_RESERVE_R, true, build_reserve_r, check_regions},
    {PROTO_PUBLISH, false, build_publish, check_tokens},
    {PROTO_PUBLISH_AS, false, build_publish_as, check_publish_as},
    {PROTO_PUBLISH_R, true, build_publish_r, check_statuses},
    {PROTO_ABORT, false, build_abort, check_tokens},
    {PROTO_ACQUIRE, false, build_acquire, check_acquire},
    {PROTO_ACQUIRE_R, true, build_acquire_r, check_regions},
    {PROTO_RELEASE, false, build_release, check_tokens},
    {PROTO_RELEASE_R, true, build_release_r, check_statuses},
    {PROTO_CLEAR, false, build_clear, check_no_arg},
    {PROTO_CLEAR_R, true, build_clear_r, check_clear_r},
    {PROTO_STATS, false, build_stats, check_no_arg},
    {PROTO_STATS_R, true, build_stats_r, check_stats_r},
    {PROTO_PING, false, build_ping, check_no_arg},
    {PROTO_PONG, true, build_pong, check_no_arg},
    {PROTO_EVENTS, true, build_events, check_events},
    {PROTO_ERROR, true, build_error, check_error},
    {PROTO_SESSIONS, false, build_sessions, check_no_arg},
    {PROTO_SESSIONS_R, true, build_sessions_r, check_sessions_r},
    {PROTO_AUTH_CHALLENGE, true, build_challenge, check_key1},
    {PROTO_AUTH, false, build_auth, check_auth},
    {PROTO_AUTH_OK, true, build_auth_ok, check_key1},
    {PROTO_REGISTER, false, build_register, check_register},
    {PROTO_REGISTER_R, true, build_register_r, check_ack},
    {PROTO_HEARTBEAT, false, build_heartbeat, check_node_events},
    {PROTO_HEARTBEAT_R, true, build_heartbeat_r, check_ack},
    {PROTO_RESYNC, false, build_resync, check_node_events},
    {PROTO_RESYNC_R, true, build_resync_r, check_ack},
    {PROTO_LOCATE, false, build_locate, check_locate},
    {PROTO_LOCATE_R, true, build_locate_r, check_locate_r},
    {PROTO_NODES, false, build_nodes, check_nodes},
    {PROTO_NODES_R, true, build_nodes_r, check_nodes_r},
    {PROTO_SUSPECT, false, build_suspect, check_suspect},
    {PROTO_WAITING, true, build_waiting, check_waiting},
};
#define NSAMPLES (sizeof(samples) / sizeof(samples[0]))

static struct proto_buf build(const struct sample *s)
{
    struct proto_buf b = {0};

    s->build(&b);
    return b;
}

/* ---- round trips ------------------------------------------------------------ */

Test(proto_roundtrip, every_type_has_a_sample)
{
    size_t types = 0;

#define X(name, val, rec, max, dir) types++;
    PROTO_TYPES(X)
#undef X
    cr_assert_eq(types, NSAMPLES, "a type of PROTO_TYPES has no sample here");
    for (size_t i = 0; i < NSAMPLES; i++)
        cr_assert_str_neq(proto_type_name(samples[i].type), "?");
    cr_assert_str_eq(proto_type_name(PROTO_RESERVE), "RESERVE");
    cr_assert_str_eq(proto_type_name(0), "?");
    cr_assert_str_eq(proto_type_name(999), "?");
}

Test(proto_roundtrip, every_type)
{
    for (size_t i = 0; i < NSAMPLES; i++) {
        struct proto_buf b = build(&samples[i]);
        struct proto_frame f = parse_ok(&b, samples[i].from_server);
        cr_assert_eq(f.type, samples[i].type, "%s", proto_type_name(samples[i].type));
        samples[i].check(&f);
        proto_buf_free(&b);
    }
}

Test(proto_roundtrip, pipelined_frames_parse_one_after_another)
{
    struct proto_buf b = {0};
    size_t off = 0, seen = 0;

    for (size_t i = 0; i < NSAMPLES; i++)
        if (!samples[i].from_server)
            samples[i].build(&b);
    while (off < b.len) {
        struct proto_frame f;
        long r = proto_frame_parse(b.data + off, b.len - off, false, &f, err, sizeof(err));
        cr_assert_gt(r, 0, "%s", err);
        off += (size_t)r;
        seen++;
    }
    cr_assert_eq(off, b.len);
    cr_assert_eq(seen, 19);
    proto_buf_free(&b);
}

/* The layout, written out byte by byte: a HELLO frame. */
Test(proto_roundtrip, hello_bytes_are_little_endian_in_field_order)
{
    uint8_t want[PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE + PROTO_HELLO_SIZE] = {0};
    struct proto_buf b = {0};
    uint8_t *r = want + 24;

    raw_frame(want, 8 + PROTO_HELLO_SIZE, PROTO_HELLO, 0, 1, 1, 0);
    le32(r, PROTO_MAGIC);
    le16(r + 4, PROTO_VERSION);
    r[6] = PROTO_ROLE_LOOKUP;
    r[7] = 0;
    le32(r + 8, PROTO_HELLO_EVENTS);
    le32(r + 12, 0x11223344);
    le32(r + 16, 0x55667788);
    le32(r + 20, 0x7fffffff);
    memcpy(r + 24, "vllm-engine-0", 13);
    memcpy(r + 24 + PROTO_NAME_MAX, "tenant-a", 8);
    cr_assert_eq(memcmp(r, "PBMU", 4), 0, "the magic reads \"UMBP\" as a little-endian u32");
    build_hello(&b);
    cr_assert_eq(b.len, sizeof(want));
    cr_assert_eq(tu_first_diff(b.data, want, sizeof(want)), SIZE_MAX);
    proto_buf_free(&b);
}

/* The Python encoder of make_corpus.py and this codec agree. */
static void parse_seed_dir(const char *sub, bool from_server)
{
    char dir[512], path[1024];
    uint8_t buf[1 << 16];
    struct dirent *de;
    int files = 0;
    DIR *d;

    snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/%s", UMBP_SOURCE_DIR, sub);
    d = opendir(dir);
    cr_assert_not_null(d, "%s: run from the repository root (or define UMBP_SOURCE_DIR)", dir);
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        FILE *fp = fopen(path, "rb");
        cr_assert_not_null(fp, "%s", path);
        size_t len = fread(buf, 1, sizeof(buf), fp), off = 0;
        fclose(fp);
        while (off < len) {
            struct proto_frame f;
            long r = proto_frame_parse(buf + off, len - off, from_server, &f, err, sizeof(err));
            cr_assert_gt(r, 0, "%s at byte %zu: %ld %s", path, off, r, err);
            off += (size_t)r;
        }
        files++;
    }
    closedir(d);
    cr_assert_gt(files, 10, "%s: too few seeds", dir);
}

Test(proto_roundtrip, python_seed_corpus_parses)
{
    parse_seed_dir("server", false);
    parse_seed_dir("client", true);
}

/* ---- incomplete and misdirected frames ------------------------------------------- */

Test(proto_parse, every_prefix_of_a_valid_frame_is_incomplete)
{
    for (size_t i = 0; i < NSAMPLES; i++) {
        struct proto_buf b = build(&samples[i]);
        for (size_t k = 0; k < b.len; k++) {
            struct proto_frame f = {.type = 0xffff};
            long r = proto_frame_parse(b.data, k, samples[i].from_server, &f, err, sizeof(err));
            cr_assert_eq(r, 0, "%s: prefix %zu of %zu gave %ld (%s)",
                         proto_type_name(samples[i].type), k, b.len, r, err);
            cr_assert_eq(f.type, 0xffff, "an incomplete frame sets nothing");
        }
        proto_buf_free(&b);
    }
}

Test(proto_parse, a_frame_from_the_wrong_side_names_frame_type)
{
    for (size_t i = 0; i < NSAMPLES; i++) {
        struct proto_buf b = build(&samples[i]);
        long r = parse_err(b.data, PROTO_HDR_SIZE, !samples[i].from_server);
        cr_assert_eq(r, -EPROTO, "%s", proto_type_name(samples[i].type));
        assert_err_names("frame.type");
        cr_assert(strstr(err, proto_type_name(samples[i].type)), "%s", err);
        proto_buf_free(&b);
    }
}

/* ---- malformed frames --------------------------------------------------------- */

Test(proto_malformed, flags_nonzero)
{
    uint8_t p[24];

    raw_frame(p, 8, PROTO_PING, 3, 1, 0, 0);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
    cr_assert_str_eq(err, "frame.flags: must be 0, got 3");
    cr_assert_eq(parse_err(p, PROTO_HDR_SIZE, false), -EPROTO, "found from the header alone");
}

Test(proto_malformed, len_over_max_body)
{
    uint8_t p[24];

    raw_frame(p, PROTO_MAX_BODY + 1, PROTO_LOOKUP, 0, 1, 0, 0);
    cr_assert_eq(parse_err(p, PROTO_HDR_SIZE, false), -EMSGSIZE,
                 "refused before buffering the body");
    assert_err_names("frame.len");
    raw_frame(p, UINT32_MAX, PROTO_LOOKUP, 0, 1, 0, 0);
    cr_assert_eq(parse_err(p, PROTO_HDR_SIZE, false), -EMSGSIZE);
}

Test(proto_malformed, unknown_type)
{
    static const uint16_t bad[] = {0, 41, 99, 0xffff};
    uint8_t p[24];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        raw_frame(p, 8, bad[i], 0, 1, 0, 0);
        cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
        assert_err_names("frame.type");
        cr_assert_eq(parse_err(p, sizeof(p), true), -EPROTO);
        assert_err_names("frame.type");
    }
}

Test(proto_malformed, wrong_direction)
{
    uint8_t p[24];

    raw_frame(p, 8, PROTO_PONG, 0, 1, 0, 0);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
    cr_assert(strstr(err, "frame.type: PONG is a server frame"), "%s", err);
    raw_frame(p, 8, PROTO_PING, 0, 1, 0, 0);
    cr_assert_eq(parse_err(p, sizeof(p), true), -EPROTO);
    cr_assert(strstr(err, "frame.type: PING is a client frame"), "%s", err);
}

Test(proto_malformed, body_shorter_than_its_header)
{
    uint8_t p[24];

    raw_frame(p, 4, PROTO_PING, 0, 1, 0, 0);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
    assert_err_names("PING.len");
}

Test(proto_malformed, n_over_max)
{
    uint8_t p[24];

    raw_frame(p, 8, PROTO_RESERVE, 0, 1, 70000, 0);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
    cr_assert_str_eq(err, "RESERVE.n: 70000 records exceed 65536");
    raw_frame(p, 8, PROTO_SESSIONS_R, 0, 1, 4097, 0);
    cr_assert_eq(parse_err(p, sizeof(p), true), -EPROTO);
    assert_err_names("SESSIONS_R.n");
    raw_frame(p, 8 + 32, PROTO_PING, 0, 1, 1, 0);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
    assert_err_names("PING.n");
}

Test(proto_malformed, one_record_types_need_exactly_one)
{
    uint8_t p[24];

    raw_frame(p, 8, PROTO_HELLO, 0, 1, 0, 0);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
    cr_assert_str_eq(err, "HELLO.n: must be 1, got 0");
    raw_frame(p, 8, PROTO_STATS_R, 0, 1, 2, 0);
    cr_assert_eq(parse_err(p, sizeof(p), true), -EPROTO);
    assert_err_names("STATS_R.n");
}

Test(proto_malformed, len_does_not_match_n)
{
    uint8_t p[24];

    raw_frame(p, 100, PROTO_LOOKUP, 0, 1, 3, 0);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO, "found before the records arrive");
    cr_assert_str_eq(err, "LOOKUP.len: 8 + 3*32 != 100");
    raw_frame(p, 8 + 3 * 32 + 1, PROTO_LOOKUP, 0, 1, 3, 0);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
    /* n * size overflowing 32 bits must not wrap onto a small len. */
    raw_frame(p, 8, PROTO_EVENTS, 0, 0, 0x80000000u, 0);
    cr_assert_lt(parse_err(p, sizeof(p), true), 0);
}

Test(proto_malformed, arg_outside_its_rule)
{
    uint8_t p[24 + 32];

    memset(p, 0, sizeof(p));
    raw_frame(p, 8, PROTO_PING, 0, 1, 0, 5);
    cr_assert_eq(parse_err(p, 24, false), -EPROTO);
    cr_assert_str_eq(err, "PING.arg: must be 0, got 5");
    raw_frame(p, 8 + 32, PROTO_LOOKUP, 0, 1, 1, 2);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
    assert_err_names("LOOKUP.arg");
    raw_frame(p, 8 + 32, PROTO_ACQUIRE, 0, 1, 1, 0);
    cr_assert_eq(parse_err(p, sizeof(p), false), -EPROTO);
    assert_err_names("ACQUIRE.arg");
    raw_frame(p, 8 + 32, PROTO_ACQUIRE, 0, 1, 1, UINT32_MAX);
    cr_assert_eq(parse_err(p, sizeof(p), false), (long)sizeof(p), "any ttl > 0: %s", err);
    raw_frame(p, 8, PROTO_WAITING, 0, 3, 0, 0);
    cr_assert_eq(parse_err(p, 24, true), -EPROTO);
    cr_assert_str_eq(err, "WAITING.arg: a wait of 0 ms is not in 1 .. 3660000");
    raw_frame(p, 8, PROTO_WAITING, 0, 3, 0, PROTO_WAIT_MAX_MS + 1);
    cr_assert_eq(parse_err(p, 24, true), -EPROTO);
    assert_err_names("WAITING.arg");
    raw_frame(p, 8, PROTO_WAITING, 0, 3, 0, PROTO_WAIT_MAX_MS);
    cr_assert_eq(parse_err(p, 24, true), 24, "%s", err);
    /* RESERVE.arg: a hold of at most PROTO_HOLD_MAX_MS (0 = none) */
    raw_frame(p, 8, PROTO_RESERVE, 0, 4, 0, PROTO_HOLD_MAX_MS + 1);
    cr_assert_eq(parse_err(p, 24, false), -EPROTO);
    cr_assert_str_eq(err, "RESERVE.arg: a hold of 600001 ms exceeds 600000");
    raw_frame(p, 8, PROTO_RESERVE, 0, 4, 0, PROTO_HOLD_MAX_MS);
    cr_assert_eq(parse_err(p, 24, false), 24, "%s", err);
    raw_frame(p, 8, PROTO_PUBLISH_AS, 0, 4, 0, 1);
    cr_assert_eq(parse_err(p, 24, false), -EPROTO);
    cr_assert_str_eq(err, "PUBLISH_AS.arg: must be 0, got 1");
}

Test(proto_malformed, unsolicited_frames_carry_seq_0)
{
    uint8_t p[24];

    raw_frame(p, 8, PROTO_EVENTS, 0, 5, 0, 0);
    cr_assert_eq(parse_err(p, sizeof(p), true), -EPROTO);
    assert_err_names("EVENTS.seq");
    raw_frame(p, 8, PROTO_EVENTS, 0, 0, 0, 17);
    cr_assert_eq(parse_err(p, sizeof(p), true), 24, "EVENTS with only a lost count: %s", err);
}

/* A valid sample with byte `at` of its first record set to v, parsed. */
static struct proto_frame spoiled(const struct sample *s, struct proto_buf *b, size_t at,
                                  uint8_t v)
{
    *b = build(s);
    b->data[PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE + at] = v;
    return parse_ok(b, s->from_server);
}

static const struct sample *sample_of(uint16_t type)
{
    for (size_t i = 0; i < NSAMPLES; i++)
        if (samples[i].type == type)
            return &samples[i];
    cr_assert_fail("no sample of type %u", type);
    return NULL;
}

static void expect_hello_refused(size_t at, uint8_t v, const char *field)
{
    struct proto_buf b;
    struct proto_frame f = spoiled(sample_of(PROTO_HELLO), &b, at, v);
    struct proto_hello h = {0};

    err[0] = 0;
    cr_assert_eq(proto_get_hello(&f, &h, err, sizeof(err)), -EINVAL, "%s", field);
    assert_err_names(field);
    cr_assert_eq(h.magic, 0, "output untouched on failure");
    proto_buf_free(&b);
}

Test(proto_malformed, hello_records)
{
    expect_hello_refused(0, 'X', "HELLO.magic");
    expect_hello_refused(6, 4, "HELLO.role");
    expect_hello_refused(7, 1, "HELLO.pad");
    expect_hello_refused(8, 0x02, "HELLO.flags");
    expect_hello_refused(24 + 20, 'x', "HELLO.engine_id");        /* after the NUL */
    expect_hello_refused(24 + 64 + 63, 'x', "HELLO.name_space"); /* the last byte */
}

/* A worker declares its write deadline in the HELLO's arg (protocol 2);
 * other roles declare none.  Both sides refuse a wrong one by name. */
Test(proto_malformed, hello_write_deadline)
{
    struct proto_hello h = sample_hello(), got;
    struct proto_buf b = {0};
    struct proto_frame f;

    h.role = PROTO_ROLE_WORKER;
    h.write_deadline_ms = 11000;
    cr_assert_eq(proto_begin(&b, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(&b, &h), 0);
    cr_assert_eq(proto_end(&b), 0);
    cr_assert_gt(proto_frame_parse(b.data, b.len, false, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(f.arg, 11000, "the deadline travels in the body header");
    cr_assert_eq(proto_get_hello(&f, &got, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(got.write_deadline_ms, 11000);
    /* a worker without one, a lookup client with one */
    le32(b.data + 16 + 4, 0);
    cr_assert_gt(proto_frame_parse(b.data, b.len, false, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(proto_get_hello(&f, &got, err, sizeof(err)), -EINVAL);
    assert_err_names("HELLO.arg");
    b.data[16 + 8 + 6] = PROTO_ROLE_LOOKUP;
    le32(b.data + 16 + 4, 5);
    cr_assert_gt(proto_frame_parse(b.data, b.len, false, &f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(proto_get_hello(&f, &got, err, sizeof(err)), -EINVAL);
    assert_err_names("HELLO.arg");
    /* over the cap: refused by the parser, before the record arrives */
    le32(b.data + 16 + 4, PROTO_WRITE_DEADLINE_MAX_MS + 1);
    cr_assert_eq(proto_frame_parse(b.data, 24, false, &f, err, sizeof(err)), -EPROTO);
    assert_err_names("HELLO.arg");
    proto_buf_free(&b);
    /* the encoder refuses what the decoder would */
    h.write_deadline_ms = 0;
    cr_assert_eq(proto_begin(&b, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(&b, &h), -EINVAL);
    cr_assert_neq(proto_end(&b), 0);
    proto_buf_free(&b);
}

Test(proto_malformed, string_without_nul)
{
    struct proto_buf b = build(sample_of(PROTO_HELLO));
    struct proto_frame f;
    struct proto_hello h;

    memset(b.data + 24 + 24, 'a', PROTO_NAME_MAX);
    f = parse_ok(&b, false);
    cr_assert_eq(proto_get_hello(&f, &h, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "HELLO.engine_id: not NUL-terminated"), "%s", err);
    proto_buf_free(&b);

    b = build(sample_of(PROTO_ERROR));
    memset(b.data + 24 + 4, 'a', PROTO_ERRMSG_MAX);
    f = parse_ok(&b, true);
    struct proto_error e;
    cr_assert_eq(proto_get_error(&f, &e), -EINVAL);
    proto_buf_free(&b);

    b = build(sample_of(PROTO_SESSIONS_R));
    memset(b.data + 24 + 56 + 64, 'a', PROTO_NAME_MAX); /* name_space of item 0 */
    f = parse_ok(&b, true);
    struct proto_session_item s;
    cr_assert_eq(proto_get_session_item(&f, 0, &s), -EINVAL);
    cr_assert_eq(proto_get_session_item(&f, 1, &s), 0, "only item 0 is spoiled");
    proto_buf_free(&b);
}

Test(proto_malformed, nonzero_pads)
{
    struct proto_buf b;
    struct proto_frame f;
    struct proto_welcome w;
    struct proto_region_item it;
    struct proto_session_item s;

    f = spoiled(sample_of(PROTO_HELLO_OK), &b, 2, 1);
    cr_assert_eq(proto_get_welcome(&f, &w, err, sizeof(err)), -EINVAL);
    cr_assert_str_eq(err, "HELLO_OK.pad: must be 0, got 1");
    proto_buf_free(&b);
    f = spoiled(sample_of(PROTO_RESERVE_R), &b, 7, 0x80);
    cr_assert_eq(proto_get_region_item(&f, 0, &it), -EINVAL);
    cr_assert_eq(proto_get_region_item(&f, 1, &it), 0);
    proto_buf_free(&b);
    f = spoiled(sample_of(PROTO_SESSIONS_R), &b, 28, 1);
    cr_assert_eq(proto_get_session_item(&f, 0, &s), -EINVAL);
    proto_buf_free(&b);
}

Test(proto_malformed, values_outside_their_range)
{
    struct proto_buf b;
    struct proto_frame f;
    uint8_t u8;
    struct proto_event_item e;
    struct proto_session_item s;
    struct proto_error er;

    f = spoiled(sample_of(PROTO_LOOKUP_R), &b, 0, 2);
    cr_assert_eq(proto_get_u8(&f, 0, &u8), -EINVAL, "present is 0 or 1");
    proto_buf_free(&b);
    f = spoiled(sample_of(PROTO_EVENTS), &b, 0, 3);
    cr_assert_eq(proto_get_event_item(&f, 0, &e), -EINVAL, "event type 3 is unknown");
    proto_buf_free(&b);
    f = spoiled(sample_of(PROTO_SESSIONS_R), &b, 16, 7);
    cr_assert_eq(proto_get_session_item(&f, 0, &s), -EINVAL, "role 7 is unknown");
    proto_buf_free(&b);
    f = spoiled(sample_of(PROTO_HELLO_ERR), &b, 0, 0);
    cr_assert_eq(proto_get_error(&f, &er), -EINVAL, "HELLO_ERR status != arg");
    proto_buf_free(&b);
}

Test(proto_malformed, accessors_check_type_and_index)
{
    struct proto_buf b = build(sample_of(PROTO_RESERVE));
    struct proto_frame f = parse_ok(&b, false);
    struct proto_reserve_item it;
    struct proto_token_item tk;
    struct proto_hello h;
    umbp_key_t k;

    cr_assert_eq(proto_get_key(&f, 0, &k), -EINVAL, "RESERVE records are not keys");
    cr_assert_eq(proto_get_token_item(&f, 0, &tk), -EINVAL);
    cr_assert_eq(proto_get_hello(&f, &h, err, sizeof(err)), -EINVAL);
    assert_err_names("HELLO");
    cr_assert_eq(proto_get_reserve_item(&f, NKEYS - 1, &it), 0);
    cr_assert_eq(proto_get_reserve_item(&f, NKEYS, &it), -EINVAL);
    cr_assert_eq(proto_get_reserve_item(&f, UINT32_MAX, &it), -EINVAL);
    f.record_size = 32; /* a frame filled in by hand, inconsistently */
    cr_assert_eq(proto_get_reserve_item(&f, 0, &it), -EINVAL);
    proto_buf_free(&b);
}

/* ---- the encoder ------------------------------------------------------------- */

Test(proto_encode, begin_refuses_what_the_parser_would)
{
    struct proto_buf b = {0};

    cr_assert_eq(proto_begin(&b, 0, 1, 0, 0), -EINVAL, "unknown type");
    cr_assert_eq(proto_begin(&b, PROTO_LOOKUP, 1, PROTO_MAX_RECORDS + 1, 0), -EINVAL);
    cr_assert_eq(proto_begin(&b, PROTO_HELLO, 1, 0, 0), -EINVAL, "HELLO has one record");
    cr_assert_eq(proto_begin(&b, PROTO_PING, 1, 0, 1), -EINVAL, "PING's arg is 0");
    cr_assert_eq(proto_begin(&b, PROTO_ACQUIRE, 1, 1, 0), -EINVAL, "ttl 0");
    cr_assert_eq(proto_begin(&b, PROTO_EVENTS, 1, 0, 0), -EINVAL, "EVENTS seq is 0");
    cr_assert_eq(proto_end(&b), -EINVAL, "nothing open");
    cr_assert_eq(b.len, 0);
    cr_assert_eq(proto_begin(&b, PROTO_PING, 1, 0, 0), 0);
    cr_assert_eq(proto_begin(&b, PROTO_PING, 2, 0, 0), -EINVAL, "one frame at a time");
    cr_assert_eq(proto_end(&b), 0);
    cr_assert_eq(b.len, 24);
    proto_buf_free(&b);
}

Test(proto_encode, wrong_count_or_kind_drops_the_frame_only)
{
    struct proto_buf b = {0};
    umbp_key_t k = key(0);
    struct proto_token_item tk = {0};

    build_ping(&b);
    cr_assert_eq(proto_begin(&b, PROTO_LOOKUP, 2, 2, 0), 0);
    cr_assert_eq(proto_put_key(&b, &k), 0);
    cr_assert_eq(proto_end(&b), -EPROTO, "one record short");
    cr_assert_eq(b.len, 24, "the PING before stays");

    cr_assert_eq(proto_begin(&b, PROTO_LOOKUP, 2, 1, 0), 0);
    cr_assert_eq(proto_put_key(&b, &k), 0);
    cr_assert_eq(proto_put_key(&b, &k), -EINVAL, "one record too many");
    cr_assert_eq(proto_end(&b), -EINVAL, "the failure sticks");
    cr_assert_eq(b.len, 24);

    cr_assert_eq(proto_begin(&b, PROTO_LOOKUP, 2, 1, 0), 0);
    cr_assert_eq(proto_put_token_item(&b, &tk), -EINVAL, "a token in a LOOKUP");
    cr_assert_eq(proto_put_key(&b, &k), -EINVAL, "sticky");
    cr_assert_eq(proto_end(&b), -EINVAL);
    cr_assert_eq(b.len, 24);

    cr_assert_eq(proto_put_key(&b, &k), -EINVAL, "no frame open");
    parse_ok(&b, false);
    proto_buf_free(&b);
}

Test(proto_encode, puts_refuse_what_the_decoder_would)
{
    struct proto_buf b = {0};
    struct proto_hello h = sample_hello();
    struct proto_error e = {0};
    struct proto_event_item ev = {.type = 9};

    h.magic = 1;
    cr_assert_eq(proto_begin(&b, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(&b, &h), -EINVAL);
    cr_assert_eq(proto_end(&b), -EINVAL);
    h = sample_hello();
    memset(h.engine_id, 'z', sizeof(h.engine_id));
    cr_assert_eq(proto_begin(&b, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(&b, &h), -EINVAL, "unterminated engine_id");
    cr_assert_eq(proto_end(&b), -EINVAL);
    memset(e.message, 'm', sizeof(e.message));
    cr_assert_eq(proto_begin(&b, PROTO_ERROR, 0, 1, 0), 0);
    cr_assert_eq(proto_put_error(&b, &e), -EINVAL);
    cr_assert_eq(proto_end(&b), -EINVAL);
    cr_assert_eq(proto_begin(&b, PROTO_EVENTS, 0, 1, 0), 0);
    cr_assert_eq(proto_put_event_item(&b, &ev), -EINVAL);
    cr_assert_eq(proto_end(&b), -EINVAL);
    cr_assert_eq(proto_begin(&b, PROTO_LOOKUP_R, 1, 1, 0), 0);
    cr_assert_eq(proto_put_u8(&b, 2), -EINVAL);
    cr_assert_eq(proto_end(&b), -EINVAL);
    cr_assert_eq(b.len, 0);
    proto_buf_free(&b);
}

Test(proto_encode, pads_and_string_tails_go_out_as_zero)
{
    struct proto_buf b = {0};
    struct proto_hello h = sample_hello();
    struct proto_frame f;
    struct proto_hello back;

    h.pad = 0xee;
    memset(h.engine_id, 0xee, sizeof(h.engine_id));
    strcpy(h.engine_id, "e"); /* garbage after the NUL */
    cr_assert_eq(proto_begin(&b, PROTO_HELLO, 1, 1, 0), 0);
    cr_assert_eq(proto_put_hello(&b, &h), 0);
    cr_assert_eq(proto_end(&b), 0);
    f = parse_ok(&b, false);
    cr_assert_eq(proto_get_hello(&f, &back, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(back.pad, 0);
    for (size_t i = 1; i < PROTO_NAME_MAX; i++)
        cr_assert_eq(back.engine_id[i], 0, "byte %zu", i);
    proto_buf_free(&b);
}

Test(proto_encode, error_frame_cuts_a_long_message)
{
    struct proto_buf b = {0};
    char msg[400];
    struct proto_frame f;
    struct proto_error e;

    memset(msg, 'q', sizeof(msg) - 1);
    msg[sizeof(msg) - 1] = 0;
    cr_assert_eq(proto_put_error_frame(&b, PROTO_ERROR, 0, -EPROTO, msg), 0);
    f = parse_ok(&b, true);
    cr_assert_eq(proto_get_error(&f, &e), 0);
    cr_assert_eq(strlen(e.message), PROTO_ERRMSG_MAX - 1);
    cr_assert_eq(proto_put_error_frame(&b, PROTO_PING, 0, -EPROTO, "x"), -EINVAL);
    cr_assert_eq(proto_put_error_frame(&b, PROTO_ERROR, 5, -EPROTO, "x"), -EINVAL,
                 "ERROR is unsolicited: seq 0");
    proto_buf_free(&b);
}

Test(proto_encode, consume_and_growth)
{
    struct proto_buf b = {0};
    struct proto_frame f;
    umbp_key_t k = key(1);

    proto_buf_consume(&b, 0); /* an empty buffer (data NULL): UBSan checks it */
    proto_buf_consume(&b, 16);
    cr_assert_eq(b.len, 0);

    build_ping(&b);
    build_stats(&b);
    proto_buf_consume(&b, 24);
    f = parse_ok(&b, false);
    cr_assert_eq(f.type, PROTO_STATS);
    /* A whole maximal LOOKUP: 2 MiB in one frame, doubling as it grows. */
    cr_assert_eq(proto_begin(&b, PROTO_LOOKUP, 7, PROTO_MAX_RECORDS, 0), 0);
    proto_buf_consume(&b, 1000); /* drops the STATS, stops at the open frame */
    cr_assert_eq(b.len, 24);
    for (uint32_t i = 0; i < PROTO_MAX_RECORDS; i++)
        cr_assert_eq(proto_put_key(&b, &k), 0);
    cr_assert_eq(proto_end(&b), 0);
    cr_assert_eq(b.cap & (b.cap - 1), 0, "capacity %zu is a power of two", b.cap);
    f = parse_ok(&b, false);
    cr_assert_eq(f.n, PROTO_MAX_RECORDS);
    proto_buf_consume(&b, b.len);
    cr_assert_eq(b.len, 0);
    proto_buf_free(&b);
    cr_assert_null(b.data);
}

/* realloc failing: the open frame is dropped, what was before stays. */
/* proto_buf_move: frames built in one buffer (a reply built in slices)
 * land whole after another's, byte for byte; into an empty buffer they
 * move without a copy; an open frame on either side is refused. */
Test(proto_encode, move_appends_whole_frames)
{
    struct proto_buf out = {0}, reply = {0}, expect = {0};
    cr_assert_eq(proto_put_empty(&out, PROTO_PONG, 1, 0), 0);
    cr_assert_eq(proto_put_empty(&expect, PROTO_PONG, 1, 0), 0);
    for (struct proto_buf *b = &reply; b; b = b == &reply ? &expect : NULL) {
        cr_assert_eq(proto_begin(b, PROTO_LOOKUP_R, 2, 3, 0), 0);
        for (uint8_t i = 0; i < 3; i++)
            cr_assert_eq(proto_put_u8(b, i & 1), 0);
        cr_assert_eq(proto_end(b), 0);
    }
    struct proto_buf open = {0};
    cr_assert_eq(proto_begin(&open, PROTO_PONG, 3, 0, 0), 0);
    cr_assert_eq(proto_buf_move(&open, &reply), -EINVAL, "moved behind an open frame");
    cr_assert_eq(proto_buf_move(&out, &open), -EINVAL, "moved an open frame");
    cr_assert_eq(proto_end(&open), 0);
    proto_buf_free(&open);
    cr_assert_eq(proto_buf_move(&out, &reply), 0);
    cr_assert_eq(reply.len, 0);
    cr_assert_eq(out.len, expect.len);
    cr_assert_arr_eq(out.data, expect.data, expect.len);

    struct proto_buf empty = {0};
    cr_assert_eq(proto_buf_move(&empty, &out), 0);
    cr_assert_eq(out.len, 0);
    cr_assert_eq(empty.len, expect.len);
    cr_assert_arr_eq(empty.data, expect.data, expect.len);
    cr_assert_eq(proto_buf_move(&empty, &out), 0, "moving nothing");
    cr_assert_eq(empty.len, expect.len);
    proto_buf_free(&empty);
    proto_buf_free(&out);
    proto_buf_free(&reply);
    proto_buf_free(&expect);
}

Test(proto_encode, out_of_memory_is_clean)
{
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("RLIMIT_AS and AddressSanitizer's shadow memory do not mix");
#else
    struct proto_buf b = {0};
    struct rlimit lim;
    umbp_key_t k = key(2);
    unsigned long pages = 0;
    FILE *fp = fopen("/proc/self/statm", "r");
    int rc = 0;

    cr_assert_not_null(fp);
    cr_assert_eq(fscanf(fp, "%lu", &pages), 1);
    fclose(fp);
    build_ping(&b);
    /* Room for a few MiB more at most: a 2 MiB frame's doubling fails. */
    lim.rlim_cur = lim.rlim_max = pages * (unsigned long)sysconf(_SC_PAGESIZE) + (1ul << 20);
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
    cr_assert_eq(proto_begin(&b, PROTO_LOOKUP, 7, PROTO_MAX_RECORDS, 0), 0);
    for (uint32_t i = 0; i < PROTO_MAX_RECORDS && rc == 0; i++)
        rc = proto_put_key(&b, &k);
    cr_assert_eq(rc, -ENOMEM);
    cr_assert_eq(proto_put_key(&b, &k), -ENOMEM, "sticky");
    cr_assert_eq(proto_end(&b), -ENOMEM);
    cr_assert_eq(b.len, 24);
    parse_ok(&b, false);
    proto_buf_free(&b);
#endif
}

/* ---- the client's region check ------------------------------------------------ */

static int region(int32_t status, uint64_t off, uint64_t size, uint64_t token, uint64_t want,
                  uint64_t pool, bool is_reserve)
{
    struct proto_region_item it = {.status = status, .offset = off, .size = size,
                                   .token = token};

    err[0] = 0;
    return proto_region_check(&it, want, pool, is_reserve, err, sizeof(err));
}

Test(proto_region, accepts)
{
    cr_assert_eq(region(0, 0, 4096, 1, 4096, 8192, true), 0, "%s", err);
    cr_assert_eq(region(0, 4096, 4096, 1, 4096, 8192, true), 0, "ends at the pool's end");
    cr_assert_eq(region(0, 100, 7, 1, 0, 8192, false), 0, "acquire: any size");
    cr_assert_eq(region(UMBP_TIER_EXISTS, 0, 0, 0, 4096, 8192, true), 0);
    cr_assert_eq(region(-ENOSPC, 0, 0, 0, 4096, 8192, true), 0);
    cr_assert_eq(region(-ENOENT, 0, 0, 0, 0, 8192, false), 0);
    cr_assert_eq(region(0, UINT64_MAX - 10, 10, 1, 0, UINT64_MAX, false), 0,
                 "ends at the last byte of the largest pool");
}

Test(proto_region, rejects)
{
    cr_assert_eq(region(0, 0, 4096, 1, 4000, 8192, true), -EPROTO);
    assert_err_names("RESERVE_R.size");
    cr_assert_eq(region(0, 0, 0, 1, 0, 8192, false), -EPROTO);
    assert_err_names("ACQUIRE_R.size");
    cr_assert_eq(region(0, 4097, 4096, 1, 4096, 8192, true), -EPROTO);
    assert_err_names("RESERVE_R.offset");
    cr_assert_eq(region(0, 9000, 1, 1, 0, 8192, false), -EPROTO);
    assert_err_names("ACQUIRE_R.offset");
    cr_assert_eq(region(0, 0, 4096, 1, 0, 0, false), -EPROTO, "an empty pool");
    cr_assert_eq(region(UMBP_TIER_EXISTS, 0, 0, 0, 0, 8192, false), -EPROTO,
                 "EXISTS is a reserve status");
    assert_err_names("ACQUIRE_R.status");
    cr_assert_eq(region(5, 0, 0, 0, 4096, 8192, true), -EPROTO);
    assert_err_names("RESERVE_R.status");
    cr_assert_eq(region(-ENOSPC, 0, 0, 3, 4096, 8192, true), -EPROTO, "token with a failure");
    cr_assert_eq(region(-ENOSPC, 64, 0, 0, 4096, 8192, true), -EPROTO);
    cr_assert_eq(region(-ENOSPC, 0, 64, 0, 4096, 8192, true), -EPROTO);
}

Test(proto_region, offset_plus_size_overflow)
{
    cr_assert_eq(region(0, UINT64_MAX - 10, 100, 1, 100, UINT64_MAX, true), -EPROTO,
                 "wraps past 2^64 onto a small end");
    assert_err_names("RESERVE_R.offset");
    cr_assert_eq(region(0, 1ull << 63, 1ull << 63, 1, 0, 1ull << 40, false), -EPROTO);
    cr_assert_eq(region(0, 16, UINT64_MAX, 1, 0, 1ull << 40, false), -EPROTO);
}

/* ---- the socket path ----------------------------------------------------------- */

static int path(const char *dir, unsigned dp, const char *inst, char *out, size_t outlen)
{
    err[0] = 0;
    return proto_socket_path(dir, dp, inst, out, outlen, err, sizeof(err));
}

Test(proto_path, shapes)
{
    char out[256];

    cr_assert_eq(path("/run/umbp", 0, NULL, out, sizeof(out)), 0, "%s", err);
    cr_assert_str_eq(out, "/run/umbp/umbp-dp0.sock");
    cr_assert_eq(path("/run/umbp/", 3, "", out, sizeof(out)), 0, "%s", err);
    cr_assert_str_eq(out, "/run/umbp/umbp-dp3.sock");
    cr_assert_eq(path("/tmp", 4294967295u, "a-Z.9_x", out, sizeof(out)), 0, "%s", err);
    cr_assert_str_eq(out, "/tmp/umbp-dp4294967295-a-Z.9_x.sock");
    cr_assert_eq(path("rel", 1, "i", out, sizeof(out)), 0);
    cr_assert_str_eq(out, "rel/umbp-dp1-i.sock");
}

Test(proto_path, bad_instance_or_dir)
{
    static const char *const bad[] = {"a/b", "a b", "..\n", "x*", "\xc3\xa9", "a:b"};
    char out[256];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(path("/run", 0, bad[i], out, sizeof(out)), -EINVAL, "%s", bad[i]);
        assert_err_names("lookup_instance");
    }
    cr_assert_eq(path("", 0, NULL, out, sizeof(out)), -EINVAL);
    assert_err_names("socket_dir");
}

Test(proto_path, too_long)
{
    size_t cap = sizeof(((struct sockaddr_un *)0)->sun_path);
    char dir[256], out[256];
    size_t fixed = strlen("/umbp-dp0.sock");

    /* dir + "/umbp-dp0.sock" + NUL == sizeof sun_path exactly: fits. */
    memset(dir, 'd', cap - 1 - fixed);
    dir[0] = '/';
    dir[cap - 1 - fixed] = 0;
    cr_assert_eq(path(dir, 0, NULL, out, sizeof(out)), 0, "%s", err);
    cr_assert_eq(strlen(out), cap - 1);
    dir[cap - 1 - fixed] = 'd';
    dir[cap - fixed] = 0;
    cr_assert_eq(path(dir, 0, NULL, out, sizeof(out)), -ENAMETOOLONG);
    cr_assert(strstr(err, "socket_dir") && strstr(err, "lookup_instance"), "%s", err);
    dir[20] = 0;
    cr_assert_eq(path(dir, 0, "a-very-long-instance-name-a-very-long-instance-name-"
                               "a-very-long-instance-name-a-very-long", out, sizeof(out)),
                 -ENAMETOOLONG);
    cr_assert_eq(path("/run", 0, NULL, out, 10), -ENAMETOOLONG, "the output buffer");
}

/* ---- fd passing ------------------------------------------------------------------ */

static int temp_file(void)
{
    char name[] = "/tmp/umbp-proto-XXXXXX";
    int fd = mkstemp(name);

    cr_assert_geq(fd, 0);
    unlink(name);
    return fd;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    cr_assert_not_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

Test(proto_socket, fd_refers_to_the_same_file)
{
    int sv[2], file = temp_file(), got = -1;
    struct proto_buf b = {0};
    uint8_t in[256];
    char back[6] = {0};

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    build_welcome(&b);
    cr_assert_eq(proto_send_with_fd(sv[0], b.data, b.len, file), 0);
    long r = proto_recv_with_fd(sv[1], in, sizeof(in), &got);
    cr_assert_eq(r, (long)b.len);
    cr_assert_eq(memcmp(in, b.data, b.len), 0);
    cr_assert_geq(got, 0);
    cr_assert_neq(got, file);
    cr_assert(fcntl(got, F_GETFD) & FD_CLOEXEC, "received with MSG_CMSG_CLOEXEC");
    cr_assert_eq(pwrite(file, "hello", 5, 100), 5);
    cr_assert_eq(pread(got, back, 5, 100), 5);
    cr_assert_str_eq(back, "hello");
    cr_assert_eq(pwrite(got, "world", 5, 0), 5);
    cr_assert_eq(pread(file, back, 5, 0), 5);
    cr_assert_str_eq(back, "world");
    close(got);
    close(file);
    close(sv[0]);
    close(sv[1]);
    proto_buf_free(&b);
}

Test(proto_socket, without_fd_and_eof)
{
    int sv[2], got = 7;
    uint8_t in[64];

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_assert_eq(proto_send_with_fd(sv[0], "abc", 3, -1), 0);
    cr_assert_eq(proto_recv_with_fd(sv[1], in, sizeof(in), &got), 3);
    cr_assert_eq(got, -1);
    cr_assert_eq(proto_send_with_fd(sv[0], "", 0, 0), -EINVAL, "an fd needs a byte");
    cr_assert_eq(proto_recv_with_fd(sv[1], in, 0, &got), -EINVAL);
    close(sv[0]);
    cr_assert_eq(proto_recv_with_fd(sv[1], in, sizeof(in), &got), 0, "EOF");
    cr_assert_eq(proto_send_with_fd(sv[1], "x", 1, -1), -EPIPE, "no SIGPIPE");
    close(sv[1]);
}

Test(proto_socket, nonblocking_empty_is_eagain)
{
    int sv[2], got;
    uint8_t in[8];

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    cr_assert_eq(proto_recv_with_fd(sv[1], in, sizeof(in), &got), -EAGAIN);
    close(sv[0]);
    close(sv[1]);
}

Test(proto_socket, two_fds_are_refused_and_closed)
{
    int sv[2], fds[2] = {temp_file(), temp_file()}, got = 7, before;
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(fds))];
    } ctl;
    struct iovec iov = {.iov_base = "x", .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    uint8_t in[8];

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(c), fds, sizeof(fds));
    cr_assert_eq(sendmsg(sv[0], &msg, 0), 1);
    before = count_fds();
    cr_assert_eq(proto_recv_with_fd(sv[1], in, sizeof(in), &got), -EPROTO);
    cr_assert_eq(got, -1);
    cr_assert_eq(count_fds(), before, "both received fds closed");
    close(fds[0]);
    close(fds[1]);
    close(sv[0]);
    close(sv[1]);
}

struct sender {
    int sock, fd;
    const uint8_t *buf;
    size_t len;
    int rc;
};

static void *send_big(void *arg)
{
    struct sender *s = arg;

    s->rc = proto_send_with_fd(s->sock, s->buf, s->len, s->fd);
    return NULL;
}

/* Larger than the socket buffer: sendmsg writes it in parts, the fd rides
 * on the first part only. */
Test(proto_socket, partial_writes_carry_the_fd_once)
{
    size_t len = 8u << 20, off = 0;
    uint8_t *out = malloc(len), *in = malloc(len);
    int sv[2], fds = 0, got;
    struct tu_rng rng;
    pthread_t th;

    cr_assert(out && in);
    tu_rng_seed(&rng, 42);
    tu_fill_random(&rng, out, len);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct sender s = {.sock = sv[0], .fd = temp_file(), .buf = out, .len = len};
    cr_assert_eq(pthread_create(&th, NULL, send_big, &s), 0);
    while (off < len) {
        long r = proto_recv_with_fd(sv[1], in + off, len - off, &got);
        cr_assert_gt(r, 0, "recv: %ld", r);
        if (got >= 0) {
            cr_assert_eq(off, 0, "the fd arrives with the first byte");
            fds++;
            close(got);
        }
        off += (size_t)r;
    }
    pthread_join(th, NULL);
    cr_assert_eq(s.rc, 0);
    cr_assert_eq(fds, 1);
    cr_assert_eq(memcmp(in, out, len), 0);
    close(s.fd);
    close(sv[0]);
    close(sv[1]);
    free(in);
    free(out);
}

/* ---- input buffers --------------------------------------------------------------- */

Test(proto_in, room_grows_to_one_frame_then_refuses_and_shrinks_when_empty)
{
    const size_t max = (size_t)PROTO_HDR_SIZE + PROTO_MAX_BODY, initial = 4096;
    size_t cap = initial, len = 0;
    uint8_t *buf = malloc(cap);
    cr_assert_eq(proto_in_room(&buf, len, &cap, initial), 0);
    cr_assert_eq(cap, initial, "room left: no growth");
    for (size_t i = 0; i < initial; i++)
        buf[i] = (uint8_t)(i * 7);
    len = initial;
    cr_assert_eq(proto_in_room(&buf, len, &cap, initial), 0);
    cr_assert_eq(cap, 2 * initial, "a full buffer doubles");
    for (size_t i = 0; i < initial; i++)
        cr_assert_eq(buf[i], (uint8_t)(i * 7), "byte %zu kept", i);
    while (cap < max) {
        len = cap;
        cr_assert_eq(proto_in_room(&buf, len, &cap, initial), 0);
        cr_assert_leq(cap, max);
    }
    len = cap;
    cr_assert_eq(proto_in_room(&buf, len, &cap, initial), -ENOBUFS,
                 "full at one largest frame: nothing more can be a frame");
    len = 0;
    cr_assert_eq(proto_in_room(&buf, len, &cap, initial), 0);
    cr_assert_eq(cap, initial, "an empty buffer that grew shrinks back");
    free(buf);
}

Test(proto_in, reserve_drops_parsed_bytes_compacts_then_doubles)
{
    const size_t chunk = 1024;
    uint8_t *buf = NULL;
    size_t off = 0, len = 0, cap = 0;
    cr_assert_eq(proto_in_reserve(&buf, &off, &len, &cap, chunk), 0);
    cr_assert_geq(cap - len, chunk);
    size_t first = cap;
    for (size_t i = 0; i < cap; i++)
        buf[i] = (uint8_t)i;
    len = cap;
    off = cap - 100; /* 100 unparsed bytes at the end */
    cr_assert_eq(proto_in_reserve(&buf, &off, &len, &cap, chunk), 0);
    cr_assert_eq(off, 0);
    cr_assert_eq(len, 100);
    cr_assert_eq(cap, first, "compacting made room: no growth");
    for (size_t i = 0; i < 100; i++)
        cr_assert_eq(buf[i], (uint8_t)(first - 100 + i), "unparsed byte %zu moved intact", i);
    len = cap; /* full and nothing parsed */
    cr_assert_eq(proto_in_reserve(&buf, &off, &len, &cap, chunk), 0);
    cr_assert_geq(cap - len, chunk);
    for (size_t i = 0; i < 100; i++)
        cr_assert_eq(buf[i], (uint8_t)(first - 100 + i));
    off = len; /* everything parsed */
    cr_assert_eq(proto_in_reserve(&buf, &off, &len, &cap, chunk), 0);
    cr_assert_eq(off, 0);
    cr_assert_eq(len, 0);
    free(buf);
}

/* The master's records: each accessor names the field it refuses. */
static void expect_refused(void (*bld)(struct proto_buf *), size_t at, uint8_t v,
                           int (*get)(const struct proto_frame *), const char *field)
{
    struct proto_buf b = {0};
    struct proto_frame f;
    bld(&b);
    b.data[PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE + at] = v;
    cr_assert_gt(proto_frame_parse(b.data, b.len, b.data[4] & 1 ? true : false, &f, err,
                                   sizeof(err)), 0);
    err[0] = 0;
    cr_assert_lt(get(&f), 0, "%s", field);
    assert_err_names(field);
    proto_buf_free(&b);
}

static int get_register(const struct proto_frame *f)
{
    struct proto_register r;
    return proto_get_register(f, &r, err, sizeof(err));
}

static int get_events(const struct proto_frame *f)
{
    struct proto_node_event e;
    for (uint32_t i = 0; i < f->n; i++)
        if (proto_get_node_event(f, i, &e, err, sizeof(err)) < 0)
            return -EINVAL;
    return 0;
}

static int get_ack(const struct proto_frame *f)
{
    struct proto_ack a;
    return proto_get_ack(f, &a, err, sizeof(err));
}

static int get_locations(const struct proto_frame *f)
{
    struct proto_location l;
    for (uint32_t i = 0; i < f->n; i++)
        if (proto_get_location(f, i, &l, err, sizeof(err)) < 0)
            return -EINVAL;
    return 0;
}

Test(proto_malformed, master_records_name_the_field)
{
    /* types: REGISTER 28, HEARTBEAT 30, RESYNC 32 are requests (even),
     * the replies odd: b.data[4] & 1 picks the parser's side */
    expect_refused(build_register, PROTO_NAME_MAX + 4 + 1, 0x08, get_register,
                   "REGISTER.addr_len");
    expect_refused(build_register, PROTO_NAME_MAX + 8 + 32 + 10, 'x', get_register,
                   "REGISTER.addr");
    expect_refused(build_register, 0, 0, get_register, "REGISTER.host");
    expect_refused(build_register, PROTO_NAME_MAX, 0, get_register, "REGISTER.pid");
    expect_refused(build_heartbeat, 8, PROTO_NODE_STORED, get_events, "HEARTBEAT.kind");
    expect_refused(build_heartbeat, PROTO_NODE_EVENT_SIZE + 12, 1, get_events, "HEARTBEAT.pad");
    expect_refused(build_heartbeat, PROTO_NODE_EVENT_SIZE + 8, 9, get_events, "HEARTBEAT.kind");
    expect_refused(build_resync, PROTO_NODE_EVENT_SIZE, 1, get_events, "RESYNC.kind");
    expect_refused(build_register_r, 8, 7, get_ack, "REGISTER_R.action");
    expect_refused(build_locate_r, 16 + 12, 5, get_locations, "LOCATE_R.refs");
    expect_refused(build_locate_r, 4, 1, get_locations, "LOCATE_R.pad");
}
