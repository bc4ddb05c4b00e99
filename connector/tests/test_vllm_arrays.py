"""The vLLM connector's array code paths (umbp/vllm/scheduler.py): each
checked against the per-block Python loop it replaced, on random inputs; and
harness scenarios with long prompts (partial hits anywhere in 40 blocks, with
full, sliding-window and Mamba groups) and with two requests storing the
same blocks in one step.

Run: UMBP_LIBRARY=/path/to/libumbp.so /usr/bin/python3 -m pytest connector/tests/test_vllm_arrays.py
"""
import os
import random
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "vllm_harness")
CONNECTOR = os.path.dirname(HERE)
for p in (HARNESS, HERE, CONNECTOR):  # the fake vllm, the harness package, umbp
    if p not in sys.path:
        sys.path.insert(0, p)

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
import vllm  # noqa: E402  (the fake one)

assert getattr(vllm, "FAKE", False), "the fake vllm of vllm_harness must come first on sys.path"

from umbp.vllm import scheduler as SCH  # noqa: E402
from umbp.vllm.identity import FULL, MAMBA, NULL_BLOCK_ID, SWA, GroupInfo  # noqa: E402
from vllm_harness import scenarios as S  # noqa: E402
from vllm_harness.engine import HarnessError  # noqa: E402

# ---- the loops these replaced (the connector before its array rewrite) ---------------


def old_report_id(g0, p, local_k):
    for j in range(min(p, len(g0) - 1), local_k - 1, -1):
        if g0[j] != NULL_BLOCK_ID:
            return g0[j]
    return NULL_BLOCK_ID


def old_best_k(groups, ok, local_k, kmax):
    limit = kmax
    for gi, g in enumerate(groups):
        if g.kind == FULL:
            row = ok[gi]
            bad = np.flatnonzero(~row)
            limit = min(limit, local_k + (int(bad[0]) if bad.size else row.size))
    others = [(gi, g) for gi, g in enumerate(groups) if g.kind != FULL]
    for k in range(limit, local_k, -1):
        if all(ok[gi, g.needed(local_k, k).start - local_k:k - local_k].all() for gi, g in others):
            return k
    return local_k


def _groups(kinds, window=40):
    out = []
    for i, kind in enumerate(kinds):
        out.append(GroupInfo(i, kind, kind, 16, (), "float32", window=window if kind == SWA else 0))
    return out


def _sched(groups):
    """A scheduler half with only what _best_k reads."""
    s = SCH.UMBPScheduler.__new__(SCH.UMBPScheduler)
    s.groups = groups
    s.full_gis = [gi for gi, g in enumerate(groups) if g.kind == FULL]
    s.quarantine = {}
    return s


# ---- unit checks ----------------------------------------------------------------------


def test_report_ids_equal_the_loop():
    rng = random.Random(7)
    for _ in range(400):
        n0 = rng.randrange(0, 40)
        g0 = [0 if rng.random() < 0.4 else rng.randrange(1, 99) for _ in range(n0)]
        local_k = rng.randrange(0, 30)
        hi = local_k + rng.randrange(1, 40)
        pos = np.array(sorted(rng.sample(range(local_k, hi), rng.randrange(1, hi - local_k + 1))), dtype=np.int64)
        got = SCH.report_ids(np.array(g0, dtype=np.int64), pos, local_k).tolist()
        assert got == [old_report_id(g0, int(p), local_k) for p in pos], (g0, local_k, pos)


@pytest.mark.parametrize("kinds", [[FULL], [FULL, SWA], [FULL, MAMBA], [FULL, SWA, MAMBA], [SWA], [MAMBA],
                                   [SWA, MAMBA], [FULL, FULL, SWA]])
def test_best_k_equals_the_loop(kinds):
    rng = random.Random(hash(tuple(kinds)) & 0xffff)
    for window in (16, 17, 40, 100):
        groups = _groups(kinds, window)
        s = _sched(groups)
        for _ in range(150):
            local_k = rng.randrange(0, 5)
            n = rng.randrange(1, 50)
            p = rng.choice((0.5, 0.9, 0.97, 1.0))
            ok = np.array([[rng.random() < p for _ in range(n)] for _ in groups], dtype=bool).reshape(len(groups), n)
            assert s._best_k(ok, local_k, local_k + n) == old_best_k(groups, ok, local_k, local_k + n), (ok, local_k)


