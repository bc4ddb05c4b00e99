#!/usr/bin/python3
"""bench_vllm_step - engine-side Python time per step of the vLLM connector.

Drives the engine-order harness (connector/tests/vllm_harness: the REAL
umbp.vllm connector over the REAL runtime, CPU torch tensors as KV caches,
copied by the library's host backend, a fake vllm package) with

  store   a request of --blocks full blocks (block size 16, so 8192 tokens
          for 512) prefilled in one step: its blocks are planned
          (build_connector_meta) and submitted (wait_for_save) as stores
  hit     a second request with the same prompt: it hits all of them
          (get_num_new_matched_tokens), its loads are planned
          (update_state_after_alloc) and submitted (start_load_kv)

and times every connector hook from entry to return (time.perf_counter
around the UMBPConnector method), so the harness's own scheduler and model
time is excluded.  A hook called once per worker (TP=2 in-process: twice a
step) counts each call.  Each round uses fresh prompts (new block hashes, so
every store is new and every hit a real lookup); --rounds rounds, --warmup
of them not counted.  Printed per hook and phase, in microseconds: calls per
round, the median over all calls (most are idle steps), "heaviest": the
median over rounds of the round's heaviest call (the one that does the
512-block work), "of it C": the part of that call spent inside libumbp's
key derivation, submission, lookup and job calls (C_CALLS; the rest is
Python), the max over all calls, and ok/OVER of "heaviest" against
the 200 us target (the project's per-step budget for a 512-block request:
plan, lookup, load); only the hooks whose work grows with the number of
blocks are held to it.

Usage: /usr/bin/python3 bench/python/bench_vllm_step.py [--blocks 512] [--rounds 30]
       [--tp 1,2] [--load sync|async] [--lookup-async] [--profile HOOK]
"""
import argparse
import collections
import cProfile
import os
import pstats
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TESTS = os.path.join(REPO, "connector", "tests")
for p in (os.path.join(TESTS, "vllm_harness"), TESTS, os.path.join(REPO, "connector")):
    if p not in sys.path:
        sys.path.insert(0, p)
if not os.environ.get("UMBP_LIBRARY") and os.path.exists(os.path.join(REPO, "build", "libumbp.so")):
    os.environ["UMBP_LIBRARY"] = os.path.join(REPO, "build", "libumbp.so")

import umbp  # noqa: E402
import umbp.vllm.connector as C  # noqa: E402
import vllm  # noqa: E402,F401  (the harness's fake)
from vllm_harness.config import FULL, HarnessConfig  # noqa: E402
from vllm_harness.engine import Engine  # noqa: E402

TARGET_US = 200.0
HOOKS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
         "update_connector_output", "request_finished", "request_finished_all_groups",
         "bind_connector_metadata", "handle_preemptions", "start_load_kv", "wait_for_layer_load",
         "wait_for_save", "get_finished", "get_transfer_results", "get_block_ids_with_load_errors",
         "build_connector_worker_meta", "get_kv_connector_kv_cache_events", "get_kv_connector_stats",
         "clear_connector_metadata", "take_events")
#: hooks whose work grows with the blocks of a request: held to the target
SCALED = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
          "start_load_kv", "wait_for_save", "update_connector_output", "request_finished",
          "request_finished_all_groups", "get_finished", "get_transfer_results")

times = collections.defaultdict(list)  # (phase, hook) -> [[(us, us in libumbp) of each call] per round]
state = {"phase": None, "round": 0, "profile": None, "prof": None, "in_profile": False}
c_time = [0.0]  # seconds spent inside the timed libumbp calls (any thread)
c_by_name = collections.defaultdict(lambda: [0, 0.0])  # within --profile's hook: name -> [calls, seconds]
#: the libumbp calls of the hot paths: key derivation, block submission, lookups, job polling
C_CALLS = ("umbp_keys_derive", "umbp_kv_store", "umbp_kv_load", "umbp_lookup", "umbp_op_statuses",
           "umbp_op_wait", "umbp_op_release", "umbp_lookup_client_query")


def _wrap_c():
    """Times every C_CALLS function: patched in umbp._lib and in the modules
    that bound it to a global (runtime.py: _kv_store = _lib.umbp_kv_store)."""
    import umbp._lib as L
    import umbp.lookup as LK
    import umbp.runtime as R

    for name in C_CALLS:
        f = getattr(L, name, None) if L.has(name) else None
        if f is None:
            continue

        def timed(*a, _f=f, _name=name):
            t = time.perf_counter()
            try:
                return _f(*a)
            finally:
                dt = time.perf_counter() - t
                c_time[0] += dt
                if state["in_profile"]:
                    e = c_by_name[_name]
                    e[0] += 1
                    e[1] += dt

        setattr(L, name, timed)
        for mod in (R, LK):
            for k, v in list(vars(mod).items()):
                if v is f:
                    setattr(mod, k, timed)


