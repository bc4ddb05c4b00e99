"""A stand-in vLLM engine: block pool, scheduler (sync and async scheduling),
TP workers (in this process or in their own), the KV output aggregator, and
the step loop, all calling the REAL connector in vLLM's order
(connector-api.md §1.4, scheduler.py@00024d31 and the offloading connector's
test RequestRunner):

    schedule():  running requests (allocate, preempt on failure; no connector call)
                 waiting requests (only without preemptions): local prefix hit ->
                 get_num_new_matched_tokens -> allocate -> update_state_after_alloc
                 -> (async load: WAITING_FOR_REMOTE_KVS) ; build_connector_meta
    workers:     see worker.py
    update_from_output(so, out): invalid blocks (recompute policy) -> tokens, stops ->
                 request_finished_all_groups (delay_free) -> update_connector_output ->
                 finished_recving / finished_sending -> take_events
    async scheduling: update_from_output(previous step) after the next schedule().
"""
from __future__ import annotations

import collections
import dataclasses
import importlib
import multiprocessing as mp
import os
import sys
import time

from . import model
from .config import FULL, MAMBA, SWA

NULL = 0


class HarnessError(AssertionError):
    pass


# ---- block pool -------------------------------------------------------------------


class BlockPool:
    """vLLM's BlockPool in small: block 0 is the null block; freed blocks go to
    the tail of an LRU free queue; with a prefix cache, freed full blocks keep
    their hash until they are reallocated."""

    def __init__(self, num_blocks: int, prefix_cache: bool):
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.free_q = collections.OrderedDict((b, None) for b in range(1, num_blocks))
        self.prefix_cache = prefix_cache
        self.cached: dict = {}  # hash -> block
        self.block_hash: dict = {}  # block -> hash
        self.fresh: list = []  # blocks allocated in this schedule() (the runner zeroes them)

    def num_free(self):
        return len(self.free_q)

    def allocate(self, n: int):
        if n > len(self.free_q):
            return None
        out = []
        for _ in range(n):
            b, _ = self.free_q.popitem(last=False)
            h = self.block_hash.pop(b, None)
            if h is not None and self.cached.get(h) == b:
                del self.cached[h]
            assert self.ref[b] == 0
            self.ref[b] = 1
            out.append(b)
            self.fresh.append(b)
        return out

    def touch(self, blocks):
        for b in blocks:
            if self.ref[b] == 0:
                self.free_q.pop(b)
            self.ref[b] += 1

    def free(self, blocks):
        for b in blocks:
            if b == NULL:
                continue
            if self.ref[b] <= 0:
                raise HarnessError(f"block {b} freed twice")
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free_q[b] = None

    def cache(self, h, b):
        if self.prefix_cache and h not in self.cached:
            self.cached[h] = b
            self.block_hash[b] = h

    def evict_cached(self):
        for h, b in list(self.cached.items()):
            if self.ref[b] == 0:
                del self.cached[h]
                self.block_hash.pop(b, None)


# ---- scheduler --------------------------------------------------------------------


@dataclasses.dataclass
class _Sched:
    rid: str
    n: int
    epoch: int


class _KVCacheManager:
    """The one KVCacheManager method the version-specific methods call."""

    def __init__(self, sched):
        self.sched = sched

    def get_block_ids(self, req_id):
        return tuple(list(t) for t in self.sched.req_blocks[req_id])


