"""Fake vllm/v1/outputs.py: KVConnectorOutput (connector-api.md §1.5)."""
from dataclasses import dataclass, field


@dataclass
class KVConnectorOutput:
    finished_sending: set | None = None
    finished_recving: set | None = None
    kv_connector_stats: object = None
    kv_cache_events: object = None
    kv_connector_worker_meta: object = None
    invalid_block_ids: set = field(default_factory=set)
    expected_finished_count: int = 0
    # newer vLLM: request ids whose async load failed, a set or a mapping
    # {req_id: KVTransferFailure} (umbp.vllm._compat.make_failed_recving)
    failed_recving: object = None
    # the mixin @00f4240e: transfer_results.prefix_replay_checkpoints
    prefix_replay_checkpoints: object = None

    def is_empty(self):
        return not (self.finished_sending or self.finished_recving or self.kv_connector_stats
                    or self.kv_cache_events or self.invalid_block_ids or self.kv_connector_worker_meta)