def test_rows_in_is_exact():
    rng = np.random.default_rng(3)
    for w in (1, 8, 16, 20, 32, 64):
        s = rng.integers(0, 256, (50, w), dtype=np.uint8)
        h = np.concatenate([s[rng.integers(0, 50, 30)], rng.integers(0, 256, (30, w), dtype=np.uint8)])
        rng.shuffle(h)
        want = [bytes(r) in {bytes(x) for x in s} for r in h]
        assert SCH.rows_in(h, s).tolist() == want
    # rows whose 64-bit XOR folds collide (their 8-byte words swapped): still exact
    a = rng.integers(0, 256, (4, 32), dtype=np.uint8)
    swapped = a.copy()
    swapped[:, :8], swapped[:, 8:16] = a[:, 8:16], a[:, :8]
    assert SCH.rows_in(swapped, a).tolist() == [False] * 4
    assert SCH.rows_in(a, np.concatenate([a[:2], swapped[:2]])).tolist() == [True, True, False, False]
    assert SCH.rows_in(np.concatenate([a, swapped]), np.concatenate([a, swapped])).all()
    assert not SCH.rows_in(a[:0], a).size and not SCH.rows_in(a, a[:0]).any()


def test_rows_grow():
    r = SCH.Rows()
    want = []
    rng = np.random.default_rng(1)
    for _ in range(40):
        x = rng.integers(0, 256, (int(rng.integers(0, 9)), 3), dtype=np.uint8)
        r.extend(x)
        want.extend(x.tolist())
        assert r.a.tolist() == want
    ids = SCH.Rows(SCH.ids_array([3, 4]))
    ids.extend(SCH.ids_array([5]))
    assert ids.a.tolist() == [3, 4, 5] and ids.a.dtype == np.int64


def test_block_ids_convert_only_what_is_new():
    ids = SCH._Ids([4, 5])
    assert ids.array().tolist() == [4, 5]
    ids.lst.extend([6])
    a = ids.array()
    assert a.tolist() == [4, 5, 6] and a.dtype == np.int64 and ids.arr.n == 3
    assert SCH._Ids().array().tolist() == []


def test_block_ids_arrays_accepts_every_form():
    class Blocks:
        def get_block_ids(self):
            return ([1, 2], [0, 3])

    assert [a.tolist() for a in SCH.block_ids_arrays(Blocks())] == [[1, 2], [0, 3]]
    assert [a.tolist() for a in SCH.block_ids_arrays([5, 6])] == [[5, 6]]  # old single-group list
    assert [a.tolist() for a in SCH.block_ids_arrays(([], [7]))] == [[], [7]]
    assert SCH.block_ids_arrays(None) == []


def test_plan_keys_equal_the_workers_derivation():
    import umbp
    from umbp.vllm.metadata import StorePlan

    ns = umbp.Namespace.derive("m", "", 16, "NHD", "float32")
    hs = np.frombuffer(os.urandom(10 * 32), dtype=np.uint8).reshape(10, 32)
    keys = [umbp.derive_keys(ns, rank=(r, 0, 0, 0), group=1, hashes=hs) for r in range(2)]
    plan = StorePlan(1, "r", 1, hs.tobytes(), 32, np.arange(10, dtype=np.int64).tobytes(), True,
                     keys=np.stack(keys).tobytes(), key_blocks=10)
    for r in range(2):
        assert (plan.keys_of(r, 2) == keys[r]).all()
    assert plan.keys_of(0, 4) is None  # another world size: derive
    part = StorePlan(2, "r", 1, hs.tobytes(), 32, b"", True, keys=np.stack([k[:7] for k in keys]).tobytes(),
                     key_blocks=7)
    assert (part.keys_of(1, 2) == keys[1][:7]).all()
    assert plan.num_blocks == 10 and plan.block_id_array().tolist() == list(range(10))
    import pickle

    assert pickle.loads(pickle.dumps(plan)) == plan


# ---- harness scenarios ----------------------------------------------------------------

NB = 40
LONG = [(i * 7919) % 997 + 1 for i in range(NB * 16 + 1)]  # 40 full blocks + 1 token


def _long_partial(m, groups=None, tp=1, async_scheduling=False, engine="00024d31"):
    """A stores a 40-block prompt; B shares its first m blocks.  Returns B's
    (local, external) match and the blocks each rank loaded per group."""
    kw = {"num_blocks": 128, "tp": tp, "async_scheduling": async_scheduling, "engine": engine}
    if groups:
        kw["groups"] = groups
    with S.engine(**kw) as e:
        e.add("A", LONG, 2)
        e.run()
        for w in e.workers:
            w.poison(-7.0)
        pb = LONG[:m * 16] + [2000 + i for i in range(len(LONG) - m * 16)] if m < NB else list(LONG)
        e.add("B", pb, 2)
        e.run()
        e.check_outputs({"A": LONG, "B": pb}, 2)
        if e.bad:
            raise HarnessError(f"forward passes saw wrong KV: {e.bad}")
        m_b = e.matched("B")
        loaded = [w.counters()["blocks_loaded_by_group"] for w in e.workers]
        e.check_clean()
        return m_b, loaded


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2-inproc"])
@pytest.mark.parametrize("m", [0, 5, 15, 16, 17, 31, 33, 39, 40])
def test_long_prompt_partial_hits(m, tp):
    got, loaded = _long_partial(m, tp=tp)
    assert got is not None and got[1] == m * 16 and got[0] == 0
    assert all(x.get(0, 0) == m for x in loaded)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync-sched", "async-sched"])
