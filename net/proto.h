/*
 * proto.h - the standalone wire protocol between a client runtime (the shm
 * tier, the `umbp` tool) and umbp-server, declared once for both sides.
 *
 * The protocol is the tier contract (include/umbp/tier.h) carried over a Unix
 * stream socket: one request frame per batched tier call, one reply frame
 * with the same sequence number, many requests pipelined.  Payload bytes
 * never cross the socket: the server hands a worker its shared-memory pool
 * once (SCM_RIGHTS on the HELLO_OK frame) and replies carry pool offsets.
 *
 * Frames.  Every frame is a 16-byte header then `len` body bytes, all
 * integers little-endian:
 *
 *     u32 len      body bytes, <= PROTO_MAX_BODY
 *     u16 type     enum proto_type
 *     u16 flags    0 (reserved; a nonzero value is malformed)
 *     u64 seq      chosen by the requester, echoed by the reply; 0 for
 *                  unsolicited server frames (EVENTS, ERROR, AUTH_CHALLENGE)
 *
 * Bodies.  Every body has one shape, an array of fixed-size records:
 *
 *     u32 n        number of records, <= the type's max_records
 *     u32 arg      per type: LOOKUP flags, ACQUIRE lease ttl (ms), a
 *                  status (CLEAR_R, HELLO_ERR), lost events (EVENTS), a
 *                  worker's write deadline (HELLO, ms); else 0
 *     n records    of the type's record size (table in proto.c)
 *
 * so a decoder checks exactly one equation, len == 8 + n * record_size, plus
 * the per-type bounds on n, and every record accessor is bounds-checked.
 * Record layouts are the struct proto_* below, packed field by field in the
 * order written (no padding on the wire beyond the explicit pad fields).
 *
 * Versioning.  HELLO carries PROTO_VERSION; the server answers HELLO_ERR
 * (status -EPROTO) to any version it does not speak.  A change that alters
 * an existing record or type bumps PROTO_VERSION.  A new message type (or
 * flag bit, or event type) leaves existing layouts alone but is malformed
 * for an old peer, so it also comes with a new PROTO_VERSION, and is only
 * sent to a peer whose HELLO / HELLO_OK announced a version that has it.
 *
 * Malformed input.  Every decoder returns a negative code and writes the
 * name of the offending field into err ("RESERVE.n", "frame.flags"); the
 * server logs it and disconnects that client only.
 *
 * This header is the codec only (bytes in, bytes out); the socket's
 * particulars are fdpass.h (socket path, SCM_RIGHTS) and inbuf.h (a
 * stream's input buffers and output drain).
 *
 * Threads: stateless functions; any thread.
 */
#ifndef UMBP_NET_PROTO_H
#define UMBP_NET_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/umbp.h"

#define PROTO_MAGIC 0x554d4250u /* "UMBP" as a big-endian u32 ("PBMU" in a dump) */
/* 2: HELLO.arg carries a worker's write deadline; 3: the TCP handshake
 * (AUTH_*) and umbp-master's frames (REGISTER .. NODES_R, role node);
 * 4: WAITING (a server that is a node holds a request for the cluster);
 * 5: PUBLISH_AS and RESERVE.arg (reservations made ahead, a hold in ms) */
#define PROTO_VERSION 5
#define PROTO_HDR_SIZE 16
#define PROTO_BODY_HDR_SIZE 8
#define PROTO_MAX_RECORDS 65536u       /* per frame; larger batches are split */
#define PROTO_MAX_RENAME_RECORDS 32768u /* PUBLISH_AS: 72-byte records */
#define PROTO_MAX_BODY (4u << 20)      /* >= 8 + PROTO_MAX_RECORDS * 40 */
#define PROTO_NAME_MAX 64              /* engine id, namespace: NUL-padded */
#define PROTO_ERRMSG_MAX 192

/* Message types.  X(name, value, record size, max records, direction)
 * direction: C = client -> server request, S = server -> client. */
