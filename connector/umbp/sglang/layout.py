"""Where each page of SGLang's host KV pool lives, for ranged put/get.

SGLang's HiCache host pool (``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost``,
python/sglang/srt/mem_cache/pool_host/{mha,mla}.py; see
docs/sglang.md for the commit) keeps one ``kv_buffer`` tensor whose shape
depends on ``--hicache-mem-layout``.  ``size`` is the number of token slots and
``P = size / page_size`` the number of pages:

====================  ==============================  ==========================
layout                MHA ``kv_buffer``               MLA ``kv_buffer``
====================  ==============================  ==========================
layer_first           (2, L, size, H, D)              (L, size, 1, D)
page_first            (2, size, L, H, D)              (size, L, 1, D)
page_first_direct     (2, P, L, page_size, H, D)      (P, L, page_size, 1, D)
page_head             (2, P, H, page_size, L, D)      (not an MLA layout)
====================  ==============================  ==========================

A page is named by the token slot of its first token (``host_indices[::page_size]``).
Every address of a page is ``base + first_slot * m + c[j]`` for a few
constants: ``j`` runs over the page's pieces in object order.

- page-first layouts (page_first, page_first_direct, page_head): one
  contiguous all-layer piece for K and one for V (MLA: one piece), each
  ``L * page_size * H * D * itemsize`` bytes, ``m = L * H * D * itemsize``,
  ``c = [0, v_offset]`` -- SGLang's own ``get_page_buffer_meta`` pointers;
- layer_first: one piece per (K/V, layer), ``page_size * H * D * itemsize``
  bytes each, ``m = H * D * itemsize``, ``c[kv * L + l] = kv * v_offset +
  l * size * H * D * itemsize``.

``v_offset`` is half the buffer (SGLang's ``layer_num * size * head_num *
head_dim * itemsize``).  The object of a page is its pieces end to end in
that order, which is exactly SGLang's flat data page
(``get_data_page(index).flatten()``) for every layout, so the legacy
get/set path and the zero-copy v1 path store the same bytes.

The other host pools of SGLang's v2 (multi-pool) interface -- Mamba state,
the DSA indexer, ... -- are addressed by AffineLayout (below), fitted at
registration to the pool's own get_page_buffer_meta; KV-shaped pools (SWA,
draft) by PageLayout.

Everything here is numpy over whole batches: no per-page Python work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple

import numpy as np

# layouts this backend can address, MHA and MLA
MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


class LayoutError(ValueError):
    """The host pool is not one this backend can address (names what and why)."""


def _first_slots(host_indices: Any, num_pages: int, page_size: int, num_slots: int,
                 aligned: bool, layout: str) -> np.ndarray:
    """host_indices[::page_size] as int64 (n,), checked: num_pages whole pages
    of integer slots inside [0, num_slots), each starting on a multiple of
    page_size when aligned.  Raises LayoutError otherwise."""
    if host_indices is None:
        raise LayoutError("host_indices is None")
    if hasattr(host_indices, "detach"):  # torch tensor
        host_indices = host_indices.detach()
        if getattr(host_indices.device, "type", "cpu") != "cpu":
            host_indices = host_indices.cpu()
        host_indices = host_indices.numpy()
    idx = np.asarray(host_indices).reshape(-1)
    if idx.shape[0] != num_pages * page_size:
        raise LayoutError(f"host_indices has {idx.shape[0]} slots for {num_pages} pages of "
                          f"{page_size} tokens")
    if idx.dtype.kind not in "iu":
        raise LayoutError(f"host_indices must be integers, got {idx.dtype}")
    first = idx[::page_size].astype(np.int64, copy=False)
    if first.size:
        if int(first.min()) < 0 or int(first.max()) + page_size > num_slots:
            raise LayoutError(f"host_indices outside the pool's {num_slots} slots")
        if aligned and page_size > 1 and np.any(first % page_size):
            raise LayoutError(f"host_indices of a {layout} pool must start each page "
                              f"on a multiple of page_size {page_size}")
    return first


def _buffer_facts(buf: Any, what: str = "kv_buffer") -> Tuple[int, Tuple[int, ...], int, str, bool]:
    """(base address, shape, itemsize, dtype name, C-contiguous) of a torch
    tensor or a numpy array, without importing torch."""
    if isinstance(buf, np.ndarray):
        return (int(buf.ctypes.data), tuple(int(x) for x in buf.shape), int(buf.itemsize),
                str(buf.dtype.name), bool(buf.flags.c_contiguous))
    # torch.Tensor (duck-typed so that importing this module never needs torch)
    if hasattr(buf, "data_ptr") and hasattr(buf, "element_size"):
        dev = getattr(buf, "device", None)
        if dev is not None and getattr(dev, "type", "cpu") != "cpu":
            raise LayoutError(f"{what} is on device {dev}; a host pool must be CPU memory")
        dtype = str(getattr(buf, "dtype", "unknown")).replace("torch.", "")
        return (int(buf.data_ptr()), tuple(int(x) for x in buf.shape), int(buf.element_size()),
                dtype, bool(buf.is_contiguous()))
    raise LayoutError(f"{what} must be a torch tensor or a numpy array, got {type(buf).__name__}")


@dataclass(frozen=True)
class PageLayout:
    """Address arithmetic of one host pool (see the module docstring)."""

    layout: str
    is_mla: bool
    page_size: int
    num_layers: int
    num_slots: int        # token slots of the pool (SGLang's ``size``)
    token_bytes: int      # bytes of one token of one layer of K (or of V): H*D*itemsize
    dtype: str
    itemsize: int
    base: int             # kv_buffer's address
    buffer_bytes: int
    slot_stride: int      # m: bytes per token slot in the first-slot term
    piece_offsets: np.ndarray  # c: uint64 (k,), address offset of piece j
    piece_bytes: int      # every piece has this length
    aligned: bool         # first slots must be multiples of page_size
    addressable: bool = True  # False: a pool without kv_buffer (lookups only)

    @property
    def pieces(self) -> int:
        return int(self.piece_offsets.shape[0])

    @property
    def object_size(self) -> int:
        return self.pieces * self.piece_bytes

    def describe(self) -> str:
        kind = "MLA" if self.is_mla else "MHA"
        return (f"{kind} {self.layout}, page_size {self.page_size}, {self.num_layers} layers, "
                f"{self.token_bytes} B per token per layer, {self.pieces} pieces of "
                f"{self.piece_bytes} B per page ({self.object_size} B objects), "
                f"{self.num_slots} slots")

    @classmethod
    def from_pool(cls, pool: Any, is_mla: bool) -> "PageLayout":
        """Reads ``layout``, ``page_size`` and ``kv_buffer`` from a SGLang host
        pool (or anything with those attributes) and checks them against each
        other; ``layer_num`` and ``size`` are checked when present.  Raises
        LayoutError naming the problem."""
        layout = getattr(pool, "layout", None)
        page_size = getattr(pool, "page_size", None)
        buf = getattr(pool, "kv_buffer", None)
        if layout is None or page_size is None:
            raise LayoutError("host pool has no 'layout' or 'page_size' attribute "
                              f"({type(pool).__name__}); not a SGLang HostKVCache")
        allowed = MLA_LAYOUTS if is_mla else MHA_LAYOUTS
        if layout not in allowed:
            raise LayoutError(
                f"--hicache-mem-layout {layout!r} is not supported for "
                f"{'MLA' if is_mla else 'MHA'} models by the umbp backend; use one of "
                + ", ".join(allowed))
        page_size = int(page_size)
        if page_size < 1:
            raise LayoutError(f"page_size must be >= 1, got {page_size}")
        if buf is None:
            raise LayoutError("host pool has no kv_buffer (a dummy pool?); the umbp backend "
                              "needs the host KV buffer")
        if isinstance(buf, (list, tuple)):
            # SGLang's AsymmetricMHATokenToKVPoolHost (pool_host/mha.py@39baee9e):
            # an MHA model whose K and V head dims differ (head_dim != v_head_dim,
            # e.g. MiMo-V2) keeps K and V in two buffers, kv_buffer = (k, v)
            dims = [tuple(int(x) for x in getattr(b, "shape", ())) for b in buf]
            raise LayoutError(
                f"{type(pool).__name__}: kv_buffer is {len(buf)} separate buffers (shapes "
                f"{dims}), not one (2, ...) tensor: an MHA pool with separate K and V buffers "
                "(SGLang's AsymmetricMHATokenToKVPoolHost, for models whose head_dim != "
                "v_head_dim, e.g. MiMo-V2) is not supported by the umbp backend; run such a "
                "model without the umbp storage backend")
        base, shape, itemsize, dtype, contiguous = _buffer_facts(buf)
        if not contiguous:
            raise LayoutError("kv_buffer is not contiguous; the umbp backend addresses it "
                              "by SGLang's strides")
        want_ndim = {("layer_first", False): 5, ("page_first", False): 5,
                     ("page_first_direct", False): 6, ("page_head", False): 6,
                     ("layer_first", True): 4, ("page_first", True): 4,
                     ("page_first_direct", True): 5}[(layout, is_mla)]
        if len(shape) != want_ndim:
            raise LayoutError(f"kv_buffer of a {'MLA' if is_mla else 'MHA'} {layout} pool must have "
                              f"{want_ndim} dimensions, got shape {shape}")
        if not is_mla and shape[0] != 2:
            raise LayoutError(f"kv_buffer of an MHA pool must start with a K/V dimension of 2, "
                              f"got shape {shape}")
        s = shape if is_mla else shape[1:]
        if layout == "layer_first":
            num_layers, size, a, b = s
        elif layout == "page_first":
            size, num_layers, a, b = s
        elif layout == "page_first_direct":
            pages, num_layers, ps, a, b = s
            size = pages * ps
        else:  # page_head (MHA only): (P, H, page_size, L, D)
            pages, a, ps, num_layers, b = s
            size = pages * ps
        if layout in ("page_first_direct", "page_head") and ps != page_size:
            raise LayoutError(f"kv_buffer shape {shape} has pages of {ps} tokens but "
                              f"page_size is {page_size}")
        layer_num = getattr(pool, "layer_num", None)
        if layer_num is not None and int(layer_num) != num_layers:
            raise LayoutError(f"kv_buffer shape {shape} has {num_layers} layers but the pool's "
                              f"layer_num is {layer_num}")
        pool_size = getattr(pool, "size", None)
        if pool_size is not None and int(pool_size) != size:
            raise LayoutError(f"kv_buffer shape {shape} has {size} token slots but the pool's "
                              f"size is {pool_size}")
        if size < page_size or num_layers < 1:
            raise LayoutError(f"kv_buffer shape {shape} holds no whole page of {page_size} tokens")
        token_bytes = a * b * itemsize
        buffer_bytes = (1 if is_mla else 2) * num_layers * size * token_bytes
        v_offset = num_layers * size * token_bytes
        if layout == "layer_first":
            kvs = 1 if is_mla else 2
            j = np.arange(kvs * num_layers, dtype=np.uint64)
            offsets = (j // np.uint64(num_layers)) * np.uint64(v_offset) + \
                (j % np.uint64(num_layers)) * np.uint64(size * token_bytes)
            slot_stride = token_bytes
            piece_bytes = page_size * token_bytes
        else:
            offsets = np.array([0] if is_mla else [0, v_offset], dtype=np.uint64)
            slot_stride = num_layers * token_bytes
            piece_bytes = num_layers * page_size * token_bytes
        return cls(layout=layout, is_mla=is_mla, page_size=page_size, num_layers=num_layers,
                   num_slots=size, token_bytes=token_bytes, dtype=dtype, itemsize=itemsize,
                   base=base, buffer_bytes=buffer_bytes, slot_stride=slot_stride,
                   piece_offsets=offsets, piece_bytes=piece_bytes,
                   aligned=layout in ("page_first_direct", "page_head"))

    @classmethod
    def without_buffer(cls, pool: Any, is_mla: bool) -> "PageLayout":
        """The layout facts of a pool that holds no kv_buffer (SGLang's dummy MLA
        host pool on ranks that never back up), from its attributes, so that
        keys and lookups work; no page is addressable.  Raises LayoutError when
        the attributes are missing."""
        layout = getattr(pool, "layout", None)
        allowed = MLA_LAYOUTS if is_mla else MHA_LAYOUTS
        if layout not in allowed:
            raise LayoutError(f"--hicache-mem-layout {layout!r} is not supported for "
                              f"{'MLA' if is_mla else 'MHA'} models by the umbp backend; use one of "
                              + ", ".join(allowed))
        try:
            page_size = int(pool.page_size)
            num_layers = int(pool.layer_num)
            size = int(getattr(pool, "size", 0) or 0)
            dtype = pool.dtype
            itemsize = getattr(dtype, "itemsize", None)
            if itemsize is None:  # torch < 2.1
                import torch
                itemsize = torch.empty((), dtype=dtype).element_size()
            if is_mla:
                width = int(pool.kv_cache_dim)
            else:
                width = int(pool.head_num) * int(pool.head_dim)
        except Exception as e:
            raise LayoutError("host pool has no kv_buffer and lacks page_size, layer_num, dtype "
                              f"and {'kv_cache_dim' if is_mla else 'head_num/head_dim'} ({e})") from None
        token_bytes = width * int(itemsize)
        kvs = 1 if is_mla else 2
        pieces = kvs * num_layers if layout == "layer_first" else kvs
        piece_bytes = page_size * token_bytes * (1 if layout == "layer_first" else num_layers)
        return cls(layout=layout, is_mla=is_mla, page_size=page_size, num_layers=num_layers,
                   num_slots=size, token_bytes=token_bytes,
                   dtype=str(dtype).replace("torch.", ""), itemsize=int(itemsize), base=0,
                   buffer_bytes=0, slot_stride=0, piece_offsets=np.zeros(pieces, dtype=np.uint64),
                   piece_bytes=piece_bytes, aligned=False, addressable=False)

    # ---- per batch -------------------------------------------------------

    def first_slots(self, host_indices: Any, num_pages: int) -> np.ndarray:
        """The first token slot of each of num_pages pages, int64 (n,).  Raises
        LayoutError when host_indices do not hold num_pages whole pages inside
        the pool (a caller bug: the batch must fail, never touch memory outside
        the buffer)."""
        if not self.addressable:
            raise LayoutError("the host pool has no kv_buffer: no page can be read or written")
        return _first_slots(host_indices, num_pages, self.page_size, self.num_slots,
                            self.aligned, self.layout)

    def ranges(self, first_slots: np.ndarray):
        """(ptrs, lens, offsets), each uint64 (n, pieces): the host address of
        every piece of every page, its length and its offset in the object.
        Row i tiles [0, object_size) in order, as a ranged put needs."""
        n = first_slots.shape[0]
        start = np.uint64(self.base) + first_slots.astype(np.uint64) * np.uint64(self.slot_stride)
        ptrs = start[:, None] + self.piece_offsets[None, :]
        lens = np.full((n, self.pieces), self.piece_bytes, dtype=np.uint64)
        offs = np.broadcast_to(
            np.arange(self.pieces, dtype=np.uint64) * np.uint64(self.piece_bytes), (n, self.pieces))
        return ptrs, lens, np.ascontiguousarray(offs)

    @property
    def geometry(self) -> str:
        """What makes two pools' objects byte-compatible (for key namespaces)."""
        return (f"{'mla' if self.is_mla else 'mha'}:{self.layout}:{self.num_layers}x"
                f"{self.token_bytes}:{self.object_size}")


