"""Tests of umbp.sglang (the SGLang HiCache L3 storage backend).

SGLang cannot be installed here: sglang_fakes.FakeHostPool stands in for its
host KV pool (real shapes per layout), FakeMambaPoolHost and
FakeDSAIndexerPoolHost for the other pools of hybrid models (the v2
interface), and umbp.sglang._compat for its HiCacheStorage types.  Run with Debian's python (numpy, torch 1.13, pytest):

    UMBP_LIBRARY=build/libumbp.so /usr/bin/python3 -m pytest connector/tests/test_sglang_backend.py

The standalone tests start an umbp-server: $UMBP_SERVER, else
build/server/umbp-server; they skip, saying
so, when none exists.
"""
from __future__ import annotations

import ctypes
import dataclasses
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from hashlib import sha256
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest
from conftest import master_binary, server_binary, stop_process

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
CONNECTOR = HERE.parent
REPO = CONNECTOR.parent
for p in (str(HERE), str(CONNECTOR)):
    if p not in sys.path:
        sys.path.insert(0, p)

import umbp  # noqa: E402
from sglang_fakes import (  # noqa: E402
    FakeDSAIndexerPoolHost,
    FakeHostPool,
    FakeMambaPoolHost,
    FakeSidecarHostPool,
    count_pool_hits,
    page_indices,
)
from umbp.sglang import _compat, hicache  # noqa: E402
from umbp.sglang.config import UMBPStoreConfigError  # noqa: E402
from umbp.sglang.hicache import UMBPStore, page_hashes  # noqa: E402
from umbp.sglang.layout import AffineLayout, LayoutError, PageLayout  # noqa: E402

MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]
DYNAMIC = {"backend_name": "umbp", "module_path": "umbp.sglang.hicache",
           "class_name": "UMBPStore", "interface_v1": 1}


def hkey(i) -> str:
    """A SGLang-style page hash: 64 hex digits of SHA-256."""
    return sha256(f"page-{i}".encode()).hexdigest()


def scfg(extra=None, *, tp_rank=0, tp_size=1, mla=False, metrics=False, model="test/model", **kw):
    return _compat.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=kw.pop("pp_rank", 0), pp_size=kw.pop("pp_size", 1),
        attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=metrics,
        is_page_first_layout=True, model_name=model,
        extra_config={**DYNAMIC, "capacity_bytes": "64MiB", **(extra or {})}, **kw)


def make_store(pool=None, extra=None, **kw) -> UMBPStore:
    st = UMBPStore(scfg(extra, **kw), {})
    if pool is not None:
        st.register_mem_pool_host(pool)
    return st


@pytest.fixture
def stores():
    made = []

    def make(*a, **kw):
        st = make_store(*a, **kw)
        made.append(st)
        return st
    yield make
    for st in made:
        st.close()


# ---- the standalone server ------------------------------------------------


class Server:
    def __init__(self, capacity="256MiB"):
        binary = server_binary()
        if binary is None:
            pytest.skip("no umbp-server (set UMBP_SERVER or build it): standalone tests skipped")
        self.tmp = tempfile.mkdtemp(prefix="umbp-sgl-")
        self.socket_dir = os.path.join(self.tmp, "s")
        self.argv = [binary, "--json", json.dumps({"capacity_bytes": capacity,
                                                   "socket_dir": self.socket_dir})]
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        line = self.proc.stdout.readline()  # "umbp-server: serving <socket> ..." (stderr)
        if "serving" not in line:
            self.close()
            pytest.fail(f"umbp-server did not start: {line!r}")
        self.log = [line]
        threading.Thread(target=lambda f=self.proc.stdout: self.log.extend(f), daemon=True).start()

    def options(self, **kw):
        return {"mode": "standalone", "socket_dir": self.socket_dir, "startup_timeout_ms": 5000,
                "timeout_ms": 3000, "lookup_timeout_ms": 200, **kw}

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self):
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


# ---- layout arithmetic ----------------------------------------------------

@pytest.mark.parametrize("mla,layout", [(False, lo) for lo in MHA_LAYOUTS] + [(True, lo) for lo in MLA_LAYOUTS])
def test_addresses_match_sglang_page_buffer_meta(mla, layout):
    pool = FakeHostPool(layout, mla=mla)
    lay = PageLayout.from_pool(pool, mla)
    pages = [5, 0, 3]
    idx = page_indices(pool, pages)
    ptrs, lens, offs = lay.ranges(lay.first_slots(idx, len(pages)))
    want_ptrs, want_sizes = pool.get_page_buffer_meta(idx)
    assert lay.object_size == pool.get_dummy_flat_data_page().numel() * pool.itemsize
    assert set(lens.reshape(-1).tolist()) == set(want_sizes)
    if layout == "layer_first" and not mla:
        # SGLang lists K_l, V_l per layer; an object is every K layer, then every V layer
        got = ptrs.reshape(len(pages), 2, -1).transpose(0, 2, 1).reshape(-1)
    else:
        got = ptrs.reshape(-1)
    assert got.tolist() == want_ptrs
    # each row tiles the object in order
    assert (offs[:, 1:] == offs[:, :-1] + lens[:, :-1]).all() and (offs[:, 0] == 0).all()


def test_layout_refuses_what_it_cannot_address():
    with pytest.raises(LayoutError, match="page_head"):  # not an MLA layout
        PageLayout.from_pool(type("P", (), {"layout": "page_head", "page_size": 4,
                                            "kv_buffer": torch.zeros(2, 2, 4, 3, 8)})(), True)
    with pytest.raises(LayoutError, match="page_first_kv_split"):
        PageLayout.from_pool(type("P", (), {"layout": "page_first_kv_split", "page_size": 4,
                                            "kv_buffer": torch.zeros(2, 2, 4, 1, 8)})(), True)
    with pytest.raises(LayoutError, match="dimensions"):
        PageLayout.from_pool(type("P", (), {"layout": "page_first", "page_size": 4,
                                            "kv_buffer": torch.zeros(2, 8, 3, 16)})(), False)
    pool = FakeHostPool("page_first")
    pool.kv_buffer = pool.kv_buffer.transpose(1, 2)
    with pytest.raises(LayoutError, match="contiguous"):
        PageLayout.from_pool(pool, False)
    pool = FakeHostPool("page_first")
    pool.layer_num = 7
    with pytest.raises(LayoutError, match="layer_num"):
        PageLayout.from_pool(pool, False)
    pool = FakeHostPool("page_first_direct")
    pool.page_size = 8
    with pytest.raises(LayoutError, match="page_size"):
        PageLayout.from_pool(pool, False)


# ---- byte-exact round trips ----------------------------------------------

@pytest.mark.parametrize("mla,layout", [(False, lo) for lo in MHA_LAYOUTS] + [(True, lo) for lo in MLA_LAYOUTS])
def test_set_then_get_into_poisoned_pool_is_byte_exact(stores, mla, layout):
    pool = FakeHostPool(layout, mla=mla)
    pool.fill_random(seed=1)
    st = stores(pool, mla=mla)
    src_pages = [6, 1, 4, 2]
    keys = [hkey(i) for i in range(len(src_pages))]
    want = [pool.page_bytes(p * pool.page_size) for p in src_pages]
    assert st.batch_set_v1(keys, page_indices(pool, src_pages)) == [True] * 4

    pool.poison(0xA5)
    dst_pages = [0, 7, 3, 5]
    assert st.batch_get_v1(keys, page_indices(pool, dst_pages)) == [True] * 4
    for p, w in zip(dst_pages, want):
        assert pool.page_bytes(p * pool.page_size) == w
    # nothing outside the destination pages was written
    for p in set(range(pool.page_num)) - set(dst_pages):
        assert set(pool.page_bytes(p * pool.page_size)) == {0xA5}


def test_v1_objects_are_sglang_flat_pages_both_ways(stores):
    """batch_set_v1 and the legacy set store the same bytes (the flat data page)."""
    pool = FakeHostPool("layer_first")
    pool.fill_random(seed=2)
    st = stores(pool)
    assert st.batch_set_v1([hkey(1)], page_indices(pool, [3])) == [True]
    got = st.get(hkey(1), pool.get_dummy_flat_data_page())
    assert got is not None
    assert got.view(torch.uint8).numpy().tobytes() == pool.page_bytes(3 * pool.page_size)

    flat = pool.get_data_page(5 * pool.page_size).clone()
    assert st.set(hkey(2), flat)
    pool.poison()
    assert st.batch_get_v1([hkey(2)], page_indices(pool, [0])) == [True]
    assert pool.page_bytes(0) == flat.view(torch.uint8).numpy().tobytes()
    # batch_get allocates when no target is given; misses are None
    out = st.batch_get([hkey(2), hkey(99)])
    assert out[1] is None and out[0].view(torch.uint8).numpy().tobytes() == flat.view(torch.uint8).numpy().tobytes()
    assert st.batch_set([hkey(3)], [torch.zeros(3, dtype=torch.float16)]) is False  # wrong size


