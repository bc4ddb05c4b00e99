"""The scheduler half of the UMBP connector: lookups, load and store planning,
delayed frees, quarantine, KV events.  Runs in vLLM's scheduler process; owns
no pool (embedded: it asks the workers' lookup sockets; standalone: a lookup
session of umbp-server).

Semantics (docs/vllm.md has the user's view):

- A block at position i counts as a hit only if every worker rank holds the
  object of every group that position needs: full attention [local_k, k),
  sliding window the window before k, Mamba the state at k.  The hit is capped
  so that the last prompt token is computed, and block-aligned.
- Stores are eager by default: each step, the blocks that became full in that
  step (prompt blocks; decode blocks too with save_decode_cache) are stored
  after the forward pass.  With lazy_offload, a request's blocks are stored
  when it finishes.  Blocks hit locally or loaded are not stored again.
- request_finished returns (True, None) while a store of the request is in
  flight (or a lazy store is queued), so vLLM keeps its GPU blocks until every
  worker reports the request in get_finished()'s sending set; and while an
  async load is in flight (vLLM then frees on finished_recving).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time

import numpy as np

from . import _compat
from .events import EventBuilder, UMBPKVEvents
from .identity import (FULL, MAMBA, NULL_BLOCK_ID, Topology, derive_namespace, describe_groups,
                       hash_bytes, hash_scale, resolve_hash_block_size)
from .lookup import DistributedLookup, EmbeddedLookup, LookupBackend, StandaloneLookup
from .metadata import LoadPlan, StorePlan, UMBPConnectorMetadata, UMBPWorkerMetadata
from .stats import UMBPConnectorStats

log = _compat.get_logger("umbp.vllm.scheduler")


_EMPTY_IDS = np.zeros(0, dtype=np.int64)


def ids_array(x) -> np.ndarray:
    """One group's block ids (a list of ints from vLLM) as an int64 array:
    one np.fromiter, no per-id Python work."""
    if isinstance(x, np.ndarray):
        return x.astype(np.int64, copy=False)
    if not x:
        return _EMPTY_IDS
    return np.fromiter(x, dtype=np.int64, count=len(x))


def _group_lists(ids) -> list:
    """A request's block ids as vLLM hands them (KVCacheBlocks, a tuple of
    lists per group, or an old single-group list): a list of per-group
    sequences (not copied)."""
    if ids is None:
        return []
    if hasattr(ids, "get_block_ids"):
        ids = ids.get_block_ids()
        if ids is None:
            return []
    if len(ids) and not isinstance(ids[0], (list, tuple, np.ndarray)):
        return [ids]  # an old single-group list
    return list(ids)


def block_ids_arrays(ids) -> list:
    """A request's block ids as vLLM hands them: a list of int64 arrays, one
    per group."""
    return [ids_array(x) for x in _group_lists(ids)]


#: positions a long lookup asks for first (UMBPScheduler._match)
PROBE_BLOCKS = 16


class Rows:
    """An array grown along its first axis (capacity doubles): a request's
    identity hashes (n, hash_len), its keys of one (rank, group) (n, 32), or
    one group's block ids (n,).  ``a`` is the filled part (a view); row 0 is
    block position ``base``."""

    __slots__ = ("buf", "n", "base")

    def __init__(self, a: np.ndarray | None = None, base: int = 0):
        self.buf = a
        self.n = 0 if a is None else len(a)
        self.base = base

    @property
    def a(self) -> np.ndarray:
        # n before buf: extend() replaces buf before it raises n, so a reader
        # on another thread (the lookup pool) never sees n rows of a shorter buf
        n = self.n
        buf = self.buf
        return buf[:n] if buf is not None else _EMPTY_IDS

    def extend(self, x: np.ndarray):
        m = len(x)
        if not m:
            return
        if self.buf is None:
            self.buf = np.empty((max(m, 16),) + x.shape[1:], dtype=x.dtype)
        elif self.n + m > len(self.buf):
            buf = np.empty((max(2 * len(self.buf), self.n + m),) + self.buf.shape[1:], dtype=self.buf.dtype)
            buf[:self.n] = self.buf[:self.n]
            self.buf = buf
        self.buf[self.n:self.n + m] = x
        self.n += m


class _Ids:
    """One group's block ids of a request: vLLM's list (appended to as the
    request grows) and its int64 array, converted when a plan needs it and
    then only for the ids added since (decode steps add one at a time)."""

    __slots__ = ("lst", "arr")

    def __init__(self, x=()):
        self.lst = list(x)
        self.arr = Rows(_EMPTY_IDS)

    def array(self) -> np.ndarray:
        n, have = len(self.lst), self.arr.n
        if have < n:
            self.arr.extend(np.fromiter(itertools.islice(self.lst, have, None), dtype=np.int64, count=n - have))
        return self.arr.a


def _fold64(rows: np.ndarray) -> np.ndarray:
    """uint64 per row of a uint8 (n, w) array: its 8-byte words XORed."""
    n, w = rows.shape
    if w % 8:
        pad = np.zeros((n, w + 8 - w % 8), dtype=np.uint8)
        pad[:, :w] = rows
        rows = pad
    return np.bitwise_xor.reduce(np.ascontiguousarray(rows).view(np.uint64), axis=1)


def rows_in(h: np.ndarray, s: np.ndarray) -> np.ndarray:
    """bool (len(h),): whether each row of h (uint8 (n, w)) is a row of s
    (uint8 (m, w)); exact (candidates found by a 64-bit fold, then compared
    byte for byte)."""
    out = np.zeros(len(h), dtype=bool)
    if not len(h) or not len(s):
        return out
    fh, fs = _fold64(h), _fold64(s)
    order = np.argsort(fs, kind="stable")
    fs = fs[order]
    cand = np.flatnonzero(np.isin(fh, fs))
    if not cand.size:
        return out
    lo = np.searchsorted(fs, fh[cand], "left")
    hi = np.searchsorted(fs, fh[cand], "right")
    if (hi - lo != 1).any():  # rows of s that share a fold: compare whole rows (slow, never seen)
        v = np.dtype((np.void, h.shape[1]))
        out[cand] = np.isin(np.ascontiguousarray(h[cand]).view(v).ravel(), np.ascontiguousarray(s).view(v).ravel())
        return out
    out[cand] = (h[cand] == s[order[lo]]).all(axis=1)
    return out


def report_ids(g0: np.ndarray, pos: np.ndarray, local_k: int) -> np.ndarray:
    """The block id vLLM must see as failed when position p (each of pos,
    all >= local_k) fails: vLLM scans the request's group-0 block ids and
    recomputes from the first reported one, so report group 0's block at p,
    or the nearest real one before it (not below local_k); the null block
    when there is none (recomputes from the first null position: more than
    needed, never wrong).  A running "last real index" (maximum.accumulate)."""
    out = np.full(pos.shape, NULL_BLOCK_ID, dtype=np.int64)
    n0 = len(g0)
    if n0 <= local_k or not pos.size:
        return out
    seg = g0[local_k:min(n0, int(pos.max()) + 1)]
    idx = np.arange(seg.size)
    last = np.maximum.accumulate(np.where(seg != NULL_BLOCK_ID, idx, -1))
    j = last[np.minimum(pos, n0 - 1) - local_k]
    real = j >= 0
    out[real] = seg[j[real]]
    return out


# A plan's block positions: a slice when they are a contiguous run (the
# common case: numpy views, no index arrays), else an ascending int64 array.

def _sel_first(sel) -> int:
    return sel.start if isinstance(sel, slice) else int(sel[0])


def _sel_list(sel):
    return range(sel.start, sel.stop) if isinstance(sel, slice) else sel.tolist()


class _Req:
    __slots__ = ("request", "block_ids", "stored_upto", "started", "inflight", "load_state", "finished",
                 "hashes", "keys", "epoch", "load_range", "park_until", "park_epoch", "parked")

    def __init__(self, request):
        self.request = request
        self.block_ids: list | None = None  # per vLLM group: _Ids of the request's GPU block ids
        self.stored_upto = 0  # block positions below are stored, hit, or skipped
        self.started = False
        self.inflight: set = set()  # store plan ids not yet done on every worker
        self.load_state: str | None = None  # async load: "queued" -> "sent" -> None
        self.finished = False
        self.hashes = Rows()  # identity hash per block position: uint8 (n, hash_len)
        self.keys: dict = {}  # (rank, group index) -> Rows uint8 (n, 32) of positions [base, base + n)
        self.epoch = 0  # bumped when a load of the request failed (see StorePlan.epoch)
        self.load_range = None  # (local_k, k, group-0 block ids array) of the last load
        # a synchronous load: stores built before step park_until wait in
        # `parked` until the scheduler has seen that step's load errors
        self.park_until = 0
        self.park_epoch = 0
        self.parked: list = []


def load_policy(num_groups: int, has_mamba: bool, mamba_cache_mode, load_async: bool,
                limits: _compat.EngineLimits) -> tuple:
    """(loads on, loads async, warning or "") for a model of num_groups vLLM
    KV cache groups on an engine with these limits.  The rule: never create a
    situation the engine cannot recover from.  A load can always fail (an
    object evicted or a copy error between lookup and load), and reporting it
    is the only way to make vLLM recompute instead of computing on wrong KV;
    where reporting it (or completing an async load) would raise in EngineCore,
    no hit is promised at all."""
    if has_mamba and mamba_cache_mode == "align" and limits.mamba_align_no_external:
        return False, load_async, (
            "loads disabled: this vLLM's scheduler asserts that no token comes from a KV connector in "
            "Mamba 'align' mode (_mamba_block_aligned_split: \"External KV connector is not verified yet\"), "
            "so any hit would crash EngineCore; umbp still stores blocks but reports no hits")
    if num_groups >= 2 and limits.invalid_blocks_one_group:
        return False, load_async, (
            "loads disabled: this vLLM's scheduler reads the block ids of one KV cache group when a load "
            "fails (_update_requests_with_invalid_blocks), and this model has %d groups: reporting a failed "
            "load would raise ValueError in EngineCore, and not reporting it would compute on wrong KV; "
            "umbp still stores blocks but reports no hits" % num_groups)
    if num_groups >= 2 and load_async and limits.async_done_one_group:
        if has_mamba:
            return False, load_async, (
                "loads disabled: this vLLM's scheduler reads the block ids of one KV cache group when an "
                "async load completes (_update_waiting_for_remote_kv), this model has %d groups, and Mamba "
                "state needs async loads; umbp still stores blocks but reports no hits" % num_groups)
        return True, False, (
            "synchronous loads: this vLLM's scheduler reads the block ids of one KV cache group when an "
            "async load completes (_update_waiting_for_remote_kv), and this model has %d groups" % num_groups)
    return True, load_async, ""


class UMBPScheduler:
    def __init__(self, umbp, opts, vllm_config, kv_cache_config, kv_role: str):
        self.umbp = umbp
        self.opts = opts
        self.vllm_config = vllm_config
        cc = getattr(vllm_config, "cache_config", None)
        self.groups = describe_groups(kv_cache_config, cc)
        self.block_size = self.groups[0].block_size
        hbs = resolve_hash_block_size(opts.hash_block_size, vllm_config, self.block_size)
        self.scale = hash_scale(self.block_size, hbs)
        self.topo = Topology.from_vllm_config(vllm_config)
        self.world = self.topo.world_size
        self.layout = _compat.kv_cache_layout(vllm_config)
        self.ns = derive_namespace(umbp, vllm_config, self.groups, self.topo, opts.key_namespace, self.layout)
        self.rank_ids = [self.topo.rank_id(r) for r in range(self.world)]
        self.num_vllm_groups = len(getattr(kv_cache_config, "kv_cache_groups", None) or [None])

        # context parallelism: no hits and no stores at all (one warning; the
        # load policy below is then not consulted, so it warns no second time)
        self.inert = self.topo.context_parallel_limit()
        if self.inert:
            log.warning("umbp: %s", self.inert)
        self.load_enabled = bool(opts.enable_lookup) and kv_role != "kv_producer" and not self.inert
        self.store_enabled = kv_role != "kv_consumer" and not self.inert
        self.has_mamba = any(g.kind == MAMBA for g in self.groups)
        self.load_async = bool(opts.load_async) or self.has_mamba
        if self.has_mamba and not opts.load_async:
            log.info("umbp: load_async forced on: a synchronous Mamba load would read stale state")
        if self.load_enabled:
            self.limits = _compat.engine_limits()
            self.load_enabled, self.load_async, why = load_policy(
                self.num_vllm_groups, self.has_mamba, getattr(cc, "mamba_cache_mode", None), self.load_async,
                self.limits)
            if why:
                log.warning("umbp: %s (read from %s)", why, self.limits.source)
        self.lazy = bool(opts.lazy_offload)
        self.quarantine_s = opts.load_failure_quarantine_ms / 1000.0
        prompt_cap = not opts.save_decode_cache
        self.prompt_cap = prompt_cap

        self.backend: LookupBackend = self._make_backend()
        self.stats = UMBPConnectorStats()
        self.events = EventBuilder(self.world, self.block_size, self.groups) if opts.enable_events else None

        self.reqs: dict[str, _Req] = {}
        self.plans: dict[int, tuple] = {}  # store plan id -> (req_id, group id, positions)
        self.plan_counts: dict[int, int] = {}
        self.next_plan_id = 1
        self.step = 0
        self.queued_loads: list = []
        self.queued_stores: list = []  # lazy stores planned at request_finished
        self.queued_async_ids: set = set()
        self.queued_load_errors: dict = {}
        self.delayed_free: set = set()  # announced to workers in the next metadata
        self.held: dict[str, str] = {}  # req_id -> "send" | "recv": we said delay_free
        self.quarantine: dict = {}  # (group id, hash) -> monotonic expiry
        self.pending_match: dict = {}  # req_id -> (local_k, k)
        self.lookups: dict = {}  # req_id -> ((local_k, kmax, epoch), future)
        self.pool = (concurrent.futures.ThreadPoolExecutor(opts.lookup_workers, thread_name_prefix="umbp-lookup")
                     if opts.lookup_async and self.load_enabled else None)
        self.clear_epoch = 0  # reset_cache() count
        self.clear_sent = 0  # epoch the workers were asked to clear
        self.clear_acked = 0
        self.clear_counts: dict = {}
        self.lock = threading.Lock()
        self.keys_lock = threading.Lock()
        self.warned_lookup = False
        self.full_gis = [gi for gi, g in enumerate(self.groups) if g.kind == FULL]
        self.row_rank = np.repeat(np.arange(self.world, dtype=np.uint32), len(self.groups))
        log.info("umbp connector (scheduler): mode=%s namespace=%s groups=%s world=%d load=%s(%s) store=%s(%s)",
                 opts.mode, self.ns.hex, [(g.index, g.kind) for g in self.groups], self.world,
                 self.load_enabled, "async" if self.load_async else "sync", self.store_enabled,
                 "lazy" if self.lazy else "eager")

    # ---- lookups ---------------------------------------------------------------

    def _make_backend(self) -> LookupBackend:
        if not self.load_enabled:
            return LookupBackend()
        o = self.opts
        if o.props.shared_lookup and not o.props.sessions:
            # distributed: umbp-master's index knows every node's keys
            cfg = o.runtime_config(rank=0, world_size=self.world, dp_rank=self.topo.dp_rank)
            return DistributedLookup(self.umbp, cfg, self.world, o.lookup_timeout_ms)
        if o.props.shared_lookup:
            cfg = o.runtime_config(rank=0, world_size=self.world, dp_rank=self.topo.dp_rank, role="lookup")
            return StandaloneLookup(self.umbp.Runtime(cfg))
        return EmbeddedLookup(self.umbp, self.ns.hex, self.world, self.topo.dp_rank, o.lookup_dir,
                              o.lookup_instance, o.lookup_timeout_ms)

    def _identity(self, st: _Req, upto: int) -> np.ndarray:
        """Identity hashes of block positions [0, upto), uint8 (n >= upto,
        hash_len): only the hashes new since the last call are appended
        (under keys_lock: a lookup on the pool may extend them too)."""
        hs = st.hashes
        if hs.n < upto:
            with self.keys_lock:
                self._extend_identity(st, upto)
        return hs.a

    def _extend_identity(self, st: _Req, upto: int):
        hs = st.hashes
        if hs.n < upto:
            bh = st.request.block_hashes
            s = self.scale
            new = bh[hs.n:upto] if s == 1 else bh[hs.n * s + s - 1:upto * s:s]
            if new:
                h0 = new[0]
                hl = hs.buf.shape[1] if hs.buf is not None else (
                    len(h0) if isinstance(h0, bytes) and 1 <= len(h0) <= 64 else len(hash_bytes(h0)))
                buf = b""
                if isinstance(h0, bytes):
                    buf = b"".join(new)  # vLLM's BlockHash is bytes: no per-hash Python work
                if len(buf) != hl * len(new):  # not bytes (old vLLM), or not all of length hl
                    buf = b"".join([hash_bytes(h) for h in new])
                    if len(buf) != hl * len(new):
                        raise ValueError("umbp: a request's block hashes differ in length")
                hs.extend(np.frombuffer(buf, dtype=np.uint8).reshape(len(new), hl))

    def _num_blocks_hashed(self, request) -> int:
        return len(getattr(request, "block_hashes", None) or ()) // self.scale

    def _keys(self, st: _Req, rank: int, gi: int, lo: int, hi: int) -> np.ndarray:
        """Keys of (rank, group index gi) for positions [lo, hi); derives only
        those not derived before (never the locally cached prefix below the
        first lookup's local_k).  Called under keys_lock."""
        k = st.keys.get((rank, gi))

        def derive(a, b):
            return self.umbp.derive_keys(self.ns, rank=self.rank_ids[rank], group=self.groups[gi].index,
                                         hashes=st.hashes.a[a:b])

        if k is None or k.n == 0:
            k = st.keys[(rank, gi)] = Rows(base=lo)
        elif lo < k.base:  # a later lookup from a lower local_k (e.g. after a preemption)
            new = Rows(derive(lo, k.base), base=lo)
            new.extend(k.a)
            k = st.keys[(rank, gi)] = new
        end = k.base + k.n
        if end < hi:
            k.extend(derive(end, hi))
        return k.buf[lo - k.base:hi - k.base]

    def _plan_keys(self, st: _Req, gi: int, sel) -> dict:
        """Every rank's keys of the leading positions of sel (group index gi)
        that the lookups already derived: the plan fields keys (bytes of
        (world, m, 32)) and key_blocks (m); empty when there are none (each
        worker derives what a plan lacks)."""
        first = _sel_first(sel)
        with self.keys_lock:
            ks = [st.keys.get((r, gi)) for r in range(self.world)]
            if any(k is None or k.base > first for k in ks):
                return {}
            cover = min(k.base + k.n for k in ks)  # positions below are derived for every rank
            if isinstance(sel, slice):
                m = min(sel.stop, cover) - first
                if m <= 0:
                    return {}
                parts = [k.buf[first - k.base:first - k.base + m] for k in ks]
            else:
                m = int(np.searchsorted(sel, cover))
                if not m:
                    return {}
                parts = [k.buf[sel[:m] - k.base] for k in ks]
            keys = parts[0].tobytes() if len(parts) == 1 else b"".join([x.tobytes() for x in parts])
            return {"keys": keys, "key_blocks": m}

    def _match(self, st: _Req, local_k: int, kmax: int) -> tuple:
        """Longest k in [local_k, kmax] such that every rank holds every block
        each group needs for a hit at k; returns (k, lookup failed, blocks
        quarantined).  May run on the lookup pool.

        A long query first asks for its first PROBE_BLOCKS positions only:
        when a full-attention group misses one of them, the answer lies in
        them (a hit needs every full-attention block before it, and other
        groups' blocks before the hit), and the keys of the rest are never
        derived.  A miss of a new prompt then costs the derivation of 16 keys
        instead of all of them; a hit pays one more (short) lookup."""
        if self.full_gis and kmax - local_k > 2 * PROBE_BLOCKS:
            p = local_k + PROBE_BLOCKS
            ok, failed, nq = self._present(st, local_k, p)
            if failed or not all(ok[gi].all() for gi in self.full_gis):
                return self._best_k(ok, local_k, p), failed, nq
        ok, failed, nq = self._present(st, local_k, kmax)
        return self._best_k(ok, local_k, kmax), failed, nq

    def _present(self, st: _Req, local_k: int, kmax: int) -> tuple:
        """(ok bool (groups, kmax - local_k): every rank holds the block,
        lookup failed, blocks quarantined) for positions [local_k, kmax)."""
        n = kmax - local_k
        G = len(self.groups)
        self._identity(st, kmax)
        with self.keys_lock:
            parts = [self._keys(st, r, gi, local_k, kmax) for r in range(self.world) for gi in range(G)]
        rows = parts[0][None] if len(parts) == 1 else np.stack(parts)  # (ranks x groups, n, 32)
        try:
            present, rc = self.backend.query(rows, self.row_rank)
        except Exception as e:  # any failure is a miss
            if not self.warned_lookup:
                log.warning("umbp: lookup failed (%s); counted as a miss", e)
                self.warned_lookup = True
            present, rc = np.zeros(rows.shape[:2], dtype=bool), -1
        ok = np.asarray(present, dtype=bool).reshape(self.world, G, n).all(axis=0)
        nq = self._apply_quarantine(st, ok, local_k, kmax) if self.quarantine else 0
        return ok, rc < 0, nq

    def _apply_quarantine(self, st, ok, local_k, kmax) -> int:
        now = time.monotonic()
        with self.lock:
            for k, t in list(self.quarantine.items()):
                if t <= now:
                    del self.quarantine[k]
            q = list(self.quarantine)
        hs = st.hashes.a[local_k:kmax]
        hl = hs.shape[1]
        nq = 0
        for gi, g in enumerate(self.groups):
            qh = [h for gid, h in q if gid == g.index and len(h) == hl]
            if not qh:
                continue
            m = ok[gi] & rows_in(hs, np.frombuffer(b"".join(qh), dtype=np.uint8).reshape(len(qh), hl))
            ok[gi, m] = False
            nq += int(m.sum())
        return nq

    def _best_k(self, ok: np.ndarray, local_k: int, kmax: int) -> int:
        limit = kmax
        for gi in self.full_gis:
            row = ok[gi]
            if not row.all():
                limit = min(limit, local_k + int(row.argmin()))  # the first miss
        if limit <= local_k:
            return local_k
        others = [(gi, g) for gi, g in enumerate(self.groups) if g.kind != FULL]
        if not others:
            return limit
        # a hit at k needs, for each other group, ok over its needed(local_k, k):
        # the run of held blocks ending at k - 1 must be that long
        ks = np.arange(local_k + 1, limit + 1)
        good = np.ones(ks.size, dtype=bool)
        idx = np.arange(limit - local_k)
        for gi, g in others:
            row = ok[gi, :limit - local_k]
            run = idx - np.maximum.accumulate(np.where(row, -1, idx))  # held blocks ending at each index
            if g.kind == MAMBA:
                start = ks - 1
            else:
                start = np.maximum(local_k, ks - g.window_blocks)
            good &= run[ks - 1 - local_k] >= ks - start
        hit = np.flatnonzero(good)
        return int(ks[hit[-1]]) if hit.size else local_k

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if not self.load_enabled:
            return 0, False
        B = self.block_size
        if num_computed_tokens % B:
            return 0, False
        rid = request.request_id
        num_tokens = getattr(request, "num_tokens", None)
        if num_tokens is None:
            num_tokens = len(request.all_token_ids)
        local_k = num_computed_tokens // B
        kmax = min((num_tokens - 1) // B, self._num_blocks_hashed(request))
        if kmax <= local_k or self.clear_sent > self.clear_acked:
            self.pending_match.pop(rid, None)
            return 0, False
        st = self.reqs.get(rid)
        if st is None:
            st = self.reqs[rid] = _Req(request)
        st.request = request
        if self.pool is not None:
            key = (local_k, kmax, self.clear_epoch)
            cur = self.lookups.get(rid)
            if cur is None or cur[0] != key:
                fut = self.pool.submit(self._match, st, local_k, kmax)
                self.lookups[rid] = (key, fut)
                return None, False
            if not cur[1].done():
                return None, False
            try:
                k, failed, nq = cur[1].result()
            except Exception as e:
                log.warning("umbp: async lookup failed (%s); counted as a miss", e)
                k, failed, nq = local_k, True, 0
        else:
            k, failed, nq = self._match(st, local_k, kmax)
        self.stats.add("lookups")
        self.stats.add("lookup_errors", int(failed))
        self.stats.add("quarantined_blocks", nq)
        self.stats.add("lookup_query_tokens", (kmax - local_k) * B)
        self.stats.add("lookup_hit_tokens", (k - local_k) * B)
        if k <= local_k:
            self.pending_match.pop(rid, None)
            return 0, False
        self.pending_match[rid] = (local_k, k)
        return (k - local_k) * B, self.load_async

    # ---- loads -----------------------------------------------------------------

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        rid = request.request_id
        st = self.reqs.get(rid)
        if st is None:
            st = self.reqs[rid] = _Req(request)
        st.request = request
        self.lookups.pop(rid, None)
        match = self.pending_match.pop(rid, None)
        if num_external_tokens <= 0 or match is None:
            return
        B = self.block_size
        local_k, k = match
        k = min(k, local_k + num_external_tokens // B)
        if k <= local_k:
            return
        ids = block_ids_arrays(blocks)
        hs = self._identity(st, k)
        hl = hs.shape[1]
        is_async = self.load_async
        g0 = ids[0] if ids else _EMPTY_IDS
        seg0 = g0[local_k:k]
        all0 = len(seg0) == k - local_k and bool((seg0 != NULL_BLOCK_ID).all())
        # each position reports its own group-0 block when that is real
        rep_all = seg0 if all0 else report_ids(g0, np.arange(local_k, k), local_k)
        for gi, g in enumerate(self.groups):
            r = g.needed(local_k, k)
            if not r:
                continue
            a, b = r.start, r.stop
            gids = ids[g.index] if g.index < len(ids) else _EMPTY_IDS
            rep = rep_all[a - local_k:b - local_k]
            dst = gids[a:b]
            if len(dst) == b - a and (all0 and g.index == 0 or (dst != NULL_BLOCK_ID).all()):
                sel = slice(a, b)
            else:
                have = np.zeros(b - a, dtype=bool)
                have[:len(dst)] = dst != NULL_BLOCK_ID
                # a block the hit needs has no GPU block: recompute from it
                self.queued_load_errors.setdefault(rid, set()).update(rep[~have].tolist())
                idx = np.flatnonzero(have)
                if not idx.size:
                    continue
                sel, dst, rep = idx + a, dst[idx], rep[idx]
            self.queued_loads.append(LoadPlan(rid, g.index, hs[sel].tobytes(), hl, dst.tobytes(), rep.tobytes(),
                                              is_async, st.epoch, **self._plan_keys(st, gi, sel)))
        if is_async:
            st.load_state = "queued"
            self.queued_async_ids.add(rid)
        st.stored_upto = max(st.stored_upto, k)
        st.load_range = (local_k, k, g0)
        if not is_async:
            # With TP, a rank whose own load succeeded computes this step (and,
            # with async scheduling, the next one) from every rank's KV: if
            # another rank's load failed, those blocks are bad everywhere.  Their
            # stores wait until the step's output (its load errors) has been
            # seen: two metadata builds later under either scheduling.
            st.park_until = self.step + 1 + 2
            st.park_epoch = st.epoch
            st.parked = []

    # ---- stores ----------------------------------------------------------------

    def _plan_stores(self, st: _Req, rid: str, total: int, ids, out: list, seen: dict, after_forward: bool):
        """Plans the stores of positions [stored_upto, hi) that each group
        stores (ids: int64 block ids per vLLM group; None: the request's).
        seen: vLLM group id -> [hash rows planned in this step]: a block
        another request of the step already stores is skipped."""
        req = st.request
        B = self.block_size
        hi = min(total // B, self._num_blocks_hashed(req))
        # newer vLLM (base.py@003df296, SupportsHMA.request_finished_all_groups):
        # a content-addressed connector stores no hash past the publishable ones
        # (EAGLE: the last hashes are not final until the draft KV exists)
        pub = getattr(req, "num_publishable_block_hashes", None)
        if pub is not None:
            hi = min(hi, int(pub) // self.scale)
        if self.prompt_cap:
            hi = min(hi, getattr(req, "num_prompt_tokens", total) // B)
        lo = st.stored_upto
        if ids is None:
            ids = st.block_ids
            if hi <= lo or not ids:
                return
            ids = [x.array() for x in ids]
        if hi <= lo or not ids:
            return
        hs = self._identity(st, hi)
        for gi, g in enumerate(self.groups):
            gids = ids[g.index] if g.index < len(ids) else _EMPTY_IDS
            r = g.to_store(lo, hi, total)
            a, b = r.start, min(r.stop, len(gids))
            if b <= a:
                continue
            dst = gids[a:b]
            keep = dst != NULL_BLOCK_ID
            prev = seen.get(g.index)
            if prev:
                keep &= ~rows_in(hs[a:b], prev[0] if len(prev) == 1 else np.concatenate(prev))
            if keep.all():
                sel = slice(a, b)
            else:
                idx = np.flatnonzero(keep)
                if not idx.size:
                    continue
                sel, dst = idx + a, dst[idx]
            seen.setdefault(g.index, []).append(hs[sel])
            if after_forward and self.step < st.park_until:
                st.parked.append((gi, sel, dst))
                continue
            self._emit_store(st, rid, gi, sel, dst, out, after_forward)
        st.stored_upto = hi

    def _emit_store(self, st: _Req, rid: str, gi: int, sel, dst: np.ndarray, out: list, after_forward: bool):
        g = self.groups[gi]
        req = st.request
        B = self.block_size
        hs = st.hashes.a
        pid = self.next_plan_id
        self.next_plan_id += 1
        out.append(StorePlan(pid, rid, g.index, hs[sel].tobytes(), hs.shape[1], dst.tobytes(), after_forward,
                             st.epoch, **self._plan_keys(st, gi, sel)))
        st.inflight.add(pid)
        self.plans[pid] = (rid, g.index, _sel_first(sel))
        if self.events is not None:
            toks = getattr(req, "all_token_ids", None)
            if toks is None:
                toks = getattr(req, "prompt_token_ids", None) or []
            lora = _compat.lora_of(req)
            for p in _sel_list(sel):  # vLLM's events are per-block objects
                self.events.note_store(g.index, hs[p].tobytes(), hs[p - 1].tobytes() if p else None,
                                       list(toks[p * B:(p + 1) * B]), lora)

    def _release_parked(self, out: list, pre: set):
        """Parked stores of synchronously loaded requests whose load step's
        output has been seen: emit them if no load error came (full-attention
        blocks only: sliding-window and Mamba blocks may have been freed
        meanwhile), else drop them (recomputed blocks are stored anew)."""
        for rid, st in self.reqs.items():
            if not st.parked or self.step < st.park_until:
                continue
            parked, st.parked = st.parked, []
            if st.epoch != st.park_epoch or rid in pre or st.block_ids is None or st.finished:
                continue
            for gi, sel, dst in parked:
                if self.groups[gi].kind == FULL:
                    self._emit_store(st, rid, gi, sel, dst, out, False)

    def _set_block_ids(self, st: _Req, groups):
        """The request's block ids from a scheduled request's (all of them)."""
        st.block_ids = [_Ids(x) for x in groups]

    def _add_block_ids(self, st: _Req, groups):
        """Appends a cached request's new block ids (per group)."""
        while len(st.block_ids) < len(groups):
            st.block_ids.append(_Ids())
        for gi, x in enumerate(groups):
            if len(x):
                st.block_ids[gi].lst.extend(x)

    def build_connector_meta(self, so) -> UMBPConnectorMetadata:
        self.step += 1
        meta = UMBPConnectorMetadata(step=self.step, clear_epoch=self.clear_sent)
        seen: dict = {}
        eager = self.store_enabled and not self.lazy
        nst = getattr(so, "num_scheduled_tokens", None) or {}
        for nr in getattr(so, "scheduled_new_reqs", None) or ():
            st = self.reqs.get(nr.req_id)
            if st is None:
                continue
            self._set_block_ids(st, _group_lists(nr.block_ids))
            nct = int(nr.num_computed_tokens)
            if not st.started:
                st.started = True
                st.stored_upto = max(st.stored_upto, nct // self.block_size)
            if eager:
                self._plan_stores(st, nr.req_id, nct + nst.get(nr.req_id, 0), None, meta.stores, seen, True)
        for rid, new_ids, nct, resumed in self._cached(getattr(so, "scheduled_cached_reqs", None)):
            st = self.reqs.get(rid)
            if st is None:
                continue
            new_ids = _group_lists(new_ids) if new_ids is not None else None
            if resumed or st.block_ids is None:
                self._set_block_ids(st, new_ids if new_ids else [()] * self.num_vllm_groups)
            elif new_ids:
                self._add_block_ids(st, new_ids)
            if not st.started:
                st.started = True
                st.stored_upto = max(st.stored_upto, int(nct) // self.block_size)
            if eager:
                self._plan_stores(st, rid, int(nct) + nst.get(rid, 0), None, meta.stores, seen, True)
        pre = set(getattr(so, "preempted_req_ids", None) or ())
        self._release_parked(meta.stores, pre)
        meta.flush_plan_ids = self._flush(so, nst)
        for rid in pre:
            st = self.reqs.get(rid)
            if st is not None:
                st.block_ids = None  # freed by the scheduler; new ones come on resume
                st.parked = []
        meta.preempted_req_ids = pre
        meta.loads, self.queued_loads = self.queued_loads, []
        for rid in self.queued_async_ids:
            st = self.reqs.get(rid)
            if st is not None and st.load_state == "queued":
                st.load_state = "sent"
        meta.async_load_req_ids, self.queued_async_ids = self.queued_async_ids, set()
        meta.load_error_ids, self.queued_load_errors = self.queued_load_errors, {}
        meta.stores.extend(self.queued_stores)
        self.queued_stores = []
        meta.delayed_free_req_ids, self.delayed_free = self.delayed_free, set()
        if not _compat.HAS_WORKER_METADATA and self.clear_sent > self.clear_acked:
            self.clear_acked = self.clear_sent  # no way to hear back: best effort
        return meta

    def _flush(self, so, nst) -> set:
        """Store plans whose source blocks vLLM may free before this step's
        forward: sliding-window blocks that leave the window of a scheduled
        request (vLLM's remove_skipped_blocks at allocation: blocks below
        num_computed_tokens - sliding_window + 1; one block of margin here) and
        every Mamba state block (its manager frees old state blocks)."""
        if not self.plans or all(g.kind == FULL for g in self.groups):
            return set()
        kinds = {g.index: g for g in self.groups}
        computed = {}
        for nr in getattr(so, "scheduled_new_reqs", None) or ():
            computed[nr.req_id] = int(nr.num_computed_tokens)
        for rid, _ids, nct, _res in self._cached(getattr(so, "scheduled_cached_reqs", None)):
            computed[rid] = int(nct)
        out = set()
        B = self.block_size
        for pid, (rid, gid, p0) in self.plans.items():
            g = kinds.get(gid)
            if g is None or g.kind == FULL:
                continue
            if g.kind == MAMBA:
                out.add(pid)
                continue
            c = computed.get(rid)
            if c is not None and (p0 + 1) * B <= c - g.window + 1 + B:
                out.add(pid)
        return out

    @staticmethod
    def _cached(cached):
        """(req_id, new_block_ids, num_computed_tokens, resumed) of
        CachedRequestData (one object of lists; or a list of per-request objects
        in old vLLM)."""
        if cached is None:
            return
        if isinstance(cached, (list, tuple)):
            for c in cached:
                yield (c.req_id, getattr(c, "new_block_ids", None), c.num_computed_tokens,
                       bool(getattr(c, "resumed_from_preemption", False)))
            return
        resumed_set = getattr(cached, "resumed_req_ids", None)
        resumed_list = getattr(cached, "resumed_from_preemption", None)
        for i, rid in enumerate(cached.req_ids):
            if resumed_set is not None:
                resumed = rid in resumed_set
            elif resumed_list is not None:
                resumed = bool(resumed_list[i])
            else:
                resumed = False
            yield rid, cached.new_block_ids[i], cached.num_computed_tokens[i], resumed

    # ---- completion ------------------------------------------------------------

    def request_finished(self, request, block_ids) -> tuple:
        rid = request.request_id
        self.pending_match.pop(rid, None)
        cur = self.lookups.pop(rid, None)
        if cur is not None:
            cur[1].cancel()
        st = self.reqs.get(rid)
        if st is None:
            return False, None
        st.finished = True
        if self.lazy and self.store_enabled:
            ids = block_ids_arrays(block_ids)
            if ids:
                total = int(getattr(request, "num_computed_tokens", 0))
                self._plan_stores(st, rid, total, ids, self.queued_stores, {}, False)
        if st.load_state is not None:
            self.held[rid] = "recv"  # vLLM frees on finished_recving
            return True, None
        if st.inflight:
            self.held[rid] = "send"
            self.delayed_free.add(rid)
            return True, None
        self._drop(rid)
        return False, None

    def _drop(self, rid: str):
        st = self.reqs.pop(rid, None)
        self.held.pop(rid, None)
        if st is not None:
            for pid in st.inflight:
                self.plans.pop(pid, None)
                self.plan_counts.pop(pid, None)

    def update_connector_output(self, out):
        wm = getattr(out, "kv_connector_worker_meta", None)
        if isinstance(wm, UMBPWorkerMetadata):
            for pid, n in wm.stores_done.items():
                if pid not in self.plans:
                    continue
                c = self.plan_counts.get(pid, 0) + n
                if c >= self.world:
                    self.plan_counts.pop(pid, None)
                    rid = self.plans.pop(pid)[0]
                    st = self.reqs.get(rid)
                    if st is not None:
                        st.inflight.discard(pid)
                else:
                    self.plan_counts[pid] = c
            if wm.failed_loads and self.quarantine_s > 0:
                until = time.monotonic() + self.quarantine_s
                with self.lock:
                    for g, h in wm.failed_loads:
                        self.quarantine[(g, h)] = until  # a later store does not lift it
            for ep, n in wm.clears_done.items():
                c = self.clear_counts[ep] = self.clear_counts.get(ep, 0) + n
                if c >= self.world:
                    self.clear_acked = max(self.clear_acked, ep)
                    self.clear_counts = {e: v for e, v in self.clear_counts.items() if e > ep}
        inv = set(getattr(out, "invalid_block_ids", None) or ())
        # newer vLLM: failed_recving may be a mapping whose failures name blocks
        inv |= _compat.failed_recving_blocks(getattr(out, "failed_recving", None))
        if inv:
            self._on_load_errors(inv)
        ev = getattr(out, "kv_cache_events", None)
        if self.events is not None and isinstance(ev, UMBPKVEvents):
            self.events.feed(ev.get_all_events())
        for rid in getattr(out, "finished_recving", None) or ():
            st = self.reqs.get(rid)
            if st is not None:
                st.load_state = None
            if self.held.get(rid) == "recv":
                self._drop(rid)
        for rid in getattr(out, "finished_sending", None) or ():
            if self.held.get(rid) == "send":
                self._drop(rid)

    def _on_load_errors(self, invalid: set):
        """vLLM recomputes from the first failed block: store those blocks
        again once recomputed (rewind stored_upto), and bump the epoch so the
        workers skip stores planned from the bad KV (StorePlan.epoch)."""
        inv = np.fromiter(invalid, dtype=np.int64, count=len(invalid))
        for st in self.reqs.values():
            if st.load_range is None:
                continue
            local_k, k, ids0 = st.load_range
            seg = ids0[local_k:min(k, len(ids0))]
            bad = np.flatnonzero(np.isin(seg, inv)) if seg.size else seg
            first = local_k + int(bad[0]) if bad.size else (local_k if NULL_BLOCK_ID in invalid else None)
            if first is not None:
                st.epoch += 1
                st.stored_upto = min(st.stored_upto, first)
                st.load_range = None
                st.parked, st.park_until = [], 0  # planned from bad KV; what comes next is recomputed

    # ---- the rest --------------------------------------------------------------

    def take_events(self):
        return self.events.take() if self.events is not None else ()

    def reset_cache(self) -> bool:
        self.clear_epoch += 1
        with self.lock:
            self.quarantine.clear()
        for _, fut in self.lookups.values():
            fut.cancel()
        self.lookups.clear()
        self.pending_match.clear()
        try:
            done = self.backend.clear()
        except Exception as e:
            log.warning("umbp: reset_cache: clearing through the %s lookup path failed (%s); the workers "
                        "clear their pools on the next step", self.backend.name, e)
            done = None
        if done is None:
            self.clear_sent = self.clear_epoch  # workers clear; lookups miss until they have
        return True

    def get_kv_connector_stats(self):
        return self.stats.take()

    def counters(self) -> dict:
        return {
            "requests_tracked": len(self.reqs),
            "held_requests": len(self.held),
            "store_plans_inflight": len(self.plans),
            "queued_loads": len(self.queued_loads),
            "queued_stores": len(self.queued_stores),
            "pending_lookups": len(self.lookups),
            "pending_matches": len(self.pending_match),
            "async_loads_inflight": sum(1 for s in self.reqs.values() if s.load_state is not None),
            "quarantined": len(self.quarantine),
            "clear_pending": int(self.clear_sent > self.clear_acked),
        }

    def shutdown(self):
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.backend.close()
