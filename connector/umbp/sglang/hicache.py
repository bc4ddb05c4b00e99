"""umbp as SGLang's HiCache L3 storage backend (``UMBPStore``).

Selected with SGLang's ``dynamic`` storage backend::

    --enable-hierarchical-cache --hicache-mem-layout page_first \\
    --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "umbp",
        "module_path": "umbp.sglang.hicache", "class_name": "UMBPStore",
        "interface_v1": 1, "capacity_bytes": "32GiB"}'

docs/sglang.md has every option, the modes and the failure behaviour.  In
short:

- one ``umbp.Runtime`` per SGLang rank: ``embedded`` (a private pool in the
  rank's process) or ``standalone`` (attached to the host's umbp-server, whose
  pool every engine on the host shares);
- ``batch_set_v1`` / ``batch_get_v1`` copy straight between SGLang's host KV
  pool and umbp objects: one ranged put or get per batch, its addresses
  computed with numpy (layout.py), no per-page Python work;
- a page's key is umbp.derive_keys(namespace, rank, 0, sha256 of the page):
  SGLang's page hash (a 64-hex-digit SHA-256 string) is the block hash, the
  rank is (tp_rank, pp_rank, attn_cp_rank, 0) -- tp_rank 0 for MLA, whose
  latent cache is the same on every TP rank -- and the namespace comes from
  model, revision, page size, layout, dtype and the parallel sizes;
- MLA: only TP rank 0 writes (SGLang's controller skips backups elsewhere;
  ``batch_set_v1`` on another rank returns all True without writing) and
  every rank reads rank 0's objects;
- failures of data calls are misses: ``False`` / ``None`` / 0 hits and a
  rate-limited log line, never an exception into SGLang's cache controller.
  Only construction (bad options, unreachable server),
  ``register_mem_pool_host`` and ``register_mem_host_pool_v2`` (a pool this
  backend cannot address, named with the reason) raise;
- the v2 multi-pool interface of SGLang's hybrid controller (Mamba / linear
  attention state, SWA, DSA indexer, draft pools): ``register_mem_host_pool_v2``
  takes every pool it can address -- KV-shaped pools (SWA, draft) by their
  kv_buffer, the others (Mamba, indexer, ...) by the pool's own
  ``get_page_buffer_meta``, checked against its buffers at registration --
  and refuses the rest at startup.  ``batch_set_v2`` / ``batch_get_v2`` copy
  straight between a pool's host pages and one umbp object per page, keyed
  like KV pages but in a namespace of that pool (name and byte geometry), so
  pools never collide.  ``batch_exists_v2`` applies SGLang's hit policies:
  the usable prefix is the longest one whose KV pages, "all_pages" pools'
  pages [0, P) and "trailing_pages" pools' last N pages are all stored.  For
  MLA models a pool is replicated (keys of TP rank 0, written by rank 0 only)
  except Mamba state, which SGLang shards by TP rank and backs up on every
  rank.  A v2 transfer of the KV pool itself maps onto v1.

Written against SGLang ``sgl-project/sglang`` at commit 001067ff
(hicache_storage.py -- PoolName, PoolHitPolicy, PoolTransfer,
PoolTransferResult, count_pool_hits, HiCacheFile's v2 --,
storage/backend_factory.py, managers/cache_controller.py with
_page_transfer_kv_batch) and the host pools of pool_host/mha.py and
pool_host/mla.py of the same period; for v2, also
hybrid_cache/hybrid_cache_controller.py and hybrid_pool_assembler.py at
00343773 (which pools, and how the v2 calls are made and read),
pool_host/mamba.py at 02f0c2a0 and pool_host/dsa.py at 03ba7b5b (the pools'
buffers and get_page_buffer_meta) and, for comparison, Mooncake's v2 in
storage/mooncake_store/mooncake_store.py at 00fe477f (docs/sglang.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from typing import Any, List, Optional

import numpy as np

import umbp

from . import config as _config
from ._compat import (
    HAVE_SGLANG,
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransferResult,
    StorageMetrics,
)
from .config import UMBPStoreConfigError
from .layout import AffineLayout, LayoutError, PageLayout, check_against_page_meta, kv_shaped

logger = logging.getLogger(__name__)

_warned: set = set()  # what _warn_once has said in this process


def _warn_once(what: str, msg: str, *args) -> None:
    """A warning logged once per process (every rank of a process builds its
    backend from the same extra_config)."""
    if what not in _warned:
        _warned.add(what)
        logger.warning(msg, *args)

__all__ = ["UMBPStore", "UMBPStoreConfigError", "LayoutError", "page_hashes",
           "HiCacheStorageConfig", "HiCacheStorageExtraInfo", "HAVE_SGLANG"]

_HASH_LEN = 32
_KEY_PERSON = b"umbp-sglang-key"  # domain of keys that are not SHA-256 hex strings


def _one_hash(key: Any) -> bytes:
    if isinstance(key, str):
        if len(key) == 64:
            try:
                b = bytes.fromhex(key)
                if len(b) == _HASH_LEN:
                    return b
            except ValueError:
                pass
        return hashlib.blake2b(key.encode("utf-8"), digest_size=_HASH_LEN, person=_KEY_PERSON).digest()
    if isinstance(key, (bytes, bytearray)):
        if len(key) == _HASH_LEN:
            return bytes(key)
        return hashlib.blake2b(bytes(key), digest_size=_HASH_LEN, person=_KEY_PERSON).digest()
    raise TypeError(f"a HiCache key must be str or bytes, got {type(key).__name__}")


def page_hashes(keys: List[Any]) -> bytes:
    """32 bytes per SGLang key, end to end: the SHA-256 a 64-hex-digit page
    hash spells (SGLang's get_hash_str), or BLAKE2b of any other key.  A key
    maps to the same bytes whatever batch it comes in.  A batch of hex keys
    costs two C calls (join, fromhex)."""
    n = len(keys)
    try:
        if n and set(map(len, keys)) == {64}:
            b = bytes.fromhex("".join(keys))
            if len(b) == _HASH_LEN * n:  # fromhex skips whitespace: a short result is not hex
                return b
    except (TypeError, ValueError):
        pass
    return b"".join(_one_hash(k) for k in keys)


def _pool_name(name: Any) -> str:
    """SGLang's PoolName (a str Enum) or a plain string, as the string."""
    return str(getattr(name, "value", name))


_LOOKUP_CHUNK = 16384  # keys per lookup call of batch_exists_v2

# SGLang after 001067ff added PoolTransferResult.restorable_prefix_pages (the
# stop points a rank can restore, intersected across ranks by the caller);
# filled in where the installed SGLang has it.
_RESULT_HAS_RESTORABLE = "restorable_prefix_pages" in {
    f.name for f in (dataclasses.fields(PoolTransferResult)
                     if dataclasses.is_dataclass(PoolTransferResult) else ())}


def _pool_result(kv_hit_pages: int, hits: dict, restorable: List[int]):
    if _RESULT_HAS_RESTORABLE:
        return PoolTransferResult(kv_hit_pages=kv_hit_pages, extra_pool_hit_pages=hits,
                                  restorable_prefix_pages=restorable)
    return PoolTransferResult(kv_hit_pages=kv_hit_pages, extra_pool_hit_pages=hits)


def _restorable(present: np.ndarray, transfer: Any) -> np.ndarray:
    """ok (P + 1,) over the prefixes 0 .. P of the P stored KV pages: ok[p]
    when this pool can restore the prefix of p pages under the transfer's hit
    policy (SGLang's PoolHitPolicy): "all_pages" needs the pool's pages
    [0, p), "trailing_pages" its last N = len(transfer.keys) (at least 1)
    pages [p - N, p).  ok[0] is False (no prefix to restore)."""
    p = present.shape[0]
    ok = np.zeros(p + 1, dtype=bool)
    policy = str(getattr(getattr(transfer, "hit_policy", None), "value",
                         getattr(transfer, "hit_policy", None)) or "all_pages")
    if policy == "all_pages":
        b = int(np.argmin(present)) if not present.all() else p
        ok[1:b + 1] = True
    elif policy == "trailing_pages":
        keys = getattr(transfer, "keys", None)
        window = max(1, len(keys) if keys else 1)
        c = np.concatenate(([0], np.cumsum(present, dtype=np.int64)))
        ends = np.arange(1, p + 1)
        starts = np.maximum(ends - window, 0)
        ok[1:] = (c[ends] - c[starts]) == (ends - starts)
    else:
        raise ValueError(f"unknown hit policy {policy!r} for pool "
                         f"{_pool_name(getattr(transfer, 'name', None))!r}")
    return ok


@dataclasses.dataclass
class _SidePool:
    """A non-KV host pool registered through register_mem_host_pool_v2."""
    name: str
    pool: Any
    layout: Any            # PageLayout (KV-shaped pools) or AffineLayout
    namespace: Any         # umbp.Namespace of this pool's objects
    key_rank: tuple        # (tp, pp, cp, 0); tp 0 for a replicated pool
    replicated: bool       # the same bytes on every TP rank (MLA models)
    writer: bool           # this rank stores the pool's pages


class _RateLimitedLog:
    """One log line per kind per interval, with the count of the ones held back."""

    def __init__(self, interval_s: float = 10.0):
        self._interval = interval_s
        self._last = {}
        self._held = {}
        self._lock = threading.Lock()

    def __call__(self, level: int, kind: str, msg: str, *args) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            held = self._held.pop(kind, 0)
            self._last[kind] = now
        if held:
            msg += " (%d similar messages held back)"
            args = args + (held,)
        logger.log(level, msg, *args)


def _tensor_facts(t: Any):
    """(address, bytes, keep-alive object) of a contiguous torch tensor or numpy
    array; a non-contiguous one is copied (for puts only the copy is read)."""
    if isinstance(t, np.ndarray):
        if not t.flags.c_contiguous:
            t = np.ascontiguousarray(t)
        return int(t.ctypes.data), int(t.nbytes), t
    if hasattr(t, "data_ptr"):
        if getattr(getattr(t, "device", None), "type", "cpu") != "cpu":
            raise ValueError(f"tensor on {t.device}: the legacy path takes host tensors")
        if not t.is_contiguous():
            t = t.contiguous()
        return int(t.data_ptr()), int(t.numel() * t.element_size()), t
    raise TypeError(f"expected a torch tensor or numpy array, got {type(t).__name__}")


class UMBPStore(HiCacheStorage):
    """SGLang HiCacheStorage on one umbp.Runtime per rank (see the module doc)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[Any] = None):
        self._rt = None
        self._closed = False
        self._log = _RateLimitedLog()
        self.storage_config = storage_config
        self._cfg = _config.parse(getattr(storage_config, "extra_config", None))

        self.tp_rank = int(storage_config.tp_rank)
        self.tp_size = int(storage_config.tp_size)
        self.pp_rank = int(getattr(storage_config, "pp_rank", 0) or 0)
        self.pp_size = int(getattr(storage_config, "pp_size", 1) or 1)
        self.cp_rank = int(getattr(storage_config, "attn_cp_rank", 0) or 0)
        self.cp_size = int(getattr(storage_config, "attn_cp_size", 1) or 1)
        self.dp_rank = int(getattr(storage_config, "dp_rank", 0) or 0)
        if self._cfg.dp_rank == "auto" and not hasattr(storage_config, "dp_rank"):
            _warn_once(
                "dp_rank_auto",
                "umbp.sglang: extra_config \"dp_rank\": \"auto\" means SGLang's attention-DP rank "
                "(HiCacheStorageConfig.dp_rank), which this SGLang's %s does not have (SGLang at "
                "001067fffe33 has it): every DP rank uses dp_rank 0 (standalone: umbp-dp0.sock, one "
                "server shared by all of them); give \"dp_rank\" as a number to choose a server",
                type(storage_config).__name__)
        self.is_mla = bool(storage_config.is_mla_model)
        self.model_name = getattr(storage_config, "model_name", None) or ""
        self.enable_metrics = bool(getattr(storage_config, "enable_storage_metrics", False))

        for what, r, s in (("tp", self.tp_rank, self.tp_size), ("pp", self.pp_rank, self.pp_size),
                           ("attn_cp", self.cp_rank, self.cp_size)):
            if s < 1 or not 0 <= r < s:
                raise UMBPStoreConfigError(
                    f"umbp.sglang: storage_config {what}_rank {r} / {what}_size {s} out of range")
        if getattr(storage_config, "should_split_heads", False):
            raise UMBPStoreConfigError(
                "umbp.sglang: heterogeneous TP (should_split_heads, page_head split pages) is "
                "not supported by the umbp backend")
        if self.is_mla and self.tp_size > 1 and not self._cfg.props.shared_pool:
            raise UMBPStoreConfigError(
                f"umbp.sglang: mode 'embedded' with an MLA model and tp_size {self.tp_size}: "
                "SGLang backs up MLA pages from TP rank 0 only, so the private pools of the "
                "other ranks would never hold a page and every prefetch would miss; use "
                "\"mode\": \"standalone\" (one umbp-server per host, shared by the ranks)")
        if not self._cfg.interface_v1:
            logger.warning(
                "umbp.sglang: extra_config has no \"interface_v1\": 1, so SGLang will use the "
                "copying legacy get/set path instead of the zero-copy batch_get_v1/batch_set_v1")

        # MLA: one copy of the latent cache, written by TP rank 0, read by all
        self.is_writer = not (self.is_mla and self.tp_rank != 0)
        self.key_rank = (0 if self.is_mla else self.tp_rank, self.pp_rank, self.cp_rank, 0)
        self.rank = (self.pp_rank * self.cp_size + self.cp_rank) * self.tp_size + self.tp_rank
        self.world_size = self.tp_size * self.pp_size * self.cp_size
        self.runtime_options = self._cfg.runtime_config(self.rank, self.world_size, self.dp_rank)
        try:
            self._rt = umbp.Runtime(self.runtime_options)
        except umbp.UmbpError as e:
            raise UMBPStoreConfigError(
                f"umbp.sglang: creating the umbp runtime (mode {self._cfg.mode}, rank "
                f"{self.rank}/{self.world_size}) failed: {e}") from e

        self.layout: Optional[PageLayout] = None
        self.namespace = None
        self.mem_pool_host = None
        self._pools: dict = {}  # name -> _SidePool (register_mem_host_pool_v2)
        self._metrics_lock = threading.Lock()
        self._prefetch_pgs: List[int] = []
        self._backup_pgs: List[int] = []
        self._prefetch_bw: List[float] = []
        self._backup_bw: List[float] = []
        logger.info("umbp.sglang: %s runtime for rank %d/%d (tp %d/%d, pp %d/%d, cp %d/%d%s)",
                    self._cfg.mode, self.rank, self.world_size, self.tp_rank, self.tp_size,
                    self.pp_rank, self.pp_size, self.cp_rank, self.cp_size,
                    ", MLA" + ("" if self.is_writer else " reader") if self.is_mla else "")

        # registered as a built-in backend, SGLang passes the host pool second
        if kwargs is not None and hasattr(kwargs, "kv_buffer"):
            self.register_mem_pool_host(kwargs)

    # ---- setup -----------------------------------------------------------

    def _refuse_dcp_share(self, pool: Any) -> None:
        """LayoutError where decode context parallelism is on: the host pool's
        dcp_size (SGLang's MLATokenToKVPoolHost holds one DCP rank's share of
        each page, pool_host/mla.py@01c0ede3), or, for a pool without one,
        HiCacheStorageConfig.dcp_size (newer SGLang, which also scopes its
        storage keys per DCP rank and picks MLA writers with
        is_mla_storage_writer).  umbp's keys and its MLA rule (TP rank 0
        writes, every rank reads) know nothing of DCP ranks, so another rank
        would load rank 0's share as its own: refused until umbp supports
        DCP."""
        def size_of(obj) -> int:
            try:
                return int(getattr(obj, "dcp_size", 1) or 1)
            except (TypeError, ValueError):
                return 1
        if hasattr(pool, "dcp_size"):
            dcp, where = size_of(pool), pool
        else:
            dcp, where = size_of(self.storage_config), self.storage_config
        if dcp > 1:
            source = "host pool" if where is pool else "storage config"
            raise LayoutError(
                f"umbp does not support decode context parallelism yet (dcp_size {dcp}, dcp_rank "
                f"{getattr(where, 'dcp_rank', '?')}, from the {source}): "
                "each rank's host pool holds one DCP rank's share of every page, and umbp's keys "
                "and its MLA rule (TP rank 0 writes, every rank reads) do not tell the shares "
                "apart; run without --dcp-size or without the umbp storage backend")

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Learns the host pool's layout and derives the key namespace.  Raises
        LayoutError (a ValueError) for a pool this backend cannot address."""
        self._refuse_dcp_share(mem_pool_host)
        super().register_mem_pool_host(mem_pool_host)
        if getattr(mem_pool_host, "kv_buffer", None) is None and not self.is_writer:
            # SGLang's dummy MLA host pool on a rank that never backs up: keys and
            # lookups still work (they answer for rank 0's pages); loads miss
            lay = PageLayout.without_buffer(mem_pool_host, self.is_mla)
            logger.warning("umbp.sglang: host pool without kv_buffer on MLA rank %d: lookups "
                           "only, every load misses", self.tp_rank)
        else:
            lay = PageLayout.from_pool(mem_pool_host, self.is_mla)
        if self._cfg.key_namespace is not None:
            ns = umbp.Namespace.from_string(self._cfg.key_namespace)
        else:
            model = self.model_name
            if not model:
                model = "unnamed-model"
                logger.warning("umbp.sglang: storage_config has no model_name; keys use %r "
                               "(set key_namespace to share objects deliberately)", model)
            kind = "mla" if self.is_mla else "full"
            ns = umbp.Namespace.derive(
                model, self._cfg.model_revision, lay.page_size,
                f"sglang:{lay.layout}:{lay.token_bytes}", lay.dtype,
                groups=[(kind, lay.page_size, lay.num_layers, lay.dtype)],
                tp=1 if self.is_mla else self.tp_size, pp=self.pp_size, pcp=self.cp_size, dcp=1)
        self.layout = lay
        self.namespace = ns
        logger.info("umbp.sglang: host pool %s; namespace %s", lay.describe(), ns.hex)

    # ---- the v2 multi-pool interface ---------------------------------------
    #
    # SGLang's hybrid controller (hybrid_cache_controller.py) registers every
    # host pool of a hybrid model, the KV anchor included, and moves the other
    # pools with batch_exists_v2 / batch_get_v2 / batch_set_v2 (the KV pool
    # itself still goes through batch_*_v1).  Each registered pool gets its own
    # key namespace (model, revision, pool name, byte geometry, parallel sizes),
    # so a Mamba page and a DSA indexer page of the same page hash are different
    # objects, and one umbp object per pool page.

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Accepts the KV anchor (the pool register_mem_pool_host took; another
        object is taken the same way) and every other pool this backend can
        address: KV-shaped pools (SWA, draft) by their kv_buffer, every other
        pool (Mamba state, DSA indexer, ...) by SGLang's own
        get_page_buffer_meta, checked against the pool's buffers.  A pool it
        cannot address raises UMBPStoreConfigError naming the pool and why, so
        SGLang fails at startup instead of serving prefixes whose state was
        never stored."""
        name = _pool_name(host_pool_name)
        if name == "kv":
            if host_pool is not getattr(self, "mem_pool_host", None):
                self.register_mem_pool_host(host_pool)
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
            return
        try:
            side = self._side_pool(host_pool, name)
        except (LayoutError, umbp.UmbpError) as e:
            raise UMBPStoreConfigError(
                f"umbp.sglang: cannot store SGLang host pool {name!r} "
                f"({type(host_pool).__name__}): {e}") from None
        self._pools[name] = side
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        logger.info("umbp.sglang: host pool %r: %s; keys of %s (namespace %s)%s", name,
                    side.layout.describe(),
                    "TP rank 0 (replicated across TP)" if side.replicated else "this TP rank",
                    side.namespace.hex, "" if side.writer else ", read only on this rank")

    def _side_pool(self, pool: Any, name: str) -> "_SidePool":
        self._refuse_dcp_share(pool)
        mla_shaped = kv_shaped(pool)
        if mla_shaped is not None:
            lay = PageLayout.from_pool(pool, mla_shaped)
            check_against_page_meta(lay, pool)
            layers = lay.num_layers
        else:
            lay = AffineLayout.from_page_buffer_meta(pool)
            layers = getattr(pool, "layer_num", None) or getattr(pool, "num_mamba_layers", None) or 1
        # MLA (SGLang's is_mla_model: every rank-replicated model): SGLang backs
        # up a non-KV pool from TP rank 0 only, except Mamba state, which is
        # sharded by TP rank and backed up on every rank (should_backup).
        replicated = self.is_mla and name != "mamba"
        if replicated and mla_shaped is False and self.tp_size > 1:
            raise LayoutError(
                f"an MHA pool (K/V heads split over the {self.tp_size} TP ranks) in an MLA "
                "model: SGLang's hybrid controller backs it up from TP rank 0 only "
                "(should_backup), so the other ranks could never load their own heads")
        geometry = lay.geometry
        if self._cfg.key_namespace is not None:
            model, revision, tag = self._cfg.key_namespace, "", "sglang-pool-override"
        else:
            model, revision, tag = (self.model_name or "unnamed-model", self._cfg.model_revision,
                                    "sglang-pool")
        desc = f"{tag}:{name}:{geometry}"
        if len(desc.encode()) > 1024:
            desc = f"{tag}:{name}:sha256:{hashlib.sha256(geometry.encode()).hexdigest()}"
        ns = umbp.Namespace.derive(
            model, revision, lay.page_size, desc, lay.dtype,
            groups=[(name, lay.page_size, max(1, int(layers)), lay.dtype)],
            tp=1 if replicated else self.tp_size, pp=self.pp_size, pcp=self.cp_size, dcp=1)
        return _SidePool(name=name, pool=pool, layout=lay, namespace=ns,
                         key_rank=(0 if replicated else self.tp_rank, self.pp_rank, self.cp_rank, 0),
                         replicated=replicated,
                         writer=not (replicated and self.tp_rank != 0))

    def _pool_keys(self, side: "_SidePool", hashes: bytes) -> np.ndarray:
        return umbp.derive_keys(side.namespace, rank=side.key_rank, group=0, hashes=hashes,
                                hash_len=_HASH_LEN)

    def _lookup_present(self, key_rows: List[np.ndarray]) -> List[np.ndarray]:
        """Which of each array of keys are stored: one lookup (no LRU touch)
        for all of them, in chunks of _LOOKUP_CHUNK keys."""
        sizes = [k.shape[0] for k in key_rows]
        allk = np.concatenate(key_rows) if key_rows else np.zeros((0, 32), dtype=np.uint8)
        present = np.zeros(allk.shape[0], dtype=bool)
        for s in range(0, allk.shape[0], _LOOKUP_CHUNK):
            _, p = self._rt.lookup(allk[s:s + _LOOKUP_CHUNK], touch=False)
            present[s:s + _LOOKUP_CHUNK] = p
        return np.split(present, np.cumsum(sizes)[:-1]) if sizes else []

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[Any]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None):
        """SGLang's multi-pool prefix match (hicache_storage.py's docstring):
        kv_hit_pages is the longest prefix P of keys that every pool can
        restore: the KV pages [0, P) are stored, an "all_pages" pool has its
        pages [0, P), a "trailing_pages" pool its last len(transfer.keys)
        pages [P - N, P).  extra_pool_hit_pages has, per pool, the longest
        such prefix for that pool alone (and "kv": the stored KV prefix).  A
        pool's page i is the object of keys[i] in that pool.  A pool never
        registered, or a failure, counts as nothing stored."""
        try:
            keys = list(keys or [])
            transfers = list(pool_transfers or [])
            n = len(keys)
            if n == 0 or self._not_ready("batch_exists_v2"):
                return _pool_result(0, {}, [])
            hashes = page_hashes(keys)
            names = [_pool_name(t.name) for t in transfers]
            sides = {}
            for nm in dict.fromkeys(names):
                if nm == "kv":
                    continue
                side = self._pools.get(nm)
                if side is None:
                    self._log(logging.WARNING, "v2-unregistered",
                              "umbp.sglang: batch_exists_v2 for pool %r, never registered "
                              "with register_mem_host_pool_v2: 0 pages", nm)
                    continue
                sides[nm] = side
            rows = [self._keys(keys)] + [self._pool_keys(s, hashes) for s in sides.values()]
            present = dict(zip(["kv", *sides], self._lookup_present(rows)))
            kv = present["kv"]
            kv_pages = int(np.argmin(kv)) if not kv.all() else n
            stops = np.zeros(kv_pages + 1, dtype=bool)  # stops[P]: prefix P restorable
            stops[1:] = True
            hits = {PoolName.KV: kv_pages}
            for t, nm in zip(transfers, names):
                pres = present.get(nm)
                if pres is None:
                    pres = np.zeros(n, dtype=bool)
                ok = _restorable(pres[:kv_pages], t)
                hits[t.name] = int(np.flatnonzero(ok)[-1]) if ok.any() else 0
                stops &= ok
            restorable = np.flatnonzero(stops).tolist()
            return _pool_result(restorable[-1] if restorable else 0, hits, restorable)
        except Exception as e:
            self._log(logging.WARNING, "exists-v2-error", "umbp.sglang: batch_exists_v2 failed: %s", e)
            return _pool_result(0, {}, [])

    def _v2_io(self, t: Any, op: str, extra_info) -> List[bool]:
        """One transfer of batch_get_v2 (op "get") or batch_set_v2 ("put"):
        per-page success, never an exception."""
        keys = list(getattr(t, "keys", None) or [])
        n = len(keys)
        if n == 0:
            return []
        name = _pool_name(getattr(t, "name", None))
        host_indices = getattr(t, "host_indices", None)
        try:
            if name == "kv":
                if op == "get":
                    return self.batch_get_v1(keys, host_indices, extra_info)
                return self.batch_set_v1(keys, host_indices, extra_info)
            side = self._pools.get(name)
            if side is None:
                self._log(logging.WARNING, "v2-unregistered",
                          "umbp.sglang: %s of pool %r, never registered with "
                          "register_mem_host_pool_v2: %d pages counted as failed",
                          op, name, n)
                return [False] * n
            if op == "put" and not side.writer:
                return [True] * n  # rank 0 stores the replicated pool (see _side_pool)
            if self._closed or self._rt is None:
                return [False] * n
            lay = side.layout
            first = lay.first_slots(host_indices, n)
            ptrs, lens, offs = lay.ranges(first)
            k = self._pool_keys(side, page_hashes(keys))
            if op == "put":
                ok = self._submit(lambda sel: self._rt.put_ranges(k[sel], lay.object_size, ptrs[sel],
                                                                  lens[sel]), k, "put", n)
            else:
                ok = self._submit(lambda sel: self._rt.get_ranges(k[sel], ptrs[sel], lens[sel],
                                                                  offs[sel]), k, "get", n)
            if op == "put" and not ok.all():
                self._log(logging.WARNING, "v2-put-failed",
                          "umbp.sglang: %d of %d pages of pool %r not stored (pool full, "
                          "timeout or server unreachable)", n - int(ok.sum()), n, name)
            return ok.tolist()
        except Exception as e:  # never into SGLang's prefetch or backup thread
            self._log(logging.WARNING, "v2-" + op + "-error",
                      "umbp.sglang: %s of %d pages of pool %r failed: %s", op, n, name, e)
            return [False] * n

    def _v2_batch(self, transfers: Optional[List[Any]], op: str, extra_info) -> dict:
        out: dict = {}
        try:
            transfers = list(transfers or [])
        except Exception as e:
            self._log(logging.WARNING, "v2-" + op + "-error",
                      "umbp.sglang: batch_%s_v2 of %r: %s", op, type(transfers).__name__, e)
            return out
        for i, t in enumerate(transfers):
            try:
                out[getattr(t, "name", i)] = self._v2_io(t, op, extra_info)
            except Exception as e:  # an unhashable name, say
                self._log(logging.WARNING, "v2-" + op + "-error",
                          "umbp.sglang: batch_%s_v2 transfer %d: %s", op, i, e)
        return out

    def batch_get_v2(self, transfers: List[Any],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        """{transfer.name: per-page success}: each transfer's pages read from
        umbp into its pool's host pages at transfer.host_indices
        (len(keys) * pool.page_size slots; a page is named by its first)."""
        return self._v2_batch(transfers, "get", extra_info)

    def batch_set_v2(self, transfers: List[Any],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        """{transfer.name: per-page success}: each transfer's host pages
        stored as one umbp object per page.  On an MLA rank other than TP 0,
        a replicated pool's pages are rank 0's to store: all True, nothing
        written (as batch_set_v1)."""
        return self._v2_batch(transfers, "put", extra_info)

    def _keys(self, keys: List[Any]) -> np.ndarray:
        return umbp.derive_keys(self.namespace, rank=self.key_rank, group=0,
                                hashes=page_hashes(keys), hash_len=_HASH_LEN)

    def _finish(self, job, what: str, n: int) -> np.ndarray:
        """Waits for a job to complete and returns its per-key success;
        releases it.  Every job here copies to or from SGLang's host pages,
        which SGLang frees and reuses as soon as the call returns, and a job
        released in flight goes on copying (umbp.h: a get may still write its
        destination, a put still reads its source and publishes).  So it is
        never handed back in flight: umbp completes every op within
        timeout_ms (a timed-out copy is cut at its next chunk), and an op
        that has not after two waits is logged at error and waited for."""
        try:
            done = job.wait() or job.wait()
            rounds = 2
            while not done:
                self._log(logging.ERROR, what + "-stuck",
                          "umbp.sglang: a %s of %d pages has not completed after %d waits of "
                          "timeout_ms; still waiting (it copies SGLang's host pages)",
                          what, n, rounds)
                done = job.wait()
                rounds += 1
            return np.asarray(job.ok, dtype=bool).copy()
        finally:
            job.release()

    def _submit(self, submit, key_rows: np.ndarray, what: str, n: int) -> np.ndarray:
        """Runs submit(rows) over key_rows; a batch that repeats a key (which
        umbp refuses whole) is split into batches of distinct keys."""
        try:
            return self._finish(submit(np.arange(n)), what, n)
        except umbp.UmbpError as e:
            if getattr(e, "code", None) != umbp.E_DUPLICATE_KEY:
                raise
        ok = np.zeros(n, dtype=bool)
        rest = np.arange(n)
        view = np.ascontiguousarray(key_rows).view(np.dtype((np.void, key_rows.shape[1]))).reshape(-1)
        while rest.size:
            _, first = np.unique(view[rest], return_index=True)
            sel = rest[np.sort(first)]
            ok[sel] = self._finish(submit(sel), what, sel.size)
            rest = np.setdiff1d(rest, sel, assume_unique=True)
        return ok

    def _record(self, pgs: List[int], bw: List[float], pages: int, nbytes: int, t0: float) -> None:
        if not self.enable_metrics or pages == 0:
            return
        dt = time.perf_counter() - t0
        with self._metrics_lock:
            pgs.append(pages)
            bw.append(nbytes / dt / 1e9 if dt > 0 else 0.0)

    def _not_ready(self, what: str) -> bool:
        if self._closed or self._rt is None:
            return True
        if self.layout is None:
            self._log(logging.WARNING, "unregistered",
                      "umbp.sglang: %s before register_mem_pool_host; counted as a miss", what)
            return True
        return False

    # ---- zero-copy path (interface_v1) -------------------------------------

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        n = len(keys)
        if n == 0:
            return []
        if not self.is_writer:
            return [True] * n
        if self._not_ready("batch_set_v1"):
            return [False] * n
        try:
            t0 = time.perf_counter()
            lay = self.layout
            first = lay.first_slots(host_indices, n)
            ptrs, lens, _ = lay.ranges(first)
            k = self._keys(keys)
            ok = self._submit(lambda sel: self._rt.put_ranges(k[sel], lay.object_size, ptrs[sel], lens[sel]),
                              k, "put", n)
            good = int(ok.sum())
            if good < n:
                self._log(logging.WARNING, "put-failed",
                          "umbp.sglang: %d of %d pages not stored (pool full, timeout or "
                          "server unreachable)", n - good, n)
            self._record(self._backup_pgs, self._backup_bw, good, good * lay.object_size, t0)
            return ok.tolist()
        except Exception as e:  # never into SGLang's backup thread
            self._log(logging.WARNING, "put-error", "umbp.sglang: batch_set_v1 of %d pages failed: %s", n, e)
            return [False] * n

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        n = len(keys)
        if n == 0:
            return []
        if self._not_ready("batch_get_v1"):
            return [False] * n
        try:
            t0 = time.perf_counter()
            lay = self.layout
            first = lay.first_slots(host_indices, n)
            ptrs, lens, offs = lay.ranges(first)
            k = self._keys(keys)
            ok = self._submit(lambda sel: self._rt.get_ranges(k[sel], ptrs[sel], lens[sel], offs[sel]),
                              k, "get", n)
            good = int(ok.sum())
            self._record(self._prefetch_pgs, self._prefetch_bw, good, good * lay.object_size, t0)
            return ok.tolist()
        except Exception as e:  # never into SGLang's prefetch thread
            self._log(logging.WARNING, "get-error", "umbp.sglang: batch_get_v1 of %d pages failed: %s", n, e)
            return [False] * n

    # ---- lookups -----------------------------------------------------------

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many leading keys are stored (one lookup round trip; no LRU touch)."""
        if not keys or self._not_ready("batch_exists"):
            return 0
        try:
            prefix, _ = self._rt.lookup(self._keys(keys), touch=False)
            return int(prefix)
        except Exception as e:
            self._log(logging.WARNING, "lookup-error", "umbp.sglang: lookup of %d keys failed: %s",
                      len(keys), e)
            return 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- legacy copying path (SGLang's generic get/set) --------------------

    def _target(self, t: Any):
        if t is not None:
            return t
        buf = self.mem_pool_host.kv_buffer
        count = self.layout.object_size // self.layout.itemsize
        if isinstance(buf, np.ndarray):
            return np.empty(count, dtype=buf.dtype)
        return buf.new_empty((count,))

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Any]:
        """Reads whole objects into the given flat host tensors (SGLang passes
        get_dummy_flat_data_page()s; None allocates one).  Returns the tensor
        of each key found and None for each miss."""
        n = len(keys)
        if n == 0:
            return []
        if self._not_ready("batch_get"):
            return [None] * n
        try:
            size = self.layout.object_size
            targets = [self._target(t) for t in (target_locations or [None] * n)]
            facts = [_tensor_facts(t) for t in targets]
            usable = np.array([f[1] == size and f[2] is t for f, t in zip(facts, targets)], dtype=bool)
            if not usable.all():
                self._log(logging.WARNING, "legacy-size",
                          "umbp.sglang: batch_get target of the wrong size or not contiguous "
                          "(objects are %d bytes); counted as a miss", size)
            idx = np.flatnonzero(usable)
            out: List[Any] = [None] * n
            if idx.size == 0:
                return out
            ptrs = np.array([facts[i][0] for i in idx], dtype=np.uint64)
            k = self._keys([keys[i] for i in idx])
            ok = self._submit(lambda sel: self._rt.get(k[sel], ptrs[sel], size), k, "get", idx.size)
            for j, i in enumerate(idx):
                if ok[j]:
                    out[i] = targets[i]
            return out
        except Exception as e:
            self._log(logging.WARNING, "get-error", "umbp.sglang: batch_get of %d pages failed: %s", n, e)
            return [None] * n

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Any:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None) -> bool:
        """Stores flat data pages (SGLang's get_data_page(index).flatten()), each
        exactly one object; True when every key is stored (or already was)."""
        n = len(keys)
        if n == 0:
            return True
        if not self.is_writer:
            return True
        if self._not_ready("batch_set") or values is None or len(values) != n:
            return False
        try:
            size = self.layout.object_size
            facts = [_tensor_facts(v) for v in values]
            if any(f[1] != size for f in facts):
                self._log(logging.WARNING, "legacy-size",
                          "umbp.sglang: batch_set value of the wrong size (objects are %d bytes)", size)
                return False
            ptrs = np.array([f[0] for f in facts], dtype=np.uint64)
            k = self._keys(keys)
            ok = self._submit(lambda sel: self._rt.put(k[sel], ptrs[sel], size), k, "put", n)
            del facts  # the copies made for non-contiguous values lived until here
            return bool(ok.all())
        except Exception as e:
            self._log(logging.WARNING, "put-error", "umbp.sglang: batch_set of %d pages failed: %s", n, e)
            return False

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], None if value is None else [value])

    # ---- management --------------------------------------------------------

    def clear(self) -> bool:
        """Removes every object of this rank's pool.  In standalone mode the pool
        is the server's, shared by every engine on the host: clear_shared_pool
        (default true) says whether to clear it anyway."""
        if self._closed or self._rt is None:
            return False
        if self._cfg.props.shared_pool and not self._cfg.clear_shared_pool:
            logger.warning("umbp.sglang: clear() ignored: the standalone pool is shared by every "
                           "engine on the host and clear_shared_pool is false")
            return False
        try:
            self._rt.clear()
            return True
        except Exception as e:
            logger.warning("umbp.sglang: clear failed: %s", e)
            return False

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (pages and GB/s of each
        prefetch and backup batch), or None without --enable-storage-metrics."""
        if not self.enable_metrics:
            return None
        with self._metrics_lock:
            m = StorageMetrics(prefetch_pgs=self._prefetch_pgs, backup_pgs=self._backup_pgs,
                               prefetch_bandwidth=self._prefetch_bw, backup_bandwidth=self._backup_bw)
            self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw = [], [], [], []
        return m

    def umbp_stats(self) -> dict:
        """The runtime's counters (umbp_stats_t fields); {} when unavailable."""
        try:
            return dict(self._rt.stats()) if self._rt is not None and not self._closed else {}
        except Exception:
            return {}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        rt, self._rt = self._rt, None
        if rt is not None:
            try:
                rt.close()
            except Exception:
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

