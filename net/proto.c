/*
 * proto.c - the codec of the wire protocol declared in proto.h: the frame
 * parser, the record accessors and the frame builder.  Bytes in, bytes out:
 * no sockets here (fdpass.c passes the pool's fd over a Unix socket,
 * inbuf.c keeps a stream's input and drains its output).
 *
 * One table, generated from PROTO_TYPES, says for every type its record
 * size, its record limit, its direction, which record kind its records are
 * (so an accessor or a put of the wrong kind is refused), what its arg may
 * hold and whether it is unsolicited (seq 0).  The parser checks a frame
 * against that table only; the accessors check the record contents.  The
 * encoder refuses whatever the decoder would refuse, so a frame built here
 * always parses, and decoding then re-encoding a valid frame gives back the
 * same bytes (the fuzzers check both).
 *
 * Bytes are read and written through the get_/put_ helpers below only:
 * memcpy of little-endian integers, swapped on a big-endian host; no
 * pointer into a frame is ever cast to a wider type, so alignment of the
 * caller's buffer does not matter.
 *
 * Threads: no state but the caller's; any thread.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "umbp/tier.h"
#include "proto.h"
#include "proto_rec.h"
#include "seterr.h"

/* The little-endian helpers, cursors and record kinds: proto_rec.h. */

/* ---- the type table ------------------------------------------------------- */

/* What the body header's arg may hold. */
enum arg_rule {
    ARG_ZERO,   /* unused: 0 */
    ARG_LOOKUP, /* PROTO_LOOKUP_* bits */
    ARG_TTL,    /* a lease ttl in ms, > 0 */
    ARG_WRITE,  /* a write deadline in ms, <= PROTO_WRITE_DEADLINE_MAX_MS */
    ARG_ANY,    /* a status or a count: any value */
    ARG_RESYNC, /* PROTO_RESYNC_* bits */
    ARG_WAIT,   /* a bound in ms, 1 .. PROTO_WAIT_MAX_MS */
    ARG_HOLD,   /* a hold in ms, <= PROTO_HOLD_MAX_MS */
};

/* Per type: record kind, arg rule, unsolicited (seq 0).  A type added to
 * PROTO_TYPES without a line here does not compile. */
#define SPEC_HELLO REC_HELLO, ARG_WRITE, false
#define SPEC_HELLO_OK REC_WELCOME, ARG_ZERO, false
#define SPEC_HELLO_ERR REC_ERROR, ARG_ANY, false
#define SPEC_LOOKUP REC_KEY, ARG_LOOKUP, false
#define SPEC_LOOKUP_R REC_U8, ARG_ZERO, false
#define SPEC_RESERVE REC_RESERVE, ARG_HOLD, false
#define SPEC_RESERVE_R REC_REGION, ARG_ZERO, false
#define SPEC_PUBLISH REC_TOKEN, ARG_ZERO, false
#define SPEC_PUBLISH_R REC_STATUS, ARG_ZERO, false
#define SPEC_ABORT REC_TOKEN, ARG_ZERO, false
#define SPEC_ACQUIRE REC_KEY, ARG_TTL, false
#define SPEC_ACQUIRE_R REC_REGION, ARG_ZERO, false
#define SPEC_RELEASE REC_TOKEN, ARG_ZERO, false
#define SPEC_RELEASE_R REC_STATUS, ARG_ZERO, false
#define SPEC_CLEAR REC_NONE, ARG_ZERO, false
#define SPEC_CLEAR_R REC_NONE, ARG_ANY, false
#define SPEC_STATS REC_NONE, ARG_ZERO, false
#define SPEC_STATS_R REC_STATS, ARG_ZERO, false
#define SPEC_PING REC_NONE, ARG_ZERO, false
#define SPEC_PONG REC_NONE, ARG_ZERO, false
#define SPEC_EVENTS REC_EVENT, ARG_ANY, true
#define SPEC_ERROR REC_ERROR, ARG_ZERO, true
#define SPEC_SESSIONS REC_NONE, ARG_ZERO, false
#define SPEC_SESSIONS_R REC_SESSION, ARG_ZERO, false
#define SPEC_AUTH_CHALLENGE REC_KEY, ARG_ZERO, true
#define SPEC_AUTH REC_AUTH, ARG_ZERO, false
#define SPEC_AUTH_OK REC_KEY, ARG_ZERO, false
#define SPEC_REGISTER REC_REGISTER, ARG_ZERO, false
#define SPEC_REGISTER_R REC_ACK, ARG_ZERO, false
#define SPEC_HEARTBEAT REC_NODE_EVENT, ARG_ZERO, false
#define SPEC_HEARTBEAT_R REC_ACK, ARG_ZERO, false
#define SPEC_RESYNC REC_NODE_EVENT, ARG_RESYNC, false
#define SPEC_RESYNC_R REC_ACK, ARG_ZERO, false
#define SPEC_LOCATE REC_KEY, ARG_ZERO, false
#define SPEC_LOCATE_R REC_LOCATION, ARG_ANY, false
#define SPEC_NODES REC_NONE, ARG_ANY, false
#define SPEC_NODES_R REC_NODE_INFO, ARG_ANY, false
#define SPEC_SUSPECT REC_STATUS, ARG_ZERO, false /* a u32 node ref per record */
#define SPEC_WAITING REC_NONE, ARG_WAIT, false
#define SPEC_PUBLISH_AS REC_RENAME, ARG_ZERO, false

