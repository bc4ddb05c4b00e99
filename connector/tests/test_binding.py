"""The binding end to end on the host GPU backend (device memory is host
memory, so CPU torch tensors stand in for GPU KV caches): runtime options,
KV store/load in every layout with poisoned destinations and exact bytes,
per-key statuses, host put/get, lookups, events and stats."""
import errno
import signal
import time

import numpy as np
import pytest

import umbp
from conftest import host_options, stop_process

torch = pytest.importorskip("torch")

POISON = 0xA5
NB, BS, H, D = 12, 4, 2, 8  # blocks, tokens per block, heads, head size


# ---- runtime ----------------------------------------------------------------

def test_create_close_idempotent_and_context_manager():
    r = umbp.Runtime(host_options())
    assert not r.closed
    r.close()
    r.close()
    assert r.closed
    with pytest.raises(umbp.UmbpError) as ei:
        r.stats()
    assert ei.value.code == -errno.EBADF
    with umbp.Runtime(host_options()) as r2:
        assert r2.stats()["capacity_bytes"] == 64 << 20
    assert r2.closed
    umbp.Runtime('{"capacity_bytes": "8MiB"}').close()  # a JSON string works too


@pytest.mark.parametrize("opts, name", [
    ({"capacity": "1GiB"}, "capacity"),
    ({"capacity_bytes": "1GiB", "total_capacity_bytes": "2GiB"}, "total_capacity_bytes"),
    ({"dram_high_watermark": 1.5}, "dram_high_watermark"),
    ({"mode": "bogus"}, "mode"),
    ({"log_level": "loud"}, "log_level"),
    ({"timeout_ms": 0}, "timeout_ms"),
    ({"gpu_backend": "tpu"}, "gpu_backend"),
    ({"enable_events": "yes please"}, "enable_events"),
    ({"rank": 3, "world_size": 2}, "rank"),
])
def test_bad_options_raise_naming_the_option(opts, name):
    with pytest.raises(umbp.UmbpError) as ei:
        umbp.Runtime(opts)
    assert name in str(ei.value), str(ei.value)
    assert ei.value.code < 0


def test_stats_has_every_field(rt):
    s = rt.stats()
    assert set(s) == set(umbp._ffi.STATS_FIELDS)
    assert s["capacity_bytes"] == 64 << 20 and s["num_objects"] == 0
    assert all(isinstance(v, int) for v in s.values())


# ---- KV caches -----------------------------------------------------------------
#
# Every cache is built from uint8 storage ("raw") viewed as bf16, so bytes
# are compared exactly (random bf16 bit patterns include NaNs).  blk(raw, b)
# is block b of the cache, in every layer.

def _rand(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)


def make_flash_attn(L):
    raws = [_rand((2, NB, BS, H, 2 * D), l) for l in range(L)]
    tensors = {"model.layers.%d.attn" % l: r.view(torch.bfloat16) for l, r in enumerate(raws)}
    return tensors, raws, lambda r, b: r[:, b]


def make_flashinfer(L):
    raws = [_rand((NB, 2, BS, H, 2 * D), 10 + l) for l in range(L)]
    return [r.view(torch.bfloat16) for r in raws], raws, lambda r, b: r[b]


def make_hnd(L):
    # memory (2, nb, H, bs, D) seen as (2, nb, bs, H, D): vLLM's HND view
    raws = [_rand((2, NB, H, BS, 2 * D), 20 + l) for l in range(L)]
    tensors = {"l%d" % l: r.view(torch.bfloat16).permute(0, 1, 3, 2, 4) for l, r in enumerate(raws)}
    assert not next(iter(tensors.values())).is_contiguous()
    return tensors, raws, lambda r, b: r[:, b]


def make_mla(L):
    raws = [_rand((NB, BS, 2 * 72), 30 + l) for l in range(L)]
    return {"l%d" % l: r.view(torch.bfloat16) for l, r in enumerate(raws)}, raws, lambda r, b: r[b]


def make_cross_layer(L):
    raw = _rand((NB, L, 2, BS, H, 2 * D), 40)
    return raw.view(torch.bfloat16), [raw], lambda r, b: r[b]


