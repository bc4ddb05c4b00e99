"""A stand-in vLLM worker: CPU torch KV caches, the REAL connector (WORKER
role) over the REAL runtime, and a fake model forward that checks every value
it attends to (model.py).  The calls follow vLLM's worker order
(connector-api.md §1.4):

    new API, V1 runner (gpu_model_runner.py@000fc94b): handle_preemptions(meta) ->
        _update_states (zeroes reallocated blocks; late stores start after it) ->
        bind_connector_metadata -> start_load_kv (mixin 00f4240e without sync loads:
        after the forward, before wait_for_save)
    new API (V2 runner): bind_connector_metadata -> handle_preemptions(meta) -> start_load_kv
    old API:             handle_preemptions(set) if any -> bind_connector_metadata -> start_load_kv
    then per layer wait_for_layer_load / (attention) / save_kv_layer; wait_for_save (if a forward ran);
    get_transfer_results (new) or get_finished; get_block_ids_with_load_errors; get_kv_connector_stats;
    get_kv_connector_kv_cache_events; build_connector_worker_meta (new); clear_connector_metadata.

``worker_main`` runs one in its own process (TP=2 across processes).
"""
from __future__ import annotations

import importlib
import traceback

import numpy as np
import torch

from . import model
from .config import FULL, MAMBA, SWA
from .engine import HarnessError


class LateStore:
    """A store the connector submitted whose copy has not read its source
    blocks yet.  On a GPU a store's copy runs on its own stream after the
    event recorded on the compute stream, and nothing orders it before the
    next step's block zeroing (_update_states) unless the connector waits for
    it.  The harness takes the worst case the engine allows: the copy starts
    when the connector waits for the job, else right after the next step's
    zeroing (HarnessWorker.start_late_stores), so a store of a block freed and
    reallocated meanwhile reads zeros and publishes them under a valid key.
    poll()/done stay False until the copy has started and completed."""

    __slots__ = ("_launch", "_job")

    def __init__(self, launch):
        self._launch = launch
        self._job = None

    def start(self):
        if self._job is None:
            self._job = self._launch()
            self._launch = None
        return self._job

    def poll(self):
        return self._job is not None and self._job.poll()

    @property
    def done(self):
        return self.poll()

    def wait(self, timeout_ms=None):
        return self.start().wait(timeout_ms)

    @property
    def statuses(self):
        if self._job is None:
            import umbp

            raise umbp.UmbpError(umbp.E_INPROGRESS, "store not started")
        return self._job.statuses

    @property
    def num_ok(self):
        return self.start().num_ok

    def release(self):
        self.start().release()  # released unstarted: a put still completes


