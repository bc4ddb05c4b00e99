/*
 * dist_keys.h - the keys of umbp-dist-node (tests/integration/dist_node.c)
 * as functions of (space, seed, i), so a test process computes the keys a
 * node stored: space 1 for put/get keys, 2 for kv keys.  Header only.
 */
#ifndef UMBP_TEST_DIST_KEYS_H
#define UMBP_TEST_DIST_KEYS_H

#include <stdint.h>
#include <string.h>

#include "umbp/umbp.h"

static inline uint64_t dist_splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline umbp_key_t dist_key_of(uint64_t space, uint64_t seed, uint64_t i)
{
    umbp_key_t k;
    uint64_t s = dist_splitmix64(dist_splitmix64(space ^ 0x756d6270ull) ^ seed) ^
                 (i * 0x100000001b3ull);
    for (int w = 0; w < UMBP_KEY_SIZE / 8; w++) {
        s = dist_splitmix64(s);
        memcpy(&k.bytes[w * 8], &s, 8);
    }
    return k;
}

#endif
