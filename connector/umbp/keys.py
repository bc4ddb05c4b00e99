"""Namespaces and keys (C: include/umbp/keys.h, runtime/keys.c).

Namespace / derive_keys call the library (one C call per batch).  The
pure-Python functions namespace_py, namespace_from_string_py and
derive_key_py encode the same bytes for hashlib.blake2b; tests check that
both agree and reproduce the digests pinned in tests/unit/test_keys.c.

Byte layout (runtime/keys.c): a string is u32 length (little endian) then
its bytes; an integer is a u32 little endian; a namespace is its 16 raw
bytes.  The first field is a version tag.
  namespace = BLAKE2b-128("umbp-ns-v1", model, revision, block_size, layout,
              dtype, num_groups, {kind, block_size, num_layers, dtype}...,
              tp, pp, pcp, dcp)
  override  = BLAKE2b-128("umbp-ns-override-v1", s)
  key       = BLAKE2b-256("umbp-key-v1", ns[16], tp, pp, pcp, dcp, group,
              u32 hash_len, hash bytes)       (the hash itself is not
              length-prefixed: its length precedes it as a plain u32)
"""
import ctypes
import errno
import hashlib
import struct

import numpy as np

from . import _ffi
from . import _lib
from ._lib import UmbpError

KEY_SIZE = _ffi.KEY_SIZE
NS_SIZE = _ffi.NS_SIZE
BLOCK_HASH_MAX = _ffi.BLOCK_HASH_MAX
_STR_MAX = 4096
_GROUPS_MAX = 64

_NS_TAG = b"umbp-ns-v1"
_NS_OVERRIDE_TAG = b"umbp-ns-override-v1"
_KEY_TAG = b"umbp-key-v1"


def _einval(msg):
    return UmbpError(-errno.EINVAL, msg)


def _enc(s, field, may_be_empty=False):
    if s is None:
        s = ""
    if isinstance(s, str):
        b = s.encode("utf-8")
    elif isinstance(s, (bytes, bytearray)):
        b = bytes(s)
    else:
        raise TypeError("namespace: %s must be a str, not %s" % (field, type(s).__name__))
    if not b and not may_be_empty:
        raise _einval("namespace: %s is required" % field)
    if len(b) > _STR_MAX:
        raise _einval("namespace: %s is longer than %d bytes" % (field, _STR_MAX))
    if b"\0" in b:
        raise _einval("namespace: %s contains a NUL character" % field)
    return b


def _size(v, field):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError("namespace: %s must be an int" % field)
    v = int(v)
    if v < 1 or v > 0xFFFFFFFF:
        raise _einval("namespace: %s must be >= 1 (and fit 32 bits), got %d" % (field, v))
    return v


def _u32id(v, field):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError("%s must be an int" % field)
    v = int(v)
    if v < 0 or v > 0xFFFFFFFF:
        raise _einval("%s must be 0 .. 2^32-1, got %d" % (field, v))
    return v


def _norm_desc(model, revision, block_size, layout, dtype, groups, tp, pp, pcp, dcp):
    """Validated, encoded fields, in the order they are hashed."""
    groups = list(groups or ())
    if len(groups) > _GROUPS_MAX:
        raise _einval("namespace: num_groups must be 0 .. %d with groups given" % _GROUPS_MAX)
    gs = []
    for g in groups:
        if isinstance(g, dict):
            g = (g["kind"], g["block_size"], g["num_layers"], g["dtype"])
        kind, gbs, gnl, gdt = g
        gs.append((_enc(kind, "groups[].kind"), _size(gbs, "groups[].block_size"),
                   _size(gnl, "groups[].num_layers"), _enc(gdt, "groups[].dtype")))
    return (_enc(model, "model"), _enc(revision, "revision", True), _size(block_size, "block_size"),
            _enc(layout, "layout"), _enc(dtype, "dtype"), gs,
            _size(tp, "tp"), _size(pp, "pp"), _size(pcp, "pcp"), _size(dcp, "dcp"))


# ---- pure-Python reference ---------------------------------------------------

def _h_u32(v):
    return struct.pack("<I", v)


def _h_str(b):
    return struct.pack("<I", len(b)) + b


