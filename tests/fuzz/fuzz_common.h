/*
 * fuzz_common.h - what both proto fuzzers check about every frame they
 * parse (header only; included by fuzz_proto_server.c and
 * fuzz_proto_client.c).
 *
 * The input is a byte stream as a peer would send it: frames are parsed
 * and consumed one after another until the stream ends, is incomplete, or
 * is malformed (where a real reader would disconnect).  Properties, each an
 * abort() when broken:
 *   - a malformed frame returns -EPROTO or -EMSGSIZE and names a field,
 *     "frame.<field>: ..." or "<TYPE>.<field>: ...";
 *   - a valid frame occupies 16 + 8 + n * record_size bytes and every
 *     shorter prefix of it parses as "not enough bytes yet";
 *   - every accessor refuses (-EINVAL) a frame of another type and any index
 *     >= n, and answers 0 or -EINVAL otherwise (our own table of which
 *     accessor goes with which type, written apart from proto.c's);
 *   - a frame whose records all decode re-encodes with proto_begin,
 *     proto_put_* and proto_end into exactly the bytes it was parsed from.
 */
#ifndef UMBP_FUZZ_COMMON_H
#define UMBP_FUZZ_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "fuzz_check.h"

/* One accessor each; the order is irrelevant. */
enum fz_acc {
    FZ_KEY, FZ_U8, FZ_STATUS, FZ_HELLO, FZ_WELCOME, FZ_RESERVE, FZ_TOKEN,
    FZ_REGION, FZ_EVENT, FZ_ERROR, FZ_STATS, FZ_SESSION, FZ_RENAME,
    FZ_AUTH, FZ_REGISTER, FZ_NODE_EVENT, FZ_ACK, FZ_LOCATION, FZ_NODE_INFO, /* proto_master.c */
    FZ_NACC, FZ_NONE = -1,
};

union fz_rec {
    umbp_key_t key;
    uint8_t u8;
    int32_t status;
    struct proto_hello hello;
    struct proto_welcome welcome;
    struct proto_reserve_item reserve;
    struct proto_token_item token;
    struct proto_rename_item rename;
    struct proto_region_item region;
    struct proto_event_item event;
    struct proto_error error;
    struct proto_stats stats;
    struct proto_session_item session;
    struct proto_auth auth;
    struct proto_register reg;
    struct proto_node_event node_event;
    struct proto_ack ack;
    struct proto_location location;
    struct proto_node_info node_info;
};

/* Which accessor reads the records of each type: the fuzzers' own statement
 * of proto.h, checked against proto.c. */
static inline int fz_acc_of(uint16_t type)
{
    switch (type) {
    case PROTO_LOOKUP: case PROTO_ACQUIRE: return FZ_KEY;
    case PROTO_LOOKUP_R: return FZ_U8;
    case PROTO_PUBLISH_R: case PROTO_RELEASE_R: case PROTO_SUSPECT: return FZ_STATUS;
    case PROTO_HELLO: return FZ_HELLO;
    case PROTO_HELLO_OK: return FZ_WELCOME;
    case PROTO_RESERVE: return FZ_RESERVE;
    case PROTO_PUBLISH: case PROTO_ABORT: case PROTO_RELEASE: return FZ_TOKEN;
    case PROTO_PUBLISH_AS: return FZ_RENAME;
    case PROTO_RESERVE_R: case PROTO_ACQUIRE_R: return FZ_REGION;
    case PROTO_EVENTS: return FZ_EVENT;
    case PROTO_HELLO_ERR: case PROTO_ERROR: return FZ_ERROR;
    case PROTO_STATS_R: return FZ_STATS;
    case PROTO_SESSIONS_R: return FZ_SESSION;
    case PROTO_AUTH_CHALLENGE: case PROTO_AUTH_OK: case PROTO_LOCATE: return FZ_KEY;
    case PROTO_AUTH: return FZ_AUTH;
    case PROTO_REGISTER: return FZ_REGISTER;
    case PROTO_HEARTBEAT: case PROTO_RESYNC: return FZ_NODE_EVENT;
    case PROTO_REGISTER_R: case PROTO_HEARTBEAT_R: case PROTO_RESYNC_R: return FZ_ACK;
    case PROTO_LOCATE_R: return FZ_LOCATION;
    case PROTO_NODES_R: return FZ_NODE_INFO;
    default: return FZ_NONE;
    }
}

