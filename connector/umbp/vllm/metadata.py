"""What the scheduler half sends the workers each step, and what the workers
send back.  Plain dataclasses of ints, strs, bytes, lists, sets and dicts, so
vLLM may pickle or msgpack them across processes (no tensors, no handles).

A plan's per-block data is packed in bytes, one object per field, so that
neither side builds per-block Python objects: block hashes (n * hash_len
bytes), block ids (n int64), and the keys when the scheduler has them.

Block hashes always travel.  Keys travel for the leading blocks of a plan
whose keys the scheduler's lookups already derived (every rank's: world * m
* 32 bytes), so a worker does not derive them again (loads of a hit, stores
of blocks looked up); a worker derives its own rank's keys of the rest (one
``umbp.derive_keys`` call per plan, none when all came).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._compat import KVConnectorMetadata, KVConnectorWorkerMetadata


def ids_of(x) -> np.ndarray:
    """Block ids of a plan field as int64: bytes of int64 (what the scheduler
    sends) or a list of ints."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        return np.frombuffer(x, dtype=np.int64)
    return np.asarray(x, dtype=np.int64).reshape(-1)


class _Plan:
    @property
    def num_blocks(self) -> int:
        return len(self.hashes) // self.hash_len if self.hash_len else 0

    def block_id_array(self) -> np.ndarray:
        return ids_of(self.block_ids)

    def keys_of(self, rank: int, world: int):
        """This rank's keys of the plan's first key_blocks blocks: uint8
        (key_blocks, 32) (the worker derives the rest); None when the plan
        carries none (or was built for another world size)."""
        m = self.key_blocks
        if not self.keys or not 0 < m <= self.num_blocks or len(self.keys) != world * m * 32:
            return None
        return np.frombuffer(self.keys, dtype=np.uint8).reshape(world, m, 32)[rank]


@dataclasses.dataclass
class LoadPlan(_Plan):
    """Restore ``num_blocks`` blocks of one request and KV cache group."""

    req_id: str
    group: int  # vLLM group id (index into kv_cache_groups)
    hashes: bytes  # identity hashes, n * hash_len bytes
    hash_len: int
    block_ids: bytes  # destination GPU block ids: n int64 (or a list of ints)
    report_ids: bytes  # per block, the id to report (group 0's, see scheduler.py) when it fails: n int64 (or a list)
    is_async: bool  # load between steps (reported in get_finished) or within this step
    epoch: int = 0  # the request's epoch (see StorePlan.epoch)
    #: every rank's keys of the first key_blocks blocks, (world, key_blocks,
    #: 32) uint8; workers derive the others (all of them when None)
    keys: bytes | None = None
    key_blocks: int = 0


@dataclasses.dataclass
class StorePlan(_Plan):
    """Store ``num_blocks`` blocks of one request and group."""

    plan_id: int
    req_id: str
    group: int
    hashes: bytes
    hash_len: int
    block_ids: bytes  # source GPU block ids: n int64 (or a list of ints)
    after_forward: bool  # True: written by this step's forward (submit in wait_for_save)
    #: the request's epoch: a worker whose load of the request failed skips the
    #: request's stores up to that load's epoch (their source blocks were
    #: computed from bad KV); the scheduler bumps the epoch once it has seen
    #: the failure and recomputes
    epoch: int = 0
    keys: bytes | None = None  # as LoadPlan.keys
    key_blocks: int = 0

@dataclasses.dataclass
class UMBPConnectorMetadata(KVConnectorMetadata):
    step: int = 0
    loads: list = dataclasses.field(default_factory=list)  # [LoadPlan]
    stores: list = dataclasses.field(default_factory=list)  # [StorePlan]
    #: async-load requests of this step: each worker reports every one of them in
    #: get_finished()'s recving set once its loads (possibly none) are done
    async_load_req_ids: set = dataclasses.field(default_factory=set)
    #: finished requests whose blocks vLLM keeps (request_finished said True)
    #: until every worker reports them in get_finished()'s sending set
    delayed_free_req_ids: set = dataclasses.field(default_factory=set)
    preempted_req_ids: set = dataclasses.field(default_factory=set)
    #: store plans whose source blocks vLLM frees before this step's forward
    #: (sliding-window blocks leaving the window, Mamba state blocks): every
    #: worker waits for them in bind_connector_metadata (OffloadingConnector's
    #: jobs_to_flush)
    flush_plan_ids: set = dataclasses.field(default_factory=set)
    #: req_id -> block ids every worker reports as failed loads this step (a
    #: block the hit needs that the engine gave no real GPU block: recompute)
    load_error_ids: dict = dataclasses.field(default_factory=dict)
    #: reset_cache(): workers clear their pool when this passes their last epoch
    clear_epoch: int = 0

    def is_empty(self) -> bool:
        return not (self.loads or self.stores or self.async_load_req_ids or self.delayed_free_req_ids
                    or self.preempted_req_ids or self.load_error_ids)


@dataclasses.dataclass
class UMBPWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler, once per step; ``aggregate`` merges the workers'."""

    #: plan_id -> number of workers whose store job of that plan completed
    stores_done: dict = dataclasses.field(default_factory=dict)
    #: plan_id -> blocks that failed to store, summed over workers
    stores_failed_blocks: dict = dataclasses.field(default_factory=dict)
    #: (group, hash) of blocks whose load failed with a data error (quarantine)
    failed_loads: list = dataclasses.field(default_factory=list)
    #: clear epoch -> number of workers that executed that reset_cache() clear
    clears_done: dict = dataclasses.field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (self.stores_done or self.stores_failed_blocks or self.failed_loads or self.clears_done)

    def aggregate(self, other: "UMBPWorkerMetadata") -> "UMBPWorkerMetadata":
        out = UMBPWorkerMetadata(
            stores_done=dict(self.stores_done),
            stores_failed_blocks=dict(self.stores_failed_blocks),
            failed_loads=list(self.failed_loads) + list(other.failed_loads),
            clears_done=dict(self.clears_done),
        )
        for k, v in other.clears_done.items():
            out.clears_done[k] = out.clears_done.get(k, 0) + v
        for k, v in other.stores_done.items():
            out.stores_done[k] = out.stores_done.get(k, 0) + v
        for k, v in other.stores_failed_blocks.items():
            out.stores_failed_blocks[k] = out.stores_failed_blocks.get(k, 0) + v
        return out
