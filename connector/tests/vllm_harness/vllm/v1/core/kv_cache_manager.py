"""Fake vllm/v1/core/kv_cache_manager.py: KVCacheBlocks."""
from dataclasses import dataclass


@dataclass
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: object = None
    is_null: bool = False


@dataclass
class KVCacheBlocks:
    blocks: tuple  # one sequence of KVCacheBlock per KV cache group

    def get_block_ids(self, allow_none=False):
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_unhashed_block_ids(self):
        assert len(self.blocks) == 1
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def __add__(self, other):
        return KVCacheBlocks(tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)))

    def new_empty(self):
        return KVCacheBlocks(tuple(() for _ in self.blocks))