#define PROTO_TYPES(X)                                                             \
    X(HELLO, 1, PROTO_HELLO_SIZE, 1, C)      /* n = 1 */                           \
    X(HELLO_OK, 2, PROTO_WELCOME_SIZE, 1, S) /* n = 1; worker: pool fd attached */ \
    X(HELLO_ERR, 3, PROTO_ERROR_SIZE, 1, S)  /* n = 1, arg = status */             \
    X(LOOKUP, 4, 32, PROTO_MAX_RECORDS, C)   /* keys; arg = PROTO_LOOKUP_* */      \
    X(LOOKUP_R, 5, 1, PROTO_MAX_RECORDS, S)  /* u8 present per key */              \
    X(RESERVE, 6, PROTO_RESERVE_ITEM_SIZE, PROTO_MAX_RECORDS, C)                  \
    X(RESERVE_R, 7, PROTO_REGION_ITEM_SIZE, PROTO_MAX_RECORDS, S)                 \
    X(PUBLISH, 8, PROTO_TOKEN_ITEM_SIZE, PROTO_MAX_RECORDS, C)                    \
    X(PUBLISH_R, 9, 4, PROTO_MAX_RECORDS, S) /* i32 status per item */             \
    X(ABORT, 10, PROTO_TOKEN_ITEM_SIZE, PROTO_MAX_RECORDS, C) /* no reply */      \
    X(ACQUIRE, 11, 32, PROTO_MAX_RECORDS, C) /* keys; arg = lease ttl ms */        \
    X(ACQUIRE_R, 12, PROTO_REGION_ITEM_SIZE, PROTO_MAX_RECORDS, S)                \
    X(RELEASE, 13, PROTO_TOKEN_ITEM_SIZE, PROTO_MAX_RECORDS, C)                   \
    X(RELEASE_R, 14, 4, PROTO_MAX_RECORDS, S) /* i32 status per item */            \
    X(CLEAR, 15, 0, 0, C)                                                          \
    X(CLEAR_R, 16, 0, 0, S)                  /* arg = status */                    \
    X(STATS, 17, 0, 0, C)                                                          \
    X(STATS_R, 18, PROTO_STATS_SIZE, 1, S)                                         \
    X(PING, 19, 0, 0, C)                                                           \
    X(PONG, 20, 0, 0, S)                                                           \
    X(EVENTS, 21, PROTO_EVENT_ITEM_SIZE, PROTO_MAX_RECORDS, S) /* seq 0; arg = lost */ \
    X(ERROR, 22, PROTO_ERROR_SIZE, 1, S)     /* seq 0; sent before a disconnect */ \
    X(SESSIONS, 23, 0, 0, C)                 /* admin: list sessions */            \
    X(SESSIONS_R, 24, PROTO_SESSION_ITEM_SIZE, 4096, S)                           \
    /* the shared-secret handshake over TCP (net/auth.h), before HELLO */          \
    X(AUTH_CHALLENGE, 25, 32, 1, S)          /* seq 0: the server's nonce */        \
    X(AUTH, 26, PROTO_AUTH_SIZE, 1, C)       /* the client's nonce and MAC */       \
    X(AUTH_OK, 27, 32, 1, S)                 /* the server's MAC */                 \
    /* umbp-master (master/): nodes report, lookups ask */                        \
    X(REGISTER, 28, PROTO_REGISTER_SIZE, 1, C)                                    \
    X(REGISTER_R, 29, PROTO_ACK_SIZE, 1, S)                                       \
    X(HEARTBEAT, 30, PROTO_NODE_EVENT_SIZE, PROTO_MAX_RECORDS, C) /* record 0: STATUS */ \
    X(HEARTBEAT_R, 31, PROTO_ACK_SIZE, 1, S)                                      \
    X(RESYNC, 32, PROTO_NODE_EVENT_SIZE, PROTO_MAX_RECORDS, C) /* arg: FIRST, LAST */ \
    X(RESYNC_R, 33, PROTO_ACK_SIZE, 1, S)                                         \
    X(LOCATE, 34, 32, PROTO_MAX_RECORDS, C)  /* keys */                            \
    X(LOCATE_R, 35, PROTO_LOCATION_SIZE, PROTO_MAX_RECORDS, S) /* arg = node epoch */ \
    X(NODES, 36, 0, 0, C)                    /* arg = the epoch the client knows */ \
    X(NODES_R, 37, PROTO_NODE_INFO_SIZE, PROTO_MAX_NODES_FRAME, S) /* arg = epoch */ \
    /* a node's report: refs of nodes it failed to fetch from (no reply) */       \
    X(SUSPECT, 38, 4, PROTO_MAX_NODES_FRAME, C)                                   \
    /* the request of this seq waits for the cluster: its reply comes within    \
     * arg ms (a server that is its host's node; not a reply) */                 \
    X(WAITING, 39, 0, 0, S)                                                       \
    /* publish a reservation under another key (one made ahead of its key) */     \
    X(PUBLISH_AS, 40, PROTO_RENAME_ITEM_SIZE, PROTO_MAX_RENAME_RECORDS, C) /* PUBLISH_R */