#define DIR_C false
#define DIR_S true

struct type_info {
    const char *name;             /* NULL: no such type */
    uint32_t rec_size, max_records;
    bool from_server;
    enum rec_kind kind;
    enum arg_rule arg;
    bool unsolicited;
};

/* Expands SPEC_<name> before taking its three parts apart. */
#define TYPE_INFO(...) TYPE_INFO_(__VA_ARGS__)
#define TYPE_INFO_(nm, rec, max, srv, k, a, u)                                   \
    {.name = nm, .rec_size = rec, .max_records = max, .from_server = srv,        \
     .kind = k, .arg = a, .unsolicited = u}

static const struct type_info types[] = {
#define X(name, val, rec, max, dir)                                               \
    [val] = TYPE_INFO(#name, rec, max, DIR_##dir, SPEC_##name),
    PROTO_TYPES(X)
#undef X
};

/* Every type's record size is its kind's, and its largest body fits. */
#define CHECK_TYPE(...) CHECK_TYPE_(__VA_ARGS__)
#define CHECK_TYPE_(name, rec, max, k, a, u)                                     \
    _Static_assert((rec) == KIND_SIZE(k), name ": record size is not its kind's"); \
    _Static_assert(PROTO_BODY_HDR_SIZE + (uint64_t)(max) * (rec) <= PROTO_MAX_BODY, \
                   name ": max_records records exceed PROTO_MAX_BODY");
#define X(name, val, rec, max, dir) CHECK_TYPE(#name, rec, max, SPEC_##name)
PROTO_TYPES(X)
#undef X

_Static_assert(PROTO_HDR_SIZE == 4 + 2 + 2 + 8, "frame header layout");
_Static_assert(PROTO_BODY_HDR_SIZE == 4 + 4, "body header layout");
_Static_assert(PROTO_MAX_BODY <= INT32_MAX, "a frame's size fits a long everywhere");

static const struct type_info *type_info(uint16_t type)
{
    if (type >= sizeof(types) / sizeof(types[0]) || !types[type].name)
        return NULL;
    return &types[type];
}

const char *proto_type_name(uint16_t type)
{
    const struct type_info *t = type_info(type);

    return t ? t->name : "?";
}

/* ---- parsing frames --------------------------------------------------------- */

static int check_arg(const struct type_info *t, uint32_t arg, char *err, size_t errlen)
{
    switch (t->arg) {
    case ARG_ZERO:
        if (arg == 0)
            return 0;
        net_seterr(err, errlen, "%s.arg: must be 0, got %u", t->name, arg);
        return -EPROTO;
    case ARG_LOOKUP:
        if (!(arg & ~PROTO_LOOKUP_TOUCH))
            return 0;
        net_seterr(err, errlen,
               "%s.arg: unknown flag bits 0x%x (known: PROTO_LOOKUP_TOUCH = 0x%x)", t->name,
               arg & ~PROTO_LOOKUP_TOUCH, PROTO_LOOKUP_TOUCH);
        return -EPROTO;
    case ARG_TTL:
        if (arg > 0)
            return 0;
        net_seterr(err, errlen, "%s.arg: lease ttl must be > 0 ms, got 0", t->name);
        return -EPROTO;
    case ARG_WRITE:
        if (arg <= PROTO_WRITE_DEADLINE_MAX_MS)
            return 0;
        net_seterr(err, errlen, "%s.arg: write deadline %u ms exceeds %u", t->name, arg,
               PROTO_WRITE_DEADLINE_MAX_MS);
        return -EPROTO;
    case ARG_ANY:
        return 0;
    case ARG_WAIT:
        if (arg >= 1 && arg <= PROTO_WAIT_MAX_MS)
            return 0;
        net_seterr(err, errlen, "%s.arg: a wait of %u ms is not in 1 .. %u", t->name, arg,
               PROTO_WAIT_MAX_MS);
        return -EPROTO;
    case ARG_HOLD:
        if (arg <= PROTO_HOLD_MAX_MS)
            return 0;
        net_seterr(err, errlen, "%s.arg: a hold of %u ms exceeds %u", t->name, arg,
               PROTO_HOLD_MAX_MS);
        return -EPROTO;
    case ARG_RESYNC:
        if (!(arg & ~(PROTO_RESYNC_FIRST | PROTO_RESYNC_LAST)))
            return 0;
        net_seterr(err, errlen, "%s.arg: unknown flag bits 0x%x (known: PROTO_RESYNC_FIRST = "
               "0x%x, PROTO_RESYNC_LAST = 0x%x)", t->name,
               arg & ~(PROTO_RESYNC_FIRST | PROTO_RESYNC_LAST), PROTO_RESYNC_FIRST,
               PROTO_RESYNC_LAST);
        return -EPROTO;
    }
    return -EPROTO;
}

/* The 16-byte header alone: refused before the body arrives. */
static int check_header(const uint8_t *h, bool from_server, const struct type_info **out,
                        char *err, size_t errlen)
{
    uint32_t len = get_u32(h);
    uint16_t type = get_u16(h + 4), flags = get_u16(h + 6);
    uint64_t seq = get_u64(h + 8);
    const struct type_info *t = type_info(type);

    if (flags) {
        net_seterr(err, errlen, "frame.flags: must be 0, got %u", flags);
        return -EPROTO;
    }
    if (len > PROTO_MAX_BODY) {
        net_seterr(err, errlen, "frame.len: %u bytes exceed PROTO_MAX_BODY (%u)", len,
               PROTO_MAX_BODY);
        return -EMSGSIZE;
    }
    if (!t) {
        net_seterr(err, errlen, "frame.type: unknown type %u", type);
        return -EPROTO;
    }
    if (t->from_server != from_server) {
        net_seterr(err, errlen, "frame.type: %s is a %s frame; the %s may not send it", t->name,
               t->from_server ? "server" : "client", from_server ? "server" : "client");
        return -EPROTO;
    }
    if (len < PROTO_BODY_HDR_SIZE) {
        net_seterr(err, errlen, "%s.len: %u bytes, shorter than the %d-byte body header",
               t->name, len, PROTO_BODY_HDR_SIZE);
        return -EPROTO;
    }
    if (t->unsolicited && seq) {
        net_seterr(err, errlen, "%s.seq: an unsolicited frame carries seq 0, got %llu", t->name,
               (unsigned long long)seq);
        return -EPROTO;
    }
    *out = t;
    return 0;
}

/* The body header against the header's len: refused before the records
 * arrive. */
static int check_body(const struct type_info *t, uint32_t len, uint32_t n, uint32_t arg,
                      char *err, size_t errlen)
{
    if (t->max_records == 1 && n != 1) {
        net_seterr(err, errlen, "%s.n: must be 1, got %u", t->name, n);
        return -EPROTO;
    }
    if (n > t->max_records) {
        net_seterr(err, errlen, "%s.n: %u records exceed %u", t->name, n, t->max_records);
        return -EPROTO;
    }
    if (check_arg(t, arg, err, errlen))
        return -EPROTO;
    if ((uint64_t)PROTO_BODY_HDR_SIZE + (uint64_t)n * t->rec_size != len) {
        net_seterr(err, errlen, "%s.len: %d + %u*%u != %u", t->name, PROTO_BODY_HDR_SIZE, n,
               t->rec_size, len);
        return -EPROTO;
    }
    return 0;
}

long proto_frame_parse(const uint8_t *buf, size_t avail, bool from_server,
                       struct proto_frame *f, char *err, size_t errlen)
{
    const struct type_info *t;
    uint32_t len, n, arg;
    int rc;

    if (avail < PROTO_HDR_SIZE)
        return 0;
    rc = check_header(buf, from_server, &t, err, errlen);
    if (rc)
        return rc;
    if (avail < PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE)
        return 0;
    len = get_u32(buf);
    n = get_u32(buf + PROTO_HDR_SIZE);
    arg = get_u32(buf + PROTO_HDR_SIZE + 4);
    rc = check_body(t, len, n, arg, err, errlen);
    if (rc)
        return rc;
    if (avail - PROTO_HDR_SIZE < len)
        return 0;
    f->type = get_u16(buf + 4);
    f->seq = get_u64(buf + 8);
    f->n = n;
    f->arg = arg;
    f->records = buf + PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE;
    f->record_size = t->rec_size;
    return (long)PROTO_HDR_SIZE + len;
}

/* ---- record checks, shared by the accessors and the puts --------------------- */

/* NULL if the field holds a NUL-terminated string padded with NULs to its
 * end, else what is wrong. */
const char *proto_string_problem(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);

    if (n == cap)
        return "not NUL-terminated within the field";
    for (size_t i = n + 1; i < cap; i++)
        if (s[i])
            return "nonzero bytes after the terminating NUL";
    return NULL;
}

