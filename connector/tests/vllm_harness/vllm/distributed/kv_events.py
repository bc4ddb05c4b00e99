"""Fake vllm/distributed/kv_events.py: the event structs and
KVConnectorKVEvents of kv_events.py@0181ea3173e5.

vLLM's events are msgspec Structs: a field with no default is REQUIRED (the
constructor raises TypeError without it, as msgspec does), and
inspect.signature lists the fields.  Dataclasses with the same fields, order
and defaults give both.  FAKE_VLLM_API=old gives the older six-field
BlockStored (no lora_name, no group_idx) and two-field BlockRemoved."""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import vllm


class KVCacheEvent:
    pass


MEDIUM_GPU = "GPU"

if vllm.API != "old":

    @dataclass
    class BlockStored(KVCacheEvent):
        block_hashes: list
        parent_block_hash: Any
        token_ids: list
        block_size: int
        lora_id: Any
        medium: Any
        lora_name: Any
        extra_keys: Any = None
        group_idx: Any = None
        kv_cache_spec_kind: Any = None
        kv_cache_spec_sliding_window: Any = None

    @dataclass
    class BlockRemoved(KVCacheEvent):
        block_hashes: list
        medium: Any
        group_idx: Any = None

else:

    @dataclass
    class BlockStored(KVCacheEvent):
        block_hashes: list
        parent_block_hash: Any
        token_ids: list
        block_size: int
        lora_id: Any
        medium: Any

    @dataclass
    class BlockRemoved(KVCacheEvent):
        block_hashes: list
        medium: Any


@dataclass
class AllBlocksCleared(KVCacheEvent):
    pass


if vllm.API != "old":

    class KVConnectorKVEvents(ABC):
        @abstractmethod
        def add_events(self, events): ...

        @abstractmethod
        def aggregate(self): ...

        @abstractmethod
        def increment_workers(self, count=1): ...

        @abstractmethod
        def get_all_events(self): ...

        @abstractmethod
        def get_number_of_workers(self): ...

        @abstractmethod
        def clear_events(self): ...

        def merge(self, other):
            self.add_events(other.get_all_events())
            return self