def namespace_py(model, revision, block_size, layout, dtype, groups=(), tp=1, pp=1, pcp=1, dcp=1):
    """The 16-byte namespace, computed with hashlib (reference for tests)."""
    m, rev, bs, lay, dt, gs, tp, pp, pcp, dcp = _norm_desc(
        model, revision, block_size, layout, dtype, groups, tp, pp, pcp, dcp)
    h = hashlib.blake2b(digest_size=NS_SIZE)
    for part in (_h_str(_NS_TAG), _h_str(m), _h_str(rev), _h_u32(bs), _h_str(lay), _h_str(dt),
                 _h_u32(len(gs))):
        h.update(part)
    for kind, gbs, gnl, gdt in gs:
        h.update(_h_str(kind) + _h_u32(gbs) + _h_u32(gnl) + _h_str(gdt))
    h.update(_h_u32(tp) + _h_u32(pp) + _h_u32(pcp) + _h_u32(dcp))
    return h.digest()


def namespace_from_string_py(s):
    b = _enc(s, "key_namespace")
    return hashlib.blake2b(_h_str(_NS_OVERRIDE_TAG) + _h_str(b), digest_size=NS_SIZE).digest()


def _rank4(rank):
    if isinstance(rank, (int, np.integer)) and not isinstance(rank, bool):
        rank = (rank, 0, 0, 0)
    rank = tuple(rank)
    if len(rank) != 4:
        raise _einval("rank must be (tp, pp, pcp, dcp), got %r" % (rank,))
    return tuple(_u32id(v, "rank." + n) for v, n in zip(rank, ("tp", "pp", "pcp", "dcp")))


def derive_key_py(ns, rank, group, block_hash):
    """One 32-byte key, computed with hashlib (reference for tests)."""
    nsb = ns.bytes if isinstance(ns, Namespace) else bytes(ns)
    if len(nsb) != NS_SIZE:
        raise _einval("namespace must be %d bytes" % NS_SIZE)
    hb = bytes(block_hash)
    if not 1 <= len(hb) <= BLOCK_HASH_MAX:
        raise _einval("hash_len %d outside 1 .. %d" % (len(hb), BLOCK_HASH_MAX))
    tp, pp, pcp, dcp = _rank4(rank)
    msg = (_h_str(_KEY_TAG) + nsb + struct.pack("<6I", tp, pp, pcp, dcp, _u32id(group, "group"),
                                                 len(hb)) + hb)
    return hashlib.blake2b(msg, digest_size=KEY_SIZE).digest()


# ---- the library -------------------------------------------------------------

class Namespace:
    """16 bytes naming what makes blocks interchangeable (model, layout, ...)."""

    __slots__ = ("_c", "bytes", "hex")

    def __init__(self, raw):
        raw = bytes(raw)
        if len(raw) != NS_SIZE:
            raise _einval("a namespace is %d bytes, got %d" % (NS_SIZE, len(raw)))
        self._c = _ffi.Ns.from_buffer_copy(raw)
        self.bytes = raw
        self.hex = raw.hex()

    @classmethod
    def derive(cls, model, revision, block_size, layout, dtype, groups=(), tp=1, pp=1, pcp=1,
               dcp=1):
        m, rev, bs, lay, dt, gs, tp, pp, pcp, dcp = _norm_desc(
            model, revision, block_size, layout, dtype, groups, tp, pp, pcp, dcp)
        garr = (_ffi.CacheGroupDesc * max(1, len(gs)))()
        for i, (kind, gbs, gnl, gdt) in enumerate(gs):
            garr[i] = _ffi.CacheGroupDesc(kind, gbs, gnl, gdt)
        d = _ffi.NsDesc(model=m, revision=rev, block_size=bs, layout=lay, dtype=dt,
                        groups=ctypes.cast(garr, ctypes.POINTER(_ffi.CacheGroupDesc)),
                        num_groups=len(gs), tp=tp, pp=pp, pcp=pcp, dcp=dcp)
        out = _ffi.Ns()
        _lib.check(_lib.umbp_ns_derive(ctypes.byref(d), ctypes.byref(out)), "umbp_ns_derive",
                   use_last=True)
        return cls(bytes(out))

    @classmethod
    def from_string(cls, s):
        """The namespace of a user's key_namespace override."""
        b = _enc(s, "key_namespace")
        out = _ffi.Ns()
        _lib.check(_lib.umbp_ns_from_string(b, ctypes.byref(out)), "umbp_ns_from_string",
                   use_last=True)
        return cls(bytes(out))

    @classmethod
    def from_hex(cls, s):
        if not isinstance(s, str):
            raise TypeError("namespace hex must be a str")
        out = _ffi.Ns()
        _lib.check(_lib.umbp_ns_from_hex(s.encode("ascii", "replace"), ctypes.byref(out)),
                   "umbp_ns_from_hex", use_last=True)
        return cls(bytes(out))

    def __eq__(self, other):
        return isinstance(other, Namespace) and other.bytes == self.bytes

    def __hash__(self):
        return hash(self.bytes)

    def __repr__(self):
        return "umbp.Namespace(%s)" % self.hex


