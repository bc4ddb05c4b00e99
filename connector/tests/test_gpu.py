"""The binding on a real GPU (skipped without CUDA): torch.cuda tensors in
FlashAttention, HND-permuted and cross-layer layouts, stores that wait for a
torch.cuda.Event recorded after the writes, poisoned destinations, loads
that wait for the poisoning's event, and bytes compared exactly."""
import numpy as np
import pytest

import umbp

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif("cuda" not in umbp.gpu_backends_built(),
                       reason="libumbp was built without the CUDA backend"),
]

NB, BS, H, D, L = 64, 16, 8, 128, 4
POISON = 0xA5


def _raw(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda", generator=g)


def _layouts():
    fa = [_raw((2, NB, BS, H, 2 * D), l) for l in range(L)]
    hnd = [_raw((2, NB, H, BS, 2 * D), 10 + l) for l in range(L)]
    cross = _raw((NB, L, 2, BS, H, 2 * D), 20)
    return {
        "flash_attn": ({"l%d" % l: r.view(torch.bfloat16) for l, r in enumerate(fa)}, fa,
                       lambda r, b: r[:, b]),
        "hnd": ({"l%d" % l: r.view(torch.bfloat16).permute(0, 1, 3, 2, 4) for l, r in enumerate(hnd)},
                hnd, lambda r, b: r[:, b]),
        "cross_layer": (cross.view(torch.bfloat16), [cross], lambda r, b: r[b]),
    }


@pytest.mark.parametrize("name", ["flash_attn", "hnd", "cross_layer"])
def test_cuda_store_load_with_events(name):
    with umbp.Runtime({"capacity_bytes": "256MiB", "gpu_backend": "cuda"}) as rt:
        tensors, raws, blk = _layouts()[name]
        kv = rt.register_kv_caches(tensors)
        assert kv.object_size == L * 2 * BS * H * D * 2
        src = list(range(0, 40, 2))
        dst = list(range(1, 41, 2))
        keys = np.random.default_rng(1).integers(0, 256, (len(src), 32), dtype=np.uint8)
        for r in raws:  # the "compute stream" writes the blocks, then records
            r.add_(1)
        ev = torch.cuda.Event()
        ev.record()
        job = rt.store_blocks(kv, keys, src, wait_event=ev)
        assert job.wait(30000) and job.ok.all(), job.statuses
        orig = [[blk(r, b).clone() for b in src] for r in raws]
        for r in raws:
            r.fill_(POISON)
        ev2 = torch.cuda.Event()
        ev2.record()
        job = rt.load_blocks(kv, keys, torch.tensor(dst), wait_event=ev2)
        assert job.wait(30000) and job.ok.all(), job.statuses
        torch.cuda.synchronize()
        for li, r in enumerate(raws):
            for i, b in enumerate(dst):
                assert torch.equal(blk(r, b), orig[li][i]), (name, li, b)
            assert bool((blk(r, 0) == POISON).all())
        job.release()
        rt.deregister(kv)


def test_event_handle_of_a_real_event():
    ev = torch.cuda.Event()
    ev.record()
    h = umbp.runtime.event_handle(ev)
    assert isinstance(h, int) and h == ev.cuda_event and h != 0
