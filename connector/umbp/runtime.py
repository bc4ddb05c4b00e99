"""Runtime, KV cache registration, block transfers, host put/get, lookups.

One Runtime per worker rank (umbp_runtime_t).  Every data operation submits
one batch with one C call and returns a Job at once; batches are built as
numpy arrays of the C structs (umbp/_ffi.py) by vectorised assignment, so
no hot path loops over keys in Python.  A job reads its per-key statuses
with one umbp_op_statuses call, which also says whether it is done.

Lifetime: closing a runtime (close(), the context manager, or garbage
collection) frees every op handle it gave out (umbp_runtime_destroy), so
Jobs and KVCaches check that their runtime is open before touching a
handle.  Like the C API, close() must not race with other calls on the same
runtime; every other method may be called from any thread.

Fork: a child forked from a process holding runtimes gets none of their
threads, so every runtime of the parent is dead in the child (_forked_child):
its pointer is dropped without umbp_runtime_destroy, and every call raises
EBADF.  The child creates its own.

Arguments are checked here before they reach ctypes, which would wrap an
integer out of its C type's range instead of refusing it.
"""
import array
import ctypes
import errno
import json
import os
import time
import weakref

import numpy as np

from . import _ffi
from . import _kvlayout
from . import _lib
from ._lib import UmbpError

E_INPROGRESS = -4097
E_NOT_ATTEMPTED = -4098
E_TIMEOUT = -4099
E_DUPLICATE_KEY = -4102

_KEY = _ffi.KEY_SIZE
_RANGE_SZ = _ffi.RANGE_DT.itemsize
_LOOKUP_TOUCH = 1
# lookup results that mean "could not ask": every key counts as a miss
_LOOKUP_MISS_RCS = frozenset((E_TIMEOUT, E_NOT_ATTEMPTED, -errno.EAGAIN))

_op_statuses = _lib.umbp_op_statuses
_op_wait = _lib.umbp_op_wait
_prewake = _lib.umbp_prewake
_op_release = _lib.umbp_op_release
_kv_store = _lib.umbp_kv_store
_kv_load = _lib.umbp_kv_load
_kv_warm_load = _lib.umbp_kv_warm_load
_put = _lib.umbp_put
_get = _lib.umbp_get
_lookup = _lib.umbp_lookup
_byref = ctypes.byref
_c_void_p = ctypes.c_void_p
_U32_MAX = (1 << 32) - 1
_INT_MAX = (1 << 31) - 1
_KV_MAX_BATCH = 1 << 24  # kv_submit refuses more (-EINVAL)
_WARM_BUF_BLOCKS = 4096  # the block arrays made ready at registration (_warm_submit)
_E_SHAPE = -4101  # UMBP_E_SHAPE: kv_check's answer to a block id past the layout


