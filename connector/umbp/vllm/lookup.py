"""The scheduler's lookups: which blocks every worker rank holds.

One query per request covers every rank and group at once (rows = ranks x
groups, one round trip per batch).  Three ways to answer it:

- ``ClientLookup``: ``umbp.LookupClient`` over the workers' lookup sockets
  (embedded mode; each worker serves its pool with ``rt.serve_lookups``).
- ``LocalLookup``: the workers' runtimes live in this process (TP=1 under
  vLLM's single-process executor, which runs the worker in the engine-core
  process beside the scheduler; the harness): ask them directly.
- ``StandaloneLookup``: a ``role: lookup`` session of umbp-server; every rank's
  objects are in the one shared pool, so one ``rt.lookup`` answers all rows.
- ``DistributedLookup``: ``umbp.LookupClient`` in distributed mode, which asks
  umbp-master; its index knows every node's keys (each rank's runtime is a
  node), within a heartbeat of their store.

Every failure is a miss (all rows absent), never an exception on the scheduler
thread.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ._compat import get_logger

log = get_logger("umbp.vllm.lookup")

# ---- in-process registry of worker runtimes ----------------------------------

_local_lock = threading.Lock()
_local: dict[tuple, dict[int, object]] = {}


def register_local(ns_hex: str, dp: int, instance: str, rank: int, rt) -> None:
    with _local_lock:
        _local.setdefault((ns_hex, dp, instance), {})[rank] = rt


def unregister_local(ns_hex: str, dp: int, instance: str, rank: int, rt=None) -> None:
    with _local_lock:
        d = _local.get((ns_hex, dp, instance))
        if d is not None and (rt is None or d.get(rank) is rt):
            d.pop(rank, None)
            if not d:
                _local.pop((ns_hex, dp, instance), None)


def local_runtimes(ns_hex: str, dp: int, instance: str, world: int):
    """The runtimes of ranks 0..world-1 when all of them are in this process."""
    with _local_lock:
        d = _local.get((ns_hex, dp, instance))
        if not d or any(r not in d for r in range(world)):
            return None
        return [d[r] for r in range(world)]


class LookupBackend:
    name = "none"

    def query(self, rows: np.ndarray, row_rank: np.ndarray):
        """rows: uint8 (R, n, 32); row_rank: int (R,).  Returns (present bool
        (R, n), rc) with rc 0 or a negative code (then everything is absent)."""
        raise NotImplementedError

    def clear(self):
        """Clears every rank's pool now: True/False, or None when this backend
        cannot (the workers clear it on the next step instead)."""
        return None

    def close(self):
        pass


class LocalLookup(LookupBackend):
    name = "local"

    def __init__(self, runtimes):
        self.runtimes = runtimes

    def query(self, rows, row_rank):
        present = np.zeros(rows.shape[:2], dtype=bool)
        for i in range(rows.shape[0]):
            _, p = self.runtimes[int(row_rank[i])].lookup(rows[i], touch=False)
            present[i] = p
        return present, 0

    def clear(self):
        for rt in self.runtimes:
            rt.clear()
        return True


class ClientLookup(LookupBackend):
    name = "client"

    def __init__(self, client):
        self.client = client
        self.lock = threading.Lock()

    def query(self, rows, row_rank):
        with self.lock:
            _, present, rc = self.client.query_ex(rows, row_rank=row_rank)
        present = np.asarray(present, dtype=bool).reshape(rows.shape[:2])
        if rc < 0:
            present[:] = False
        return present, int(rc)

    def close(self):
        try:
            self.client.close()
        except Exception:
            pass


class StandaloneLookup(LookupBackend):
    name = "standalone"

    def __init__(self, rt):
        self.rt = rt

    def query(self, rows, row_rank):
        r, n = rows.shape[:2]
        _, present = self.rt.lookup(np.ascontiguousarray(rows.reshape(r * n, -1)), touch=False)
        return np.asarray(present, dtype=bool).reshape(r, n), 0

    def clear(self):
        self.rt.clear()
        return True

    def close(self):
        try:
            self.rt.close()
        except Exception:
            pass


class DistributedLookup(LookupBackend):
    """Distributed mode: the lookup client asks umbp-master, in one round trip
    per query.  Created on first use and retried every ``retry_s`` while it
    cannot be (a missing secret file is a config error, refused at once)."""

    name = "distributed"

    def __init__(self, umbp, runtime_cfg: dict, world: int, timeout_ms: int, retry_s: float = 5.0):
        self.umbp = umbp
        self.cfg = {"mode": runtime_cfg["mode"], "num_ranks": max(1, world), "lookup_timeout_ms": timeout_ms}
        for k in ("master_address", "secret_file"):
            if runtime_cfg.get(k):
                self.cfg[k] = runtime_cfg[k]
        self.retry_s = retry_s
        self.client: ClientLookup | None = None
        self.next_try = 0.0
        self.lock = threading.Lock()
        self.warned = False

    def _client(self):
        with self.lock:
            if self.client is not None:
                return self.client
            now = time.monotonic()
            if now < self.next_try:
                return None
            self.next_try = now + self.retry_s
            try:
                self.client = ClientLookup(self.umbp.LookupClient(self.cfg))
            except Exception as e:
                if not self.warned:
                    log.warning("umbp: the master's lookup client cannot be made (%s); lookups miss", e)
                    self.warned = True
            return self.client

    def query(self, rows, row_rank):
        c = self._client()
        if c is None:
            return np.zeros(rows.shape[:2], dtype=bool), -1
        return c.query(rows, row_rank)

    def close(self):
        if self.client is not None:
            self.client.close()


class EmbeddedLookup(LookupBackend):
    """Embedded mode: in-process runtimes when every rank is here, else the
    lookup client (created on first use; retried every ``retry_s`` while the
    workers' sockets are not up yet)."""

    name = "embedded"

    def __init__(self, umbp, ns_hex: str, world: int, dp: int, lookup_dir: str, instance: str,
                 timeout_ms: int, retry_s: float = 5.0):
        self.umbp = umbp
        self.ns_hex, self.world, self.dp = ns_hex, world, dp
        self.lookup_dir, self.instance, self.timeout_ms = lookup_dir, instance, timeout_ms
        self.retry_s = retry_s
        self.client: ClientLookup | None = None
        self.unavailable: str | None = None  # why the client cannot exist (NotImplementedError)
        self.next_try = 0.0
        self.lock = threading.Lock()
        self.warned = False

    def _local(self):
        rts = local_runtimes(self.ns_hex, self.dp, self.instance, self.world)
        return LocalLookup(rts) if rts is not None else None

    def _client(self):
        with self.lock:
            if self.client is not None or self.unavailable is not None:
                return self.client
            now = time.monotonic()
            if now < self.next_try:
                return None
            self.next_try = now + self.retry_s
            cfg = {"mode": "embedded", "namespace": self.ns_hex, "num_ranks": self.world,
                   "dp_index": self.dp, "lookup_instance": self.instance,
                   "lookup_timeout_ms": self.timeout_ms}
            if self.lookup_dir:
                cfg["lookup_dir"] = self.lookup_dir
            try:
                self.client = ClientLookup(self.umbp.LookupClient(cfg))
            except NotImplementedError as e:
                self.unavailable = str(e) or "umbp.LookupClient is not implemented"
                log.warning("umbp: the scheduler cannot reach the workers' pools (%s); every lookup is a miss "
                            "unless the workers run in this process", self.unavailable)
            except Exception as e:  # sockets not up yet, ...
                if not self.warned:
                    log.warning("umbp: lookup client not ready (%s); lookups miss until it is", e)
                    self.warned = True
            return self.client

    def backend(self):
        return self._local() or self._client()

    def query(self, rows, row_rank):
        b = self.backend()
        if b is None:
            return np.zeros(rows.shape[:2], dtype=bool), -1
        return b.query(rows, row_rank)

    def clear(self):
        b = self._local()
        return b.clear() if b is not None else None

    def close(self):
        if self.client is not None:
            self.client.close()