def _hashes_buffer(hashes, hash_len):
    """(contiguous uint8 array or bytes, n, hash_len) from the accepted forms."""
    if isinstance(hashes, np.ndarray):
        a = hashes
        if a.dtype != np.uint8:
            raise TypeError("hashes array must be uint8, got %s" % a.dtype)
        if a.ndim == 1:
            if not hash_len:
                raise _einval("a 1-d hashes array needs hash_len=")
            a = a.reshape(-1, hash_len)
        if a.ndim != 2:
            raise _einval("hashes array must be (n, hash_len), got shape %s" % (a.shape,))
        if hash_len and a.shape[1] != hash_len:
            raise _einval("hashes array is (n, %d) but hash_len=%d" % (a.shape[1], hash_len))
        return np.ascontiguousarray(a), a.shape[0], a.shape[1]
    if isinstance(hashes, (bytes, bytearray, memoryview)):
        b = bytes(hashes)
        if not hash_len:
            raise _einval("hashes given as one bytes object need hash_len=")
        if len(b) % hash_len:
            raise _einval("hashes: %d bytes is not a multiple of hash_len %d" % (len(b), hash_len))
        return b, len(b) // hash_len, hash_len
    if not isinstance(hashes, (list, tuple)):
        hashes = list(hashes)
    if not hashes:
        return b"", 0, hash_len or 32
    lens = set(map(len, hashes))
    if len(lens) != 1:
        raise _einval("hashes: every block hash must have the same length, got lengths %s"
                      % sorted(lens))
    hl = lens.pop()
    if hash_len and hl != hash_len:
        raise _einval("hashes are %d bytes but hash_len=%d" % (hl, hash_len))
    try:
        b = b"".join(hashes)
    except TypeError:
        raise TypeError("hashes must be bytes objects") from None
    return b, len(hashes), hl


_RANK_C = {}  # (tp, pp, pcp, dcp) of plain ints -> its RankId: a connector asks for the same few


def _rank_c(rank):
    """The RankId of rank (validated by _rank4), cached for tuples of ints."""
    if type(rank) is tuple:
        r = _RANK_C.get(rank)
        if r is not None and all(type(v) is int for v in rank):
            return r
    t = _rank4(rank)
    r = _ffi.RankId(*t)
    if type(rank) is tuple and len(_RANK_C) < 1024 and all(type(v) is int for v in rank):
        _RANK_C[rank] = r
    return r


def derive_keys(ns, rank=(0, 0, 0, 0), group=0, hashes=(), hash_len=None):
    """Keys of one rank and cache group: np.ndarray uint8 (n, 32), one C call.

    hashes: list of bytes (equal lengths 1..64), one bytes object of
    n * hash_len (pass hash_len=), or a uint8 array (n, hash_len)."""
    if not isinstance(ns, Namespace):
        ns = Namespace(ns)
    buf, n, hl = _hashes_buffer(hashes, hash_len)
    if not 1 <= hl <= BLOCK_HASH_MAX:
        raise _einval("umbp_keys_derive: hash_len %d outside 1 .. %d" % (hl, BLOCK_HASH_MAX))
    r = _rank_c(rank)
    out = np.empty((n, KEY_SIZE), dtype=np.uint8)
    if n:
        src = buf.ctypes.data if isinstance(buf, np.ndarray) else buf
        _lib.check(_lib.umbp_keys_derive(ctypes.byref(ns._c), ctypes.byref(r),
                                         _u32id(group, "group"), src, hl, n, out.ctypes.data),
                   "umbp_keys_derive", use_last=True)
    return out