# ---- the other host pools of SGLang's v2 (multi-pool) interface -------------
#
# SGLang's hybrid controller registers every host pool of a hybrid model with
# register_mem_host_pool_v2.  Two kinds reach a storage backend:
#
# - KV-shaped pools (SWA, draft, draft SWA): MHATokenToKVPoolHost /
#   MLATokenToKVPoolHost instances like the anchor, one kv_buffer tensor of
#   the shapes in the table at the top; PageLayout addresses them;
# - every other pool (Mamba state: MambaPoolHost, pool_host/mamba.py; the DSA
#   indexer: DSAIndexerPoolHost, pool_host/dsa.py; ...): buffers of their own,
#   exposed by get_hybrid_pool_buffer(), and addressed by SGLang itself (and by
#   Mooncake's store) through the pool's get_page_buffer_meta(indices): per
#   page a fixed list of (pointer, size) pieces.  AffineLayout takes those
#   pieces from SGLang's own get_page_buffer_meta at registration and checks
#   that piece j of page p sits at base_j + p * stride_j inside one of the
#   pool's buffers, so that a whole batch is addressed with numpy afterwards.

# kv_buffer dimensions per --hicache-mem-layout (the table at the top)
_MHA_NDIM = {"layer_first": 5, "page_first": 5, "page_first_direct": 6, "page_head": 6}
_MLA_NDIM = {"layer_first": 4, "page_first": 4, "page_first_direct": 5}


