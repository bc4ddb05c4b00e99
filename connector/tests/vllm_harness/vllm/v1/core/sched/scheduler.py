"""Fake vllm/v1/core/sched/scheduler.py: the three Scheduler methods in which
vLLM's handling of a KV connector differs between versions, one class per
engine version the harness models (HarnessConfig.engine).  The harness's
scheduler (engine.py) inherits the selected class, so it behaves as that
version does, and Engine sets this module's ``Scheduler`` to it before the
connector is built, so the connector probes what the harness runs.

- ``SCHEDULER_00024D31``: scheduler.py@00024d314514 (read in full).
  _update_requests_with_invalid_blocks unpacks ONE group's block ids for every
  scanned request (ValueError with >= 2 KV cache groups);
  _update_waiting_for_remote_kv unpacks one group too and recomputes
  num_computed_tokens from the block count (the request's num_computed_tokens
  is not set when an async load is allocated); _mamba_block_aligned_split
  asserts that no token is external.
- ``SCHEDULER_MIXIN``: the later SchedulerKVConnectorMixin split (commit not
  recorded by the reading, see shared/reference/connector-vs-real-engines.md):
  the invalid-block scan still unpacks one group and align mode still asserts,
  but async-load completion reads request.num_computed_tokens (set when the
  load is allocated).
- ``SCHEDULER_HMA``: NOT a vLLM version: an engine without those three
  limits, which the connector's multi-group load paths are written for (and
  which the connector recognises by the same probe).  Used only by tests that
  exercise those paths.
"""
from __future__ import annotations


class _Base:
    #: engine name as HarnessConfig.engine spells it
    ENGINE = ""
    #: whether an async load's allocation sets request.num_computed_tokens
    SETS_COMPUTED_AT_ASYNC_ALLOC = True
    # _truncate_at_invalid, _align, block_size, kv_cache_manager and
    # failed_recving_kv_req_ids come from the harness scheduler (engine.py)


class SCHEDULER_00024D31(_Base):
    ENGINE = "00024d31"
    SETS_COMPUTED_AT_ASYNC_ALLOC = False

    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids):
        affected = set()
        for request in requests:
            req_id = request.request_id
            # TODO (davidb): add support for hybrid memory allocator
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(req_id)
            if self._truncate_at_invalid(request, req_block_ids, invalid_block_ids):
                affected.add(req_id)
        return affected

    def _update_waiting_for_remote_kv(self, request):
        if request.request_id in self.failed_recving_kv_req_ids:
            self.failed_recving_kv_req_ids.discard(request.request_id)
        else:
            (block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)
            num_computed_tokens = len(block_ids) * self.block_size
            num_computed_tokens = min(num_computed_tokens, request.num_tokens)
            if num_computed_tokens == request.num_tokens:
                num_computed_tokens -= 1
            request.num_computed_tokens = num_computed_tokens

    def _mamba_block_aligned_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                                   num_external_computed_tokens=0):
        assert num_external_computed_tokens == 0, (
            "External KV connector is not verified yet"
        )
        return self._align(request, request.num_computed_tokens + num_new_local_computed_tokens
                           + num_external_computed_tokens, num_new_tokens)


class SCHEDULER_MIXIN(_Base):
    ENGINE = "mixin"

    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids):
        affected = set()
        for request in requests:
            req_id = request.request_id
            # TODO (davidb): add support for hybrid memory allocator
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(req_id)
            if self._truncate_at_invalid(request, req_block_ids, invalid_block_ids):
                affected.add(req_id)
        return affected

    def _update_waiting_for_remote_kv(self, request):
        # num_computed_tokens was set when the load was allocated (and
        # truncated by _update_requests_with_invalid_blocks on a failure)
        self.failed_recving_kv_req_ids.discard(request.request_id)

    def _mamba_block_aligned_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                                   num_external_computed_tokens=0):
        assert num_external_computed_tokens == 0, (
            "External KV connector is not verified yet"
        )
        return self._align(request, request.num_computed_tokens + num_new_local_computed_tokens
                           + num_external_computed_tokens, num_new_tokens)


class SCHEDULER_HMA(_Base):
    ENGINE = "hma"

    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids):
        affected = set()
        for request in requests:
            req_block_ids = self.kv_cache_manager.get_block_ids(request.request_id)[0]
            if self._truncate_at_invalid(request, req_block_ids, invalid_block_ids):
                affected.add(request.request_id)
        return affected

    def _update_waiting_for_remote_kv(self, request):
        self.failed_recving_kv_req_ids.discard(request.request_id)

    def _mamba_block_aligned_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                                   num_external_computed_tokens=0):
        return self._align(request, request.num_computed_tokens + num_new_local_computed_tokens
                           + num_external_computed_tokens, num_new_tokens)


ENGINES = {c.ENGINE: c for c in (SCHEDULER_00024D31, SCHEDULER_MIXIN, SCHEDULER_HMA)}

#: the class the running harness engine uses (set by vllm_harness.engine.Engine)
Scheduler = SCHEDULER_00024D31