def _count(x, what, hi=_U32_MAX):
    """x as an int in [0, hi]: an integer, not a bool (ctypes would wrap it)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= x <= hi:
        raise UmbpError(-errno.EINVAL, "%s must be an integer in 0 .. %d, got %r" % (what, hi, x))
    return int(x)


def _timeout(t):
    """timeout_ms for a C int: None or < 0 is -1 (the runtime's timeout_ms)."""
    if t is None:
        return -1
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t > _INT_MAX:
        raise UmbpError(-errno.EINVAL, "timeout_ms must be None, an integer < 0 (the runtime's "
                        "timeout_ms) or 0 .. %d, got %r" % (_INT_MAX, t))
    return -1 if t < 0 else int(t)


def keys_array(keys):
    """Keys as a C-contiguous uint8 array (n, 32): from such an array (or a
    flat uint8 array of n * 32), one bytes object of n * 32, or a list of
    32-byte bytes."""
    if isinstance(keys, np.ndarray):
        if keys.dtype != np.uint8:
            raise TypeError("keys must be a uint8 array, got %s" % keys.dtype)
        if keys.ndim == 1:
            if keys.size % _KEY:
                raise UmbpError(-errno.EINVAL, "keys: %d bytes is not a multiple of 32" % keys.size)
            keys = keys.reshape(-1, _KEY)
        elif keys.ndim != 2 or keys.shape[1] != _KEY:
            raise UmbpError(-errno.EINVAL, "keys must be shaped (n, 32), got %s" % (keys.shape,))
        return keys if keys.flags.c_contiguous else np.ascontiguousarray(keys)
    if isinstance(keys, (list, tuple)):
        if keys and set(map(len, keys)) != {_KEY}:
            raise _bad_key_item(keys)
        joined = b"".join(keys)
        # each item is at least 32 bytes (len 32): 32 each in all is 32 each
        if len(joined) != _KEY * len(keys):
            raise _bad_key_item(keys)
        keys = joined
    if isinstance(keys, (bytes, bytearray, memoryview)):
        a = np.frombuffer(keys, dtype=np.uint8)
        if a.size % _KEY:
            raise UmbpError(-errno.EINVAL, "keys: %d bytes is not a multiple of 32" % a.size)
        return a.reshape(-1, _KEY)
    raise TypeError("keys must be a uint8 array (n, 32), bytes or a list of bytes, not %s"
                    % type(keys).__name__)


def _bad_key_item(keys):
    """The error naming the first item of a list of keys that is not 32 bytes."""
    for i, k in enumerate(keys):
        try:
            nbytes = memoryview(k).nbytes
        except TypeError:
            nbytes = None
        if len(k) != _KEY or nbytes != _KEY:
            return UmbpError(-errno.EINVAL, "keys: item %d is a %s of %s bytes; every key must "
                             "be 32 bytes (bytes, bytearray, memoryview or a uint8 array of 32)"
                             % (i, type(k).__name__, nbytes if nbytes is not None else "?"))
    return UmbpError(-errno.EINVAL, "keys: every key must be 32 bytes")


def _as_numpy(x):
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor, without importing torch
        return x.detach().cpu().numpy()
    return np.asarray(x)


_BOOLS = frozenset((bool, np.bool_))
_ONE = np.uint64(1)


def _u64(x, n, what):
    """A uint64 vector of n (a scalar broadcasts).  Bools, which Python and
    array('Q') take as integers, are refused: as a scalar, in a list, or as
    a bool array."""
    if isinstance(x, (int, np.integer)):
        if isinstance(x, bool):
            raise UmbpError(-errno.EINVAL, "%s must be integers, not a bool" % what)
        if x < 0:
            raise UmbpError(-errno.EINVAL, "%s must be >= 0, got %d" % (what, x))
        return np.full(n, x, dtype=np.uint64)
    if isinstance(x, (list, tuple)):  # vLLM's block ids
        if len(x) != n:
            raise UmbpError(-errno.EINVAL, "%s must have %d entries (one per key), got %d"
                            % (what, n, len(x)))
        # array('Q') converts a list of ints 2-3x faster than np.fromiter
        # and refuses negative ones itself, but takes a bool as 0 or 1
        try:
            a = np.frombuffer(array.array("Q", x), dtype=np.uint64)
        except OverflowError:
            raise UmbpError(-errno.EINVAL, "%s: negative entry (or one over 2^64 - 1)"
                            % what) from None
        except TypeError:
            a = None  # a np.bool_ too, where numpy no longer takes it as an index
        # only an entry of 0 or 1 can be a bool: ids above 1 cost an argmin
        # (~0.3 us for 625), others a set of the entries' types (~4 us)
        if a is None or n and a[a.argmin()] <= _ONE:
            if not _BOOLS.isdisjoint(set(map(type, x))):
                i = next(i for i, v in enumerate(x) if type(v) in _BOOLS)
                raise TypeError("%s must be integers, not bools (entry %d is %r)"
                                % (what, i, x[i]))
            if a is None:
                raise TypeError("%s must be integers" % what)
        return a
    a = _as_numpy(x)
    if a.dtype.kind == "b":  # O(1): a bool array, a mask, is no list of integers
        raise TypeError("%s must be integers, got %s" % (what, a.dtype))
    if a.ndim != 1 or a.shape[0] != n:
        raise UmbpError(-errno.EINVAL, "%s must have %d entries (one per key), got shape %s"
                        % (what, n, a.shape))
    if a.dtype.kind == "i":
        if n and a.min() < 0:
            raise UmbpError(-errno.EINVAL, "%s: negative entry" % what)
    elif a.dtype.kind != "u" and n:
        raise TypeError("%s must be integers, got %s" % (what, a.dtype))
    return a


def _u64_2d(x, n, what, k=None):
    a = _as_numpy(x)
    if a.dtype.kind not in "iu":
        raise TypeError("%s must be integers, got %s" % (what, a.dtype))
    if a.ndim == 1 and k is not None and a.shape[0] == k:
        a = np.broadcast_to(a, (n, k))
    if a.ndim != 2 or a.shape[0] != n or (k is not None and a.shape[1] != k):
        raise UmbpError(-errno.EINVAL, "%s must be shaped (%d, k), got %s" % (what, n, a.shape))
    if a.dtype.kind == "i" and a.size and a.min() < 0:
        raise UmbpError(-errno.EINVAL, "%s: negative entry" % what)
    return a


def _some_ranges(what, ptrs):
    """k of ptrs (n, k): at least 1 where n > 0."""
    n, k = ptrs.shape
    if n and not k:
        raise UmbpError(-errno.EINVAL, "%s: ptrs is shaped (%d, 0): every object needs at least "
                        "one range" % (what, n))
    return k


def event_handle(ev):
    """The raw cudaEvent_t / hipEvent_t of ev: None, an int, a torch.cuda.Event
    (its cuda_event), or a torch.Event (its event_id)."""
    if ev is None:
        return None
    if isinstance(ev, (int, np.integer)) and not isinstance(ev, bool):
        h = int(ev)
    else:
        for attr in ("cuda_event", "event_id"):
            h = getattr(ev, attr, None)
            if h is not None and not isinstance(h, bool):
                h = int(h)
                break
        else:
            raise TypeError("wait_event must be a torch.cuda.Event or a raw event handle (int), "
                            "not %s" % type(ev).__name__)
    if not 0 <= h < 1 << 64:
        raise UmbpError(-errno.EINVAL, "wait_event: an event handle is an address in "
                        "0 .. 2^64 - 1, got %d" % h)
    return h or None


class Job:
    """One submitted batch.  Per-key statuses once done (0 = ok)."""

    __slots__ = ("_rt", "_op", "_n", "_st", "_keep", "kind", "__weakref__")

    def __init__(self, rt, op, n, kind, keep=None):
        self._rt = rt
        self._op = op
        self._n = n
        self._st = None if op else _frozen(np.zeros(n, dtype=np.int32))
        self._keep = keep
        self.kind = kind

    def __len__(self):
        return self._n

    def _handle(self):
        if self._rt._ptr is None:
            self._op = None  # freed by umbp_runtime_destroy (or the parent's, after a fork)
            raise self._rt._dead("umbp job: its runtime was closed before it completed")
        if self._op is None:
            raise UmbpError(-errno.EBADF, "umbp job: released before it completed")
        return self._op

    def poll(self):
        """True once the op has completed (never blocks)."""
        if self._st is not None:
            return True
        st = np.empty(self._n, dtype=np.int32)
        rc = _op_statuses(self._handle(), st.ctypes.data, self._n)
        if rc == E_INPROGRESS:
            return False
        if rc < 0:
            raise _lib.error(rc, "umbp_op_statuses")
        self._st = _frozen(st)
        return True

    def wait(self, timeout_ms=None):
        """Waits up to timeout_ms (None or < 0: the runtime's timeout_ms,
        after which the op has completed with timeouts anyway; at most
        2^31 - 1).  True when done."""
        t = _timeout(timeout_ms)
        if self._st is not None:
            return True
        _op_wait(self._handle(), t)
        return self.poll()

    @property
    def done(self):
        return self.poll()

    @property
    def statuses(self):
        """np.int32 (n,), read-only: 0 or a negative code per key; UmbpError
        E_INPROGRESS before the op is done."""
        if not self.poll():
            raise UmbpError(E_INPROGRESS, "umbp job: %s" % _lib.strerror(E_INPROGRESS))
        return self._st.view()  # its base is read-only: the view cannot be made writeable

    @property
    def ok(self):
        return self.statuses == 0

    @property
    def num_ok(self):
        return int(np.count_nonzero(self.statuses == 0))

    def release(self):
        """Hands the op back (idempotent).  Released in flight: a put still
        completes; a get may write its destination until it notices (wait
        first if the memory is reused)."""
        op, self._op = self._op, None
        self._keep = None
        if op is not None and self._rt._ptr is not None:
            _op_release(op)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def __repr__(self):
        state = ("done" if self._st is not None else "closed" if self._rt._ptr is None
                 else "released" if self._op is None else "pending")
        return "<umbp.Job %s n=%d %s>" % (self.kind, self._n, state)


def _frozen(st):
    st.flags.writeable = False
    return st


def _refuse_repeats(what, keys, h):
    """E_DUPLICATE_KEY where a key of keys[h:] repeats one of keys[:h] (a
    split batch: each op refuses repeats within itself)."""
    words = keys.view(np.uint64)
    # the tail's first words looked up in the head's, sorted: 8 us for 625
    # keys on a 2-vCPU VM where a set of them took 13 (it runs between the
    # head's submission and the tail's)
    first = words[:, 0]
    heads = np.sort(first[:h])
    tail = first[h:]
    at = np.searchsorted(heads, tail)
    np.minimum(at, h - 1, out=at)
    if not (heads.take(at) == tail).any():
        return
    head = words[:h]
    for i in range(h, keys.shape[0]):
        same = np.flatnonzero((head == words[i]).all(axis=1))
        if same.size:
            raise UmbpError(E_DUPLICATE_KEY, "%s of %d blocks: key %d repeats key %d" % (
                what, keys.shape[0], i, int(same[0])))


class _SplitJob(Job):
    """One batch submitted as several ops (Runtime.kv_head_blocks): a Job
    whose statuses are its parts' in order."""

    __slots__ = ("_parts",)

    def __init__(self, rt, parts, kind, keep=None):
        Job.__init__(self, rt, True, sum(len(j) for j in parts), kind, keep)
        self._parts = parts

    def _handle(self):
        raise AssertionError("a split job has no single op")

    def poll(self):
        if self._st is not None:
            return True
        # one array, each part's statuses copied into its slice: what runs
        # right after a wait-up stays short (docs/benchmarks.md)
        st = np.empty(self._n, dtype=np.int32)
        addr, off = st.ctypes.data, 0
        for j in self._parts:
            rc = _op_statuses(j._handle(), addr + 4 * off, j._n)
            if rc == E_INPROGRESS:
                return False
            if rc < 0:
                raise _lib.error(rc, "umbp_op_statuses")
            off += j._n
        self._st = _frozen(st)
        return True

    def wait(self, timeout_ms=None):
        t = _timeout(timeout_ms)
        if self._st is not None:
            return True
        if self._rt._ptr is None:
            self._parts[0]._handle()  # raises: the runtime was closed
        if self._op is None:
            raise UmbpError(-errno.EBADF, "umbp job: released before it completed")
        if t < 0:  # as Job.wait: each part up to the runtime's timeout_ms
            for j in self._parts:
                _op_wait(j._handle(), -1)
            return self.poll()
        end = time.monotonic() + t / 1e3
        for j in self._parts:
            _op_wait(j._handle(), max(0, int((end - time.monotonic()) * 1e3)))
        return self.poll()

    def release(self):
        self._op = None
        self._keep = None
        for j in self._parts:
            j.release()


class KVCache:
    """A registered KV cache (umbp_kv_register).  Holds its tensors: they
    must outlive the registration."""

    __slots__ = ("_rt", "handle", "object_size", "num_blocks", "num_layers", "layout", "tensors")

    def __init__(self, rt, handle, object_size, num_blocks, num_layers, layout, tensors):
        self._rt = weakref.ref(rt)  # the runtime holds its KV caches, not the reverse
        self.handle = handle
        self.object_size = object_size
        self.num_blocks = num_blocks
        self.num_layers = num_layers
        self.layout = layout
        self.tensors = tensors

    def __repr__(self):
        return "<umbp.KVCache handle=%d %s blocks=%d layers=%d object_size=%d>" % (
            self.handle or 0, self.layout, self.num_blocks, self.num_layers, self.object_size)


_live = weakref.WeakSet()  # every open Runtime, for _forked_child


def _forked_child():
    """After os.fork(), in the child: the parent's runtimes have no threads
    here and their memory is a copy; destroying one (close(), collection at
    exit) crashed, and ops submitted to one never completed.  Each is marked
    dead without umbp_runtime_destroy, as if closed."""
    for rt in list(_live):
        rt._forked = True
        rt._ptr = None
        for kv in rt._kvs:
            kv.handle = None
        rt._kvs = []
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


class Runtime:
    """One umbp runtime (one per worker rank)."""

    _forked = False  # set in a forked child (_forked_child)

    def __init__(self, options=None, **kw):
        if options is None:
            options = {}
        if isinstance(options, str):
            if kw:
                options = dict(json.loads(options or "{}"), **kw)
        elif isinstance(options, dict):
            options = dict(options, **kw)
        else:
            raise TypeError("options must be a dict or a JSON string")
        text = options if isinstance(options, str) else json.dumps(options)
        self._ptr = None
        self.events_lost = 0
        self.last_lookup_rc = 0
        self._kvs = []
        self._bufs = []  # block arrays, reused (_kv_op)
        out = _c_void_p()
        _lib.check(_lib.umbp_runtime_create(text.encode("utf-8"), _byref(out)),
                   "umbp_runtime_create", use_last=True)
        self._pid = os.getpid()
        self._ptr = out.value
        _live.add(self)

    # ---- lifetime ----------------------------------------------------------

    def _p(self):
        p = self._ptr
        if p is None:
            raise self._dead("umbp runtime is closed")
        return p

    def _dead(self, closed):
        """The EBADF of a call on this runtime once closed (message closed),
        or in a process forked from the one that created it."""
        if self._forked:
            return UmbpError(-errno.EBADF, "umbp runtime belongs to the parent process (pid %d): "
                             "a forked child must create its own Runtime" % self._pid)
        return UmbpError(-errno.EBADF, closed)

    @property
    def closed(self):
        """True once closed, and in a forked child (the parent's runtime)."""
        return self._ptr is None

    def close(self, _destroy=_lib.umbp_runtime_destroy):
        """Completes in-flight ops (with errors where they cannot finish) and
        frees everything, outstanding jobs included.  Idempotent."""
        p, self._ptr = self._ptr, None
        if p is not None:
            for kv in self._kvs:
                kv.handle = None
            self._kvs = []
            _live.discard(self)
            _destroy(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- KV cache ----------------------------------------------------------

    def register_kv_caches(self, kv_caches, layout="auto", num_blocks=None):
        """Registers KV tensors: a dict (order = layer order), a list, or one
        (cross-layer) tensor.  layout: auto, flash_attn, flashinfer, mla,
        cross_layer or a dict of dims (see umbp/_kvlayout.py)."""
        arr, tensors, info = _kvlayout.describe(kv_caches, layout, num_blocks)
        h = ctypes.c_uint64()
        _lib.check(_lib.umbp_kv_register(self._p(), arr, len(arr), _byref(h)),
                   "register_kv_caches", use_last=True)
        kv = KVCache(self, h.value, int(_lib.umbp_kv_object_size(self._ptr, h.value)),
                     info["num_blocks"], info["num_layers"], info["layout"], tuple(tensors))
        self._kvs.append(kv)
        if len(self._kvs) == 1:
            self._warm_submit(kv)
        return kv

    def _warm_submit(self, kv):
        """Runs the Python side of store_blocks / load_blocks before the
        engine's first batch, so that batch does not pay for this code's
        first runs (numpy's and ctypes' first calls, the interpreter's first
        passes over it: on an H200 host a first store's submit took 60-80 us
        longer than a steady one's, and ran 1-2 points of the pinned copy's
        speed slower).  First batches of no blocks, which C refuses before
        touching anything; then, twice, a whole batch as an engine submits it
        (8 heads: split, waited for, its statuses read, released) through
        umbp_kv_warm_load, which copies nothing and counts nothing, of
        random keys.  The C side warms itself (gpu_warm_transfers,
        gpu_warm_store)."""
        p = self._p()
        # the block arrays the first batches fill, written once: a first
        # batch's own would come from heap pages never touched (a 625-block
        # store faulted 5 in on a 2-vCPU VM; first touches of a VM's memory
        # can cost far more on a GPU host)
        m = min(int(kv.num_blocks), _WARM_BUF_BLOCKS)
        while len(self._bufs) < 2:
            b = np.empty(max(m, 1), dtype=_ffi.KV_BLOCK_DT)
            b.view(np.uint8).fill(0)
            self._bufs.append(b)
        keys = keys_array(np.arange(2 * _KEY, dtype=np.uint8).reshape(2, _KEY))
        ids = _u64([0, 1], 2, "block_ids")
        _refuse_repeats("warm", keys, 1)
        for fn in (_kv_store, _kv_load):
            blocks = np.empty(2, dtype=_ffi.KV_BLOCK_DT)
            blocks["key"] = keys.view("V32")[:, 0]
            blocks["block"] = ids
            op = _c_void_p()
            if fn(p, kv.handle, blocks.ctypes.data, 0, None, _byref(op)) >= 0 and op.value:
                _op_release(op.value)  # C took an empty batch after all: hand it back
        n = min(int(kv.num_blocks), 8 * max(self._head_blocks, 4))
        if n < 2:
            return
        ids = list(range(n))  # a list, as vLLM passes its block ids
        for _ in range(2):
            keys = np.frombuffer(os.urandom(n * _KEY), dtype=np.uint8).reshape(n, _KEY)
            try:
                job = self._kv_submit(_kv_warm_load, "warm-up", kv, keys, ids, 0, 0, None)
                done = job.wait(1000)  # a server stopped just now: a second at most
                if done:
                    job.num_ok  # the statuses' read, as an engine's first batch does
                job.release()
                if not done:
                    return
            except UmbpError:  # a warm-up never fails registration
                return

    def deregister(self, kv):
        """Unregisters kv (idempotent).  C refuses (-EBUSY) while a job on it
        is in flight (waited for or not, released or not), its message saying
        how many; then kv stays registered and keeps its tensors.  Jobs on kv
        hold its tensors themselves until they are released."""
        if kv.handle is None:
            return
        if kv._rt() is not self:
            raise UmbpError(-errno.ENOENT, "deregister: the KV cache belongs to another runtime")
        rc = _lib.umbp_kv_deregister(self._p(), kv.handle)
        if rc < 0:  # before any change; only -EBUSY sets umbp_last_error (the count)
            raise _lib.error(rc, "deregister", use_last=rc == -errno.EBUSY)
        kv.handle = None
        kv.tensors = ()
        self._kvs = [k for k in self._kvs if k is not kv]

    _head_blocks = 32

    @property
    def kv_head_blocks(self):
        """A store or restore of at least 8 x kv_head_blocks blocks is
        submitted as a head of kv_head_blocks, then the rest: the head's copy
        runs while this thread converts and submits the rest and the runtime
        takes its leases or reservations (H200 host, a 328 MB prefix: about
        +1 point of the pinned copy's speed, docs/benchmarks.md).  The whole
        batch's block ids, their range and the other arguments are checked
        before the head goes.  A key of the rest that repeats one of the head
        is refused (E_DUPLICATE_KEY) as in one op, after the head ran (waited
        for and released first), as is what only C finds in the rest.
        0: one op.  Default 32."""
        return self._head_blocks

    @staticmethod
    def _count_option(name, n, zero):
        """n as an int where it is an integer >= 0 (not a bool), else
        -EINVAL naming the option and what 0 means."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise UmbpError(-errno.EINVAL, "%s must be an integer >= 0 (0: %s), got %r"
                            % (name, zero, n))
        return int(n)

    @kv_head_blocks.setter
    def kv_head_blocks(self, n):
        self._head_blocks = self._count_option("kv_head_blocks", n, "one op")

    _head_bytes = 0

    @property
    def kv_head_bytes(self):
        """A split batch's head is at least kv_head_blocks blocks and, up to
        a quarter of the batch, at least kv_head_bytes of objects: a longer
        head copies for longer while this thread submits the rest.  On an
        H200 host (a 328 MB prefix of 512 KiB objects) 32 MiB, a head of 64
        blocks, did not make first stores faster than a head of 32 blocks
        and some first restores were slower (docs/benchmarks.md), so it is
        off by default.  0: a head of exactly kv_head_blocks.  Default 0."""
        return self._head_bytes

    @kv_head_bytes.setter
    def kv_head_bytes(self, n):
        self._head_bytes = self._count_option("kv_head_bytes", n,
                                              "a head of exactly kv_head_blocks")

    def prewake(self):
        """A batch is about to be submitted: where poll_wait is on, the
        loop thread wakes now and polls for it (at most 1 ms) instead of
        waking when it arrives (umbp_prewake).  store_blocks and load_blocks
        do this themselves before they build the batch; call it earlier where
        more work comes first."""
        _prewake(self._p())

    def _kv_submit(self, fn, what, kv, keys, block_ids, first_layer, num_layers, wait_event):
        p = self._p()
        _prewake(p)  # its wake-up overlaps the conversions below
        if kv.handle is None or kv._rt() is not self:
            raise UmbpError(-errno.ENOENT, "%s: the KV cache is not registered with this runtime"
                            % what)
        keys = keys_array(keys)
        n = keys.shape[0]
        # the whole batch is checked before any part of it goes (a split
        # batch's head would run although the call raised)
        ids = _u64(block_ids, n, "block_ids")
        if (first_layer or num_layers or first_layer.__class__ is not int
                or num_layers.__class__ is not int):
            first_layer = _count(first_layer, "first_layer")
            num_layers = _count(num_layers, "num_layers")
        ev = event_handle(wait_event)
        if not n:
            return Job(self, None, 0, what)
        if ids.max() >= kv.num_blocks:  # C's kv_check, which would find it in the rest only
            i = int(np.argmax(ids >= kv.num_blocks))
            raise UmbpError(_E_SHAPE, "%s of %d blocks: %s: block id %d (key %d) is past the KV "
                            "cache's %d blocks" % (what, n, _lib.strerror(_E_SHAPE), int(ids[i]),
                                                   i, kv.num_blocks))
        opts = None
        if first_layer or num_layers or ev:
            opts = _byref(_ffi.KvXferOpts(first_layer, num_layers, ev))
        h = self._head_blocks
        if h and 8 * h <= n <= _KV_MAX_BATCH:
            if self._head_bytes:  # at least kv_head_bytes of copy, at most a quarter
                h = max(h, min(-(-self._head_bytes // kv.object_size), n // 4))
            head = self._kv_op(p, fn, what, kv, keys[:h], ids[:h], opts, n)
            try:
                # while the head copies: each op refuses repeats within itself
                _refuse_repeats(what, keys, h)
                tail = self._kv_op(p, fn, what, kv, keys[h:], ids[h:], opts, n)
            except BaseException:
                head.wait()  # in flight it may still copy the caller's blocks
                head.release()
                raise
            return _SplitJob(self, (head, tail), what, kv.tensors)
        return self._kv_op(p, fn, what, kv, keys, ids, opts, n)

    def _kv_op(self, p, fn, what, kv, keys, ids, opts, total):
        """One op of keys; total: the batch's size (a split batch's errors
        name the whole batch)."""
        n = keys.shape[0]
        bufs = self._bufs  # list.pop and append: safe between threads
        buf = bufs.pop() if bufs else None
        if buf is None or buf.shape[0] < n:
            buf = np.empty(n, dtype=_ffi.KV_BLOCK_DT)
        blocks = buf[:n]
        blocks["key"] = keys.view("V32")[:, 0]
        blocks["block"] = ids
        op = _c_void_p()
        rc = fn(p, kv.handle, blocks.ctypes.data, n, opts, _byref(op))
        if len(bufs) < 4:
            bufs.append(buf)  # C read the blocks during the call only
        if rc < 0:
            raise _lib.error(rc, "%s of %d blocks" % (what, total))
        # the tensors, not kv: deregister drops kv's, the job may still copy
        return Job(self, op.value, n, what, kv.tensors)

    def store_blocks(self, kv, keys, block_ids, wait_event=None):
        """Stores whole blocks as the objects of keys (umbp_kv_store)."""
        return self._kv_submit(_kv_store, "store_blocks", kv, keys, block_ids, 0, 0, wait_event)

    def load_blocks(self, kv, keys, block_ids, first_layer=0, num_layers=0, wait_event=None):
        """Restores objects into blocks, optionally layers [first_layer,
        first_layer + num_layers) only (umbp_kv_load)."""
        return self._kv_submit(_kv_load, "load_blocks", kv, keys, block_ids, first_layer,
                               num_layers, wait_event)

    # ---- host objects ------------------------------------------------------

    def _submit_items(self, fn, what, items, n, ranges):
        op = _c_void_p()
        rc = fn(self._p(), items.ctypes.data, n, _byref(op))
        if rc < 0:
            raise _lib.error(rc, "%s of %d keys" % (what, n))
        return Job(self, op.value, n, what)

    @staticmethod
    def _ranges(ptrs, lens, offsets):
        r = np.empty(ptrs.shape, dtype=_ffi.RANGE_DT)
        r["ptr"] = ptrs
        r["len"] = lens
        r["offset"] = offsets
        return r

    def put(self, keys, ptrs, sizes):
        """Puts one object per key from host memory: ptrs (n,), sizes (n,) or int."""
        keys = keys_array(keys)
        n = keys.shape[0]
        ptrs = _u64(ptrs, n, "ptrs")
        sizes = _u64(sizes, n, "sizes")
        if not n:
            return Job(self, None, 0, "put")
        r = self._ranges(ptrs, sizes, 0)
        items = np.empty(n, dtype=_ffi.PUT_ITEM_DT)
        items["key"] = keys.view("V32")[:, 0]
        items["object_size"] = sizes
        items["ranges"] = np.arange(r.ctypes.data, r.ctypes.data + n * _RANGE_SZ, _RANGE_SZ,
                                    dtype=np.uint64)
        items["num_ranges"] = 1
        return self._submit_items(_put, "put", items, n, r)

    def put_ranges(self, keys, object_size, ptrs, lens):
        """Puts objects of object_size (int or (n,)) from k ranges each:
        ptrs and lens (n, k), tiling [0, object_size) in order."""
        keys = keys_array(keys)
        n = keys.shape[0]
        ptrs = _u64_2d(ptrs, n, "ptrs")
        k = _some_ranges("put_ranges", ptrs)
        lens = _u64_2d(lens, n, "lens", k).astype(np.uint64, copy=False)
        osz = _u64(object_size, n, "object_size")
        if not n:
            return Job(self, None, 0, "put_ranges")
        offsets = np.cumsum(lens, axis=1, dtype=np.uint64) - lens
        r = self._ranges(ptrs, lens, offsets)
        items = np.empty(n, dtype=_ffi.PUT_ITEM_DT)
        items["key"] = keys.view("V32")[:, 0]
        items["object_size"] = osz
        step = k * _RANGE_SZ
        items["ranges"] = np.arange(r.ctypes.data, r.ctypes.data + n * step, step, dtype=np.uint64)
        items["num_ranges"] = k
        return self._submit_items(_put, "put_ranges", items, n, r)

    def get(self, keys, ptrs, sizes):
        """Gets the first sizes bytes (whole objects) of each key into ptrs."""
        keys = keys_array(keys)
        n = keys.shape[0]
        ptrs = _u64(ptrs, n, "ptrs")
        sizes = _u64(sizes, n, "sizes")
        if not n:
            return Job(self, None, 0, "get")
        r = self._ranges(ptrs, sizes, 0)
        items = np.empty(n, dtype=_ffi.GET_ITEM_DT)
        items["key"] = keys.view("V32")[:, 0]
        items["ranges"] = np.arange(r.ctypes.data, r.ctypes.data + n * _RANGE_SZ, _RANGE_SZ,
                                    dtype=np.uint64)
        items["num_ranges"] = 1
        return self._submit_items(_get, "get", items, n, r)

    def get_ranges(self, keys, ptrs, lens, offsets):
        """Gets k ranges of each object: ptrs, lens, offsets (n, k)."""
        keys = keys_array(keys)
        n = keys.shape[0]
        ptrs = _u64_2d(ptrs, n, "ptrs")
        k = _some_ranges("get_ranges", ptrs)
        lens = _u64_2d(lens, n, "lens", k)
        offsets = _u64_2d(offsets, n, "offsets", k)
        if not n:
            return Job(self, None, 0, "get_ranges")
        r = self._ranges(ptrs, lens, offsets)
        items = np.empty(n, dtype=_ffi.GET_ITEM_DT)
        items["key"] = keys.view("V32")[:, 0]
        step = k * _RANGE_SZ
        items["ranges"] = np.arange(r.ctypes.data, r.ctypes.data + n * step, step, dtype=np.uint64)
        items["num_ranges"] = k
        return self._submit_items(_get, "get_ranges", items, n, r)

    # ---- lookups and control -----------------------------------------------

    def lookup(self, keys, touch=False):
        """(prefix, present): the consecutive present prefix and np.bool_ (n,).
        A lookup that could not ask (timeout, stalled backend, too many in
        flight) reports every key absent; last_lookup_rc says which."""
        p = self._p()
        keys = keys_array(keys)
        n = keys.shape[0]
        present = np.zeros(n, dtype=np.uint8)
        if not n:
            self.last_lookup_rc = 0
            return 0, present.view(np.bool_)
        prefix = ctypes.c_size_t()
        rc = _lookup(p, keys.ctypes.data, n, present.ctypes.data, _byref(prefix),
                     _LOOKUP_TOUCH if touch else 0)
        self.last_lookup_rc = rc
        if rc < 0:
            if rc in _LOOKUP_MISS_RCS:
                present[:] = 0
                return 0, present.view(np.bool_)
            raise _lib.error(rc, "lookup of %d keys" % n)
        return prefix.value, present.view(np.bool_)

    def exists(self, keys):
        return self.lookup(keys)[1]

    def clear(self):
        _lib.check(_lib.umbp_clear(self._p()), "clear")

    def flush(self, timeout_ms=None):
        """Waits for every put submitted before; True when all completed,
        False past the timeout (None or < 0: the runtime's timeout_ms; at most
        2^31 - 1)."""
        rc = _lib.umbp_flush(self._p(), _timeout(timeout_ms))
        if rc == E_TIMEOUT:
            return False
        _lib.check(rc, "flush")
        return True

    def stats(self):
        """Every umbp_stats_t counter, by name."""
        s = _ffi.Stats()
        _lib.check(_lib.umbp_get_stats(self._p(), _byref(s)), "stats")
        return {f: getattr(s, f) for f in _ffi.STATS_FIELDS}

    def drain_events(self, max=4096):
        """(types np.uint8 (m,), keys np.uint8 (m, 32)), oldest first; 1 =
        stored, 2 = removed.  events_lost: events dropped before this drain
        (resynchronise if non-zero).  Needs the enable_events option."""
        p = self._p()
        buf = np.empty(_count(max, "drain_events: max", 1 << 62), dtype=_ffi.EVENT_DT)
        lost = ctypes.c_uint64()
        m = _lib.umbp_events_drain(p, buf.ctypes.data, buf.shape[0], _byref(lost))
        self.events_lost = lost.value
        raw = buf[:m].view(np.uint8).reshape(m, _ffi.EVENT_DT.itemsize)
        return buf["type"][:m].astype(np.uint8), np.ascontiguousarray(raw[:, 4:4 + _KEY])

    def serve_lookups(self, ns_hex, dp_index, rank, lookup_dir=None, instance=""):
        """Serves the scheduler's LookupClient for this rank (embedded mode)."""
        f = _lib.optional("umbp_lookup_serve")
        ns_hex = getattr(ns_hex, "hex", ns_hex)
        dp_index = _count(dp_index, "serve_lookups: dp_index")
        rank = _count(rank, "serve_lookups: rank")
        _lib.check(f(self._p(), lookup_dir.encode() if lookup_dir else None, ns_hex.encode(),
                     (instance or "").encode(), dp_index, rank),
                   "serve_lookups", use_last=True)
