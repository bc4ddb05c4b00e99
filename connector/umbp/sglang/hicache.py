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
  ``register_mem_pool_host`` (a layout this backend cannot address) and
  ``register_mem_host_pool_v2`` of any pool but KV raise;
- the v2 multi-pool interface (SGLang's hybrid controller: Mamba, SWA, DSA
  indexer, draft pools) is refused at registration, when SGLang starts; the
  ``*_v2`` data calls, if reached anyway, answer misses of SGLang's shapes
  (never NotImplementedError, which would kill SGLang's prefetch or backup
  thread for good).  A transfer of the KV pool itself maps onto v1.

Written against SGLang ``sgl-project/sglang`` at commit 001067ff
(hicache_storage.py, storage/backend_factory.py, managers/cache_controller.py)
and the host pools of pool_host/mha.py and pool_host/mla.py of the same
period; the v2 calls as hybrid_cache/hybrid_cache_controller.py at 00343773
makes them.
"""
from __future__ import annotations

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
    PoolTransferResult,
    StorageMetrics,
)
from .config import UMBPStoreConfigError
from .layout import LayoutError, PageLayout

logger = logging.getLogger(__name__)

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

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Learns the host pool's layout and derives the key namespace.  Raises
        LayoutError (a ValueError) for a pool this backend cannot address."""
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

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang's hybrid controller registers every host pool here, the KV
        anchor included.  The KV pool is the one register_mem_pool_host took
        (or is taken the same way); any other pool (Mamba or SWA state, DSA
        indexer, DeepSeek-V4 compressed pools, draft KV) is refused with
        UMBPStoreConfigError, so SGLang fails at startup instead of serving
        prefixes whose sidecar state was never stored."""
        name = _pool_name(host_pool_name)
        if name == "kv":
            if host_pool is not getattr(self, "mem_pool_host", None):
                self.register_mem_pool_host(host_pool)
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
            return
        raise UMBPStoreConfigError(
            f"umbp.sglang: SGLang registered host pool {name!r} through register_mem_host_pool_v2, "
            "but the umbp backend stores only the KV pool (one object per KV page) and does "
            "not implement the v2 multi-pool interface that hybrid models need (Mamba/linear "
            "attention or SWA state, DSA indexer, DeepSeek-V4 compressed pools, speculative "
            "draft pools). Serve this model without --hicache-storage-backend (HiCache's host "
            "tier still works), or with a storage backend that implements "
            "batch_exists_v2/batch_get_v2/batch_set_v2")

    def _v2_results(self, transfers: Optional[List[Any]], v1, what: str) -> dict:
        """{pool name: per-page success} for each transfer: the KV pool's via
        v1, every other pool's all False (never registered: see above)."""
        out: dict = {}
        refused = []
        for t in transfers or []:
            keys = list(getattr(t, "keys", None) or [])
            if _pool_name(t.name) == "kv" and getattr(t, "host_indices", None) is not None:
                out[t.name] = v1(keys, t.host_indices)
            else:
                out[t.name] = [False] * len(keys)
                refused.append(_pool_name(t.name))
        if refused:
            self._log(logging.WARNING, what + "-v2",
                      "umbp.sglang: %s for pools %s counted as misses: the umbp backend stores "
                      "only the KV pool (docs/sglang.md, \"The v2 interface\")", what, refused)
        return out

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[Any]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None):
        """With no extra pools, batch_exists.  With any, no usable prefix: SGLang
        takes the minimum over the pools, and umbp holds none of the others."""
        try:
            extra = list(pool_transfers or [])
            others = [t for t in extra if _pool_name(t.name) != "kv"]
            if others:
                self._log(logging.WARNING, "exists-v2",
                          "umbp.sglang: batch_exists_v2 with pools %s: 0 pages (the umbp "
                          "backend stores only the KV pool)", [_pool_name(t.name) for t in others])
                return PoolTransferResult(0, {t.name: 0 for t in extra})
            hit = self.batch_exists(keys, extra_info)
            return PoolTransferResult(hit, {t.name: hit for t in extra})
        except Exception as e:
            self._log(logging.WARNING, "exists-v2-error", "umbp.sglang: batch_exists_v2 failed: %s", e)
            return PoolTransferResult(0, {})

    def batch_get_v2(self, transfers: List[Any],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        try:
            return self._v2_results(transfers, lambda k, h: self.batch_get_v1(k, h, extra_info),
                                    "batch_get_v2")
        except Exception as e:  # never into SGLang's prefetch thread
            self._log(logging.WARNING, "get-v2-error", "umbp.sglang: batch_get_v2 failed: %s", e)
            return {getattr(t, "name", i): [False] * len(getattr(t, "keys", None) or [])
                    for i, t in enumerate(transfers or [])}

    def batch_set_v2(self, transfers: List[Any],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        try:
            return self._v2_results(transfers, lambda k, h: self.batch_set_v1(k, h, extra_info),
                                    "batch_set_v2")
        except Exception as e:  # never into SGLang's backup thread
            self._log(logging.WARNING, "put-v2-error", "umbp.sglang: batch_set_v2 failed: %s", e)
            return {getattr(t, "name", i): [False] * len(getattr(t, "keys", None) or [])
                    for i, t in enumerate(transfers or [])}

    def _keys(self, keys: List[Any]) -> np.ndarray:
        return umbp.derive_keys(self.namespace, rank=self.key_rank, group=0,
                                hashes=page_hashes(keys), hash_len=_HASH_LEN)

    def _finish(self, job, what: str, n: int) -> np.ndarray:
        """Waits for a job (bounded by the runtime's timeout_ms, twice) and
        returns its per-key success; releases it."""
        try:
            done = job.wait() or job.wait()
            if not done:
                self._log(logging.ERROR, what + "-stuck",
                          "umbp.sglang: a %s of %d pages did not complete within two timeout_ms; "
                          "counted as failed", what, n)
                return np.zeros(n, dtype=bool)
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