static int check_string(const char *what, const char *s, size_t cap, char *err,
                        size_t errlen)
{
    const char *why = proto_string_problem(s, cap);

    if (!why)
        return 0;
    net_seterr(err, errlen, "%s: %s (%zu bytes)", what, why, cap);
    return -EINVAL;
}

/* A string the encoder may write: it stops at the NUL, so only
 * termination matters. */
static bool string_terminated(const char *s, size_t cap) { return strnlen(s, cap) < cap; }

static bool role_known(uint32_t role) { return role <= PROTO_ROLE_NODE; }

/* What both the decoder and the encoder refuse in a HELLO. */
static int check_hello_values(const struct proto_hello *h, char *err, size_t errlen)
{
    if (h->magic != PROTO_MAGIC) {
        net_seterr(err, errlen, "HELLO.magic: 0x%08x, not PROTO_MAGIC 0x%08x", h->magic,
               PROTO_MAGIC);
        return -EINVAL;
    }
    if (!role_known(h->role)) {
        net_seterr(err, errlen, "HELLO.role: unknown role %u", h->role);
        return -EINVAL;
    }
    if ((h->role == PROTO_ROLE_WORKER) != (h->write_deadline_ms != 0) ||
        h->write_deadline_ms > PROTO_WRITE_DEADLINE_MAX_MS) {
        net_seterr(err, errlen, "HELLO.arg: write deadline %u ms; a worker declares one in "
               "1..%u ms (how long after a reservation it may still write into the pool), "
               "other roles 0", h->write_deadline_ms, PROTO_WRITE_DEADLINE_MAX_MS);
        return -EINVAL;
    }
    if (h->flags & ~PROTO_HELLO_EVENTS) {
        net_seterr(err, errlen,
               "HELLO.flags: unknown bits 0x%x (known: PROTO_HELLO_EVENTS = 0x%x)",
               h->flags & ~PROTO_HELLO_EVENTS, PROTO_HELLO_EVENTS);
        return -EINVAL;
    }
    return 0;
}

