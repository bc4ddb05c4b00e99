"""Fake vllm/v1/kv_cache_interface.py (vllm.md §2 specs)."""
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: object = "float32"


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    sliding_window: int | None = None


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    pass


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = 0


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    shapes: tuple = ()
    dtypes: tuple = ()
    mamba_cache_mode: str = "align"


@dataclass
class KVCacheTensor:
    size: int
    shared_by: list


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list = field(default_factory=list)
    kv_cache_groups: list = field(default_factory=list)


# The group descriptions newer vLLMs put in BlockStored (kv_cache_spec_kind,
# kv_cache_spec_sliding_window, the fields of kv_events.py@0181ea3173e5's
# BlockStored), from two functions of kv_cache_interface.py that vLLM's own
# OffloadingConnector applies to each group's spec.  No vllm-project/vllm
# commit stored for this project has them (kv_cache_interface.py@bc8282e6
# does not); the kind names are those of the trees derived from vLLM that do.
# Present with every API whose BlockStored has the fields (not "old").
import enum  # noqa: E402

import vllm  # noqa: E402

if vllm.API != "old":

    class KVCacheSpecKind(str, enum.Enum):
        FULL_ATTENTION = "full_attention"
        MLA_ATTENTION = "mla_attention"
        SLIDING_WINDOW = "sliding_window"
        SLIDING_WINDOW_MLA = "sliding_window_mla"
        MAMBA = "mamba"
        UNKNOWN = "unknown"

    def get_kv_cache_spec_kind(spec):
        if isinstance(spec, MambaSpec):
            return KVCacheSpecKind.MAMBA
        if isinstance(spec, SlidingWindowSpec):
            return KVCacheSpecKind.SLIDING_WINDOW
        if isinstance(spec, MLAAttentionSpec):
            return KVCacheSpecKind.MLA_ATTENTION
        if isinstance(spec, FullAttentionSpec):
            return KVCacheSpecKind.FULL_ATTENTION
        return KVCacheSpecKind.UNKNOWN

    def get_kv_cache_spec_sliding_window(spec):
        return spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None
