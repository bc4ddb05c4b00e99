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
 *   - an accepted DATA carries data only with status 0, size bytes of it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ucx_wire.h"
#include "fuzz_check.h"

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
    ucx_wire_fetch_hdr_put(out, h.req_id, h.n);
    FZ_CHECK(hlen == UCX_FETCH_HDR_LEN && !memcmp(out, hdr, hlen));
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
