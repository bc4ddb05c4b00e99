"""The worker half of the UMBP connector: one umbp.Runtime per worker rank,
the KV caches registered per KV cache group, and the scheduler's plans turned
into runtime jobs.

Threads: every method runs on vLLM's worker thread (the forward thread).
Nothing here waits on a copy except where vLLM needs the bytes: a
synchronous load in wait_for_layer_load, and handle_preemptions (the blocks of
a preempted request are reused by the next forward).  Stores are submitted
after the forward pass with a CUDA event recorded on the compute stream: the
copy waits for it on the device, not on the host.
"""

from __future__ import annotations

import time

import numpy as np

from . import _compat
from .events import KeyMap, UMBPKVEvents
from .identity import MAMBA, Topology, derive_namespace, describe_groups
from .lookup import register_local, unregister_local
from .metadata import UMBPWorkerMetadata, ids_of
from .stats import UMBPConnectorStats

log = _compat.get_logger("umbp.vllm.worker")


class _Job:
    __slots__ = ("kind", "req_id", "group", "plan", "job", "t0", "nbytes", "event", "sync")

    def __init__(self, kind, plan, job, nbytes, event, sync=False):
        self.kind = kind
        self.req_id = plan.req_id
        self.group = plan.group
        self.plan = plan
        self.job = job
        self.t0 = time.monotonic()
        self.nbytes = nbytes
        self.event = event  # kept alive until the job completes
        self.sync = sync


def _split_hashes(plan) -> list:
    h, n = plan.hashes, plan.hash_len
    return [h[i:i + n] for i in range(0, len(h), n)]