static int check_hello(const struct proto_hello *h, char *err, size_t errlen)
{
    if (check_hello_values(h, err, errlen))
        return -EINVAL;
    if (h->pad) {
        net_seterr(err, errlen, "HELLO.pad: must be 0, got %u", h->pad);
        return -EINVAL;
    }
    if (check_string("HELLO.engine_id", h->engine_id, PROTO_NAME_MAX, err, errlen))
        return -EINVAL;
    return check_string("HELLO.name_space", h->name_space, PROTO_NAME_MAX, err, errlen);
}

static bool event_type_known(uint32_t type)
{
    return type == UMBP_EVENT_STORED || type == UMBP_EVENT_REMOVED;
}

/* ---- record layouts ------------------------------------------------------- */

static void dec_hello(const uint8_t *p, struct proto_hello *h)
{
    struct rd r = {p};

    h->magic = rd_u32(&r);
    h->version = rd_u16(&r);
    h->role = rd_u8(&r);
    h->pad = rd_u8(&r);
    h->flags = rd_u32(&r);
    h->pid = rd_u32(&r);
    h->dp_rank = rd_u32(&r);
    h->tp_rank = rd_u32(&r);
    rd_bytes(&r, h->engine_id, PROTO_NAME_MAX);
    rd_bytes(&r, h->name_space, PROTO_NAME_MAX);
}

static void enc_hello(uint8_t *p, const struct proto_hello *h)
{
    struct wr w = {p};

    wr_u32(&w, h->magic);
    wr_u16(&w, h->version);
    wr_u8(&w, h->role);
    wr_u8(&w, 0);
    wr_u32(&w, h->flags);
    wr_u32(&w, h->pid);
    wr_u32(&w, h->dp_rank);
    wr_u32(&w, h->tp_rank);
    wr_string(&w, h->engine_id, PROTO_NAME_MAX);
    wr_string(&w, h->name_space, PROTO_NAME_MAX);
}

static void dec_welcome(const uint8_t *p, struct proto_welcome *o)
{
    struct rd r = {p};

    o->version = rd_u16(&r);
    o->pad = rd_u16(&r);
    o->lease_ttl_ms = rd_u32(&r);
    o->session_id = rd_u64(&r);
    o->pool_id = rd_u64(&r);
    o->pool_size = rd_u64(&r);
    o->capacity_bytes = rd_u64(&r);
}

static void enc_welcome(uint8_t *p, const struct proto_welcome *o)
{
    struct wr w = {p};

    wr_u16(&w, o->version);
    wr_u16(&w, 0);
    wr_u32(&w, o->lease_ttl_ms);
    wr_u64(&w, o->session_id);
    wr_u64(&w, o->pool_id);
    wr_u64(&w, o->pool_size);
    wr_u64(&w, o->capacity_bytes);
}

/* RESERVE and token items share one layout: a key and a u64. */
static void dec_key_u64(const uint8_t *p, umbp_key_t *key, uint64_t *v)
{
    memcpy(key->bytes, p, UMBP_KEY_SIZE);
    *v = get_u64(p + UMBP_KEY_SIZE);
}

static void enc_key_u64(uint8_t *p, const umbp_key_t *key, uint64_t v)
{
    memcpy(p, key->bytes, UMBP_KEY_SIZE);
    put_u64(p + UMBP_KEY_SIZE, v);
}

static void dec_region(const uint8_t *p, struct proto_region_item *o)
{
    struct rd r = {p};

    o->status = (int32_t)rd_u32(&r);
    o->pad = rd_u32(&r);
    o->offset = rd_u64(&r);
    o->size = rd_u64(&r);
    o->token = rd_u64(&r);
}

static void enc_region(uint8_t *p, const struct proto_region_item *o)
{
    struct wr w = {p};

    wr_u32(&w, (uint32_t)o->status);
    wr_u32(&w, 0);
    wr_u64(&w, o->offset);
    wr_u64(&w, o->size);
    wr_u64(&w, o->token);
}

static void dec_error(const uint8_t *p, struct proto_error *o)
{
    o->status = (int32_t)get_u32(p);
    memcpy(o->message, p + 4, PROTO_ERRMSG_MAX);
}

static void enc_error(uint8_t *p, const struct proto_error *o)
{
    struct wr w = {p};

    wr_u32(&w, (uint32_t)o->status);
    wr_string(&w, o->message, PROTO_ERRMSG_MAX);
}

/* The STATS_R fields in wire order. */
#define STAT(f) offsetof(struct proto_stats, f)
static const size_t stats_fields[] = {
    STAT(capacity_bytes), STAT(used_bytes),    STAT(num_objects),     STAT(num_pending),
    STAT(num_leased),     STAT(evictions),     STAT(evicted_bytes),   STAT(leases_expired),
    STAT(sessions),       STAT(lookups),       STAT(lookup_keys),     STAT(lookup_hits),
    STAT(reserves),       STAT(publishes),     STAT(acquires),        STAT(acquire_hits),
    STAT(protocol_errors), STAT(refused_connections), STAT(held_regions),
    STAT(reservations_expired),
};
#undef STAT
_Static_assert(sizeof(stats_fields) / sizeof(stats_fields[0]) == PROTO_STATS_FIELDS,
               "every STATS_R field is on the wire");