class _SchedulerCore:
    """vLLM's scheduler in small.  Engine subclasses it with the class of
    vllm/v1/core/sched/scheduler.py that HarnessConfig.engine names, which
    supplies _update_requests_with_invalid_blocks, _update_waiting_for_remote_kv
    and _mamba_block_aligned_split as that vLLM version has them."""

    def __init__(self, cfg, connector):
        from vllm.v1.request import RequestStatus

        self.RS = RequestStatus
        self.cfg = cfg
        self.B = cfg.block_size
        self.conn = connector
        self.pool = BlockPool(cfg.num_blocks, cfg.local_prefix_cache and len(cfg.groups) == 1)
        self.requests: dict = {}
        self.waiting: list = []
        self.running: list = []
        self.req_blocks: dict = {}  # rid -> [per group list of block ids]
        self.placeholders: dict = {}
        self.epoch: dict = {}
        self.finished_req_ids: set = set()
        self.finished_recving: set = set()
        self.failed_recving_kv_req_ids: set = set()
        self.kv_cache_manager = _KVCacheManager(self)
        self.block_size = self.B
        self.need_mamba_block_aligned_split = (any(k == MAMBA for k, _n, _w in cfg.groups)
                                               and cfg.mamba_cache_mode == "align")
        self.delayed: set = set()  # finished requests whose blocks the connector holds
        self.outputs: dict = collections.defaultdict(list)
        self.finished_blocks: dict = {}  # rid -> block ids at finish (for snapshots)
        self.events: list = []
        self.log: list = []  # (what, rid, value)
        self.step_no = 0
        self.discarded: list = []
        self.preempted_total = 0

    # -- requests --

    def add_request(self, req):
        self.requests[req.request_id] = req
        self.waiting.append(req)
        self.placeholders[req.request_id] = 0
        self.epoch[req.request_id] = 0
        if hasattr(self.conn, "on_new_request"):
            self.conn.on_new_request(req)

    def has_requests(self):
        return bool(self.requests)

    # -- allocation (vLLM's managers in small) --

    def _skipped(self, kind, window, pos, computed):
        """Whether block position pos is outside what the group keeps once
        `computed` tokens are computed (SWA: before the window; Mamba: before
        the block holding the current state)."""
        if kind == SWA:
            return (pos + 1) * self.B <= computed - window + 1
        if kind == MAMBA:
            return computed > 0 and pos < (computed - 1) // self.B
        return False

    def _allocate(self, req, total_tokens, computed):
        """Blocks for total_tokens of req (computed tokens already known)."""
        rid = req.request_id
        tables = self.req_blocks.setdefault(rid, [[] for _ in self.cfg.groups])
        need = -(-total_tokens // self.B)
        # free what is skipped now (remove_skipped_blocks)
        for g, (kind, _n, w) in enumerate(self.cfg.groups):
            t = tables[g]
            for p in range(len(t)):
                if t[p] != NULL and self._skipped(kind, w, p, computed):
                    self.pool.free([t[p]])
                    t[p] = NULL
        want = []
        for g, (kind, _n, w) in enumerate(self.cfg.groups):
            t = tables[g]
            for p in range(len(t), need):
                want.append((g, p, self._skipped(kind, w, p, computed)))
        real = [x for x in want if not x[2]]
        got = self.pool.allocate(len(real))
        if got is None:
            return False
        it = iter(got)
        for g, p, skip in want:
            tables[g].append(NULL if skip else next(it))
        return True

    def _free_blocks(self, rid):
        for t in self.req_blocks.pop(rid, []):
            self.pool.free([b for b in t if b != NULL])

    def _blocks_obj(self, rid):
        from vllm.v1.core.kv_cache_manager import KVCacheBlock, KVCacheBlocks

        return KVCacheBlocks(tuple([KVCacheBlock(b, is_null=(b == NULL)) for b in t] for t in self.req_blocks[rid]))

    def _local_hit(self, req):
        """Local prefix-cache hit (single full-attention group): blocks and tokens."""
        if not self.pool.prefix_cache:
            return [], 0
        kmax = (req.num_tokens - 1) // self.B
        hits = []
        for i in range(min(kmax, len(req.block_hashes))):
            b = self.pool.cached.get(req.block_hashes[i])
            if b is None:
                break
            hits.append(b)
        return hits, len(hits) * self.B

    def _preempt(self, req):
        rid = req.request_id
        self._free_blocks(rid)
        req.status = self.RS.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.placeholders[rid] = 0
        self.epoch[rid] += 1
        self.running.remove(req)
        self.waiting.insert(0, req)
        self.preempted_total += 1
        self.log.append(("preempted", rid, self.step_no))

    def _align(self, req, c, n):
        """Mamba 'align' chunking: a prefill chunk ends on a block boundary, and
        at the last boundary before the last prompt token."""
        if not self.need_mamba_block_aligned_split or n <= 1:
            return n
        end = c + n
        last = (req.num_tokens - 1) // self.B * self.B
        if c < last < end:
            return last - c
        if end < req.num_tokens and end % self.B:
            n2 = end // self.B * self.B - c
            return n2 if n2 > 0 else n
        return n

    def _split(self, req, n, new_local=0, ext=0):
        """Where this step's chunk of req ends: vLLM's Mamba 'align' split
        (the vLLM version's own _mamba_block_aligned_split) when that mode
        is on, else n.  The GPU mini engine overrides it to compute a
        prompt's last block in a step of its own."""
        if self.need_mamba_block_aligned_split:
            return self._mamba_block_aligned_split(req, n, new_local, ext)
        return n

    def schedule(self):
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        self.step_no += 1
        self.pool.fresh = []
        no_zero = set()  # async-load destinations (vLLM's _skip_zero_block_ids)
        sync_loads = False  # SchedulerOutput.has_sync_kv_loads: a request scheduled with external tokens loaded now
        budget = self.cfg.max_num_batched_tokens
        scheduled = {}
        new_reqs, cached_ids, resumed = [], [], set()
        cached_new_blocks, cached_nct = [], []
        preempted = set()
        before = {rid: [len(t) for t in self.req_blocks.get(rid, [])] for rid in self.requests}

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            rid = req.request_id
            n = req.num_tokens + self.placeholders[rid] - req.num_computed_tokens
            n = min(n, budget)
            n = self._split(req, n)
            if n <= 0:
                i += 1
                continue
            ok = False
            while True:
                if self._allocate(req, req.num_computed_tokens + n, req.num_computed_tokens):
                    ok = True
                    break
                victim = self.running[-1]
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is req:
                    break
            if not ok:
                break
            scheduled[rid] = n
            budget -= n
            i += 1

        skipped = []
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
                req = self.waiting.pop(0)
                rid = req.request_id
                if req.status == self.RS.WAITING_FOR_REMOTE_KVS:
                    if rid not in self.finished_recving:
                        skipped.append(req)
                        continue
                    self.finished_recving.discard(rid)
                    self._update_waiting_for_remote_kv(req)
                    req.status = self.RS.WAITING
                    self.log.append(("recv_done", rid, req.num_computed_tokens))
                ext, load_async = 0, False
                local_blocks = []
                if req.num_computed_tokens == 0:
                    local_blocks, local = self._local_hit(req)
                    ext, load_async = self.conn.get_num_new_matched_tokens(req, local)
                    self.log.append(("matched", rid, (local, ext, load_async)))
                    if ext is None:
                        skipped.append(req)
                        continue
                    computed = local + ext
                else:
                    local, computed = req.num_computed_tokens, req.num_computed_tokens
                n = min(req.num_tokens - computed, budget)
                n = self._split(req, n, computed - req.num_computed_tokens - ext, ext)
                if load_async:
                    n = 0
                fresh = rid not in self.req_blocks
                if fresh and local_blocks:
                    self.pool.touch(local_blocks)
                    self.req_blocks[rid] = [list(local_blocks)]
                if not self._allocate(req, computed + n, computed):
                    if fresh and local_blocks:
                        self._free_blocks(rid)
                    self.waiting.insert(0, req)
                    break
                self.conn.update_state_after_alloc(req, self._blocks_obj(rid), ext)
                self.log.append(("alloc", rid, ext))
                if ext:
                    req.num_external_computed_tokens = ext
                if load_async:
                    no_zero.update(b for t in self.req_blocks[rid] for b in t)
                    req.status = self.RS.WAITING_FOR_REMOTE_KVS
                    if self.SETS_COMPUTED_AT_ASYNC_ALLOC:
                        req.num_computed_tokens = computed
                    skipped.append(req)
                    continue
                if ext and not load_async:
                    sync_loads = True
                req.num_computed_tokens = computed
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = computed
                was_preempted = req.status == self.RS.PREEMPTED
                req.status = self.RS.RUNNING
                self.running.append(req)
                scheduled[rid] = n
                budget -= n
                if was_preempted:
                    resumed.add(rid)
                    cached_ids.append(rid)
                    cached_new_blocks.append(tuple(list(t) for t in self.req_blocks[rid]))
                    cached_nct.append(req.num_computed_tokens)
                else:
                    new_reqs.append(NewRequestData(
                        req_id=rid, prompt_token_ids=list(req.prompt_token_ids), mm_features=[],
                        sampling_params=req.sampling_params, pooling_params=None,
                        block_ids=tuple(list(t) for t in self.req_blocks[rid]),
                        num_computed_tokens=req.num_computed_tokens, lora_request=None))
        self.waiting = skipped + self.waiting

        new_ids = {nr.req_id for nr in new_reqs}
        for rid in scheduled:
            if rid in new_ids or rid in resumed:
                continue
            req = self.requests[rid]
            cached_ids.append(rid)
            prev = before.get(rid) or [0] * len(self.cfg.groups)
            tabs = self.req_blocks[rid]
            cached_new_blocks.append(tuple(list(t[prev[g]:]) for g, t in enumerate(tabs)))
            cached_nct.append(req.num_computed_tokens)
        cached = CachedRequestData(req_ids=cached_ids, resumed_req_ids=resumed, new_block_ids=cached_new_blocks,
                                   num_computed_tokens=cached_nct,
                                   num_output_tokens=[self.requests[r].num_output_tokens for r in cached_ids])
        so = SchedulerOutput(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                             num_scheduled_tokens=dict(scheduled),
                             total_num_scheduled_tokens=sum(scheduled.values()),
                             finished_req_ids=set(self.finished_req_ids), preempted_req_ids=set(preempted))
        so.has_sync_kv_loads = sync_loads
        so.kv_connector_metadata = self.conn.build_connector_meta(so)
        # tokens each worker needs (placeholders predicted: the model is deterministic)
        tokens = {}
        for rid, n in scheduled.items():
            req = self.requests[rid]
            tokens[rid] = model.predict(req.all_token_ids, self.placeholders[rid])
        sched = {}
        for rid, n in scheduled.items():
            req = self.requests[rid]
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens + self.placeholders[rid]:
                self.placeholders[rid] += 1
            sched[rid] = _Sched(rid, n, self.epoch[rid])
            self._cache_full_blocks(req)
        self.finished_req_ids = set()
        so._harness_sched = sched
        so._harness_zero = set(self.pool.fresh) - no_zero - {NULL}
        so._harness_step = self.step_no
        return so, tokens

    def _cache_full_blocks(self, req):
        if not self.pool.prefix_cache:
            return
        t = self.req_blocks[req.request_id][0]
        for i in range(min(req.num_computed_tokens // self.B, len(req.block_hashes), len(t))):
            self.pool.cache(req.block_hashes[i], t[i])

    # -- outputs --

    def _handle_invalid_blocks(self, invalid):
        """scheduler.py@00024d31 _handle_invalid_blocks (connector-api.md §1.7;
        every version modelled handles the policy alike): every async-loading
        waiting request, then every running one, through the engine version's
        _update_requests_with_invalid_blocks.  Policy "recompute": async
        requests go to failed_recving_kv_req_ids (recomputed from the valid
        prefix once their recv completes), running ones recompute (this step's
        output is skipped).  Policy "fail": the affected requests are returned
        and update_from_output ends them with FINISHED_ERROR.  Returns the
        affected ids (skipped in update_from_output's main loop)."""
        waiting = [r for r in self.waiting if r.status == self.RS.WAITING_FOR_REMOTE_KVS]
        affected = self._update_requests_with_invalid_blocks(waiting, invalid)
        affected |= self._update_requests_with_invalid_blocks(list(self.running), invalid)
        if self.cfg.load_failure_policy == "fail":
            return affected
        for rid in affected:
            req = self.requests[rid]
            if req.status == self.RS.WAITING_FOR_REMOTE_KVS:
                self.failed_recving_kv_req_ids.add(rid)
            else:
                self.epoch[rid] += 1  # this step's (and in-flight steps') output is recomputed
                self.placeholders[rid] = 0
        return affected

    def _truncate_at_invalid(self, req, ids0, invalid) -> bool:
        """Truncate num_computed_tokens at the first invalid block of ids0."""
        rid = req.request_id
        cur = req.num_computed_tokens
        if (req.status == self.RS.WAITING_FOR_REMOTE_KVS and not self.SETS_COMPUTED_AT_ASYNC_ALLOC
                and rid not in self.failed_recving_kv_req_ids):
            cur = len(ids0) * self.B  # not set at allocation in this version
        for idx, b in enumerate(ids0):
            if b in invalid:
                new = min(cur, idx * self.B)
                if new < cur or req.status == self.RS.WAITING_FOR_REMOTE_KVS:
                    self.log.append(("truncated", rid, (cur, new)))
                    req.num_computed_tokens = new
                    req.num_external_computed_tokens = min(req.num_external_computed_tokens, new)
                    return True
                return False
        return False

    def _free_request(self, req):
        rid = req.request_id
        blocks = tuple(list(t) for t in self.req_blocks.get(rid, []))
        self.finished_blocks[rid] = blocks
        delay, _params = self.conn.request_finished_all_groups(req, blocks)
        self.log.append(("request_finished", rid, delay))
        self.finished_req_ids.add(rid)
        if delay:
            self.delayed.add(rid)
        else:
            self._free_blocks(rid)
            del self.requests[rid]

    def finish_request(self, rid, status):
        req = self.requests[rid]
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        self._free_request(req)

    def update_from_output(self, so, out):
        kvo = out["kv"]
        failed = set()
        if kvo.invalid_block_ids:
            failed = self._handle_invalid_blocks(kvo.invalid_block_ids)
        for rid, s in so._harness_sched.items():
            req = self.requests.get(rid)
            if req is None or req.is_finished() or rid in failed:
                continue
            if s.epoch != self.epoch[rid]:
                self.discarded.append((so._harness_step, rid))
                continue
            tok = out["sampled"].get(rid)
            if tok is None:
                continue
            self.placeholders[rid] -= 1
            req.append_output_token_ids(tok)
            self.outputs[rid].append(tok)
            if req.num_output_tokens >= req.sampling_params.max_tokens:
                self.running.remove(req)
                req.status = self.RS.FINISHED_LENGTH_CAPPED
                self._free_request(req)
        if failed and self.cfg.load_failure_policy == "fail":
            # kv_load_failure_policy "fail": the requests whose loads failed end
            # with FINISHED_ERROR (finish_requests -> _free_request ->
            # request_finished*: a request still loading keeps its blocks)
            for rid in sorted(failed):
                if rid in self.requests and not self.requests[rid].is_finished():
                    self.finish_request(rid, self.RS.FINISHED_ERROR)
                    self.log.append(("failed_error", rid, self.step_no))
        # _update_from_kv_xfer_finished
        self.conn.update_connector_output(kvo)
        for rid in kvo.finished_recving or ():
            if rid not in self.requests:
                raise HarnessError(f"finished_recving of unknown request {rid}")
            req = self.requests[rid]
            if req.status == self.RS.WAITING_FOR_REMOTE_KVS:
                self.finished_recving.add(rid)
            else:
                if not req.is_finished():
                    raise HarnessError(f"finished_recving of {rid} in status {req.status!r}")
                self._release_delayed(rid)
        for rid in kvo.finished_sending or ():
            if rid not in self.requests or rid not in self.delayed:
                raise HarnessError(f"finished_sending of {rid}, which is not held")
            self._release_delayed(rid)
        self.events.extend(self.conn.take_events())

    def _release_delayed(self, rid):
        if rid not in self.delayed:
            raise HarnessError(f"blocks of {rid} released, but the connector did not hold them")
        self.delayed.discard(rid)
        self._free_blocks(rid)
        del self.requests[rid]
        self.log.append(("freed", rid, self.step_no))


def _default_scheduler():
    from vllm.v1.core.sched.scheduler import SCHEDULER_00024D31

    class HarnessScheduler(SCHEDULER_00024D31, _SchedulerCore):
        """The harness scheduler as scheduler.py@00024d31 (what subclasses
        outside Engine, e.g. the GPU mini engine, get); Engine puts the class
        HarnessConfig.engine names before it."""

    return HarnessScheduler


HarnessScheduler = _default_scheduler()


# ---- aggregation ------------------------------------------------------------------


class Aggregator:
    """KVOutputAggregator: a finished id counts once every worker reported it;
    invalid block ids are united; stats, events and worker metadata merged."""

    def __init__(self, world):
        self.world = world
        self.sending = collections.Counter()
        self.recving = collections.Counter()
        self.failed_seen: list = []  # each worker's non-empty failed_recving, in order

    def aggregate(self, outs):
        from vllm.v1.outputs import KVConnectorOutput

        sampled = outs[0]["sampled"]
        for o in outs[1:]:
            clean = {k: v for k, v in o["sampled"].items()}
            if clean != sampled:
                # each rank checks its own shard: a garbage token on any rank wins
                merged = dict(sampled)
                for k, v in clean.items():
                    if v == model.GARBAGE:
                        merged[k] = v
                for k, v in sampled.items():
                    if clean.get(k) is None:
                        raise HarnessError(f"ranks disagree on sampling {k}")
                sampled = merged
        fs, fr, inv = set(), set(), set()
        stats = events = wmeta = failed = None
        for o in outs:
            k = o["kv"]
            for r in k.finished_sending or ():
                self.sending[r] += 1
                if self.sending[r] == self.world:
                    fs.add(r)
                    del self.sending[r]
            for r in k.finished_recving or ():
                self.recving[r] += 1
                if self.recving[r] == self.world:
                    fr.add(r)
                    del self.recving[r]
            inv |= set(k.invalid_block_ids or ())
            f = getattr(k, "failed_recving", None)
            if f:  # a set of ids or a mapping of failures, as the connector built it
                self.failed_seen.append(f)
                failed = (dict(failed or {}) | dict(f)) if hasattr(f, "keys") else (set(failed or ()) | set(f))
            if k.kv_connector_stats is not None:
                stats = k.kv_connector_stats if stats is None else stats.aggregate(k.kv_connector_stats)
            if k.kv_cache_events is not None:
                if events is None:
                    events = k.kv_cache_events
                else:
                    events.add_events(k.kv_cache_events.get_all_events())
                    events.increment_workers(1)
            if k.kv_connector_worker_meta is not None:
                wmeta = k.kv_connector_worker_meta if wmeta is None else wmeta.aggregate(k.kv_connector_worker_meta)
        # KVOutputAggregator@00f4240e does not call aggregate() on the events:
        # the scheduler connector gets every worker's events
        kvo = KVConnectorOutput(finished_sending=fs or None, finished_recving=fr or None, kv_connector_stats=stats,
                                kv_cache_events=events, kv_connector_worker_meta=wmeta, invalid_block_ids=inv,
                                failed_recving=failed)
        return {"sampled": sampled, "kv": kvo, "bad": set().union(*(o["bad"] for o in outs))}


# ---- workers in processes -----------------------------------------------------------


class RemoteWorker:
    """A HarnessWorker in its own process (spawn), same methods."""

    def __init__(self, cfg, rank):
        from .worker import worker_main

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        env = {k: v for k, v in os.environ.items() if k.startswith(("UMBP_", "FAKE_VLLM", "PYTHON"))}
        env["HARNESS_SYS_PATH"] = os.pathsep.join(sys.path)
        self.proc = ctx.Process(target=worker_main, args=(child, cfg, rank, env), daemon=True)
        self.proc.start()
        self._result()

    def _result(self):
        if not self.conn.poll(120):
            raise HarnessError("worker process did not answer in 120 s")
        st, res = self.conn.recv()
        if st != "ok":
            raise HarnessError("worker process failed:\n" + res)
        return res

    def call(self, name, *args):
        self.conn.send((name, args))
        return self._result()

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a: self.call(name, *a)

    def close(self):
        try:
            self.proc.join(10)
        finally:
            if self.proc.is_alive():
                self.proc.kill()


# ---- the engine ----------------------------------------------------------------------


class Engine:
    def __init__(self, cfg):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        from .worker import HarnessWorker

        self.cfg = cfg
        mod = importlib.import_module("umbp.vllm.connector")
        if cfg.processes:
            self.workers = [RemoteWorker(cfg, r) for r in range(cfg.tp)]
        else:
            self.workers = [HarnessWorker(cfg, r) for r in range(cfg.tp)]
        # the scheduler's connector after the workers (their pools serve its lookups)
        from vllm.v1.core.sched import scheduler as sched_mod

        version = sched_mod.ENGINES[cfg.engine]
        sched_mod.Scheduler = version  # what the connector probes is what runs
        self.conn = mod.UMBPConnector(cfg.vllm_config(0), KVConnectorRole.SCHEDULER, cfg.kv_cache_config())
        self.sched = type("HarnessScheduler_" + cfg.engine, (version, _SchedulerCore), {})(cfg, self.conn)
        self.agg = Aggregator(cfg.tp)
        self.prev = None
        self.bad = []  # (step, rid) whose forward saw wrong KV
        self.steps = 0
        self.closed = False

    def add(self, rid, prompt, max_tokens=4):
        from vllm.v1.request import Request, SamplingParams

        req = Request(rid, prompt, SamplingParams(max_tokens=max_tokens), block_size=self.cfg.block_size,
                      hash_block_size=self.cfg.hash_block_size or None)
        self.sched.add_request(req)
        return req

    def abort(self, rid):
        self.sched.finish_request(rid, self.sched.RS.FINISHED_ABORTED)

    def step(self, before_execute=None):
        so, tokens = self.sched.schedule()
        if before_execute is not None:
            before_execute(so)
        # TP: every rank loads and checks its context, then (the all-reduce)
        # every rank writes from what all ranks saw
        bad = set().union(*[w.execute_check(so, tokens) for w in self.workers])
        outs = [w.execute_finish(bad) for w in self.workers]
        out = self.agg.aggregate(outs)
        self.bad.extend((so._harness_step, r) for r in out["bad"])
        self.steps += 1
        if self.cfg.async_scheduling:
            if self.prev is not None:
                self.sched.update_from_output(*self.prev)
            self.prev = (so, out)
        else:
            self.sched.update_from_output(so, out)
        return so

    def run(self, max_steps=500, before_execute=None):
        n = 0
        while self.sched.has_requests() or self.prev is not None:
            if not self.sched.has_requests() and self.prev is not None:
                self.sched.update_from_output(*self.prev)
                self.prev = None
                continue
            so = self.step(before_execute)
            n += 1
            if so.total_num_scheduled_tokens == 0:
                time.sleep(0.001)  # an idle engine step takes time too (async lookups run meanwhile)
            if n > max_steps:
                raise HarnessError(f"requests still unfinished after {max_steps} steps: "
                                   f"{ {r: str(q.status) for r, q in self.sched.requests.items()} }")
        return n

    # -- checks --

    def counters(self):
        return {"scheduler": self.conn.debug_counters(), "workers": [w.counters() for w in self.workers]}

    def check_clean(self):
        """Every block released, every job complete and released, nothing held."""
        s = self.sched
        problems = []
        if s.requests or s.waiting or s.running or s.delayed:
            problems.append(f"requests left: {list(s.requests)} waiting={len(s.waiting)} running={len(s.running)} "
                            f"delayed={s.delayed}")
        if s.pool.num_free() != self.cfg.num_blocks - 1:
            problems.append(f"{self.cfg.num_blocks - 1 - s.pool.num_free()} blocks not returned to the pool")
        if any(s.pool.ref):
            problems.append(f"ref counts left: {[(b, r) for b, r in enumerate(s.pool.ref) if r]}")
        if s.req_blocks:
            problems.append(f"block tables left: {list(s.req_blocks)}")
        c = self.counters()
        sc = c["scheduler"]
        for k in ("requests_tracked", "held_requests", "store_plans_inflight", "queued_loads", "queued_stores",
                  "pending_lookups", "pending_matches", "async_loads_inflight", "clear_pending"):
            if sc.get(k):
                problems.append(f"scheduler connector {k} = {sc[k]}")
        for w in c["workers"]:
            for k in ("jobs_inflight", "pending_stores", "async_loads_pending", "delayed_free_pending"):
                if w.get(k):
                    problems.append(f"worker {w['rank']} {k} = {w[k]}")
            if not w["jobs_submitted"] == w["jobs_completed"] == w["jobs_released"]:
                problems.append(f"worker {w['rank']} jobs submitted/completed/released = {w['jobs_submitted']}/"
                                f"{w['jobs_completed']}/{w['jobs_released']}")
        if problems:
            raise HarnessError("engine not clean:\n  " + "\n  ".join(problems))
        return c

    def check_outputs(self, prompts: dict, max_tokens: dict | int):
        for rid, prompt in prompts.items():
            mt = max_tokens if isinstance(max_tokens, int) else max_tokens[rid]
            want = model.generate(prompt, mt)
            got = self.sched.outputs[rid]
            if got != want:
                raise HarnessError(f"{rid}: generated {got}, expected {want}")

    def matched(self, rid):
        """The last (local, external, async) get_num_new_matched_tokens answer for rid."""
        vals = [v for what, r, v in self.sched.log if what == "matched" and r == rid and v[1] is not None]
        return vals[-1] if vals else None

    def shutdown(self):
        if self.closed:
            return
        self.closed = True
        out = []
        try:
            self.conn.shutdown()
        finally:
            for w in self.workers:
                out.append(w.shutdown())
                if isinstance(w, RemoteWorker):
                    w.close()
        return out