class UMBPWorker:
    def __init__(self, umbp, opts, vllm_config, kv_cache_config):
        self.umbp = umbp
        self.opts = opts
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.groups = describe_groups(kv_cache_config, getattr(vllm_config, "cache_config", None))
        self.topo = Topology.from_vllm_config(vllm_config)
        self.layout = _compat.kv_cache_layout(vllm_config)
        self.ns = derive_namespace(umbp, vllm_config, self.groups, self.topo, opts.key_namespace, self.layout)
        self.rank = self.topo.worker_rank(vllm_config, _compat.parallel_ranks())
        self.rank_id = self.topo.rank_id(self.rank)
        #: context parallelism: the scheduler half plans nothing (and says why,
        #: once), so this rank registers nothing and creates no pool
        self.inert = bool(self.topo.context_parallel_limit())
        self.timeout_ms = opts.resolved["timeout_ms"]

        self.rt = None
        self.kv: dict = {}  # vLLM group id -> umbp KV registration
        self.layer_group: dict = {}
        self.is_cuda = False
        self.serving = False
        self.local_registered = False

        self.meta = None
        self.saved = False  # wait_for_save ran since the last bind
        self.jobs: list = []  # in flight
        self.sync_loads: dict = {}  # group -> [_Job] of this step
        self.pending_stores: list = []  # StorePlans waiting for wait_for_save / get_finished
        self.async_pending: set = set()  # async-load requests to report in recving
        self.delayed_free: set = set()
        self.finished_seen: dict = {}  # req_id -> step first seen finished
        self.failed_block_ids: set = set()
        self.failed_recving: set = set()
        self.last_failed_recving: set = set()
        self.cleared_epoch = 0
        self.preempt_drained_step = -1
        self.flushed_step = None  # the metadata step whose freed-block stores were waited for
        self.tainted: dict = {}  # req_id -> epoch of its last failed load
        self.step = 0
        self.wmeta = UMBPWorkerMetadata()
        self.stats = UMBPConnectorStats()
        self.keymap = KeyMap() if opts.enable_events else None
        self.events_out: list = []
        self.n_submitted = 0
        self.n_completed = 0
        self.n_released = 0
        self.blocks_loaded_by_group: dict = {}
        self.blocks_stored_by_group: dict = {}
        #: test hook: while True, completed store jobs are not collected (they
        #: look in flight), to hold a request's delayed free deterministically
        self.hold_store_completions = False
        #: vLLM's V2 runner overwrites reallocated blocks (zeroing, block
        #: copies) before the connector's first hook of a step, so neither
        #: handle_preemptions nor bind can wait for a store of a block freed
        #: meanwhile (a preempted request's, one that left a sliding window, a
        #: Mamba state block): every store is waited for by the end of the step
        #: that submitted it (get_finished)
        self.fence_stores_in_step = not self.inert and _compat.uses_v2_model_runner(vllm_config)
        if self.fence_stores_in_step:
            log.warning("umbp: vLLM's V2 model runner zeroes and copies reallocated KV blocks before the "
                        "connector's first hook of a step (update_requests before pre_forward): umbp waits "
                        "for each step's stores at the end of that step, so that none reads a block reused "
                        "meanwhile")

    # ---- registration ----------------------------------------------------------

    def _runtime(self, device):
        if self.rt is not None:
            return self.rt
        self.is_cuda = device is not None and device.type == "cuda"
        backend = None if self.is_cuda else "host"
        dev = device.index if self.is_cuda and device.index is not None else (0 if self.is_cuda else None)
        cfg = self.opts.runtime_config(rank=self.rank, world_size=self.topo.world_size,
                                       dp_rank=self.topo.dp_rank,
                                       role="worker" if self.opts.props.sessions else None,
                                       gpu_backend=backend, gpu_device=dev)
        self.rt = self.umbp.Runtime(cfg)
        return self.rt

    def _after_register(self):
        o = self.opts
        if not o.props.shared_lookup and o.enable_lookup:
            try:
                self.rt.serve_lookups(self.ns.hex, self.topo.dp_rank, self.rank, o.lookup_dir or None,
                                      o.lookup_instance)
                self.serving = True
            except NotImplementedError as e:
                log.info("umbp: this libumbp cannot serve lookups over a socket (%s); only a scheduler "
                         "in this process can see rank %d's pool", e, self.rank)
        register_local(self.ns.hex, self.topo.dp_rank, o.lookup_instance, self.rank, self.rt)
        self.local_registered = True
        log.info("umbp connector (worker rank %d %s): namespace=%s groups=%s object sizes=%s",
                 self.rank, self.rank_id, self.ns.hex, [g.index for g in self.groups],
                 {g: kv.object_size for g, kv in self.kv.items()})

    @staticmethod
    def _first_tensor(x):
        while isinstance(x, (list, tuple)):
            x = x[0]
        return x

    @staticmethod
    def _state_views(layer_name, value):
        """A Mamba layer's state tensors as (num_blocks, 1, bytes) uint8 views
        (umbp's "mla" layout: one chunk per block), without copying."""
        import torch

        out = []
        for i, t in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            try:
                v = t.view(t.shape[0], -1).view(torch.uint8).unsqueeze(1)
            except RuntimeError as e:
                raise ValueError(f"umbp: Mamba state {i} of layer {layer_name!r} is not dense per block "
                                 f"(shape {tuple(t.shape)}, strides {t.stride()}): {e}") from None
            out.append(v)
        return out

    def _refresh_namespace(self):
        """The namespace again, now that the KV caches exist: newer vLLM
        resolves the KV cache layout in the engine core and hands it to the
        workers (cache_config.kv_cache_layout); the KV caches are allocated in
        that layout, so by their registration this rank's config has it,
        whenever the connector itself was created."""
        layout = _compat.kv_cache_layout(self.vllm_config)
        if layout != self.layout:
            self.layout = layout
            self.ns = derive_namespace(self.umbp, self.vllm_config, self.groups, self.topo,
                                       self.opts.key_namespace, layout)

    def register_kv_caches(self, kv_caches: dict):
        if not kv_caches:
            raise ValueError("umbp: register_kv_caches got no KV caches")
        if self.inert:
            log.info("umbp: rank %d: context parallelism: the connector is inert, no pool is created", self.rank)
            return
        self._refresh_namespace()
        rt = self._runtime(self._first_tensor(next(iter(kv_caches.values()))).device)
        expected = getattr(self.kv_cache_config, "num_blocks", None)
        single = len(self.groups) == 1 and not self.groups[0].layer_names
        for g in self.groups:
            names = list(kv_caches) if single else [n for n in g.layer_names if n in kv_caches]
            if not names:
                raise ValueError(f"umbp: no KV cache tensor of group {g.index} (layers {list(g.layer_names)[:4]}...) "
                                 "was registered")
            if g.kind == MAMBA:
                tensors = [v for n in names for v in self._state_views(n, kv_caches[n])]
                kv = rt.register_kv_caches(tensors, layout="mla")
            else:
                kv = rt.register_kv_caches({n: kv_caches[n] for n in names})
            if expected and kv.num_blocks != expected:
                raise ValueError(
                    f"umbp: group {g.index}'s KV tensors have {kv.num_blocks} blocks, the KV cache config "
                    f"{expected}: a kernel block size other than the scheduler's block size is not supported")
            self.kv[g.index] = kv
            for n in names:
                self.layer_group[n] = g.index
        self._after_register()

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend=None):
        if len(self.groups) != 1:
            raise ValueError("umbp: a cross-layer KV cache needs a single KV cache group")
        if self.inert:
            log.info("umbp: rank %d: context parallelism: the connector is inert, no pool is created", self.rank)
            return
        self._refresh_namespace()
        rt = self._runtime(kv_cache.device)
        g = self.groups[0]
        self.kv[g.index] = rt.register_kv_caches(kv_cache, layout="cross_layer")
        for n in g.layer_names:
            self.layer_group[n] = g.index
        self._after_register()

    # ---- per step ----------------------------------------------------------------

    def bind(self, meta):
        self.meta = meta
        self.saved = False
        if meta is None:
            return
        self.step = meta.step
        self.delayed_free |= meta.delayed_free_req_ids
        self.async_pending |= meta.async_load_req_ids
        for rid, ids in meta.load_error_ids.items():
            self.failed_block_ids.update(ids)
            if rid in meta.async_load_req_ids:
                self.failed_recving.add(rid)
        # a runner that did not hand the metadata to handle_preemptions first
        # (V2 runner: bind precedes it; old runners: a set of ids): flush here,
        # still before the forward
        self._flush(meta)
        if meta.preempted_req_ids and self.preempt_drained_step != meta.step:
            self.drain(meta.preempted_req_ids)  # a runner that never calls handle_preemptions

    def _event(self):
        if not self.is_cuda:
            return None
        import torch

        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        return ev

    def _keys(self, plan):
        """This rank's keys of a plan: the scheduler's (derived for its
        lookups) for the blocks the plan carries keys of, derived here for
        the rest."""
        k = plan.keys_of(self.rank, self.topo.world_size)
        m = 0 if k is None else len(k)
        if m == plan.num_blocks:
            return k
        rest = self.umbp.derive_keys(self.ns, rank=self.rank_id, group=plan.group,
                                     hashes=plan.hashes[m * plan.hash_len:], hash_len=plan.hash_len)
        return rest if not m else np.concatenate([k, rest])

    def _handle_clear(self, meta):
        if meta.clear_epoch > self.cleared_epoch:
            try:
                # a shared pool (standalone): one pool for every rank; a second
                # rank's clear would remove what the first stored since.
                # Distributed: each rank's node clears its own slice.
                if not self.opts.props.sessions or self.rank == 0:
                    self.rt.clear()
            except Exception as e:
                log.warning("umbp: reset_cache: clearing rank %d's pool failed: %s", self.rank, e)
            self.cleared_epoch = meta.clear_epoch
            self.wmeta.clears_done[meta.clear_epoch] = self.wmeta.clears_done.get(meta.clear_epoch, 0) + 1

    def start_load_kv(self, forward_context=None, **kwargs):
        meta = self.meta
        if meta is None or self.rt is None:
            return
        self._handle_clear(meta)
        now_stores = [p for p in meta.stores if not p.after_forward]
        self.pending_stores.extend(p for p in meta.stores if p.after_forward)
        if not meta.loads and not now_stores:
            return
        ev = self._event()
        for plan in meta.loads:
            self._submit_load(plan, ev)
        for plan in now_stores:
            self._submit_store(plan, ev)

    def _submit_load(self, plan, ev):
        kv = self.kv.get(plan.group)
        err = None
        if kv is None:
            err = f"group {plan.group} not registered"
        else:
            try:
                job = self.rt.load_blocks(kv, self._keys(plan), plan.block_id_array(), wait_event=ev)
            except self.umbp.UmbpError as e:
                err = e
        if err is not None:
            log.warning("umbp: rank %d: load of %d blocks of %s not submitted: %s", self.rank,
                        plan.num_blocks, plan.req_id, err)
            self.stats.add("submit_errors")
            self.stats.add("load_blocks_failed", plan.num_blocks)
            self.failed_block_ids.update(ids_of(plan.report_ids).tolist())
            self._taint(plan)
            if plan.is_async:
                self.failed_recving.add(plan.req_id)
            return
        j = _Job("load", plan, job, kv.object_size * plan.num_blocks, ev, sync=not plan.is_async)
        self.jobs.append(j)
        self.n_submitted += 1
        if j.sync:
            self.sync_loads.setdefault(plan.group, []).append(j)

    def _submit_store(self, plan, ev):
        if plan.epoch <= self.tainted.get(plan.req_id, -1):
            # planned before the scheduler saw this worker's failed load of the
            # request: the source blocks were computed from bad KV
            self.stats.add("store_blocks_failed", plan.num_blocks)
            self._store_done(plan, plan.num_blocks)
            return
        kv = self.kv.get(plan.group)
        err = None
        if kv is None:
            err = f"group {plan.group} not registered"
        else:
            try:
                keys = self._keys(plan)
                job = self.rt.store_blocks(kv, keys, plan.block_id_array(), wait_event=ev)
            except self.umbp.UmbpError as e:
                err = e
        if err is not None:
            log.warning("umbp: rank %d: store of %d blocks of %s not submitted: %s", self.rank,
                        plan.num_blocks, plan.req_id, err)
            self.stats.add("submit_errors")
            self.stats.add("store_blocks_failed", plan.num_blocks)
            self._store_done(plan, plan.num_blocks)
            return
        if self.keymap is not None:
            self.keymap.add(keys, plan.group, _split_hashes(plan))
        self.jobs.append(_Job("store", plan, job, kv.object_size * plan.num_blocks, ev))
        self.n_submitted += 1

    def _taint(self, plan):
        self.tainted[plan.req_id] = max(self.tainted.get(plan.req_id, -1), plan.epoch)

    def _store_done(self, plan, nfailed: int):
        w = self.wmeta
        w.stores_done[plan.plan_id] = w.stores_done.get(plan.plan_id, 0) + 1
        if nfailed:
            w.stores_failed_blocks[plan.plan_id] = w.stores_failed_blocks.get(plan.plan_id, 0) + nfailed

    def _submit_pending_stores(self):
        if not self.pending_stores:
            return
        ev = self._event()
        plans, self.pending_stores = self.pending_stores, []
        for plan in plans:
            self._submit_store(plan, ev)

    def wait_for_layer_load(self, layer_name: str):
        if not self.sync_loads:
            return
        g = self.layer_group.get(layer_name)
        groups = [g] if g is not None else list(self.sync_loads)
        for gid in groups:
            for j in self.sync_loads.pop(gid, ()):
                self._wait(j)
                self._finish_sync(j)

    def _finish_sync(self, j: _Job):
        """A synchronous load is complete once waited for: account for it now,
        so that its failures are known before this step's stores are submitted."""
        if j in self.jobs and (j.job.done or j.job.poll()):
            self.jobs.remove(j)
            self._complete(j)

    def _wait(self, j: _Job):
        if j.job.done or j.job.wait(self.timeout_ms + 1000):
            return True
        log.error("umbp: rank %d: %s job of %s still running past timeout_ms", self.rank, j.kind, j.req_id)
        return False

    def wait_for_save(self):
        # submit this step's stores; the copy waits for the compute stream's
        # event on the device, so nothing here blocks on it
        self._submit_pending_stores()
        self.saved = True

    def clear(self):
        """clear_connector_metadata: the step's last hook.  Stores still
        pending (a runner that ran no wait_for_save in this step) go out now."""
        self._submit_pending_stores()
        self.meta = None

    def _complete(self, j: _Job):
        st = np.asarray(j.job.statuses)
        ok = st == 0
        nok = int(ok.sum())
        nfail = int(ok.size - nok)
        dt = time.monotonic() - j.t0
        per = j.nbytes // max(1, j.plan.num_blocks)
        if j.kind == "load":
            self.stats.add("load_jobs")
            self.stats.add("load_blocks_ok", nok)
            self.stats.add("load_blocks_failed", nfail)
            self.stats.add("load_bytes", per * nok)
            self.stats.add("load_seconds", dt)
            self.blocks_loaded_by_group[j.group] = self.blocks_loaded_by_group.get(j.group, 0) + nok
            if nfail:
                bad = np.flatnonzero(~ok)
                self.failed_block_ids.update(ids_of(j.plan.report_ids)[bad].tolist())
                data = bad[(st[bad] != self.umbp.E_NOT_ATTEMPTED) & (st[bad] != self.umbp.E_TIMEOUT)]
                if data.size:  # quarantined by the scheduler
                    h = np.frombuffer(j.plan.hashes, dtype=np.uint8).reshape(-1, j.plan.hash_len)
                    self.wmeta.failed_loads.extend((j.group, x.tobytes()) for x in h[data])
                self._taint(j.plan)
                if j.plan.is_async:
                    self.failed_recving.add(j.req_id)
                log.info("umbp: rank %d: %d of %d blocks of %s failed to load (%s): recomputed", self.rank,
                         nfail, ok.size, j.req_id, self.umbp.strerror(int(st[~ok][0])))
        else:
            self.stats.add("store_jobs")
            self.stats.add("store_blocks_ok", nok)
            self.stats.add("store_blocks_failed", nfail)
            self.stats.add("store_bytes", per * nok)
            self.stats.add("store_seconds", dt)
            self.blocks_stored_by_group[j.group] = self.blocks_stored_by_group.get(j.group, 0) + nok
            self._store_done(j.plan, nfail)
            if nfail:
                log.info("umbp: rank %d: %d of %d blocks of %s failed to store (%s)", self.rank, nfail, ok.size,
                         j.req_id, self.umbp.strerror(int(st[~ok][0])))
        j.job.release()
        self.n_completed += 1
        self.n_released += 1

    def _collect(self, wait=None):
        """Completes every finished job (and waits for those wait(job) selects)."""
        keep = []
        for j in self.jobs:
            waited = wait is not None and wait(j)
            if waited:
                self._wait(j)
            if j.kind == "store" and self.hold_store_completions and not waited:
                keep.append(j)
                continue
            if j.job.done or j.job.poll():
                self._complete(j)
            else:
                keep.append(j)
        self.jobs = keep

    def drain(self, req_ids):
        """Waits for the loads and stores of these requests (preempted: their
        blocks go to other requests in the next forward)."""
        ids = set(req_ids)
        if ids and any(j.req_id in ids for j in self.jobs):
            self._collect(wait=lambda j: j.req_id in ids)

    def _flush(self, meta):
        """Waits for the stores whose source blocks vLLM frees in this step
        (sliding-window blocks leaving the window, Mamba state blocks), once
        per step.  It must run before the runner's _update_states, which
        zeroes newly allocated blocks and applies kv_cache_block_copies: a
        freed block reallocated in this step would otherwise be overwritten
        while the store still reads it (zeros published under a valid key).
        The V1 runner calls handle_preemptions(metadata) before
        _update_states, so the wait is there (as in vLLM's base docstring and
        its OffloadingConnector); bind repeats it for other runners."""
        step = getattr(meta, "step", None)
        if meta is None or (step is not None and self.flushed_step == step):
            return
        self.flushed_step = step
        ids = getattr(meta, "flush_plan_ids", None)
        if ids and any(j.kind == "store" and j.plan.plan_id in ids for j in self.jobs):
            self._collect(wait=lambda j: j.kind == "store" and j.plan.plan_id in ids)

    def handle_preemptions(self, arg):
        if isinstance(arg, (set, frozenset, list, tuple)):
            ids = set(arg)
        else:
            self._flush(arg)
            ids = set(getattr(arg, "preempted_req_ids", None) or ())
        if ids:
            self.drain(ids)
        if arg is not None and hasattr(arg, "step"):
            self.preempt_drained_step = arg.step
        elif self.meta is not None:
            self.preempt_drained_step = self.meta.step

    def get_finished(self, finished_req_ids):
        for rid in finished_req_ids or ():
            self.finished_seen.setdefault(rid, self.step)
            self.tainted.pop(rid, None)
        for gid in list(self.sync_loads):  # a model that never called wait_for_layer_load
            for j in self.sync_loads.pop(gid):
                self._wait(j)
                self._finish_sync(j)
        # This step's stores go out in wait_for_save, or in clear (a step
        # without wait_for_save).  Not here while a wait_for_save may still
        # come: with a speculative config vLLM's V1 runner collects the results
        # (this call) before the drafter writes its layer's KV and calls
        # wait_for_save after it (mixin@00f4240ee645 defer_finalize); a store
        # submitted now would copy the draft layer's blocks before that write.
        if self.meta is None or self.saved:
            self._submit_pending_stores()
        if self.fence_stores_in_step:
            self._collect(wait=lambda j: j.kind == "store")
        else:
            self._collect()
        busy_load = {j.req_id for j in self.jobs if j.kind == "load"}
        busy_store = {j.req_id for j in self.jobs if j.kind == "store"}
        busy_store.update(p.req_id for p in self.pending_stores)
        recving = {r for r in self.async_pending if r not in busy_load}
        self.async_pending -= recving
        sending = {r for r in self.delayed_free if r in self.finished_seen and r not in busy_store}
        self.delayed_free -= sending
        for r in sending:
            self.finished_seen.pop(r, None)
        if len(self.finished_seen) > 64:  # keep only what a delayed free may still need
            self.finished_seen = {r: s for r, s in self.finished_seen.items()
                                  if r in self.delayed_free or s >= self.step - 8}
        self.last_failed_recving = self.failed_recving & recving
        self.failed_recving -= recving
        self._drain_events()
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> set:
        out, self.failed_block_ids = self.failed_block_ids, set()
        return out

    def _drain_events(self):
        if self.keymap is None or self.rt is None:
            return
        while True:
            types, keys = self.rt.drain_events()
            if len(types) == 0:
                break
            self.events_out.extend(self.keymap.translate(self.rank, types, keys))
            if len(types) < 4096:
                break

    def get_kv_connector_kv_cache_events(self):
        if not self.events_out:
            return None
        ev, self.events_out = UMBPKVEvents(self.events_out), []
        return ev

    def build_connector_worker_meta(self):
        if self.wmeta.is_empty():
            return None
        out, self.wmeta = self.wmeta, UMBPWorkerMetadata()
        return out

    def get_kv_connector_stats(self):
        return self.stats.take()

    def counters(self) -> dict:
        return {
            "rank": self.rank,
            "jobs_submitted": self.n_submitted,
            "jobs_completed": self.n_completed,
            "jobs_released": self.n_released,
            "jobs_inflight": len(self.jobs),
            "pending_stores": len(self.pending_stores),
            "async_loads_pending": len(self.async_pending),
            "delayed_free_pending": len(self.delayed_free),
            "blocks_loaded_by_group": dict(self.blocks_loaded_by_group),
            "blocks_stored_by_group": dict(self.blocks_stored_by_group),
        }

    def shutdown(self):
        deadline = time.monotonic() + self.timeout_ms / 1000.0 + 1.0
        for j in self.jobs:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                if not (j.job.done or j.job.wait(left)):
                    log.warning("umbp: rank %d: %s job of %s still running at shutdown", self.rank, j.kind,
                                j.req_id)
            except Exception:
                pass
            try:
                j.job.release()
                self.n_released += 1
            except Exception:
                pass
        self.jobs = []
        self.pending_stores = []
        self.sync_loads = {}
        if self.local_registered:
            unregister_local(self.ns.hex, self.topo.dp_rank, self.opts.lookup_instance, self.rank, self.rt)
            self.local_registered = False
        if self.rt is not None:
            for kv in self.kv.values():
                try:
                    self.rt.deregister(kv)
                except Exception:
                    pass
            self.kv = {}
            self.rt.close()
            self.rt = None
