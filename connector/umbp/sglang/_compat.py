"""SGLang's types, or stand-ins for them where SGLang is not installed.

Inside SGLang the backend must subclass SGLang's own ``HiCacheStorage`` (the
``dynamic`` factory checks ``issubclass``) and ``get_stats`` must return
SGLang's ``StorageMetrics`` (its collector asserts ``isinstance``), so the real
classes are used whenever ``sglang`` imports.  Without SGLang (tests, tools)
the stand-ins below have the same names, fields and defaults as SGLang's at
the commit named in docs/sglang.md, and nothing more.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, List, Optional

try:  # pragma: no cover - exercised only where SGLang is installed
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )
    HAVE_SGLANG = True
except Exception:  # ImportError, or a SGLang that fails to import here
    HAVE_SGLANG = False

    @dataclass
    class HiCacheStorageConfig:  # type: ignore[no-redef]
        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        dp_rank: int = 0
        dp_size: int = 1
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    @dataclass
    class HiCacheStorageExtraInfo:  # type: ignore[no-redef]
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class HiCacheStorage(ABC):  # type: ignore[no-redef]
        """The abstract methods and defaults of SGLang's HiCacheStorage."""

        def register_mem_pool_host(self, mem_pool_host: Any):
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
            raise NotImplementedError()

        def batch_get_v2(self, transfers, extra_info=None):
            raise NotImplementedError()

        def batch_set_v2(self, transfers, extra_info=None):
            raise NotImplementedError()

        def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
            raise NotImplementedError()

        def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
            raise NotImplementedError()

        @abstractmethod
        def get(self, key, target_location=None, target_sizes=None):
            pass

        @abstractmethod
        def batch_get(self, keys, target_locations=None, target_sizes=None):
            pass

        @abstractmethod
        def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
            pass

        @abstractmethod
        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
            pass

        @abstractmethod
        def exists(self, key) -> bool:
            pass

        def batch_exists(self, keys, extra_info=None) -> int:
            for i in range(len(keys)):
                if not self.exists(keys[i]):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None

# SGLang's StorageMetricsCollector.log_storage_metrics asserts isinstance(x,
# StorageMetrics) on the scheduler thread, so get_stats must return SGLang's
# own class: newer SGLang defines it in observability/metrics_collector.py
# (at 016d8605e458, with a defaulted prefetch_stats field), older SGLang in
# metrics/collector.py.  The stand-in is only for running without SGLang.
StorageMetrics = None
for _mod in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
    try:  # pragma: no cover - exercised only where SGLang is installed
        StorageMetrics = getattr(__import__(_mod, fromlist=["StorageMetrics"]), "StorageMetrics", None)
    except Exception:
        StorageMetrics = None
    if StorageMetrics is not None:
        break
del _mod
HAVE_SGLANG_METRICS = StorageMetrics is not None
if StorageMetrics is None:
    @dataclass
    class StorageMetrics:  # type: ignore[no-redef]
        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)

# The v2 (multi-pool) types: SGLang's where it has them (hicache_storage.py at
# 001067ff), else stand-ins with the same names, fields and defaults.
try:  # pragma: no cover
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
        PoolTransferResult,
    )
except Exception:
    from enum import Enum

    class PoolName(str, Enum):  # type: ignore[no-redef]
        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"
        DEEPSEEK_V4_C4 = "deepseek_v4_c4"
        DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
        DEEPSEEK_V4_C128 = "deepseek_v4_c128"
        DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
        DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
        DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
        DRAFT = "draft"
        DRAFT_INDEXER = "draft_indexer"
        DRAFT_SWA = "draft_swa"

        def __str__(self) -> str:
            return self.value

    class PoolHitPolicy(str, Enum):  # type: ignore[no-redef]
        """ALL_PAGES: every page in [0, kv_hit) must exist (e.g. DSA);
        TRAILING_PAGES: only the last N pages must exist (Mamba/SWA state)."""
        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"

    @dataclass
    class PoolTransfer:  # type: ignore[no-redef]
        name: Any
        host_indices: Any = None
        device_indices: Any = None
        keys: Optional[List[str]] = None
        hit_policy: Any = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Any = None

    @dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        kv_hit_pages: int
        extra_pool_hit_pages: dict

        @classmethod
        def empty(cls):
            return cls(0, {})