def make_padded_flashinfer(L):
    # blocks padded apart: the stride of block_dim is larger than a block
    blk_bytes = 2 * BS * H * D * 2
    raws = [_rand((NB, blk_bytes + 64), 50 + l) for l in range(L)]
    ts = [r.view(torch.bfloat16).as_strided((NB, 2, BS, H, D),
                                            ((blk_bytes + 64) // 2, BS * H * D, H * D, D, 1))
          for r in raws]
    return ts, raws, lambda r, b: r[b, :blk_bytes]


LAYOUTS = {
    "flash_attn": (make_flash_attn, 1 * 2 * BS * H * D * 2),
    "flashinfer": (make_flashinfer, 1 * 2 * BS * H * D * 2),
    "hnd": (make_hnd, 1 * 2 * BS * H * D * 2),
    "mla": (make_mla, 1 * BS * 72 * 2),
    "cross_layer": (make_cross_layer, 1 * 2 * BS * H * D * 2),
    "padded": (make_padded_flashinfer, 1 * 2 * BS * H * D * 2),
}


def _keys(n, seed):
    return np.random.default_rng(seed).integers(0, 256, (n, 32), dtype=np.uint8)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_store_then_load_restores_exact_bytes(rt, name):
    L = 3
    make, per_layer_object = LAYOUTS[name]
    tensors, raws, blk = make(L)
    kv = rt.register_kv_caches(tensors)
    assert kv.num_blocks == NB and kv.num_layers == L
    assert kv.object_size == L * per_layer_object
    assert kv.layout == {"hnd": "flash_attn", "padded": "flashinfer"}.get(name, name)
    src_blocks = np.array([1, 4, 5, 9, 11])
    keys = _keys(len(src_blocks), 7)
    orig = [[blk(r, b).clone() for b in src_blocks] for r in raws]
    with rt.store_blocks(kv, keys, src_blocks) as job:
        assert job.wait(10000)
        assert job.statuses.tolist() == [0] * len(src_blocks) and job.num_ok == len(src_blocks)
    for r in raws:
        r.fill_(POISON)
    dst_blocks = torch.tensor([0, 2, 3, 7, 10])  # a torch tensor of ids works too
    with rt.load_blocks(kv, keys, dst_blocks) as job:
        assert job.wait(10000)
        assert job.ok.all()
    for li, r in enumerate(raws):
        for i, b in enumerate(dst_blocks.tolist()):
            assert torch.equal(blk(r, b), orig[li][i]), (name, li, b)
        for b in set(range(NB)) - set(dst_blocks.tolist()):
            assert bool((blk(r, b) == POISON).all()), (name, li, b)
        if name == "padded":  # the padding between blocks is never written
            assert bool((r[:, -64:] == POISON).all())


def test_layer_subset_load(rt):
    L = 4
    tensors, raws, blk = make_flash_attn(L)
    kv = rt.register_kv_caches(tensors)
    keys = _keys(3, 8)
    orig = [[blk(r, b).clone() for b in range(3)] for r in raws]
    job = rt.store_blocks(kv, keys, [0, 1, 2])
    assert job.wait(10000) and job.ok.all()
    for r in raws:
        r.fill_(POISON)
    job = rt.load_blocks(kv, keys, [0, 1, 2], first_layer=1, num_layers=2)
    assert job.wait(10000) and job.ok.all()
    for li, r in enumerate(raws):
        for b in range(3):
            if li in (1, 2):
                assert torch.equal(blk(r, b), orig[li][b])
            else:
                assert bool((blk(r, b) == POISON).all())


def test_statuses_of_misses_and_whole_batch_errors(rt):
    tensors, raws, blk = make_flashinfer(2)
    kv = rt.register_kv_caches(tensors)
    keys = _keys(6, 9)
    assert rt.store_blocks(kv, keys[:3], [0, 1, 2]).wait(10000)
    job = rt.load_blocks(kv, keys, [3, 4, 5, 6, 7, 8])
    assert job.wait(10000)
    assert job.statuses.tolist() == [0, 0, 0, -errno.ENOENT, -errno.ENOENT, -errno.ENOENT]
    assert job.ok.tolist() == [True] * 3 + [False] * 3 and job.num_ok == 3
    dup = np.concatenate([keys[:2], keys[:1]])
    with pytest.raises(umbp.UmbpError) as ei:
        rt.store_blocks(kv, dup, [0, 1, 2])
    assert ei.value.code == umbp.E_DUPLICATE_KEY
    with pytest.raises(umbp.UmbpError) as ei:
        rt.load_blocks(kv, dup, [0, 1, 2])
    assert ei.value.code == umbp.E_DUPLICATE_KEY
    with pytest.raises(umbp.UmbpError) as ei:
        rt.store_blocks(kv, keys[:1], [NB])
    assert ei.value.code in (umbp.E_SHAPE, umbp.E_KV_RANGE)
    with pytest.raises(umbp.UmbpError, match="negative"):
        rt.store_blocks(kv, keys[:1], [-1])
    with pytest.raises(umbp.UmbpError, match="2 entries"):
        rt.store_blocks(kv, keys[:2], [0])
    empty = rt.store_blocks(kv, keys[:0], [])
    assert empty.done and len(empty.statuses) == 0
    rt.deregister(kv)
    with pytest.raises(umbp.UmbpError) as ei:
        rt.store_blocks(kv, keys[:1], [0])
    assert ei.value.code == -errno.ENOENT


def test_registration_warms_the_submit_path_and_submits_nothing(rt, monkeypatch):
    """The first register_kv_caches runs store_blocks' and load_blocks' Python
    with batches of no blocks, which C refuses before doing anything, and
    warm-up loads that copy and count nothing: no put or get counted, no
    transfer; a later registration does not run it."""
    calls = []
    real = umbp.Runtime._warm_submit
    monkeypatch.setattr(umbp.Runtime, "_warm_submit",
                        lambda self, kv: (calls.append(kv), real(self, kv))[1])
    before = rt.stats()
    kv, raws = _split_cache(rt, 16)
    after = rt.stats()
    assert calls == [kv]
    for k in ("num_objects", "num_pending", "puts_ok", "puts_failed", "gets_ok", "gets_miss",
              "gets_failed", "kv_transfers", "mailbox_full"):
        assert after[k] == before[k], (k, before[k], after[k])
    kv2, _ = _split_cache(rt, 16)
    assert calls == [kv]
    keys = _keys(3, 33)
    with rt.store_blocks(kv2, keys, [0, 1, 2]) as job:
        assert job.wait(10000) and job.num_ok == 3


def test_registration_runs_a_split_batch_through_warm_loads(rt, monkeypatch):
    """With 256 blocks or more, the warm-up is a whole batch as an engine
    submits it: 8 heads (split into two ops: a head of kv_head_blocks, 32,
    then 224 blocks), twice, through
    umbp_kv_warm_load, of random keys; the cache's bytes are untouched and
    nothing is counted."""
    seen = []
    real = umbp.runtime._kv_warm_load
    monkeypatch.setattr(umbp.runtime, "_kv_warm_load",
                        lambda p, h, blocks, n, opts, op: (seen.append(n),
                                                           real(p, h, blocks, n, opts, op))[1])
    before = rt.stats()
    kv, raws = _split_cache(rt, 300)
    orig = [r.clone() for r in raws]
    after = rt.stats()
    assert seen == [32, 224, 32, 224], seen
    for k in ("num_objects", "num_leased", "gets_ok", "gets_miss", "gets_failed",
              "kv_transfers", "bytes_read"):
        assert after[k] == before[k], (k, before[k], after[k])
    for r, o in zip(raws, orig):
        assert torch.equal(r, o)
    # a real store and restore of the same cache afterwards
    keys = _keys(3, 35)
    assert rt.store_blocks(kv, keys, [0, 1, 2]).wait(10000)
    for r in raws:
        r[:, 3:6].fill_(POISON)
    job = rt.load_blocks(kv, keys, [3, 4, 5])
    assert job.wait(10000) and job.num_ok == 3
    for r, o in zip(raws, orig):
        assert torch.equal(r[:, 3:6], o[:, 0:3])


def test_store_and_load_prewake_the_loop_before_building_the_batch(rt, monkeypatch):
    """store_blocks / load_blocks call umbp_prewake before they convert
    anything (the loop thread's wake-up overlaps the conversions), then
    submit the batch."""
    kv, raws = _split_cache(rt, 8)
    order = []
    real_prewake, real_keys = umbp.runtime._prewake, umbp.runtime.keys_array
    monkeypatch.setattr(umbp.runtime, "_prewake",
                        lambda p: (order.append("prewake"), real_prewake(p))[1])
    monkeypatch.setattr(umbp.runtime, "keys_array",
                        lambda k: (order.append("keys"), real_keys(k))[1])
    keys = _keys(2, 77)
    with rt.store_blocks(kv, keys, [0, 1]) as job:
        assert job.wait(10000) and job.num_ok == 2
    with rt.load_blocks(kv, keys, [2, 3]) as job:
        assert job.wait(10000) and job.num_ok == 2
    assert order == ["prewake", "keys"] * 2


@pytest.mark.parametrize("poll_wait, expect", [("on", 1), ("off", 0)])
def test_prewake_sets_the_loop_polling_where_it_may(poll_wait, expect):
    """Runtime.prewake() (umbp_prewake): the loop thread counts it where
    poll_wait is on; where it is off nothing is sent at all."""
    with umbp.Runtime(host_options(poll_wait=poll_wait)) as r:
        assert r.stats()["prewakes"] == 0
        r.prewake()
        end = time.monotonic() + 10
        while r.stats()["prewakes"] < expect and time.monotonic() < end:
            time.sleep(0.001)
        assert r.stats()["prewakes"] == expect


# ---- a large batch goes out as a head, then the rest (kv_head_blocks) ------

def _split_cache(rt, nb):
    L = 2
    raws = [torch.from_numpy(np.random.default_rng(60 + l).integers(
        0, 256, (2, nb, BS * H * D * 2), dtype=np.uint8)) for l in range(L)]
    ts = [r.view(torch.bfloat16).view(2, nb, BS, H, D) for r in raws]
    return rt.register_kv_caches(ts, layout="flash_attn"), raws


def test_a_split_batch_is_one_job_with_its_statuses_in_order(rt):
    """kv_head_blocks 4: a batch of 40 blocks is a head of 4 and a tail of
    36.  Misses in the head and in the tail land at their own positions,
    every restored byte is exact, the blocks not asked for stay poisoned."""
    rt.kv_head_blocks = 4
    n, nb = 40, 128
    kv, raws = _split_cache(rt, nb)
    keys = _keys(n, 31)
    src = list(range(n))
    stored = [i for i in range(n) if i not in (2, 17, 39)]  # one miss in the head, two in the tail
    job = rt.store_blocks(kv, keys[stored], [src[i] for i in stored])
    assert type(job).__name__ == "_SplitJob" and len(job) == len(stored)
    assert job.wait(10000) and job.num_ok == len(stored)
    job.release()
    orig = [r.clone() for r in raws]
    for r in raws:
        r[:, n:].fill_(POISON)
    dst = [n + 1 + 2 * i for i in range(n)]  # scattered destinations
    with rt.load_blocks(kv, keys, dst) as job:
        assert job.wait(10000)
        st = job.statuses.tolist()
    assert [i for i, x in enumerate(st) if x != 0] == [2, 17, 39]
    assert all(st[i] == -errno.ENOENT for i in (2, 17, 39))
    for li, r in enumerate(raws):
        for i, b in enumerate(dst):
            if i in stored:
                assert torch.equal(r[:, b], orig[li][:, i]), (li, i, b)
            else:
                assert bool((r[:, b] == POISON).all()), (li, i, b)
        for b in set(range(n, nb)) - set(dst):
            assert bool((r[:, b] == POISON).all()), (li, b)


def test_a_split_batch_refuses_what_one_op_refuses(rt):
    """A key repeated across the head and the tail, and a bad block id in the
    tail, are refused as for one op (the head may have run: it is waited for
    and released first); kv_head_blocks 0 submits one op."""
    rt.kv_head_blocks = 4
    kv, raws = _split_cache(rt, 96)
    keys = _keys(40, 32)
    dup = keys.copy()
    dup[30] = dup[1]
    with pytest.raises(umbp.UmbpError, match="key 30 repeats key 1") as ei:
        rt.store_blocks(kv, dup, list(range(40)))
    assert ei.value.code == umbp.E_DUPLICATE_KEY
    with pytest.raises(umbp.UmbpError) as ei:
        rt.load_blocks(kv, dup, list(range(40)))
    assert ei.value.code == umbp.E_DUPLICATE_KEY
    with pytest.raises(umbp.UmbpError, match="negative"):
        rt.store_blocks(kv, keys, list(range(39)) + [-1])
    with pytest.raises(umbp.UmbpError) as ei:
        rt.store_blocks(kv, keys, list(range(39)) + [96])
    assert ei.value.code in (umbp.E_SHAPE, umbp.E_KV_RANGE)
    with pytest.raises(umbp.UmbpError, match="40 entries"):
        rt.store_blocks(kv, keys, list(range(39)))
    st = rt.stats()  # the refused batches' heads ran and were released
    assert st["num_leased"] == 0 and st["num_pending"] == 0, st
    job = rt.store_blocks(kv, keys, np.arange(40))
    assert job.wait(10000) and job.ok.all()
    rt.kv_head_blocks = 0
    job = rt.load_blocks(kv, keys, np.arange(40, 80))
    assert type(job) is umbp.Job and job.wait(10000) and job.ok.all()
    for r in raws:
        assert torch.equal(r[:, 40:80], r[:, :40])


def test_a_split_batchs_head_covers_kv_head_bytes_up_to_a_quarter(rt):
    """The head is kv_head_blocks blocks, or more where kv_head_bytes of
    objects need more, never over a quarter of the batch; kv_head_bytes 0
    gives exactly kv_head_blocks.  A key of the rest whose first 8 bytes
    equal a head key's (the check's quick pass) is no repeat."""
    kv, raws = _split_cache(rt, 1200)
    osz = kv.object_size
    assert rt.kv_head_bytes == 0  # the default: a head of kv_head_blocks
    cases = [  # (kv_head_blocks, kv_head_bytes, batch) -> head
        ((4, 10 * osz, 40), 10),
        ((4, 10 * osz + 1, 80), 11),
        ((4, 10 * osz, 39), 9),       # a quarter of 39
        ((8, 2 * osz, 64), 8),        # kv_head_blocks is the least
        ((4, 0, 80), 4),
        ((32, 32 << 20, 1000), 250),  # 32 MiB of small objects: a quarter
    ]
    for i, ((hb, hbytes, n), want) in enumerate(cases):
        rt.kv_head_blocks, rt.kv_head_bytes = hb, hbytes
        keys = _keys(n, 200 + i)
        keys[n - 1, :8] = keys[0, :8]  # the same first word, another key
        job = rt.store_blocks(kv, keys, list(range(n)))
        assert [len(j) for j in job._parts] == [want, n - want], (hb, hbytes, n)
        assert job.wait(10000) and job.num_ok == n
        job.release()
        dup = keys.copy()
        dup[n - 2] = dup[want - 1]  # the head's last key, repeated in the rest
        with pytest.raises(umbp.UmbpError, match="key %d repeats key %d" % (n - 2, want - 1)) as ei:
            rt.load_blocks(kv, dup, list(range(n)))
        assert ei.value.code == umbp.E_DUPLICATE_KEY
    st = rt.stats()
    assert st["num_leased"] == 0 and st["num_pending"] == 0, st


def test_block_arrays_are_made_ready_at_registration_and_reused(rt, monkeypatch):
    """Registration makes two block arrays ready (min(blocks, 4096) entries,
    pages written); a batch fills one and gives it back once C read it, a
    larger batch makes a larger one; at most four are kept."""
    kv, raws = _split_cache(rt, 300)
    bufs = rt._bufs
    assert [b.shape[0] for b in bufs] == [300, 300]
    ready = {b.ctypes.data for b in bufs}
    seen = []
    real = umbp.runtime._kv_store
    monkeypatch.setattr(umbp.runtime, "_kv_store", lambda p, h, blocks, n, o, op: (
        seen.append(blocks), real(p, h, blocks, n, o, op))[1])
    rt.kv_head_blocks = 0
    for i in range(3):
        job = rt.store_blocks(kv, _keys(250, 40 + i), list(range(250)))
        assert job.wait(10000) and job.num_ok == 250
        job.release()
    assert set(seen) <= ready, "a batch that fits took a new array"
    assert len(rt._bufs) == 2
    kv2, _ = _split_cache(rt, 1200)
    job = rt.store_blocks(kv2, _keys(1000, 44), list(range(1000)))
    assert job.wait(10000) and job.num_ok == 1000
    job.release()
    assert seen[-1] not in ready and sorted(b.shape[0] for b in rt._bufs) == [300, 1000]
    for b in list(rt._bufs):
        rt._bufs.append(b)
    rt._bufs.append(b)
    job = rt.store_blocks(kv, _keys(8, 45), list(range(8)))
    assert job.wait(10000) and len(rt._bufs) == 4  # 5: one taken, not given back to 4
    job.release()


def test_threads_submitting_at_once_never_share_a_block_array(rt):
    """Four threads store and restore their own keys and blocks at once,
    each batch split (a head, then the rest): every restored byte is the
    thread's own, the blocks not asked for stay poisoned.  A block array
    shared between two threads' fills would mix their keys or blocks."""
    import threading
    rt.kv_head_blocks = 4
    nthreads, n, rounds = 4, 40, 25
    kv, raws = _split_cache(rt, 2 * nthreads * n)
    orig = [r.clone() for r in raws]
    errors = []

    def work(t):
        try:
            src = list(range(t * n, (t + 1) * n))
            dst = list(range((nthreads + t) * n, (nthreads + t + 1) * n))
            for i in range(rounds):
                keys = _keys(n, 1000 * t + i)
                with rt.store_blocks(kv, keys, src) as job:
                    assert job.wait(10000) and job.num_ok == n, job.statuses
                for r in raws:
                    r[:, dst].fill_(POISON)
                with rt.load_blocks(kv, keys, dst) as job:
                    assert job.wait(10000) and job.num_ok == n, job.statuses
                for li, r in enumerate(raws):
                    assert torch.equal(r[:, dst], orig[li][:, src]), (t, i, li)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((t, repr(e)))

    ts = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for x in ts:
        x.start()
    for x in ts:
        x.join(120)
    assert not any(x.is_alive() for x in ts), "a thread hung"
    assert not errors, errors


@pytest.mark.parametrize("bad", [-1, 2.5, "1", None, False])
def test_kv_head_bytes_refuses_what_is_not_a_count(rt, bad):
    assert rt.kv_head_bytes == 0  # the default
    rt.kv_head_bytes = np.uint32(1 << 20)
    assert rt.kv_head_bytes == 1 << 20 and type(rt.kv_head_bytes) is int
    with pytest.raises(umbp.UmbpError, match="kv_head_bytes must be an integer >= 0") as ei:
        rt.kv_head_bytes = bad
    assert ei.value.code == -errno.EINVAL
    assert rt.kv_head_bytes == 1 << 20  # unchanged


def test_registration_beside_a_stopped_server(server):
    """The server stopped (SIGSTOP) while an engine registers: the C warm-up
    store and the binding's warm-up loads each give up within a second, so
    registration returns (bounded here at 30 s, the time printed), and once
    the server runs again the cache stores and restores byte-exact."""
    r = umbp.Runtime({"mode": "standalone", "socket_dir": server[1], "gpu_backend": "host",
                      "timeout_ms": 10000})
    try:
        stop_process(server[0])
        t0 = time.monotonic()
        try:
            kv, raws = _split_cache(r, 300)
        finally:
            server[0].send_signal(signal.SIGCONT)
        took = time.monotonic() - t0
        print("registration beside a stopped server: %.2f s" % took)
        assert took < 30
        keys = _keys(3, 36)
        ok = False
        for _ in range(100):  # until the session is healthy again
            job = r.store_blocks(kv, keys, [0, 1, 2])
            ok = job.wait(20000) and job.num_ok == 3
            job.release()
            if ok:
                break
            time.sleep(0.05)
        assert ok
        orig = [x.clone() for x in raws]
        for x in raws:
            x[:, 3:6].fill_(POISON)
        with r.load_blocks(kv, keys, [3, 4, 5]) as job:
            assert job.wait(20000) and job.num_ok == 3
        for x, o in zip(raws, orig):
            assert torch.equal(x[:, 3:6], o[:, 0:3])
    finally:
        r.close()


def test_a_split_batch_through_a_real_server(server):
    """Standalone: the head and the rest of a 300-block batch (the rest
    split again by the runtime's own head rule) store into a real
    umbp-server and restore byte-exact into poisoned blocks; misses land at
    their own positions."""
    r = umbp.Runtime({"mode": "standalone", "socket_dir": server[1], "gpu_backend": "host",
                      "timeout_ms": 10000})
    try:
        assert r.kv_head_blocks == 32
        n, nb = 300, 640
        kv, raws = _split_cache(r, nb)
        keys = _keys(n, 34)
        skip = {5, 150, 299}
        stored = [i for i in range(n) if i not in skip]
        job = r.store_blocks(kv, keys[stored], stored)
        assert type(job).__name__ == "_SplitJob"
        assert job.wait(20000) and job.num_ok == len(stored), job.statuses
        job.release()
        orig = [x.clone() for x in raws]
        for x in raws:
            x[:, n:].fill_(POISON)
        dst = list(range(nb - 1, nb - 1 - n, -1))  # descending, all above n
        with r.load_blocks(kv, keys, dst) as job:
            assert job.wait(20000)
            st = job.statuses.tolist()
        assert {i for i, x in enumerate(st) if x != 0} == skip, st
        for li, x in enumerate(raws):
            for i, b in enumerate(dst):
                if i in skip:
                    assert bool((x[:, b] == POISON).all()), (li, i, b)
                else:
                    assert torch.equal(x[:, b], orig[li][:, i]), (li, i, b)
    finally:
        r.close()


@pytest.mark.parametrize("bad", [-1, 2.5, "32", None, True])
def test_kv_head_blocks_refuses_what_is_not_a_count(rt, bad):
    with pytest.raises(umbp.UmbpError, match="kv_head_blocks must be an integer >= 0") as ei:
        rt.kv_head_blocks = bad
    assert ei.value.code == -errno.EINVAL
    assert rt.kv_head_blocks == 32  # unchanged
    rt.kv_head_blocks = np.int64(8)
    assert rt.kv_head_blocks == 8 and type(rt.kv_head_blocks) is int


def test_a_split_batch_across_a_stopped_then_killed_server(server):
    """Standalone, 300 blocks: the server stopped (SIGSTOP) under a split
    load, then killed (-9) under another.  Each load ends within its bound
    (a wait that outlives it fails the test); a block reported loaded holds
    exactly its stored bytes, every other block stays poisoned."""
    import signal as sig

    proc, sock = server
    r = umbp.Runtime({"mode": "standalone", "socket_dir": sock, "gpu_backend": "host",
                      "timeout_ms": 1500, "lookup_timeout_ms": 500})
    try:
        n, nb = 300, 640
        kv, raws = _split_cache(r, nb)
        keys = _keys(n, 35)
        with r.store_blocks(kv, keys, list(range(n))) as job:
            assert job.wait(20000) and job.num_ok == n
        orig = [x.clone() for x in raws]
        dst = list(range(nb - 1, nb - 1 - n, -1))

        def load_and_check(what):
            for x in raws:
                x[:, n:].fill_(POISON)
            with r.load_blocks(kv, keys, dst) as job:
                # the runtime ends every op by timeout_ms (both parts run at once)
                assert job.wait(15000), what + ": the load did not end within its bound"
                st = job.statuses.tolist()
            for li, x in enumerate(raws):
                for i, b in enumerate(dst):
                    if st[i] == 0:
                        assert torch.equal(x[:, b], orig[li][:, i]), (what, li, i, b)
                    else:
                        assert bool((x[:, b] == POISON).all()), (what, li, i, b, st[i])
            return st

        stop_process(proc)
        try:
            st = load_and_check("server stopped")
        finally:
            proc.send_signal(sig.SIGCONT)
        assert any(x != 0 for x in st), "every block loaded from a stopped server"
        proc.send_signal(sig.SIGKILL)
        proc.wait(10)
        st = load_and_check("server killed")
        assert all(x != 0 for x in st), "a block loaded from a killed server"
    finally:
        r.close()


def test_a_split_job_released_early_or_waited_with_a_bound(rt):
    rt.kv_head_blocks = 4
    kv, raws = _split_cache(rt, 96)
    keys = _keys(40, 33)
    job = rt.store_blocks(kv, keys, list(range(40)))
    assert job.wait(0) in (True, False)  # a zero bound never blocks
    assert job.wait(10000) and job.done and job.num_ok == 40
    job.release()
    job.release()  # idempotent
    job = rt.load_blocks(kv, keys, list(range(40, 80)))
    job.release()  # in flight: its parts are released
    with pytest.raises(umbp.UmbpError) as ei:
        job.wait(10000)
    assert ei.value.code == -errno.EBADF
    assert "released" in repr(job)


def test_keys_in_every_accepted_form(rt):
    tensors, raws, blk = make_mla(1)
    kv = rt.register_kv_caches(tensors)
    keys = _keys(3, 10)
    as_bytes = keys.tobytes()
    as_list = [k.tobytes() for k in keys]
    assert rt.store_blocks(kv, as_bytes, np.array([0, 1, 2], dtype=np.int32)).wait(10000)
    assert rt.lookup(as_list)[0] == 3
    assert rt.lookup(keys.ravel())[0] == 3
    assert rt.exists(keys[::-1]).all()  # a non-contiguous view is copied
    with pytest.raises(umbp.UmbpError):
        rt.lookup(b"x" * 33)
    with pytest.raises(TypeError):
        rt.lookup(keys.astype(np.int16))


def test_wait_event_forms_on_the_host_backend(rt):
    class FakeCudaEvent:  # torch.cuda.Event exposes the cudaEvent_t as .cuda_event
        cuda_event = 0x1234

    class FakeTorchEvent:  # torch.Event (2.x) exposes it as .event_id
        event_id = 0x5678

    assert umbp.runtime.event_handle(None) is None
    assert umbp.runtime.event_handle(0) is None
    assert umbp.runtime.event_handle(0x42) == 0x42
    assert umbp.runtime.event_handle(FakeCudaEvent()) == 0x1234
    assert umbp.runtime.event_handle(FakeTorchEvent()) == 0x5678
    with pytest.raises(TypeError):
        umbp.runtime.event_handle("event")
    tensors, raws, blk = make_flash_attn(1)
    kv = rt.register_kv_caches(tensors)
    keys = _keys(2, 11)
    # the host backend ignores the event (there is no device to wait on)
    assert rt.store_blocks(kv, keys, [0, 1], wait_event=FakeCudaEvent()).wait(10000)
    assert rt.load_blocks(kv, keys, [2, 3], wait_event=0x1234).wait(10000)
    assert torch.equal(raws[0][:, 2], raws[0][:, 0])


def test_layout_inference_and_its_errors(rt):
    # (2, 2, ...) fits flash_attn and flashinfer: refused unless told
    t = torch.zeros((2, 2, BS, H, D), dtype=torch.bfloat16)
    with pytest.raises(umbp.UmbpError, match="num_blocks= or layout="):
        rt.register_kv_caches([t])
    assert rt.register_kv_caches([t], layout="flashinfer").layout == "flashinfer"
    t = torch.zeros((2, NB, BS, H, D), dtype=torch.bfloat16)
    with pytest.raises(umbp.UmbpError, match="num_blocks"):
        rt.register_kv_caches([t], num_blocks=NB + 1)
    assert rt.register_kv_caches([t], num_blocks=NB).layout == "flash_attn"
    with pytest.raises(umbp.UmbpError, match="4-dim"):
        rt.register_kv_caches([torch.zeros((NB, BS, H, D))])
    with pytest.raises(umbp.UmbpError, match="expects 5 dims"):
        rt.register_kv_caches([torch.zeros((NB, BS, D))], layout="flash_attn")
    with pytest.raises(umbp.UmbpError, match="unknown layout"):
        rt.register_kv_caches([t], layout="paged")
    with pytest.raises(umbp.UmbpError, match="only one"):
        rt.register_kv_caches([torch.zeros((NB, 2, 2, BS, H, D))] * 2, layout="cross_layer")
    with pytest.raises(umbp.UmbpError, match="share one"):
        rt.register_kv_caches([t, torch.zeros((NB, BS, D))])
    with pytest.raises(TypeError):
        rt.register_kv_caches({"l0": np.zeros((2, NB, BS, H, D))})
    # the library's own shape errors come back naming the tensor
    with pytest.raises(umbp.UmbpError) as ei:
        rt.register_kv_caches([t, torch.zeros((2, NB + 1, BS, H, D), dtype=torch.bfloat16)])
    assert ei.value.code == umbp.E_KV_MISMATCH
    # explicit roles: a cross-layer MLA cache (nb, L, bs, D)
    kv = rt.register_kv_caches(torch.zeros((NB, 3, BS, 72), dtype=torch.bfloat16),
                               layout={"block_dim": 0, "layer_dim": 1})
    assert kv.num_layers == 3 and kv.object_size == 3 * BS * 72 * 2
    assert kv.tensors[0].shape == (NB, 3, BS, 72)


# ---- host objects --------------------------------------------------------------

def test_put_get_ranges_round_trip(rt):
    n, k, part = 8, 4, 1000
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, (k, n, part), dtype=np.uint8)  # range j of key i: src[j, i]
    keys = _keys(n, 12)
    base = src.ctypes.data
    ptrs = base + (np.arange(k)[None, :] * n * part + np.arange(n)[:, None] * part).astype(np.uint64)
    job = rt.put_ranges(keys, k * part, ptrs, np.full((n, k), part))
    assert job.wait(10000) and job.ok.all()
    whole = np.full((n, k * part), POISON, dtype=np.uint8)
    job = rt.get(keys, whole.ctypes.data + np.arange(n, dtype=np.uint64) * (k * part), k * part)
    assert job.wait(10000) and job.ok.all()
    assert np.array_equal(whole, src.transpose(1, 0, 2).reshape(n, k * part))
    # two disjoint ranges of every object, read out of order
    dst = np.full((n, 2, 100), POISON, dtype=np.uint8)
    ptrs = dst.ctypes.data + np.arange(n * 2, dtype=np.uint64).reshape(n, 2) * 100
    offs = np.tile(np.array([3500, 10], dtype=np.uint64), (n, 1))
    job = rt.get_ranges(keys, ptrs, np.full((n, 2), 100), offs)
    assert job.wait(10000) and job.ok.all()
    assert np.array_equal(dst[:, 0], whole[:, 3500:3600])
    assert np.array_equal(dst[:, 1], whole[:, 10:110])


def test_put_get_errors_and_misses(rt):
    buf = np.zeros(4096, dtype=np.uint8)
    keys = _keys(3, 13)
    with pytest.raises(umbp.UmbpError) as ei:
        rt.put(np.concatenate([keys[:1], keys[:1]]), [buf.ctypes.data] * 2, 64)
    assert ei.value.code == umbp.E_DUPLICATE_KEY
    with pytest.raises(umbp.UmbpError) as ei:  # ranges that do not tile the object
        rt.put_ranges(keys[:1], 100, [[buf.ctypes.data]], [[50]])
    assert ei.value.code == umbp.E_SHAPE
    assert rt.put(keys[:1], [buf.ctypes.data], 64).wait(10000)
    job = rt.get(keys, buf.ctypes.data + np.arange(3, dtype=np.uint64) * 1024, 64)
    assert job.wait(10000)
    assert job.statuses.tolist() == [0, -errno.ENOENT, -errno.ENOENT]
    job = rt.get(keys[:1], [buf.ctypes.data], 128)  # past the end of the object
    assert job.wait(10000) and job.statuses[0] == umbp.E_SHAPE


# ---- lookups, events, lifetime --------------------------------------------------

def test_lookup_prefix_and_present(rt):
    buf = np.zeros(64 * 10, dtype=np.uint8)
    keys = _keys(10, 14)
    stored = [0, 1, 2, 4, 5]
    assert rt.put(keys[stored], buf.ctypes.data + np.array(stored, dtype=np.uint64) * 64,
                  64).wait(10000)
    prefix, present = rt.lookup(keys)
    assert prefix == 3 and rt.last_lookup_rc == 0
    assert present.dtype == np.bool_ and present.tolist() == [i in stored for i in range(10)]
    assert rt.lookup(keys[3:])[0] == 0
    assert rt.lookup(keys[:0]) [0] == 0
    assert rt.exists(keys[[4, 3]]).tolist() == [True, False]
    assert rt.lookup(keys, touch=True)[0] == 3
    s = rt.stats()
    assert s["lookups"] >= 4 and s["num_objects"] == 5


def test_events_after_store_and_clear(rt):
    tensors, raws, blk = make_flash_attn(1)
    kv = rt.register_kv_caches(tensors)
    keys = _keys(4, 15)
    assert rt.store_blocks(kv, keys, [0, 1, 2, 3]).wait(10000)
    types, ekeys = rt.drain_events()
    assert types.tolist() == [umbp.EVENT_STORED] * 4 and rt.events_lost == 0
    assert ekeys.shape == (4, 32) and ekeys.dtype == np.uint8
    assert {k.tobytes() for k in ekeys} == {k.tobytes() for k in keys}
    rt.clear()
    types, ekeys = rt.drain_events(max=2)
    assert types.tolist() == [umbp.EVENT_REMOVED] * 2
    types, _ = rt.drain_events()
    assert types.tolist() == [umbp.EVENT_REMOVED] * 2
    assert rt.lookup(keys)[0] == 0


def test_flush_and_stats_after_puts(rt):
    buf = np.random.default_rng(4).integers(0, 256, 4096, dtype=np.uint8)
    keys = _keys(4, 16)
    job = rt.put(keys, buf.ctypes.data + np.arange(4, dtype=np.uint64) * 1024, 1024)
    assert rt.flush(10000) is True
    assert job.done and job.num_ok == 4
    s = rt.stats()
    assert s["puts_ok"] == 4 and s["bytes_written"] == 4096 and s["num_objects"] == 4


def test_jobs_after_close_and_release():
    r = umbp.Runtime(host_options())
    buf = np.zeros(1024, dtype=np.uint8)
    job = r.put(_keys(1, 17), [buf.ctypes.data], 1024)
    done = r.put(_keys(1, 18), [buf.ctypes.data], 1024)
    assert done.wait(10000)
    r.close()
    job.release()  # its handle went with the runtime: nothing to release, no crash
    assert done.statuses.tolist() == [0]  # read before the close, kept
    fresh = umbp.Runtime(host_options())
    j = fresh.put(_keys(1, 19), [buf.ctypes.data], 1024)
    j.release()
    j.release()
    with pytest.raises(umbp.UmbpError):
        j.statuses
    fresh.close()


def test_kv_caches_belong_to_their_runtime_and_gc_closes(rt):
    import gc
    import weakref
    tensors, raws, blk = make_flash_attn(1)
    other = umbp.Runtime(host_options())
    kv = other.register_kv_caches(tensors)
    with pytest.raises(umbp.UmbpError) as ei:
        rt.store_blocks(kv, _keys(1, 20), [0])
    assert ei.value.code == -errno.ENOENT
    with pytest.raises(umbp.UmbpError):
        rt.deregister(kv)
    job = other.store_blocks(kv, _keys(1, 21), [0])  # never released by hand
    ref = weakref.ref(other)
    del other, job
    gc.collect()
    assert ref() is None  # collected (and closed) without an explicit close()
    assert kv.handle is None