enum proto_type {
#define X(name, val, rec, max, dir) PROTO_##name = val,
    PROTO_TYPES(X)
#undef X
};

/* ---- records -------------------------------------------------------------- */

enum proto_role {
    PROTO_ROLE_WORKER = 0, /* maps the pool; every call */
    PROTO_ROLE_LOOKUP = 1, /* an engine's scheduler: LOOKUP, STATS, PING; no pool */
    PROTO_ROLE_ADMIN = 2,  /* the umbp tool: STATS, SESSIONS, CLEAR, PING; no pool */
    PROTO_ROLE_NODE = 3,   /* umbp-master only: a node of the cluster (REGISTER ..) */
};

#define PROTO_HELLO_EVENTS 1u     /* hello.flags: send me EVENTS frames */
/* A worker's write deadline: after a reservation is granted it writes into
 * the region for at most this long (its timeout_ms plus the time a copy
 * already started may still take), so the server never hands the region
 * out again before then unless the worker published or aborted it. */
#define PROTO_WRITE_DEADLINE_MAX_MS (3600000u + 600000u)
/* WAITING.arg: 1 .. this (lookup_timeout_ms + timeout_ms at most) */
#define PROTO_WAIT_MAX_MS (60000u + 3600000u)
#define PROTO_LOOKUP_TOUCH 1u     /* LOOKUP arg: refresh LRU of present keys */

/* HELLO record. */
struct proto_hello {
    uint32_t magic;               /* PROTO_MAGIC */
    uint16_t version;             /* PROTO_VERSION */
    uint8_t role;                 /* enum proto_role */
    uint8_t pad;                  /* 0 */
    uint32_t flags;               /* PROTO_HELLO_* */
    uint32_t pid;
    uint32_t dp_rank, tp_rank;
    char engine_id[PROTO_NAME_MAX]; /* NUL-terminated within the field */
    char name_space[PROTO_NAME_MAX]; /* tenant namespace (quotas); "" = default */
    /* not in the record: the frame's arg (proto_put_hello sets it,
     * proto_get_hello reads it); a worker's is 1..PROTO_WRITE_DEADLINE_MAX_MS,
     * every other role's 0 */
    uint32_t write_deadline_ms;
};
#define PROTO_HELLO_SIZE (4 + 2 + 1 + 1 + 4 + 4 + 4 + 4 + 2 * PROTO_NAME_MAX)

/* HELLO_OK record. */
struct proto_welcome {
    uint16_t version;             /* the version the server will speak */
    uint16_t pad;
    uint32_t lease_ttl_ms;        /* the server's cap on lease ttl */
    uint64_t session_id;
    uint64_t pool_id;             /* random at pool creation; kept when a
                                     restarted server adopts the pool */
    uint64_t pool_size;           /* bytes of the mapping the fd gives */
    uint64_t capacity_bytes;      /* usable by objects */
};
#define PROTO_WELCOME_SIZE (2 + 2 + 4 + 8 + 8 + 8 + 8)

/* RESERVE item: a key and its object size. */
struct proto_reserve_item {
    umbp_key_t key;
    uint64_t size;
};
#define PROTO_RESERVE_ITEM_SIZE (UMBP_KEY_SIZE + 8)

/* PUBLISH, ABORT and RELEASE item: a key and the token its reservation or
 * lease was given. */
struct proto_token_item {
    umbp_key_t key;
    uint64_t token;
};
#define PROTO_TOKEN_ITEM_SIZE (UMBP_KEY_SIZE + 8)

/* PUBLISH_AS item: the reservation (its key and token, as RESERVE made
 * it) and the key its object is published under.  from == key is a plain
 * PUBLISH.  Replied by PUBLISH_R: 0, UMBP_TIER_EXISTS (the key was already
 * present or being written: the reservation is dropped, first writer wins),
 * or a negative code. */