@pytest.mark.parametrize("m,want", [(40, 40), (22, 20), (10, 8), (3, 0)])
def test_long_prompt_hybrid_groups(m, want, async_scheduling):
    """On the "hma" engine (the only one where hybrid hits are promised): full + sliding window (32 tokens) + Mamba: A's 4-block chunks store Mamba
    states at multiples of 4 blocks and the window (+1) before each chunk's
    end, so B's hit is the largest multiple of 4 not above m."""
    got, loaded = _long_partial(m, groups=[(FULL, 2, 0), (SWA, 2, 32), (MAMBA, 1, 0)], engine="hma",
                                async_scheduling=async_scheduling)
    assert got is not None and got[1] == want * 16
    if want:
        assert loaded == [{0: want, 1: 2, 2: 1}]


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2-inproc"])
def test_same_blocks_of_two_requests_in_one_step_are_stored_once(tp):
    with S.engine(tp=tp, max_num_batched_tokens=256) as e:
        e.add("A", S.PROMPT, 2)
        e.add("A2", S.PROMPT, 2)
        so = e.step()
        assert {nr.req_id for nr in so.scheduled_new_reqs} == {"A", "A2"}
        stores = [p for p in so.kv_connector_metadata.stores]
        assert sorted(p.req_id for p in stores) == ["A"] and len(stores[0].hashes) == 6 * stores[0].hash_len
        e.run()
        e.check_outputs({"A": S.PROMPT, "A2": S.PROMPT}, 2)
        assert [w.counters()["blocks_stored_by_group"] for w in e.workers] == [{0: 6}] * tp
        e.add("B", S.PROMPT, 2)
        e.run()
        assert e.matched("B")[1] == 96
        e.check_clean()


def test_keys_are_derived_once_from_the_first_lookups_local_k():
    import threading

    import umbp

    ns = umbp.Namespace.derive("m", "", 16, "NHD", "float32")
    s = _sched(_groups([FULL, SWA]))
    s.umbp, s.ns, s.world, s.rank_ids = umbp, ns, 2, [(0, 0, 0, 0), (1, 0, 0, 0)]
    s.keys_lock = threading.Lock()
    st = SCH._Req(None)
    st.hashes.extend(np.frombuffer(os.urandom(20 * 32), dtype=np.uint8).reshape(20, 32))
    want = {(r, gi): umbp.derive_keys(ns, rank=s.rank_ids[r], group=gi, hashes=st.hashes.a)
            for r in range(2) for gi in range(2)}
    derived = []
    orig = umbp.derive_keys

    class Counting:
        KEY_SIZE = umbp.KEY_SIZE

        @staticmethod
        def derive_keys(*a, **kw):
            derived.append(len(kw["hashes"]))
            return orig(*a, **kw)

    s.umbp = Counting
    for lo, hi in ((5, 10), (7, 12), (2, 12), (0, 20)):
        for (r, gi), w in want.items():
            assert (s._keys(st, r, gi, lo, hi) == w[lo:hi]).all()
    assert sum(derived) == 20 * 4  # each key of each (rank, group) once
    def pk(*a):
        d = s._plan_keys(*a)
        return d and (d["keys"], d["key_blocks"])

    assert pk(st, 1, slice(3, 8)) == (want[(0, 1)][3:8].tobytes() + want[(1, 1)][3:8].tobytes(), 5)
    idx = np.array([1, 4, 19])
    assert pk(st, 0, idx) == (want[(0, 0)][idx].tobytes() + want[(1, 0)][idx].tobytes(), 3)
    st2 = SCH._Req(None)
    st2.hashes = st.hashes
    s._keys(st2, 0, 0, 5, 10)
    s._keys(st2, 1, 0, 5, 10)
    # only rank 0 and 1 of group 0, positions [5, 10): the leading covered part
    w0 = {r: umbp.derive_keys(ns, rank=s.rank_ids[r], group=0, hashes=st.hashes.a) for r in range(2)}
    assert pk(st2, 0, slice(4, 8)) == {}  # its first block has no key
    assert pk(st2, 0, slice(5, 12)) == (w0[0][5:10].tobytes() + w0[1][5:10].tobytes(), 5)
    assert pk(st2, 0, np.array([6, 9, 11])) == (w0[0][[6, 9]].tobytes() + w0[1][[6, 9]].tobytes(), 2)
    assert pk(st2, 0, slice(10, 12)) == {}
    assert pk(st2, 1, slice(5, 10)) == {}  # group 1 was never looked up


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2-inproc"])
def test_a_plan_with_keys_of_its_first_blocks_only(tp):
    """A 96-token prompt is looked up for 5 blocks (the last token is always
    computed) but stores 6: its store plan carries the keys of 5, each worker
    derives the 6th; a later request finds all 6."""
    prompt = S.PROMPT[:96]
    plans = []

    def note(so):
        plans.extend(so.kv_connector_metadata.stores)

    with S.engine(tp=tp) as e:
        e.add("A", prompt, 2)
        e.run(before_execute=note)
        assert [(p.num_blocks, p.key_blocks) for p in plans] == [(4, 4), (2, 1)]  # two prefill chunks of 64
        for w in e.workers:
            w.poison(-7.0)
        e.add("B", prompt + [7, 8, 9], 2)
        e.run()
        e.check_outputs({"A": prompt, "B": prompt + [7, 8, 9]}, 2)
        assert e.matched("B")[1] == 96 and not e.bad
        e.check_clean()


