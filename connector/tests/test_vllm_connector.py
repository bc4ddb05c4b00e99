"""The UMBP vLLM connector (umbp.vllm) driven in vLLM's call order by the
engine-order harness (vllm_harness/): the REAL connector over the REAL
runtime (libumbp, CPU torch KV caches copied by the host GPU backend), a FAKE
vllm package (vllm_harness/vllm) put on sys.path here only.

Run: UMBP_LIBRARY=/path/to/libumbp.so /usr/bin/python3 -m pytest connector/tests/test_vllm_connector.py
"""
import functools
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
from conftest import stop_process

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "vllm_harness")
CONNECTOR = os.path.dirname(HERE)
for p in (HARNESS, HERE, CONNECTOR):  # the fake vllm, the harness package, umbp
    if p not in sys.path:
        sys.path.insert(0, p)

torch = pytest.importorskip("torch")
import umbp  # noqa: E402
import vllm  # noqa: E402  (the fake one)

assert getattr(vllm, "FAKE", False), "the fake vllm of vllm_harness must come first on sys.path"

from vllm_harness import scenarios as S  # noqa: E402
from vllm_harness.config import FULL, MAMBA, SWA  # noqa: E402
from vllm_harness.engine import HarnessError  # noqa: E402

SCHED = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync-sched", "async-sched"])
LOADS = pytest.mark.parametrize("load_async", [True, False], ids=["async-load", "sync-load"])
TP = pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2-inproc"])

NO_LOOKUP_REASON = (
    "libumbp at %s has no lookup service: umbp.LookupClient raises NotImplementedError "
    "(LibraryTooOld); TP=2 across processes in embedded mode needs the lookup branch's "
    "umbp_lookup_client_* / umbp_lookup_serve" % umbp.library_path)


# ---- the engine scenarios, new vLLM API -----------------------------------------------


@SCHED
@LOADS
@TP
def test_cache_hit_restore_is_byte_exact(async_scheduling, load_async, tp):
    r = S.restore(async_scheduling=async_scheduling, tp=tp, extra={"load_async": load_async})
    assert r["matched"] == (0, 96, load_async)
    assert r["checked_blocks"] == 6 * tp


@SCHED
@pytest.mark.parametrize("groups", [None, [(FULL, 2, 0), (SWA, 2, 32)]], ids=["full", "full+swa"])
def test_lazy_offload_stores_at_request_finished(async_scheduling, groups):
    kw = {"groups": groups, "engine": "hma"} if groups else {}
    r = S.restore(async_scheduling=async_scheduling, extra={"lazy_offload": True}, **kw)
    assert r["matched"] == (0, 96, True)


@pytest.mark.parametrize("option,field", [("auto", "hash_block_size"), ("auto", "prefix_match_unit"), (4, None)],
                         ids=["option-auto-from-hash_block_size", "option-auto-from-prefix_match_unit",
                              "option-given"])
def test_hash_block_size_below_the_block_size(option, field, monkeypatch):
    """Hybrid vLLMs hash at a finer granularity than the block (connector-api.md
    §1.5): a block's identity is the hash of its last sub-block.  The
    granularity is cache_config.hash_block_size in older vLLMs,
    cache_config.prefix_match_unit since vllm/config/cache.py@002f10e0cfa1."""
    if field:
        from vllm.config import CacheConfig
        monkeypatch.setattr(CacheConfig, field, 4, raising=False)
    r = S.restore(hash_block_size=4, extra={"hash_block_size": option})
    assert r["matched"] == (0, 96, True)


def _scheduler_half(cfg, vc=None):
    """The SCHEDULER half of a connector built from a harness config (and its
    VllmConfig, when given)."""
    import umbp.vllm.connector as mod
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    return mod.UMBPConnector(vc or cfg.vllm_config(), KVConnectorRole.SCHEDULER, cfg.kv_cache_config())


@pytest.mark.parametrize("pmu,hbs,scale", [(4, None, 4), (4, 8, 4), (None, 8, 2), (None, None, 1)],
                         ids=["prefix_match_unit", "prefix_match_unit-first", "hash_block_size",
                              "neither"])
def test_prefix_match_unit_sets_the_hash_scale(pmu, hbs, scale):
    """vllm/config/cache.py@002f10e0cfa1 renamed hash_block_size to
    prefix_match_unit (None: the block size): with prefix_match_unit 4 and
    16-token blocks, a block is 4 of the request's block hashes."""
    from vllm_harness.config import HarnessConfig

    cfg = HarnessConfig(extra={"capacity_bytes": "16MiB"})
    vc = cfg.vllm_config()
    vc.cache_config.prefix_match_unit = pmu
    if hbs is not None:
        vc.cache_config.hash_block_size = hbs
    conn = _scheduler_half(cfg, vc)
    try:
        assert conn._scheduler.block_size == 16 and conn._scheduler.scale == scale
    finally:
        conn.shutdown()


def test_the_kv_cache_layout_comes_from_cache_config(monkeypatch):
    """vLLM PR #51718 removed get_kv_cache_layout; the engine's resolved
    layout is cache_config.kv_cache_layout (vllm/config/cache.py@002f10e0cfa1,
    a KVCacheLayout member name; NHD / HND are vLLM's aliases of LBNHC /
    LBHNC).  The layout is part of the key namespace: two layouts must not
    share keys, and an alias must not split them."""
    import importlib.util

    import umbp.vllm.connector as mod
    from umbp.vllm import _compat
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_harness.config import HarnessConfig

    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)
    for m in ("vllm.v1.attention", "vllm.attention"):  # this fake vLLM has no get_kv_cache_layout
        assert importlib.util.find_spec(m) is None

    def ns(layout, role=KVConnectorRole.SCHEDULER):
        cfg = HarnessConfig(extra={"capacity_bytes": "16MiB"})
        vc = cfg.vllm_config()
        vc.cache_config.kv_cache_layout = layout
        conn = mod.UMBPConnector(vc, role, cfg.kv_cache_config())
        try:
            return (conn._scheduler or conn._worker).ns.hex
        finally:
            conn.shutdown()

    assert ns("LBHNC") != ns("LBNHC")
    assert ns("NHD") == ns("LBNHC") == ns(None)  # None: no layout resolved, vLLM's default
    assert ns("HND") == ns("LBHNC") != ns("BLNHC")
    assert ns("LBHNC", KVConnectorRole.WORKER) == ns("LBHNC")  # both halves derive the same keys
    # a worker created before the engine handed it the layout: its namespace
    # follows the layout the KV caches are registered in
    cfg = HarnessConfig(extra={"capacity_bytes": "16MiB"})
    vc = cfg.vllm_config()
    vc.cache_config.kv_cache_layout = None
    w = mod.UMBPConnector(vc, KVConnectorRole.WORKER, cfg.kv_cache_config())
    try:
        vc.cache_config.kv_cache_layout = "LBHNC"
        w.register_kv_caches({name: torch.zeros(2, cfg.num_blocks, cfg.block_size, cfg.heads, cfg.dim)
                              for name, *_ in cfg.layers()})
        assert w._worker.ns.hex == ns("LBHNC")
    finally:
        w.shutdown()
    assert _compat.kv_cache_layout(None) == "NHD"
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "LBHNC")  # no layout in the config: the variable
    assert ns(None) == ns("HND") and _compat.kv_cache_layout(None) == "HND"


