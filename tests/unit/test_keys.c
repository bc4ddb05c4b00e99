/*
 * test_keys.c - namespaces and keys (umbp/keys.h): pinned digests (the same
 * values Python's hashlib.blake2b gives for the byte layout in
 * docs/connector.md; connector/tests/test_keys.py checks the Python side
 * against the library), every input changes the result, bad descriptions are
 * refused naming the field, and a batch equals one-by-one derivation.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "umbp/keys.h"

static const umbp_cache_group_desc_t GROUPS[2] = {
    {"full", 16, 32, "bfloat16"},
    {"sliding_window", 16, 8, "bfloat16"},
};

static umbp_ns_desc_t llama(void)
{
    return (umbp_ns_desc_t){.model = "meta-llama/Llama-3.1-8B",
                            .revision = "main",
                            .block_size = 16,
                            .layout = "NHD",
                            .dtype = "bfloat16",
                            .groups = GROUPS,
                            .num_groups = 2,
                            .tp = 2,
                            .pp = 1,
                            .pcp = 1,
                            .dcp = 1};
}

static void hex_of(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

Test(keys, pinned_digests)
{
    umbp_ns_desc_t d = llama();
    umbp_ns_t ns, ov;
    char hex[UMBP_NS_HEX_SIZE], khex[2 * UMBP_KEY_SIZE + 1];
    cr_assert_eq(umbp_ns_derive(&d, &ns), 0);
    umbp_ns_to_hex(&ns, hex);
    cr_assert_str_eq(hex, "5a4d86d4aef73eaf6ea9ddcb8783c253");
    cr_assert_eq(umbp_ns_from_string("my-fleet", &ov), 0);
    umbp_ns_to_hex(&ov, hex);
    cr_assert_str_eq(hex, "a6417803cd0742644acc464bb3b8a3b3");

    uint8_t h[32];
    for (int i = 0; i < 32; i++)
        h[i] = (uint8_t)i;
    umbp_key_t k;
    umbp_rank_id_t r1 = {1, 0, 0, 0}, r0 = {0, 0, 0, 0};
    cr_assert_eq(umbp_keys_derive(&ns, &r1, 1, h, 32, 1, &k), 0);
    hex_of(k.bytes, UMBP_KEY_SIZE, khex);
    cr_assert_str_eq(khex, "3ed630bc974494226f4c02af0c660fbb7e48921415fe4a0b9d3856639abf3ae6");
    memset(h, 0xab, 16);
    cr_assert_eq(umbp_keys_derive(&ns, &r0, 0, h, 16, 1, &k), 0);
    hex_of(k.bytes, UMBP_KEY_SIZE, khex);
    cr_assert_str_eq(khex, "2a12d513c5db67155da762cde01a1518ae151870e4fe5e0d3759907f786ccede");
}

Test(keys, hex_round_trip_and_bad_hex)
{
    umbp_ns_t ns, back;
    char hex[UMBP_NS_HEX_SIZE];
    for (int i = 0; i < UMBP_NS_SIZE; i++)
        ns.bytes[i] = (uint8_t)(rand() & 0xff);
    umbp_ns_to_hex(&ns, hex);
    cr_assert_eq(umbp_ns_from_hex(hex, &back), 0);
    cr_assert_eq(memcmp(ns.bytes, back.bytes, UMBP_NS_SIZE), 0);
    cr_assert_eq(umbp_ns_from_hex("abc", &back), -EINVAL);
    cr_assert_eq(umbp_ns_from_hex("zz4d86d4aef73eaf6ea9ddcb8783c253", &back), -EINVAL);
    cr_assert_eq(umbp_ns_from_hex(NULL, &back), -EINVAL);
}

/* Every field of the description, and of the key, changes the digest. */
Test(keys, every_input_matters)
{
    umbp_ns_desc_t base = llama(), d;
    umbp_ns_t ref, ns;
    cr_assert_eq(umbp_ns_derive(&base, &ref), 0);
    umbp_cache_group_desc_t g2[2] = {GROUPS[0], GROUPS[1]};
#define CHANGED(stmt)                                                                   \
    do {                                                                                \
        d = base;                                                                       \
        g2[0] = GROUPS[0];                                                              \
        g2[1] = GROUPS[1];                                                              \
        d.groups = g2;                                                                  \
        stmt;                                                                           \
        cr_assert_eq(umbp_ns_derive(&d, &ns), 0);                                       \
        cr_assert_neq(memcmp(ns.bytes, ref.bytes, UMBP_NS_SIZE), 0, "unchanged: " #stmt); \
    } while (0)
    CHANGED(d.model = "meta-llama/Llama-3.1-70B");
    CHANGED(d.revision = "");
    CHANGED(d.block_size = 32);
    CHANGED(d.layout = "HND");
    CHANGED(d.dtype = "float16");
    CHANGED(d.num_groups = 1);
    CHANGED(g2[1].kind = "mamba");
    CHANGED(g2[0].block_size = 32);
    CHANGED(g2[0].num_layers = 31);
    CHANGED(g2[1].dtype = "fp8_e4m3");
    CHANGED(d.tp = 4);
    CHANGED(d.pp = 2);
    CHANGED(d.pcp = 2);
    CHANGED(d.dcp = 2);
    /* fields do not run into each other: "ab"+"c" differs from "a"+"bc" */
    CHANGED((d.model = "meta-llama/Llama-3.1-8Bm", d.revision = "ain"));
#undef CHANGED

    uint8_t h[32] = {7};
    umbp_key_t k0, k;
    umbp_rank_id_t r = {0, 0, 0, 0};
    cr_assert_eq(umbp_keys_derive(&ref, &r, 0, h, 32, 1, &k0), 0);
    umbp_rank_id_t rs[4] = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(umbp_keys_derive(&ref, &rs[i], 0, h, 32, 1, &k), 0);
        cr_assert_neq(memcmp(k.bytes, k0.bytes, UMBP_KEY_SIZE), 0, "rank field %d", i);
    }
    cr_assert_eq(umbp_keys_derive(&ref, &r, 1, h, 32, 1, &k), 0);
    cr_assert_neq(memcmp(k.bytes, k0.bytes, UMBP_KEY_SIZE), 0, "group");
    cr_assert_eq(umbp_keys_derive(&ns, &r, 0, h, 32, 1, &k), 0);
    cr_assert_neq(memcmp(k.bytes, k0.bytes, UMBP_KEY_SIZE), 0, "namespace");
    cr_assert_eq(umbp_keys_derive(&ref, &r, 0, h, 31, 1, &k), 0);
    cr_assert_neq(memcmp(k.bytes, k0.bytes, UMBP_KEY_SIZE), 0, "hash length");
}