def test_duplicate_keys_in_one_batch(stores):
    pool = FakeHostPool("page_first")
    pool.fill_random(seed=3)
    st = stores(pool)
    want = pool.page_bytes(2 * pool.page_size)
    assert st.batch_set_v1([hkey(1), hkey(1)], page_indices(pool, [2, 4])) == [True, True]
    pool.poison()
    assert st.batch_get_v1([hkey(1), hkey(1)], page_indices(pool, [0, 6])) == [True, True]
    assert pool.page_bytes(0) == want and pool.page_bytes(6 * pool.page_size) == want


# ---- lookups and misses -----------------------------------------------------

def test_exists_and_batch_exists_prefix(stores):
    pool = FakeHostPool("page_first")
    st = stores(pool)
    k = [hkey(i) for i in range(4)]
    assert st.batch_exists(k) == 0
    assert st.batch_set_v1([k[0], k[1], k[2]], page_indices(pool, [0, 1, 2])) == [True] * 3
    assert st.batch_exists(k) == 3
    assert st.batch_exists([k[0], k[1], k[3], k[2]]) == 2
    assert st.batch_exists([k[3], k[0]]) == 0
    assert st.batch_exists([]) == 0
    assert st.exists(k[1]) and not st.exists(k[3])
    assert st.batch_exists(k, _compat.HiCacheStorageExtraInfo(prefix_keys=[hkey(100)])) == 3


def test_misses_return_false_and_leave_the_pool_alone(stores):
    pool = FakeHostPool("page_first_direct")
    st = stores(pool)
    pool.fill_random(seed=4)
    assert st.batch_set_v1([hkey(1)], page_indices(pool, [1])) == [True]
    pool.poison(0x5A)
    assert st.batch_get_v1([hkey(7), hkey(8)], page_indices(pool, [2, 3])) == [False, False]
    assert set(pool.raw().numpy().tobytes()) == {0x5A}
    assert st.batch_get_v1([hkey(1), hkey(9)], page_indices(pool, [2, 3])) == [True, False]
    assert st.get(hkey(9), pool.get_dummy_flat_data_page()) is None
    assert not st.exists(hkey(9))


def test_bad_calls_are_misses_not_exceptions(stores):
    pool = FakeHostPool("page_first_direct")
    st = stores(pool)
    k = [hkey(1), hkey(2)]
    assert st.batch_set_v1(k, page_indices(pool, [1])) == [False, False]            # too few slots
    assert st.batch_set_v1(k, torch.tensor([0] * 8, dtype=torch.int64) + 10_000) == [False, False]  # outside
    assert st.batch_get_v1(k, torch.arange(1, 9)) == [False, False]                # pages not aligned
    assert st.batch_set_v1(k, torch.zeros(8)) == [False, False]                    # not integers
    assert st.batch_set_v1([], torch.zeros(0, dtype=torch.int64)) == []
    assert st.batch_get_v1([], torch.zeros(0, dtype=torch.int64)) == []
    assert st.batch_exists([object()]) == 0
    # before registration and after close: misses
    bare = stores()
    assert bare.batch_set_v1(k, page_indices(pool, [0, 1])) == [False, False]
    assert bare.batch_get_v1(k, page_indices(pool, [0, 1])) == [False, False]
    assert bare.batch_exists(k) == 0 and bare.get(k[0]) is None and bare.set(k[0], torch.zeros(1)) is False
    st.close()
    assert st.batch_get_v1(k, page_indices(pool, [0, 1])) == [False, False]
    assert st.batch_exists(k) == 0 and st.clear() is False


FAKE_METRICS = """
import dataclasses
from typing import Dict, List


@dataclasses.dataclass
class StorageMetrics:  # {where} (observability/metrics_collector.py@016d8605e458 has these fields)
    prefetch_pgs: List[int] = dataclasses.field(default_factory=list)
    backup_pgs: List[int] = dataclasses.field(default_factory=list)
    prefetch_bandwidth: List[float] = dataclasses.field(default_factory=list)
    backup_bandwidth: List[float] = dataclasses.field(default_factory=list)
    prefetch_stats: Dict[str, float] = dataclasses.field(default_factory=dict)
"""

METRICS_CHECK = """
import json, sys
fake, connector = json.loads(sys.argv[1])
sys.path[:0] = [fake, connector]
import umbp.sglang._compat as C
from umbp.sglang.hicache import UMBPStore
from sglang.srt.observability.metrics_collector import StorageMetrics
assert not C.HAVE_SGLANG  # this fake SGLang has no mem_cache: the storage classes are stand-ins
cfg = C.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, True, True, "m",
                             extra_config={"capacity_bytes": "16MiB", "interface_v1": 1})
st = UMBPStore(cfg, {})
m = st.get_stats()
st.close()
print(type(m).__module__, isinstance(m, StorageMetrics))
"""