@pytest.mark.parametrize("local", [False, True], ids=["no-local-hit", "local-hit"])
@SCHED
def test_partial_hits_subtract_the_local_prefix(local, async_scheduling):
    r = S.partial(local_prefix_cache=local, async_scheduling=async_scheduling)
    assert r["matched"][:2] == ((16, 32) if local else (0, 48))


@SCHED
@pytest.mark.parametrize("decode", [False, True], ids=["prompt-stores", "decode-stores"])
def test_preemption(async_scheduling, decode):
    r = S.preemption(async_scheduling=async_scheduling, extra={"save_decode_cache": decode})
    assert r["preempted"]


@SCHED
@TP
def test_abort_during_load_and_with_stores_in_flight(async_scheduling, tp):
    S.abort(async_scheduling=async_scheduling, tp=tp)


@SCHED
def test_store_in_flight_at_request_finished_delays_the_free(async_scheduling):
    r = S.store_inflight(async_scheduling=async_scheduling)
    assert r["held_blocks"] > 0 and all(n > 0 for n in r["inflight_while_held"])


@pytest.mark.parametrize("via_workers", [False, True], ids=["scheduler-clears", "workers-clear"])
def test_reset_cache(via_workers):
    S.reset(via_workers=via_workers)


@SCHED
@LOADS
@pytest.mark.parametrize("tp,fail_rank", [(1, 0), (2, 1)], ids=["tp1", "tp2-rank1-fails"])
def test_failed_load_is_recomputed(async_scheduling, load_async, tp, fail_rank):
    r = S.failed_load(async_scheduling=async_scheduling, tp=tp, fail_rank=fail_rank, keep=2,
                      extra={"load_async": load_async})
    assert r["truncated"][0][1] == 32
    assert r["matched_C"][1] == 96  # B stored the recomputed blocks again, no quarantine


@SCHED
@LOADS
@TP
def test_blocks_computed_from_a_failed_load_are_never_stored(async_scheduling, load_async, tp):
    """B's load fails on the last rank after block 2 while its step also
    computes two more full blocks: with TP those are bad on every rank (the
    all-reduce), so no rank may store them; C (B's prompt) must then restore
    only good blocks and generate the right tokens."""
    r = S.failed_load(async_scheduling=async_scheduling, tp=tp, fail_rank=tp - 1, keep=2, extend=40,
                      extra={"load_async": load_async})
    assert r["matched_C"][1] == 128  # B recomputed and stored everything: C hits 8 blocks


@pytest.mark.parametrize("shape", ["set", "mapping"])
def test_failed_recving_is_built_in_the_engines_shape(shape, monkeypatch):
    """failed_recving of KVConnectorTransferResults: a set of request ids
    (base.py@003df296), or {req_id: KVTransferFailure} in newer vLLM-derived
    trees.  The connector builds the shape the engine's class declares."""
    import dataclasses
    import enum

    import vllm.v1.outputs as outs
    from umbp.vllm import _compat

    if shape == "mapping":
        class Reason(enum.Enum):
            TRANSFER = "transfer"
            INTEGRITY = "integrity"

        @dataclasses.dataclass(frozen=True)
        class KVTransferFailure:
            reason: Reason
            invalid_block_ids: frozenset = frozenset()

        @dataclasses.dataclass
        class Results:
            finished_sending: set = dataclasses.field(default_factory=set)
            finished_recving: set = dataclasses.field(default_factory=set)
            failed_recving: dict = dataclasses.field(default_factory=dict)

        monkeypatch.setattr(outs, "KVTransferFailure", KVTransferFailure, raising=False)
        monkeypatch.setattr(outs, "KVTransferFailureReason", Reason, raising=False)
        monkeypatch.setattr(_compat, "KVConnectorTransferResults", Results)
    assert _compat.failed_recving_is_mapping() == (shape == "mapping")
    r = S.failed_load(keep=2, extra={"load_async": True})
    seen = r["failed_seen"]
    assert len(seen) == 1 and set(seen[0]) == {"B"}, seen
    if shape == "set":
        assert isinstance(seen[0], set)
    else:
        assert isinstance(seen[0], dict)
        assert seen[0]["B"] == KVTransferFailure(Reason.TRANSFER, frozenset())
    assert r["truncated"][0][1] == 32 and r["matched_C"][1] == 96


def test_failed_recving_is_read_in_either_shape():
    """The scheduler side reads failed_recving as a set of ids or as a mapping
    whose failures name invalid blocks (which then rewind like invalid_block_ids)."""
    from types import SimpleNamespace as NS

    from umbp.vllm import _compat
    from umbp.vllm.scheduler import UMBPScheduler

    fail = NS(reason="transfer", invalid_block_ids=frozenset({7, 9}))
    assert _compat.failed_recving_ids({"a", "b"}) == {"a", "b"}
    assert _compat.failed_recving_ids({"a": fail, "b": None}) == {"a", "b"}
    assert _compat.failed_recving_ids(None) == set() and _compat.failed_recving_ids({}) == set()
    assert _compat.failed_recving_blocks({"a", "b"}) == set()
    assert _compat.failed_recving_blocks({"a": fail, "b": None}) == {7, 9}
    seen = []
    fake = NS(events=None, reqs={}, held={}, _on_load_errors=seen.append)
    for out, want in ((NS(invalid_block_ids={3}, failed_recving={"a"}), [{3}]),
                      (NS(invalid_block_ids=set(), failed_recving={"a": fail}), [{7, 9}]),
                      (NS(invalid_block_ids={3}, failed_recving={"a": fail, "b": None}), [{3, 7, 9}]),
                      (NS(invalid_block_ids=set(), failed_recving={"a"}), [])):
        seen.clear()
        UMBPScheduler.update_connector_output(fake, out)
        assert seen == want, (out, seen)


@pytest.mark.parametrize("publishable", [None, 2, 0])
def test_stores_stop_at_num_publishable_block_hashes(publishable):
    """Newer vLLM (base.py@003df296, request_finished_all_groups): content-
    addressed connectors must not store positions past
    request.num_publishable_block_hashes (with EAGLE the last hashes are not
    final yet).  A's 6 hashed blocks, 2 publishable: C finds 2 blocks."""
    with S.engine() as e:
        a = e.add("A", S.PROMPT, 3)
        if publishable is not None:
            a.num_publishable_block_hashes = publishable
        assert len(a.block_hashes) >= 6
        e.run()
        e.add("C", S.PROMPT, 3)
        e.run()
        e.check_outputs({"A": S.PROMPT, "C": S.PROMPT}, 3)
        assert e.matched("C")[1] == (96 if publishable is None else 16 * publishable)


@pytest.mark.parametrize("engine", ["00024d31", "mixin"])
@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sched-sync", "sched-async"])
def test_failed_load_under_the_fail_policy_ends_the_request(engine, load_async, async_scheduling):
    r = S.failed_load_fails(engine=engine, extra={"load_async": load_async}, async_scheduling=async_scheduling)
    assert r["failed"] == ["B"]


