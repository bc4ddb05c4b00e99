"""Fake vllm/config: the config objects the connector reads (VllmConfig-like)."""
from dataclasses import dataclass, field

from vllm import API


@dataclass
class ModelConfig:
    model: str = "facebook/opt-125m"
    revision: str | None = None
    dtype: str = "float16"


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_gpu_blocks: int | None = None
    mamba_cache_mode: str = "none"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    data_parallel_rank: int = 0
    rank: int = 0


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 64
    max_num_seqs: int = 16
    async_scheduling: bool = False


@dataclass
class KVTransferConfig:
    kv_connector: str | None = None
    kv_connector_module_path: str | None = None
    kv_role: str | None = None
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"
    engine_id: str = "fake-engine"

    @property
    def is_kv_producer(self):
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self):
        return self.kv_role in ("kv_consumer", "kv_both")


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer_config: KVTransferConfig | None = None
    speculative_config: object = None
    #: harness only (no vLLM field): what vLLM decides when
    #: VLLM_USE_V2_MODEL_RUNNER is unset (vllm/config/vllm.py@000fc94b754f:
    #: V2 for the models it runs on V2 by default, given Triton and no feature
    #: V2 lacks); read by use_v2_model_runner where this version has it
    harness_v2_default: bool = False


def _use_v2_model_runner(self) -> bool:
    """VllmConfig.use_v2_model_runner (vllm/config/vllm.py@000fc94b754f): the
    variable when set, else vLLM's default for the model."""
    from vllm import envs

    v = envs.VLLM_USE_V2_MODEL_RUNNER
    if v is not None:
        return v
    return self.harness_v2_default


if API == "00f4240e":  # the version whose VllmConfig has the property (see vllm/envs.py)
    VllmConfig.use_v2_model_runner = property(_use_v2_model_runner)