struct proto_rename_item {
    umbp_key_t from;
    uint64_t token;
    umbp_key_t key;
};
#define PROTO_RENAME_ITEM_SIZE (UMBP_KEY_SIZE + 8 + UMBP_KEY_SIZE)

/* RESERVE.arg: a hold in ms.  0: the client writes into each region it is
 * granted for at most its write deadline (HELLO.arg) from the grant.  h > 0:
 * reservations made ahead, before the client knows their keys: it starts
 * writing into one at most h ms after the grant, and then writes for at
 * most its write deadline; the server keeps the region that long. */
#define PROTO_HOLD_MAX_MS 600000u

/* RESERVE_R and ACQUIRE_R item: the outcome for one key, in request order.
 * status 0: [offset, offset + size) of the pool is the object's region and
 * token names the reservation or lease; status UMBP_TIER_EXISTS (reserve
 * only) or a negative code: offset, size and token are 0. */
struct proto_region_item {
    int32_t status;
    uint32_t pad;                 /* 0 */
    uint64_t offset, size, token;
};
#define PROTO_REGION_ITEM_SIZE (4 + 4 + 8 + 8 + 8)

/* EVENTS item. */
struct proto_event_item {
    uint32_t type;                /* umbp_event_type_t */
    umbp_key_t key;
};
#define PROTO_EVENT_ITEM_SIZE (4 + UMBP_KEY_SIZE)

/* HELLO_ERR and ERROR record. */
struct proto_error {
    int32_t status;
    char message[PROTO_ERRMSG_MAX]; /* NUL-terminated within the field */
};
#define PROTO_ERROR_SIZE (4 + PROTO_ERRMSG_MAX)

/* STATS_R record: the pool and the server's counters. */
struct proto_stats {
    uint64_t capacity_bytes, used_bytes;
    uint64_t num_objects, num_pending, num_leased;
    uint64_t evictions, evicted_bytes, leases_expired;
    uint64_t sessions;
    uint64_t lookups, lookup_keys, lookup_hits;
    uint64_t reserves, publishes, acquires, acquire_hits;
    uint64_t protocol_errors, refused_connections;
    /* version 2: regions of unfinished reservations whose session ended,
     * kept until their writers' deadlines; reservations reclaimed at their
     * deadline (never published nor aborted) */
    uint64_t held_regions, reservations_expired;
};
#define PROTO_STATS_FIELDS 20
#define PROTO_STATS_SIZE (8 * PROTO_STATS_FIELDS)

/* SESSIONS_R item: one connected session. */
struct proto_session_item {
    uint64_t session_id;
    uint32_t pid, uid;
    uint32_t role, dp_rank, tp_rank, pad;
    uint64_t leases, reservations; /* held now */
    uint64_t requests;             /* frames handled */
    char engine_id[PROTO_NAME_MAX];
    char name_space[PROTO_NAME_MAX];
};
#define PROTO_SESSION_ITEM_SIZE (8 + 4 * 6 + 8 * 3 + 2 * PROTO_NAME_MAX)

/* ---- the TCP handshake and umbp-master's records (proto_master.c) ------------ */

/* AUTH record: the client's nonce, then its MAC over both nonces
 * (net/auth.h).  AUTH_CHALLENGE and AUTH_OK carry one 32-byte value,
 * read and written as a key (proto_get_key, proto_put_key). */
struct proto_auth {
    uint8_t nonce[32];
    uint8_t mac[32];
};
#define PROTO_AUTH_SIZE 64

#define PROTO_NODE_ADDR_MAX 1024     /* a node's UCX worker address, opaque */
#define PROTO_MAX_REPLICAS 4         /* owners per key in LOCATE_R */
#define PROTO_MAX_NODES_FRAME 2048   /* NODES_R records */

/* REGISTER record: a node's identity (host + pid + start time: a restarted
 * engine is a new node), its worker address, capacity and use, and the
 * sequence number of the last event it has issued (0: none yet). */
