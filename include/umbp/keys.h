/*
 * umbp/keys.h - the keys an engine's blocks are stored under.
 *
 * A key is derived from (namespace, rank identity, cache group, engine block
 * hash) with BLAKE2b (libsodium), so the same block of the same model on the
 * same rank gets the same key in every process, every engine and every
 * language: the Python package derives identical keys with hashlib.blake2b
 * (docs/connector.md gives the byte layout).  The data-parallel rank is not
 * part of a key, so DP ranks and engines of one model share objects.
 *
 * The namespace is 16 bytes derived from what makes blocks interchangeable:
 * model, revision, block size, layout, dtype, cache groups and the parallel
 * sizes (tp, pp, pcp, dcp); a user may override it with any string
 * (`key_namespace`).  Thread-safe; no runtime needed.
 */
#ifndef UMBP_KEYS_H
#define UMBP_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "umbp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UMBP_NS_SIZE 16
#define UMBP_NS_HEX_SIZE (2 * UMBP_NS_SIZE + 1) /* with the NUL */
#define UMBP_BLOCK_HASH_MAX 64                  /* bytes of one engine block hash */

typedef struct umbp_ns {
    uint8_t bytes[UMBP_NS_SIZE];
} umbp_ns_t;

/* One KV cache group of the engine (vLLM's kv_cache_groups). */
typedef struct umbp_cache_group_desc {
    const char *kind;    /* "full", "sliding_window", "mamba", "mla", ... */
    uint32_t block_size; /* tokens per block of this group */
    uint32_t num_layers;
    const char *dtype;   /* "bfloat16", "float16", "fp8_e4m3", ... */
} umbp_cache_group_desc_t;

typedef struct umbp_ns_desc {
    const char *model;    /* required, non-empty */
    const char *revision; /* NULL or "" when unknown */
    uint32_t block_size;  /* >= 1 */
    const char *layout;   /* "NHD", "HND", "cross_layer", ... (required) */
    const char *dtype;    /* required */
    const umbp_cache_group_desc_t *groups;
    uint32_t num_groups;  /* 0 .. 64 */
    uint32_t tp, pp, pcp, dcp; /* parallel sizes, each >= 1 */
} umbp_ns_desc_t;

/* Which shard of a block a rank holds. */
typedef struct umbp_rank_id {
    uint32_t tp, pp, pcp, dcp;
} umbp_rank_id_t;

/* Derives the namespace.  -EINVAL (umbp_last_error() names the field) for a
 * missing string, a size of 0, more than 64 groups or a string over 4096
 * bytes. */
UMBP_API int umbp_ns_derive(const umbp_ns_desc_t *desc, umbp_ns_t *out);

/* The namespace of a user's `key_namespace` string (non-empty, <= 4096
 * bytes; -EINVAL otherwise). */
UMBP_API int umbp_ns_from_string(const char *s, umbp_ns_t *out);

/* 32 lowercase hex characters and a NUL into hex[UMBP_NS_HEX_SIZE]. */
UMBP_API void umbp_ns_to_hex(const umbp_ns_t *ns, char hex[UMBP_NS_HEX_SIZE]);
/* Parses exactly 32 hex characters; -EINVAL otherwise. */
UMBP_API int umbp_ns_from_hex(const char *hex, umbp_ns_t *out);

/*
 * Derives n keys of one rank and cache group: out[i] from the engine's block
 * hash hashes[i * hash_len .. (i + 1) * hash_len).  hash_len is 1 ..
 * UMBP_BLOCK_HASH_MAX (vLLM's sha256 block hashes are 32 bytes).  -EINVAL for
 * a bad hash_len or a NULL pointer with n > 0.  About 0.3 us per key.
 */
UMBP_API int umbp_keys_derive(const umbp_ns_t *ns, const umbp_rank_id_t *rank, uint32_t group,
                              const void *hashes, size_t hash_len, size_t n, umbp_key_t *out);

#ifdef __cplusplus
}
#endif
#endif /* UMBP_KEYS_H */
