"""UMBPConnector: vLLM v1 KV connector over umbp (KV cache offload to host DRAM).

Load it with::

    vllm serve <model> --enable-prefix-caching --kv-transfer-config \\
      '{"kv_connector": "UMBPConnector", "kv_connector_module_path": "umbp.vllm.connector",
        "kv_role": "kv_both", "kv_connector_extra_config": {"capacity_bytes": "64GiB"}}'

Options: umbp/vllm/options.py and docs/vllm.md.

**vLLM versions.**  vLLM could not be installed where this was written; it was
written against the public sources recorded in the project's reference notes,
not run against a vLLM build:

- ``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` at 003df2961dd8
  (newest stored: ``handle_preemptions(metadata)``, KVConnectorWorkerMetadata,
  SupportsHMA) and at 13f4ad0f55b0 (older: ``handle_preemptions(set[str])``,
  no worker metadata, optional kv_cache_config);
- the later ``get_transfer_results``/``KVConnectorTransferResults`` API as the
  UMBP connector and ``kv_connector_model_runner_mixin.py`` at 00f4240ee645
  use it (implemented when the base class has it);
- the engine order of ``vllm/v1/core/sched/scheduler.py`` at 00024d314514,
  ``kv_connector_model_runner_mixin.py`` at 23ec7c7fab7a / 00f4240ee645, the V2
  runner ``vllm/v1/worker/gpu/kv_connector.py`` at 4649d3bacc9b, and
  ``vllm/v1/core/sched/output.py`` at 00e8f1fd0936 (field names), with async
  scheduling (default since v0.14.0) and the set-typed ``handle_preemptions``
  of v0.18.0;
- the V2 runner's ``gpu/kv_connector.py`` at 00f4240ee645 (``finish_forward``,
  ``reset_capture_state``) and ``gpu/model_runner.py`` at 0036d38de46c (blocks
  zeroed and copied before the connector's first hook of a step), and the
  mixin's ``defer_finalize`` at 00f4240ee645 (speculative decoding:
  ``wait_for_save`` after the drafter, after ``get_transfer_results``);
- ``vllm/config/cache.py`` at 002f10e0cfa1 (``cache_config.kv_cache_layout``,
  ``prefix_match_unit``) and ``vllm/config/vllm.py`` at 000fc94b754f
  (``VllmConfig.use_v2_model_runner``: vLLM's default picks the runner when
  ``VLLM_USE_V2_MODEL_RUNNER`` is unset).

With decode or prefill context parallelism the connector is inert (no hits,
no stores; identity.Topology.context_parallel_limit says why).

Version skew is handled by guarded imports (_compat.py), by accepting both
``handle_preemptions`` argument types, both ``get_finished`` and
``get_transfer_results``, a missing ``kv_cache_config`` argument, ``get_block_ids()``
as a tuple of lists or a plain list, and ``resumed_req_ids`` or
``resumed_from_preemption`` in CachedRequestData.  The test harness
(connector/tests/vllm_harness) drives this module through a fake ``vllm``
shaped after those sources.

Structure: this class is a role dispatcher; scheduler.py is the scheduler half
(lookups, plans, delayed frees, quarantine, events), worker.py the worker half
(one umbp.Runtime per rank, jobs), metadata.py what travels between them.
"""

from __future__ import annotations

import inspect

import umbp

from . import _compat
from ._compat import (KVConnectorBase_V1, KVConnectorRole, SupportsHMA, get_logger)
from .metadata import UMBPConnectorMetadata
from .options import ConnectorOptions, UMBPConfigError, requires_piecewise
from .scheduler import UMBPScheduler
from .stats import UMBPConnectorStats, UMBPPromMetrics
from .worker import UMBPWorker

log = get_logger("umbp.vllm")

__all__ = ["UMBPConnector", "UMBPConnectorMetadata", "UMBPConfigError"]

_BASE_INIT_PARAMS = set(inspect.signature(KVConnectorBase_V1.__init__).parameters)


def _is_scheduler(role) -> bool:
    return role == KVConnectorRole.SCHEDULER or _compat.enum_name(role) == "SCHEDULER"


