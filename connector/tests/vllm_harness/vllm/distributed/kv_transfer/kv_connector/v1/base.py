"""Fake vllm/distributed/kv_transfer/kv_connector/v1/base.py: ONE real
version per FAKE_VLLM_API value (vllm.API), never a mix:

- ``old``: base.py@13f4ad0f: handle_preemptions(set), no SupportsHMA,
  KVConnectorWorkerMetadata or transfer results;
- ``003df296``: base.py@003df296 (connector-api.md §1.1-1.3):
  handle_preemptions(metadata), KVConnectorWorkerMetadata, SupportsHMA; no
  KVConnectorTransferResults / get_transfer_results;
- ``new`` (the default): base.py@7ba3df63 as a third-party walk cites it
  (lines 87-96): the 003df296 surface plus
  KVConnectorTransferResults(finished_sending, finished_recving,
  failed_recving: set[str]) and get_transfer_results;
- ``00f4240e``: the base.py the mixin @00f4240e is written against: that
  mixin reads transfer_results.prefix_replay_checkpoints, so the results
  class has that field too.  Its declaration is not stored anywhere read, so
  the fake gives NO field a default: a connector must pass every field.

The mixin a harness engine runs (HarnessConfig.mixin) must match: "00f4240e"
calls get_transfer_results unconditionally."""
import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import vllm

NEW = vllm.API != "old"
HAS_RESULTS = vllm.API in ("new", "00f4240e")


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024 - an empty marker, as in vLLM
    pass


class KVConnectorHandshakeMetadata(ABC):  # noqa: B024
    pass


if NEW:

    class KVConnectorWorkerMetadata(ABC):
        @abstractmethod
        def aggregate(self, other):
            raise NotImplementedError

    class SupportsHMA(ABC):
        @abstractmethod
        def request_finished_all_groups(self, request, block_ids):
            raise NotImplementedError


if vllm.API == "new":

    @dataclass
    class KVConnectorTransferResults:
        finished_sending: set = field(default_factory=set)
        finished_recving: set = field(default_factory=set)
        failed_recving: set = field(default_factory=set)

elif vllm.API == "00f4240e":

    @dataclass
    class KVConnectorTransferResults:
        finished_sending: set
        finished_recving: set
        failed_recving: set
        # req_id -> the replay checkpoint a load certified (SWA bounded replay);
        # a request without one replays its window
        prefix_replay_checkpoints: dict


def supports_hma(connector) -> bool:
    if not NEW:
        return False
    cls = connector if isinstance(connector, type) else type(connector)
    return issubclass(cls, SupportsHMA)


class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set")
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role
        self.use_eagle_prefix_cache_hashing = False

    @property
    def role(self):
        return self._role

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        return self._kv_transfer_config.is_kv_producer

    # ---- worker side ----
    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches):
        return

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        return

    def set_host_xfer_buffer_ops(self, copy_operation):
        return

    def handle_preemptions(self, kv_connector_metadata):
        return

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs):
        raise NotImplementedError

    @abstractmethod
    def wait_for_layer_load(self, layer_name):
        raise NotImplementedError

    @abstractmethod
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        raise NotImplementedError

    @abstractmethod
    def wait_for_save(self):
        raise NotImplementedError

    def get_finished(self, finished_req_ids):
        return None, None

    if vllm.API == "new":

        def get_transfer_results(self, finished_req_ids):
            s, r = self.get_finished(finished_req_ids)
            return KVConnectorTransferResults(set(s or ()), set(r or ()), set())

    elif vllm.API == "00f4240e":

        def get_transfer_results(self, finished_req_ids):
            s, r = self.get_finished(finished_req_ids)
            return KVConnectorTransferResults(set(s or ()), set(r or ()), set(), {})

    def get_block_ids_with_load_errors(self):
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self):
        return None

    if NEW:

        def build_connector_worker_meta(self):
            return None

    # ---- scheduler side ----
    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        raise NotImplementedError

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        raise NotImplementedError

    @abstractmethod
    def build_connector_meta(self, scheduler_output):
        raise NotImplementedError

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        return False, None

    def take_events(self):
        return ()

    def reset_cache(self):
        return None

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return False

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return None

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return None