@pytest.mark.parametrize("kinds", [[FULL], [FULL, SWA], [FULL, MAMBA], [SWA], [FULL, FULL, SWA]])
def test_match_probe_equals_one_full_query(kinds):
    """_match asks for the first PROBE_BLOCKS positions of a long query first:
    its answer equals _best_k over one query of every position, and a miss of
    a full-attention block inside the probe derives no key past it."""
    import threading

    import umbp

    ns = umbp.Namespace.derive("m", "", 16, "NHD", "float32")
    rng = random.Random(hash(tuple(kinds)) & 0xffff)
    P = SCH.PROBE_BLOCKS
    for window in (16, 40):
        groups = _groups(kinds, window)
        G = len(groups)
        for _ in range(60):
            world = rng.choice((1, 2))
            n_pos = rng.choice((10, 2 * P, 2 * P + 1, 3 * P + 5, 80))
            local_k = rng.randrange(0, 4)
            kmax = min(n_pos, local_k + rng.randrange(1, n_pos + 1))
            if kmax <= local_k:
                continue
            s = _sched(groups)
            s.world, s.rank_ids = world, [(r, 0, 0, 0) for r in range(world)]
            s.row_rank = np.repeat(np.arange(world), G)
            s.keys_lock = threading.Lock()
            s.warned_lookup = False
            st = SCH._Req(None)
            st.hashes.extend(np.frombuffer(os.urandom(n_pos * 32), dtype=np.uint8).reshape(n_pos, 32))
            # which (rank, group, position) the pools hold: a prefix, then holes
            cut = rng.choice((0, 1, P - 1, P, P + 1, n_pos))
            held = np.array([[[pos < cut or rng.random() < 0.5 for pos in range(n_pos)]
                              for _g in groups] for _r in range(world)], dtype=bool)
            present_keys = set()
            for r in range(world):
                for gi in range(G):
                    k = umbp.derive_keys(ns, rank=s.rank_ids[r], group=gi, hashes=st.hashes.a)
                    present_keys.update(bytes(k[pos]) for pos in range(n_pos) if held[r, gi, pos])

            class Backend:
                @staticmethod
                def query(rows, row_rank):
                    return np.array([[bytes(x) in present_keys for x in row] for row in rows]), 0

            derived = []

            class Counting:
                KEY_SIZE = umbp.KEY_SIZE

                @staticmethod
                def derive_keys(*a, **kw):
                    derived.append(len(kw["hashes"]))
                    return umbp.derive_keys(*a, **kw)

            s.umbp, s.ns, s.backend = Counting, ns, Backend
            k, failed, nq = s._match(st, local_k, kmax)
            ok = held[:, :, local_k:kmax].all(axis=0)
            assert (k, failed, nq) == (s._best_k(ok, local_k, kmax), False, 0), (held, local_k, kmax)
            full_miss_in_probe = any(not ok[gi, :P].all() for gi in s.full_gis)
            if kmax - local_k > 2 * P and full_miss_in_probe:
                assert sum(derived) == P * world * G  # nothing past the probe
            else:
                assert sum(derived) == (kmax - local_k) * world * G
