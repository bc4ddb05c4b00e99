"""What identifies an object: the KV cache groups, the rank topology, the key
namespace and the engine block hash of each block.  No vLLM import (duck-typed
on vLLM's config objects).

Keys: ``umbp.derive_keys(namespace, rank=(tp, pp, pcp, dcp), group=g,
hashes=identity hashes)``; one object per (rank, group, block), all layers of
the group end to end.  The data-parallel rank is not in the key, so DP ranks
and engines of one model share objects (standalone mode).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Sequence

#: vLLM's BlockPool hands out block 0 as the null block (the placeholder of
#: sliding-window and Mamba blocks that were skipped); it is never stored or loaded.
NULL_BLOCK_ID = 0

FULL, SWA, MAMBA = "full", "sliding_window", "mamba"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """One KV cache group as the connector treats it."""

    index: int  # index in kv_cache_config.kv_cache_groups (the vLLM group id)
    kind: str  # FULL | SWA | MAMBA: which blocks a hit needs and a store writes
    ns_kind: str  # what the namespace records ("full", "mla", "sliding_window", ...)
    block_size: int
    layer_names: tuple
    dtype: str
    window: int = 0  # sliding window in tokens (SWA)
    # vLLM's KVCacheSpec of the group (None for the one group of an old vLLM):
    # the KV events describe the group from it (events.py)
    spec: object = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def window_blocks(self) -> int:
        """Blocks before a hit point that a sliding-window group needs: the next
        token attends to the window-1 tokens before it (vLLM's
        ``cdiv(sliding_window - 1, block_size)``)."""
        if self.kind != SWA:
            return 0
        return max(1, cdiv(max(self.window - 1, 1), self.block_size))

    # -- which block positions a hit at k blocks (beyond local_k) needs --

    def needed(self, local_k: int, k: int) -> range:
        if self.kind == FULL:
            return range(local_k, k)
        if self.kind == SWA:
            return range(max(local_k, k - self.window_blocks), k)
        return range(k - 1, k) if k > local_k else range(0)  # Mamba: the state at k

    def to_store(self, lo: int, hi: int, total_tokens: int) -> range:
        """Block positions to store after a step that left ``total_tokens``
        computed, of which [lo, hi) are full and not stored yet."""
        if hi <= lo:
            return range(0)
        if self.kind == FULL:
            return range(lo, hi)
        if self.kind == SWA:
            # the window before the step's end point, plus one block so that a
            # hit capped one block earlier (last prompt token recomputed) works
            return range(max(lo, hi - self.window_blocks - 1), hi)
        # Mamba: the state is at total_tokens; it is a block boundary state
        # only when the step ended on one
        if total_tokens == hi * self.block_size:
            return range(hi - 1, hi)
        return range(0)


def _dtype_str(dt) -> str:
    s = str(dt)
    return s[len("torch."):] if s.startswith("torch.") else s


def _mro_names(obj) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def describe_groups(kv_cache_config, cache_config) -> list[GroupInfo]:
    """The prefix-cacheable groups of ``kv_cache_config`` (vLLM's KVCacheConfig),
    or one full-attention group when there is none (old vLLM)."""
    block_size = int(getattr(cache_config, "block_size", 16) or 16)
    groups_cfg = getattr(kv_cache_config, "kv_cache_groups", None) if kv_cache_config is not None else None
    if not groups_cfg:
        return [GroupInfo(0, FULL, "full", block_size, (), _dtype_str(getattr(cache_config, "cache_dtype", "auto")))]
    cacheable = getattr(kv_cache_config, "prefix_cacheable_group_ids", None)
    out = []
    for i, g in enumerate(groups_cfg):
        if cacheable is not None and i not in set(cacheable):
            continue
        spec = g.kv_cache_spec
        names = _mro_names(spec)
        bs = int(getattr(spec, "block_size", block_size))
        dtype = getattr(spec, "dtype", None)
        if dtype is None:
            dtypes = getattr(spec, "dtypes", None) or ()
            dtype = ",".join(_dtype_str(d) for d in dtypes) or "state"
        dtype = _dtype_str(dtype)
        layers = tuple(getattr(g, "layer_names", ()) or ())
        if "CrossAttentionSpec" in names or "EncoderOnlyAttentionSpec" in names:
            continue  # not prefix-cacheable by block hash
        if "MambaSpec" in names:
            out.append(GroupInfo(i, MAMBA, "mamba", bs, layers, dtype, spec=spec))
        elif "SlidingWindowSpec" in names or "SlidingWindowMLASpec" in names:
            w = int(getattr(spec, "sliding_window", 0) or 0)
            if w <= 0:
                raise ValueError(f"kv cache group {i}: sliding-window spec without a window")
            out.append(GroupInfo(i, SWA, "sliding_window", bs, layers, dtype, window=w, spec=spec))
        else:
            ns_kind = "mla" if "MLAAttentionSpec" in names else (
                "chunked_local" if "ChunkedLocalAttentionSpec" in names else "full")
            # chunked local attention is treated as full attention: it stores and
            # loads more than it needs, which is never wrong
            out.append(GroupInfo(i, FULL, ns_kind, bs, layers, dtype, spec=spec))
    if not out:
        raise ValueError("no prefix-cacheable KV cache group: nothing for the umbp connector to offload")
    sizes = {g.block_size for g in out}
    if len(sizes) > 1:
        raise ValueError(
            f"KV cache groups with different block sizes {sorted(sizes)} are not supported by the umbp connector"
        )
    return out


@dataclasses.dataclass(frozen=True)
class Topology:
    """Parallel sizes of one engine; a worker's linear rank is vLLM's layout
    (TP fastest, then PCP, then PP); DCP ranks are TP ranks modulo dcp."""

    tp: int = 1
    pp: int = 1
    pcp: int = 1
    dcp: int = 1
    dp_rank: int = 0

    @classmethod
    def from_vllm_config(cls, vllm_config) -> "Topology":
        pc = getattr(vllm_config, "parallel_config", None)
        g = lambda n, d=1: int(getattr(pc, n, d) or d) if pc is not None else d  # noqa: E731
        topo = cls(
            tp=g("tensor_parallel_size"),
            pp=g("pipeline_parallel_size"),
            pcp=g("prefill_context_parallel_size"),
            dcp=g("decode_context_parallel_size"),
            dp_rank=int(getattr(pc, "data_parallel_rank", 0) or 0) if pc is not None else 0,
        )
        if topo.pp > 1:
            raise ValueError("pipeline_parallel_size > 1 is not supported by the umbp connector")
        if topo.tp % topo.dcp:
            raise ValueError(f"decode_context_parallel_size {topo.dcp} must divide tensor_parallel_size {topo.tp}")
        return topo

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.pcp

    def rank_id(self, linear: int) -> tuple[int, int, int, int]:
        """(tp, pp, pcp, dcp) of a linear rank."""
        tp_r = linear % self.tp
        pcp_r = (linear // self.tp) % self.pcp
        pp_r = linear // (self.tp * self.pcp)
        return (tp_r, pp_r, pcp_r, tp_r % self.dcp)

    def linear(self, tp_r: int, pp_r: int = 0, pcp_r: int = 0) -> int:
        return tp_r + self.tp * (pcp_r + self.pcp * pp_r)

    def worker_rank(self, vllm_config, ranks: dict | None) -> int:
        if ranks is not None:
            return self.linear(ranks["tp"], ranks.get("pp", 0), ranks.get("pcp", 0))
        pc = getattr(vllm_config, "parallel_config", None)
        return int(getattr(pc, "rank", 0) or 0) % self.world_size

    def context_parallel_limit(self) -> str:
        """Why the connector must stay inert on this topology ("" when it need
        not).  With decode (or prefill) context parallelism vLLM's scheduler
        works in blocks of block_size x dcp (x pcp) tokens ("block hashes are
        computed on the original full token sequence at a granularity of
        original_block_size x dcp_world_size", its scheduler's note), and each
        DCP rank's GPU block holds an interleaved share of such a block's
        tokens.  The connector counts in cache_config.block_size blocks, so
        it would look up and store half-computed blocks under valid keys.
        Until the per-rank layout is handled, it promises no hit and stores
        nothing."""
        if self.dcp <= 1 and self.pcp <= 1:
            return ""
        return ("connector inert: decode_context_parallel_size %d / prefill_context_parallel_size %d: with "
                "context parallelism vLLM's scheduler hashes blocks of block_size x dcp x pcp tokens and "
                "each rank's GPU blocks hold an interleaved share of them, which umbp does not support "
                "yet; umbp reports no hits and stores nothing (docs/vllm.md, \"Which models get hits\")"
                % (self.dcp, self.pcp))


def derive_namespace(umbp, vllm_config, groups: Sequence[GroupInfo], topo: Topology, key_namespace: str,
                     layout: str):
    """The key namespace: key_namespace when set, else derived from what makes
    blocks interchangeable (model, revision, block size, layout, dtype, groups,
    parallel sizes)."""
    if key_namespace and key_namespace != "auto":
        return umbp.Namespace.from_string(key_namespace)
    mc = getattr(vllm_config, "model_config", None)
    cc = getattr(vllm_config, "cache_config", None)
    model = str(getattr(mc, "model", None) or getattr(mc, "served_model_name", None) or "unknown")
    sc = getattr(vllm_config, "speculative_config", None)
    draft = getattr(getattr(sc, "draft_model_config", None), "model", None) if sc is not None else None
    if draft:
        model = f"{model}+draft={draft}"
    revision = str(getattr(mc, "revision", None) or "")
    dtype = str(getattr(cc, "cache_dtype", "auto") or "auto")
    if dtype == "auto":
        dtype = _dtype_str(getattr(mc, "dtype", "auto"))
    return umbp.Namespace.derive(
        model, revision, int(groups[0].block_size), layout, dtype,
        groups=[(g.ns_kind, g.block_size, max(1, len(g.layer_names)), g.dtype) for g in groups],
        tp=topo.tp, pp=topo.pp, pcp=topo.pcp, dcp=topo.dcp,
    )


def hash_bytes(h) -> bytes:
    """One engine block hash as bytes (vLLM's BlockHash is bytes; older
    versions used ints or a NamedTuple with hash_value)."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
    else:
        v = getattr(h, "hash_value", h)
        if isinstance(v, int):
            b = (v & ((1 << 128) - 1)).to_bytes(16, "big")
        else:
            b = hashlib.blake2b(repr(v).encode(), digest_size=32).digest()
    if not 1 <= len(b) <= 64:
        b = hashlib.blake2b(b, digest_size=32).digest()
    return b


def hash_scale(block_size: int, hash_block_size: int) -> int:
    if hash_block_size <= 0 or block_size % hash_block_size:
        raise ValueError(f"hash_block_size {hash_block_size} must divide the block size {block_size}")
    return block_size // hash_block_size


def resolve_hash_block_size(option, vllm_config, block_size: int) -> int:
    if option != "auto":
        return int(option)
    cc = getattr(vllm_config, "cache_config", None)
    # vllm/config/cache.py@002f10e0cfa1 names it prefix_match_unit (None: the
    # block size); older vLLMs hash_block_size
    for name in ("prefix_match_unit", "hash_block_size"):
        v = getattr(cc, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return block_size


def gcd_all(xs) -> int:
    out = 0
    for x in xs:
        out = math.gcd(out, x)
    return out