struct proto_register {
    char host[PROTO_NAME_MAX];       /* NUL-terminated, non-empty */
    uint32_t pid;                    /* > 0 */
    uint32_t addr_len;               /* <= PROTO_NODE_ADDR_MAX */
    uint64_t start_ns;               /* > 0: the process's start (any clock it keeps) */
    uint64_t capacity_bytes;         /* > 0 */
    uint64_t used_bytes;
    uint64_t seq;
    uint8_t addr[PROTO_NODE_ADDR_MAX]; /* [addr_len, end) zero */
};
#define PROTO_REGISTER_SIZE (PROTO_NAME_MAX + 4 + 4 + 8 * 4 + PROTO_NODE_ADDR_MAX)

/* HEARTBEAT and RESYNC records.  Record 0 of each frame is STATUS (seq:
 * the node's last event seq, size: bytes used, key zero); HEARTBEAT's
 * others are events with consecutive seq > 0; RESYNC's others are STORED
 * with seq 0 (the snapshot is as of the STATUS seq of its FIRST frame). */
enum proto_node_event_kind {
    PROTO_NODE_STATUS = 0,
    PROTO_NODE_STORED = 1,           /* size > 0 */
    PROTO_NODE_REMOVED = 2,          /* size 0 */
};
struct proto_node_event {
    uint64_t seq;
    uint32_t kind;
    uint32_t pad;                    /* 0 */
    umbp_key_t key;
    uint64_t size;
};
#define PROTO_NODE_EVENT_SIZE (8 + 4 + 4 + UMBP_KEY_SIZE + 8)
#define PROTO_RESYNC_FIRST 1u        /* RESYNC arg: drop what the master has of me */
#define PROTO_RESYNC_LAST 2u         /* RESYNC arg: the snapshot is whole */

/* REGISTER_R, HEARTBEAT_R and RESYNC_R record. */
enum proto_ack_action {
    PROTO_ACK_OK = 0,
    PROTO_ACK_RESYNC = 1,            /* send your whole key set (RESYNC FIRST .. LAST) */
    PROTO_ACK_REGISTER = 2,          /* unknown node (a restarted master, or declared dead) */
};
struct proto_ack {
    uint64_t seq;                    /* the last event seq the master applied */
    uint32_t action;                 /* enum proto_ack_action */
    uint32_t node_ref;               /* the master's number for the node; 0 with REGISTER */
};
#define PROTO_ACK_SIZE 16

/* LOCATE_R record, per key in request order: its live owners. */
struct proto_location {
    uint32_t nrep;                   /* 0 .. PROTO_MAX_REPLICAS; 0 = miss */
    uint32_t pad;                    /* 0 */
    uint64_t size;                   /* object bytes; 0 with nrep 0 */
    uint32_t refs[PROTO_MAX_REPLICAS]; /* node refs (NODES_R); [nrep, end) zero */
};
#define PROTO_LOCATION_SIZE (4 + 4 + 8 + 4 * PROTO_MAX_REPLICAS)

/* NODES_R record: one node the master routes to or suspects. */
enum proto_node_state {
    PROTO_NODE_ALIVE = 0,
    PROTO_NODE_SUSPECT = 1,          /* missed heartbeats: not returned by LOCATE */
};
struct proto_node_info {
    uint32_t ref;                    /* > 0, never reused by this master */
    uint32_t state;                  /* enum proto_node_state */
    char host[PROTO_NAME_MAX];
    uint32_t pid;
    uint32_t addr_len;
    uint64_t start_ns, capacity_bytes, used_bytes, seq, keys, heartbeat_age_ms;
    uint8_t addr[PROTO_NODE_ADDR_MAX];
};
#define PROTO_NODE_INFO_SIZE (4 + 4 + PROTO_NAME_MAX + 4 + 4 + 8 * 6 + PROTO_NODE_ADDR_MAX)

/* ---- decoding ----------------------------------------------------------------- */

/* A complete, validated frame: a view into the caller's buffer. */
struct proto_frame {
    uint16_t type;
    uint64_t seq;
    uint32_t n, arg;              /* the body header */
    const uint8_t *records;       /* n * record size bytes */
    uint32_t record_size;
};

