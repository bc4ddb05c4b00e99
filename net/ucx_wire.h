/*
 * ucx_wire.h - the two active messages of a remote fetch over UCX
 * (net/ucx.c sends and receives them; docs/protocol.md, "Remote fetch").
 *
 * FETCH (requester -> owner, AM id UCX_AM_FETCH): a 56-byte header
 * {magic, version, type, req_id, n, flags, nonce[16], mac[16]} and, as the
 * message's data, n records {key[32], max_size u64}: the buffer the
 * requester has for each key.  DATA (owner -> requester, AM id UCX_AM_DATA,
 * one per key): a 48-byte header {magic, version, type, req_id, index,
 * status, size, mac[16]} and, when status is 0, exactly size bytes of the
 * object as data.  Every integer is little-endian; a record's place is
 * fixed, so a length names its count.
 *
 * Authentication (nodes that hold the cluster's secret, auth.h's key): the
 * requester draws a random nonce per FETCH; FETCH.mac is a keyed BLAKE2b
 * (crypto_generichash, 16 bytes) over the header's fields, the nonce and
 * the records; each DATA.mac over its header's fields and that FETCH's
 * nonce.  An owner with the key serves no FETCH whose mac is wrong (DATA
 * -EACCES for each key, mac zero); a requester with the key takes no DATA
 * whose mac is wrong, but a -EACCES (a refusal costs a miss, never a
 * byte).  Without the key both macs are zero and not checked.  The macs
 * keep out a peer without the secret that has not seen the traffic (reads,
 * and answers forged for another's fetch).  A tap that replays a captured
 * FETCH to a holder of its keys gets answers with right macs, but on a
 * connection of its own: the owner sends DATA with the reply flag and the
 * requester takes it only on the connection its FETCH went out on
 * (ucx.c, on_data; version 3).  Not covered: the object's bytes (a tap that
 * can inject into that connection itself can change them) and secrecy
 * (nothing is encrypted); docs/distributed.md, Security.
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/umbp.h"

/* UCX keeps a table indexed by AM id: keep them small */
enum { UCX_AM_FETCH = 85, UCX_AM_DATA = 86 };

#define UCX_WIRE_MAGIC 0x46504d55u /* "UMPF" on the wire (LE) */
#define UCX_WIRE_VERSION 3 /* 2: the nonce and the macs; 3: DATA only on its FETCH's connection */
#define UCX_WIRE_FETCH 1
#define UCX_WIRE_DATA 2
#define UCX_FETCH_HDR_LEN 56
#define UCX_FETCH_REC_LEN 40
#define UCX_DATA_HDR_LEN 48
#define UCX_WIRE_NONCE 16
#define UCX_WIRE_MAC 16
#define UCX_WIRE_KEY 32 /* net_auth_key's bytes */
/* keys in one FETCH: its records travel eager (40 KiB at most) */
#define UCX_FETCH_MAX_KEYS 1024
/* one object's bytes: the largest max_size a FETCH may ask for */
#define UCX_OBJ_MAX (1ull << 32)

struct ucx_fetch_hdr {
    uint64_t req_id;
    uint32_t n;
    uint8_t nonce[UCX_WIRE_NONCE];
    uint8_t mac[UCX_WIRE_MAC];
};

struct ucx_fetch_rec {
    umbp_key_t key;
    uint64_t max_size;
};

struct ucx_data_hdr {
    uint64_t req_id;
    uint32_t index;
    int32_t status; /* 0, -ENOENT (miss), -EMSGSIZE (larger than max_size), -EIO,
                       -EACCES (the FETCH's mac was wrong) */
    uint64_t size;  /* the object's size; the data's length when status is 0 */
    uint8_t mac[UCX_WIRE_MAC];
};

/* Builders: write exactly UCX_FETCH_HDR_LEN, UCX_FETCH_REC_LEN or
 * UCX_DATA_HDR_LEN bytes.  fetch_hdr_put takes the nonce and the mac
 * (ucx_wire_fetch_mac, or zeros without a key); data_hdr_put writes h->mac. */
void ucx_wire_fetch_hdr_put(void *buf, uint64_t req_id, uint32_t n,
                            const uint8_t nonce[UCX_WIRE_NONCE], const uint8_t mac[UCX_WIRE_MAC]);
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

/* The macs (key: UCX_WIRE_KEY bytes).  FETCH's covers req_id, n, the nonce
 * and the n records (n * UCX_FETCH_REC_LEN bytes); DATA's covers req_id,
 * index, status, size and the FETCH's nonce.  The checks compare in
 * constant time: true when the mac is right. */
void ucx_wire_fetch_mac(const uint8_t *key, uint64_t req_id, uint32_t n,
                        const uint8_t nonce[UCX_WIRE_NONCE], const void *records,
                        uint8_t mac[UCX_WIRE_MAC]);
void ucx_wire_data_mac(const uint8_t *key, const struct ucx_data_hdr *h,
                       const uint8_t nonce[UCX_WIRE_NONCE], uint8_t mac[UCX_WIRE_MAC]);
bool ucx_wire_fetch_mac_ok(const uint8_t *key, const struct ucx_fetch_hdr *h,
                           const void *records);
bool ucx_wire_data_mac_ok(const uint8_t *key, const struct ucx_data_hdr *h,
                          const uint8_t nonce[UCX_WIRE_NONCE]);

#endif
