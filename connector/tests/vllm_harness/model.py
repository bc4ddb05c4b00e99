"""A deterministic stand-in for a model, so that every KV byte is checkable.

- digest[p]: a 64-bit chained digest of tokens[0..p] (prefix-dependent, like
  real KV: the KV of a position depends on every token before it);
- the K/V of (rank, layer, position) is a function of digest[p] (every TP rank
  holds different bytes, as shards do);
- a Mamba state after m tokens is a function of digest[m-1];
- the next token after tokens is a function of digest[-1].

A forward pass reads the context it attends to and checks every value; a
mismatch (a block restored wrongly, or not at all) makes it emit GARBAGE
instead of the next token, so a wrong restore shows as a wrong output token.
"""
from __future__ import annotations

import numpy as np

MASK = (1 << 64) - 1
SEED = 0x9E3779B97F4A7C15
GARBAGE = -1
VOCAB = 997
MOD = 65521  # values < 2**16 are exact in float32


def mix(h: int, t: int) -> int:
    h ^= (t + 0x632BE59BD9B4E019) & MASK
    h = (h * 0xFF51AFD7ED558CCD) & MASK
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK
    h ^= h >> 29
    return h


def digests(tokens, cache: list | None = None) -> list:
    """digest[p] for p < len(tokens); reuses ``cache`` (a list of digests of
    a prefix of the same tokens) when given."""
    out = cache if cache is not None else []
    h = out[-1] if out else SEED
    for p in range(len(out), len(tokens)):
        h = mix(h, int(tokens[p]))
        out.append(h)
    return out


def next_token(dig: int) -> int:
    return int(dig % VOCAB) + 1


def generate(prompt, max_tokens: int) -> list:
    toks = list(prompt)
    d = digests(toks)
    out = []
    for _ in range(max_tokens):
        t = next_token(d[-1])
        out.append(t)
        toks.append(t)
        digests(toks, d)
    return out


def predict(tokens, n: int) -> list:
    """tokens plus the next n tokens the model would produce (async scheduling's
    placeholders: the harness knows them because the model is deterministic)."""
    toks = list(tokens)
    d = digests(toks)
    for _ in range(n):
        toks.append(next_token(d[-1]))
        digests(toks, d)
    return toks


def kv_values(dig: np.ndarray, rank: int, layer: int, heads: int, dim: int) -> np.ndarray:
    """float32 (2, len(dig), heads, dim): K and V of positions with these digests."""
    salt = (rank * 1000003 + layer * 7919 + np.arange(2)[:, None, None] * 131
            + np.arange(heads)[None, :, None] * 17 + np.arange(dim)[None, None, :]).astype(np.uint64)
    v = (dig.astype(np.uint64)[None, :, None, None] ^ salt[:, None, :, :]) % np.uint64(MOD)
    return v.astype(np.float32)


def state_values(dig: int, rank: int, layer: int, which: int, size: int) -> np.ndarray:
    salt = (rank * 1000003 + layer * 7919 + 50000 + which * 997 + np.arange(size)).astype(np.uint64)
    return ((np.uint64(dig) ^ salt) % np.uint64(MOD)).astype(np.float32)