static void dec_stats(const uint8_t *p, struct proto_stats *o)
{
    for (size_t i = 0; i < PROTO_STATS_FIELDS; i++) {
        uint64_t v = get_u64(p + 8 * i);
        memcpy((char *)o + stats_fields[i], &v, sizeof(v));
    }
}

static void enc_stats(uint8_t *p, const struct proto_stats *o)
{
    for (size_t i = 0; i < PROTO_STATS_FIELDS; i++) {
        uint64_t v;
        memcpy(&v, (const char *)o + stats_fields[i], sizeof(v));
        put_u64(p + 8 * i, v);
    }
}

static void dec_session(const uint8_t *p, struct proto_session_item *o)
{
    struct rd r = {p};

    o->session_id = rd_u64(&r);
    o->pid = rd_u32(&r);
    o->uid = rd_u32(&r);
    o->role = rd_u32(&r);
    o->dp_rank = rd_u32(&r);
    o->tp_rank = rd_u32(&r);
    o->pad = rd_u32(&r);
    o->leases = rd_u64(&r);
    o->reservations = rd_u64(&r);
    o->requests = rd_u64(&r);
    rd_bytes(&r, o->engine_id, PROTO_NAME_MAX);
    rd_bytes(&r, o->name_space, PROTO_NAME_MAX);
}

static void enc_session(uint8_t *p, const struct proto_session_item *o)
{
    struct wr w = {p};

    wr_u64(&w, o->session_id);
    wr_u32(&w, o->pid);
    wr_u32(&w, o->uid);
    wr_u32(&w, o->role);
    wr_u32(&w, o->dp_rank);
    wr_u32(&w, o->tp_rank);
    wr_u32(&w, 0);
    wr_u64(&w, o->leases);
    wr_u64(&w, o->reservations);
    wr_u64(&w, o->requests);
    wr_string(&w, o->engine_id, PROTO_NAME_MAX);
    wr_string(&w, o->name_space, PROTO_NAME_MAX);
}

/* ---- record accessors ----------------------------------------------------------- */

/* Record i of a frame whose records are of `kind`; -EINVAL otherwise (also
 * for a frame the caller filled in by hand with the wrong record size). */
int proto_record_at(const struct proto_frame *f, uint32_t i, enum rec_kind kind,
                    const uint8_t **out)
{
    const struct type_info *t = f ? type_info(f->type) : NULL;

    if (!t || t->kind != kind || f->record_size != t->rec_size || i >= f->n || !f->records)
        return -EINVAL;
    *out = f->records + (size_t)i * t->rec_size;
    return 0;
}

int proto_record_err(const struct proto_frame *f, uint32_t i, enum rec_kind kind,
                     const uint8_t **out, const char *what, char *err, size_t errlen)
{
    if (proto_record_at(f, i, kind, out) == 0)
        return 0;
    net_seterr(err, errlen, "%s: not a %s frame with that record (%s, n = %u)", what, what,
           f ? proto_type_name(f->type) : "no frame", f ? f->n : 0);
    return -EINVAL;
}

int proto_get_key(const struct proto_frame *f, uint32_t i, umbp_key_t *out)
{
    const uint8_t *p;

    if (proto_record_at(f, i, REC_KEY, &p))
        return -EINVAL;
    memcpy(out->bytes, p, UMBP_KEY_SIZE);
    return 0;
}

int proto_get_u8(const struct proto_frame *f, uint32_t i, uint8_t *out)
{
    const uint8_t *p;

    /* LOOKUP_R's only u8 is a present flag: 0 or 1. */
    if (proto_record_at(f, i, REC_U8, &p) || *p > 1)
        return -EINVAL;
    *out = *p;
    return 0;
}

int proto_get_status(const struct proto_frame *f, uint32_t i, int32_t *out)
{
    const uint8_t *p;

    if (proto_record_at(f, i, REC_STATUS, &p))
        return -EINVAL;
    *out = (int32_t)get_u32(p);
    return 0;
}

int proto_get_hello(const struct proto_frame *f, struct proto_hello *out, char *err,
                    size_t errlen)
{
    struct proto_hello h;
    const uint8_t *p;

    if (proto_record_err(f, 0, REC_HELLO, &p, "HELLO", err, errlen))
        return -EINVAL;
    dec_hello(p, &h);
    h.write_deadline_ms = f->arg; /* carried in the body header */
    if (check_hello(&h, err, errlen))
        return -EINVAL;
    *out = h;
    return 0;
}

int proto_get_welcome(const struct proto_frame *f, struct proto_welcome *out, char *err,
                      size_t errlen)
{
    struct proto_welcome w;
    const uint8_t *p;

    if (proto_record_err(f, 0, REC_WELCOME, &p, "HELLO_OK", err, errlen))
        return -EINVAL;
    dec_welcome(p, &w);
    if (w.pad) {
        net_seterr(err, errlen, "HELLO_OK.pad: must be 0, got %u", w.pad);
        return -EINVAL;
    }
    *out = w;
    return 0;
}

