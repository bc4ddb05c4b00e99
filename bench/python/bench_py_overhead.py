#!/usr/bin/python3
"""bench_py_overhead - engine-side Python cost per step of the umbp package.

Times, per call, what a vLLM connector does each step (design brief target:
<= 200 us each), on a host-backend KV cache of small blocks (2 layers of
(2, 4096, 1, 1, 16) bf16: 128-byte objects, so copies are negligible):
  store plan   derive 512 keys from 512 fresh 32-byte block hashes (a list
               of bytes, as vLLM holds them) + build the blocks array +
               submit umbp_kv_store: from entry to the return of
               store_blocks (the copy is waited for outside the timing)
  lookup       rt.lookup of those 512 keys (a synchronous round trip)
  load submit  rt.load_blocks of 512 blocks (block ids a list of ints)
and the raw ctypes per-call cost (a no-argument call, a call with a pointer
argument, umbp_strerror), the floor of any binding's per-call cost.

Beside each it prints the same calls made from C in the same run
(bench/bench_py_baseline.c; path from --baseline, $UMBP_BENCH_BASELINE or
build/bench/bench_py_baseline) and the ratio Python / C.

Usage: /usr/bin/python3 bench/python/bench_py_overhead.py [--iters N] [--baseline PATH]
"""
import argparse
import ctypes
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "connector"))

import numpy as np  # noqa: E402

import umbp  # noqa: E402
from umbp import _lib  # noqa: E402

NB, NKEYS, L = 4096, 512, 2


class FakeTensor:
    """Just enough of a torch tensor for register_kv_caches (no torch needed)."""

    def __init__(self, arr):
        self.arr = arr
        self.shape = arr.shape

    def data_ptr(self):
        return self.arr.ctypes.data

    def stride(self):
        return tuple(s // self.arr.itemsize for s in self.arr.strides)

    def element_size(self):
        return self.arr.itemsize


def quantiles(ts):
    ts = sorted(ts)
    return ts[len(ts) // 2] * 1e6, ts[len(ts) * 90 // 100] * 1e6


def per_call_us(fn, n=200000):
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = (time.perf_counter() - t0) / n * 1e6
        best = t if best is None else min(best, t)
    return best


def run_python(iters):
    now = time.perf_counter
    rt = umbp.Runtime({"capacity_bytes": "256MiB", "gpu_backend": "host"})
    layers = [np.random.default_rng(l).integers(0, 1 << 16, (2, NB, 1, 1, 16), dtype=np.uint16)
              for l in range(L)]
    kv = rt.register_kv_caches([FakeTensor(a) for a in layers], layout="flash_attn")
    ns = umbp.Namespace.derive("bench/model", "", 16, "NHD", "bfloat16")
    rng = np.random.default_rng(7)
    ts, tl, tg, td = [], [], [], []
    for it in range(iters):
        raw = rng.integers(0, 256, (NKEYS, 32), dtype=np.uint8)
        hashes = [raw[i].tobytes() for i in range(NKEYS)]
        ids = [(it * NKEYS + i) % NB for i in range(NKEYS)]
        t0 = now()
        keys = umbp.derive_keys(ns, (0, 0, 0, 0), 0, hashes)
        job = rt.store_blocks(kv, keys, ids)
        ts.append(now() - t0)
        assert job.wait(60000) and job.num_ok == NKEYS
        job.release()

        t0 = now()
        prefix, present = rt.lookup(keys)
        tl.append(now() - t0)
        assert prefix == NKEYS

        ids = [(it * NKEYS + i + 7) % NB for i in range(NKEYS)]
        t0 = now()
        job = rt.load_blocks(kv, keys, ids)
        tg.append(now() - t0)
        assert job.wait(60000) and job.num_ok == NKEYS
        job.release()

        t0 = now()
        umbp.derive_keys(ns, (0, 0, 0, 0), 0, hashes)
        td.append(now() - t0)
    rt.close()
    out = {"store_plan": quantiles(ts), "lookup": quantiles(tl), "load_submit": quantiles(tg),
           "derive_keys": quantiles(td)}
    f0 = _lib.umbp_gpu_backends_built
    f1 = _lib.umbp_op_test
    f2 = _lib.umbp_strerror
    out["call"] = (per_call_us(f0),) * 2
    out["call_ptr"] = (per_call_us(lambda: f1(None)) - per_call_us(lambda: None),) * 2
    out["call_strerror"] = (per_call_us(lambda: f2(-4097)) - per_call_us(lambda: None),) * 2
    return out


def run_baseline(path, iters):
    if not path or not os.path.exists(path):
        return None, "no C baseline (%s): build it with cmake --build build --target " \
                     "bench_py_baseline" % path
    r = subprocess.run([path, str(iters)], capture_output=True, text=True, timeout=600)
    if r.returncode:
        return None, "C baseline failed: %s" % r.stderr.strip()
    out = {}
    for line in r.stdout.splitlines():
        p = line.split()
        if len(p) == 5 and p[1] == "median_us":
            out[p[0]] = (float(p[2]), float(p[4]))
    return out, r.stdout.splitlines()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--baseline", default=os.environ.get(
        "UMBP_BENCH_BASELINE", os.path.join(REPO, "build", "bench", "bench_py_baseline")))
    a = ap.parse_args()
    py = run_python(a.iters)
    c, note = run_baseline(a.baseline, a.iters)
    print("bench_py_overhead: %d iterations of %d blocks, host backend, Python %s, numpy %s"
          % (a.iters, NKEYS, sys.version.split()[0], np.__version__))
    print("  library %s" % umbp.library_path)
    print("  C baseline: %s" % note)
    print("  %-44s %10s %9s %10s %7s %9s  %s" % ("call", "py median", "py p90", "C median",
                                              "py/C", "py - C", "target <= 200 us"))
    rows = [("store plan: derive 512 keys + blocks + submit", "store_plan", True),
            ("  of which derive_keys(512) alone", "derive_keys", False),
            ("lookup of 512 keys", "lookup", True),
            ("load submit of 512 blocks", "load_submit", True)]
    for label, key, target in rows:
        pm, p9 = py[key]
        cm = c.get(key, (None,))[0] if c else None
        ratio = "%7.2f" % (pm / cm) if cm else "%7s" % "-"
        diff = "%9.1f" % (pm - cm) if cm else "%9s" % "-"
        verdict = ("ok" if pm <= 200 else "OVER") if target else ""
        print("  %-44s %10.1f %9.1f %10s %s %s  %s" % (
            label, pm, p9, "%.1f" % cm if cm else "-", ratio, diff, verdict))
    cc = c.get("call", (None,))[0] if c else None
    print("  raw ctypes call, no arguments (umbp_gpu_backends_built): %.3f us  (C: %s us)"
          % (py["call"][0], "%.4f" % cc if cc else "-"))
    print("  raw ctypes call, one pointer argument (umbp_op_test(NULL)), loop cost removed: %.3f us"
          % py["call_ptr"][0])
    print("  raw ctypes call returning a string (umbp_strerror), loop cost removed: %.3f us"
          % py["call_strerror"][0])


if __name__ == "__main__":
    main()
