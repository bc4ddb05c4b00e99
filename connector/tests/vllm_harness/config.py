"""One harness engine's configuration, and the vLLM config objects it implies."""
from __future__ import annotations

import dataclasses

FULL, SWA, MAMBA = "full", "sliding_window", "mamba"


@dataclasses.dataclass
class HarnessConfig:
    #: KV cache groups: (kind, number of layers, sliding window in tokens)
    groups: list = dataclasses.field(default_factory=lambda: [(FULL, 2, 0)])
    block_size: int = 16
    hash_block_size: int = 0  # tokens per request.block_hashes entry (0: block_size)
    num_blocks: int = 64  # GPU blocks per group pool (shared by all groups, block 0 is the null block)
    tp: int = 1
    extra: dict = dataclasses.field(default_factory=dict)  # kv_connector_extra_config
    kv_role: str = "kv_both"
    max_num_batched_tokens: int = 64
    max_num_seqs: int = 8
    async_scheduling: bool = False
    local_prefix_cache: bool = False
    api: str = "new"  # engine call conventions: "new" (metadata handle_preemptions, worker meta) or "old"
    processes: bool = False  # TP workers in their own processes
    device: str = "cpu"  # where the KV tensors live ("cuda" on the GPU machine)
    cross_layer: bool = False  # one (nb, L, 2, bs, H, D) tensor when the connector prefers cross-layer blocks
    heads: int = 2
    dim: int = 4
    conv_size: int = 6
    ssm_shape: tuple = (2, 5)
    model: str = "fake/model-7b"
    load_failure_policy: str = "recompute"
    #: the vLLM scheduler version the engine behaves as (vllm/v1/core/sched/scheduler.py
    #: of the fake package): "00024d31", "mixin", or "hma" (no such vLLM: an engine
    #: without the one-group limits, for the connector's multi-group load paths)
    engine: str = "00024d31"
    #: with api "new": the worker call order of vLLM's V1 runner ("v1":
    #: handle_preemptions(meta) -> _update_states, which zeroes newly allocated
    #: blocks -> bind) or of the V2 runner ("v2": bind -> handle_preemptions, as
    #: gpu/kv_connector.py@4649d3ba; "v2-0036d38d": gpu/model_runner.py@0036d38d,
    #: whose update_requests zeroes new blocks and applies block copies BEFORE
    #: gpu/kv_connector.py@00f4240e's pre_forward (handle_preemptions -> bind ->
    #: start_load_kv only with sync loads), finish_forward after the forward,
    #: post_forward (start_load_kv, wait_for_save, get_transfer_results, ...,
    #: clear); it pairs with FAKE_VLLM_API=00f4240e).  Both v2 values set
    #: VLLM_USE_V2_MODEL_RUNNER, which is how vLLM selects that runner
    runner: str = "v1"
    #: how the engine picks that runner: "env" sets VLLM_USE_V2_MODEL_RUNNER
    #: (1 for a v2 runner, else 0); "config" leaves it unset, so that vLLM's
    #: own default decides (VllmConfig.use_v2_model_runner, vllm/config/vllm.py
    #: @000fc94b754f: V2 by default for the models it lists), which only
    #: FAKE_VLLM_API=00f4240e has
    runner_selected_by: str = "env"
    #: with runner "v1": the KVConnectorModelRunnerMixin version.  "23ec7c7f":
    #: bind -> start_load_kv -> forward -> wait_for_save (only after a forward).
    #: "00f4240e": start_load_kv before the forward only when the step has sync
    #: loads (SchedulerOutput.has_sync_kv_loads), else after the forward launch
    #: (before wait_for_save); wait_for_save also in steps without a forward
    mixin: str = "23ec7c7f"
    #: stores read their source blocks as late as the engine allows: when the
    #: connector waits for them, else after the next step's block zeroing
    #: (worker.LateStore); False: as soon as submitted
    late_stores: bool = True
    #: with mixin "00f4240e": a speculative config (EAGLE).  The model's last
    #: layer of group 0 is the draft model's: the target forward does not write
    #: it, the drafter does, after the mixin's context has collected the step's
    #: results (get_transfer_results, ...) and before finalize_kv_connector
    #: (wait_for_save, clear_connector_metadata): gpu_model_runner.py's
    #: defer_finalize, kv_connector_model_runner_mixin.py@00f4240ee645
    spec_decode: bool = False
    mamba_cache_mode: str = "align"  # vLLM's cache_config.mamba_cache_mode (Mamba groups)
    #: parallel_config.decode_context_parallel_size / prefill_context_parallel_size
    #: (the connector is inert with either > 1; the engine itself does not model them)
    dcp: int = 1
    pcp: int = 1

    def layers(self) -> list:
        """[(name, group index, kind, layer index)] in model order (groups interleaved)."""
        out, counts = [], [0] * len(self.groups)
        idx = 0
        while any(counts[g] < self.groups[g][1] for g in range(len(self.groups))):
            for g, (kind, n, _w) in enumerate(self.groups):
                if counts[g] < n:
                    counts[g] += 1
                    suffix = "mixer" if kind == MAMBA else "self_attn.attn"
                    out.append((f"model.layers.{idx}.{suffix}", g, kind, idx))
                    idx += 1
        return out

    def kv_cache_config(self):
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                                KVCacheTensor, MambaSpec, SlidingWindowSpec)

        groups = []
        layers = self.layers()
        for g, (kind, _n, w) in enumerate(self.groups):
            names = [name for name, gi, _k, _i in layers if gi == g]
            if kind == FULL:
                spec = FullAttentionSpec(block_size=self.block_size, num_kv_heads=self.heads,
                                         head_size=self.dim, dtype="float32")
            elif kind == SWA:
                spec = SlidingWindowSpec(block_size=self.block_size, num_kv_heads=self.heads,
                                         head_size=self.dim, dtype="float32", sliding_window=w)
            else:
                spec = MambaSpec(block_size=self.block_size, shapes=((self.conv_size,), tuple(self.ssm_shape)),
                                 dtypes=("float32", "float32"))
            groups.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec))
        tensors = [KVCacheTensor(size=0, shared_by=[name]) for name, *_ in layers]
        return KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)

    def vllm_config(self, rank: int = 0):
        from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig, SchedulerConfig,
                                 VllmConfig)

        return VllmConfig(
            model_config=ModelConfig(model=self.model, dtype="float32"),
            cache_config=CacheConfig(block_size=self.block_size, cache_dtype="auto", num_gpu_blocks=self.num_blocks,
                                     mamba_cache_mode=self.mamba_cache_mode),
            parallel_config=ParallelConfig(tensor_parallel_size=self.tp, rank=rank,
                                           decode_context_parallel_size=self.dcp,
                                           prefill_context_parallel_size=self.pcp),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=self.max_num_batched_tokens,
                                             max_num_seqs=self.max_num_seqs,
                                             async_scheduling=self.async_scheduling),
            kv_transfer_config=KVTransferConfig(
                kv_connector="UMBPConnector", kv_connector_module_path="umbp.vllm.connector",
                kv_role=self.kv_role, kv_connector_extra_config=dict(self.extra),
                kv_load_failure_policy=self.load_failure_policy),
            harness_v2_default=self.runner.startswith("v2"),
        )