/* Looks for one frame at the start of buf[0, avail).
 *  > 0: a whole valid frame; *f describes it and the return value is the
 *       number of bytes it occupies (header + body).
 *    0: not enough bytes yet (also sets nothing).
 *  < 0: malformed (-EPROTO, or -EMSGSIZE for a len over PROTO_MAX_BODY);
 *       err names the field.  Known as soon as the 16-byte header or the
 *       8-byte body header shows it, before the records arrive.
 * Besides the equation above: flags 0, a type of the right direction, n = 1
 * for the one-record types (max 1), arg as its type allows (0 where unused,
 * known LOOKUP bits, ACQUIRE ttl > 0), seq 0 for EVENTS and ERROR.
 * `from_server` selects which direction's types are acceptable: a server
 * parses with false (only C types), a client with true (only S types). */
long proto_frame_parse(const uint8_t *buf, size_t avail, bool from_server,
                       struct proto_frame *f, char *err, size_t errlen);

/* Record accessors: i < f->n and f->type of the right kind, else -EINVAL.
 * Strings are checked to be NUL-terminated within their field and NUL-padded
 * after it; the pads to be zero; hello.magic, hello.flags, roles and event
 * types to be known; a LOOKUP_R u8 to be 0 or 1; a HELLO_ERR's status to
 * equal its arg (err, where there is one, names the field).  *out is
 * written only on success. */
int proto_get_key(const struct proto_frame *f, uint32_t i, umbp_key_t *out);
int proto_get_u8(const struct proto_frame *f, uint32_t i, uint8_t *out);
int proto_get_status(const struct proto_frame *f, uint32_t i, int32_t *out);
int proto_get_hello(const struct proto_frame *f, struct proto_hello *out, char *err,
                    size_t errlen);
int proto_get_welcome(const struct proto_frame *f, struct proto_welcome *out, char *err,
                      size_t errlen);
int proto_get_reserve_item(const struct proto_frame *f, uint32_t i,
                           struct proto_reserve_item *out);
int proto_get_token_item(const struct proto_frame *f, uint32_t i,
                         struct proto_token_item *out);
int proto_get_rename_item(const struct proto_frame *f, uint32_t i,
                          struct proto_rename_item *out);
int proto_get_region_item(const struct proto_frame *f, uint32_t i,
                          struct proto_region_item *out);
int proto_get_event_item(const struct proto_frame *f, uint32_t i,
                         struct proto_event_item *out);
int proto_get_error(const struct proto_frame *f, struct proto_error *out);
int proto_get_stats(const struct proto_frame *f, struct proto_stats *out);
int proto_get_session_item(const struct proto_frame *f, uint32_t i,
                           struct proto_session_item *out);

/* Client side: a region reply item is acceptable for a request of
 * `want_size` bytes (0 = any, ACQUIRE) in a pool of pool_size bytes: status
 * 0 with size == want_size (when given), size > 0 and [offset, offset+size)
 * inside the pool without overflow; or status != 0 with zero fields.  Else
 * -EPROTO and err names the field ("RESERVE_R.offset"). */
int proto_region_check(const struct proto_region_item *it, uint64_t want_size,
                       uint64_t pool_size, bool is_reserve, char *err, size_t errlen);

/* ---- encoding ----------------------------------------------------------------- */

/* A growable output buffer.  Frames are appended whole.  Zero-initialise
 * it ({0}); data[0, len) is what to write to the socket, once no frame is
 * open (between proto_begin and proto_end the tail is a partial frame). */
struct proto_buf {
    uint8_t *data;
    size_t len, cap;
    /* private to proto.c: the frame proto_begin opened */
    bool open;
    int error;                    /* first failure of a put since proto_begin */
    size_t frame;                 /* offset of its header in data */
};

void proto_buf_free(struct proto_buf *b);
/* Room for `extra` more bytes without a realloc (capacity doubles from 4
 * KiB): 0 or -ENOMEM.  What lies past len is the caller's to write. */
int proto_buf_reserve(struct proto_buf *b, size_t extra);
/* Drops the first `bytes` (already written to the socket); never drops
 * into an open frame. */
void proto_buf_consume(struct proto_buf *b, size_t bytes);

/* Appends from's whole frames to `to` and empties from (which keeps or
 * swaps its memory).  -EINVAL while either has a frame open, -ENOMEM (both
 * unchanged). */
int proto_buf_move(struct proto_buf *to, struct proto_buf *from);

