#!/usr/bin/env python3
"""bench_py_kv - GPU store and restore of a 10,000-token prefix through
``import umbp`` (what the vLLM and SGLang connectors call), against plain
pinned copies measured in the same process.

Each case runs in a fresh child process, because the costs that only the
first transfers of a process pay (CUDA's lazy kernel loading, the copy
engine's table allocations, driver state of a stream's first copy) are what
the "first" columns measure:

  first store, first restore   the first umbp store (625 fresh blocks) and
               the first restore (into other, poisoned block ids) of a new
               runtime, timed in Python from the call to the end of
               Job.wait(): the time an engine waits.  The benchmark's own
               torch operations (new contents, poison, compare) run once
               before them, untimed, as an engine's first store follows warm
               torch work (--cold-bench-ops: not)
  steady       best and median of --rounds later stores (fresh keys) and
               restores
  both ways    a store of a new prefix and a restore of a stored one
               submitted together, against two plain pinned copies run
               together on two streams (host to device and device to host)
  baseline     one contiguous pinned host <-> device copy of the same bytes
               (torch copy_, non_blocking, then synchronize), best of the
               rounds, and its first call

Every restore is compared byte for byte with the source blocks; a mismatch
exits 1.  Ratios are umbp GB/s over the baseline's GB/s of the same process.

  --decode     the miniature engine's decode step (connector/tests/gpu/
               mini_engine.py's model, 853 M parameters, bf16, one request of
               --context tokens) timed alone, with one 10,000-token restore for
               another request starting with each step, with one contiguous
               pinned copy of the same bytes starting with each step (the
               floor: what the link's traffic alone takes from the step), and
               while restores run back to back: the slowdown in percent.

Usage: python3 bench/python/bench_py_kv.py [--mode embedded|standalone|both]
       [--layout mini|4k|32k] [--rounds N] [--decode] [--ab]
--ab adds the same cases with gpu_warm_transfers=0 (no warming at
registration), to show what the warming saves.  --case NAME:OPT=V,... (repeatable)
with --runs N runs each case N times, alternated, and ends with one table of
every run's ratios and decode slowdowns, e.g.
  --mode embedded --decode --graph --case base: \
      --case few:gpu_max_ctas=16,gpu_threads_per_cta=32 --runs 2
Besides runtime options a case takes head=N, headbytes=N, bufs=0, prewake=0 and three diagnostics of
the first call: busy=MS (GPU work just before the first store), pinwarm=1 (a
pinned copy each way just before it), idle=MS (sleep before every steady store
and restore, and before an extra pinned copy, the baseline after the same idle).
Each report also prints the steady rounds' ratios one by one, with their
minimum, 10th percentile and median and the first call's rank among them.
--timeline runs the first store and the first restore, and after the rounds two
more stores and a pinned copy after each, under torch.profiler and prints where each one's time went on the GPU:
the submit to its first kernel and copy, the link busy and idle between the
copies, and the wait after the last copy (a diagnostic: the profiler slows
the calls it watches).
Prints "SKIP: ..." and exits 0 without CUDA.  Environment: UMBP_LIBRARY, UMBP_SERVER as for the tests.
"""
import argparse
import collections
import json
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "connector"))

BLOCK = 16
POISON = 0x5A5A  # int16 pattern written over restore targets
# layer count, kv heads, head dim (bf16): one object = L * 2 * 16 * H * D * 2 bytes
LAYOUTS = {
    "mini": (16, 4, 128),   # the miniature engine's model: 16 KiB chunks, 512 KiB objects
    "4k": (32, 1, 128),     # 4 KiB chunks, 256 KiB objects
    "32k": (32, 8, 128),    # 32 KiB chunks, 2 MiB objects
}


