import numpy as np
import pytest

import umbp


def test_host_put_get_round_trip(rt):
    n, size = 16, 4096
    src = np.random.default_rng(1).integers(0, 256, (n, size), dtype=np.uint8)
    keys = np.random.default_rng(2).integers(0, 256, (n, 32), dtype=np.uint8)
    ptrs = src.ctypes.data + np.arange(n, dtype=np.uint64) * size
    with rt.put(keys, ptrs, size) as job:
        assert job.wait(10000)
        assert (job.statuses == 0).all()
    dst = np.full_like(src, 0xA5)
    with rt.get(keys, dst.ctypes.data + np.arange(n, dtype=np.uint64) * size, size) as job:
        assert job.wait(10000)
        assert job.num_ok == n
    assert np.array_equal(src, dst)