def kv_shaped(pool: Any) -> Any:
    """None when pool is not a KV-shaped host pool (one kv_buffer tensor with
    the dimensions of an MHA or MLA pool of its layout); else whether it is
    MLA (True) or MHA (False)."""
    buf = getattr(pool, "kv_buffer", None)
    layout = getattr(pool, "layout", None)
    if buf is None or isinstance(buf, (list, tuple)) or not hasattr(buf, "shape"):
        return None
    shape = tuple(int(x) for x in buf.shape)
    if _MHA_NDIM.get(layout) == len(shape) and shape[0] == 2:
        return False
    if _MLA_NDIM.get(layout) == len(shape):
        return True
    return None


def pool_buffers(pool: Any):
    """[(start, nbytes, dtype name)] of a host pool's buffers: SGLang's
    get_hybrid_pool_buffer() (the tensors Mooncake registers for a pool),
    else its kv_buffer (one tensor or a list).  Empty buffers are left out.
    Raises LayoutError for a buffer not in contiguous CPU memory."""
    get = getattr(pool, "get_hybrid_pool_buffer", None)
    bufs = get() if callable(get) else getattr(pool, "kv_buffer", None)
    if bufs is None:
        return []
    if not isinstance(bufs, (list, tuple)):
        bufs = [bufs]
    out = []
    for i, b in enumerate(bufs):
        if b is None:
            continue
        base, shape, itemsize, dtype, contiguous = _buffer_facts(b, f"host buffer {i}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize if shape else itemsize
        if nbytes == 0:
            continue
        if not contiguous:
            raise LayoutError(f"host buffer {i} (shape {shape}) is not contiguous")
        out.append((base, nbytes, dtype))
    return out


def _index_tensor(start: int, count: int):
    """Token slots start .. start+count-1 as SGLang passes them (an int64
    torch tensor; numpy where torch is missing)."""
    try:
        import torch
        return torch.arange(start, start + count, dtype=torch.int64)
    except ImportError:  # pragma: no cover
        return np.arange(start, start + count, dtype=np.int64)


def _page_meta(pool: Any, page: int, page_size: int):
    """SGLang's (ptrs, sizes) of one page, as int lists; LayoutError when the
    pool has none or refuses."""
    meta = getattr(pool, "get_page_buffer_meta", None)
    if not callable(meta):
        raise LayoutError("the pool has no get_page_buffer_meta (SGLang's zero-copy page "
                          "addresses), so its pages cannot be addressed")
    try:
        ptrs, sizes = meta(_index_tensor(page * page_size, page_size))
        ptrs = [int(p) for p in ptrs]
        sizes = [int(z) for z in sizes]
    except Exception as e:
        raise LayoutError(f"its get_page_buffer_meta refuses the {getattr(pool, 'layout', '?')!r} "
                          f"layout ({type(e).__name__}: {e}); SGLang's zero-copy storage "
                          "path needs --hicache-mem-layout page_first or "
                          "page_first_direct for this pool") from None
    if not ptrs or len(ptrs) != len(sizes) or any(z <= 0 for z in sizes):
        raise LayoutError(f"get_page_buffer_meta of page {page} gave {len(ptrs)} pointers "
                          f"and sizes {sizes}: no usable pieces")
    return ptrs, sizes


def _merged(ptrs, sizes):
    """The byte intervals ptrs/sizes cover, merged: [(start, end)]."""
    out = []
    for p, z in sorted(zip(ptrs, sizes)):
        if out and p <= out[-1][1]:
            out[-1][1] = max(out[-1][1], p + z)
        else:
            out.append([p, p + z])
    return [tuple(x) for x in out]


def _probe_pages(num_pages: int):
    return sorted({p for p in (0, 1, 2, num_pages // 2, num_pages - 1) if 0 <= p < num_pages})


def check_against_page_meta(lay: Any, pool: Any) -> None:
    """For a KV-shaped pool that has SGLang's get_page_buffer_meta: the bytes
    lay addresses for a few pages must be exactly the bytes SGLang's own
    pointers cover (pieces may be cut differently).  A meta that refuses the
    layout (as SGLang's do for some) is not a disagreement."""
    meta = getattr(pool, "get_page_buffer_meta", None)
    if not callable(meta):
        return
    for page in _probe_pages(lay.num_slots // lay.page_size):
        try:
            ptrs, sizes = meta(_index_tensor(page * lay.page_size, lay.page_size))
            theirs = _merged([int(p) for p in ptrs], [int(z) for z in sizes])
        except Exception:
            return
        p, z, _ = lay.ranges(np.array([page * lay.page_size], dtype=np.int64))
        mine = _merged(p.reshape(-1).tolist(), z.reshape(-1).tolist())
        if mine != theirs:
            raise LayoutError(f"page {page}: the {lay.layout} layout computed from kv_buffer "
                              f"covers {mine[:4]} but the pool's get_page_buffer_meta "
                              f"points at {theirs[:4]}")


@dataclass(frozen=True)
class AffineLayout:
    """Pages of a host pool as SGLang's get_page_buffer_meta describes them:
    piece j of the page starting at token slot s is at bases[j] +
    (s // page_size) * strides[j] and is lens[j] bytes.  The object of a page
    is its pieces end to end in SGLang's order (for MambaPoolHost: temporal
    state, then each conv state, as get_data_page flattens them)."""

    layout: str
    page_size: int
    num_slots: int
    bases: np.ndarray     # uint64 (k,)
    strides: np.ndarray   # uint64 (k,), bytes per page
    lens: np.ndarray      # uint64 (k,)
    dtype: str            # the pool's buffer dtypes, "+"-joined
    addressable: bool = True
    aligned: bool = True

    @property
    def pieces(self) -> int:
        return int(self.lens.shape[0])

    @property
    def object_size(self) -> int:
        return int(self.lens.sum())

    @property
    def geometry(self) -> str:
        return f"{self.layout}:{'+'.join(str(int(x)) for x in self.lens)}:{self.dtype}"

    def describe(self) -> str:
        return (f"{self.layout}, page_size {self.page_size}, {self.pieces} pieces "
                f"({'+'.join(str(int(x)) for x in self.lens)} B) per page "
                f"({self.object_size} B objects), {self.num_slots} slots")

    @classmethod
    def from_page_buffer_meta(cls, pool: Any) -> "AffineLayout":
        """Asks the pool's get_page_buffer_meta for a few pages (first, second,
        middle, last) and fits bases and strides; checks that every probed
        page gives the same pieces at the fitted addresses, that pages of a
        piece do not overlap, that the pieces of a page do not overlap, and
        that the first and last page of every piece lie inside one buffer of
        the pool (so every page in between does).  Raises LayoutError naming
        the problem."""
        layout = str(getattr(pool, "layout", None) or "?")
        try:
            page_size = int(pool.page_size)
            num_slots = int(pool.size)
        except Exception:
            raise LayoutError("the pool has no integer page_size and size") from None
        if page_size < 1 or num_slots < page_size:
            raise LayoutError(f"page_size {page_size} and size {num_slots} hold no whole page")
        buffers = pool_buffers(pool)
        if not buffers:
            raise LayoutError("the pool has no host buffer (kv_buffer / get_hybrid_pool_buffer "
                              "are empty: a dummy pool?), so its pages cannot be stored")
        num_pages = num_slots // page_size
        probes = _probe_pages(num_pages)
        metas = {p: _page_meta(pool, p, page_size) for p in probes}
        ptrs0, sizes0 = metas[0]
        k = len(ptrs0)
        for p, (ptrs, sizes) in metas.items():
            if len(ptrs) != k or sizes != sizes0:
                raise LayoutError(f"get_page_buffer_meta gives page {p} the pieces {sizes} but "
                                  f"page 0 the pieces {sizes0}")
        bases = np.array(ptrs0, dtype=np.int64)
        strides = np.zeros(k, dtype=np.int64)
        if len(probes) > 1:
            p1 = probes[1]
            d = np.array(metas[p1][0], dtype=np.int64) - bases
            if np.any(d % p1):
                raise LayoutError(f"get_page_buffer_meta: pages 0 and {p1} are not a whole "
                                  "stride apart")
            strides = d // p1
        for p, (ptrs, _) in metas.items():
            if np.any(np.array(ptrs, dtype=np.int64) != bases + p * strides):
                raise LayoutError(f"get_page_buffer_meta: page {p}'s pointers are not "
                                  "base + page * stride (not a layout this backend can "
                                  "address)")
        lens = np.array(sizes0, dtype=np.int64)
        if num_pages > 1 and np.any(strides < lens):
            raise LayoutError(f"get_page_buffer_meta: piece strides {strides.tolist()} are "
                              f"smaller than the pieces {lens.tolist()} (pages would overlap)")
        spans = sorted(zip(bases.tolist(), (bases + lens).tolist()))
        if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
            raise LayoutError("get_page_buffer_meta: the pieces of one page overlap")
        last = num_pages - 1
        for j in range(k):
            lo, hi = int(bases[j]), int(bases[j] + last * strides[j] + lens[j])
            if not any(b <= lo and hi <= b + n for b, n, _ in buffers):
                raise LayoutError(f"get_page_buffer_meta: piece {j} of pages 0 .. {last} "
                                  f"([{lo:#x}, {hi:#x})) is not inside one of the pool's "
                                  "buffers")
        dtypes = "+".join(dict.fromkeys(d for _, _, d in buffers))
        return cls(layout=layout, page_size=page_size, num_slots=num_slots,
                   bases=bases.astype(np.uint64), strides=strides.astype(np.uint64),
                   lens=lens.astype(np.uint64), dtype=dtypes)

    def first_slots(self, host_indices: Any, num_pages: int) -> np.ndarray:
        return _first_slots(host_indices, num_pages, self.page_size, self.num_slots,
                            self.aligned, self.layout)

    def ranges(self, first_slots: np.ndarray):
        """(ptrs, lens, offsets), each uint64 (n, pieces), as PageLayout.ranges."""
        n = first_slots.shape[0]
        page = (first_slots // self.page_size).astype(np.uint64)
        ptrs = self.bases[None, :] + page[:, None] * self.strides[None, :]
        lens = np.broadcast_to(self.lens, (n, self.pieces))
        offs = np.broadcast_to(np.cumsum(self.lens, dtype=np.uint64) - self.lens, (n, self.pieces))
        return ptrs, np.ascontiguousarray(lens), np.ascontiguousarray(offs)