Test(keys, batch_equals_one_by_one)
{
    enum { N = 777, HL = 32 };
    umbp_ns_desc_t d = llama();
    umbp_ns_t ns;
    cr_assert_eq(umbp_ns_derive(&d, &ns), 0);
    uint8_t *h = malloc(N * HL);
    umbp_key_t *batch = malloc(N * sizeof(*batch)), one;
    for (int i = 0; i < N * HL; i++)
        h[i] = (uint8_t)rand();
    umbp_rank_id_t r = {1, 0, 0, 0};
    cr_assert_eq(umbp_keys_derive(&ns, &r, 3, h, HL, N, batch), 0);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(umbp_keys_derive(&ns, &r, 3, h + i * HL, HL, 1, &one), 0);
        cr_assert_eq(memcmp(one.bytes, batch[i].bytes, UMBP_KEY_SIZE), 0, "key %d", i);
        if (i)
            cr_assert_neq(memcmp(batch[i - 1].bytes, batch[i].bytes, UMBP_KEY_SIZE), 0);
    }
    free(h);
    free(batch);
}

Test(keys, bad_arguments_name_the_field)
{
    umbp_ns_desc_t d;
    umbp_ns_t ns;
#define REFUSED(stmt, field)                                                      \
    do {                                                                          \
        d = llama();                                                              \
        stmt;                                                                     \
        cr_assert_eq(umbp_ns_derive(&d, &ns), -EINVAL, #stmt);                    \
        cr_assert(strstr(umbp_last_error(), field), "%s: %s", #stmt, umbp_last_error()); \
    } while (0)
    REFUSED(d.model = NULL, "model");
    REFUSED(d.model = "", "model");
    REFUSED(d.block_size = 0, "block_size");
    REFUSED(d.layout = NULL, "layout");
    REFUSED(d.dtype = "", "dtype");
    REFUSED(d.tp = 0, "tp");
    REFUSED(d.dcp = 0, "dcp");
    REFUSED(d.num_groups = 65, "num_groups");
    REFUSED((d.groups = NULL, d.num_groups = 1), "num_groups");
#undef REFUSED
    char *big = malloc(5000);
    memset(big, 'x', 4999);
    big[4999] = 0;
    d = llama();
    d.model = big;
    cr_assert_eq(umbp_ns_derive(&d, &ns), -EINVAL);
    cr_assert_eq(umbp_ns_from_string(big, &ns), -EINVAL);
    cr_assert_eq(umbp_ns_from_string("", &ns), -EINVAL);
    free(big);

    uint8_t h[65] = {0};
    umbp_key_t k;
    umbp_rank_id_t r = {0};
    cr_assert_eq(umbp_keys_derive(&ns, &r, 0, h, 0, 1, &k), -EINVAL);
    cr_assert_eq(umbp_keys_derive(&ns, &r, 0, h, 65, 1, &k), -EINVAL);
    cr_assert(strstr(umbp_last_error(), "hash_len"));
    cr_assert_eq(umbp_keys_derive(&ns, &r, 0, NULL, 32, 1, &k), -EINVAL);
    cr_assert_eq(umbp_keys_derive(&ns, &r, 0, NULL, 32, 0, NULL), 0);
}