int proto_get_reserve_item(const struct proto_frame *f, uint32_t i,
                           struct proto_reserve_item *out)
{
    const uint8_t *p;

    if (proto_record_at(f, i, REC_RESERVE, &p))
        return -EINVAL;
    dec_key_u64(p, &out->key, &out->size);
    return 0;
}

int proto_get_token_item(const struct proto_frame *f, uint32_t i,
                         struct proto_token_item *out)
{
    const uint8_t *p;

    if (proto_record_at(f, i, REC_TOKEN, &p))
        return -EINVAL;
    dec_key_u64(p, &out->key, &out->token);
    return 0;
}

int proto_get_rename_item(const struct proto_frame *f, uint32_t i,
                          struct proto_rename_item *out)
{
    const uint8_t *p;

    if (proto_record_at(f, i, REC_RENAME, &p))
        return -EINVAL;
    dec_key_u64(p, &out->from, &out->token);
    memcpy(out->key.bytes, p + PROTO_TOKEN_ITEM_SIZE, UMBP_KEY_SIZE);
    return 0;
}

int proto_get_region_item(const struct proto_frame *f, uint32_t i,
                          struct proto_region_item *out)
{
    struct proto_region_item it;
    const uint8_t *p;

    if (proto_record_at(f, i, REC_REGION, &p))
        return -EINVAL;
    dec_region(p, &it);
    if (it.pad)
        return -EINVAL;
    *out = it;
    return 0;
}

int proto_get_event_item(const struct proto_frame *f, uint32_t i,
                         struct proto_event_item *out)
{
    const uint8_t *p;
    uint32_t type;

    if (proto_record_at(f, i, REC_EVENT, &p))
        return -EINVAL;
    type = get_u32(p);
    if (!event_type_known(type))
        return -EINVAL;
    out->type = type;
    memcpy(out->key.bytes, p + 4, UMBP_KEY_SIZE);
    return 0;
}

int proto_get_error(const struct proto_frame *f, struct proto_error *out)
{
    struct proto_error e;
    const uint8_t *p;

    if (proto_record_at(f, 0, REC_ERROR, &p))
        return -EINVAL;
    dec_error(p, &e);
    if (proto_string_problem(e.message, PROTO_ERRMSG_MAX))
        return -EINVAL;
    /* HELLO_ERR carries its status twice (arg and record): they agree. */
    if (f->type == PROTO_HELLO_ERR && (uint32_t)e.status != f->arg)
        return -EINVAL;
    *out = e;
    return 0;
}

int proto_get_stats(const struct proto_frame *f, struct proto_stats *out)
{
    const uint8_t *p;

    if (proto_record_at(f, 0, REC_STATS, &p))
        return -EINVAL;
    dec_stats(p, out);
    return 0;
}

int proto_get_session_item(const struct proto_frame *f, uint32_t i,
                           struct proto_session_item *out)
{
    struct proto_session_item s;
    const uint8_t *p;

    if (proto_record_at(f, i, REC_SESSION, &p))
        return -EINVAL;
    dec_session(p, &s);
    if (s.pad || !role_known(s.role) || proto_string_problem(s.engine_id, PROTO_NAME_MAX) ||
        proto_string_problem(s.name_space, PROTO_NAME_MAX))
        return -EINVAL;
    *out = s;
    return 0;
}

/* ---- the client's check of a region ------------------------------------------ */

static int check_region_ok(const struct proto_region_item *it, uint64_t want_size,
                           uint64_t pool_size, const char *type, char *err, size_t errlen)
{
    if (want_size && it->size != want_size) {
        net_seterr(err, errlen, "%s.size: %llu bytes, the request asked for %llu", type,
               (unsigned long long)it->size, (unsigned long long)want_size);
        return -EPROTO;
    }
    if (it->size == 0) {
        net_seterr(err, errlen, "%s.size: 0 for a granted region", type);
        return -EPROTO;
    }
    /* Written so that offset + size cannot overflow. */
    if (it->offset > pool_size || it->size > pool_size - it->offset) {
        net_seterr(err, errlen, "%s.offset: [%llu, +%llu) is not inside the pool of %llu bytes",
               type, (unsigned long long)it->offset, (unsigned long long)it->size,
               (unsigned long long)pool_size);
        return -EPROTO;
    }
    return 0;
}

static int check_region_failed(const struct proto_region_item *it, bool is_reserve,
                               const char *type, char *err, size_t errlen)
{
    if (it->status > 0 && !(is_reserve && it->status == UMBP_TIER_EXISTS)) {
        net_seterr(err, errlen, "%s.status: %d is neither 0, %sa negative code", type,
               it->status, is_reserve ? "UMBP_TIER_EXISTS (1) nor " : "nor ");
        return -EPROTO;
    }
    if (it->offset || it->size || it->token) {
        net_seterr(err, errlen, "%s.offset: status %d with offset %llu, size %llu, token %llu; "
               "all must be 0", type, it->status, (unsigned long long)it->offset,
               (unsigned long long)it->size, (unsigned long long)it->token);
        return -EPROTO;
    }
    return 0;
}

