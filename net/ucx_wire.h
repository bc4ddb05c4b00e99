/*
 * ucx_wire.h - the two active messages of a remote fetch over UCX
 * (net/ucx.c sends and receives them; docs/protocol.md, "Remote fetch").
 *
 * FETCH (requester -> owner, AM id UCX_AM_FETCH): a 24-byte header
 * {magic, version, type, req_id, n, flags} and, as the message's data, n
 * records {key[32], max_size u64}: the buffer the requester has for each
 * key.  DATA (owner -> requester, AM id UCX_AM_DATA, one per key): a 32-byte
 * header {magic, version, type, req_id, index, status, size} and, when
 * status is 0, exactly size bytes of the object as data.  Every integer is
 * little-endian; a record's place is fixed, so a length names its count.
 *
 * These bytes come from another process, possibly on another host: the
 * decoders check every field (magic, version, type, the count against the
 * data's length, each max_size, the status against the codes an owner may
 * send, size against the data) and name the bad one, "FETCH.n: ...".  What
 * only the requester can check (req_id known, index < its n, size <= the
 * max it asked) it checks itself (ucx.c).  tests/fuzz/fuzz_ucx_wire.c
 * fuzzes both decoders.  No UCX here: the fuzzer links this file alone.
 * Any thread (no state).
 */
#ifndef UMBP_NET_UCX_WIRE_H
#define UMBP_NET_UCX_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "umbp/umbp.h"

/* UCX keeps a table indexed by AM id: keep them small */
enum { UCX_AM_FETCH = 85, UCX_AM_DATA = 86 };

#define UCX_WIRE_MAGIC 0x46504d55u /* "UMPF" on the wire (LE) */
#define UCX_WIRE_VERSION 1
#define UCX_WIRE_FETCH 1
#define UCX_WIRE_DATA 2
#define UCX_FETCH_HDR_LEN 24
#define UCX_FETCH_REC_LEN 40
#define UCX_DATA_HDR_LEN 32
/* keys in one FETCH: its records travel eager (40 KiB at most) */
#define UCX_FETCH_MAX_KEYS 1024
/* one object's bytes: the largest max_size a FETCH may ask for */
#define UCX_OBJ_MAX (1ull << 32)

struct ucx_fetch_hdr {
    uint64_t req_id;
    uint32_t n;
};

struct ucx_fetch_rec {
    umbp_key_t key;
    uint64_t max_size;
};

struct ucx_data_hdr {
    uint64_t req_id;
    uint32_t index;
    int32_t status; /* 0, -ENOENT (miss), -EMSGSIZE (larger than max_size), -EIO */
    uint64_t size;  /* the object's size; the data's length when status is 0 */
};

/* Builders: write exactly UCX_FETCH_HDR_LEN, UCX_FETCH_REC_LEN or
 * UCX_DATA_HDR_LEN bytes. */
void ucx_wire_fetch_hdr_put(void *buf, uint64_t req_id, uint32_t n);
void ucx_wire_fetch_rec_put(void *rec, const umbp_key_t *key, uint64_t max_size);
void ucx_wire_data_hdr_put(void *buf, const struct ucx_data_hdr *h);

/* Decoders: 0, or -EPROTO with err naming the field.  fetch_parse checks the
 * header and every record of data (datalen bytes); fetch_rec then reads
 * record i of a parsed message without checks. */
int ucx_wire_fetch_parse(const void *hdr, size_t hdrlen, const void *data, size_t datalen,
                         struct ucx_fetch_hdr *out, char *err, size_t errlen);
void ucx_wire_fetch_rec(const void *data, uint32_t i, struct ucx_fetch_rec *out);
int ucx_wire_data_parse(const void *hdr, size_t hdrlen, size_t datalen, struct ucx_data_hdr *out,
                        char *err, size_t errlen);

#endif