def test_failed_load_quarantine_outlives_a_later_store():
    r = S.failed_load(keep=2, extra={"load_failure_quarantine_ms": 60000})
    assert r["matched_C"][1] == 32  # blocks 2.. failed: misses for 60 s even though B stored them again


@SCHED
@TP
def test_sliding_window_and_mamba_groups(async_scheduling, tp):
    r = S.hybrid(async_scheduling=async_scheduling, tp=tp, extra={"load_async": False})
    assert r["matched"] == (0, 96, True)  # Mamba forces asynchronous loads
    for loaded, stored in zip(r["loaded"], r["stored"]):
        # full attention: all 6 blocks; the 32-token window: 2 blocks; Mamba: the state at 96
        assert loaded == {0: 6, 1: 2, 2: 1}
        # SWA stores the window (+1) of each chunk's end: [1, 4) then [4, 6); Mamba the states at 64, 96
        assert stored == {0: 6, 1: 5, 2: 2}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_stores_of_reused_blocks_are_waited_for_before_update_states(async_scheduling):
    """A sliding-window block leaves the window and is reallocated (and zeroed
    by the V1 runner's _update_states) in the next step, while its store may
    still read it: the connector waits for such stores in handle_preemptions,
    before _update_states.  Every later restore of those windows is exact."""
    r = S.reused_source_blocks(async_scheduling=async_scheduling)
    assert r["loaded"][0][1] > 0  # the windows were restored


def test_the_harness_catches_stores_of_reused_blocks_waited_for_in_bind(monkeypatch):
    """The same scenario with the wait only in bind_connector_metadata (where
    it was): the stores read the zeroed blocks and publish zeros under valid
    keys; a later restore generates GARBAGE."""
    from umbp.vllm.worker import UMBPWorker

    real = UMBPWorker.handle_preemptions

    def bind_only(self, arg):
        self._flush = lambda meta: None
        try:
            real(self, arg)
        finally:
            del self._flush

    monkeypatch.setattr(UMBPWorker, "handle_preemptions", bind_only)
    with pytest.raises(AssertionError, match="GARBAGE|-1|wrong KV"):
        S.reused_source_blocks()


def _new_mixin(name, **kw):
    """A scenario under the mixin @00f4240e and the base.py it pairs with."""
    return _run_api("00f4240e", name, mixin="00f4240e", **kw)


@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sched-sync", "sched-async"])
def test_restore_with_start_load_kv_after_the_forward(load_async, async_scheduling):
    r = _new_mixin("restore", extra={"load_async": load_async}, async_scheduling=async_scheduling)
    assert r["matched"] == [0, 96, load_async]


@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
def test_failed_load_with_start_load_kv_after_the_forward(load_async):
    _new_mixin("failed_load", extra={"load_async": load_async})


@pytest.mark.parametrize("name", ["hybrid", "reused_source_blocks"])
def test_hybrid_and_reused_blocks_with_start_load_kv_after_the_forward(name):
    _new_mixin(name)


def test_the_harness_catches_a_sync_load_started_after_the_forward(monkeypatch):
    """The harness runs start_load_kv after the forward only where the mixin
    does: were a synchronous load started there, the forward would read the
    blocks before they are loaded (GARBAGE)."""
    from vllm_harness import worker as hw

    monkeypatch.setattr(hw.HarnessWorker, "_starts_load_after_forward", lambda self, so: True)
    with pytest.raises(AssertionError):
        S.restore(extra={"load_async": False})


@pytest.mark.parametrize("name,kw", [
    ("restore", {}),
    ("restore", {"async_scheduling": True, "extra": {"load_async": False}}),
    ("preemption", {"extra": {"save_decode_cache": True}}),
    ("hybrid", {}),
], ids=lambda x: x if isinstance(x, str) else json.dumps(x, separators=(",", ":")))
def test_spec_decode_defers_wait_for_save_past_the_drafter(name, kw):
    """With a speculative config the V1 runner defers the mixin's finalize
    (kv_connector_model_runner_mixin.py@00f4240ee645 defer_finalize):
    get_transfer_results and build_connector_worker_meta come BEFORE the
    drafter writes its layer's KV, wait_for_save and clear_connector_metadata
    after it (finalize_kv_connector).  A store submitted in
    get_transfer_results would copy the draft layer's blocks before the
    drafter wrote them: the draft KV of every restored block wrong."""
    _new_mixin(name, spec_decode=True, **kw)


def _v2_runner(name, **kw):
    """A scenario under the V2 model runner @0036d38d (gpu/model_runner.py:
    update_requests zeroes newly allocated blocks and applies block copies
    BEFORE gpu/kv_connector.py@00f4240e's pre_forward calls
    handle_preemptions and bind) with the base.py it pairs with."""
    return _run_api("00f4240e", name, runner="v2-0036d38d", **kw)