class HarnessWorker:
    def __init__(self, cfg, rank: int):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        self.cfg = cfg
        self.rank = rank
        self.B = cfg.block_size
        self.layers = cfg.layers()
        mod = importlib.import_module("umbp.vllm.connector")
        import os

        # what selects vLLM's V2 runner: VLLM_USE_V2_MODEL_RUNNER (vllm.envs),
        # set while the connector is created only (in-process workers share
        # os.environ with later tests); or, left unset, vLLM's own default
        # (VllmConfig.use_v2_model_runner, where this version has it)
        import vllm

        if cfg.runner_selected_by not in ("env", "config"):
            raise HarnessError(f"runner_selected_by {cfg.runner_selected_by!r}: 'env' or 'config'")
        if cfg.runner_selected_by == "config" and vllm.API != "00f4240e":
            raise HarnessError("runner_selected_by 'config' needs VllmConfig.use_v2_model_runner: "
                               "run it with FAKE_VLLM_API=00f4240e")
        before = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
        if cfg.runner_selected_by == "env":
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if cfg.runner.startswith("v2") else "0"
        else:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        try:
            self.conn = mod.UMBPConnector(cfg.vllm_config(rank), KVConnectorRole.WORKER, cfg.kv_cache_config())
        finally:
            if before is None:
                os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
            else:
                os.environ["VLLM_USE_V2_MODEL_RUNNER"] = before
        self.kv = {}
        self.cross = None
        dev = self.dev = torch.device(cfg.device)
        if cfg.cross_layer and self.conn.prefer_cross_layer_blocks:
            # vLLM's cross-layer layout (num_blocks, L, 2, bs, H, D); each layer sees a
            # (2, num_blocks, bs, H, D) view of it
            self.cross = torch.zeros(cfg.num_blocks, len(self.layers), 2, self.B, cfg.heads, cfg.dim, device=dev)
            for name, _g, _kind, i in self.layers:
                self.kv[name] = self.cross[:, i].transpose(0, 1)
            self.conn.register_cross_layers_kv_cache(self.cross, None)
        else:
            for name, g, kind, _i in self.layers:
                if kind == MAMBA:
                    self.kv[name] = [torch.zeros(cfg.num_blocks, cfg.conv_size, device=dev),
                                     torch.zeros((cfg.num_blocks,) + tuple(cfg.ssm_shape), device=dev)]
                else:
                    self.kv[name] = torch.zeros(2, cfg.num_blocks, self.B, cfg.heads, cfg.dim, device=dev)
            self.conn.register_kv_caches(dict(self.kv))
        import vllm

        if (getattr(cfg, "mixin", "") == "00f4240e" or cfg.runner == "v2-0036d38d") and vllm.API != "00f4240e":
            raise HarnessError("mixin 00f4240e and the V2 runner @0036d38d pair with base.py@00f4240e: "
                               "run them with FAKE_VLLM_API=00f4240e")
        self.late = []  # LateStore jobs not started yet
        if cfg.late_stores:
            rt = self.conn._worker.rt
            real = rt.store_blocks

            def store_blocks(*a, **kw):
                j = LateStore(lambda: real(*a, **kw))
                self.late.append(j)
                return j

            rt.store_blocks = store_blocks
        self.reqs = {}  # rid -> per-group block ids
        self.digest_cache = {}  # rid -> (tokens, digests)
        self.calls = []  # connector calls of the last step, for order checks
        self.preemption_args = []

    # ---- helpers ------------------------------------------------------------------

    def _digests(self, rid, tokens):
        prev = self.digest_cache.get(rid)
        if prev is not None and len(prev[0]) <= len(tokens) and tokens[:len(prev[0])] == prev[0]:
            d = list(prev[1])
            model.digests(tokens, d)
        else:
            d = model.digests(tokens)
        self.digest_cache[rid] = (list(tokens), d)
        return d

    def _pos_index(self, ids, positions):
        blocks = torch.as_tensor([ids[p // self.B] for p in positions], dtype=torch.long, device=self.dev)
        offs = torch.as_tensor([p % self.B for p in positions], dtype=torch.long, device=self.dev)
        return blocks, offs

    def _put(self, x):
        return torch.from_numpy(x).to(self.dev)

    def _zero_new_blocks(self, so):
        """The V1 runner's _update_states (gpu_model_runner.py@000fc94b):
        _zero_block_ids(new_block_ids_to_zero), then kv_cache_block_copies, on
        the blocks the scheduler allocated in this step (async-load
        destinations excepted).  The bytes are overwritten in every layer (a
        block id belongs to one group): a store still to read a freed and
        reallocated block reads these zeros."""
        zero = getattr(so, "_harness_zero", None) or set()
        if not zero:
            return
        idx = torch.tensor(sorted(zero), dtype=torch.long)
        for name, *_ in self.layers:
            t = self.kv.get(name) if isinstance(self.kv, dict) else None
            if t is None:
                continue
            if isinstance(t, list):
                for x in t:
                    x[idx.to(x.device)] = 0
            else:
                t[:, idx.to(t.device)] = 0

    def _update_states(self, so):
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)
            self.digest_cache.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            self.reqs[nr.req_id] = [list(x) for x in nr.block_ids]
        c = so.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            nb = c.new_block_ids[i]
            if rid in c.resumed_req_ids or rid not in self.reqs:
                self.reqs[rid] = [list(x) for x in nb] if nb else [[] for _ in self.cfg.groups]
            elif nb:
                for g, x in enumerate(nb):
                    self.reqs[rid][g].extend(x)

    def _new_mixin(self) -> bool:
        cfg = self.cfg
        return cfg.api == "new" and cfg.runner == "v1" and getattr(cfg, "mixin", "") == "00f4240e"

    def _v2_0036(self) -> bool:
        return self.cfg.api == "new" and self.cfg.runner == "v2-0036d38d"

    def _starts_load_after_forward(self, so) -> bool:
        """kv_connector_model_runner_mixin.py@00f4240e and the V2 runner's
        gpu/kv_connector.py@00f4240e (pre_forward / post_forward):
        start_after_forward = not scheduler_output.has_sync_kv_loads."""
        return (self._new_mixin() or self._v2_0036()) and not getattr(so, "has_sync_kv_loads", False)

    def start_late_stores(self):
        """The copies of the stores submitted before this point start now
        (LateStore): after this step's block zeroing."""
        late, self.late = getattr(self, "late", []), []  # subclasses may not run __init__
        for j in late:
            j.start()

    # ---- the fake forward ------------------------------------------------------------

    def _check(self, tokens, work):
        """Phase 1 of a forward: every layer waits for its loads and checks the
        context each request attends to.  Returns the rids that saw wrong KV."""
        bad = set()
        self._dig = {rid: np.asarray(self._digests(rid, tokens[rid][:c + n]), dtype=np.uint64)
                     for rid, c, n in work}
        cfg = self.cfg
        for name, g, kind, li in self.layers:
            self.conn.wait_for_layer_load(name)
            self.calls.append(("wait_for_layer_load", name))
            t = self.kv[name]
            for rid, c, n in work:
                ids = self.reqs[rid][g]
                d = self._dig[rid]
                if kind == MAMBA:
                    if c > 0:
                        b = ids[(c - 1) // self.B]
                        for which, st in enumerate(t):
                            exp = model.state_values(int(d[c - 1]), self.rank, li, which, st[0].numel())
                            if not np.array_equal(st[b].reshape(-1).cpu().numpy(), exp):
                                bad.add(rid)
                    continue
                lo = 0 if kind == FULL else max(0, c - cfg.groups[g][2] + 1)
                if c > lo:
                    blk, off = self._pos_index(ids, range(lo, c))
                    got = t[:, blk, off].cpu().numpy()  # (2, m, H, D)
                    if not np.array_equal(got, model.kv_values(d[lo:c], self.rank, li, cfg.heads, cfg.dim)):
                        bad.add(rid)
        return bad

    def _draft_layer(self):
        """The draft model's layer (spec_decode): the last layer of group 0."""
        if not getattr(self.cfg, "spec_decode", False):
            return None
        return [name for name, g, _k, _i in self.layers if g == 0][-1]

    def _defers_finalize(self, so) -> bool:
        """gpu_model_runner.py with a speculative config: the mixin's
        defer_finalize (@00f4240e) in steps with a forward."""
        return self._new_mixin() and getattr(self.cfg, "spec_decode", False) and so.total_num_scheduled_tokens > 0

    def _write(self, tokens, work, bad, only=None, skip=None):
        """Phase 2: every layer writes the new positions' KV (Mamba: the new
        state).  A request whose context was wrong on ANY rank gets garbage, as
        tensor parallelism spreads it (the all-reduce); its next token is GARBAGE.
        only/skip: the draft layer, written by the drafter after the target."""
        cfg = self.cfg
        for name, g, kind, li in self.layers:
            if (only is not None and name != only) or (skip is not None and name == skip):
                continue
            t = self.kv[name]
            for rid, c, n in work:
                ids = self.reqs[rid][g]
                d = self._dig[rid]
                if kind == MAMBA:
                    b = ids[(c + n - 1) // self.B]
                    for which, st in enumerate(t):
                        v = model.state_values(int(d[c + n - 1]), self.rank, li, which, st[0].numel())
                        st[b] = self._put(v + 3.0 if rid in bad else v).reshape(st[b].shape)
                    continue
                blk, off = self._pos_index(ids, range(c, c + n))
                v = model.kv_values(d[c:c + n], self.rank, li, cfg.heads, cfg.dim)
                t[:, blk, off] = self._put(v + 3.0 if rid in bad else v)
            self.conn.save_kv_layer(name, t, None)
        out = {}
        for rid, c, n in work:
            if c + n == len(tokens[rid]):
                out[rid] = model.GARBAGE if rid in bad else model.next_token(int(self._dig[rid][c + n - 1]))
        return out

    def execute(self, so, tokens):
        """Both phases at once (TP=1, or tests that call a worker alone)."""
        bad = self.execute_check(so, tokens)
        return self.execute_finish(bad)

    def execute_check(self, so, tokens):
        conn = self.conn
        self.calls = []
        meta = so.kv_connector_metadata
        if self.cfg.api == "new" and self.cfg.runner == "v1":
            conn.handle_preemptions(meta)
            self.preemption_args.append(("meta", set(getattr(meta, "preempted_req_ids", ()))))
            self._update_states(so)
            self._zero_new_blocks(so)
            self.start_late_stores()
            conn.bind_connector_metadata(meta)
            self.calls += [("handle_preemptions",), ("bind_connector_metadata",)]
        elif self.cfg.api == "new" and self.cfg.runner == "v2-0036d38d":
            # gpu/model_runner.py@0036d38d execute_model: update_requests
            # (zeroes new_block_ids_to_zero, applies kv_cache_block_copies)
            # BEFORE gpu/kv_connector.py's pre_forward: handle_preemptions ->
            # bind -> start_load_kv only with sync loads
            self._update_states(so)
            self._zero_new_blocks(so)
            self.start_late_stores()
            conn.handle_preemptions(meta)
            self.preemption_args.append(("meta", set(getattr(meta, "preempted_req_ids", ()))))
            conn.bind_connector_metadata(meta)
            self.calls += [("handle_preemptions",), ("bind_connector_metadata",)]
        elif self.cfg.api == "new":
            conn.bind_connector_metadata(meta)
            conn.handle_preemptions(meta)
            self.preemption_args.append(("meta", set(getattr(meta, "preempted_req_ids", ()))))
            self.calls += [("bind_connector_metadata",), ("handle_preemptions",)]
        else:
            if so.preempted_req_ids:
                conn.handle_preemptions(set(so.preempted_req_ids))
                self.preemption_args.append(("set", set(so.preempted_req_ids)))
                self.calls.append(("handle_preemptions",))
            conn.bind_connector_metadata(meta)
            self.calls.append(("bind_connector_metadata",))
        if not (self.cfg.api == "new" and self.cfg.runner in ("v1", "v2-0036d38d")):
            self._update_states(so)
            self.start_late_stores()
        from vllm.forward_context import ForwardContext

        self._load_after_forward = self._starts_load_after_forward(so)
        if not self._load_after_forward:
            conn.start_load_kv(ForwardContext())
            self.calls.append(("start_load_kv",))
        self._so, self._tokens = so, tokens
        self._work = []
        if so.total_num_scheduled_tokens > 0:
            c = so.scheduled_cached_reqs
            self._work = [(nr.req_id, nr.num_computed_tokens, so.num_scheduled_tokens[nr.req_id])
                          for nr in so.scheduled_new_reqs]
            self._work += [(rid, c.num_computed_tokens[i], so.num_scheduled_tokens[rid])
                           for i, rid in enumerate(c.req_ids)]
            return self._check(tokens, self._work)
        return set()

    def execute_finish(self, bad_all):
        from vllm.v1.outputs import KVConnectorOutput

        from vllm.forward_context import ForwardContext

        conn, so = self.conn, self._so
        sampled = {}
        draft = self._draft_layer()
        if so.total_num_scheduled_tokens > 0:
            # (subclasses, e.g. gpu/mini_engine.py, override _write without skip)
            sampled = (self._write(self._tokens, self._work, set(bad_all)) if draft is None
                       else self._write(self._tokens, self._work, set(bad_all), skip=draft))
        if self._v2_0036():  # ActiveKVConnector.finish_forward after the forward (no_forward too)
            conn.finish_forward()
            self.calls.append(("finish_forward",))
        if getattr(self, "_load_after_forward", False):  # the mixin's finally / post_forward: after the forward
            conn.start_load_kv(ForwardContext())
            self.calls.append(("start_load_kv",))
        defer = self._defers_finalize(so)
        if defer:
            pass  # wait_for_save in finalize_kv_connector, after the drafter
        elif so.total_num_scheduled_tokens > 0 or self._new_mixin() or self._v2_0036():
            conn.wait_for_save()
            self.calls.append(("wait_for_save",))
            self.inflight_after_save = conn.debug_counters()["jobs_inflight"]
        replay = None
        if self._new_mixin() or self._v2_0036():  # the mixin / post_forward @00f4240e call it unconditionally
            res = conn.get_transfer_results(so.finished_req_ids)
            fs, fr = res.finished_sending or None, res.finished_recving or None
            failed = res.failed_recving
            replay = res.prefix_replay_checkpoints
            self.calls.append(("get_transfer_results",))
        elif self.cfg.api == "new" and hasattr(conn, "get_transfer_results"):
            res = conn.get_transfer_results(so.finished_req_ids)
            fs, fr = res.finished_sending or None, res.finished_recving or None
            failed = res.failed_recving
            self.calls.append(("get_transfer_results",))
        else:
            failed = None
            fs, fr = conn.get_finished(so.finished_req_ids)
            self.calls.append(("get_finished",))
        invalid = conn.get_block_ids_with_load_errors()
        stats = conn.get_kv_connector_stats()
        events = conn.get_kv_connector_kv_cache_events()
        wmeta = conn.build_connector_worker_meta() if self.cfg.api == "new" else None
        if defer:
            # sample_tokens: the drafter's forward writes the draft layer; a
            # store submitted before it may have read its blocks by now
            self.start_late_stores()
            if draft is not None and self._work:
                self._write(self._tokens, self._work, set(bad_all), only=draft)
            conn.wait_for_save()  # finalize_kv_connector
            self.calls.append(("wait_for_save",))
            self.inflight_after_save = conn.debug_counters()["jobs_inflight"]
        conn.clear_connector_metadata()
        self.calls.append(("clear_connector_metadata",))
        out = KVConnectorOutput(finished_sending=fs, finished_recving=fr, kv_connector_stats=stats,
                                kv_cache_events=events, kv_connector_worker_meta=wmeta,
                                invalid_block_ids=set(invalid), failed_recving=failed,
                                prefix_replay_checkpoints=replay)
        return {"sampled": sampled, "bad": set(bad_all), "kv": out, "rank": self.rank}

    # ---- test controls ---------------------------------------------------------------

    def poison(self, value=-7.0, keep_blocks=()):
        """Fills every KV byte (but the blocks in keep_blocks) with value."""
        keep = sorted(set(keep_blocks))
        for name, _g, kind, _i in self.layers:
            v = self.kv[name]
            saved = [(t, t[:, keep].clone() if kind != MAMBA else t[keep].clone())
                     for t in (v if isinstance(v, list) else [v])] if keep else []
            for t in (v if isinstance(v, list) else [v]):
                t.fill_(value)
            for t, s in saved:
                if kind == MAMBA:
                    t[keep] = s
                else:
                    t[:, keep] = s

    def get_preemption_args(self):
        return list(self.preemption_args)

    def snapshot(self, group: int, block_ids):
        """Bytes of these blocks of every layer of the group, in layer order."""
        out = []
        for name, g, kind, _i in self.layers:
            if g != group:
                continue
            t = self.kv[name]
            idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.dev)
            if kind == MAMBA:
                out.extend(x[idx].cpu().numpy().tobytes() for x in t)
            else:
                out.append(t[:, idx].cpu().numpy().tobytes())
        return out

    def block_bytes(self, group: int, block_id: int) -> bytes:
        """One GPU block of a group laid out as umbp's object: per layer (model
        order) the K chunk then the V chunk; a Mamba layer's state tensors."""
        out = []
        for name, g, kind, _i in self.layers:
            if g != group:
                continue
            t = self.kv[name]
            if kind == MAMBA:
                out.extend(x[block_id].cpu().numpy().tobytes() for x in t)
            else:
                out += [t[0, block_id].cpu().numpy().tobytes(), t[1, block_id].cpu().numpy().tobytes()]
        return b"".join(out)

    def object_bytes(self, group: int, hashes) -> list:
        """The pool's objects of these block hashes (None where absent)."""
        rt = self.runtime()
        size = self.conn._worker.kv[group].object_size
        keys = self.keys_of(group, hashes)
        buf = np.zeros((len(keys), size), dtype=np.uint8)
        ptrs = buf.ctypes.data + np.arange(len(keys), dtype=np.uint64) * np.uint64(size)
        j = rt.get(keys, ptrs, size)
        assert j.wait(5000)
        st = j.statuses.copy()
        j.release()
        return [buf[i].tobytes() if st[i] == 0 else None for i in range(len(keys))]

    def counters(self):
        return self.conn.debug_counters()

    def hold_stores(self, on: bool):
        self.conn._worker.hold_store_completions = bool(on)

    def runtime(self):
        return self.conn._worker.rt

    def keys_of(self, group: int, hashes):
        w = self.conn._worker
        import umbp

        return umbp.derive_keys(w.ns, rank=w.rank_id, group=group, hashes=list(hashes))

    def remove_objects(self, group: int, hashes, keep_first: int, ranks=None):
        """Makes the objects of hashes[keep_first:] disappear from this rank's
        pool (the objects of hashes[:keep_first] survive): get the survivors,
        clear, put them back.  A failed load between lookup and load.  ranks:
        whose survivors to keep (a standalone pool holds every rank's)."""
        import umbp

        rt = self.runtime()
        w = self.conn._worker
        size = w.kv[group].object_size
        keys = self.keys_of(group, hashes)
        keep = keys[:keep_first]
        if ranks is not None:
            keep = np.concatenate([umbp.derive_keys(w.ns, rank=w.topo.rank_id(r), group=group,
                                                    hashes=list(hashes[:keep_first])) for r in ranks])
        buf = np.zeros((max(1, len(keep)), size), dtype=np.uint8)
        if len(keep):
            ptrs = buf.ctypes.data + np.arange(len(keep), dtype=np.uint64) * np.uint64(size)
            j = rt.get(keep, ptrs, size)
            assert j.wait(5000) and j.num_ok == len(keep), j.statuses
            j.release()
        rt.clear()
        if len(keep):
            j = rt.put(keep, ptrs, size)
            assert j.wait(5000) and j.num_ok == len(keep), j.statuses
            j.release()
        _, present = rt.lookup(keys)
        return present.tolist()

    def clear_pool(self):
        self.runtime().clear()

    def shutdown(self):
        self.conn.shutdown()
        return self.conn.debug_counters()


def worker_main(conn, cfg, rank, env):
    """Entry of a worker process: serves HarnessWorker methods over a Pipe."""
    import os
    import sys

    os.environ.update(env)
    for p in env.get("HARNESS_SYS_PATH", "").split(os.pathsep):
        if p and p not in sys.path:
            sys.path.insert(0, p)
    try:
        w = HarnessWorker(cfg, rank)
        conn.send(("ok", None))
    except BaseException as e:  # noqa: BLE001
        conn.send(("err", "".join(traceback.format_exception(e))))
        return
    while True:
        try:
            name, args = conn.recv()
        except EOFError:
            break
        try:
            res = getattr(w, name)(*args)
            conn.send(("ok", res))
        except BaseException as e:  # noqa: BLE001
            conn.send(("err", "".join(traceback.format_exception(e))))
        if name == "shutdown":
            break
