"""The engine-order scenarios.  Each builds an Engine, runs requests through
the real connector and runtime, checks its own claims (HarnessError on
failure) and ends with Engine.check_clean(): every block back in the pool,
every job completed and released, nothing held.  They return a dict of what
they saw, for the tests to check further.

They run in the test process, or (old vLLM API) in a subprocess started with
FAKE_VLLM_API=old via ``python -m vllm_harness.scenarios NAME JSON``.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from . import model
from .config import FULL, MAMBA, SWA, HarnessConfig
from .engine import Engine, HarnessError

PROMPT = list(range(1, 100))  # 99 tokens: 6 full blocks of 16, hit capped at 96 tokens


def _cfg(**kw) -> HarnessConfig:
    given = dict(kw.pop("extra", {}) or {})
    extra = {} if given.get("mode") == "standalone" else {"capacity_bytes": "16MiB"}
    extra.update(given)
    groups = kw.pop("groups", None)
    if groups is not None:
        kw["groups"] = [tuple(g) for g in groups]
    return HarnessConfig(extra=extra, **kw)


@contextlib.contextmanager
def engine(**kw):
    e = Engine(_cfg(**kw))
    try:
        yield e
    finally:
        e.shutdown()


def _needed(e, k):
    """Positions of each group a hit of k blocks loads (identity.GroupInfo.needed)."""
    from umbp.vllm.identity import describe_groups

    gi = describe_groups(e.cfg.kv_cache_config(), e.cfg.vllm_config().cache_config)
    return {g.index: list(g.needed(0, k)) for g in gi}


def _run_until_loaded(e, rid):
    """Steps until rid's load has completed and before its blocks can change
    (sliding-window and Mamba blocks are freed as it computes on): after the
    step that ran a synchronous load, or once an async load is reported."""
    planned = []

    def note(so):
        meta = so.kv_connector_metadata
        planned.append(any(p.req_id == rid for p in meta.loads))

    for _ in range(200):
        so = e.step(before_execute=note)
        req = e.sched.requests.get(rid)
        if req is None:
            raise HarnessError(f"{rid} finished before its load was seen")
        if rid in e.sched.finished_recving:
            return
        if planned[-1] and not any(p.is_async for p in so.kv_connector_metadata.loads if p.req_id == rid):
            return
        if so.total_num_scheduled_tokens == 0:
            time.sleep(0.001)
    raise HarnessError(f"{rid} never loaded")


def _check_restored_bytes(e, rid, k, hashes):
    """Every block restored for rid equals the pool's object byte for byte, on every rank."""
    tables = e.sched.req_blocks[rid]
    checked = 0
    for g, pos in _needed(e, k).items():
        for w in e.workers:
            objs = w.object_bytes(g, [hashes[p] for p in pos])
            for p, obj in zip(pos, objs):
                if obj is None:
                    raise HarnessError(f"{rid}: object of group {g} position {p} missing on rank")
                got = w.block_bytes(g, tables[g][p])
                if got != obj:
                    raise HarnessError(f"{rid}: group {g} block {p} restored bytes differ from the stored object")
                checked += 1
    return checked


def restore(**kw):
    """Cache hit restore: A stores its prompt; every KV byte is poisoned; B
    (same prompt) restores it; B's restored blocks equal the stored objects
    exactly and both generate the model's tokens."""
    mt = kw.pop("max_tokens", 6)
    with engine(**kw) as e:
        a = e.add("A", PROMPT, mt)
        e.run()
        e.check_clean()
        for w in e.workers:
            w.poison()
        e.add("B", PROMPT, mt)
        _run_until_loaded(e, "B")
        sc = e.cfg.block_size // (e.cfg.hash_block_size or e.cfg.block_size)
        nbytes = _check_restored_bytes(e, "B", 6, list(a.block_hashes)[sc - 1::sc])
        e.run()
        e.check_outputs({"A": PROMPT, "B": PROMPT}, mt)
        m = e.matched("B")
        if m is None or m[1] != 96:
            raise HarnessError(f"B matched {m}, expected 96 external tokens")
        if e.bad:
            raise HarnessError(f"forward passes saw wrong KV: {e.bad}")
        c = e.check_clean()
        return {"matched": m, "checked_blocks": nbytes, "counters": c, "steps": e.steps}