int proto_region_check(const struct proto_region_item *it, uint64_t want_size,
                       uint64_t pool_size, bool is_reserve, char *err, size_t errlen)
{
    const char *type = is_reserve ? "RESERVE_R" : "ACQUIRE_R";

    if (it->status == 0)
        return check_region_ok(it, want_size, pool_size, type, err, errlen);
    return check_region_failed(it, is_reserve, type, err, errlen);
}

/* ---- building frames ------------------------------------------------------------ */

void proto_buf_free(struct proto_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void proto_buf_consume(struct proto_buf *b, size_t bytes)
{
    size_t done = b->open ? b->frame : b->len;

    if (bytes > done)
        bytes = done;
    if (bytes == 0)
        return; /* also an empty buffer, whose data may be NULL */
    memmove(b->data, b->data + bytes, b->len - bytes);
    b->len -= bytes;
    if (b->open)
        b->frame -= bytes;
}

/* Room for `extra` more bytes; capacity doubles. */
int proto_buf_reserve(struct proto_buf *b, size_t extra)
{
    size_t need = b->len + extra, cap = b->cap ? b->cap : 4096;
    uint8_t *data;

    if (need < b->len)
        return -ENOMEM;
    if (need <= b->cap)
        return 0;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return -ENOMEM;
        cap *= 2;
    }
    data = realloc(b->data, cap);
    if (!data)
        return -ENOMEM;
    b->data = data;
    b->cap = cap;
    return 0;
}

static const struct type_info *open_type(const struct proto_buf *b)
{
    return type_info(get_u16(b->data + b->frame + 4));
}

static uint32_t open_n(const struct proto_buf *b)
{
    return get_u32(b->data + b->frame + PROTO_HDR_SIZE);
}

static bool begin_allowed(const struct type_info *t, uint64_t seq, uint32_t n, uint32_t arg)
{
    if (!t || n > t->max_records || (t->max_records == 1 && n != 1))
        return false;
    if (t->unsolicited && seq)
        return false;
    return check_arg(t, arg, NULL, 0) == 0;
}

int proto_buf_move(struct proto_buf *to, struct proto_buf *from)
{
    if (to->open || from->open)
        return -EINVAL;
    if (from->len == 0)
        return 0;
    if (to->len == 0) { /* nothing to keep: take the other's bytes whole */
        struct proto_buf t = *to;
        *to = *from;
        *from = t;
        return 0;
    }
    if (proto_buf_reserve(to, from->len))
        return -ENOMEM;
    memcpy(to->data + to->len, from->data, from->len);
    to->len += from->len;
    from->len = 0;
    return 0;
}

int proto_begin(struct proto_buf *b, uint16_t type, uint64_t seq, uint32_t n, uint32_t arg)
{
    uint8_t *h;

    if (b->open || !begin_allowed(type_info(type), seq, n, arg))
        return -EINVAL;
    if (proto_buf_reserve(b, PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE))
        return -ENOMEM;
    h = b->data + b->len;
    put_u32(h, 0); /* len: proto_end fills it in */
    put_u16(h + 4, type);
    put_u16(h + 6, 0);
    put_u64(h + 8, seq);
    put_u32(h + PROTO_HDR_SIZE, n);
    put_u32(h + PROTO_HDR_SIZE + 4, arg);
    b->frame = b->len;
    b->len += PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE;
    b->open = true;
    b->error = 0;
    return 0;
}

int proto_end(struct proto_buf *b)
{
    const struct type_info *t;
    uint64_t body;
    int rc = 0;

    if (!b->open)
        return -EINVAL;
    t = open_type(b);
    body = PROTO_BODY_HDR_SIZE + (uint64_t)open_n(b) * t->rec_size;
    if (b->error)
        rc = b->error;
    else if (b->len - b->frame != PROTO_HDR_SIZE + body)
        rc = -EPROTO;
    b->open = false;
    b->error = 0;
    if (rc) {
        b->len = b->frame;
        return rc;
    }
    put_u32(b->data + b->frame, (uint32_t)body);
    return 0;
}

/* A put's failure sticks to the open frame: proto_end reports it. */
int proto_put_fail(struct proto_buf *b, int rc)
{
    if (b->open && !b->error)
        b->error = rc;
    return b->open ? b->error : rc;
}

/* Appends one record of `kind` to the open frame; *out is where its bytes
 * go. */
int proto_record_slot(struct proto_buf *b, enum rec_kind kind, uint8_t **out)
{
    const struct type_info *t;
    uint64_t have;

    if (!b->open)
        return -EINVAL;
    if (b->error)
        return b->error;
    t = open_type(b);
    have = b->len - b->frame - PROTO_HDR_SIZE - PROTO_BODY_HDR_SIZE;
    if (t->kind != kind || have + t->rec_size > (uint64_t)open_n(b) * t->rec_size)
        return proto_put_fail(b, -EINVAL);
    if (proto_buf_reserve(b, t->rec_size))
        return proto_put_fail(b, -ENOMEM);
    *out = b->data + b->len;
    b->len += t->rec_size;
    return 0;
}

int proto_put_key(struct proto_buf *b, const umbp_key_t *k)
{
    uint8_t *p;
    int rc = proto_record_slot(b, REC_KEY, &p);

    if (rc)
        return rc;
    memcpy(p, k->bytes, UMBP_KEY_SIZE);
    return 0;
}

