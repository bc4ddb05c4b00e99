/*
 * ucx_wire.c - encode and decode the FETCH and DATA active messages
 * (ucx_wire.h says the layout and what is checked).  No state, no UCX.
 */
#include "ucx_wire.h"

#include <errno.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -EPROTO;
}

static void common_put(uint8_t *p, uint16_t type, uint64_t req_id)
{
    put32(p, UCX_WIRE_MAGIC);
    put16(p + 4, UCX_WIRE_VERSION);
    put16(p + 6, type);
    put64(p + 8, req_id);
}

/* magic, version, type of a header of `want` bytes */
static int common_check(const uint8_t *p, size_t len, size_t want, uint16_t type,
                        const char *name, char *err, size_t errlen)
{
    if (len != want)
        return bad(err, errlen, "%s.header: %zu bytes, expected %zu", name, len, want);
    if (get32(p) != UCX_WIRE_MAGIC)
        return bad(err, errlen, "%s.magic: 0x%08x, expected 0x%08x", name, get32(p),
                   UCX_WIRE_MAGIC);
    if (get16(p + 4) != UCX_WIRE_VERSION)
        return bad(err, errlen, "%s.version: %u, this build speaks %u", name, get16(p + 4),
                   UCX_WIRE_VERSION);
    if (get16(p + 6) != type)
        return bad(err, errlen, "%s.type: %u, expected %u", name, get16(p + 6), type);
    return 0;
}

void ucx_wire_fetch_hdr_put(void *buf, uint64_t req_id, uint32_t n,
                            const uint8_t nonce[UCX_WIRE_NONCE], const uint8_t mac[UCX_WIRE_MAC])
{
    uint8_t *p = buf;
    common_put(p, UCX_WIRE_FETCH, req_id);
    put32(p + 16, n);
    put32(p + 20, 0);
    memcpy(p + 24, nonce, UCX_WIRE_NONCE);
    memcpy(p + 24 + UCX_WIRE_NONCE, mac, UCX_WIRE_MAC);
}

void ucx_wire_fetch_rec_put(void *rec, const umbp_key_t *key, uint64_t max_size)
{
    uint8_t *p = rec;
    memcpy(p, key->bytes, UMBP_KEY_SIZE);
    put64(p + UMBP_KEY_SIZE, max_size);
}

void ucx_wire_data_hdr_put(void *buf, const struct ucx_data_hdr *h)
{
    uint8_t *p = buf;
    common_put(p, UCX_WIRE_DATA, h->req_id);
    put32(p + 16, h->index);
    put32(p + 20, (uint32_t)h->status);
    put64(p + 24, h->size);
    memcpy(p + 32, h->mac, UCX_WIRE_MAC);
}

int ucx_wire_fetch_parse(const void *hdr, size_t hdrlen, const void *data, size_t datalen,
                         struct ucx_fetch_hdr *out, char *err, size_t errlen)
{
    const uint8_t *p = hdr;
    int rc = common_check(p, hdrlen, UCX_FETCH_HDR_LEN, UCX_WIRE_FETCH, "FETCH", err, errlen);
    if (rc)
        return rc;
    uint32_t n = get32(p + 16), flags = get32(p + 20);
    if (n == 0 || n > UCX_FETCH_MAX_KEYS)
        return bad(err, errlen, "FETCH.n: %u outside 1..%u", n, UCX_FETCH_MAX_KEYS);
    if (flags != 0)
        return bad(err, errlen, "FETCH.flags: 0x%x, none are defined", flags);
    if (datalen != (size_t)n * UCX_FETCH_REC_LEN)
        return bad(err, errlen, "FETCH.records: %zu bytes for n = %u, expected %zu", datalen, n,
                   (size_t)n * UCX_FETCH_REC_LEN);
    const uint8_t *d = data;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t max = get64(d + (size_t)i * UCX_FETCH_REC_LEN + UMBP_KEY_SIZE);
        if (max == 0 || max > UCX_OBJ_MAX)
            return bad(err, errlen, "FETCH.max_size[%u]: %llu outside 1..%llu", i,
                       (unsigned long long)max, (unsigned long long)UCX_OBJ_MAX);
    }
    out->req_id = get64(p + 8);
    out->n = n;
    memcpy(out->nonce, p + 24, UCX_WIRE_NONCE);
    memcpy(out->mac, p + 24 + UCX_WIRE_NONCE, UCX_WIRE_MAC);
    return 0;
}

void ucx_wire_fetch_rec(const void *data, uint32_t i, struct ucx_fetch_rec *out)
{
    const uint8_t *p = (const uint8_t *)data + (size_t)i * UCX_FETCH_REC_LEN;
    memcpy(out->key.bytes, p, UMBP_KEY_SIZE);
    out->max_size = get64(p + UMBP_KEY_SIZE);
}

