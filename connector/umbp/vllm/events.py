"""KV events: workers drain their runtime's stored/removed events, map each key
back to (group, block hash), and hand them to vLLM as a KVConnectorKVEvents;
vLLM aggregates the workers' and passes them to the scheduler connector in
``update_connector_output``; the scheduler turns them into vLLM's BlockStored /
BlockRemoved in ``take_events``:

- BlockStored(hash) once every rank holds the block's object (a block is a hit
  only then);
- BlockRemoved(hash) when any rank loses it (evicted or cleared) after it was
  announced.

Events of keys a worker did not store itself (another engine's, in standalone
mode, or keys older than ``key_map_max`` stores) cannot be mapped back and are
counted in ``unmapped``.
"""

from __future__ import annotations

import collections

from . import _compat

STORED, REMOVED = 1, 2


class UMBPKVEvents(_compat.KVConnectorKVEvents):
    """Raw worker events ``(rank, type, group, block_hash)``; aggregation
    concatenates (the scheduler counts ranks itself)."""

    def __init__(self, events=None, num_workers: int = 1):
        self._events = list(events or [])
        self._workers = num_workers

    def add_events(self, events):
        self._events.extend(events)

    def aggregate(self):
        return self

    def increment_workers(self, count: int = 1):
        self._workers += count

    def get_all_events(self):
        return list(self._events)

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self):
        self._events.clear()
        self._workers = 0

    def __repr__(self):
        return f"UMBPKVEvents({len(self._events)} events, {self._workers} workers)"


class KeyMap:
    """Worker side: key -> (group, block hash) of the keys this worker stored,
    bounded (oldest forgotten first)."""

    def __init__(self, max_entries: int = 1 << 20):
        self.max = max_entries
        self.d: collections.OrderedDict = collections.OrderedDict()
        self.unmapped = 0

    def add(self, keys, group: int, hashes: list):
        for i, h in enumerate(hashes):
            k = bytes(keys[i])
            self.d[k] = (group, h)
            self.d.move_to_end(k)
        while len(self.d) > self.max:
            self.d.popitem(last=False)

    def translate(self, rank: int, types, keys) -> list:
        out = []
        for t, k in zip(types, keys):
            kb = bytes(k)
            info = self.d.get(kb)
            if info is None:
                self.unmapped += 1
                continue
            if int(t) == REMOVED:
                self.d.pop(kb, None)
            out.append((rank, int(t), info[0], info[1]))
        return out


class EventBuilder:
    """Scheduler side: rank counting and vLLM event objects."""

    def __init__(self, world: int, block_size: int, groups, info_max: int = 1 << 17):
        self.world = world
        self.block_size = block_size
        self.group_ids = [g.index for g in groups]
        # group -> (kv_cache_spec_kind, kv_cache_spec_sliding_window), as vLLM names them
        self.group_spec = {g.index: _compat.event_group_spec(getattr(g, "spec", None)) for g in groups}
        self.holders: dict = {}  # (group, hash) -> set of ranks holding it
        self.announced: set = set()
        self.info: collections.OrderedDict = collections.OrderedDict()  # (g, h) -> (parent, tokens, lora)
        self.info_max = info_max
        self.pending: list = []
        self.lost = 0

    def note_store(self, group: int, h: bytes, parent, token_ids, lora):
        """lora: (lora_id, lora_name) of the request (_compat.lora_of)."""
        k = (group, h)
        self.info[k] = (parent, list(token_ids) if token_ids is not None else [], lora)
        self.info.move_to_end(k)
        while len(self.info) > self.info_max:
            self.info.popitem(last=False)

    def _emits(self, group: int) -> bool:
        # vLLM's events name the group only in newer versions; older ones get
        # the first group's events (the block-hash prefix routers follow)
        return _compat.EVENTS_HAVE_GROUP or group == self.group_ids[0]

    def feed(self, events):
        """Each event on its own: one that cannot be built (an event class of
        another vLLM) is counted in ``lost``, warned about once, and leaves
        the block unannounced (so no BlockRemoved follows for it)."""
        for ev in events:
            try:
                self._feed_one(*ev)
            except Exception as e:  # events are best effort
                if not self.lost:
                    _compat.get_logger("umbp.vllm.events").warning(
                        "umbp: a KV event could not be built as vLLM's event object (%s); such events "
                        "are dropped and counted", e)
                self.lost += 1

    def _feed_one(self, rank, t, group, h):
        k = (group, h)
        if t == STORED:
            s = self.holders.setdefault(k, set())
            s.add(rank)
            if len(s) >= self.world and k not in self.announced:
                parent, tokens, lora = self.info.pop(k, (None, [], (None, None)))
                if self._emits(group):
                    cv = _compat.convert_block_hash
                    # every field vLLM's block pool fills (kv_events.py@0181ea31:
                    # lora_name has no default); the block is announced only
                    # once its event exists
                    kind, window = self.group_spec.get(group, (None, None))
                    ev = _compat.make_block_stored(
                        block_hashes=[cv(h)], parent_block_hash=cv(parent) if parent is not None else None,
                        token_ids=tokens, block_size=self.block_size, lora_id=lora[0], medium="CPU",
                        lora_name=lora[1], group_idx=group, kv_cache_spec_kind=kind,
                        kv_cache_spec_sliding_window=window)
                    self.pending.append(ev)
                self.announced.add(k)
        elif t == REMOVED:
            s = self.holders.get(k)
            if s is not None:
                s.discard(rank)
                if not s:
                    self.holders.pop(k, None)
            if k in self.announced:
                if self._emits(group):
                    self.pending.append(_compat.make_block_removed(
                        block_hashes=[_compat.convert_block_hash(h)], medium="CPU", group_idx=group))
                self.announced.discard(k)

    def take(self) -> list:
        out, self.pending = self.pending, []
        return out
