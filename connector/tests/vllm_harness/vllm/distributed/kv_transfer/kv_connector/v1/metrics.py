"""Fake vllm/distributed/kv_transfer/kv_connector/v1/metrics.py (KVConnectorStats;
KVConnectorPromMetrics shaped after the NIXL connector's use of it [INF])."""
from dataclasses import dataclass, field

import vllm


@dataclass
class KVConnectorStats:
    data: dict = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other):
        raise NotImplementedError

    def reduce(self):
        raise NotImplementedError

    def is_empty(self):
        raise NotImplementedError


if vllm.API != "old":

    class KVConnectorPromMetrics:
        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            import prometheus_client

            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._gauge_cls = metric_types[prometheus_client.Gauge]
            self._counter_cls = metric_types[prometheus_client.Counter]
            self._histogram_cls = metric_types[prometheus_client.Histogram]
            self._labelnames = labelnames
            self._per_engine_labelvalues = per_engine_labelvalues

        def make_per_engine(self, metric):
            return {idx: metric.labels(*lv) for idx, lv in self._per_engine_labelvalues.items()}

        def observe(self, transfer_stats_data, engine_idx=0):
            raise NotImplementedError