int proto_put_u8(struct proto_buf *b, uint8_t v)
{
    uint8_t *p;
    int rc;

    if (v > 1)
        return proto_put_fail(b, -EINVAL);
    rc = proto_record_slot(b, REC_U8, &p);
    if (rc)
        return rc;
    *p = v;
    return 0;
}

int proto_put_status(struct proto_buf *b, int32_t v)
{
    uint8_t *p;
    int rc = proto_record_slot(b, REC_STATUS, &p);

    if (rc)
        return rc;
    put_u32(p, (uint32_t)v);
    return 0;
}

int proto_put_hello(struct proto_buf *b, const struct proto_hello *h)
{
    uint8_t *p;
    int rc;

    if (check_hello_values(h, NULL, 0) || !string_terminated(h->engine_id, PROTO_NAME_MAX) ||
        !string_terminated(h->name_space, PROTO_NAME_MAX))
        return proto_put_fail(b, -EINVAL);
    rc = proto_record_slot(b, REC_HELLO, &p);
    if (rc)
        return rc;
    enc_hello(p, h);
    /* the write deadline travels in the body header's arg */
    put_u32(b->data + b->frame + PROTO_HDR_SIZE + 4, h->write_deadline_ms);
    return 0;
}

int proto_put_welcome(struct proto_buf *b, const struct proto_welcome *w)
{
    uint8_t *p;
    int rc = proto_record_slot(b, REC_WELCOME, &p);

    if (rc)
        return rc;
    enc_welcome(p, w);
    return 0;
}

int proto_put_reserve_item(struct proto_buf *b, const struct proto_reserve_item *it)
{
    uint8_t *p;
    int rc = proto_record_slot(b, REC_RESERVE, &p);

    if (rc)
        return rc;
    enc_key_u64(p, &it->key, it->size);
    return 0;
}

int proto_put_token_item(struct proto_buf *b, const struct proto_token_item *it)
{
    uint8_t *p;
    int rc = proto_record_slot(b, REC_TOKEN, &p);

    if (rc)
        return rc;
    enc_key_u64(p, &it->key, it->token);
    return 0;
}

int proto_put_rename_item(struct proto_buf *b, const struct proto_rename_item *it)
{
    uint8_t *p;
    int rc = proto_record_slot(b, REC_RENAME, &p);

    if (rc)
        return rc;
    enc_key_u64(p, &it->from, it->token);
    memcpy(p + PROTO_TOKEN_ITEM_SIZE, it->key.bytes, UMBP_KEY_SIZE);
    return 0;
}

int proto_put_region_item(struct proto_buf *b, const struct proto_region_item *it)
{
    uint8_t *p;
    int rc = proto_record_slot(b, REC_REGION, &p);

    if (rc)
        return rc;
    enc_region(p, it);
    return 0;
}

int proto_put_event_item(struct proto_buf *b, const struct proto_event_item *it)
{
    uint8_t *p;
    int rc;

    if (!event_type_known(it->type))
        return proto_put_fail(b, -EINVAL);
    rc = proto_record_slot(b, REC_EVENT, &p);
    if (rc)
        return rc;
    put_u32(p, it->type);
    memcpy(p + 4, it->key.bytes, UMBP_KEY_SIZE);
    return 0;
}

int proto_put_error(struct proto_buf *b, const struct proto_error *e)
{
    uint8_t *p;
    int rc;

    if (!string_terminated(e->message, PROTO_ERRMSG_MAX))
        return proto_put_fail(b, -EINVAL);
    rc = proto_record_slot(b, REC_ERROR, &p);
    if (rc)
        return rc;
    enc_error(p, e);
    return 0;
}

int proto_put_stats(struct proto_buf *b, const struct proto_stats *s)
{
    uint8_t *p;
    int rc = proto_record_slot(b, REC_STATS, &p);

    if (rc)
        return rc;
    enc_stats(p, s);
    return 0;
}

int proto_put_session_item(struct proto_buf *b, const struct proto_session_item *it)
{
    uint8_t *p;
    int rc;

    if (!role_known(it->role) || !string_terminated(it->engine_id, PROTO_NAME_MAX) ||
        !string_terminated(it->name_space, PROTO_NAME_MAX))
        return proto_put_fail(b, -EINVAL);
    rc = proto_record_slot(b, REC_SESSION, &p);
    if (rc)
        return rc;
    enc_session(p, it);
    return 0;
}

int proto_put_empty(struct proto_buf *b, uint16_t type, uint64_t seq, uint32_t arg)
{
    int rc = proto_begin(b, type, seq, 0, arg);

    return rc ? rc : proto_end(b);
}

int proto_put_error_frame(struct proto_buf *b, uint16_t type, uint64_t seq, int32_t status,
                          const char *message)
{
    const struct type_info *t = type_info(type);
    struct proto_error e = {.status = status};
    int rc;

    if (!t || t->kind != REC_ERROR)
        return -EINVAL;
    /* A message too long for the field is cut, not refused: the error must
     * still reach the peer. */
    snprintf(e.message, sizeof(e.message), "%s", message ? message : "");
    rc = proto_begin(b, type, seq, 1, t->arg == ARG_ANY ? (uint32_t)status : 0);
    if (rc)
        return rc;
    proto_put_error(b, &e);
    return proto_end(b);
}
