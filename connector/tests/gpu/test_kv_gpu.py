"""The GPU KV path through ``import umbp`` on a real CUDA device: what only a
GPU can show (transfers of both directions in flight at once, a store held
on the device by its wait_event).  Skipped where there is no CUDA device or
no torch (CI); on a GPU machine:

    UMBP_LIBRARY=build/libumbp.so python3 -m pytest -q connector/tests/gpu/test_kv_gpu.py

A store is held on the device, for as long as a test needs, by a stream that
waits for a word of pinned host memory to become 1 (cuStreamWaitValue32 from
the CUDA driver), recorded into the store's wait_event: the hold ends when
the test says so, not after a guessed time.
"""
import ctypes
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # connector/

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import umbp  # noqa: E402

BLOCK = 16
LAYERS, HEADS, HEAD_DIM = 16, 4, 128  # the miniature engine's model: 512 KiB objects
NBLK = 256                            # blocks per prefix
POISON = 0x5A5A


class Gate:
    """A CUDA stream held until release(): it waits on the device for a
    pinned host word to become >= 1."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.word = torch.zeros(1, dtype=torch.int32).pin_memory()
        self.stream = torch.cuda.Stream()
        dptr = ctypes.c_uint64()
        rc = self.cu.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(self.word.data_ptr()),
                                                  ctypes.c_uint(0))
        if rc != 0:
            pytest.skip(f"cuMemHostGetDevicePointer failed ({rc}): cannot hold a stream on host memory")
        fn = getattr(self.cu, "cuStreamWaitValue32_v2", None) or self.cu.cuStreamWaitValue32
        # CU_STREAM_WAIT_VALUE_GEQ = 0
        rc = fn(ctypes.c_void_p(self.stream.cuda_stream), ctypes.c_uint64(dptr.value), ctypes.c_uint32(1),
                ctypes.c_uint(0))
        if rc != 0:
            pytest.skip(f"cuStreamWaitValue32 failed ({rc}): stream memory operations not supported")
        self.event = torch.cuda.Event()
        self.event.record(self.stream)
        self.released = False

    def release(self):
        if not self.released:
            self.word[0] = 1
            self.released = True
            self.stream.synchronize()


@pytest.fixture
def env():
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    caches = [torch.empty(2, 3 * NBLK + 8, BLOCK, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
              for _ in range(LAYERS)]
    for c in caches:
        c.view(torch.int16).random_(-32768, 32767)
    rt = umbp.Runtime({"capacity_bytes": "2GiB", "gpu_backend": "cuda", "timeout_ms": 60000,
                       "log_level": "warn"})
    kv = rt.register_kv_caches(caches, layout="flash_attn")
    ns = umbp.Namespace.derive("tests/kv_gpu", "", BLOCK, "NHD", "bfloat16")
    serial = [0]

    def fresh_keys():
        serial[0] += 1
        return umbp.derive_keys(ns, (0, 0, 0, 0), 0, [os.urandom(32) for _ in range(NBLK)])

    def poison(ids):
        idx = torch.tensor(ids, device=dev)
        for c in caches:
            c.view(torch.int16).index_fill_(1, idx, POISON)
        torch.cuda.synchronize()

    def same(src, dst):
        si, di = torch.tensor(src, device=dev), torch.tensor(dst, device=dev)
        return all(torch.equal(c.view(torch.int16).index_select(1, si), c.view(torch.int16).index_select(1, di))
                   for c in caches)

    yield rt, kv, fresh_keys, poison, same
    rt.close()


A = list(range(0, NBLK))
B = list(range(NBLK, 2 * NBLK))
C = list(range(2 * NBLK, 3 * NBLK))


def test_a_restore_completes_while_a_store_submitted_before_it_is_held(env):
    """A restore submitted behind a store completes when its own copy ends,
    while the store is still held on the device by its wait_event (the
    engine's forward in vLLM).  With a waiter that waits for transfers in
    submission order, the restore's completion waits for the store's."""
    rt, kv, fresh_keys, poison, same = env
    k1 = fresh_keys()
    job = rt.store_blocks(kv, k1, A)
    assert job.wait() and job.num_ok == NBLK
    job.release()
    poison(B)
    gate = Gate()
    k2 = fresh_keys()
    try:
        st = rt.store_blocks(kv, k2, C, wait_event=gate.event)
        ld = rt.load_blocks(kv, k1, B)
        finished = ld.wait(timeout_ms=20000)
        store_done_before_release = st.done
    finally:
        gate.release()
    assert not store_done_before_release, "the store was not held by its wait_event: this test checks nothing"
    assert finished, "the restore did not complete while a store submitted before it was held on the device"
    assert ld.num_ok == NBLK, ld.statuses[:8]
    ld.release()
    assert same(A, B), "restored bytes differ from the stored blocks"
    assert st.wait() and st.num_ok == NBLK, st.statuses[:8]
    st.release()
    poison(B)
    job = rt.load_blocks(kv, k2, B)  # the held store stored what its blocks held
    assert job.wait() and job.num_ok == NBLK
    job.release()
    assert same(C, B), "the held store's bytes differ from its blocks"


def test_a_store_and_a_restore_in_flight_together_are_byte_exact(env):
    """Both directions at once, in both submission orders, every byte
    compared (the restore's destinations poisoned first)."""
    rt, kv, fresh_keys, poison, same = env
    k1 = fresh_keys()
    job = rt.store_blocks(kv, k1, A)
    assert job.wait() and job.num_ok == NBLK
    job.release()
    for store_first in (False, True):
        poison(B)
        k2 = fresh_keys()
        if store_first:
            st = rt.store_blocks(kv, k2, C)
            ld = rt.load_blocks(kv, k1, B)
        else:
            ld = rt.load_blocks(kv, k1, B)
            st = rt.store_blocks(kv, k2, C)
        assert ld.wait() and ld.num_ok == NBLK and st.wait() and st.num_ok == NBLK
        ld.release()
        st.release()
        assert same(A, B), f"restore beside a store (store first: {store_first}) differs"
        poison(B)
        job = rt.load_blocks(kv, k2, B)
        assert job.wait() and job.num_ok == NBLK
        job.release()
        assert same(C, B), f"store beside a restore (store first: {store_first}) differs"