/* Accessors without an index: they read the frame's one record. */
static inline bool fz_singleton(int a)
{
    return a == FZ_HELLO || a == FZ_WELCOME || a == FZ_ERROR || a == FZ_STATS ||
           a == FZ_AUTH || a == FZ_REGISTER || a == FZ_ACK;
}

static inline int fz_get(int a, const struct proto_frame *f, uint32_t i, union fz_rec *r,
                         char *err, size_t errlen)
{
    switch (a) {
    case FZ_KEY: return proto_get_key(f, i, &r->key);
    case FZ_U8: return proto_get_u8(f, i, &r->u8);
    case FZ_STATUS: return proto_get_status(f, i, &r->status);
    case FZ_HELLO: return proto_get_hello(f, &r->hello, err, errlen);
    case FZ_WELCOME: return proto_get_welcome(f, &r->welcome, err, errlen);
    case FZ_RESERVE: return proto_get_reserve_item(f, i, &r->reserve);
    case FZ_TOKEN: return proto_get_token_item(f, i, &r->token);
    case FZ_RENAME: return proto_get_rename_item(f, i, &r->rename);
    case FZ_REGION: return proto_get_region_item(f, i, &r->region);
    case FZ_EVENT: return proto_get_event_item(f, i, &r->event);
    case FZ_ERROR: return proto_get_error(f, &r->error);
    case FZ_STATS: return proto_get_stats(f, &r->stats);
    case FZ_SESSION: return proto_get_session_item(f, i, &r->session);
    case FZ_AUTH: return proto_get_auth(f, &r->auth, err, errlen);
    case FZ_REGISTER: return proto_get_register(f, &r->reg, err, errlen);
    case FZ_NODE_EVENT: return proto_get_node_event(f, i, &r->node_event, err, errlen);
    case FZ_ACK: return proto_get_ack(f, &r->ack, err, errlen);
    case FZ_LOCATION: return proto_get_location(f, i, &r->location, err, errlen);
    case FZ_NODE_INFO: return proto_get_node_info(f, i, &r->node_info, err, errlen);
    }
    abort();
}

static inline int fz_put(int a, struct proto_buf *b, const union fz_rec *r)
{
    switch (a) {
    case FZ_KEY: return proto_put_key(b, &r->key);
    case FZ_U8: return proto_put_u8(b, r->u8);
    case FZ_STATUS: return proto_put_status(b, r->status);
    case FZ_HELLO: return proto_put_hello(b, &r->hello);
    case FZ_WELCOME: return proto_put_welcome(b, &r->welcome);
    case FZ_RESERVE: return proto_put_reserve_item(b, &r->reserve);
    case FZ_TOKEN: return proto_put_token_item(b, &r->token);
    case FZ_RENAME: return proto_put_rename_item(b, &r->rename);
    case FZ_REGION: return proto_put_region_item(b, &r->region);
    case FZ_EVENT: return proto_put_event_item(b, &r->event);
    case FZ_ERROR: return proto_put_error(b, &r->error);
    case FZ_STATS: return proto_put_stats(b, &r->stats);
    case FZ_SESSION: return proto_put_session_item(b, &r->session);
    case FZ_AUTH: return proto_put_auth(b, &r->auth);
    case FZ_REGISTER: return proto_put_register(b, &r->reg);
    case FZ_NODE_EVENT: return proto_put_node_event(b, &r->node_event);
    case FZ_ACK: return proto_put_ack(b, &r->ack);
    case FZ_LOCATION: return proto_put_location(b, &r->location);
    case FZ_NODE_INFO: return proto_put_node_info(b, &r->node_info);
    }
    abort();
}

/* The error of a malformed frame names a field of the frame or its type. */
static inline void fz_check_error(long r, const char *err)
{
    const char *dot = strchr(err, '.'), *colon = strchr(err, ':');
    char type[32];

    FZ_CHECK(r == -EPROTO || r == -EMSGSIZE);
    FZ_CHECK(dot && colon && dot < colon && dot > err && (size_t)(dot - err) < sizeof(type));
    memcpy(type, err, (size_t)(dot - err));
    type[dot - err] = 0;
    if (strcmp(type, "frame") != 0) {
        bool known = false;
        for (uint16_t t = 0; t < 64 && !known; t++)
            known = strcmp(proto_type_name(t), type) == 0;
        FZ_CHECK(known);
    }
}