/* Starts a frame of `type` with n records and arg; the caller then appends
 * exactly n records with the proto_put_* functions below, then calls
 * proto_end.  -ENOMEM, -EINVAL (n over the type's max, n != 1 for a
 * one-record type, an arg or seq the decoder would refuse, an unknown
 * type, a frame already open).
 * A put refuses (-EINVAL) a record of the wrong kind for the open frame, one
 * record too many, or a value the decoder would refuse (an unterminated
 * string, a bad magic or role); pads are written as 0 whatever the struct
 * holds.  A put's failure sticks: later puts return it too. */
int proto_begin(struct proto_buf *b, uint16_t type, uint64_t seq, uint32_t n, uint32_t arg);
/* Checks that exactly n records of the type's size were appended and fills
 * in len: 0; else the first failure of a put since proto_begin, or -EPROTO
 * (too few records), and the frame is dropped from b.  -EINVAL if no frame
 * is open. */
int proto_end(struct proto_buf *b);

int proto_put_key(struct proto_buf *b, const umbp_key_t *k);
int proto_put_u8(struct proto_buf *b, uint8_t v);
int proto_put_status(struct proto_buf *b, int32_t v);
int proto_put_hello(struct proto_buf *b, const struct proto_hello *h);
int proto_put_welcome(struct proto_buf *b, const struct proto_welcome *w);
int proto_put_reserve_item(struct proto_buf *b, const struct proto_reserve_item *it);
int proto_put_token_item(struct proto_buf *b, const struct proto_token_item *it);
int proto_put_rename_item(struct proto_buf *b, const struct proto_rename_item *it);
int proto_put_region_item(struct proto_buf *b, const struct proto_region_item *it);
int proto_put_event_item(struct proto_buf *b, const struct proto_event_item *it);
int proto_put_error(struct proto_buf *b, const struct proto_error *e);
int proto_put_stats(struct proto_buf *b, const struct proto_stats *s);
int proto_put_session_item(struct proto_buf *b, const struct proto_session_item *it);

/* Whole small frames in one call.  proto_put_empty: n = 0 (any type that
 * allows it).  proto_put_error_frame: HELLO_ERR (arg = status too) or ERROR
 * (seq must be 0); a message longer than the field is cut to fit. */
int proto_put_empty(struct proto_buf *b, uint16_t type, uint64_t seq, uint32_t arg);
int proto_put_error_frame(struct proto_buf *b, uint16_t type, uint64_t seq, int32_t status,
                          const char *message);

const char *proto_type_name(uint16_t type); /* "RESERVE", or "?" */

/* The master's records and the handshake's (proto_master.c).  Accessors:
 * 0, or -EINVAL with err naming the field ("REGISTER.addr_len: 2000 bytes
 * exceed 1024").  proto_get_node_event also checks the record's place:
 * record 0 STATUS, HEARTBEAT's others STORED or REMOVED with seq > 0,
 * RESYNC's others STORED with seq 0.  Puts refuse what the accessors
 * refuse (the place of a node event excepted: the put does not know it). */
int proto_get_auth(const struct proto_frame *f, struct proto_auth *out, char *err,
                   size_t errlen);
int proto_get_register(const struct proto_frame *f, struct proto_register *out, char *err,
                       size_t errlen);
int proto_get_node_event(const struct proto_frame *f, uint32_t i, struct proto_node_event *out,
                         char *err, size_t errlen);
int proto_get_ack(const struct proto_frame *f, struct proto_ack *out, char *err, size_t errlen);
int proto_get_location(const struct proto_frame *f, uint32_t i, struct proto_location *out,
                       char *err, size_t errlen);
int proto_get_node_info(const struct proto_frame *f, uint32_t i, struct proto_node_info *out,
                        char *err, size_t errlen);
int proto_put_auth(struct proto_buf *b, const struct proto_auth *a);
int proto_put_register(struct proto_buf *b, const struct proto_register *r);
int proto_put_node_event(struct proto_buf *b, const struct proto_node_event *e);
int proto_put_ack(struct proto_buf *b, const struct proto_ack *a);
int proto_put_location(struct proto_buf *b, const struct proto_location *l);
int proto_put_node_info(struct proto_buf *b, const struct proto_node_info *n);

#endif /* UMBP_NET_PROTO_H */
