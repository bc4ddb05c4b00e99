/*
 * proto_rec.h - what the codec's files share and nobody else sees: the
 * little-endian byte helpers, the record cursors, the record kinds, and
 * the two doors into a frame's records (the accessor's record_at, the
 * builder's record_slot), so that a second file of records
 * (proto_master.c: the master's and the TCP handshake's) reaches frames
 * only through the checks proto.c makes.  Private to net/proto*.c.
 *
 * Threads: stateless; any thread.
 */
#ifndef UMBP_NET_PROTO_REC_H
#define UMBP_NET_PROTO_REC_H

#include <stdint.h>
#include <string.h>

#include "proto.h"

/* ---- little-endian bytes ------------------------------------------------- */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LE16(x) __builtin_bswap16(x)
#define LE32(x) __builtin_bswap32(x)
#define LE64(x) __builtin_bswap64(x)
#else
#define LE16(x) (x)
#define LE32(x) (x)
#define LE64(x) (x)
#endif

static inline uint16_t get_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return LE16(v);
}

static inline uint32_t get_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return LE32(v);
}

static inline uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return LE64(v);
}

static inline void put_u16(uint8_t *p, uint16_t v)
{
    v = LE16(v);
    memcpy(p, &v, sizeof(v));
}

static inline void put_u32(uint8_t *p, uint32_t v)
{
    v = LE32(v);
    memcpy(p, &v, sizeof(v));
}

static inline void put_u64(uint8_t *p, uint64_t v)
{
    v = LE64(v);
    memcpy(p, &v, sizeof(v));
}

/* Cursors over one record: each call moves past the field it handles. */
struct rd {
    const uint8_t *p;
};

struct wr {
    uint8_t *p;
};

static inline uint8_t rd_u8(struct rd *r) { return *r->p++; }

static inline uint16_t rd_u16(struct rd *r)
{
    r->p += 2;
    return get_u16(r->p - 2);
}

static inline uint32_t rd_u32(struct rd *r)
{
    r->p += 4;
    return get_u32(r->p - 4);
}

static inline uint64_t rd_u64(struct rd *r)
{
    r->p += 8;
    return get_u64(r->p - 8);
}

static inline void rd_bytes(struct rd *r, void *dst, size_t n)
{
    memcpy(dst, r->p, n);
    r->p += n;
}

static inline void wr_u8(struct wr *w, uint8_t v) { *w->p++ = v; }

static inline void wr_u16(struct wr *w, uint16_t v)
{
    put_u16(w->p, v);
    w->p += 2;
}

static inline void wr_u32(struct wr *w, uint32_t v)
{
    put_u32(w->p, v);
    w->p += 4;
}

static inline void wr_u64(struct wr *w, uint64_t v)
{
    put_u64(w->p, v);
    w->p += 8;
}

/* A string field: its bytes up to the NUL, then zeros to the field's end
 * (never what follows the NUL in the caller's array). */
static inline void wr_string(struct wr *w, const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);

    memcpy(w->p, s, n);
    memset(w->p + n, 0, cap - n);
    w->p += cap;
}

/* What the records of a type are; each kind has one accessor and one put. */
enum rec_kind {
    REC_NONE, REC_HELLO, REC_WELCOME, REC_ERROR, REC_KEY, REC_U8, REC_STATUS,
    REC_RESERVE, REC_TOKEN, REC_REGION, REC_EVENT, REC_STATS, REC_SESSION, REC_RENAME,
    /* proto_master.c */
    REC_AUTH, REC_REGISTER, REC_NODE_EVENT, REC_ACK, REC_LOCATION, REC_NODE_INFO,
};

#define KIND_SIZE(k)                                                             \
    ((k) == REC_NONE      ? 0                                                    \
     : (k) == REC_HELLO   ? PROTO_HELLO_SIZE                                     \
     : (k) == REC_WELCOME ? PROTO_WELCOME_SIZE                                   \
     : (k) == REC_ERROR   ? PROTO_ERROR_SIZE                                     \
     : (k) == REC_KEY     ? UMBP_KEY_SIZE                                        \
     : (k) == REC_U8      ? 1                                                    \
     : (k) == REC_STATUS  ? 4                                                    \
     : (k) == REC_RESERVE ? PROTO_RESERVE_ITEM_SIZE                              \
     : (k) == REC_TOKEN   ? PROTO_TOKEN_ITEM_SIZE                                \
     : (k) == REC_REGION  ? PROTO_REGION_ITEM_SIZE                               \
     : (k) == REC_EVENT   ? PROTO_EVENT_ITEM_SIZE                                \
     : (k) == REC_STATS   ? PROTO_STATS_SIZE                                     \
     : (k) == REC_SESSION ? PROTO_SESSION_ITEM_SIZE                              \
     : (k) == REC_RENAME  ? PROTO_RENAME_ITEM_SIZE                               \
     : (k) == REC_AUTH    ? PROTO_AUTH_SIZE                                      \
     : (k) == REC_REGISTER ? PROTO_REGISTER_SIZE                                 \
     : (k) == REC_NODE_EVENT ? PROTO_NODE_EVENT_SIZE                             \
     : (k) == REC_ACK     ? PROTO_ACK_SIZE                                       \
     : (k) == REC_LOCATION ? PROTO_LOCATION_SIZE                                 \
     : (k) == REC_NODE_INFO ? PROTO_NODE_INFO_SIZE                               \
                          : -1)


/* Record i of a frame whose records are of `kind` (-EINVAL otherwise). */
int proto_record_at(const struct proto_frame *f, uint32_t i, enum rec_kind kind,
                    const uint8_t **out);
/* The same, with err naming the frame ("REGISTER: not a REGISTER frame ..."). */
int proto_record_err(const struct proto_frame *f, uint32_t i, enum rec_kind kind,
                     const uint8_t **out, const char *what, char *err, size_t errlen);
/* Appends one record of `kind` to b's open frame (*out: where its bytes go);
 * a failure sticks to the frame (proto_end reports it). */
int proto_record_slot(struct proto_buf *b, enum rec_kind kind, uint8_t **out);
/* Makes rc the open frame's failure and returns it. */
int proto_put_fail(struct proto_buf *b, int rc);
/* NULL if s is NUL-terminated within cap and NUL-padded after, else what is wrong. */
const char *proto_string_problem(const char *s, size_t cap);

#endif /* UMBP_NET_PROTO_REC_H */
