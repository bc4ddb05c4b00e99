/*
 * fuzz_ucx_wire.c - the decoders of the remote fetch's active messages
 * (net/ucx_wire.c): FETCH, which an owner receives, and DATA, which a
 * requester receives, both from another process.
 *
 * Input: byte 0 picks the decoder (even: FETCH, odd: DATA), bytes 1-2 the
 * header's length (little-endian, capped by what is left), then the header,
 * then the message's data.  Properties, each an abort() when broken:
 *   - the decoder answers 0 or -EPROTO, and -EPROTO names a field
 *     ("FETCH.<field>: ..." or "DATA.<field>: ...");
 *   - an accepted message re-encodes with the builders into exactly the
 *     bytes it was parsed from (header and, for FETCH, every record), and
 *     its count matches the data's length;
 *   - an accepted DATA carries data only with status 0, size bytes of it;
 *   - the macs (a fixed key): the parsed mac is accepted exactly when it is
 *     the one the builder's side computes over the parsed fields, nonce and
 *     records; that mac is accepted, and not after one bit of the nonce, of
 *     a record or of a field (req_id, index, status, size) changes, nor
 *     under another key.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ucx_wire.h"
#include "fuzz_check.h"

static const uint8_t key[UCX_WIRE_KEY] = "fuzz-ucx-wire key, 32 bytes....";

static void check_fetch(const uint8_t *hdr, size_t hlen, const uint8_t *data, size_t dlen)
{
    char err[160] = "";
    struct ucx_fetch_hdr h;
    int rc = ucx_wire_fetch_parse(hdr, hlen, data, dlen, &h, err, sizeof(err));
    if (rc) {
        FZ_CHECK(rc == -EPROTO);
        FZ_CHECK(!strncmp(err, "FETCH.", 6) && strchr(err, ':'));
        return;
    }
    FZ_CHECK(h.n >= 1 && h.n <= UCX_FETCH_MAX_KEYS);
    FZ_CHECK(dlen == (size_t)h.n * UCX_FETCH_REC_LEN);
    uint8_t out[UCX_FETCH_HDR_LEN];
    ucx_wire_fetch_hdr_put(out, h.req_id, h.n, h.nonce, h.mac);
    FZ_CHECK(hlen == UCX_FETCH_HDR_LEN && !memcmp(out, hdr, hlen));
    uint8_t mac[UCX_WIRE_MAC];
    ucx_wire_fetch_mac(key, h.req_id, h.n, h.nonce, data, mac);
    FZ_CHECK(ucx_wire_fetch_mac_ok(key, &h, data) == !memcmp(mac, h.mac, UCX_WIRE_MAC));
    struct ucx_fetch_hdr g = h;
    memcpy(g.mac, mac, UCX_WIRE_MAC);
    FZ_CHECK(ucx_wire_fetch_mac_ok(key, &g, data));
    g.nonce[h.req_id % UCX_WIRE_NONCE] ^= (uint8_t)(1u << (h.n % 8));
    FZ_CHECK(!ucx_wire_fetch_mac_ok(key, &g, data));
    g.nonce[h.req_id % UCX_WIRE_NONCE] = h.nonce[h.req_id % UCX_WIRE_NONCE];
    g.req_id ^= 1;
    FZ_CHECK(!ucx_wire_fetch_mac_ok(key, &g, data));
    g.req_id = h.req_id;
    uint8_t *copy = malloc(dlen);
    FZ_CHECK(copy);
    memcpy(copy, data, dlen);
    copy[(h.req_id >> 8) % dlen] ^= 0x80;
    FZ_CHECK(!ucx_wire_fetch_mac_ok(key, &g, copy));
    free(copy);
    for (uint32_t i = 0; i < h.n; i++) {
        struct ucx_fetch_rec r;
        uint8_t rec[UCX_FETCH_REC_LEN];
        ucx_wire_fetch_rec(data, i, &r);
        FZ_CHECK(r.max_size >= 1 && r.max_size <= UCX_OBJ_MAX);
        ucx_wire_fetch_rec_put(rec, &r.key, r.max_size);
        FZ_CHECK(!memcmp(rec, data + (size_t)i * UCX_FETCH_REC_LEN, UCX_FETCH_REC_LEN));
    }
}

static void check_data(const uint8_t *hdr, size_t hlen, size_t dlen)
{
    char err[160] = "";
    struct ucx_data_hdr h;
    int rc = ucx_wire_data_parse(hdr, hlen, dlen, &h, err, sizeof(err));
    if (rc) {
        FZ_CHECK(rc == -EPROTO);
        FZ_CHECK(!strncmp(err, "DATA.", 5) && strchr(err, ':'));
        return;
    }
    FZ_CHECK(h.index < UCX_FETCH_MAX_KEYS && h.size <= UCX_OBJ_MAX);
    FZ_CHECK(h.status == 0 ? dlen == h.size : dlen == 0);
    uint8_t out[UCX_DATA_HDR_LEN];
    ucx_wire_data_hdr_put(out, &h);
    FZ_CHECK(hlen == UCX_DATA_HDR_LEN && !memcmp(out, hdr, hlen));
    uint8_t nonce[UCX_WIRE_NONCE], mac[UCX_WIRE_MAC];
    memcpy(nonce, hdr, UCX_WIRE_NONCE); /* any 16 bytes: the header's first */
    ucx_wire_data_mac(key, &h, nonce, mac);
    FZ_CHECK(ucx_wire_data_mac_ok(key, &h, nonce) == !memcmp(mac, h.mac, UCX_WIRE_MAC));
    struct ucx_data_hdr g = h;
    memcpy(g.mac, mac, UCX_WIRE_MAC);
    FZ_CHECK(ucx_wire_data_mac_ok(key, &g, nonce));
    g.size ^= 1;
    FZ_CHECK(!ucx_wire_data_mac_ok(key, &g, nonce));
    g.size = h.size;
    g.status ^= 1;
    FZ_CHECK(!ucx_wire_data_mac_ok(key, &g, nonce));
    g.status = h.status;
    g.index ^= 1u << (h.size % 10); /* another key of the fetch */
    FZ_CHECK(!ucx_wire_data_mac_ok(key, &g, nonce));
    g.index = h.index;
    g.req_id ^= 1ull << (h.index % 64); /* another fetch */
    FZ_CHECK(!ucx_wire_data_mac_ok(key, &g, nonce));
    g.req_id = h.req_id;
    /* another key: nothing this key made passes */
    uint8_t other[UCX_WIRE_KEY];
    memcpy(other, key, sizeof(other));
    other[h.index % UCX_WIRE_KEY] ^= 1;
    FZ_CHECK(!ucx_wire_data_mac_ok(other, &g, nonce));
    nonce[h.index % UCX_WIRE_NONCE] ^= 4;
    FZ_CHECK(!ucx_wire_data_mac_ok(key, &g, nonce));
}

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len)
{
    if (len < 3)
        return 0;
    size_t hlen = (size_t)buf[1] | ((size_t)buf[2] << 8);
    if (hlen > len - 3)
        hlen = len - 3;
    /* copies, so ASan sees reads past either part */
    uint8_t *hdr = malloc(hlen ? hlen : 1);
    size_t dlen = len - 3 - hlen;
    uint8_t *data = malloc(dlen ? dlen : 1);
    memcpy(hdr, buf + 3, hlen);
    memcpy(data, buf + 3 + hlen, dlen);
    if (buf[0] & 1)
        check_data(hdr, hlen, dlen);
    else
        check_fetch(hdr, hlen, data, dlen);
    free(hdr);
    free(data);
    return 0;
}
