"""bench_py_kv's A/B runner (--case, --runs), without a GPU: the cases run
alternated with their own options, and the closing table holds each run's
ratios to the pinned copy and the decode slowdowns, computed as the report
computes them.  (The benchmark itself needs CUDA; this keeps the part that
spends scarce device time from failing there.)"""
import argparse
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "python", "bench_py_kv.py")


@pytest.fixture()
def bench():
    spec = importlib.util.spec_from_file_location("bench_py_kv_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _result(args, mode, step_one):
    return {"bytes": 100e6, "mode": mode, "warm": 16, "head_blocks": args.head_blocks,
            "blocks": 625, "object_bytes": 160000, "layout": "mini", "register_s": 0.1,
            "base_h2d": [2.0e-3, 2.5e-3], "base_d2h": [2.0e-3], "base_both": [4.0e-3],
            "base_first_h2d": 2.0e-3, "base_first_d2h": 2.0e-3,
            "first_store": 2.5e-3, "first_restore": 4.0e-3,
            "store": [2.2e-3, 2.1e-3, 2.3e-3], "restore": [2.0e-3, 2.5e-3, 3.0e-3], "both": [5e-3],
            "decode_alone": [3e-3], "decode_gpu_alone": [2.0e-3], "decode_one": [3e-3],
            "decode_gpu_one": [step_one], "decode_pinned": [3e-3], "decode_gpu_pinned": [2.01e-3],
            "decode_busy": [3e-3], "decode_gpu_busy": [2.04e-3], "decode_context": 2048,
            "decode_restores": 4, "decode_graph": True}


def test_cases_alternate_with_their_options_and_the_table_holds_each_run(bench, capsys):
    seen = []

    def run_case(args, mode, warm, decode):
        seen.append((list(args.opt), args.head_blocks, args.no_prewake, decode,
                     getattr(args, "busy_ms", 0), getattr(args, "idle_ms", 0)))
        return _result(args, mode, 2.05e-3 if args.head_blocks == 64 else 2.06e-3)

    bench.run_case = run_case
    args = argparse.Namespace(opt=["log_level=warn"], head_blocks=None, runs=2, mode="embedded",
                              decode=True, no_prewake=False, busy_ms=0, idle_ms=0,
                              pin_warm=False)
    bench.run_ab(args, [bench.parse_case("base:"),
                        bench.parse_case("few:gpu_max_ctas=16,gpu_threads_per_cta=32,head=64,prewake=0,"
                                         "busy=50,idle=300")])
    few = (["log_level=warn", "gpu_max_ctas=16", "gpu_threads_per_cta=32"], 64, True, True, 50, 300)
    assert seen == [(["log_level=warn"], None, False, True, 0, 0), few] * 2
    # cases copy the args
    assert args.opt == ["log_level=warn"] and args.head_blocks is None and not args.no_prewake
    out = capsys.readouterr().out
    table = out[out.index("| case | run |"):].splitlines()
    assert table[0] == ("| case | run | first store | first restore | store median | restore median "
                        "| decode, one restore | decode, pinned copy | decode, back to back |")
    # store: the best pinned copy (2.0 ms) over the median (2.2 ms); restore likewise (2.5 ms)
    assert table[2] == "| base | 1 | 0.800× | 0.500× | 0.909× | 0.800× | +3.0 % | +0.5 % | +2.0 % |"
    assert table[3] == "| few | 1 | 0.800× | 0.500× | 0.909× | 0.800× | +2.5 % | +0.5 % | +2.0 % |"
    assert [r.split(" | ")[:2] for r in table[4:6]] == [["| base", "2"], ["| few", "2"]]
    # each report: the link's own spread, each pinned copy against the best (2.0 of 2.0, 2.5 ms)
    assert ("pinned copies host to device, each against the best, min / p10 / median: "
            "0.800 / 0.800 / 0.900") in out
    assert ("pinned copies device to host, each against the best, min / p10 / median: "
            "1.000 / 1.000 / 1.000") in out


def test_a_case_names_its_options(bench):
    assert bench.parse_case("base:") == ("base", [], None, True, {})
    assert bench.parse_case("x:a=1,head=8,b=c,prewake=0") == ("x", ["a=1", "b=c"], 8, False, {})
    assert bench.parse_case("x:headbytes=0") == ("x", [], None, True, {"head_bytes": 0})
    assert bench.parse_case("x:bufs=0") == ("x", [], None, True, {"no_block_bufs": True})
    assert bench.parse_case("x:ids=array") == ("x", [], None, True, {"ids": "array"})
    with pytest.raises(SystemExit, match="ids must be list or array"):
        bench.parse_case("x:ids=tuple")
    with pytest.raises(SystemExit, match="headbytes must be a byte count"):
        bench.parse_case("x:headbytes=-1")
    assert bench.parse_case("x:busy=50,idle=0,pinwarm=1") == (
        "x", [], None, True, {"busy_ms": 50, "idle_ms": 0, "pin_warm": True})
    # the benchmark's own torch operations left cold before the first calls
    assert bench.parse_case("x:coldops=1") == ("x", [], None, True, {"cold_bench_ops": True})
    with pytest.raises(SystemExit, match="coldops must be 0 or 1"):
        bench.parse_case("x:coldops=yes")
    with pytest.raises(SystemExit, match="busy must be milliseconds"):
        bench.parse_case("x:busy=-1")
    with pytest.raises(SystemExit, match="prewake must be 0 or 1"):
        bench.parse_case("x:prewake=no")
    with pytest.raises(SystemExit, match="not NAME=VALUE"):
        bench.parse_case("x:gpu_max_ctas")
    with pytest.raises(SystemExit, match="head must be a block count"):
        bench.parse_case("x:head=many")


def test_a_case_without_a_decode_leaves_its_cells_empty(bench, capsys):
    """A mode whose results lack the decode numbers (one case decoded, one
    not) still prints the table, with empty cells."""
    bench.run_case = lambda args, mode, warm, decode: (
        _result(args, mode, 2.06e-3) if args.head_blocks is None else
        {k: v for k, v in _result(args, mode, 0).items() if not k.startswith("decode")})
    args = argparse.Namespace(opt=None, head_blocks=None, runs=1, mode="embedded", decode=True,
                              no_prewake=False)
    bench.run_ab(args, [bench.parse_case("a:"), bench.parse_case("b:head=8")])
    rows = capsys.readouterr().out.split("| case | run |")[1].splitlines()
    assert rows[3].startswith("| b | 1 | 0.800× |") and rows[3].endswith("|  |  |  |")


def test_line_timer_charges_each_umbp_line_and_ranks_the_first_calls_excess(bench, tmp_path,
                                                                            monkeypatch):
    """--trace-submit: time in what a line calls counts to that line (here a
    sleep, and a nested umbp function's lines to their own), lines outside
    the umbp package are not traced, and the first call's lines are ranked
    by their excess over the steady calls' median.  The timer reads a clock
    that only the sleeps advance, so every line's time is exact."""
    class Clock:
        now = 0

        def perf_counter_ns(self):
            return self.now

        def sleep(self, s):
            self.now += int(s * 1e9)

    clock = Clock()
    monkeypatch.setattr(bench, "time", clock)
    pkg = tmp_path / "umbp"
    pkg.mkdir()
    (pkg / "fake_mod.py").write_text(
        "def inner(sleep, s):\n"
        "    sleep(s)\n"                # line 2
        "def outer(sleep, s, t):\n"
        "    inner(sleep, s); sleep(0.004)\n"  # line 4: inner's lines are its own
        "    sleep(t)\n"                # line 5
        "    return 1\n")
    spec = importlib.util.spec_from_file_location("fake_umbp_mod", pkg / "fake_mod.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t = bench.LineTimer()
    traces = []
    for first in (True, False, False, False):
        t.start()
        assert mod.outer(clock.sleep, 0.002, 0.03 if first else 0.001) == 1
        traces.append(t.stop())
    first = traces[0]
    # after inner returns, line 4 goes on (its second sleep is line 4's)
    assert first == {("fake_mod.py", 2): 2000000, ("fake_mod.py", 4): 4000000,
                     ("fake_mod.py", 5): 30000000, ("fake_mod.py", 6): 0}, first
    assert all(s[("fake_mod.py", 5)] == 1000000 for s in traces[1:]), traces
    lines = bench.LineTimer.excess(first, traces[1:], "first call", top=3)
    assert lines[0].startswith("traced submit, first call: 36000 us against a steady median "
                               "of 7000 us"), lines
    assert lines[1].split()[:2] == ["fake_mod.py:5", "+29000.0"], lines  # the excess ranks first


def _x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_timeline_measures_the_links_busy_time_gaps_and_ends_from_the_trace(bench):
    """--timeline's reading of a torch.profiler chrome trace: a store whose
    submit starts at 1000 us, two kernels, three copies with gaps of 4 and 10
    us between them (one overlapping its predecessor by 5 us), the wait ending
    30 us after the last copy; events outside the call (a poison before it)
    and instant events are not counted."""
    ev = [
        _x("kernel", "poison", 900, 50),  # before the call: not its
        _x("user_annotation", "umbp_submit", 1000, 200),
        _x("kernel", "gather", 1100, 20),
        _x("gpu_memcpy", "Memcpy DtoH", 1130, 100, bytes=1000000),
        _x("kernel", "gather", 1150, 20),
        _x("gpu_memcpy", "Memcpy DtoH", 1234, 100, bytes=1000000),   # gap 4 after copy 0
        _x("gpu_memcpy", "Memcpy DtoH", 1329, 101, bytes=2000000),   # overlaps copy 1 by 5
        {"ph": "i", "cat": "gpu_memcpy", "name": "marker", "ts": 1400},
        _x("user_annotation", "umbp_wait", 1200, 260),               # ends at 1460
    ]
    line = bench.timeline({"traceEvents": ev}, "store 2")
    # busy: 100 + 100 + (1430 - 1334) = 296 us for 4 MB: 13.5 GB/s; one gap of 4
    # (the overlap is no gap); the copies end at 1430, the wait at 1460
    assert line == ("store 2: wall 460 us (submit 200); to the first kernel 100, first copy 130; "
                    "3 copies busy 296 us, 13.5 GB/s while busy; idle between them 4 us in 1 gaps "
                    "(0 of 5 us or more; largest 4@0); 2 kernels; after the last copy 30 us")
    ev[6] = _x("gpu_memcpy", "Memcpy DtoH", 1344, 86, bytes=2000000)  # a gap of 10 after copy 1
    line = bench.timeline({"traceEvents": ev}, "store 2")
    assert "busy 286 us" in line and "idle between them 14 us in 2 gaps" in line
    assert "(1 of 5 us or more; largest 10@1, 4@0)" in line
    # what a trace without the annotations or without copies says
    assert bench.timeline({"traceEvents": ev[2:4]}, "x") == "x: no annotation in the trace"
    assert bench.timeline({"traceEvents": ev[1:3] + ev[8:]}, "x") == \
        "x: wall 460 us, no copy in the trace"
