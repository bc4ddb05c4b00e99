"""The scheduler's lookups (C: include/umbp/lookup.h, the lookup service).

A LookupClient asks every rank of one data-parallel engine whether blocks
are present, one round trip per rank per batch: from the workers' lookup
sockets in embedded mode (each worker calls Runtime.serve_lookups), or from
the server in standalone mode.  A failure (timeout, no such socket) counts as
a miss; query_ex also returns the code.

The functions are resolved on first use: with a libumbp that predates the
lookup service they raise umbp.LibraryTooOld (an UmbpError and a
NotImplementedError), and the rest of the package works as before.

umbp_lookup_client_query(c, keys, n, rows, row_rank, present, prefix): keys
holds rows x n keys, row r for rank row_rank[r] (rank r when row_rank is
NULL); present gets rows x n bytes, one per key; *prefix is the longest i
such that keys 0..i-1 are present in every row.  A failing rank makes its
rows absent and the call returns its code, with prefix and present still
valid; -EINVAL alone means nothing was asked (raised here).

The C client is for one thread at a time; a LookupClient serialises its
calls with a lock, so it may be shared by threads.

Fork: as a Runtime (umbp/runtime.py), a client of the parent is dead in a
forked child (_forked_child): its C state (connections shared with the
parent, a standalone client's runtime and its threads, which the child
lacks) is the parent's, so its pointer is dropped without
umbp_lookup_client_destroy and every query raises EBADF naming the parent's
pid.  The child creates its own.
"""
import ctypes
import errno
import json
import os
import threading
import weakref

import numpy as np

from . import _lib
from ._lib import UmbpError

_KEY = 32


def lookup_socket_path(dir, ns_hex, instance, dp_index, rank):
    """The path of the lookup socket of (namespace, instance, dp, rank)."""
    f = _lib.optional("umbp_lookup_socket_path")
    ns_hex = getattr(ns_hex, "hex", ns_hex)
    buf = ctypes.create_string_buffer(4096)
    for what, v in (("dp_index", dp_index), ("rank", rank)):
        # ctypes would wrap -1 or 2**32 into another rank's socket
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < 1 << 32:
            raise UmbpError(-errno.EINVAL, "lookup_socket_path: %s must be an integer in "
                            "0 .. 4294967295, got %r" % (what, v))
    _lib.check(f(dir.encode() if dir else None, ns_hex.encode(), (instance or "").encode(),
                 int(dp_index), int(rank), buf, len(buf)), "lookup_socket_path", use_last=True)
    return buf.value.decode()


def _rows_array(keys_rows):
    a = keys_rows
    if not isinstance(a, np.ndarray):
        raise TypeError("keys_rows must be a uint8 array (rows, n, 32)")
    if a.dtype != np.uint8:
        raise TypeError("keys_rows must be uint8, got %s" % a.dtype)
    if a.ndim == 2 and a.shape[1] == _KEY:
        a = a.reshape(1, -1, _KEY)
    if a.ndim != 3 or a.shape[2] != _KEY:
        raise UmbpError(-errno.EINVAL, "keys_rows must be shaped (rows, n, 32), got %s"
                        % (a.shape,))
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


_live = weakref.WeakSet()  # every open LookupClient, for _forked_child


def _forked_child():
    """After os.fork(), in the child: each client of the parent is marked
    dead without umbp_lookup_client_destroy (its sockets are the parent's
    connections, a standalone client's runtime has no threads here), as if
    closed.  Its lock is new: another thread of the parent may have held
    the old one at the fork."""
    for c in list(_live):
        c._forked = True
        c._ptr = None
        c._lock = threading.Lock()
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


class LookupClient:
    """A scheduler-side lookup client (umbp_lookup_client_create)."""

    _forked = False  # set in a forked child (_forked_child)

    def __init__(self, options=None, **kw):
        opts = dict(options or {}, **kw)
        self._create = _lib.optional("umbp_lookup_client_create")
        self._destroy = _lib.optional("umbp_lookup_client_destroy")
        self._query = _lib.optional("umbp_lookup_client_query")
        self._ptr = None
        self._lock = threading.Lock()
        out = ctypes.c_void_p()
        _lib.check(self._create(json.dumps(opts).encode(), ctypes.byref(out)),
                   "LookupClient", use_last=True)
        self._pid = os.getpid()
        self._ptr = out.value
        _live.add(self)

    def _dead(self):
        """The EBADF of a query once closed, or in a process forked from the
        one that created the client."""
        if self._forked:
            return UmbpError(-errno.EBADF, "LookupClient belongs to the parent process (pid %d): "
                             "a forked child must create its own LookupClient" % self._pid)
        return UmbpError(-errno.EBADF, "LookupClient is closed")

    @property
    def closed(self):
        """True once closed, and in a forked child (the parent's client)."""
        return self._ptr is None

    def query_ex(self, keys_rows, row_rank=None):
        """(prefix, present, rc): present np.bool_ (rows, n), one per key of
        each row; rc 0, or the negative code of a failing rank (its rows are
        absent; the other ranks' answers are kept)."""
        a = _rows_array(keys_rows)
        rows, n = a.shape[0], a.shape[1]
        rr = None
        if row_rank is not None:
            rr = np.ascontiguousarray(row_rank, dtype=np.uint32)
            if rr.shape != (rows,):
                raise UmbpError(-errno.EINVAL, "row_rank must have %d entries (one per row)" % rows)
        present = np.zeros((rows, n), dtype=np.uint8)
        prefix = ctypes.c_size_t()
        with self._lock:
            if self._ptr is None:
                raise self._dead()
            rc = self._query(self._ptr, a.ctypes.data, n, rows,
                             None if rr is None else rr.ctypes.data, present.ctypes.data,
                             ctypes.byref(prefix))
            if rc == -errno.EINVAL:
                raise _lib.error(rc, "LookupClient.query", use_last=True)
        return int(prefix.value), present.view(np.bool_), min(rc, 0)

    def query(self, keys_rows, row_rank=None):
        """The count of leading blocks present in every row (failures are misses)."""
        return self.query_ex(keys_rows, row_rank)[0]

    def close(self):
        """Frees the C client (idempotent).  In a forked child the parent's
        client is already dropped: nothing of the parent's is touched."""
        with self._lock:
            p, self._ptr = self._ptr, None
            if p is not None:
                _live.discard(self)
                self._destroy(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
