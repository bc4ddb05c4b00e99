"""Fake vllm/distributed/kv_events.py: BlockStored/BlockRemoved
(vllm.md §1: block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium) and KVConnectorKVEvents (the interface UMBPStoreKVEvents implements)."""
from abc import ABC, abstractmethod
from dataclasses import dataclass

import vllm


class KVCacheEvent:
    pass


@dataclass
class BlockStored(KVCacheEvent):
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object
    medium: object


@dataclass
class BlockRemoved(KVCacheEvent):
    block_hashes: list
    medium: object


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