class UMBPConnector(KVConnectorBase_V1, SupportsHMA):
    """KV cache offload to umbp (embedded DRAM pool per worker, or one
    umbp-server per host in standalone mode)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if "kv_cache_config" in _BASE_INIT_PARAMS:
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        else:  # older base: (vllm_config, role)
            super().__init__(vllm_config=vllm_config, role=role)
        ktc = vllm_config.kv_transfer_config
        self._opts = ConnectorOptions.parse(getattr(ktc, "kv_connector_extra_config", None) or {})
        kv_role = getattr(ktc, "kv_role", None) or "kv_both"
        if kv_role not in ("kv_both", "kv_producer", "kv_consumer"):
            raise UMBPConfigError(f"kv_role: must be kv_both, kv_producer or kv_consumer, got {kv_role!r}")
        if _compat.HAS_TRANSFER_RESULTS:
            _compat.transfer_results_extra()  # a results field umbp cannot fill: refused now, by name
        self._umbp_role = "scheduler" if _is_scheduler(role) else "worker"
        self._scheduler = None
        self._worker = None
        if self._umbp_role == "scheduler":
            self._scheduler = UMBPScheduler(umbp, self._opts, vllm_config, kv_cache_config, kv_role)
        else:
            self._worker = UMBPWorker(umbp, self._opts, vllm_config, kv_cache_config)

    # ---- properties and class methods --------------------------------------------

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return bool(self._opts.prefer_cross_layer_blocks)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped store is a future miss

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # any layout: it is part of the key namespace

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
        return requires_piecewise(extra_config)

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return UMBPConnectorStats(data=dict(data)) if data else UMBPConnectorStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        if UMBPPromMetrics is None:
            return None
        try:
            return UMBPPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        except Exception as e:  # metrics must never stop the engine
            log.warning("umbp: Prometheus metrics unavailable: %s", e)
            return None

    # ---- worker side --------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None:
            self._worker.bind(connector_metadata if isinstance(connector_metadata, UMBPConnectorMetadata)
                              else None)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        if self._worker is not None:
            self._worker.clear()

    def register_kv_caches(self, kv_caches) -> None:
        self._worker.register_kv_caches(kv_caches)

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend=None) -> None:
        self._worker.register_cross_layers_kv_cache(kv_cache, attn_backend)

    def handle_preemptions(self, kv_connector_metadata=None) -> None:
        # set[str] of request ids (v0.18-era) or this step's metadata (newer)
        if self._worker is not None:
            self._worker.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._worker.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass  # whole blocks are stored after the forward pass (wait_for_save)

    def finish_forward(self) -> None:
        # The V2 runner (gpu/kv_connector.py@00f4240e) calls it after every
        # forward and in steps without one; defined here so that no base.py
        # version can make that call fail.  Stores go out in wait_for_save.
        pass

    def reset_capture_state(self) -> None:
        pass  # the V2 runner's CUDA-graph capture reset: umbp holds no captured state

    def wait_for_save(self) -> None:
        self._worker.wait_for_save()

    def get_finished(self, finished_req_ids):
        return self._worker.get_finished(finished_req_ids)

    if _compat.HAS_TRANSFER_RESULTS:

        def get_transfer_results(self, finished_req_ids):
            sending, recving = self._worker.get_finished(finished_req_ids)
            # a set of ids, or a mapping of failures in newer vLLM (_compat)
            failed = _compat.make_failed_recving(self._worker.last_failed_recving)
            return _compat.KVConnectorTransferResults(
                finished_sending=set(sending or ()), finished_recving=set(recving or ()),
                failed_recving=failed, **_compat.transfer_results_extra())

    def get_block_ids_with_load_errors(self) -> set:
        return self._worker.get_block_ids_with_load_errors() if self._worker is not None else set()

    def build_connector_worker_meta(self):
        return self._worker.build_connector_worker_meta() if self._worker is not None else None

    def get_kv_connector_kv_cache_events(self):
        return self._worker.get_kv_connector_kv_cache_events() if self._worker is not None else None

    def get_kv_connector_stats(self):
        half = self._worker or self._scheduler
        return half.get_kv_connector_stats() if half is not None else None

    # ---- scheduler side -----------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> UMBPConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self._scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):
        return self._scheduler.request_finished(request, block_ids)

    def take_events(self):
        return self._scheduler.take_events() if self._scheduler is not None else ()

    def reset_cache(self):
        return self._scheduler.reset_cache() if self._scheduler is not None else None

    def has_pending_push_work(self) -> bool:
        return False  # delayed frees keep the engine stepping; nothing else waits

    # ---- both ---------------------------------------------------------------------

    def debug_counters(self) -> dict:
        """Leak counters for tests and operators: requests held, jobs in flight."""
        half = self._worker or self._scheduler
        return half.counters() if half is not None else {}

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()
