"""Fake vllm/v1/core/sched/output.py@00e8f1fd: SchedulerOutput, NewRequestData,
CachedRequestData (field names as connector-api.md §1.5)."""
from dataclasses import dataclass, field


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    mm_features: list
    sampling_params: object
    pooling_params: object
    block_ids: tuple
    num_computed_tokens: int
    lora_request: object
    prompt_embeds: object = None


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    resumed_req_ids: set = field(default_factory=set)
    new_token_ids: list = field(default_factory=list)
    all_token_ids: dict = field(default_factory=dict)
    new_block_ids: list = field(default_factory=list)
    num_computed_tokens: list = field(default_factory=list)
    num_output_tokens: list = field(default_factory=list)

    @property
    def num_reqs(self):
        return len(self.req_ids)

    def is_context_phase(self, req_id):
        return False

    @classmethod
    def make_empty(cls):
        return cls()


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict = field(default_factory=dict)
    scheduled_encoder_inputs: dict = field(default_factory=dict)
    num_common_prefix_blocks: list = field(default_factory=list)
    finished_req_ids: set = field(default_factory=set)
    free_encoder_mm_hashes: list = field(default_factory=list)
    preempted_req_ids: set | None = None
    pending_structured_output_tokens: bool = False
    kv_connector_metadata: object = None
    ec_connector_metadata: object = None
    # newer vLLM (read by kv_connector_model_runner_mixin.py@00f4240e): whether a
    # request of this step loads external KV synchronously (else start_load_kv
    # runs after the forward launch)
    has_sync_kv_loads: bool = False
