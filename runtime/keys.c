/*
 * keys.c - namespaces and keys (umbp/keys.h), BLAKE2b from libsodium.
 *
 * Every message is a sequence of fields: a string is its length (u32, little
 * endian) then its bytes; an integer is a u32, little endian; a namespace is
 * its 16 raw bytes.  The first field is a version tag, so a change of layout
 * changes every key.  connector/umbp/keys.py encodes the same fields for
 * hashlib.blake2b and tests/test_keys.c pins known digests.
 */
#include <errno.h>
#include <sodium.h>
#include <stdbool.h>
#include <string.h>

#include "par.h"
#include "umbp/keys.h"
#include "util.h"

#define STR_MAX 4096u
#define GROUPS_MAX 64u

static const char *const NS_TAG = "umbp-ns-v1";
static const char *const NS_OVERRIDE_TAG = "umbp-ns-override-v1";
static const char *const KEY_TAG = "umbp-key-v1";

static int sodium_ready(void)
{
    if (sodium_init() < 0) {
        umbp_set_error("libsodium failed to initialise");
        return -EIO;
    }
    return 0;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void h_u32(crypto_generichash_state *st, uint32_t v)
{
    uint8_t b[4];
    put_u32(b, v);
    crypto_generichash_update(st, b, 4);
}

static void h_bytes(crypto_generichash_state *st, const void *p, size_t len)
{
    h_u32(st, (uint32_t)len);
    crypto_generichash_update(st, p, len);
}

static void h_str(crypto_generichash_state *st, const char *s)
{
    h_bytes(st, s, strlen(s));
}

static int check_str(const char *s, const char *field, bool may_be_empty)
{
    if (!s || (!may_be_empty && !s[0])) {
        umbp_set_error("namespace: %s is required", field);
        return -EINVAL;
    }
    if (strlen(s) > STR_MAX) {
        umbp_set_error("namespace: %s is longer than %u bytes", field, STR_MAX);
        return -EINVAL;
    }
    return 0;
}

static int check_size(uint32_t v, const char *field)
{
    if (v == 0) {
        umbp_set_error("namespace: %s must be >= 1", field);
        return -EINVAL;
    }
    return 0;
}

static int check_desc(const umbp_ns_desc_t *d)
{
    int rc;
    if ((rc = check_str(d->model, "model", false)) < 0 ||
        (rc = check_str(d->revision ? d->revision : "", "revision", true)) < 0 ||
        (rc = check_size(d->block_size, "block_size")) < 0 ||
        (rc = check_str(d->layout, "layout", false)) < 0 ||
        (rc = check_str(d->dtype, "dtype", false)) < 0 || (rc = check_size(d->tp, "tp")) < 0 ||
        (rc = check_size(d->pp, "pp")) < 0 || (rc = check_size(d->pcp, "pcp")) < 0 ||
        (rc = check_size(d->dcp, "dcp")) < 0)
        return rc;
    if (d->num_groups > GROUPS_MAX || (d->num_groups && !d->groups)) {
        umbp_set_error("namespace: num_groups must be 0 .. %u with groups given", GROUPS_MAX);
        return -EINVAL;
    }
    for (uint32_t g = 0; g < d->num_groups; g++) {
        const umbp_cache_group_desc_t *gr = &d->groups[g];
        if ((rc = check_str(gr->kind, "groups[].kind", false)) < 0 ||
            (rc = check_size(gr->block_size, "groups[].block_size")) < 0 ||
            (rc = check_size(gr->num_layers, "groups[].num_layers")) < 0 ||
            (rc = check_str(gr->dtype, "groups[].dtype", false)) < 0)
            return rc;
    }
    return 0;
}

int umbp_ns_derive(const umbp_ns_desc_t *d, umbp_ns_t *out)
{
    int rc;
    if (!d || !out) {
        umbp_set_error("umbp_ns_derive: NULL argument");
        return -EINVAL;
    }
    if ((rc = check_desc(d)) < 0 || (rc = sodium_ready()) < 0)
        return rc;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, UMBP_NS_SIZE);
    h_str(&st, NS_TAG);
    h_str(&st, d->model);
    h_str(&st, d->revision ? d->revision : "");
    h_u32(&st, d->block_size);
    h_str(&st, d->layout);
    h_str(&st, d->dtype);
    h_u32(&st, d->num_groups);
    for (uint32_t g = 0; g < d->num_groups; g++) {
        h_str(&st, d->groups[g].kind);
        h_u32(&st, d->groups[g].block_size);
        h_u32(&st, d->groups[g].num_layers);
        h_str(&st, d->groups[g].dtype);
    }
    h_u32(&st, d->tp);
    h_u32(&st, d->pp);
    h_u32(&st, d->pcp);
    h_u32(&st, d->dcp);
    crypto_generichash_final(&st, out->bytes, UMBP_NS_SIZE);
    return 0;
}