static inline void fz_check_prefixes(const uint8_t *p, long r, bool from_server)
{
    static const size_t cuts[] = {0, 1, PROTO_HDR_SIZE - 1, PROTO_HDR_SIZE,
                                  PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE - 1,
                                  PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE};
    struct proto_frame g;
    char err[256];

    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++)
        if ((long)cuts[i] < r)
            FZ_CHECK(proto_frame_parse(p, cuts[i], from_server, &g, err, sizeof(err)) == 0);
    FZ_CHECK(proto_frame_parse(p, (size_t)r - 1, from_server, &g, err, sizeof(err)) == 0);
}

/* Calls every accessor at index i; only the frame's own one may answer 0,
 * and only for i < n.  Returns that accessor's answer (or -EINVAL). */
static inline int fz_probe(const struct proto_frame *f, uint32_t i, union fz_rec *own)
{
    int mine = fz_acc_of(f->type), own_rc = -EINVAL;
    char err[256];

    for (int a = 0; a < FZ_NACC; a++) {
        union fz_rec r;
        if (fz_singleton(a) && i != 0)
            continue; /* no index: they always read record 0 */
        err[0] = 0;
        int rc = fz_get(a, f, i, &r, err, sizeof(err));
        FZ_CHECK(rc == 0 || rc == -EINVAL);
        if (a != mine || i >= f->n) {
            FZ_CHECK(rc == -EINVAL);
            continue;
        }
        if (rc == 0)
            *own = r;
        own_rc = rc;
        if (rc && (a == FZ_HELLO || a == FZ_WELCOME))
            FZ_CHECK(strncmp(err, a == FZ_HELLO ? "HELLO." : "HELLO_OK.",
                             a == FZ_HELLO ? 6 : 9) == 0);
    }
    return own_rc;
}

/* Visits every record (through on_record, may be NULL) and re-encodes the
 * frame when all of them decode. */
static inline void fz_check_frame(const uint8_t *p, long r, const struct proto_frame *f,
                                  bool from_server,
                                  void (*on_record)(const struct proto_frame *, uint32_t,
                                                    const union fz_rec *))
{
    const uint32_t beyond[] = {f->n, f->n + 1, f->n + 1000, UINT32_MAX}; /* n <= 65536 */
    int mine = fz_acc_of(f->type);
    struct proto_buf b = {0};
    bool all_ok = true;
    union fz_rec rec;

    FZ_CHECK(r == (long)(PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE +
                         (uint64_t)f->n * f->record_size));
    FZ_CHECK(f->records == p + PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE);
    FZ_CHECK(strcmp(proto_type_name(f->type), "?") != 0);
    fz_check_prefixes(p, r, from_server);
    FZ_CHECK(mine != FZ_NONE || f->n == 0);
    FZ_CHECK(proto_begin(&b, f->type, f->seq, f->n, f->arg) == 0);
    for (uint32_t i = 0; i < f->n; i++) {
        int rc = fz_probe(f, i, &rec);
        if (rc == 0 && on_record)
            on_record(f, i, &rec);
        if (rc == 0 && all_ok)
            FZ_CHECK(fz_put(mine, &b, &rec) == 0);
        all_ok = all_ok && rc == 0;
    }
    for (size_t k = 0; k < sizeof(beyond) / sizeof(beyond[0]); k++)
        fz_probe(f, beyond[k], &rec);
    if (all_ok) {
        FZ_CHECK(proto_end(&b) == 0);
        FZ_CHECK(b.len == (size_t)r && memcmp(b.data, p, (size_t)r) == 0);
    } else {
        FZ_CHECK(proto_end(&b) == -EPROTO && b.len == 0);
    }
    proto_buf_free(&b);
}

/* Parses the whole stream as a reader would: frame after frame until it
 * runs out, is incomplete, or is malformed (a reader then disconnects). */
static inline void fz_stream(const uint8_t *data, size_t size, bool from_server,
                             void (*on_frame)(const struct proto_frame *),
                             void (*on_record)(const struct proto_frame *, uint32_t,
                                               const union fz_rec *))
{
    size_t off = 0;

    while (off < size) {
        struct proto_frame f;
        char err[256] = "";
        long r = proto_frame_parse(data + off, size - off, from_server, &f, err,
                                   sizeof(err));
        if (r == 0)
            break;
        if (r < 0) {
            fz_check_error(r, err);
            break;
        }
        FZ_CHECK((size_t)r <= size - off);
        if (on_frame)
            on_frame(&f);
        fz_check_frame(data + off, r, &f, from_server, on_record);
        off += (size_t)r;
    }
}

#endif /* UMBP_FUZZ_COMMON_H */