class LineTimer:
    """--trace-submit: the wall time of each line of the umbp package run in
    a submit (time in what a line calls, C and numpy included, counts to
    the line), from sys.settrace line events.  Tracing slows every line
    alike; what matters is a first call's excess over steady calls'."""

    def __init__(self):
        self.acc, self.last, self.t = {}, None, 0

    def _local(self, frame, event, arg):
        now = time.perf_counter_ns()
        if self.last is not None:
            self.acc[self.last] = self.acc.get(self.last, 0) + now - self.t
        if event == "line":
            self.last = (os.path.basename(frame.f_code.co_filename), frame.f_lineno)
        else:  # returned: the caller's line goes on, where it is ours
            up = frame.f_back
            self.last = (os.path.basename(up.f_code.co_filename), up.f_lineno) \
                if up is not None and "/umbp/" in up.f_code.co_filename else None
        self.t = time.perf_counter_ns()
        return self._local

    def _global(self, frame, event, arg):
        if "/umbp/" in frame.f_code.co_filename:
            return self._local
        return None

    def start(self):
        self.acc, self.last = {}, None
        sys.settrace(self._global)

    def stop(self):
        sys.settrace(None)
        return self.acc

    @staticmethod
    def excess(first, steady, what, top=12):
        """Lines of `first` by their time over the steady calls' median."""
        keys = set(first)
        for s in steady:
            keys |= set(s)
        rows = []
        for k in keys:
            med = statistics.median([s.get(k, 0) for s in steady]) if steady else 0
            rows.append((first.get(k, 0) - med, first.get(k, 0), med, k))
        rows.sort(reverse=True)
        tot_f = sum(first.values())
        tot_s = statistics.median([sum(s.values()) for s in steady]) if steady else 0
        out = [f"traced submit, {what}: {tot_f / 1e3:.0f} us against a steady median of "
               f"{tot_s / 1e3:.0f} us; lines by excess (first / steady median, us):"]
        for ex, f, med, (fn, ln) in rows[:top]:
            out.append(f"  {fn}:{ln}  +{ex / 1e3:.1f}  ({f / 1e3:.1f} / {med / 1e3:.1f})")
        return out


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def timeline(trace, what):
    """One transfer's GPU timeline from a torch.profiler chrome trace (its
    CUPTI records, which see the library's kernels and copies as well as
    torch's): from the caller's submit (the "umbp_submit" annotation) to
    the end of its wait ("umbp_wait"), when the first kernel and the first
    device-to-host or host-to-device copy started, how long the copies kept
    the link busy and how long it sat idle between them (the gaps, largest
    first, with the copy's index after which each opened), and how long the
    caller's wait went on after the last copy ended.  Times in us."""
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    cpu = {e["name"]: e for e in ev if e.get("cat") == "user_annotation"
           and e["name"] in ("umbp_submit", "umbp_wait")}
    if "umbp_submit" not in cpu:
        return f"{what}: no annotation in the trace"
    t0 = cpu["umbp_submit"]["ts"]
    sub = cpu["umbp_submit"]["dur"]
    t1 = cpu["umbp_wait"]["ts"] + cpu["umbp_wait"]["dur"] if "umbp_wait" in cpu else t0 + sub
    inside = [e for e in ev if t0 <= e["ts"] <= t1]
    kern = sorted((e for e in inside if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    dma = sorted((e for e in inside if e.get("cat") == "gpu_memcpy"), key=lambda e: e["ts"])
    if not dma:
        return f"{what}: wall {t1 - t0:.0f} us, no copy in the trace"
    busy, end, gaps, nbytes = 0.0, dma[0]["ts"], [], 0
    for i, e in enumerate(dma):
        s, f = e["ts"], e["ts"] + e["dur"]
        if s > end:
            gaps.append((s - end, i - 1))
        busy += max(0.0, f - max(s, end))
        end = max(end, f)
        nbytes += int((e.get("args") or {}).get("bytes", 0) or 0)
    gaps.sort(reverse=True)
    big = ", ".join(f"{g:.0f}@{i}" for g, i in gaps[:4])
    rate = f", {nbytes / busy / 1e3:.1f} GB/s while busy" if nbytes and busy else ""
    first_k = f"{kern[0]['ts'] - t0:.0f}" if kern else "-"
    return (f"{what}: wall {t1 - t0:.0f} us (submit {sub:.0f}); to the first kernel {first_k}, "
            f"first copy {dma[0]['ts'] - t0:.0f}; {len(dma)} copies busy {busy:.0f} us{rate}; "
            f"idle between them {sum(g for g, _ in gaps):.0f} us in {len(gaps)} gaps "
            f"({sum(1 for g, _ in gaps if g >= 5)} of 5 us or more; largest {big or '-'}); "
            f"{len(kern)} kernels; after the last copy {t1 - end:.0f} us")


def host_cpu():
    """The host's CPU model and the CPUs this process may use: the CPU side of
    a call (the submit, the loop thread, the wake-ups) is a fixed cost that
    differs between hosts of one GPU model (docs/benchmarks.md)."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} CPUs"


# ---- the child: one runtime in a fresh process ---------------------------------------


class Pinned:
    """Best-of-N pinned copies with torch, the same bytes as a prefix."""

    def __init__(self, torch, nbytes, dev):
        self.torch = torch
        self.h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.h2 = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.d = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        self.d2 = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        self.s1 = torch.cuda.Stream(dev)
        self.s2 = torch.cuda.Stream(dev)
        self.h.random_(0, 255)
        self.d2.random_(0, 255)

    def h2d(self):
        t = time.perf_counter()
        self.d.copy_(self.h, non_blocking=True)
        self.torch.cuda.synchronize()
        return time.perf_counter() - t

    def d2h(self):
        t = time.perf_counter()
        self.h2.copy_(self.d2, non_blocking=True)
        self.torch.cuda.synchronize()
        return time.perf_counter() - t

    def both(self):
        torch = self.torch
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.cuda.stream(self.s1):
            self.d.copy_(self.h, non_blocking=True)
        with torch.cuda.stream(self.s2):
            self.h2.copy_(self.d2, non_blocking=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t


def gpu_busy(torch, dev, ms):
    """About ms milliseconds of matrix products on the GPU, then a sync."""
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1e3:
        for _ in range(8):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def child(args):
    import torch

    import umbp

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    L, H, D = LAYOUTS[args.layout]
    nblk = args.blocks
    nb = 3 * nblk + 8  # three prefixes' worth of block ids: A (stored), B (restored into), C
    caches = [torch.empty(2, nb, BLOCK, H, D, dtype=torch.bfloat16, device=dev) for _ in range(L)]
    for c in caches:
        c.view(torch.int16).random_(-32768, 32767)
    obj = L * 2 * BLOCK * H * D * 2
    nbytes = nblk * obj
    out = {"mode": args.mode, "layout": args.layout, "blocks": nblk, "object_bytes": obj,
           "bytes": nbytes, "warm": args.warm, "cpu": host_cpu()}

    pin = Pinned(torch, nbytes, dev)
    out["base_first_h2d"] = pin.h2d()
    out["base_first_d2h"] = pin.d2h()
    out["base_first_both"] = pin.both()

    opts = {"capacity_bytes": args.capacity, "gpu_backend": "cuda",
            "gpu_warm_transfers": args.warm, "log_level": "warn"}
    if args.mode == "standalone":
        opts.update(mode="standalone", socket_dir=args.socket_dir)
    for kv_ in args.opt or []:
        k_, _, v_ = kv_.partition("=")
        try:
            opts[k_] = json.loads(v_)  # numbers and booleans as such
        except ValueError:
            opts[k_] = v_
    t = time.perf_counter()
    rt = umbp.Runtime(opts)
    if args.no_block_bufs:  # an A/B: a new block array for every op, none made ready
        class NoBufs(list):
            def __bool__(self):
                return False  # nothing to take

            def __len__(self):
                return 4  # full: nothing is given back, nothing made ready
        rt._bufs = NoBufs()
    if args.head_blocks is not None:
        rt.kv_head_blocks = args.head_blocks
    if args.head_bytes is not None:
        rt.kv_head_bytes = args.head_bytes
    if args.no_prewake:  # an A/B of the loop's prewake: store/load submit without it
        umbp.runtime._prewake = lambda p: 0
    out["head_blocks"] = rt.kv_head_blocks
    out["head_bytes"] = rt.kv_head_bytes
    kv = rt.register_kv_caches(caches, layout="flash_attn")
    out["register_s"] = time.perf_counter() - t
    ns = umbp.Namespace.derive("bench/py_kv", "", BLOCK, "NHD", "bfloat16")
    A = list(range(0, nblk))
    B = list(range(nblk, 2 * nblk))
    C = list(range(2 * nblk, 3 * nblk))
    out["ids"] = args.ids
    if args.ids == "array":  # as the vLLM worker passes them: int64 from the scheduler's bytes
        import numpy as np
        A, B, C = (np.frombuffer(np.array(x, dtype=np.int64).tobytes(), dtype=np.int64)
                   for x in (A, B, C))
    serial = [0]

    def fresh_keys():
        serial[0] += 1
        hashes = [os.urandom(32) for _ in range(nblk)]
        return umbp.derive_keys(ns, (0, 0, 0, 0), 0, hashes)

    def poison(ids):
        idx = torch.tensor(ids, device=dev)
        for c in caches:
            c.view(torch.int16).index_fill_(1, idx, POISON)
        torch.cuda.synchronize()

    def verify(src, dst, what):
        si = torch.tensor(src, device=dev)
        di = torch.tensor(dst, device=dev)
        for li, c in enumerate(caches):
            c = c.view(torch.int16)  # bit patterns: random bf16 bits hold NaNs
            a, b = c.index_select(1, si), c.index_select(1, di)
            if not torch.equal(a, b):
                bad = (a != b).flatten(2).any(-1)  # (2, blocks)
                nbad = int(bad.any(0).sum())
                first = int(bad.any(0).nonzero()[0])
                poisoned = bool((b[:, first] == POISON).all())
                log(f"FAIL: {what}: layer {li}: {nbad} of {len(src)} blocks differ (first: block "
                    f"{first}, K {bool(bad[0, first])} V {bool(bad[1, first])}, "
                    f"{'still poisoned' if poisoned else 'other bytes'})")
                sys.exit(1)

    calls = {"submit": [], "wait": [], "faults": []}  # where the caller's time went
    faults = lambda: resource.getrusage(resource.RUSAGE_THREAD).ru_minflt  # noqa: E731
    traces = []  # --trace-submit: per submit, {(file, line): ns}
    tracer = LineTimer() if args.trace_submit else None

    profiling = [None]  # --timeline: the torch.profiler record_function while one runs

    def timed(fn):
        torch.cuda.synchronize()
        f0 = faults()
        if tracer:
            tracer.start()
        mark = profiling[0]
        t = time.perf_counter()
        if mark:
            with mark("umbp_submit"):
                job = fn()
        else:
            job = fn()
        t1 = time.perf_counter()
        if tracer:
            traces.append(tracer.stop())
        calls["faults"].append(faults() - f0)  # pages the submit touched first
        if mark:
            with mark("umbp_wait"):
                job.wait()
        else:
            job.wait()
        dt = time.perf_counter() - t
        calls["submit"].append(t1 - t)
        calls["wait"].append(dt - (t1 - t))
        if job.num_ok != len(job):
            st = [int(x) for x in job.statuses]
            bad = [i for i, x in enumerate(st) if x != 0]
            kinds = collections.Counter(st[i] for i in bad)
            log(f"FAIL: {len(bad)} of {len(job)} keys failed: statuses {dict(kinds)}, "
                f"first at block {bad[0]}: {umbp.strerror(st[bad[0]]) if hasattr(umbp, 'strerror') else ''}")
            sys.exit(1)
        job.release()
        return dt

    # where the runtime's time went (umbp_stats_t kv_*), summed over the
    # steady rounds (store, restore) and for the first calls on their own
    phase_names = ("kv_transfers", "kv_prepare_ns", "kv_launch_ns", "kv_gpu_ns", "kv_finish_ns",
                   "kv_queue_ns", "kv_tier_ns")
    phases = {k: [0] * len(phase_names) for k in ("store", "restore", "first store", "first restore")}

    def phased(what, fn):
        a = rt.stats()
        dt = timed(fn)
        b = rt.stats()
        for i, f in enumerate(phase_names):
            phases[what][i] += b[f] - a[f]
        return dt

    lines = []  # --timeline: one line per profiled call

    def profiled(what, fn):
        """fn() under torch.profiler (--timeline; otherwise just fn())."""
        if not args.timeline:
            return fn()
        from torch.profiler import ProfilerActivity, profile, record_function
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            profiling[0] = record_function
            try:
                dt = fn()
            finally:
                profiling[0] = None
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path) as f:
                lines.append(timeline(json.load(f), what))
        finally:
            os.unlink(path)
        return dt

    def pinned_d2h():
        torch.cuda.synchronize()
        with profiling[0]("umbp_submit"):
            pin.h2.copy_(pin.d2, non_blocking=True)
        with profiling[0]("umbp_wait"):
            torch.cuda.synchronize()
        return 0

    if args.timeline:  # the profiler's own first start (CUPTI) before anything timed
        profiled("the profiler's first start", lambda: 0)
        lines.clear()

    if args.busy_ms:  # as in an engine, whose first store follows a forward pass
        gpu_busy(torch, dev, args.busy_ms)
    if args.pin_warm:  # a diagnostic: the link just moved the same bytes both ways
        pin.d2h()
        pin.h2d()
    if not args.cold_bench_ops:
        # The benchmark's own torch operations once, untimed, so that their
        # first-time costs (the dispatcher's, CUDA's lazy kernel loading,
        # the CPU caches they sweep) do not land on the umbp call after them:
        # an engine's first store and restore follow warm torch work.
        # Nothing of umbp runs here.
        for c in caches:
            c[:, :nblk].view(torch.int16).random_(-32768, 32767)
        poison(B)
        verify(B, B, "warming the benchmark's own operations")
        torch.cuda.synchronize()
    for c in caches:  # as before every steady store: new contents in A
        c[:, :nblk].view(torch.int16).random_(-32768, 32767)
    keys = fresh_keys()
    out["first_store"] = profiled("first store",
                                  lambda: phased("first store", lambda: rt.store_blocks(kv, keys, A)))
    poison(B)
    out["first_restore"] = profiled("first restore",
                                    lambda: phased("first restore", lambda: rt.load_blocks(kv, keys, B)))
    verify(A, B, "first restore")
    out["first_submit"] = calls["submit"][:2]  # the caller's submit of the first store, restore
    out["first_faults"] = calls["faults"][:2]

    st, rs, bh, bs, bb, bhi = [], [], [], [], [], []
    for r in range(args.rounds):
        for c in caches:  # new contents in A each round
            c[:, :nblk].view(torch.int16).random_(-32768, 32767)
        keys = fresh_keys()
        if args.idle_ms:  # as long idle before each store as the first one has
            torch.cuda.synchronize()
            time.sleep(args.idle_ms / 1e3)
        st.append(phased("store", lambda: rt.store_blocks(kv, keys, A)))
        poison(B)
        if args.idle_ms:  # a request that comes to an idle engine: its restore first
            time.sleep(args.idle_ms / 1e3)
        rs.append(phased("restore", lambda: rt.load_blocks(kv, keys, B)))
        verify(A, B, f"restore {r}")
        if args.idle_ms:  # the baseline after the same idle
            time.sleep(args.idle_ms / 1e3)
            bhi.append(pin.h2d())
        bh.append(pin.h2d())
        bs.append(pin.d2h())
        bb.append(pin.both())
    if tracer:
        out["trace_lines"] = LineTimer.excess(traces[0], traces[2::2], "first store")
    out.update(store=st, restore=rs, base_h2d=bh, base_h2d_idle=bhi, base_d2h=bs, base_both=bb, phases=phases,
               calls={k: statistics.median(v) for k, v in calls.items()},
               steady_faults=[max(calls["faults"][2::2] or [0]), max(calls["faults"][3::2] or [0])],
               # the steady rounds' submits alone (after the first two): store, restore
               steady_submit=[statistics.median(calls["submit"][2::2] or [0]),
                              statistics.median(calls["submit"][3::2] or [0])])
    # --timeline: two more steady stores and a pinned copy after each, under
    # the profiler, after the rounds (so no steady figure above counts them)
    for i in range(2 if args.timeline else 0):
        for c in caches:
            c[:, :nblk].view(torch.int16).random_(-32768, 32767)
        k2 = fresh_keys()
        profiled(f"steady store {i + 1}", lambda: timed(lambda: rt.store_blocks(kv, k2, A)))
        profiled(f"pinned copy, device to host, {i + 1}", pinned_d2h)
        keys = k2  # A's contents now: the prefix stored last, which both ways restores
    out["timeline"] = lines

    # both ways: restore the prefix stored last (keys, from A) into B while
    # storing a new prefix from C
    both, both_ends = [], []
    for r in range(args.rounds):
        for c in caches:
            c[:, 2 * nblk:3 * nblk].view(torch.int16).random_(-32768, 32767)
        poison(B)
        k2 = fresh_keys()
        torch.cuda.synchronize()
        t = time.perf_counter()
        if args.store_first:
            j2 = rt.store_blocks(kv, k2, C)
            j1 = rt.load_blocks(kv, keys, B)
        else:
            j1 = rt.load_blocks(kv, keys, B)
            j2 = rt.store_blocks(kv, k2, C)
        d1 = d2 = None
        while d1 is None or d2 is None:  # when each one ends
            if d1 is None and j1.done:
                d1 = time.perf_counter() - t
            if d2 is None and j2.done:
                d2 = time.perf_counter() - t
        both.append(time.perf_counter() - t)
        both_ends.append((d1, d2))
        if j1.num_ok != nblk or j2.num_ok != nblk:
            log(f"FAIL: both ways: {nblk - j1.num_ok} loads, {nblk - j2.num_ok} stores failed")
            sys.exit(1)
        j1.release()
        j2.release()
        verify(A, B, f"restore beside a store {r}")
        # the new prefix reads back too
        poison(B)
        timed(lambda: rt.load_blocks(kv, k2, B))
        verify(C, B, f"store beside a restore {r}")
    out["both"] = both
    out["both_ends"] = both_ends

    if args.decode:
        out.update(decode(args, torch, umbp, rt, kv, caches, keys, A, B, dev, pin))
    rt.deregister(kv)
    rt.close()
    print(json.dumps(out), flush=True)


def decode(args, torch, umbp, rt, kv, caches, keys, A, B, dev, pin):
    """Decode steps of the miniature engine's model, alone and beside restores."""
    sys.path.insert(0, os.path.join(REPO, "connector", "tests", "gpu"))
    import mini_engine as me

    me._import_torch()
    mc = dict(me.PRESETS["gpu"])
    model = me.build_model(mc, dev, 1234, use_hf=True).to(torch.bfloat16)
    pm = me.PagedLlama(model, mc, dev, torch.bfloat16, "NHD", 2048)
    ctx = args.context
    table = torch.arange(0, me.cdiv(ctx + args.steps + 1, BLOCK), device=dev)
    prompt = torch.tensor(me.make_prompt(mc["vocab"], ctx, 1), device=dev)
    pm.forward(prompt, 0, table)
    tok = torch.tensor([1], device=dev)

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    cur = torch.cuda.current_stream()
    graph = None
    if args.graph:
        # one decode step captured in a CUDA graph and replayed (what vLLM's
        # decode runs): its time is the GPU's, not the host's launch rate, so
        # what a restore takes from it is GPU interference.  Every replay is
        # the same step (same position): a timing, not a decode.
        side = torch.cuda.Stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            for _ in range(3):
                pm.forward(tok, ctx, table)
        cur.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            pm.forward(tok, ctx, table)
        torch.cuda.synchronize()

    def step(pos, gpu):
        # the step's own stream only: a device-wide synchronize would also
        # wait for the restore in flight on the copy engine's streams
        cur.synchronize()
        t = time.perf_counter()
        e0.record()
        if graph is not None:
            graph.replay()
        else:
            pm.forward(tok, pos, table)
        e1.record()
        cur.synchronize()
        gpu.append(e0.elapsed_time(e1) / 1e3)
        return time.perf_counter() - t

    def one_restore_per_step(pos, gpu):
        # a 10,000-token restore for another request starts with the step
        j = rt.load_blocks(kv, keys, B)
        dt = step(pos, gpu)
        j.wait()
        if j.num_ok != len(j):
            log("FAIL: a restore beside the decode failed")
            sys.exit(1)
        j.release()
        return dt

    def one_pinned_copy_per_step(pos, gpu):
        # the floor: one contiguous pinned copy of the same bytes (no
        # scatter, no runtime) on a side stream, starting with the step
        with torch.cuda.stream(pin.s1):
            pin.d.copy_(pin.h, non_blocking=True)
        dt = step(pos, gpu)
        pin.s1.synchronize()
        return dt

    junk = []
    for i in range(5):
        step(ctx + i, junk)
    res = {k: [] for k in ("alone", "one", "pinned", "busy")}
    gpu = {k: [] for k in res}
    nloads = [0]

    def restorer(stop):
        while not stop.is_set():
            j = rt.load_blocks(kv, keys, B)
            j.wait()
            if j.num_ok != len(j):
                log("FAIL: a restore beside the decode failed")
                os._exit(1)
            j.release()
            nloads[0] += 1

    # alternate step by step (alone, with a restore) and the busy phase
    # between: the host's launch rate drifts by tens of percent over a run
    # (this eager model is launch-bound), which phases of 40 steps each
    # turned into slowdowns of -26 % to +4 % on the H200 host
    for _ in range(3):
        for i in range(args.steps):
            res["alone"].append(step(ctx + i, gpu["alone"]))
            res["one"].append(one_restore_per_step(ctx + i, gpu["one"]))
            res["pinned"].append(one_pinned_copy_per_step(ctx + i, gpu["pinned"]))
        stop = threading.Event()
        th = threading.Thread(target=restorer, args=(stop,))
        th.start()
        time.sleep(0.02)
        res["busy"] += [step(ctx + i, gpu["busy"]) for i in range(args.steps)]
        stop.set()
        th.join()
    out = {"decode_context": ctx, "decode_restores": nloads[0], "decode_graph": graph is not None}
    for k in res:
        out["decode_" + k] = res[k]
        out["decode_gpu_" + k] = gpu[k]
    return out


# ---- the parent: cases, server, table ------------------------------------------------


def gbs(nbytes, s):
    return nbytes / s / 1e9


def start_server(binary, socket_dir, capacity):
    cfg = {"capacity_bytes": capacity, "socket_dir": socket_dir, "log_level": "warn"}
    p = subprocess.Popen([binary, "--json", json.dumps(cfg)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    r, _, _ = select.select([p.stdout], [], [], 30)
    line = p.stdout.readline() if r else ""
    if "serving" not in line:
        p.kill()
        raise SystemExit(f"umbp-server did not start: {line!r}")
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    return p


def run_case(args, mode, warm, decode_too):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode, "--layout", args.layout,
           "--rounds", str(args.rounds), "--blocks", str(args.blocks), "--warm", str(warm),
           "--capacity", args.capacity, "--context", str(args.context), "--steps", str(args.steps)]
    server = None
    tmp = tempfile.mkdtemp(prefix="umbp-bench-")
    if mode == "standalone":
        binary = os.environ.get("UMBP_SERVER") or os.path.join(REPO, "build", "server", "umbp-server")
        server = start_server(binary, tmp, args.server_capacity)
        cmd += ["--socket-dir", tmp]
    if decode_too:
        cmd.append("--decode")
        if args.graph:
            cmd.append("--graph")
    if args.store_first:
        cmd.append("--store-first")
    if args.head_blocks is not None:
        cmd += ["--head-blocks", str(args.head_blocks)]
    if args.head_bytes is not None:
        cmd += ["--head-bytes", str(args.head_bytes)]
    if args.no_prewake:
        cmd.append("--no-prewake")
    if args.no_block_bufs:
        cmd.append("--no-block-bufs")
    cmd += ["--ids", args.ids]
    if args.trace_submit:
        cmd.append("--trace-submit")
    if args.timeline:
        cmd.append("--timeline")
    if args.busy_ms:
        cmd += ["--busy-ms", str(args.busy_ms)]
    if args.idle_ms:
        cmd += ["--idle-ms", str(args.idle_ms)]
    if args.pin_warm:
        cmd.append("--pin-warm")
    if args.cold_bench_ops:
        cmd.append("--cold-bench-ops")
    for o in args.opt or []:
        cmd += ["--opt", o]
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(15)
    if r.returncode != 0:
        raise SystemExit(f"case {mode} warm={warm} failed (exit {r.returncode})")
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(res):
    n = res["bytes"]
    bh, bs, bb = min(res["base_h2d"]), min(res["base_d2h"]), min(res["base_both"])
    st, rs = res["store"], res["restore"]
    tag = (f"{res['mode']}, warm {res['warm']}, head {res.get('head_blocks')} blocks, "
           f"ids as a {res.get('ids', 'list')}")
    rows = [
        ("first store", gbs(n, res["first_store"]), gbs(n, bs)),
        ("first restore", gbs(n, res["first_restore"]), gbs(n, bh)),
        ("store best", gbs(n, min(st)), gbs(n, bs)),
        ("store median", gbs(n, statistics.median(st)), gbs(n, bs)),
        ("restore best", gbs(n, min(rs)), gbs(n, bh)),
        ("restore median", gbs(n, statistics.median(rs)), gbs(n, bh)),
        ("both ways best", gbs(2 * n, min(res["both"])), gbs(2 * n, bb)),
        ("both ways median", gbs(2 * n, statistics.median(res["both"])), gbs(2 * n, bb)),
    ]
    print(f"## {tag}: {res['blocks']} blocks of {res['object_bytes']} bytes ({n / 1e6:.0f} MB), "
          f"layout {res['layout']}, registration {res['register_s'] * 1e3:.1f} ms; baseline first "
          f"calls h2d {gbs(n, res['base_first_h2d']):.1f}, d2h {gbs(n, res['base_first_d2h']):.1f} GB/s"
          f"; host CPU {res.get('cpu', '?')}")
    ends = res.get("both_ends") or []
    if ends:
        print(f"both ways, median end of the restore / the store: "
              f"{statistics.median(e[0] for e in ends) * 1e3:.2f} / "
              f"{statistics.median(e[1] for e in ends) * 1e3:.2f} ms (alone: "
              f"{statistics.median(rs) * 1e3:.2f} / {statistics.median(st) * 1e3:.2f} ms)")
    for what, p in (res.get("phases") or {}).items():
        if p[0]:
            calls_ = 1 if what.startswith("first") else len(st)
            split = (f" (queue {p[5] / p[0] / 1e3:.0f} us, tier {p[6] / p[0] / 1e3:.0f} us)"
                     if len(p) > 6 else "")
            print(f"{what}, mean per GPU transfer ({p[0] / calls_:.0f} a call): prepare "
                  f"{p[1] / p[0] / 1e3:.0f} us{split}, launch {p[2] / p[0] / 1e3:.0f} us, gpu "
                  f"{p[3] / p[0] / 1e3:.0f} us, finish {p[4] / p[0] / 1e3:.0f} us")
    # is a first call slower than the steady ones, or one draw of the same
    # spread?  Ratios of the steady rounds to the best pinned copy
    for what, xs, base, first in (("store", st, bs, res["first_store"]),
                                  ("restore", rs, bh, res["first_restore"])):
        q = sorted(base / x for x in xs)
        print(f"steady {what}s, ratio min / p10 / median: {q[0]:.3f} / "
              f"{q[len(q) // 10]:.3f} / {statistics.median(q):.3f}; the first "
              f"{base / first:.3f}, under {sum(base / x > base / first for x in xs)} of {len(xs)}; "
              f"by round: {' '.join('%.3f' % (base / x) for x in xs)}")
    # the link's own spread: each round's pinned copy against the best one
    for what, xs in (("host to device", res["base_h2d"]), ("device to host", res["base_d2h"])):
        q = sorted(min(xs) / x for x in xs)
        print(f"pinned copies {what}, each against the best, min / p10 / median: {q[0]:.3f} / "
              f"{q[len(q) // 10]:.3f} / {statistics.median(q):.3f}")
    if res.get("base_h2d_idle"):
        q = statistics.median(res["base_h2d_idle"])
        print(f"pinned copy after the same idle, median: {gbs(n, q):.1f} GB/s, "
              f"{bh / q:.3f} of the best")
    if res.get("calls"):
        fs = res.get("first_submit") or [0, 0]
        ss = res.get("steady_submit") or [0, 0]
        print(f"caller, median: submit {res['calls']['submit'] * 1e6:.0f} us, wait "
              f"{res['calls']['wait'] * 1e6:.0f} us; first store / restore submit "
              f"{fs[0] * 1e6:.0f} / {fs[1] * 1e6:.0f} us, steady {ss[0] * 1e6:.0f} / "
              f"{ss[1] * 1e6:.0f} us")
    if res.get("first_faults") is not None:
        ff, sf = res["first_faults"], res.get("steady_faults") or [0, 0]
        print(f"caller's page faults in the submit: first store / restore {ff[0]} / {ff[1]}, "
              f"steady at most {sf[0]} / {sf[1]}")
    for line in res.get("trace_lines") or []:
        print(line)
    for line in res.get("timeline") or []:
        print("timeline, " + line)
    print("| case | umbp GB/s | pinned copy GB/s | ratio |")
    print("|---|---|---|---|")
    for name, u, b in rows:
        print(f"| {name} | {u:.1f} | {b:.1f} | {u / b:.3f}× |")
    if "decode_alone" in res:
        print(f"decode step of the miniature engine (context {res['decode_context']}"
              f"{', one CUDA graph' if res.get('decode_graph') else ', eager'}), median ms "
              f"(wall / GPU time of the step's kernels):")
        md = {k: (statistics.median(res["decode_" + k]), statistics.median(res["decode_gpu_" + k]))
              for k in ("alone", "one", "pinned", "busy") if "decode_" + k in res}
        for k, what in (("alone", "alone"), ("one", "one 10,000-token restore starting with the step"),
                        ("pinned", "one pinned copy of the same bytes starting with the step (the floor)"),
                        ("busy", f"restores back to back ({res['decode_restores']} in all)")):
            if k not in md:
                continue
            w, g = md[k]
            print(f"  {what}: {w * 1e3:.2f} / {g * 1e3:.2f} ms, slowdown "
                  f"{(w / md['alone'][0] - 1) * 100:+.1f} % / {(g / md['alone'][1] - 1) * 100:+.1f} %")
    sys.stdout.flush()


def metrics(res):
    """The numbers an A/B compares: ratios to the same run's pinned copy and
    the decode step's GPU-time slowdowns (percent)."""
    n = res["bytes"]
    bh, bs = min(res["base_h2d"]), min(res["base_d2h"])
    m = {"first store": gbs(n, res["first_store"]) / gbs(n, bs),
         "first restore": gbs(n, res["first_restore"]) / gbs(n, bh),
         "store median": gbs(n, statistics.median(res["store"])) / gbs(n, bs),
         "restore median": gbs(n, statistics.median(res["restore"])) / gbs(n, bh)}
    if "decode_gpu_alone" in res:
        alone = statistics.median(res["decode_gpu_alone"])
        for k, name in (("one", "decode, one restore"), ("pinned", "decode, pinned copy"),
                        ("busy", "decode, back to back")):
            if "decode_gpu_" + k in res:
                m[name] = (statistics.median(res["decode_gpu_" + k]) / alone - 1) * 100
    return m


def parse_case(text):
    """NAME:OPT=V,OPT=V (head=N sets --head-blocks, headbytes=N --head-bytes, ids=K --ids, prewake=0 --no-prewake,
    busy=MS --busy-ms, idle=MS --idle-ms, pinwarm=1 --pin-warm, coldops=1 --cold-bench-ops)
    -> (name, opts, head, prewake, extra)."""
    name, _, rest = text.partition(":")
    opts, head, prewake, extra = [], None, True, {}
    for kv in filter(None, rest.split(",")):
        k, eq, v = kv.partition("=")
        if not eq:
            raise SystemExit("--case %r: %r is not NAME=VALUE" % (text, kv))
        if k == "head":
            if not v.isdigit():
                raise SystemExit("--case %r: head must be a block count >= 0, got %r" % (text, v))
            head = int(v)
        elif k == "headbytes":
            if not v.isdigit():
                raise SystemExit("--case %r: headbytes must be a byte count >= 0, got %r" % (text, v))
            extra["head_bytes"] = int(v)
        elif k == "bufs":
            if v not in ("0", "1"):
                raise SystemExit("--case %r: bufs must be 0 or 1, got %r" % (text, v))
            extra["no_block_bufs"] = v == "0"
        elif k == "ids":
            if v not in ("list", "array"):
                raise SystemExit("--case %r: ids must be list or array, got %r" % (text, v))
            extra["ids"] = v
        elif k == "prewake":
            if v not in ("0", "1"):
                raise SystemExit("--case %r: prewake must be 0 or 1, got %r" % (text, v))
            prewake = v == "1"
        elif k == "pinwarm":
            if v not in ("0", "1"):
                raise SystemExit("--case %r: pinwarm must be 0 or 1, got %r" % (text, v))
            extra["pin_warm"] = v == "1"
        elif k == "coldops":
            if v not in ("0", "1"):
                raise SystemExit("--case %r: coldops must be 0 or 1, got %r" % (text, v))
            extra["cold_bench_ops"] = v == "1"
        elif k in ("busy", "idle"):
            if not v.isdigit():
                raise SystemExit("--case %r: %s must be milliseconds >= 0, got %r" % (text, k, v))
            extra[k + "_ms"] = int(v)
        else:
            opts.append(kv)
    return name or "case", opts, head, prewake, extra


def run_ab(args, cases):
    """Each case once per run, alternated (run 1: A B ..., run 2: A B ...):
    this host's speed drifts between calls, so a comparison holds within a
    run.  Prints each case's report, then one table of every run."""
    rows = []
    for r in range(args.runs):
        for name, opts, head, prewake, extra in cases:
            a = argparse.Namespace(**vars(args))
            for k, v in extra.items():
                setattr(a, k, v)
            a.opt = list(args.opt or []) + opts
            if head is not None:
                a.head_blocks = head
            a.no_prewake = args.no_prewake or not prewake
            print(f"### case {name}, run {r + 1}")
            res = run_case(a, args.mode, 16, args.decode)
            report(res)
            rows.append((name, r + 1, metrics(res)))
    cols = list(dict.fromkeys(k for _, _, m in rows for k in m))
    print("\n| case | run | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for name, r, m in rows:
        cells = ["" if c not in m else ("%+.1f %%" % m[c]) if c.startswith("decode")
                 else ("%.3f×" % m[c]) for c in cols]
        print(f"| {name} | {r} | " + " | ".join(cells) + " |")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="both", choices=["embedded", "standalone", "both"])
    ap.add_argument("--layout", default="mini", choices=sorted(LAYOUTS))
    ap.add_argument("--blocks", type=int, default=625, help="blocks per prefix (625: 10,000 tokens)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--capacity", default="4GiB")
    ap.add_argument("--server-capacity", default="4GiB")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--graph", action="store_true", help="--decode: replay the step as a CUDA graph")
    ap.add_argument("--ab", action="store_true")
    ap.add_argument("--store-first", action="store_true", help="both ways: submit the store first")
    ap.add_argument("--head-blocks", type=int, metavar="N",
                    help="Runtime.kv_head_blocks: a head of N blocks submitted first (0: one op; "
                         "default: the package's)")
    ap.add_argument("--head-bytes", type=int, metavar="N",
                    help="Runtime.kv_head_bytes: a head of at least N bytes of objects, up to a "
                         "quarter of the batch (0: exactly --head-blocks; default: the package's)")
    ap.add_argument("--no-prewake", action="store_true",
                    help="store_blocks / load_blocks without umbp_prewake (an A/B baseline)")
    ap.add_argument("--no-block-bufs", action="store_true",
                    help="a new block array for every op, none made ready at registration "
                         "(the binding before 2026-12-05; an A/B baseline)")
    ap.add_argument("--ids", default="list", choices=["list", "array"],
                    help="block ids as a list of ints (default) or an int64 array made from "
                         "bytes, as the vLLM connector's worker passes them")
    ap.add_argument("--trace-submit", action="store_true",
                    help="time each line of the umbp package in every store's and restore's "
                         "submit (sys.settrace; slows them, so the ratios are not the "
                         "untraced ones) and print the first store's lines by their excess "
                         "over the steady stores' median (a diagnostic)")
    ap.add_argument("--timeline", action="store_true",
                    help="run the first store and the first restore, and after the rounds two more stores and a "
                         "pinned copy after each, under torch.profiler, and print each one's GPU timeline: when "
                         "its first kernel and copy started after the submit, how long the "
                         "copies kept the link busy, the idle gaps between them, and the wait "
                         "after the last copy (a diagnostic; the profiler slows the calls it "
                         "watches: the first calls' ratios are then not the unprofiled ones; the "
                         "steady figures count none of the profiled stores)")
    ap.add_argument("--busy-ms", type=int, default=0, metavar="MS",
                    help="MS ms of GPU matrix products just before the first store, as an "
                         "engine's forward pass precedes its first store (default 0: the first "
                         "store follows the registration's idle GPU)")
    ap.add_argument("--pin-warm", action="store_true",
                    help="a pinned copy of the prefix's bytes each way just before the first "
                         "store (a diagnostic: is a first call slow because the link was idle?)")
    ap.add_argument("--cold-bench-ops", action="store_true",
                    help="do not run the benchmark's own torch operations (fill, poison, "
                         "compare) once before the first store: their first-time costs then "
                         "land on the first umbp calls after them (the behaviour before "
                         "2026-12-04)")
    ap.add_argument("--idle-ms", type=int, default=0, metavar="MS",
                    help="sleep MS ms (CPU and GPU idle) before every steady store and restore, "
                         "as the first store is and a restore for a request to an idle engine")
    ap.add_argument("--opt", action="append", metavar="NAME=VALUE", help="a runtime option (repeatable)")
    ap.add_argument("--case", action="append", metavar="NAME:OPT=V,...",
                    help="an A/B case: runtime options for it (head=N sets --head-blocks, "
                         "headbytes=N --head-bytes, bufs=0 --no-block-bufs, ids=array --ids, "
                         "prewake=0 --no-prewake, busy=MS --busy-ms, idle=MS --idle-ms, "
                         "pinwarm=1 --pin-warm, coldops=1 --cold-bench-ops); "
                         "repeatable, run alternated --runs times, one mode (not both)")
    ap.add_argument("--runs", type=int, default=1, help="--case: runs of every case, alternated")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--warm", type=int, default=16, help=argparse.SUPPRESS)
    ap.add_argument("--socket-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    if args.case:
        if args.runs < 1:
            raise SystemExit("--runs must be >= 1, got %d" % args.runs)
        if args.mode == "both":
            raise SystemExit("--case compares cases in one mode: give --mode embedded or standalone")
        run_ab(args, [parse_case(c) for c in args.case])
        return 0
    modes = ["embedded", "standalone"] if args.mode == "both" else [args.mode]
    warms = [16, 0] if args.ab else [16]
    for m in modes:
        for w in warms:
            report(run_case(args, m, w, args.decode and m == modes[0] and w == warms[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