int ucx_wire_data_parse(const void *hdr, size_t hdrlen, size_t datalen, struct ucx_data_hdr *out,
                        char *err, size_t errlen)
{
    const uint8_t *p = hdr;
    int rc = common_check(p, hdrlen, UCX_DATA_HDR_LEN, UCX_WIRE_DATA, "DATA", err, errlen);
    if (rc)
        return rc;
    uint32_t index = get32(p + 16);
    int32_t status = (int32_t)get32(p + 20);
    uint64_t size = get64(p + 24);
    if (index >= UCX_FETCH_MAX_KEYS)
        return bad(err, errlen, "DATA.index: %u, a FETCH has at most %u keys", index,
                   UCX_FETCH_MAX_KEYS);
    if (status != 0 && status != -ENOENT && status != -EMSGSIZE && status != -EIO &&
        status != -EACCES)
        return bad(err, errlen, "DATA.status: %d, expected 0, -ENOENT, -EMSGSIZE, -EIO or "
                   "-EACCES", status);
    if (size > UCX_OBJ_MAX)
        return bad(err, errlen, "DATA.size: %llu over %llu", (unsigned long long)size,
                   (unsigned long long)UCX_OBJ_MAX);
    if (status == 0 && datalen != size)
        return bad(err, errlen, "DATA.data: %zu bytes for size %llu", datalen,
                   (unsigned long long)size);
    if (status != 0 && datalen != 0)
        return bad(err, errlen, "DATA.data: %zu bytes with status %d (a failure carries none)",
                   datalen, status);
    out->req_id = get64(p + 8);
    out->index = index;
    out->status = status;
    out->size = size;
    memcpy(out->mac, p + 32, UCX_WIRE_MAC);
    return 0;
}

/* ---- the macs ------------------------------------------------------------------- */

void ucx_wire_fetch_mac(const uint8_t *key, uint64_t req_id, uint32_t n,
                        const uint8_t nonce[UCX_WIRE_NONCE], const void *records,
                        uint8_t mac[UCX_WIRE_MAC])
{
    crypto_generichash_state st;
    uint8_t f[16 + UCX_WIRE_NONCE];
    memcpy(f, "umbp-fetch", 10); /* the domain: a FETCH's mac is no DATA's */
    put16(f + 10, UCX_WIRE_VERSION);
    put32(f + 12, n);
    memcpy(f + 16, nonce, UCX_WIRE_NONCE);
    uint8_t id[8];
    put64(id, req_id);
    crypto_generichash_init(&st, key, UCX_WIRE_KEY, UCX_WIRE_MAC);
    crypto_generichash_update(&st, f, sizeof(f));
    crypto_generichash_update(&st, id, sizeof(id));
    crypto_generichash_update(&st, records, (size_t)n * UCX_FETCH_REC_LEN);
    crypto_generichash_final(&st, mac, UCX_WIRE_MAC);
}

void ucx_wire_data_mac(const uint8_t *key, const struct ucx_data_hdr *h,
                       const uint8_t nonce[UCX_WIRE_NONCE], uint8_t mac[UCX_WIRE_MAC])
{
    uint8_t f[10 + 2 + 8 + 4 + 4 + 8 + UCX_WIRE_NONCE];
    memcpy(f, "umbp-data.", 10);
    put16(f + 10, UCX_WIRE_VERSION);
    put64(f + 12, h->req_id);
    put32(f + 20, h->index);
    put32(f + 24, (uint32_t)h->status);
    put64(f + 28, h->size);
    memcpy(f + 36, nonce, UCX_WIRE_NONCE);
    crypto_generichash(mac, UCX_WIRE_MAC, f, sizeof(f), key, UCX_WIRE_KEY);
}

bool ucx_wire_fetch_mac_ok(const uint8_t *key, const struct ucx_fetch_hdr *h,
                           const void *records)
{
    uint8_t want[UCX_WIRE_MAC];
    ucx_wire_fetch_mac(key, h->req_id, h->n, h->nonce, records, want);
    return sodium_memcmp(want, h->mac, UCX_WIRE_MAC) == 0;
}

bool ucx_wire_data_mac_ok(const uint8_t *key, const struct ucx_data_hdr *h,
                          const uint8_t nonce[UCX_WIRE_NONCE])
{
    uint8_t want[UCX_WIRE_MAC];
    ucx_wire_data_mac(key, h, nonce, want);
    return sodium_memcmp(want, h->mac, UCX_WIRE_MAC) == 0;
}
