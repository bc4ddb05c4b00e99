"""Connector statistics (vLLM's KVConnectorStats) and Prometheus metrics
(vLLM's KVConnectorPromMetrics, when this vLLM has it).

Counters are plain ints in ``data`` so the object pickles across processes;
``aggregate`` sums them (workers, and the scheduler's lookup counters).
"""

from __future__ import annotations

import dataclasses

from . import _compat
from ._compat import KVConnectorStats

COUNTERS = (
    "lookups",  # scheduler lookups (one per request and attempt)
    "lookup_errors",  # lookups that failed (counted as misses)
    "lookup_query_tokens",  # tokens asked beyond the local hit
    "lookup_hit_tokens",  # tokens found beyond the local hit
    "load_jobs", "load_blocks_ok", "load_blocks_failed", "load_bytes",
    "store_jobs", "store_blocks_ok", "store_blocks_failed", "store_bytes",
    "submit_errors",  # whole-batch errors at submission (-EAGAIN, not attempted, ...)
    "quarantined_blocks",  # blocks counted as misses by the scheduler's quarantine
)
TIMES = ("load_seconds", "store_seconds")  # submission -> completion seen, summed over jobs


@dataclasses.dataclass
class UMBPConnectorStats(KVConnectorStats):
    data: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.data:
            self.reset()

    def reset(self):
        self.data = {k: 0 for k in COUNTERS}
        self.data.update({k: 0.0 for k in TIMES})

    def add(self, key: str, v=1):
        self.data[key] = self.data.get(key, 0) + v

    def aggregate(self, other):
        if other is None:
            return self
        for k, v in (getattr(other, "data", None) or {}).items():
            if isinstance(v, (int, float)):
                self.data[k] = self.data.get(k, 0) + v
        return self

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in COUNTERS)

    def reduce(self) -> dict:
        d = self.data
        asked = d.get("lookup_query_tokens", 0)
        out = {
            "Lookups": d.get("lookups", 0),
            "Lookup hit rate (tokens)": round(d.get("lookup_hit_tokens", 0) / asked, 4) if asked else 0.0,
            "Loaded blocks": d.get("load_blocks_ok", 0),
            "Failed loads (blocks)": d.get("load_blocks_failed", 0),
            "Stored blocks": d.get("store_blocks_ok", 0),
            "Failed stores (blocks)": d.get("store_blocks_failed", 0),
            "Loaded MB": round(d.get("load_bytes", 0) / 1e6, 3),
            "Stored MB": round(d.get("store_bytes", 0) / 1e6, 3),
        }
        if d.get("load_jobs"):
            out["Avg load job (ms)"] = round(1e3 * d.get("load_seconds", 0.0) / d["load_jobs"], 3)
        if d.get("store_jobs"):
            out["Avg store job (ms)"] = round(1e3 * d.get("store_seconds", 0.0) / d["store_jobs"], 3)
        return out

    def take(self) -> "UMBPConnectorStats | None":
        """This interval's stats (None if nothing happened); resets."""
        if self.is_empty():
            return None
        out = UMBPConnectorStats(data=dict(self.data))
        self.reset()
        return out


#: Prometheus series: (name, documentation, counter keys it adds up)
PROM_COUNTERS = (
    ("vllm:umbp_lookup_query_tokens", "Tokens the scheduler asked umbp for beyond the local prefix hit",
     "lookup_query_tokens"),
    ("vllm:umbp_lookup_hit_tokens", "Tokens umbp held beyond the local prefix hit", "lookup_hit_tokens"),
    ("vllm:umbp_lookup_errors", "Scheduler lookups that failed (counted as misses)", "lookup_errors"),
    ("vllm:umbp_load_blocks", "KV blocks restored from umbp", "load_blocks_ok"),
    ("vllm:umbp_load_failed_blocks", "KV blocks whose restore failed (recomputed)", "load_blocks_failed"),
    ("vllm:umbp_store_blocks", "KV blocks stored to umbp", "store_blocks_ok"),
    ("vllm:umbp_store_failed_blocks", "KV blocks whose store failed", "store_blocks_failed"),
    ("vllm:umbp_load_bytes", "Bytes restored from umbp", "load_bytes"),
    ("vllm:umbp_store_bytes", "Bytes stored to umbp", "store_bytes"),
)

UMBPPromMetrics = None
if _compat.KVConnectorPromMetrics is not None:

    class UMBPPromMetrics(_compat.KVConnectorPromMetrics):  # type: ignore[no-redef]
        """Counters per engine, fed from each interval's UMBPConnectorStats.
        Written against the NIXL connector's use of the base class [INF]:
        ``_counter_cls``, ``_labelnames``, ``make_per_engine``."""

        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            counter_cls = getattr(self, "_counter_cls", None)
            if counter_cls is None:
                import prometheus_client

                counter_cls = metric_types.get(prometheus_client.Counter, prometheus_client.Counter)
            names = getattr(self, "_labelnames", labelnames)
            self._series = []
            for name, doc, key in PROM_COUNTERS:
                c = counter_cls(name=name, documentation=doc, labelnames=names)
                if hasattr(self, "make_per_engine"):
                    per = self.make_per_engine(c)
                else:
                    per = {i: c.labels(*lv) for i, lv in per_engine_labelvalues.items()}
                self._series.append((key, per))

        def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
            for key, per in self._series:
                v = transfer_stats_data.get(key, 0)
                if v and engine_idx in per:
                    per[engine_idx].inc(v)