def partial(**kw):
    """Partial hits: B shares A's first 3 blocks; with a local prefix-cache hit
    of 1 block, the connector answers only the 2 blocks beyond it."""
    local = kw.pop("local_prefix_cache", False)
    with engine(local_prefix_cache=local, **kw) as e:
        a = e.add("A", PROMPT, 3)
        e.run()
        shared = PROMPT[:48]
        pb = shared + [500 + i for i in range(40)]
        if local:
            keep = a.block_hashes[0]
            for h in list(e.sched.pool.cached):
                if h != keep:
                    b = e.sched.pool.cached.pop(h)
                    e.sched.pool.block_hash.pop(b, None)
        keep_blocks = [e.sched.pool.cached[a.block_hashes[0]]] if local else []
        for w in e.workers:
            w.poison(-7.0, keep_blocks)  # the locally cached block keeps A's data
        e.add("B", pb, 3)
        e.run()
        e.check_outputs({"A": PROMPT, "B": pb}, 3)
        m = e.matched("B")
        want = (16, 32) if local else (0, 48)
        if m is None or (m[0], m[1]) != want:
            raise HarnessError(f"B matched {m}, expected local/external {want}")
        loaded = sum(w.counters()["blocks_loaded_by_group"].get(0, 0) for w in e.workers)
        if loaded != (want[1] // 16) * len(e.workers):
            raise HarnessError(f"{loaded} blocks loaded, expected {want[1] // 16} per rank")
        return {"matched": m, "counters": e.check_clean()}


def preemption(**kw):
    """Two requests outgrow the block pool while decoding: one is preempted
    (handle_preemptions sees it, in-flight stores of it are waited for), resumes
    with its stored prefix restored from umbp, and both finish correctly."""
    kw.setdefault("num_blocks", 14)
    kw.setdefault("max_num_batched_tokens", 128)
    mt = kw.pop("max_tokens", 44)  # 2 x 7 blocks > 13: one is preempted, and resumed ones cannot wedge the pool
    with engine(**kw) as e:
        pa, pb = list(range(1, 61)), list(range(1000, 1060))
        e.add("A", pa, mt)
        e.add("B", pb, mt)
        e.run()
        e.check_outputs({"A": pa, "B": pb}, mt)
        if e.sched.preempted_total == 0:
            raise HarnessError("no preemption happened")
        pre = [r for what, r, _ in e.sched.log if what == "preempted"]
        seen = set()
        for w in e.workers:
            for _kind, ids in w.get_preemption_args():
                seen |= ids
        if not set(pre) <= seen:
            raise HarnessError(f"handle_preemptions saw {seen}, preempted {pre}")
        resumed = [v for what, r, v in e.sched.log if what == "matched" and r in pre and v[1]]
        if not resumed:
            raise HarnessError("the preempted request restored nothing from umbp on resume")
        if e.bad:
            raise HarnessError(f"forward passes saw wrong KV: {e.bad}")
        return {"preempted": pre, "resumed_matches": resumed, "counters": e.check_clean()}


def abort(**kw):
    """Aborts: B aborted while its async load is in flight (freed on
    finished_recving); C aborted mid-prefill with its stores in flight
    (request_finished says delay; freed once every worker reports the store)."""
    kw.setdefault("max_num_batched_tokens", 32)
    with engine(**kw) as e:
        e.add("A", PROMPT, 2)
        e.run()
        e.add("B", PROMPT, 2)

        def abort_b(so):
            meta = so.kv_connector_metadata
            if any(p.req_id == "B" for p in meta.loads):
                e.abort("B")

        e.step(before_execute=abort_b)
        fin = [v for what, r, v in e.sched.log if what == "request_finished" and r == "B"]
        if fin != [True]:
            raise HarnessError(f"request_finished(B) during its load returned {fin}, expected delay")
        e.run()
        for w in e.workers:
            w.hold_stores(True)
        e.add("C", list(range(3000, 3099)), 2)
        e.step()
        e.step()
        e.abort("C")
        fin = [v for what, r, v in e.sched.log if what == "request_finished" and r == "C"]
        if fin != [True]:
            raise HarnessError(f"request_finished(C) with stores in flight returned {fin}")
        for _ in range(3):
            e.step()
        if "C" not in e.sched.delayed:
            raise HarnessError("C's blocks were released while its stores were held in flight")
        for w in e.workers:
            w.hold_stores(False)
        e.run()
        return {"counters": e.check_clean()}


def store_inflight(**kw):
    """A store still in flight at request_finished: delay_free is True, the
    blocks stay allocated until every worker reports the store done."""
    with engine(**kw) as e:
        for w in e.workers:
            w.hold_stores(True)
        e.add("A", PROMPT, 2)
        for _ in range(6):
            e.step()
        if "A" not in e.sched.delayed:
            raise HarnessError(f"A not held: log {e.sched.log[-4:]}")
        held_blocks = e.cfg.num_blocks - 1 - e.sched.pool.num_free()
        if held_blocks == 0:
            raise HarnessError("A's blocks were returned while its stores were in flight")
        inflight = [w.counters()["jobs_inflight"] for w in e.workers]
        for w in e.workers:
            w.hold_stores(False)
        e.run()
        e.check_outputs({"A": PROMPT}, 2)
        freed = [v for what, r, v in e.sched.log if what == "freed" and r == "A"]
        return {"held_blocks": held_blocks, "inflight_while_held": inflight, "freed_step": freed,
                "counters": e.check_clean()}


def reset(**kw):
    """reset_cache(): the pool is cleared; the same prompt then misses.
    via_workers: the scheduler cannot clear it itself (separate processes):
    the workers clear on the next step and lookups miss until they have."""
    via_workers = kw.pop("via_workers", False)
    with engine(**kw) as e:
        e.add("A", PROMPT, 2)
        e.run()
        sch = e.conn._scheduler
        if via_workers:
            sch.backend.clear = lambda: None
        if e.conn.reset_cache() is not True:
            raise HarnessError("reset_cache() did not return True")
        e.add("B", PROMPT, 2)
        e.run()
        m = e.matched("B")
        if m is None or m[1] != 0:
            raise HarnessError(f"B matched {m} after reset_cache")
        e.check_outputs({"A": PROMPT, "B": PROMPT}, 2)
        e.add("C", PROMPT, 2)  # B stored it again
        e.run()
        m2 = e.matched("C")
        if m2 is None or m2[1] != 96:
            raise HarnessError(f"C matched {m2} after B stored the prompt again")
        return {"counters": e.check_clean()}


def failed_load(**kw):
    """A failed load: between B's lookup and its load the objects of blocks
    >= keep disappear from one rank's pool; that rank reports their block ids
    (get_block_ids_with_load_errors), vLLM truncates and recomputes, B's
    tokens are right, and B stores the blocks again.  With a quarantine, C
    (same prompt) counts the failed blocks as misses even though B stored them
    again; without, C hits everything."""
    keep = kw.pop("keep", 2)
    fail_rank = kw.pop("fail_rank", -1)
    # extend > 16: B's load step also computes full blocks (from the partly bad
    # KV: with TP, on every rank); none of them may reach the pool
    pb = PROMPT + [2000 + i for i in range(kw.pop("extend", 0))]
    with engine(**kw) as e:
        a = e.add("A", PROMPT, 3)
        e.run()
        e.add("B", pb, 3)
        hashes = list(a.block_hashes[:6])
        done = []

        def sabotage(so):
            meta = so.kv_connector_metadata
            if not done and any(p.req_id == "B" for p in meta.loads):
                w = e.workers[fail_rank]
                shared = e.cfg.extra.get("mode") == "standalone"
                for g in range(len(e.cfg.groups)):
                    w.remove_objects(g, hashes, keep, list(range(e.cfg.tp)) if shared else None)
                done.append(so._harness_step)

        e.run(before_execute=sabotage)
        if not done:
            raise HarnessError("B never planned a load")
        e.check_outputs({"A": PROMPT, "B": pb}, 3)
        trunc = [v for what, r, v in e.sched.log if what == "truncated" and r == "B"]
        if not trunc or trunc[0][1] != keep * 16:
            raise HarnessError(f"B truncated {trunc}, expected to {keep * 16} tokens")
        e.add("C", pb, 3)
        e.run()
        e.check_outputs({"C": pb}, 3)
        # B's own forward with the failed synchronous load saw the hole (and, with
        # async scheduling, the step after it): vLLM discards those outputs.
        # Nothing else may ever read a wrong byte; an async load fails before B runs.
        sync = not e.cfg.extra.get("load_async", True)
        wrong = [(st, r) for st, r in e.bad if r != "B" or not sync]
        if wrong:
            raise HarnessError(f"forward passes saw wrong KV: {wrong}")
        m = e.matched("C")
        wm = [w.counters() for w in e.workers]
        return {"truncated": trunc, "matched_C": m, "workers": wm, "counters": e.check_clean(),
                "failed_seen": list(e.agg.failed_seen)}


def failed_load_fails(**kw):
    """kv_load_failure_policy "fail": B's load fails (its objects vanish
    between lookup and load); vLLM ends B with FINISHED_ERROR, frees its
    blocks once the connector lets go, A and C are served, and nothing
    leaks.  No forward reads wrong KV that a token comes from."""
    kw.setdefault("load_failure_policy", "fail")
    with engine(**kw) as e:
        a = e.add("A", PROMPT, 3)
        e.run()
        e.add("B", PROMPT, 3)
        hashes = list(a.block_hashes[:6])
        done = []

        def sabotage(so):
            if not done and any(p.req_id == "B" for p in so.kv_connector_metadata.loads):
                for w in e.workers:
                    for g in range(len(e.cfg.groups)):
                        w.remove_objects(g, hashes, 2)
                done.append(so._harness_step)

        e.run(before_execute=sabotage)
        if not done:
            raise HarnessError("B never planned a load")
        failed = [r for what, r, _v in e.sched.log if what == "failed_error"]
        if failed != ["B"]:
            raise HarnessError(f"requests ended with FINISHED_ERROR: {failed}, expected ['B']")
        if model.GARBAGE in e.sched.outputs["B"]:
            raise HarnessError(f"B emitted a token computed from wrong KV: {e.sched.outputs['B']}")
        e.add("C", PROMPT, 3)
        e.run()
        e.check_outputs({"A": PROMPT, "C": PROMPT}, 3)
        return {"failed": failed, "B": e.sched.outputs["B"], "counters": e.check_clean()}


def hybrid(**kw):
    """Full + sliding-window + Mamba groups: a restore loads only the window's
    blocks of the SWA group and one state block of the Mamba group; stores write
    only the window (+1) of each step's end and block-aligned Mamba states.
    On the "hma" engine (no real vLLM: see vllm/v1/core/sched/scheduler.py),
    the one where the connector promises multi-group hits."""
    kw.setdefault("groups", [(FULL, 2, 0), (SWA, 2, 32), (MAMBA, 1, 0)])
    kw.setdefault("engine", "hma")
    out = restore(**kw)
    loaded = [w["blocks_loaded_by_group"] for w in out["counters"]["workers"]]
    stored = [w["blocks_stored_by_group"] for w in out["counters"]["workers"]]
    out["loaded"], out["stored"] = loaded, stored
    return out


def reused_source_blocks(**kw):
    """Stores whose source blocks vLLM frees and reallocates in the next step
    (sliding-window blocks leaving the window; Mamba state blocks).  A's
    prompt is computed in chunks on a pool with no spare block, so every
    block that leaves the window is reallocated and zeroed by the next step's
    _update_states; the harness's stores read their source as late as the
    engine allows (worker.LateStore).  Then requests whose prompts are
    prefixes of A's restore each window A stored: every restored block must
    hold A's KV (a store that read a zeroed block published zeros under a
    valid key: the forward sees wrong KV and generates GARBAGE)."""
    mt = kw.pop("max_tokens", 2)
    n = kw.pop("prompt_blocks", 10)
    kw.setdefault("groups", [(FULL, 1, 0), (SWA, 1, 32)])
    kw.setdefault("engine", "hma")
    kw.setdefault("max_num_batched_tokens", 64)  # 4 blocks a chunk: a window block is freed the step after its store
    kw.setdefault("num_blocks", 15)  # A's 10 full-attention blocks + 4 window blocks: no spare block
    prompt = list(range(1, 16 * n + 1))
    with engine(**kw) as e:
        e.add("A", prompt, mt)
        e.run()
        e.check_clean()
        prompts = {"A": prompt}
        for k in range(3, n):
            rid = f"B{k}"
            prompts[rid] = prompt[:16 * k + 1]
            e.add(rid, prompts[rid], mt)
            e.run()
        e.check_outputs(prompts, mt)
        if e.bad:
            raise HarnessError(f"forward passes saw wrong KV: {e.bad}")
        loaded = [w["blocks_loaded_by_group"] for w in e.counters()["workers"]]
        c = e.check_clean()
        return {"loaded": loaded, "counters": c, "matched": {r: e.matched(r) for r in prompts}}


def events(**kw):
    """KV events from the runtime's events: BlockStored once every rank holds a
    block, BlockRemoved after reset_cache clears it."""
    kw.setdefault("extra", {})
    kw["extra"] = dict(kw["extra"], enable_events=True)
    with engine(**kw) as e:
        a = e.add("A", PROMPT, 2)
        e.run()
        if e.conn._scheduler.events.lost:
            raise HarnessError(f"{e.conn._scheduler.events.lost} event batches could not be built")
        stored = [ev for ev in e.sched.events if type(ev).__name__ == "BlockStored"]
        # vLLM's own events carry maybe_convert_block_hash(hash): by default
        # (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1) the low 64 bits, big-endian
        as_int = os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0"
        hs = [int.from_bytes(h, "big") & ((1 << 64) - 1) if as_int else h for h in a.block_hashes[:6]]
        got = [ev.block_hashes[0] for ev in stored]
        if got != hs:
            raise HarnessError(f"BlockStored for {len(got)} blocks, expected A's 6 in order: {got} != {hs}")
        for i, ev in enumerate(stored):
            if ev.parent_block_hash != (hs[i - 1] if i else None) or list(ev.token_ids) != PROMPT[16 * i:16 * i + 16]:
                raise HarnessError(f"BlockStored {i}: parent/token_ids wrong: {ev}")
            if ev.block_size != 16:
                raise HarnessError(f"BlockStored {i}: block_size {ev.block_size}")
            if getattr(ev, "lora_name", None) is not None or ev.lora_id is not None or ev.medium != "CPU":
                raise HarnessError(f"BlockStored {i}: lora/medium wrong: {ev}")
        e.conn.reset_cache()
        e.add("B", [7] * 20, 1)  # a step, so that the workers drain the clear's events
        e.run()
        removed = [ev.block_hashes[0] for ev in e.sched.events if type(ev).__name__ == "BlockRemoved"]
        if set(hs) - set(removed):
            raise HarnessError(f"BlockRemoved missing for {len(set(hs) - set(removed))} blocks")
        if set(removed) - set(got):
            raise HarnessError(f"BlockRemoved for {len(set(removed) - set(got))} blocks never announced")
        return {"stored": len(stored), "removed": len(removed), "counters": e.check_clean()}


def unrecoverable(**kw):
    """A configuration where the engine cannot recover from a failed load (or
    a completed async load, or any external token): A stores its prompt, B
    (same prompt) comes, and any load planned for B loses its objects first,
    so that a connector which promised B a hit must report invalid blocks.
    The engine must survive, B must be computed right (from scratch), and A's
    blocks must still be stored."""
    with engine(**kw) as e:
        e.add("A", PROMPT, 3)
        e.run()
        stored = [w.counters()["blocks_stored_by_group"] for w in e.workers]
        e.add("B", PROMPT, 3)
        hashes = [h for h in e.sched.requests["B"].block_hashes[:6]]
        planned = []

        def sabotage(so):
            meta = so.kv_connector_metadata
            if not planned and any(p.req_id == "B" for p in meta.loads):
                for g in range(len(e.cfg.groups)):
                    e.workers[0].remove_objects(g, hashes, 0, None)
                planned.append(so._harness_step)

        e.run(before_execute=sabotage)
        e.check_outputs({"A": PROMPT, "B": PROMPT}, 3)
        if e.bad:
            raise HarnessError(f"forward passes saw wrong KV: {e.bad}")
        return {"matched": e.matched("B"), "planned": planned, "stored": stored, "counters": e.check_clean()}


def lookup_async(**kw):
    """lookup_async: get_num_new_matched_tokens answers (None, False) until the
    lookup finished on the pool; the request is asked again and restores."""
    kw.setdefault("extra", {})
    kw["extra"] = dict(kw["extra"], lookup_async=True)
    with engine(**kw) as e:
        e.add("A", PROMPT, 2)
        e.run()
        e.add("B", PROMPT, 2)
        e.run()
        e.check_outputs({"A": PROMPT, "B": PROMPT}, 2)
        answers = [v for what, r, v in e.sched.log if what == "matched" and r == "B"]
        if not answers or answers[0][1] is not None or answers[-1][1] != 96:
            raise HarnessError(f"B's answers {answers}: expected None first, then 96")
        return {"answers": answers, "counters": e.check_clean()}


def roles(**kw):
    """kv_consumer loads but never stores; kv_producer stores but never looks up."""
    out = {}
    for role in ("kv_producer", "kv_consumer"):
        with engine(kv_role=role, **kw) as e:
            e.add("A", PROMPT, 2)
            e.run()
            e.add("B", PROMPT, 2)
            e.run()
            e.check_outputs({"A": PROMPT, "B": PROMPT}, 2)
            c = e.check_clean()
            out[role] = {"matched": e.matched("B"),
                         "stored": sum(sum(w["blocks_stored_by_group"].values()) for w in c["workers"])}
    return out


def server_death(kill, **kw):
    """Standalone: the server dies after A stored its prompt.  B's lookups miss
    (it recomputes), stores fail without raising, nothing hangs."""
    with engine(**kw) as e:
        e.add("A", PROMPT, 2)
        e.run()
        kill()
        t0 = time.monotonic()
        e.add("B", PROMPT, 2)
        e.run()
        e.check_outputs({"A": PROMPT, "B": PROMPT}, 2)
        m = e.matched("B")
        if m is None or m[1] != 0:
            raise HarnessError(f"B matched {m} with the server dead")
        return {"matched": m, "seconds": time.monotonic() - t0, "counters": e.check_clean()}


SCENARIOS = {f.__name__: f for f in (restore, partial, preemption, abort, store_inflight, reset, failed_load,
                                     hybrid, events, lookup_async, roles, unrecoverable, reused_source_blocks,
                                     failed_load_fails)}


def main(argv):
    name, kw = argv[1], json.loads(argv[2]) if len(argv) > 2 else {}
    res = SCENARIOS[name](**kw)
    print("SCENARIO-RESULT " + json.dumps(res, default=repr))


if __name__ == "__main__":
    main(sys.argv)