@pytest.mark.parametrize("old_too", [False, True], ids=["observability-only", "both-modules"])
def test_stats_are_sglangs_storage_metrics_from_observability(tmp_path, old_too):
    """Newer SGLang defines StorageMetrics in
    sglang.srt.observability.metrics_collector (at 016d8605e458), and its
    StorageMetricsCollector.log_storage_metrics asserts isinstance(x,
    StorageMetrics) on the scheduler thread: get_stats must return that
    class, not the stand-in (which would kill the server with
    --enable-storage-metrics).  The observability module wins over the old
    sglang.srt.metrics.collector where both exist."""
    pkg = tmp_path / "sglang"
    for d in ("", "srt", "srt/observability") + (("srt/metrics",) if old_too else ()):
        (pkg / d).mkdir(parents=True, exist_ok=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "srt/observability/metrics_collector.py").write_text(FAKE_METRICS.format(where="new"))
    if old_too:
        (pkg / "srt/metrics/collector.py").write_text(FAKE_METRICS.format(where="old"))
    out = subprocess.run([sys.executable, "-c", METRICS_CHECK, json.dumps([str(tmp_path), str(CONNECTOR)])],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sglang.srt.observability.metrics_collector", "True"], out.stdout


def test_clear_and_stats(stores):
    pool = FakeHostPool("page_first")
    st = stores(pool, metrics=True)
    assert st.batch_set_v1([hkey(1), hkey(2)], page_indices(pool, [0, 1])) == [True, True]
    assert st.batch_get_v1([hkey(1)], page_indices(pool, [2])) == [True]
    m = st.get_stats()
    assert isinstance(m, _compat.StorageMetrics)
    assert m.backup_pgs == [2] and m.prefetch_pgs == [1] and len(m.backup_bandwidth) == 1
    assert st.get_stats().backup_pgs == []  # a window, emptied by each call
    assert st.clear() is True
    assert st.batch_exists([hkey(1)]) == 0
    assert stores(pool).get_stats() is None  # without --enable-storage-metrics


# ---- the v2 multi-pool interface -------------------------------------------------
#
# SGLang's hybrid controller (hybrid_cache_controller.py @ 00343773) calls
# register_mem_pool_host(anchor), then register_mem_host_pool_v2(pool, name) for
# every host pool, the KV anchor first; it moves the non-KV pools with
# batch_exists_v2 / batch_get_v2 / batch_set_v2 and reads their results through
# count_pool_hits.  The pools are sglang_fakes' re-implementations of SGLang's.

PN, HP = _compat.PoolName, _compat.PoolHitPolicy


def slots(pool, pages):
    """host_indices of whole pages of any pool: page_size slots per page (a
    Mamba page is one slot)."""
    ps = pool.page_size
    return torch.tensor([p * ps + t for p in pages for t in range(ps)], dtype=torch.int64)


def hybrid_store(stores, anchor, pools, **kw):
    """A store registered as SGLang's hybrid controller does it."""
    st = stores(anchor, **kw)                      # attach_storage_backend: register_mem_pool_host
    st.register_mem_host_pool_v2(anchor, PN.KV)    # then every entry, the anchor first
    for name, pool in pools.items():
        st.register_mem_host_pool_v2(pool, name)
    return st


def pool_kinds():
    """(id, is_mla, anchor layout, factory(anchor) -> (name, pool))."""
    return [
        ("mamba-page_first", False, "page_first", lambda a: (PN.MAMBA, FakeMambaPoolHost("page_first"))),
        ("mamba-page_first_direct", False, "page_first_direct",
         lambda a: (PN.MAMBA, FakeMambaPoolHost("page_first_direct"))),
        ("mamba-conv_only", False, "page_first",
         lambda a: (PN.MAMBA, FakeMambaPoolHost("page_first", temporal_state_shape=(0,)))),
        ("indexer-page_first", True, "page_first", lambda a: (PN.INDEXER, FakeDSAIndexerPoolHost(a))),
        ("indexer-page_first_direct", True, "page_first_direct",
         lambda a: (PN.INDEXER, FakeDSAIndexerPoolHost(a))),
        ("swa-mha-layer_first", False, "layer_first", lambda a: (PN.SWA, FakeHostPool("layer_first", num_pages=6))),
        ("swa-mha-page_head", False, "page_head", lambda a: (PN.SWA, FakeHostPool("page_head", num_pages=6))),
        ("draft-mha-page_first", False, "page_first",
         lambda a: (PN.DRAFT, FakeHostPool("page_first", layer_num=1, head_num=4))),
        ("draft-mla-page_first_direct", True, "page_first_direct",
         lambda a: (PN.DRAFT, FakeHostPool("page_first_direct", mla=True, layer_num=1))),
        ("draft_swa-mha-page_first", False, "page_first",
         lambda a: (PN.DRAFT_SWA, FakeHostPool("page_first", num_pages=6, dtype=torch.bfloat16))),
    ]


KINDS = pool_kinds()


@pytest.mark.parametrize("kind", [k[0] for k in KINDS if k[0].split("-")[0] in ("mamba", "indexer")])
def test_v2_pool_addresses_match_sglang_page_buffer_meta(stores, kind):
    """The pages of a Mamba or DSA indexer pool are addressed with SGLang's own
    get_page_buffer_meta pointers, and an object is the pool's flat data page
    (get_data_page) byte for byte."""
    _, mla, layout, make = next(k for k in KINDS if k[0] == kind)
    anchor = FakeHostPool(layout, mla=mla)
    name, pool = make(anchor)
    st = hybrid_store(stores, anchor, {name: pool}, mla=mla)
    lay = st._pools[str(name)].layout
    assert isinstance(lay, AffineLayout)
    pool.fill_random(seed=3)
    pages = [pool.size // pool.page_size - 1, 0, 2]
    idx = slots(pool, pages)
    ptrs, lens, offs = lay.ranges(lay.first_slots(idx, len(pages)))
    want_ptrs, want_sizes = pool.get_page_buffer_meta(idx)
    assert ptrs.reshape(-1).tolist() == want_ptrs and lens.reshape(-1).tolist() == want_sizes
    assert (offs[:, 1:] == offs[:, :-1] + lens[:, :-1]).all() and (offs[:, 0] == 0).all()
    for row, p in enumerate(pages):
        obj = b"".join(ctypes.string_at(int(a), int(n)) for a, n in zip(ptrs[row], lens[row]))
        assert obj == pool.page_bytes(p * pool.page_size)
    assert lay.object_size == pool.get_dummy_flat_data_page().numel()


@pytest.mark.parametrize("kind", [k[0] for k in KINDS])
def test_v2_set_then_get_each_pool_kind_byte_exact(stores, kind):
    """batch_set_v2 from random host pages, poison the pool, batch_get_v2 into
    other pages: every byte back, nothing outside the destination written;
    the KV pool of the same keys is untouched by the pool's objects."""
    _, mla, layout, make = next(k for k in KINDS if k[0] == kind)
    anchor = FakeHostPool(layout, mla=mla)
    name, pool = make(anchor)
    st = hybrid_store(stores, anchor, {name: pool}, mla=mla)
    pool.fill_random(seed=7)
    n_pages = pool.size // pool.page_size
    src, dst = [n_pages - 1, 0, 3], [1, n_pages - 2, 2]
    keys = [hkey(100 + i) for i in range(3)]
    want = [pool.page_bytes(p * pool.page_size) for p in src]
    res = st.batch_set_v2([_compat.PoolTransfer(name=name, keys=keys, host_indices=slots(pool, src))])
    assert res == {name: [True] * 3} and count_pool_hits(res) == {name: 3}
    pool.poison(0xA5)
    res = st.batch_get_v2([_compat.PoolTransfer(name=name, keys=keys, host_indices=slots(pool, dst))])
    assert res == {name: [True] * 3}
    assert [pool.page_bytes(p * pool.page_size) for p in dst] == want
    rest = [p for p in range(n_pages) if p not in dst]
    assert all(set(pool.page_bytes(p * pool.page_size)) == {0xA5} for p in rest)
    # the same page keys name nothing in the KV pool, nor in a pool never registered
    assert st.batch_exists(keys) == 0
    assert st.batch_get_v2([_compat.PoolTransfer(name=PN.DRAFT_INDEXER, keys=keys,
                                                 host_indices=slots(pool, dst))]) == \
        {PN.DRAFT_INDEXER: [False] * 3}


def _exists(st, keys, *transfers):
    return st.batch_exists_v2(keys, list(transfers), _compat.HiCacheStorageExtraInfo())


def test_v2_exists_hit_policies(stores, monkeypatch):
    """batch_exists_v2 as hicache_storage.py's docstring defines it: the
    usable prefix P is the longest one for which the KV pages [0, P) are
    stored, every "all_pages" pool has its pages [0, P) and every
    "trailing_pages" pool its last len(keys) pages [P - N, P);
    extra_pool_hit_pages has each pool's own longest prefix."""
    anchor = FakeHostPool("page_first", mla=True, num_pages=8)
    mamba, indexer = FakeMambaPoolHost(), FakeDSAIndexerPoolHost(anchor)
    swa = FakeHostPool("page_first", mla=True, num_pages=8)
    st = hybrid_store(stores, anchor, {PN.MAMBA: mamba, PN.INDEXER: indexer, PN.SWA: swa}, mla=True)
    for p in (anchor, mamba, indexer, swa):
        p.fill_random(seed=5)
    keys = [hkey(200 + i) for i in range(6)]

    def store(name, pool, pages):
        res = st.batch_set_v2([_compat.PoolTransfer(name=name, keys=[keys[i] for i in pages],
                                                    host_indices=slots(pool, pages))])
        assert res == {name: [True] * len(pages)}

    def trailing(name, n):
        return _compat.PoolTransfer(name=name, keys=keys[:n], hit_policy=HP.TRAILING_PAGES)

    def all_pages(name):
        return _compat.PoolTransfer(name=name, indices_from_pool=PN.KV)  # hit_policy defaults to all_pages

    assert st.batch_set_v1(keys, page_indices(anchor, range(6))) == [True] * 6
    store(PN.INDEXER, indexer, [0, 1, 2, 3])
    store(PN.MAMBA, mamba, [1, 4])
    store(PN.SWA, swa, [0, 1, 2, 4, 5])

    r = _exists(st, keys)
    assert isinstance(r, _compat.PoolTransferResult) and r.kv_hit_pages == 6
    r = _exists(st, keys, all_pages(PN.INDEXER))                       # all_pages, partial: 4 of 6
    assert r.kv_hit_pages == 4 and r.extra_pool_hit_pages == {PN.KV: 6, PN.INDEXER: 4}
    r = _exists(st, keys, trailing(PN.MAMBA, 1))                       # trailing 1: stops 2 and 5
    assert r.kv_hit_pages == 5 and r.extra_pool_hit_pages[PN.MAMBA] == 5
    r = _exists(st, keys, _compat.PoolTransfer(name=PN.MAMBA, keys=None, hit_policy=HP.TRAILING_PAGES))
    assert r.kv_hit_pages == 5                                         # no keys: a window of 1
    r = _exists(st, keys, trailing(PN.SWA, 2))                         # trailing 2: stops 1, 2, 3, 6
    assert r.kv_hit_pages == 6 and r.extra_pool_hit_pages[PN.SWA] == 6
    # both at once: indexer stops 1..4, Mamba stops 2 and 5 -> 2 (the minimum of the
    # pools' own answers, 4, would need Mamba's page 3, which is not stored)
    r = _exists(st, keys, all_pages(PN.INDEXER), trailing(PN.MAMBA, 1))
    assert r.kv_hit_pages == 2
    assert r.extra_pool_hit_pages == {PN.KV: 6, PN.INDEXER: 4, PN.MAMBA: 5}
    r = _exists(st, keys, all_pages(PN.INDEXER), trailing(PN.MAMBA, 1), trailing(PN.SWA, 2))
    assert r.kv_hit_pages == 2
    r = _exists(st, keys, all_pages(PN.INDEXER), trailing(PN.SWA, 3))   # SWA windows of 3: stops 1 .. 3
    assert r.kv_hit_pages == 3 and r.extra_pool_hit_pages[PN.SWA] == 3
    # a shorter KV prefix bounds every pool
    r = _exists(st, keys[:2] + [hkey(999)] + keys[3:], all_pages(PN.INDEXER), trailing(PN.SWA, 2))
    assert r.kv_hit_pages == 2 and r.extra_pool_hit_pages[PN.KV] == 2
    # a pool with nothing stored, and a pool never registered: no usable prefix
    r = _exists(st, [hkey(300 + i) for i in range(3)])
    assert r.kv_hit_pages == 0
    draft = FakeHostPool("page_first", mla=True, layer_num=1)
    st.register_mem_host_pool_v2(draft, PN.DRAFT)
    r = _exists(st, keys, all_pages(PN.DRAFT))
    assert r.kv_hit_pages == 0 and r.extra_pool_hit_pages == {PN.KV: 6, PN.DRAFT: 0}
    r = _exists(st, keys, all_pages(PN.DRAFT_INDEXER), trailing(PN.MAMBA, 1))
    assert r.kv_hit_pages == 0 and r.extra_pool_hit_pages[PN.DRAFT_INDEXER] == 0

    # as the controller goes on (_sync_trailing_keys): the last N hashes of the
    # usable prefix, read with batch_get_v2, all hit
    r = _exists(st, keys, trailing(PN.SWA, 2), all_pages(PN.INDEXER))
    assert r.kv_hit_pages == 3
    swa.poison()
    res = st.batch_get_v2([_compat.PoolTransfer(name=PN.SWA, keys=keys[1:3], host_indices=slots(swa, [6, 7]),
                                                hit_policy=HP.TRAILING_PAGES)])
    assert count_pool_hits(res) == {PN.SWA: 2}

    # a SGLang whose PoolTransferResult has restorable_prefix_pages gets the stop points
    @dataclasses.dataclass
    class NewerResult:
        kv_hit_pages: int
        extra_pool_hit_pages: dict
        restorable_prefix_pages: Optional[List[int]] = None
    monkeypatch.setattr(hicache, "PoolTransferResult", NewerResult)
    monkeypatch.setattr(hicache, "_RESULT_HAS_RESTORABLE", True)
    r = _exists(st, keys, trailing(PN.SWA, 2))
    assert r.kv_hit_pages == 6 and r.restorable_prefix_pages == [1, 2, 3, 6]  # [0, 1) is stored


def test_v2_pools_with_the_same_page_keys_do_not_collide(stores):
    """SWA and draft pools of the same geometry, the Mamba and indexer pools
    and the KV pool itself, all written under the same page hashes: each
    reads back its own bytes."""
    anchor = FakeHostPool("page_first", num_pages=8)
    swa, draft = FakeHostPool("page_first", num_pages=8), FakeHostPool("page_first", num_pages=8)
    mamba, indexer = FakeMambaPoolHost(), FakeDSAIndexerPoolHost(anchor)
    pools = {PN.SWA: swa, PN.DRAFT: draft, PN.MAMBA: mamba, PN.INDEXER: indexer}
    st = hybrid_store(stores, anchor, pools)
    keys = [hkey(400 + i) for i in range(2)]
    want = {}
    for seed, (name, pool) in enumerate(pools.items()):
        pool.fill_random(seed=20 + seed)
        want[name] = [pool.page_bytes(p * pool.page_size) for p in (0, 1)]
    anchor.fill_random(seed=30)
    want_kv = [anchor.page_bytes(p * anchor.page_size) for p in (0, 1)]
    assert len({w[0] for w in want.values()} | {want_kv[0]}) == 5
    assert st.batch_set_v1(keys, page_indices(anchor, [0, 1])) == [True, True]
    res = st.batch_set_v2([_compat.PoolTransfer(name=nm, keys=keys, host_indices=slots(p, [0, 1]))
                           for nm, p in pools.items()])
    assert res == {nm: [True, True] for nm in pools}
    derived = [st._keys(keys)] + [st._pool_keys(st._pools[str(nm)], page_hashes(keys)) for nm in pools]
    assert len({bytes(k[0]) for k in derived}) == 5
    for pool in (anchor, *pools.values()):
        pool.poison()
    res = st.batch_get_v2([_compat.PoolTransfer(name=nm, keys=keys, host_indices=slots(p, [2, 3]))
                           for nm, p in pools.items()])
    assert res == {nm: [True, True] for nm in pools}
    for name, pool in pools.items():
        assert [pool.page_bytes(p * pool.page_size) for p in (2, 3)] == want[name], name
    assert st.batch_get_v1(keys, page_indices(anchor, [4, 5])) == [True, True]
    assert [anchor.page_bytes(p * anchor.page_size) for p in (4, 5)] == want_kv


def test_v2_registration_keeps_the_kv_anchor_and_refuses_what_it_cannot_address(stores):
    """The KV anchor is the pool register_mem_pool_host took (another object is
    taken the same way); a pool this backend cannot address is refused with
    UMBPStoreConfigError naming the pool and why, never NotImplementedError."""
    anchor = FakeHostPool("page_first")
    st = stores(anchor)
    st.register_mem_host_pool_v2(anchor, PN.KV)
    st.register_mem_host_pool_v2(anchor, "kv")
    assert st.layout is not None and st._pools == {}
    other = FakeHostPool("page_first_direct")
    bare = stores()
    bare.register_mem_host_pool_v2(other, PN.KV)
    assert bare.layout is not None and bare.layout.layout == "page_first_direct"

    # no host buffer at all (a dummy pool)
    with pytest.raises(UMBPStoreConfigError, match=r"pool 'mamba' \(FakeSidecarHostPool\).*no host buffer"):
        st.register_mem_host_pool_v2(FakeSidecarHostPool(), PN.MAMBA)
    # SGLang's own zero-copy addresses refuse layer_first for the DSA indexer
    lf = FakeHostPool("layer_first", mla=True)
    with pytest.raises(UMBPStoreConfigError, match=r"pool 'indexer'.*'layer_first'.*page_first"):
        stores(lf, mla=True).register_mem_host_pool_v2(FakeDSAIndexerPoolHost(lf), PN.INDEXER)

    # pointers outside the pool's buffers, or not one stride apart
    class Outside(FakeMambaPoolHost):
        def get_page_buffer_meta(self, indices):
            ptrs, sizes = super().get_page_buffer_meta(indices)
            return [p + 64 for p in ptrs], sizes

    with pytest.raises(UMBPStoreConfigError, match=r"pool 'mamba'.*not inside one of the pool's buffers"):
        st.register_mem_host_pool_v2(Outside(), PN.MAMBA)

    class Scattered(FakeMambaPoolHost):
        def get_page_buffer_meta(self, indices):
            ptrs, sizes = super().get_page_buffer_meta(indices)
            return [p + (64 if int(indices[0]) == self.size - 1 else 0) for p in ptrs], sizes

    with pytest.raises(UMBPStoreConfigError, match=r"pool 'mamba'.*base \+ page \* stride"):
        st.register_mem_host_pool_v2(Scattered(), PN.MAMBA)
    # a KV-shaped pool whose own pointers disagree with its kv_buffer's shape
    swa = FakeHostPool("page_first")
    swa.get_page_buffer_meta = lambda idx: ([swa.kv_buffer.data_ptr()], [8])
    with pytest.raises(UMBPStoreConfigError, match=r"pool 'swa'.*get_page_buffer_meta points at"):
        st.register_mem_host_pool_v2(swa, PN.SWA)
    # a layout umbp does not know and no get_page_buffer_meta to say where pages are
    # (with SGLang's get_page_buffer_meta, such a pool is addressed by it)
    bad = FakeHostPool("page_first")
    bad.layout, bad.get_page_buffer_meta = "page_first_kv_split", None
    with pytest.raises(UMBPStoreConfigError, match=r"pool 'swa'.*no get_page_buffer_meta"):
        st.register_mem_host_pool_v2(bad, PN.SWA)
    assert st._pools == {}
    # refused pools are misses in the data calls, as any unregistered pool
    assert st.batch_get_v2([_compat.PoolTransfer(name=PN.MAMBA, keys=[hkey(1)],
                                                 host_indices=torch.tensor([0]))]) == {PN.MAMBA: [False]}


def test_v2_bad_input_is_misses_not_exceptions(stores):
    """Whatever arrives, the v2 data calls answer SGLang's shapes ({name:
    [bool]}, a PoolTransferResult) and never raise: an exception in SGLang's
    prefetch or backup thread stops L3 for the life of the process."""
    anchor = FakeHostPool("page_first")
    mamba, indexer = FakeMambaPoolHost(), FakeDSAIndexerPoolHost(anchor)
    st = hybrid_store(stores, anchor, {PN.MAMBA: mamba, PN.INDEXER: indexer})
    k = [hkey(i) for i in range(3)]
    T = _compat.PoolTransfer

    def get(name, keys, hi):
        return st.batch_get_v2([T(name=name, keys=keys, host_indices=hi)])

    assert get(PN.MAMBA, k, None) == {PN.MAMBA: [False] * 3}                          # no indices
    assert get(PN.MAMBA, k, torch.tensor([0, 1])) == {PN.MAMBA: [False] * 3}          # too few
    assert get(PN.MAMBA, k, torch.tensor([0, 1, 99])) == {PN.MAMBA: [False] * 3}      # outside
    assert get(PN.MAMBA, k, torch.tensor([0.0, 1.0, 2.0])) == {PN.MAMBA: [False] * 3}  # not integers
    assert get(PN.MAMBA, k, torch.tensor([-1, 0, 1])) == {PN.MAMBA: [False] * 3}      # negative
    assert get(PN.INDEXER, k, torch.arange(1, 13)) == {PN.INDEXER: [False] * 3}       # pages not aligned
    assert get(PN.INDEXER, None, torch.arange(0, 12)) == {PN.INDEXER: []}             # no keys
    assert get("no-such-pool", k, torch.tensor([0, 1, 2])) == {"no-such-pool": [False] * 3}
    assert st.batch_set_v2([T(name=PN.MAMBA, keys=k, host_indices=torch.tensor([5, 5]))]) == \
        {PN.MAMBA: [False] * 3}
    assert st.batch_get_v2(None) == {} and st.batch_set_v2([]) == {} and st.batch_get_v2(5) == {}
    assert st.batch_get_v2([object()]) == {0: []}
    # a repeated key in one batch is split, as in v1
    mamba.fill_random(seed=1)
    assert st.batch_set_v2([T(name=PN.MAMBA, keys=[k[0], k[0]], host_indices=torch.tensor([1, 1]))]) == \
        {PN.MAMBA: [True, True]}
    # lookups: garbage is 0 pages
    for bad in ([object()], [T(name=PN.MAMBA, keys=k, hit_policy="most_pages")]):
        r = st.batch_exists_v2(k, bad)
        assert isinstance(r, _compat.PoolTransferResult) and r.kv_hit_pages == 0
    assert st.batch_exists_v2([], [T(name=PN.MAMBA)]).kv_hit_pages == 0
    assert st.batch_exists_v2(None, None).kv_hit_pages == 0
    # before register_mem_pool_host and after close: misses
    bare = stores()
    assert bare.batch_exists_v2(k, [T(name=PN.MAMBA, keys=k[-1:])]).kv_hit_pages == 0
    st.close()
    assert st.batch_exists_v2(k, [T(name=PN.MAMBA, keys=k)]).kv_hit_pages == 0
    assert get(PN.MAMBA, k, torch.tensor([0, 1, 2])) == {PN.MAMBA: [False] * 3}
    assert st.batch_set_v2([T(name=PN.MAMBA, keys=k, host_indices=torch.tensor([0, 1, 2]))]) == \
        {PN.MAMBA: [False] * 3}


def test_v2_kv_transfer_maps_onto_v1(stores):
    """A transfer of the KV pool itself (SGLang sends KV through v1, but a v2
    call naming "kv" must not fail) goes through batch_get_v1/batch_set_v1."""
    pool = FakeHostPool("page_first")
    st = stores(pool)
    pool.fill_random(seed=11)
    k = [hkey(i) for i in range(3)]
    KV = PN.KV
    assert st.batch_set_v2([_compat.PoolTransfer(name=KV, keys=k, host_indices=page_indices(pool, [0, 1, 2]))]) \
        == {KV: [True] * 3}
    assert st.batch_exists(k) == 3
    want = [pool.page_bytes(p * pool.page_size) for p in range(3)]
    pool.poison()
    res = st.batch_get_v2([_compat.PoolTransfer(name=KV, keys=k, host_indices=page_indices(pool, [5, 6, 7]))])
    assert res == {KV: [True, True, True]}
    assert [pool.page_bytes(p * pool.page_size) for p in (5, 6, 7)] == want
    assert st.batch_get_v2([_compat.PoolTransfer(name=KV, keys=k, host_indices=torch.zeros(3))]) == \
        {KV: [False, False, False]}
    st.close()
    assert st.batch_get_v2([_compat.PoolTransfer(name=KV, keys=k, host_indices=page_indices(pool, [0, 1, 2]))]) \
        == {KV: [False] * 3}


# ---- keys -----------------------------------------------------------------------

def test_page_hashes():
    keys = [hkey(i) for i in range(5)]
    fast = page_hashes(keys)
    assert fast == b"".join(bytes.fromhex(k) for k in keys)
    assert page_hashes(keys[2:3]) == fast[64:96]
    mixed = [keys[0], "not-a-hash", keys[1].upper(), " " + keys[2][1:]]
    h = page_hashes(mixed)
    assert len(h) == 4 * 32 and h[:32] == fast[:32] and h[64:96] == fast[32:64]
    assert page_hashes(["not-a-hash"]) == h[32:64] and page_hashes([mixed[3]]) == h[96:]
    assert h[96:] != fast[64:96]


def test_namespace_separates_layouts_and_models(stores):
    a = stores(FakeHostPool("page_first"))
    b = stores(FakeHostPool("page_first_direct"))
    c = stores(FakeHostPool("page_first"), model="other/model")
    d = stores(FakeHostPool("page_first"))
    e = stores(FakeHostPool("page_first"), extra={"key_namespace": "fleet"})
    assert len({a.namespace.hex, b.namespace.hex, c.namespace.hex, e.namespace.hex}) == 4
    assert a.namespace.hex == d.namespace.hex
    assert (a._keys([hkey(1)]) == d._keys([hkey(1)])).all()


# ---- options ---------------------------------------------------------------------

def test_loaded_like_sglangs_dynamic_factory():
    cfg = scfg()
    mod = importlib.import_module(cfg.extra_config["module_path"])
    cls = getattr(mod, cfg.extra_config["class_name"])
    assert issubclass(cls, _compat.HiCacheStorage)
    st = cls(cfg, {})  # backend_factory: backend_class(storage_config, kwargs)
    try:
        pool = FakeHostPool("page_first")
        st.register_mem_pool_host(pool)  # HiCacheController.attach_storage_backend
        assert st.mem_pool_host is pool and st.layout.layout == "page_first"
    finally:
        st.close()
    st = cls(cfg, FakeHostPool("page_first"))  # built-in style (storage_config, mem_pool_host)
    assert st.layout is not None
    st.close()


@pytest.mark.parametrize("extra,match", [
    ({"mode": "distributed"}, "master_address"),
    ({"mode": "bogus"}, "'mode'"),
    ({"dp_rank": -1}, "'dp_rank'"),
    ({"dp_rank": "any"}, "'dp_rank'"),
    ({"key_namespace": ""}, "'key_namespace'"),
    ({"clear_shared_pool": "yes"}, "'clear_shared_pool'"),
    ({"passthrough_keys": "x"}, "'passthrough_keys'"),
    ({"rank": 1}, "'rank' may not be set"),
    ({"world_size": 2}, "'world_size' may not be set"),
    ({"capacity_byte": "1GiB"}, "capacity_byte"),          # unknown: umbp refuses it
    ({"capacity_bytes": "lots"}, "capacity_bytes"),
    ({"dram_high_watermark": 1.5}, "dram_high_watermark"),
    ({"capacity_bytes": "1GiB", "total_capacity_bytes": "2GiB"}, "mutually exclusive"),
])
def test_bad_options_name_the_option(extra, match):
    with pytest.raises(UMBPStoreConfigError, match=match):
        make_store(extra=extra)


def test_option_rules():
    with pytest.raises(UMBPStoreConfigError, match="standalone"):
        make_store(mla=True, tp_size=2)  # embedded MLA with TP: ranks > 0 could never hit
    with pytest.raises(UMBPStoreConfigError, match="should_split_heads"):
        make_store(should_split_heads=True)
    with pytest.raises(UMBPStoreConfigError, match="tp_rank"):
        make_store(tp_rank=2, tp_size=2)
    with pytest.raises(UMBPStoreConfigError, match="JSON object"):
        UMBPStore(_compat.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m",
                                               extra_config=["x"]), {})
    # SGLang's own keys and passthrough keys are accepted; rank/world_size are computed
    st = make_store(extra={"prefetch_threshold": 64, "hicache_storage_pass_prefix_keys": True,
                           "new_sglang_knob": 1, "passthrough_keys": ["new_sglang_knob"]},
                    tp_rank=1, tp_size=4, pp_rank=1, pp_size=2)
    try:
        assert st.runtime_options["rank"] == 5 and st.runtime_options["world_size"] == 8
        assert "new_sglang_knob" not in st.runtime_options
        assert "prefetch_threshold" not in st.runtime_options
        assert st.key_rank == (1, 1, 0, 0)
    finally:
        st.close()
    # standalone socket choice: dp_rank fixed (default 0: every DP rank shares one server) or "auto"
    from umbp.sglang import config as sconfig
    assert sconfig.parse({"mode": "standalone"}).runtime_config(3, 8, 2)["dp_rank"] == 0
    assert sconfig.parse({"mode": "standalone", "dp_rank": "auto"}).runtime_config(3, 8, 2)["dp_rank"] == 2
    assert "dp_rank" not in sconfig.parse({}).runtime_config(0, 1, 2)
    with pytest.raises(LayoutError, match="page_head"):
        make_store(FakeHostPool("page_first", mla=True), mla=True).register_mem_pool_host(
            type("P", (), {"layout": "page_head", "page_size": 4, "kv_buffer": None})())
    with pytest.raises(LayoutError, match="kv_buffer"):
        make_store().register_mem_pool_host(type("P", (), {"layout": "page_first", "page_size": 4,
                                                          "kv_buffer": None})())


def test_dp_rank_auto_without_sglangs_dp_rank_warns_once(caplog, monkeypatch):
    """"dp_rank": "auto" means SGLang's attention-DP rank
    (HiCacheStorageConfig.dp_rank, as at 001067ff); a SGLang whose config has
    none makes it 0 for every DP rank: said once per process, naming the
    option, never where the rank exists or dp_rank is a number."""
    import logging

    # HiCacheStorageConfig as SGLang had it before dp_rank / dp_size (the
    # stand-in's fields, those two left out)
    OlderStorageConfig = dataclasses.make_dataclass("OlderStorageConfig", [
        (f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(_compat.HiCacheStorageConfig)
        if f.name not in ("dp_rank", "dp_size")])
    assert not hasattr(OlderStorageConfig, "dp_rank")

    def older(extra):
        return OlderStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m",
                                  extra_config={**DYNAMIC, "capacity_bytes": "16MiB", **extra})

    monkeypatch.setattr(hicache, "_warned", set())
    made = []
    try:
        with caplog.at_level(logging.WARNING, logger="umbp.sglang"):
            made.append(UMBPStore(scfg({"dp_rank": "auto"}, dp_rank=2), {}))  # this SGLang has it
            made.append(UMBPStore(older({"dp_rank": 1}), {}))  # a number: nothing to resolve
            assert not [m for m in caplog.messages if "dp_rank" in m]
            made.append(UMBPStore(older({"dp_rank": "auto"}), {}))
            made.append(UMBPStore(older({"dp_rank": "auto"}), {}))  # another rank of the process
        warned = [m for m in caplog.messages if "dp_rank" in m]
        assert len(warned) == 1, caplog.messages
        assert '"dp_rank": "auto"' in warned[0] and "OlderStorageConfig" in warned[0]
        assert "dp_rank 0" in warned[0]
        assert [st.dp_rank for st in made] == [2, 0, 0, 0]
    finally:
        for st in made:
            st.close()


# ---- standalone mode ---------------------------------------------------------

def test_mla_rank0_writes_rank1_reads(server):
    pool0 = FakeHostPool("page_first", mla=True)
    pool1 = FakeHostPool("page_first", mla=True)
    pool0.fill_random(seed=5)
    r0 = make_store(pool0, server.options(), mla=True, tp_rank=0, tp_size=2)
    r1 = make_store(pool1, server.options(), mla=True, tp_rank=1, tp_size=2)
    try:
        assert r0.is_writer and not r1.is_writer
        want = pool0.page_bytes(3 * pool0.page_size)
        assert r0.batch_set_v1([hkey(1)], page_indices(pool0, [3])) == [True]
        assert r1.batch_exists([hkey(1)]) == 1
        pool1.poison()
        assert r1.batch_get_v1([hkey(1)], page_indices(pool1, [6])) == [True]
        assert pool1.page_bytes(6 * pool1.page_size) == want
        # a non-writer rank claims success without writing
        assert r1.batch_set_v1([hkey(2)], page_indices(pool1, [0])) == [True]
        assert r0.batch_exists([hkey(2)]) == 0
        # a dummy host pool (no kv_buffer) on a reader rank: lookups work, loads miss
        dummy = FakeHostPool("page_first", mla=True)
        dummy.kv_buffer = None
        r2 = make_store(dummy, server.options(), mla=True, tp_rank=1, tp_size=2)
        try:
            assert r2.namespace.hex == r0.namespace.hex
            assert r2.batch_exists([hkey(1)]) == 1
            assert r2.batch_get_v1([hkey(1)], page_indices(pool1, [0])) == [False]
            assert r2.get(hkey(1)) is None
        finally:
            r2.close()
    finally:
        r0.close()
        r1.close()


def test_v2_mla_rank0_writes_replicated_pools_every_rank_writes_mamba(server):
    """MLA (SGLang's is_mla_model: rank-replicated KV): the hybrid controller
    backs up a non-KV pool from TP rank 0 only, except Mamba state, which is
    sharded by TP rank and backed up on every rank (should_backup).  So the
    DSA indexer's objects are rank 0's, read by every rank, and a batch_set_v2
    of them on another rank writes nothing; each rank stores and reads its
    own Mamba state.  An MHA pool (heads split over the ranks) in an MLA model
    could never be loaded by the other ranks: refused."""
    pools = [FakeHostPool("page_first", mla=True) for _ in range(2)]
    idx = [FakeDSAIndexerPoolHost(p) for p in pools]
    mamba = [FakeMambaPoolHost() for _ in range(2)]
    ranks = [make_store(pools[r], server.options(), mla=True, tp_rank=r, tp_size=2) for r in range(2)]
    try:
        for r, st in enumerate(ranks):
            st.register_mem_host_pool_v2(pools[r], PN.KV)
            st.register_mem_host_pool_v2(idx[r], PN.INDEXER)
            st.register_mem_host_pool_v2(mamba[r], PN.MAMBA)
            assert st._pools["indexer"].replicated and not st._pools["mamba"].replicated
            idx[r].fill_random(seed=40 + r)
            mamba[r].fill_random(seed=50 + r)
        k = [hkey(500), hkey(501)]
        T = _compat.PoolTransfer
        # rank 1 "stores" the replicated indexer: nothing written
        assert ranks[1].batch_set_v2([T(name=PN.INDEXER, keys=k, host_indices=slots(idx[1], [0, 1]))]) == \
            {PN.INDEXER: [True, True]}
        assert ranks[0].batch_get_v2([T(name=PN.INDEXER, keys=k, host_indices=slots(idx[0], [2, 3]))]) == \
            {PN.INDEXER: [False, False]}
        want_idx = [idx[0].page_bytes(p * idx[0].page_size) for p in (0, 1)]
        assert ranks[0].batch_set_v2([T(name=PN.INDEXER, keys=k, host_indices=slots(idx[0], [0, 1]))]) == \
            {PN.INDEXER: [True, True]}
        # Mamba: every rank its own state under the same page hashes
        want_m = [mamba[r].page_bytes(3) for r in range(2)]
        assert want_m[0] != want_m[1]
        for r in range(2):
            assert ranks[r].batch_set_v2([T(name=PN.MAMBA, keys=k[1:], host_indices=torch.tensor([3]),
                                            hit_policy=HP.TRAILING_PAGES)]) == {PN.MAMBA: [True]}
        assert ranks[0].batch_set_v1(k, page_indices(pools[0], [0, 1])) == [True, True]
        for r in range(2):
            r_ = ranks[r].batch_exists_v2(k, [T(name=PN.INDEXER, indices_from_pool=PN.KV),
                                              T(name=PN.MAMBA, keys=k[1:], hit_policy=HP.TRAILING_PAGES)])
            assert r_.kv_hit_pages == 2, r
            idx[r].poison()
            mamba[r].poison()
            assert ranks[r].batch_get_v2([T(name=PN.INDEXER, keys=k, host_indices=slots(idx[r], [4, 5])),
                                          T(name=PN.MAMBA, keys=k[1:], host_indices=torch.tensor([6]))]) == \
                {PN.INDEXER: [True, True], PN.MAMBA: [True]}
            assert [idx[r].page_bytes(p * idx[r].page_size) for p in (4, 5)] == want_idx
            assert mamba[r].page_bytes(6) == want_m[r]
        # an MHA draft pool in an MLA model with TP 2
        with pytest.raises(UMBPStoreConfigError, match=r"pool 'draft'.*MHA pool.*should_backup"):
            ranks[1].register_mem_host_pool_v2(FakeHostPool("page_first", layer_num=1), PN.DRAFT)
        ranks[1].register_mem_host_pool_v2(FakeHostPool("page_first", mla=True, layer_num=1), PN.DRAFT)
    finally:
        for st in ranks:
            st.close()


def test_mha_ranks_do_not_see_each_others_keys(server):
    pools = [FakeHostPool("page_first_direct") for _ in range(2)]
    for i, p in enumerate(pools):
        p.fill_random(seed=10 + i)
    ranks = [make_store(pools[r], server.options(), tp_rank=r, tp_size=2) for r in range(2)]
    try:
        assert ranks[0].namespace.hex == ranks[1].namespace.hex
        assert ranks[0].batch_set_v1([hkey(1)], page_indices(pools[0], [2])) == [True]
        assert ranks[1].batch_exists([hkey(1)]) == 0
        assert ranks[1].batch_get_v1([hkey(1)], page_indices(pools[1], [0])) == [False]
        want = [pools[0].page_bytes(2 * pools[0].page_size), pools[1].page_bytes(4 * pools[1].page_size)]
        assert want[0] != want[1]
        assert ranks[1].batch_set_v1([hkey(1)], page_indices(pools[1], [4])) == [True]
        for r in range(2):
            pools[r].poison()
            assert ranks[r].batch_get_v1([hkey(1)], page_indices(pools[r], [7])) == [True]
        for r in range(2):  # the same page hash, each rank its own bytes
            assert pools[r].page_bytes(7 * pools[r].page_size) == want[r]
    finally:
        for st in ranks:
            st.close()


WRITER = r"""
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
from sglang_fakes import FakeHostPool, page_indices
from umbp.sglang import _compat
from umbp.sglang.hicache import UMBPStore
opts = json.loads(sys.argv[2])
pool = FakeHostPool("layer_first", num_pages=16)
pool.fill_random(seed=42)
cfg = _compat.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, False, "test/model", extra_config=opts)
st = UMBPStore(cfg, {})
st.register_mem_pool_host(pool)
keys = ["%064x" % (i + 1) for i in range(5)]
ok = st.batch_set_v1(keys, page_indices(pool, [9, 3, 12, 0, 7]))
st.close()
print(json.dumps(ok))
"""


def test_standalone_page_stored_in_one_process_is_read_in_another(server):
    opts = {**DYNAMIC, **server.options(engine_id="writer")}
    out = subprocess.run([sys.executable, "-c", WRITER, json.dumps([str(HERE), str(CONNECTOR)]),
                          json.dumps(opts)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True] * 5

    ref = FakeHostPool("layer_first", num_pages=16)
    ref.fill_random(seed=42)
    pool = FakeHostPool("layer_first", num_pages=16)
    pool.poison()
    st = make_store(pool, server.options(engine_id="reader"))
    try:
        keys = ["%064x" % (i + 1) for i in range(5)]
        assert st.batch_exists(keys + [hkey(0)]) == 5
        assert st.batch_get_v1(keys, page_indices(pool, [1, 2, 4, 5, 6])) == [True] * 5
        for src, dst in zip([9, 3, 12, 0, 7], [1, 2, 4, 5, 6]):
            assert pool.page_bytes(dst * pool.page_size) == ref.page_bytes(src * ref.page_size)
    finally:
        st.close()


def test_standalone_clear_shared_pool_option(server):
    pool = FakeHostPool("page_first")
    keep = make_store(pool, server.options(clear_shared_pool=False))
    other = make_store(pool, server.options())
    try:
        assert keep.batch_set_v1([hkey(1)], page_indices(pool, [0])) == [True]
        assert keep.clear() is False and keep.batch_exists([hkey(1)]) == 1
        assert other.clear() is True and keep.batch_exists([hkey(1)]) == 0
    finally:
        keep.close()
        other.close()


def test_standalone_server_gone_means_misses_not_exceptions(server):
    pool = FakeHostPool("page_first")
    st = make_store(pool, server.options(reconnect_max_ms=100))
    try:
        assert st.batch_set_v1([hkey(1)], page_indices(pool, [0])) == [True]
        server.stop(signal.SIGKILL)
        t0 = time.monotonic()
        assert st.batch_exists([hkey(1)]) == 0
        assert st.batch_get_v1([hkey(1)], page_indices(pool, [1])) == [False]
        assert st.batch_set_v1([hkey(2)], page_indices(pool, [2])) == [False]
        assert st.get(hkey(1), pool.get_dummy_flat_data_page()) is None
        assert st.clear() in (True, False)
        assert time.monotonic() - t0 < 15  # bounded by timeout_ms, never hangs
        # a new server on the same socket: the runtime reconnects and carries on (empty pool)
        server.start()
        deadline = time.monotonic() + 10
        while st.batch_set_v1([hkey(3)], page_indices(pool, [3])) != [True]:
            assert time.monotonic() < deadline, "no reconnect within 10 s"
            time.sleep(0.05)
        assert st.batch_exists([hkey(3)]) == 1 and st.batch_exists([hkey(1)]) == 0
    finally:
        st.close()


def test_standalone_stalled_server_means_bounded_misses_then_recovers(server):
    """SIGSTOP the server: every call returns within its bound, as a miss or
    a failed store, and writes nothing into the pool; after SIGCONT the same
    backend reads the bytes it stored before the stall, exactly."""
    pool = FakeHostPool("page_first")
    pool.fill_random(seed=5)
    src = pool.page_bytes(0)
    st = make_store(pool, server.options())
    try:
        assert st.batch_set_v1([hkey(1)], page_indices(pool, [0])) == [True]
        pool.poison(0x5A)
        poisoned = pool.page_bytes(1 * pool.page_size)
        stop_process(server.proc)
        try:
            t0 = time.monotonic()
            assert st.batch_exists([hkey(1)]) == 0
            assert st.batch_get_v1([hkey(1)], page_indices(pool, [1])) == [False]
            assert st.batch_set_v1([hkey(2)], page_indices(pool, [2])) == [False]
            assert time.monotonic() - t0 < 30  # lookup_timeout_ms + timeout_ms each: never hangs
            assert pool.page_bytes(1 * pool.page_size) == poisoned, "a stalled get wrote the pool"
        finally:
            server.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 15
        while st.batch_get_v1([hkey(1)], page_indices(pool, [1])) != [True]:
            assert time.monotonic() < deadline, "no answers within 15 s of SIGCONT"
            time.sleep(0.05)
        assert pool.page_bytes(1 * pool.page_size) == src
    finally:
        st.close()


def test_standalone_unreachable_server_fails_at_creation():
    d = tempfile.mkdtemp(prefix="umbp-sgl-none-")
    try:
        with pytest.raises(UMBPStoreConfigError, match="standalone"):
            make_store(extra={"mode": "standalone", "socket_dir": os.path.join(d, "s"),
                              "startup_timeout_ms": 200})
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---- distributed mode: each process's runtime is a node of umbp-master's cluster ----

DIST_WRITER = r"""
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
from sglang_fakes import FakeHostPool, page_indices
from umbp.sglang import _compat
from umbp.sglang.hicache import UMBPStore
opts = json.loads(sys.argv[2])
pool = FakeHostPool("layer_first", num_pages=16)
pool.fill_random(seed=43)
cfg = _compat.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, False, "test/model", extra_config=opts)
st = UMBPStore(cfg, {})
st.register_mem_pool_host(pool)
keys = ["%064x" % (i + 101) for i in range(5)]
ok = st.batch_set_v1(keys, page_indices(pool, [9, 3, 12, 0, 7]))
print(json.dumps(ok), flush=True)
sys.stdin.read()  # this node holds the pages until the test is done reading
st.close()
"""


def test_distributed_page_stored_on_one_node_is_read_on_another(monkeypatch):
    """SGLang's backend in distributed mode: a writer process's node stores
    pages; this process's node finds them through a real umbp-master and
    fetches them over UCX (tcp on loopback) into a poisoned pool, byte-exact."""
    try:
        umbp.mode_properties("distributed")
    except umbp.UmbpError as e:
        pytest.skip(f"this libumbp has no distributed mode: {e}")
    binary = master_binary()
    if binary is None:
        pytest.skip("no umbp-master (set UMBP_MASTER or build it)")
    # for this test only (monkeypatch restores them): left set, the later
    # tests' processes inherited them, and UCX warned at exit that the
    # pytest process never used them
    for k, v in (("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo"), ("UCX_MEM_EVENTS", "no"),
                 ("UCX_WARN_UNUSED_ENV_VARS", "n")):
        if k not in os.environ:
            monkeypatch.setenv(k, v)
    master = subprocess.Popen([binary, "--json", json.dumps({"listen": "127.0.0.1:0"})],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    writer = st = None
    try:
        line = master.stdout.readline()  # "umbp-master: serving 127.0.0.1:<port> (pid ..)"
        assert "serving" in line, line
        addr = line.split("serving ")[1].split()[0]
        threading.Thread(target=lambda f=master.stdout: [None for _ in f], daemon=True).start()
        opts = {"mode": "distributed", "master_address": addr, "heartbeat_ms": 50,
                "lookup_timeout_ms": 2000, "timeout_ms": 10000}
        writer = subprocess.Popen([sys.executable, "-c", DIST_WRITER,
                                   json.dumps([str(HERE), str(CONNECTOR)]),
                                   json.dumps({**DYNAMIC, "capacity_bytes": "64MiB", **opts})],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ))
        out = writer.stdout.readline()
        assert json.loads(out) == [True] * 5, out

        ref = FakeHostPool("layer_first", num_pages=16)
        ref.fill_random(seed=43)
        pool = FakeHostPool("layer_first", num_pages=16)
        pool.poison()
        st = make_store(pool, opts)
        keys = ["%064x" % (i + 101) for i in range(5)]
        found = 0
        for _ in range(200):  # the master learns the writer's pages within a heartbeat
            found = st.batch_exists(keys + [hkey(0)])
            if found == 5:
                break
            time.sleep(0.05)
        assert found == 5
        assert st.batch_get_v1(keys, page_indices(pool, [1, 2, 4, 5, 6])) == [True] * 5
        for src, dst in zip([9, 3, 12, 0, 7], [1, 2, 4, 5, 6]):
            assert pool.page_bytes(dst * pool.page_size) == ref.page_bytes(src * ref.page_size)
        untouched = FakeHostPool("layer_first", num_pages=16)
        untouched.poison()
        assert pool.page_bytes(8 * pool.page_size) == untouched.page_bytes(8 * pool.page_size)
    finally:
        if st is not None:
            st.close()
        if writer is not None:
            writer.stdin.close()
            writer.wait(30)
        master.terminate()
        master.wait(15)


# ---- an op still in flight must not be handed back to SGLang ---------------

class _SlowJob:
    """A umbp job that reports 'not done' for its first `slow` waits (an op
    still copying when the backend's bounded wait ends); records whether it
    was released while still reported in flight."""

    def __init__(self, job, slow, log):
        self._job, self._slow, self._log = job, slow, log

    def wait(self, timeout_ms=None):
        if self._slow > 0:
            self._slow -= 1
            return False
        return self._job.wait(timeout_ms)

    @property
    def ok(self):
        return self._job.ok

    def release(self):
        self._log.append("released in flight" if self._slow > 0 else "released done")
        self._job.release()


@pytest.mark.parametrize("op", ["get", "put"])
def test_an_op_in_flight_is_waited_for_not_released_into_sglangs_pages(stores, monkeypatch, op):
    """umbp_op_release on a get still in flight lets the runtime go on writing
    its destination, and a put still in flight goes on reading its source and
    then publishes (umbp.h).  SGLang frees and reuses the host pages of a
    batch as soon as batch_get_v1 / batch_set_v1 return, so returning early
    (a miss) would let the late copy overwrite another request's KV, or
    publish an object with another request's bytes under this key.  The
    backend waits for the op to complete and reports its real per-page
    result: here the op reports 'not done' for three rounds of timeout_ms."""
    pool = FakeHostPool("page_first")
    pool.fill_random(seed=21)
    st = stores(pool)
    want = [pool.page_bytes(p * pool.page_size) for p in (0, 1)]
    log: list = []
    rt = st._rt
    real = rt.get_ranges if op == "get" else rt.put_ranges
    if op == "get":
        assert st.batch_set_v1([hkey(1), hkey(2)], page_indices(pool, [0, 1])) == [True, True]
        pool.poison(0xA5)
    monkeypatch.setattr(rt, "get_ranges" if op == "get" else "put_ranges",
                        lambda *a, **kw: _SlowJob(real(*a, **kw), 3, log))
    if op == "get":
        assert st.batch_get_v1([hkey(1), hkey(2)], page_indices(pool, [2, 3])) == [True, True]
        assert [pool.page_bytes(p * pool.page_size) for p in (2, 3)] == want
    else:
        assert st.batch_set_v1([hkey(1), hkey(2)], page_indices(pool, [0, 1])) == [True, True]
    assert log == ["released done"]
    monkeypatch.undo()
    if op == "put":
        pool.poison(0xA5)
        assert st.batch_get_v1([hkey(1), hkey(2)], page_indices(pool, [2, 3])) == [True, True]
        assert [pool.page_bytes(p * pool.page_size) for p in (2, 3)] == want


def test_dcp_sharded_mla_pool_is_refused(stores):
    """With decode context parallelism SGLang's MLA host pool holds only this
    DCP rank's share of every page (page_size // dcp_size token slots, set
    by dcp_size / dcp_rank on MLATokenToKVPoolHost).  umbp's keys carry no
    DCP rank and its MLA rule has TP rank 0 write for every rank: another
    rank would read rank 0's share as its own (wrong KV, reported as a hit).
    SGLang at pool_host/mla.py@01c0ede3 asserted dcp_size == 1 on its
    flat-page path only; newer SGLang scopes its keys per DCP rank, but umbp
    does not support DCP yet, so the backend refuses such a pool, KV or v2
    side pool, at registration."""
    pool = FakeHostPool("page_first", mla=True)
    pool.dcp_size, pool.dcp_rank = 2, 1
    st = stores(mla=True)
    with pytest.raises(LayoutError, match="dcp_size 2"):
        st.register_mem_pool_host(pool)
    anchor = FakeHostPool("page_first", mla=True)
    st2 = hybrid_store(stores, anchor, {}, mla=True)
    swa = FakeHostPool("page_first", mla=True, num_pages=6)
    swa.dcp_size, swa.dcp_rank = 2, 0
    with pytest.raises(UMBPStoreConfigError, match="dcp_size 2"):
        st2.register_mem_host_pool_v2(swa, PN.SWA)
    ok = FakeHostPool("page_first", mla=True)
    ok.dcp_size, ok.dcp_rank = 1, 0
    stores(ok, mla=True)  # dcp_size 1 is a plain pool


@pytest.mark.parametrize("mla", [True, False], ids=["mla", "mha"])
def test_dcp_from_the_storage_config_is_refused(stores, mla):
    """Newer SGLang puts the DCP topology in HiCacheStorageConfig (dcp_rank,
    dcp_size; it scopes storage keys per DCP rank and picks MLA writers with
    is_mla_storage_writer): a pool without dcp_size of an engine whose
    storage config has dcp_size 8 is refused too, saying that umbp does not
    support decode context parallelism (not that SGLang's L3 path lacks it)."""
    st = stores(mla=mla)
    st.storage_config.dcp_rank, st.storage_config.dcp_size = 3, 8  # this SGLang's config fields
    pool = FakeHostPool("page_first", mla=mla)
    assert not hasattr(pool, "dcp_size")
    with pytest.raises(LayoutError, match="umbp does not support decode context parallelism yet "
                                          r"\(dcp_size 8, dcp_rank 3, from the storage config\)") as e:
        st.register_mem_pool_host(pool)
    assert "DCP-aware" not in str(e.value)
    st.storage_config.dcp_size = 1  # dcp_size 1: not context parallel
    st.register_mem_pool_host(pool)
    assert st.layout is not None


def test_separate_k_and_v_buffers_are_refused_by_name(stores):
    """SGLang's AsymmetricMHATokenToKVPoolHost (pool_host/mha.py@39baee9e0973:
    MHA models with head_dim != v_head_dim, e.g. MiMo-V2) keeps K and V in
    two buffers, kv_buffer = (k, v): the backend addresses one (2, ...)
    tensor and refuses it at registration, saying what it is."""
    from sglang_fakes import FakeAsymmetricHostPool

    for layout in ("page_first", "page_first_direct"):
        pool = FakeAsymmetricHostPool(layout)
        st = stores()
        with pytest.raises(LayoutError, match="separate K and V buffers") as e:
            st.register_mem_pool_host(pool)
        msg = str(e.value)
        assert "AsymmetricMHATokenToKVPoolHost" in msg and "head_dim != v_head_dim" in msg
        assert "MiMo-V2" in msg and st.layout is None


def test_backup_and_prefetch_threads_at_once_are_byte_exact_or_misses(stores):
    """SGLang's backup thread (batch_set_v1 / batch_set_v2) and its prefetch
    threads (batch_exists_v2, batch_get_v1, batch_get_v2) run at once on
    overlapping keys (cache_controller.py@001067ff,
    hybrid_cache_controller.py@00343773): every page reported restored holds
    exactly the bytes stored under its key (random data, poisoned
    destinations), everything else is a miss, and no exception escapes."""
    import random
    anchor = FakeHostPool("page_first", mla=True, num_pages=48)
    idxp = FakeDSAIndexerPoolHost(anchor)
    mamba = FakeMambaPoolHost("page_first", size=47)
    st = hybrid_store(stores, anchor, {PN.INDEXER: idxp, PN.MAMBA: mamba}, mla=True)
    for p in (anchor, idxp, mamba):
        p.fill_random(seed=31)
    src = 16  # pages 0..15 are the sources, 16..47 destinations
    want = {(hkey(i), nm): pool.page_bytes(i * pool.page_size)
            for i in range(src) for nm, pool in (("kv", anchor), ("idx", idxp), ("mamba", mamba))}

    def pool_poison_page(pool, d):
        pool.get_data_page(d * pool.page_size, flat=False).view(-1).view(torch.uint8).fill_(0xA5) \
            if not isinstance(pool, FakeMambaPoolHost) else \
            [t.view(-1).view(torch.uint8).fill_(0xA5) for t in pool._iter_page_tensors(d)]

    for pool in (anchor, idxp, mamba):  # poison the destinations
        for d in range(src, 47):
            pool_poison_page(pool, d)
    stop = time.monotonic() + 1.5
    errors, hits = [], [0]
    PT = _compat.PoolTransfer

    def writer():
        rng = random.Random(1)
        try:
            while time.monotonic() < stop:
                ks = sorted(rng.sample(range(src), 5))
                keys = [hkey(i) for i in ks]
                r = st.batch_set_v2([PT(name=PN.INDEXER, keys=keys, host_indices=slots(idxp, ks),
                                        indices_from_pool=PN.KV),
                                     PT(name=PN.MAMBA, keys=keys[-1:], host_indices=slots(mamba, ks[-1:]),
                                        hit_policy=HP.TRAILING_PAGES)])
                assert len(r[PN.INDEXER]) == 5 and len(r[PN.MAMBA]) == 1
                assert len(st.batch_set_v1(keys, page_indices(anchor, ks))) == 5
        except BaseException as e:  # noqa: BLE001
            errors.append(f"writer: {e!r}")

    def reader(lo, hi, seed):
        rng = random.Random(seed)
        try:
            while time.monotonic() < stop:
                ks = rng.sample(range(src), 5)
                keys = [hkey(i) for i in ks]
                res = st.batch_exists_v2(keys, [PT(name=PN.INDEXER),
                                                PT(name=PN.MAMBA, keys=keys[-1:],
                                                   hit_policy=HP.TRAILING_PAGES)])
                assert 0 <= res.kv_hit_pages <= 5
                dst = rng.sample(range(lo, hi), 5)
                got = {"kv": st.batch_get_v1(keys, page_indices(anchor, dst))}
                got["idx"] = st.batch_get_v2([PT(name=PN.INDEXER, keys=keys,
                                                 host_indices=slots(idxp, dst))])[PN.INDEXER]
                got["mamba"] = st.batch_get_v2([PT(name=PN.MAMBA, keys=keys,
                                                   host_indices=slots(mamba, dst))])[PN.MAMBA]
                for nm, pool in (("kv", anchor), ("idx", idxp), ("mamba", mamba)):
                    for k, d, ok in zip(keys, dst, got[nm]):
                        if ok:
                            hits[0] += 1
                            if pool.page_bytes(d * pool.page_size) != want[(k, nm)]:
                                errors.append(f"wrong bytes: {nm} page {d}")
                        pool_poison_page(pool, d)
        except BaseException as e:  # noqa: BLE001
            errors.append(f"reader: {e!r}")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader, args=(16, 32, 2)),
               threading.Thread(target=reader, args=(32, 47, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    assert hits[0] > 0