int umbp_ns_from_string(const char *s, umbp_ns_t *out)
{
    int rc;
    if (!out) {
        umbp_set_error("umbp_ns_from_string: NULL argument");
        return -EINVAL;
    }
    if ((rc = check_str(s, "key_namespace", false)) < 0 || (rc = sodium_ready()) < 0)
        return rc;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, UMBP_NS_SIZE);
    h_str(&st, NS_OVERRIDE_TAG);
    h_str(&st, s);
    crypto_generichash_final(&st, out->bytes, UMBP_NS_SIZE);
    return 0;
}

void umbp_ns_to_hex(const umbp_ns_t *ns, char hex[UMBP_NS_HEX_SIZE])
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < UMBP_NS_SIZE; i++) {
        hex[2 * i] = digits[ns->bytes[i] >> 4];
        hex[2 * i + 1] = digits[ns->bytes[i] & 15];
    }
    hex[2 * UMBP_NS_SIZE] = '\0';
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int umbp_ns_from_hex(const char *hex, umbp_ns_t *out)
{
    if (!hex || !out || strlen(hex) != 2 * UMBP_NS_SIZE) {
        umbp_set_error("namespace: expected %u hex characters", 2 * UMBP_NS_SIZE);
        return -EINVAL;
    }
    for (size_t i = 0; i < UMBP_NS_SIZE; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            umbp_set_error("namespace: '%s' is not hex", hex);
            return -EINVAL;
        }
        out->bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* Keys [lo, hi) of a batch: the common prefix, then each block hash. */
struct derive_job {
    const uint8_t *prefix;
    size_t prefix_len;
    const uint8_t *hashes;
    size_t hash_len;
    umbp_key_t *out;
};

#define DERIVE_PAR_MIN 128 /* keys: below, a helper's wake-up costs more than it saves */
#define DERIVE_CHUNK 32

static void derive_range(void *arg, size_t lo, size_t hi)
{
    const struct derive_job *j = arg;
    uint8_t msg[4 + 16 + UMBP_NS_SIZE + 5 * 4 + 4 + UMBP_BLOCK_HASH_MAX];
    memcpy(msg, j->prefix, j->prefix_len);
    for (size_t i = lo; i < hi; i++) {
        memcpy(msg + j->prefix_len, j->hashes + i * j->hash_len, j->hash_len);
        crypto_generichash(j->out[i].bytes, UMBP_KEY_SIZE, msg, j->prefix_len + j->hash_len, NULL, 0);
    }
}

int umbp_keys_derive(const umbp_ns_t *ns, const umbp_rank_id_t *rank, uint32_t group,
                     const void *hashes, size_t hash_len, size_t n, umbp_key_t *out)
{
    if (!ns || !rank || (n && (!hashes || !out))) {
        umbp_set_error("umbp_keys_derive: NULL argument");
        return -EINVAL;
    }
    if (hash_len == 0 || hash_len > UMBP_BLOCK_HASH_MAX) {
        umbp_set_error("umbp_keys_derive: hash_len %zu outside 1 .. %d", hash_len,
                       UMBP_BLOCK_HASH_MAX);
        return -EINVAL;
    }
    int rc = sodium_ready();
    if (rc < 0)
        return rc;
    /* Everything before the block hash is the same for the batch. */
    size_t tag = strlen(KEY_TAG);
    uint8_t msg[4 + 16 + UMBP_NS_SIZE + 5 * 4 + 4 + UMBP_BLOCK_HASH_MAX];
    size_t off = 0;
    put_u32(msg + off, (uint32_t)tag);
    memcpy(msg + 4, KEY_TAG, tag);
    off = 4 + tag;
    memcpy(msg + off, ns->bytes, UMBP_NS_SIZE);
    off += UMBP_NS_SIZE;
    const uint32_t ids[5] = {rank->tp, rank->pp, rank->pcp, rank->dcp, group};
    for (int i = 0; i < 5; i++, off += 4)
        put_u32(msg + off, ids[i]);
    put_u32(msg + off, (uint32_t)hash_len);
    off += 4;
    struct derive_job job = {msg, off, hashes, hash_len, out};
    /* one compression per key (~0.2 us): large batches on several cores */
    if (n >= DERIVE_PAR_MIN)
        par_for(n, DERIVE_CHUNK, derive_range, &job);
    else
        derive_range(&job, 0, n);
    return 0;
}