def _wrap(name):
    f = getattr(C.UMBPConnector, name)

    def g(self, *a, **k):
        prof = state["prof"] if state["profile"] == name and state["phase"] else None
        if prof is not None:
            state["in_profile"] = True
            prof.enable()
        c0 = c_time[0]
        t = time.perf_counter()
        try:
            return f(self, *a, **k)
        finally:
            dt = (time.perf_counter() - t) * 1e6
            dc = (c_time[0] - c0) * 1e6
            if prof is not None:
                prof.disable()
                state["in_profile"] = False
            if state["phase"]:
                per = times[(state["phase"], name)]
                while len(per) <= state["round"]:
                    per.append([])
                per[state["round"]].append((dt, dc))

    g.__name__ = name
    setattr(C.UMBPConnector, name, g)


def run(tp, nb, rounds, warmup, load, profile, lookup_async=False):
    times.clear()
    c_by_name.clear()
    state["profile"] = profile
    state["prof"] = cProfile.Profile() if profile else None
    cfg = HarnessConfig(groups=[(FULL, 2, 0)], num_blocks=nb * 2 + 8, max_num_batched_tokens=nb * 16 + 64,
                        tp=tp, extra={"capacity_bytes": "512MiB", "load_async": load == "async",
                                      "lookup_async": lookup_async})
    e = Engine(cfg)
    rng = random.Random(1)
    try:
        for r in range(rounds):
            prompt = [rng.randrange(1000) for _ in range(nb * 16 + 1)]
            counted = r >= warmup
            state["round"] = r - warmup
            state["phase"] = "store" if counted else None
            e.add(f"a{r}", prompt, max_tokens=2)
            e.run()
            state["phase"] = "hit" if counted else None
            e.add(f"b{r}", prompt, max_tokens=2)
            e.run()
            state["phase"] = None
            m = e.matched(f"b{r}")
            if m is None or m[1] != nb * 16:
                raise SystemExit(f"round {r}: expected a hit of {nb * 16} tokens, got {m}")
        e.check_clean()
    finally:
        state["phase"] = None
        e.shutdown()
    return dict(times), state["prof"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--load", choices=("async", "sync"), default="async",
                    help="load_async option (default: async, the connector's default)")
    ap.add_argument("--lookup-async", action="store_true",
                    help="lookup_async option: lookups on the connector's thread pool")
    ap.add_argument("--profile", metavar="HOOK", help="cProfile this hook (counted calls) and print the top")
    args = ap.parse_args()
    for h in HOOKS:
        if hasattr(C.UMBPConnector, h):
            _wrap(h)
    _wrap_c()
    print(f"umbp vLLM connector, Python time per hook call: {args.blocks}-block request "
          f"({args.blocks * 16} tokens, block size 16), load_async={args.load == 'async'}, "
          f"lookup_async={args.lookup_async}, "
          f"{args.rounds - args.warmup} rounds; library {umbp.library_path}")
    worst = {}
    for tp in (int(x) for x in args.tp.split(",")):
        t, prof = run(tp, args.blocks, args.rounds, args.warmup, args.load, args.profile, args.lookup_async)
        print(f"\nTP={tp} (in-process workers)")
        print(f"  {'phase':5s} {'hook':34s} {'calls/rnd':>9s} {'median':>8s} {'heaviest':>9s} {'of it C':>8s} "
              f"{'max':>8s}  target")
        for phase in ("store", "hit"):
            for h in HOOKS:
                per = [x for x in t.get((phase, h), ()) if x]
                if not per:
                    continue
                calls = [d for x in per for d, _c in x]
                med = statistics.median(calls)
                heavy_calls = [max(x) for x in per]
                heavy = statistics.median(d for d, _c in heavy_calls)
                heavy_c = statistics.median(c for _d, c in heavy_calls)
                verdict = ("ok" if heavy <= TARGET_US else "OVER") if h in SCALED else "-"
                if h in SCALED:
                    worst[(tp, phase, h)] = heavy
                print(f"  {phase:5s} {h:34s} {len(calls) / len(per):9.1f} {med:8.1f} {heavy:9.1f} "
                      f"{heavy_c:8.1f} {max(calls):8.1f}  {verdict}")
        if prof is not None:
            print(f"\n  cProfile of {args.profile} (TP={tp}):")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(15)
            for name, (n, sec) in sorted(c_by_name.items(), key=lambda x: -x[1][1]):
                print(f"  libumbp {name:28s} {n:6d} calls {sec / n * 1e6:9.1f} us per call")
    over = [k for k, v in worst.items() if v > TARGET_US]
    print(f"\ntarget {TARGET_US:.0f} us for the heaviest call of a round (median over rounds): "
          + ("all ok" if not over else "OVER: " + ", ".join(f"TP={a} {b} {c}" for a, b, c in over)))


if __name__ == "__main__":
    main()
