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


def _buffer_facts(buf: Any) -> Tuple[int, Tuple[int, ...], int, str, bool]:
    """(base address, shape, itemsize, dtype name, C-contiguous) of a torch
    tensor or a numpy array, without importing torch."""
    if isinstance(buf, np.ndarray):
        return (int(buf.ctypes.data), tuple(int(x) for x in buf.shape), int(buf.itemsize),
                str(buf.dtype.name), bool(buf.flags.c_contiguous))
    # torch.Tensor (duck-typed so that importing this module never needs torch)
    if hasattr(buf, "data_ptr") and hasattr(buf, "element_size"):
        dev = getattr(buf, "device", None)
        if dev is not None and getattr(dev, "type", "cpu") != "cpu":
            raise LayoutError(f"kv_buffer is on device {dev}; the host KV pool must be CPU memory")
        dtype = str(getattr(buf, "dtype", "unknown")).replace("torch.", "")
        return (int(buf.data_ptr()), tuple(int(x) for x in buf.shape), int(buf.element_size()),
                dtype, bool(buf.is_contiguous()))
    raise LayoutError(f"kv_buffer must be a torch tensor or a numpy array, got {type(buf).__name__}")


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
        if hasattr(host_indices, "detach"):  # torch tensor
            host_indices = host_indices.detach()
            if getattr(host_indices.device, "type", "cpu") != "cpu":
                host_indices = host_indices.cpu()
            host_indices = host_indices.numpy()
        idx = np.asarray(host_indices).reshape(-1)
        if idx.shape[0] != num_pages * self.page_size:
            raise LayoutError(f"host_indices has {idx.shape[0]} slots for {num_pages} pages of "
                              f"{self.page_size} tokens")
        if idx.dtype.kind not in "iu":
            raise LayoutError(f"host_indices must be integers, got {idx.dtype}")
        first = idx[:: self.page_size].astype(np.int64, copy=False)
        if first.size:
            if int(first.min()) < 0 or int(first.max()) + self.page_size > self.num_slots:
                raise LayoutError(f"host_indices outside the pool's {self.num_slots} slots")
            if self.aligned and np.any(first % self.page_size):
                raise LayoutError(f"host_indices of a {self.layout} pool must start each page "
                                  f"on a multiple of page_size {self.page_size}")
        return first

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