@pytest.mark.parametrize("selected_by", ["env", "config"], ids=["VLLM_USE_V2_MODEL_RUNNER=1", "vllm-default"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_v2_runner_zeroes_reused_blocks_before_handle_preemptions(async_scheduling, selected_by):
    """The V2 runner zeroes a sliding-window block that left the window and
    was reallocated before any connector hook of the step: a store of it
    still in flight from the previous step would publish zeros under a valid
    key (GARBAGE on a later restore).  The connector waits for its stores by
    the end of the step they were submitted in when vLLM runs the V2 runner:
    selected by VLLM_USE_V2_MODEL_RUNNER=1, or with the variable unset by
    vLLM's own default (VllmConfig.use_v2_model_runner, vllm/config/vllm.py
    @000fc94b754f: True for the models vLLM runs on V2 by default)."""
    r = _v2_runner("reused_source_blocks", async_scheduling=async_scheduling, runner_selected_by=selected_by)
    assert r["loaded"][0]["1"] > 0  # the windows were restored


def test_which_runner_vllm_runs():
    """uses_v2_model_runner: the config's property where it exists (whatever
    the variable says: the property reads it), else the variable."""
    from types import SimpleNamespace as NS

    from umbp.vllm import _compat

    class Raising:
        @property
        def use_v2_model_runner(self):
            raise AttributeError("a config the property cannot judge")

    assert _compat.uses_v2_model_runner(NS(use_v2_model_runner=True)) is True
    assert _compat.uses_v2_model_runner(NS(use_v2_model_runner=False)) is False
    for cfg in (None, NS(), Raising()):  # no property: the fake's envs of FAKE_VLLM_API "new" (unset: False)
        assert _compat.uses_v2_model_runner(cfg) is False


@pytest.mark.parametrize("name,kw", [
    ("restore", {"async_scheduling": True}),
    ("restore", {"extra": {"load_async": False}}),
    ("preemption", {"extra": {"save_decode_cache": True}}),
    ("failed_load", {"extra": {"load_async": True}}),
    ("hybrid", {}),
], ids=lambda x: x if isinstance(x, str) else json.dumps(x, separators=(",", ":")))
def test_v2_runner_0036d38d(name, kw):
    """The other scenarios under the V2 runner @0036d38d: finish_forward is
    called (the connector defines it: base.py@00f4240e's declaration is not
    stored, the fake gives none), loads start after the forward without sync
    loads, every restore exact, nothing leaked."""
    _v2_runner(name, **kw)


REAL_ENGINES = pytest.mark.parametrize("engine", ["00024d31", "mixin"])
HYBRIDS = pytest.mark.parametrize("groups", [[(FULL, 2, 0), (SWA, 2, 32)], [(FULL, 2, 0), (SWA, 2, 32), (MAMBA, 1, 0)]],
                                  ids=["full+swa", "full+swa+mamba"])


@REAL_ENGINES
@HYBRIDS
@LOADS
def test_hybrid_models_on_real_schedulers_get_no_hits(engine, groups, load_async, caplog):
    """vLLM's scheduler at 00024d31 and in its later mixin reads one KV cache
    group's block ids when a load fails (and 00024d31 when an async load
    completes), and Mamba align mode asserts on external tokens: a promised
    hit on a hybrid model would kill EngineCore the moment its load failed.
    The connector promises none there, stores anyway, and says why once."""
    import logging

    with caplog.at_level(logging.WARNING):
        r = S.unrecoverable(engine=engine, groups=groups, extra={"load_async": load_async})
    assert r["matched"] == (0, 0, False) and not r["planned"]
    assert all(st.get(0, 0) == 6 for st in r["stored"])
    warned = [m for m in caplog.messages if "loads disabled" in m]
    assert len(warned) == 1, caplog.messages
    assert ("Mamba 'align' mode" if len(groups) == 3 else "one KV cache group") in warned[0]


@pytest.mark.parametrize("tp,dcp,pcp", [(2, 2, 1), (1, 1, 2), (4, 2, 2)], ids=["dcp2", "pcp2", "dcp2-pcp2"])
def test_context_parallelism_makes_the_connector_inert(tp, dcp, pcp, caplog):
    """With decode (or prefill) context parallelism vLLM's scheduler hashes
    blocks of block_size x dcp (x pcp) tokens, and each rank's GPU block holds
    an interleaved share of one: the connector, counting in block_size
    blocks, would store half-computed blocks under valid keys.  It is inert
    instead: no lookup and no hit even where the pool answers "present", no
    store planned (eager or at request_finished), no pool created on the
    workers, and one warning that names the limitation."""
    import logging

    import numpy as np

    import umbp.vllm.connector as mod
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.request import Request
    from vllm_harness.config import HarnessConfig

    asked = []

    def everything_present(rows, row_rank):
        asked.append(rows.shape)
        return np.ones(rows.shape[:2], dtype=bool), 0

    for lazy in (False, True):
        cfg = HarnessConfig(tp=tp, dcp=dcp, pcp=pcp, extra={"capacity_bytes": "16MiB", "lazy_offload": lazy})
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            conn = _scheduler_half(cfg)
        try:
            warned = [m for m in caplog.messages if "umbp" in m]
            assert len(warned) == 1 and "decode_context_parallel_size %d" % dcp in warned[0], caplog.messages
            assert "prefill_context_parallel_size %d" % pcp in warned[0] and "inert" in warned[0]
            conn._scheduler.backend.query = everything_present
            # vLLM's hashes under context parallelism: one per block_size * dcp * pcp tokens
            req = Request("A", S.PROMPT, block_size=cfg.block_size, hash_block_size=cfg.block_size * dcp * pcp)
            ids = (list(range(1, 8)),)
            assert conn.get_num_new_matched_tokens(req, 0) == (0, False)
            conn.update_state_after_alloc(req, ids, 0)
            so = SchedulerOutput(
                scheduled_new_reqs=[NewRequestData("A", S.PROMPT, [], None, None, ids, 0, None)],
                scheduled_cached_reqs=CachedRequestData(), num_scheduled_tokens={"A": 99},
                total_num_scheduled_tokens=99)
            meta = conn.build_connector_meta(so)
            assert not meta.stores and not meta.loads
            req.num_computed_tokens = 99
            assert conn.request_finished(req, ids) == (False, None)
            meta = conn.build_connector_meta(SchedulerOutput([], CachedRequestData(), {}, 0))
            assert not meta.stores and not meta.loads
            assert asked == [] and conn.debug_counters()["requests_tracked"] == 0
        finally:
            conn.shutdown()
    w = mod.UMBPConnector(cfg.vllm_config(0), KVConnectorRole.WORKER, cfg.kv_cache_config())
    try:
        w.register_kv_caches({name: torch.zeros(2, cfg.num_blocks, cfg.block_size, cfg.heads, cfg.dim)
                              for name, *_ in cfg.layers()})
        assert w._worker.rt is None  # no pool
    finally:
        w.shutdown()


@REAL_ENGINES
@LOADS
def test_single_group_models_keep_hits_on_real_schedulers(engine, load_async):
    r = S.restore(engine=engine, extra={"load_async": load_async})
    assert r["matched"] == (0, 96, load_async)
    r = S.failed_load(engine=engine, keep=2, extra={"load_async": load_async})
    assert r["truncated"]


def test_engine_limits_are_read_from_the_scheduler_that_runs():
    from umbp.vllm import _compat
    from vllm.v1.core.sched import scheduler as sched_mod

    want = {"00024d31": (True, True, True), "mixin": (True, False, True), "hma": (False, False, False)}
    saved = sched_mod.Scheduler
    try:
        for name, cls in sched_mod.ENGINES.items():
            sched_mod.Scheduler = cls
            lim = _compat.engine_limits()
            assert (lim.invalid_blocks_one_group, lim.async_done_one_group, lim.mamba_align_no_external) == want[name]
            assert cls.__qualname__ in lim.source
    finally:
        sched_mod.Scheduler = saved


def test_load_policy_matrix():
    """docs/vllm.md's matrix, row by row: (groups, Mamba, mamba_cache_mode,
    load_async asked, limits) -> (loads, async)."""
    from umbp.vllm._compat import EngineLimits
    from umbp.vllm.scheduler import load_policy

    old = EngineLimits(True, True, True, "00024d31")
    mixin = EngineLimits(True, False, True, "mixin")
    async_only = EngineLimits(False, True, False, "fixed scan, one-group async completion")
    fixed = EngineLimits(False, False, False, "hma")
    for lim in (old, mixin, async_only, fixed):
        for a in (True, False):
            assert load_policy(1, False, None, a, lim)[:2] == (True, a)  # one group: as asked
    for lim in (old, mixin):
        assert load_policy(2, False, None, True, lim)[:2] == (False, True)
        assert load_policy(3, True, "align", True, lim)[:2] == (False, True)
        assert load_policy(3, True, "none", True, lim)[:2] == (False, True)
    assert load_policy(2, False, None, True, async_only)[:2] == (True, False)  # sync loads instead
    assert load_policy(3, True, "none", True, async_only)[:2] == (False, True)  # Mamba needs async
    assert load_policy(2, False, None, False, async_only) == (True, False, "")
    assert load_policy(3, True, "align", True, fixed) == (True, True, "")


def test_sliding_window_only_sync_loads():
    r = S.hybrid(groups=[(FULL, 1, 0), (SWA, 2, 40)], extra={"load_async": False})
    assert r["matched"] == (0, 96, False)
    assert r["loaded"] == [{0: 6, 1: 3}]


@TP
def test_kv_events(tp):
    r = S.events(tp=tp)
    assert r["stored"] == 6


def test_kv_events_raw_hashes_when_vllm_says_so(monkeypatch):
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: vLLM's events carry the hash
    bytes, and so do ours."""
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    assert S.events()["stored"] == 6


def test_event_that_cannot_be_built_leaves_the_block_unannounced(monkeypatch):
    """A BlockStored that fails to build: no BlockRemoved follows for that
    block, the next block's events still go out, the failure is counted."""
    from umbp.vllm import _compat
    from umbp.vllm.events import REMOVED, STORED, EventBuilder
    from umbp.vllm.identity import describe_groups

    groups = describe_groups(S.HarnessConfig().kv_cache_config(), None)
    eb = EventBuilder(1, 16, groups)
    real = _compat.make_block_stored
    bad = b"\x01" * 32

    def flaky(**kw):
        if kw["block_hashes"] == [_compat.convert_block_hash(bad)]:
            raise TypeError("Missing required argument 'lora_name'")
        return real(**kw)

    monkeypatch.setattr(_compat, "make_block_stored", flaky)
    good = b"\x02" * 32
    eb.feed([(0, STORED, 0, bad), (0, STORED, 0, good)])
    eb.feed([(0, REMOVED, 0, bad), (0, REMOVED, 0, good)])
    evs = eb.take()
    assert [type(e).__name__ for e in evs] == ["BlockStored", "BlockRemoved"]
    assert evs[0].block_hashes == evs[1].block_hashes == [_compat.convert_block_hash(good)]
    assert eb.lost == 1


def test_events_describe_each_group_as_vllm_does(monkeypatch):
    """A hybrid model (full + sliding window + Mamba): each BlockStored names
    its group and carries kv_cache_spec_kind / kv_cache_spec_sliding_window
    exactly as this vLLM's own functions give them for the group's spec (a
    router gates sliding-window groups on them); where vLLM has no such
    functions (older versions) both stay None."""
    import vllm
    from umbp.vllm import _compat, identity
    from umbp.vllm.events import STORED, EventBuilder

    if vllm.API == "old":
        pytest.skip("the old BlockStored has no group fields")
    from vllm.v1 import kv_cache_interface as kvi

    cfg = S.HarnessConfig(groups=[(FULL, 1, 0), (SWA, 2, 40), (MAMBA, 1, 0)]).kv_cache_config()
    specs = [g.kv_cache_spec for g in cfg.kv_cache_groups]
    want = [(kvi.get_kv_cache_spec_kind(s).value, kvi.get_kv_cache_spec_sliding_window(s)) for s in specs]
    assert want == [("full_attention", None), ("sliding_window", 40), ("mamba", None)]
    h = [bytes([i + 1]) * 32 for i in range(3)]

    def stored_fields():
        eb = EventBuilder(1, 16, identity.describe_groups(cfg, None))
        eb.feed([(0, STORED, g, h[g]) for g in range(3)])
        return [(e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) for e in eb.take()]

    assert stored_fields() == [(g, want[g][0], want[g][1]) for g in range(3)]
    monkeypatch.setattr(_compat, "_vllm_spec_kind", None)
    monkeypatch.setattr(_compat, "_vllm_spec_window", None)
    assert stored_fields() == [(g, None, None) for g in range(3)]


def test_a_spec_vllm_cannot_describe_is_named_once(monkeypatch, caplog):
    """vLLM's get_kv_cache_spec_kind raising on a group's spec (a spec class
    newer than the function): that group's events go out without the two
    fields, and one warning names the spec class and the error, once."""
    import vllm
    from umbp.vllm import _compat, identity
    from umbp.vllm.events import STORED, EventBuilder

    if vllm.API == "old":
        pytest.skip("the old BlockStored has no group fields")

    def kind(spec):
        if type(spec).__name__ == "MambaSpec":
            raise ValueError("unknown KV cache spec")
        return "full_attention"

    monkeypatch.setattr(_compat, "_vllm_spec_kind", kind)
    monkeypatch.setattr(_compat, "_spec_failures", set())
    cfg = S.HarnessConfig(groups=[(FULL, 1, 0), (MAMBA, 1, 0)]).kv_cache_config()
    assert type(cfg.kv_cache_groups[1].kv_cache_spec).__name__ == "MambaSpec"
    h = [bytes([i + 1]) * 32 for i in range(4)]
    caplog.set_level("WARNING")
    eb = EventBuilder(1, 16, identity.describe_groups(cfg, None))
    eb.feed([(0, STORED, 0, h[0]), (0, STORED, 1, h[1]), (0, STORED, 1, h[2])])
    evs = eb.take()
    assert [(e.group_idx, e.kv_cache_spec_kind) for e in evs] == [
        (0, "full_attention"), (1, None), (1, None)]
    eb2 = EventBuilder(1, 16, identity.describe_groups(cfg, None))
    eb2.feed([(0, STORED, 1, h[3])])
    eb2.take()
    warned = [r.getMessage() for r in caplog.records if "get_kv_cache_spec_kind" in r.getMessage()]
    assert len(warned) == 1 and "MambaSpec" in warned[0] and "unknown KV cache spec" in warned[0]


def test_async_lookup_answers_none_until_done():
    r = S.lookup_async()
    assert r["answers"][0] == (0, None, False)


def test_kv_roles():
    r = S.roles()
    assert r["kv_producer"]["matched"] == (0, 0, False) and r["kv_producer"]["stored"] > 0
    assert r["kv_consumer"]["stored"] == 0


def test_worker_call_order_and_wait_for_save_does_not_wait():
    """wait_for_save submits the stores and returns: the job is still
    uncollected afterwards, and no Job.wait ran inside it."""
    waits = []
    orig = umbp.Job.wait

    def spy(self, timeout_ms=None):
        waits.append(inside[0])
        return orig(self, timeout_ms)

    inside = [False]
    with S.engine() as e:
        w = e.workers[0]
        real = w.conn._worker.wait_for_save

        def wrapped():
            inside[0] = True
            try:
                real()
            finally:
                inside[0] = False

        w.conn._worker.wait_for_save = wrapped
        umbp.Job.wait = spy
        try:
            e.add("A", S.PROMPT, 2)
            e.step()
        finally:
            umbp.Job.wait = orig
        assert True not in waits
        assert w.inflight_after_save >= 1
        names = [c[0] for c in w.calls]
        assert names[:3] == ["handle_preemptions", "bind_connector_metadata", "start_load_kv"]  # the V1 runner
        assert names.index("wait_for_save") > names.index("wait_for_layer_load")
        assert names[-1] == "clear_connector_metadata"
        e.run()
        e.check_clean()


@SCHED
def test_cross_layer_kv_cache(async_scheduling):
    r = S.restore(cross_layer=True, async_scheduling=async_scheduling,
                  extra={"prefer_cross_layer_blocks": True})
    assert r["matched"] == (0, 96, True) and r["checked_blocks"] == 6


def test_shutdown_releases_jobs_in_flight():
    e = S.Engine(S._cfg())
    w = e.workers[0]
    w.hold_stores(True)
    e.add("A", S.PROMPT, 4)
    e.step()
    assert w.counters()["jobs_inflight"] >= 1
    rt = w.runtime()
    [c] = e.shutdown()
    assert c["jobs_inflight"] == 0 and c["jobs_released"] == c["jobs_submitted"] >= 1
    assert rt.closed and w.conn._worker.rt is None


GPU = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
       pytest.mark.skipif("cuda" not in umbp.gpu_backends_built(), reason="libumbp built without CUDA")]


@pytest.mark.parametrize("name,kw", [
    ("restore", {}),
    ("restore", {"async_scheduling": True}),
    ("restore", {"extra": {"load_async": False}}),
    ("restore", {"async_scheduling": True, "tp": 2, "extra": {"load_async": False}}),
    ("restore", {"cross_layer": True, "extra": {"prefer_cross_layer_blocks": True}}),
    ("hybrid", {"async_scheduling": True}),
    ("failed_load", {"tp": 2, "fail_rank": 1, "extra": {"load_async": False}}),
    ("preemption", {"async_scheduling": True, "extra": {"save_decode_cache": True}}),
    ("store_inflight", {}),
    ("abort", {}),
], ids=lambda x: x if isinstance(x, str) else json.dumps(x, separators=(",", ":")))
@pytest.mark.parametrize("_gpu", [pytest.param(0, marks=GPU)], ids=["cuda"])
def test_gpu_scenarios(name, kw, _gpu):
    """The scenarios with CUDA KV tensors: the connector records torch.cuda
    events on the compute stream and the runtime's CUDA copy engine waits for
    them (stores after the forward's writes, loads after the poisoning)."""
    getattr(S, name)(device="cuda", **kw)


# ---- the old vLLM API (handle_preemptions(set), no worker metadata, ...) ---------------------


def _run_old(name, **kw):
    kw["api"] = "old"  # HarnessConfig.api: the old call conventions
    return _run_api("old", name, **kw)


def _run_api(fake_api, name, **kw):
    """A scenario in a subprocess whose fake vLLM is base.py version `fake_api`."""
    api = fake_api
    env = dict(os.environ, FAKE_VLLM_API=fake_api,
               PYTHONPATH=os.pathsep.join([HARNESS, HERE, CONNECTOR, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "vllm_harness.scenarios", name, json.dumps(kw)], cwd=HERE,
                       env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise HarnessError(f"{api}-API scenario {name} failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    line = [x for x in p.stdout.splitlines() if x.startswith("SCENARIO-RESULT ")][-1]
    return json.loads(line[len("SCENARIO-RESULT "):])


@pytest.mark.parametrize("name,kw", [
    ("restore", {}),
    ("restore", {"async_scheduling": True, "tp": 2, "extra": {"load_async": False}}),
    ("preemption", {"extra": {"save_decode_cache": True}}),
    ("abort", {"async_scheduling": True}),
    ("store_inflight", {}),
    ("reset", {"via_workers": True}),
    ("failed_load", {"tp": 2, "fail_rank": 1}),
    ("hybrid", {}),
    ("events", {}),
], ids=lambda x: x if isinstance(x, str) else json.dumps(x, separators=(",", ":")))
def test_old_vllm_api(name, kw):
    """An older vLLM: no SupportsHMA/KVConnectorWorkerMetadata/transfer results
    in base.py, handle_preemptions(set[str]) only when something was preempted."""
    _run_old(name, **kw)


@pytest.mark.parametrize("api,mixin", [("003df296", "23ec7c7f"), ("00f4240e", "00f4240e")])
@pytest.mark.parametrize("name,kw", [
    ("restore", {"async_scheduling": True}),
    ("failed_load", {"extra": {"load_async": True}}),
    ("failed_load", {"tp": 2, "fail_rank": 1, "extra": {"load_async": False}}),
    ("reused_source_blocks", {}),
], ids=lambda x: x if isinstance(x, str) else json.dumps(x, separators=(",", ":")))
def test_each_base_version(api, mixin, name, kw):
    """base.py@003df296 (no transfer results: get_finished) and the base of
    the mixin @00f4240e (results with prefix_replay_checkpoints, no field
    defaulted; start_load_kv after the forward without sync loads)."""
    _run_api(api, name, mixin=mixin, **kw)


def test_transfer_results_fields():
    """prefix_replay_checkpoints is passed empty (umbp certifies no replay
    checkpoint: the engine replays the window); an unknown required field is
    refused by name."""
    import dataclasses

    from umbp.vllm import _compat

    @dataclasses.dataclass
    class R1:
        finished_sending: set
        finished_recving: set
        failed_recving: set
        prefix_replay_checkpoints: dict

    @dataclasses.dataclass
    class R2:
        finished_sending: set
        finished_recving: set
        failed_recving: set
        replay_tokens: dict

    @dataclasses.dataclass
    class R3:
        finished_sending: set = dataclasses.field(default_factory=set)
        finished_recving: set = dataclasses.field(default_factory=set)
        failed_recving: set = dataclasses.field(default_factory=set)
        extra: dict = dataclasses.field(default_factory=dict)

    assert _compat.transfer_results_extra(R1) == {"prefix_replay_checkpoints": {}}
    with pytest.raises(TypeError, match="replay_tokens"):
        _compat.transfer_results_extra(R2)
    assert _compat.transfer_results_extra(R3) == {}


# ---- TP=2 across processes -----------------------------------------------------------------


@pytest.mark.skipif(not umbp.has_lookup_service(), reason=NO_LOOKUP_REASON)
@pytest.mark.parametrize("name,kw", [
    ("restore", {"async_scheduling": True}),
    ("failed_load", {"fail_rank": 1}),
    ("reset", {}),
    ("preemption", {}),
])
def test_tp2_processes_embedded(name, kw, tmp_path):
    try:
        umbp.LookupClient({"mode": "embedded", "namespace": "0" * 32, "num_ranks": 1}).close()
    except NotImplementedError:
        pytest.skip(NO_LOOKUP_REASON)
    except umbp.UmbpError:
        pass
    extra = dict(kw.pop("extra", {}), lookup_dir=str(tmp_path))
    getattr(S, name)(tp=2, processes=True, extra=extra, **kw)


@pytest.mark.parametrize("processes", [False, True], ids=["tp2-inproc", "tp2-processes"])
@pytest.mark.parametrize("name,kw", [
    ("restore", {}),
    ("restore", {"async_scheduling": True, "extra": {"load_async": False}}),
    ("failed_load", {"fail_rank": 1}),
    ("hybrid", {}),
    ("reset", {}),
], ids=lambda x: x if isinstance(x, str) else json.dumps(x, separators=(",", ":")))
def test_tp2_standalone(server, processes, name, kw):
    extra = dict(kw.pop("extra", {}), mode="standalone", socket_dir=server[1])
    getattr(S, name)(tp=2, processes=processes, extra=extra, **kw)


def test_standalone_server_death_means_misses(server):
    p, sock = server

    def kill():
        p.kill()
        p.wait(10)

    r = S.server_death(kill, extra={"mode": "standalone", "socket_dir": sock, "timeout_ms": 2000,
                                    "lookup_timeout_ms": 200})
    assert r["matched"][1] == 0
    assert r["seconds"] < 60


def test_standalone_server_stall_means_misses(server):
    """SIGSTOP instead of a kill: B's lookup times out (a miss, recomputed),
    its stores time out and release their blocks, its output is exact and
    nothing hangs; SIGCONT afterwards.  timeout_ms is short because B's
    blocks stay held until its stores end at that deadline, and the harness
    gives up after 500 idle steps of about 1 ms."""
    p, sock = server

    def stop():
        stop_process(p)

    try:
        r = S.server_death(stop, extra={"mode": "standalone", "socket_dir": sock, "timeout_ms": 300,
                                        "lookup_timeout_ms": 200})
    finally:
        p.send_signal(signal.SIGCONT)
    assert r["matched"][1] == 0
    assert r["seconds"] < 60


# ---- options ---------------------------------------------------------------------------------


def _parse(extra):
    from umbp.vllm.options import ConnectorOptions

    return ConnectorOptions.parse(extra)


@pytest.mark.parametrize("extra,msg", [
    ({"capacty_bytes": "1GiB"}, "unknown option 'capacty_bytes' (did you mean 'capacity_bytes'?"),
    ({"lazy_ofload": True}, "unknown option 'lazy_ofload' (did you mean 'lazy_offload'?)"),
    ({"foo": 1, "bar": 2}, "unknown option 'foo' (see docs/configuration.md); unknown option 'bar'"),
    ({"mode": "cluster"}, "mode: must be one of embedded standalone distributed, got 'cluster'"),
    ({"mode": "distributed"}, "master_address: distributed mode needs umbp-master's host:port"),
    ({"mode": "distributed", "master_address": "127.0.0.1:7390", "socket_dir": "/tmp"},
     "socket_dir: an option of the 'shm' tier, which mode 'distributed' does not use"),
    ({"load_async": "yes"}, "load_async: must be true or false, got 'yes'"),
    ({"lookup_timeout_ms": 0}, "lookup_timeout_ms: must be between 1 and 60000, got 0"),
    ({"lookup_timeout_ms": 1.5}, "lookup_timeout_ms: expected an integer"),
    ({"capacity_bytes": "lots"}, "capacity_bytes: must be a byte count"),
    ({"copy_threads": 0}, "copy_threads: must be between 1 and 64, got 0"),
    ({"capacity_bytes": 1 << 30, "total_capacity_bytes": 1 << 31}, "mutually exclusive"),
    ({"dram_high_watermark": 0.5, "dram_low_watermark": 0.6}, "dram_low_watermark=0.6 must be below dram_high_watermark=0.5"),
    ({"dram_high_watermark": 2}, "dram_high_watermark: must be between 0.01 and 1, got 2"),
    ({"dram_shm_name": "x"}, "dram_shm_name=x needs dram_use_shared_memory=true"),
    ({"load_failure_quarantine_ms": -1}, "load_failure_quarantine_ms: must be between 0 and 3600000"),
    ({"lookup_instance": "a/b"}, "lookup_instance: only letters"),
    ({"lookup_dir": "rel/dir"}, "lookup_dir: must be an absolute directory path"),
    ({"socket_dir": "/tmp/x"}, "socket_dir: an option of the 'shm' tier, which mode 'embedded' does not use"),
    ({"dp_rank": 1}, "dp_rank: an option of the 'shm' tier, which mode 'embedded' does not use"),
    ({"tenant_namespace": "t"}, "tenant_namespace: not an option in embedded mode (it sets umbp's namespace: "
                                "an option of the 'shm' tier"),
    ({"mode": "standalone", "capacity_bytes": "1GiB"}, "only with auto_start=true"),
    ({"mode": "standalone", "dram_use_hugepages": True},
     "dram_use_hugepages: an option of the 'dram' tier, which mode 'standalone' does not use"),
    ({"mode": "standalone", "lookup_dir": "/tmp"}, "lookup_dir: not an option in standalone mode"),
    ({"mode": "standalone", "endpoint": "tcp://h:1"}, "endpoint: must be unix:///<dir>/umbp-dp<N>"),
    ({"mode": "standalone", "endpoint": "/run/umbp/umbp-dp0.sock", "socket_dir": "/x"}, "mutually exclusive"),
    ({"enable_partial_hash_hits": True}, "enable_partial_hash_hits: not supported"),
    ({"backend": "memory"}, "backend: not supported"),
    ({"master_address": "h:1"}, "master_address: an option of the 'rdma' tier, which mode 'embedded' does not use"),
    ({"node_id": 3}, "node_id: not supported by the umbp connector: UMBP's distributed-mode option"),
    ({"rank": 1}, "rank: not supported by the umbp connector: set by the connector"),
    ({"namespace": "t"}, "tenant_namespace"),
    ({"num_workers": 2, "copy_threads": 2}, "same option"),
    ({"capacity_bytes": None}, "capacity_bytes: null is not a value"),
])
def test_bad_options_are_refused_naming_them(extra, msg):
    from umbp.vllm.options import UMBPConfigError

    with pytest.raises(UMBPConfigError) as ei:
        _parse(extra)
    assert msg in str(ei.value)


def test_options_map_to_the_runtime():
    o = _parse({"capacity_bytes": "2GiB", "dram_use_hugepages": True, "timeout_ms": 500, "num_workers": 3,
                "load_failure_quarantine_ms": 1000, "enable_events": True, "lookup_instance": "a",
                "key_namespace": "fleet", "load_async": False})
    cfg = o.runtime_config(rank=1, world_size=2, gpu_backend="host")
    assert cfg == {"mode": "embedded", "rank": 1, "world_size": 2, "capacity_bytes": "2GiB",
                   "dram_use_hugepages": True, "timeout_ms": 500, "copy_threads": 3,
                   "load_failure_quarantine_ms": 1000, "enable_events": True, "lookup_timeout_ms": 100,
                   "gpu_backend": "host"}
    umbp.Runtime(dict(cfg, capacity_bytes="8MiB", dram_use_hugepages=False)).close()  # the runtime accepts it
    s = _parse({"mode": "standalone", "endpoint": "unix:///run/umbp/umbp-dp3-llama.sock", "engine_id": "e1",
                "tenant_namespace": "t"})
    assert (s.passed["socket_dir"], s.dp_rank, s.lookup_instance) == ("/run/umbp", 3, "llama")
    rc = s.runtime_config(rank=0, world_size=1, role="lookup")
    assert rc["role"] == "lookup" and rc["namespace"] == "t" and rc["socket_dir"] == "/run/umbp"
    assert _parse({"mode": "standalone", "dp_rank": "auto"}).runtime_config(rank=0, world_size=1,
                                                                            dp_rank=5)["dp_rank"] == 5


def test_docs_name_every_option():
    from umbp.vllm.options import OPTIONS, UNSUPPORTED

    with open(os.path.join(os.path.dirname(CONNECTOR), "docs", "vllm.md")) as f:
        doc = f.read()
    missing = [n for n in list(OPTIONS) + list(UNSUPPORTED) if f"`{n}`" not in doc]
    assert not missing, f"docs/vllm.md does not name {missing}"


def test_unknown_options_warn_with_strict_options_false(caplog):
    o = _parse({"strict_options": False, "capacty_bytes": 1})
    assert "capacty_bytes" not in o.given
    assert any("capacty_bytes" in r.getMessage() for r in caplog.records)


def test_the_connector_refuses_bad_options_at_construction():
    from umbp.vllm.options import UMBPConfigError
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_harness.config import HarnessConfig

    import umbp.vllm.connector as mod

    cfg = HarnessConfig(extra={"lookup_timout_ms": 5})
    with pytest.raises(UMBPConfigError, match="lookup_timout_ms"):
        mod.UMBPConnector(cfg.vllm_config(), KVConnectorRole.SCHEDULER, cfg.kv_cache_config())
    cfg = HarnessConfig(kv_role="kv_sometimes")
    with pytest.raises(UMBPConfigError, match="kv_role"):
        mod.UMBPConnector(cfg.vllm_config(), KVConnectorRole.SCHEDULER, cfg.kv_cache_config())


# ---- class surface, metadata, stats, metrics --------------------------------------------------


def test_class_surface():
    import umbp.vllm.connector as mod
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA, supports_hma

    C = mod.UMBPConnector
    assert supports_hma(C) and issubclass(C, SupportsHMA)
    assert not getattr(C, "__abstractmethods__", None)
    assert C.get_required_kvcache_layout(None) is None
    assert C.requires_piecewise_for_cudagraph({"load_async": False}) is True
    assert C.requires_piecewise_for_cudagraph({}) is False
    assert mod.__doc__ and "003df2961dd8" in mod.__doc__ and "13f4ad0f55b0" in mod.__doc__


def test_optional_newer_hooks_are_inherited():
    """Optional hooks of newer vLLMs whose base default is right for umbp (a
    best-effort, content-addressed cache) stay inherited: no divergent local
    hybrid hits (vLLM-derived trees: base default False; umbp does not
    complete them atomically), the ordinary EAGLE hash chain (base.py@003df296:
    supports_eagle_prefix_cache_hashing False), no pending block frees to wait
    for in the preemption loop, no KV cache manager or partial-tail binding."""
    import umbp.vllm.connector as mod

    for name in ("supports_divergent_local_hybrid_hits", "supports_eagle_prefix_cache_hashing",
                 "set_eagle_prefix_cache_hashing", "has_pending_block_frees", "bind_kv_cache_manager",
                 "register_finished_partial_tail", "bind_gpu_block_pool", "on_new_request"):
        assert name not in vars(mod.UMBPConnector), name
    # the worker hooks the V2 runner calls exist whatever the base.py
    assert "finish_forward" in vars(mod.UMBPConnector) and "reset_capture_state" in vars(mod.UMBPConnector)


def test_import_umbp_vllm_without_vllm():
    code = ("import sys; sys.modules['vllm'] = None; import umbp, umbp.vllm, umbp.vllm.options, "
            "umbp.vllm.identity; print(umbp.vllm.CONNECTOR_NAME)")
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=CONNECTOR),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "UMBPConnector"


def test_metadata_pickles():
    from umbp.vllm.metadata import LoadPlan, StorePlan, UMBPConnectorMetadata, UMBPWorkerMetadata

    m = UMBPConnectorMetadata(step=3, loads=[LoadPlan("r", 0, b"x" * 64, 32, [1, 2], [1, 2], True)],
                              stores=[StorePlan(7, "r", 0, b"y" * 32, 32, [3], True)],
                              delayed_free_req_ids={"q"}, flush_plan_ids={7}, load_error_ids={"r": {1}})
    assert pickle.loads(pickle.dumps(m)) == m
    a = UMBPWorkerMetadata(stores_done={7: 1}, failed_loads=[(0, b"h")], clears_done={1: 1})
    b = UMBPWorkerMetadata(stores_done={7: 1, 8: 1}, stores_failed_blocks={8: 2}, clears_done={1: 1})
    c = a.aggregate(b)
    assert c.stores_done == {7: 2, 8: 1} and c.stores_failed_blocks == {8: 2} and c.clears_done == {1: 2}
    assert pickle.loads(pickle.dumps(c)) == c


def test_stats_and_prometheus():
    # optional: scripts/setup.sh installs python3-prometheus-client; without
    # it (a bare machine) this one test skips and says so
    prometheus_client = pytest.importorskip("prometheus_client", reason="prometheus_client is not installed "
                                            "(Debian python3-prometheus-client; scripts/setup.sh installs it)")

    import umbp.vllm.connector as mod

    st = mod.UMBPConnector.build_kv_connector_stats({"lookups": 2, "lookup_query_tokens": 100,
                                                     "lookup_hit_tokens": 50, "load_blocks_ok": 3})
    other = mod.UMBPConnector.build_kv_connector_stats({"lookups": 1, "store_blocks_ok": 4, "store_bytes": 4096})
    st.aggregate(other)
    red = st.reduce()
    assert red["Lookups"] == 3 and red["Lookup hit rate (tokens)"] == 0.5 and red["Stored blocks"] == 4
    assert not st.is_empty() and mod.UMBPConnector.build_kv_connector_stats().is_empty()
    assert pickle.loads(pickle.dumps(st)).data == st.data

    reg = prometheus_client.CollectorRegistry()
    types = {c: functools.partial(c, registry=reg) for c in
             (prometheus_client.Gauge, prometheus_client.Counter, prometheus_client.Histogram)}
    from vllm_harness.config import HarnessConfig

    pm = mod.UMBPConnector.build_prom_metrics(HarnessConfig().vllm_config(), types, ["engine"], {0: ["0"]})
    assert pm is not None
    pm.observe(st.data, engine_idx=0)
    assert reg.get_sample_value("vllm:umbp_store_blocks_total", {"engine": "0"}) == 4
    assert reg.get_sample_value("vllm:umbp_lookup_hit_tokens_total", {"engine": "0"}) == 50


def test_stats_flow_from_an_engine():
    with S.engine() as e:
        e.add("A", S.PROMPT, 2)
        e.run()
        e.add("B", S.PROMPT, 2)
        seen = []
        orig = e.sched.update_from_output

        def spy(so, out):
            if out["kv"].kv_connector_stats is not None:
                seen.append(dict(out["kv"].kv_connector_stats.data))
            return orig(so, out)

        e.sched.update_from_output = spy
        e.run()
        e.check_clean()
    assert sum(d.get("load_blocks_ok", 0) for d in seen) == 6
    assert sum(d.get("load_bytes", 0) for d in seen) > 0
    st = e.conn.get_kv_connector_stats()  # the scheduler's own (lookups); taken once
    assert st is None or st.data["lookups"] >= 1
