"""A minimal stand-in for SGLang's HiCache host KV pools, for tests only.

SGLang cannot be installed here, so this fakes only what umbp.sglang touches:
``layout``, ``page_size``, ``layer_num``, ``size``, ``dtype`` and ``kv_buffer``
(a torch CPU tensor) with SGLang's real shapes for each layout, plus the
helpers SGLang's generic path and its zero-copy metadata use
(``get_data_page``, ``set_from_flat_data_page``, ``get_dummy_flat_data_page``,
``get_page_buffer_meta``), re-implemented from the description of
``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost`` in
the project's reference notes on SGLang (connector-api.md §4.3; pool_host/mha.py, mla.py):

- MHA: layer_first (2, L, size, H, D); page_first (2, size, L, H, D);
  page_first_direct (2, P, L, page_size, H, D); page_head (2, P, H, page_size, L, D)
- MLA: layer_first (L, size, 1, C); page_first (size, L, 1, C);
  page_first_direct (P, L, page_size, 1, C)

``get_page_buffer_meta`` loops per page as SGLang does, so the tests can
check the backend's vectorized addresses against it.

For the v2 (multi-pool) interface of hybrid models: ``FakeMambaPoolHost`` and
``FakeDSAIndexerPoolHost`` (SGLang's MambaPoolHost and DSAIndexerPoolHost, see
below), ``FakeHostPool`` again for the SWA and draft pools (SGLang builds them
with the same MHA/MLA host pool classes), ``FakeSidecarHostPool`` for a pool
without host buffers, and SGLang's ``count_pool_hits``.
"""
from __future__ import annotations

import numpy as np
import torch


class FakeHostPool:
    def __init__(self, layout: str, *, mla: bool = False, page_size: int = 4, num_pages: int = 8,
                 layer_num: int = 3, head_num: int = 2, head_dim: int = 8, kv_cache_dim: int = 12,
                 dtype=torch.float16):
        self.layout = layout
        self.is_mla = mla
        self.page_size = page_size
        self.page_num = num_pages
        self.size = num_pages * page_size
        self.layer_num = layer_num
        self.dtype = dtype
        if mla:
            self.head_num, self.head_dim = 1, kv_cache_dim
            self.kv_cache_dim = kv_cache_dim
            dims = {
                "layer_first": (layer_num, self.size, 1, kv_cache_dim),
                "page_first": (self.size, layer_num, 1, kv_cache_dim),
                "page_first_direct": (num_pages, layer_num, page_size, 1, kv_cache_dim),
            }
        else:
            self.head_num, self.head_dim = head_num, head_dim
            dims = {
                "layer_first": (2, layer_num, self.size, head_num, head_dim),
                "page_first": (2, self.size, layer_num, head_num, head_dim),
                "page_first_direct": (2, num_pages, layer_num, page_size, head_num, head_dim),
                "page_head": (2, num_pages, head_num, page_size, layer_num, head_dim),
            }
        if layout not in dims:
            raise ValueError(f"Unsupported layout: {layout}")
        self.kv_buffer = torch.zeros(dims[layout], dtype=dtype)

    # ---- byte views for the tests ----------------------------------------

    def raw(self) -> torch.Tensor:
        """The whole buffer as uint8 (a view)."""
        return self.kv_buffer.view(-1).view(torch.uint8)

    def fill_random(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        r = self.raw()
        r.copy_(torch.randint(0, 256, r.shape, generator=g, dtype=torch.uint8))

    def poison(self, byte: int = 0xA5) -> None:
        self.raw().fill_(byte)

    @property
    def itemsize(self) -> int:
        return self.kv_buffer.element_size()

    # ---- SGLang's helpers ------------------------------------------------

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        ps = self.page_size
        if self.is_mla:
            if self.layout == "layer_first":
                page = self.kv_buffer[:, index:index + ps, :, :]
            elif self.layout == "page_first":
                page = self.kv_buffer[index:index + ps, :, :, :]
            else:
                page = self.kv_buffer[index // ps:index // ps + 1]
        else:
            if self.layout == "layer_first":
                page = self.kv_buffer[:, :, index:index + ps, :, :]
            elif self.layout == "page_first":
                page = self.kv_buffer[:, index:index + ps, :, :, :]
            else:
                page = self.kv_buffer[:, index // ps:index // ps + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        if self.is_mla:
            shape = (self.layer_num, self.page_size, 1, self.kv_cache_dim)
        else:
            shape = (2, self.layer_num, self.page_size, self.head_num, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self.get_data_page(index, flat=False)
        page.copy_(data_page.reshape(page.shape))

    def page_bytes(self, index: int) -> bytes:
        """The bytes of the page starting at token slot index, in SGLang's flat order."""
        return self.get_data_page(index).contiguous().view(torch.uint8).numpy().tobytes()

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base = self.kv_buffer.data_ptr()
        it = self.itemsize
        hd = self.head_num * self.head_dim
        indices = [int(i) for i in indices]
        ptrs = []
        if self.is_mla:
            if self.layout == "layer_first":
                for i in range(0, len(indices), self.page_size):
                    for layer in range(self.layer_num):
                        ptrs.append(base + indices[i] * hd * it + layer * self.size * hd * it)
                size = it * self.page_size * hd
            else:
                for i in range(0, len(indices), self.page_size):
                    ptrs.append(base + indices[i] * self.layer_num * hd * it)
                size = self.layer_num * it * self.page_size * hd
            return ptrs, [size] * len(ptrs)
        v_offset = self.layer_num * self.size * hd * it
        if self.layout == "layer_first":
            for i in range(0, len(indices), self.page_size):
                for layer in range(self.layer_num):
                    k = base + indices[i] * hd * it + layer * self.size * hd * it
                    ptrs += [k, k + v_offset]
            size = it * self.page_size * hd
        else:
            for i in range(0, len(indices), self.page_size):
                k = base + indices[i] * self.layer_num * hd * it
                ptrs += [k, k + v_offset]
            size = self.layer_num * it * self.page_size * hd
        return ptrs, [size] * len(ptrs)


class FakeAsymmetricHostPool:
    """SGLang's AsymmetricMHATokenToKVPoolHost (pool_host/mha.py @ 39baee9e0973),
    the host pool of MHA models whose K and V head dims differ (head_dim !=
    v_head_dim, e.g. MiMo-V2), as far as a storage backend reaches it: K and V
    in two buffers, ``kv_buffer = (k_buffer, v_buffer)`` (k_buffer and
    v_buffer are kv_buffer[0] and [1], as in MHATokenToKVPoolHost), layouts
    page_first (K (size, L, H, D), V (size, L, H, Dv)) and page_first_direct
    (K (P, L, page_size, H, D), V with Dv) only, get_page_buffer_meta giving a
    K and a V piece per page of different sizes, and the flat-page helpers
    refused (NotImplementedError)."""

    def __init__(self, layout: str = "page_first", *, page_size: int = 4, num_pages: int = 8,
                 layer_num: int = 3, head_num: int = 2, head_dim: int = 8, v_head_dim: int = 4,
                 dtype=torch.float16):
        if layout not in ("page_first", "page_first_direct"):
            raise ValueError(f"Unsupported layout for models with head_dim != v_head_dim: {layout}; "
                             "expected 'page_first' or 'page_first_direct'.")
        self.layout = layout
        self.page_size = page_size
        self.page_num = num_pages
        self.size = num_pages * page_size
        self.layer_num = layer_num
        self.head_num, self.head_dim, self.v_head_dim = head_num, head_dim, v_head_dim
        self.dtype = dtype
        if layout == "page_first":
            k_dims = (self.size, layer_num, head_num, head_dim)
            v_dims = (self.size, layer_num, head_num, v_head_dim)
        else:
            k_dims = (num_pages, layer_num, page_size, head_num, head_dim)
            v_dims = (num_pages, layer_num, page_size, head_num, v_head_dim)
        self.kv_buffer = (torch.zeros(k_dims, dtype=dtype), torch.zeros(v_dims, dtype=dtype))

    @property
    def k_buffer(self):
        return self.kv_buffer[0]

    @property
    def v_buffer(self):
        return self.kv_buffer[1]

    def _flat_page_unsupported(self):
        return NotImplementedError("Models with head_dim != v_head_dim do not support the flat-page "
                                   "interface used by HiCache L3 storage backends")

    def get_data_page(self, index, flat=True):
        raise self._flat_page_unsupported()

    def get_dummy_flat_data_page(self):
        raise self._flat_page_unsupported()

    def set_from_flat_data_page(self, index, data_page):
        raise self._flat_page_unsupported()

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        it = _itemsize(self.dtype)
        k_size = self.layer_num * it * self.page_size * self.head_num * self.head_dim
        v_size = self.layer_num * it * self.page_size * self.head_num * self.v_head_dim
        if self.layout == "page_first_direct":
            k_stride = self.layer_num * self.page_size * self.head_num * self.head_dim
            v_stride = self.layer_num * self.page_size * self.head_num * self.v_head_dim
        else:
            k_stride = self.layer_num * self.head_num * self.head_dim
            v_stride = self.layer_num * self.head_num * self.v_head_dim
        indices = [int(i) for i in indices]
        ptrs, sizes = [], []
        for i in range(0, len(indices), self.page_size):
            b = indices[i] // self.page_size if self.layout == "page_first_direct" else indices[i]
            ptrs += [self.k_buffer.data_ptr() + b * k_stride * it, self.v_buffer.data_ptr() + b * v_stride * it]
            sizes += [k_size, v_size]
        return ptrs, sizes


def page_indices(pool: FakeHostPool, pages) -> torch.Tensor:
    """host_indices for whole pages (token slots of each page, in order)."""
    ps = pool.page_size
    return torch.tensor([p * ps + t for p in pages for t in range(ps)], dtype=torch.int64)


class FakeSidecarHostPool:
    """A host pool no storage backend can address: a pool that owns no host
    buffer (kv_buffer None, no get_hybrid_pool_buffer, no
    get_page_buffer_meta), as a dummy pool of SGLang's is.  umbp must refuse
    it at register_mem_host_pool_v2."""

    def __init__(self, page_size: int = 4, num_pages: int = 8, layout: str = "page_first"):
        self.layout = layout
        self.page_size = page_size
        self.size = num_pages * page_size
        self.size_per_token = 64
        self.kv_buffer = None


# ---- the non-KV host pools of SGLang's hybrid models (v2 interface) ---------
#
# Re-implemented field for field from SGLang (sgl-project/sglang):
#   MambaPoolHost       python/sglang/srt/mem_cache/pool_host/mamba.py @ 02f0c2a0f8e4
#   DSAIndexerPoolHost  python/sglang/srt/mem_cache/pool_host/dsa.py   @ 03ba7b5b7dd2
# as far as a storage backend reaches them: page_size, size, layout, the host
# buffers (get_hybrid_pool_buffer, the tensors Mooncake registers), the flat
# data-page helpers and get_page_buffer_meta, with the same index semantics
# (a Mamba page is one slot; an indexer page is named by the anchor KV pool's
# token slot, page = slot // page_size).  Device-side transfer code is left
# out.  SWA and draft pools are MHA/MLA host pools: FakeHostPool.


def _itemsize(dtype) -> int:
    """dtype.itemsize, which SGLang uses (torch >= 2.1), on torch 1.13 too."""
    return torch.empty((), dtype=dtype).element_size()


class _BufferBytes:
    """raw / fill_random / poison over every host buffer of a fake pool."""

    def _buffers(self):
        return [b for b in self.get_hybrid_pool_buffer() if b is not None and b.numel() > 0]

    def raw(self):
        return [b.view(-1).view(torch.uint8) for b in self._buffers()]

    def fill_random(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for r in self.raw():
            r.copy_(torch.randint(0, 256, r.shape, generator=g, dtype=torch.uint8))

    def poison(self, byte: int = 0xA5) -> None:
        for r in self.raw():
            r.fill_(byte)

    def all_bytes(self) -> bytes:
        return b"".join(r.numpy().tobytes() for r in self.raw())

    def page_bytes(self, index: int) -> bytes:
        """The bytes of the page at token slot index, in SGLang's flat data-page order."""
        return self.get_data_page(index).contiguous().view(torch.uint8).numpy().tobytes()


class FakeMambaPoolHost(_BufferBytes):
    """MambaPoolHost: one slot per page (page_size 1); per slot and layer a
    temporal (SSM) state and one or more conv states, page-first only:
    temporal_buffer (size, L, 1, *temporal_shape), conv_buffer[i]
    (size, L, 1, *conv_shape_i).  kv_buffer is the list of non-empty buffers."""

    def __init__(self, layout: str = "page_first", *, size: int = 11, num_mamba_layers: int = 3,
                 conv_state_shapes=((4, 6), (2, 5)), temporal_state_shape=(2, 4, 3),
                 conv_dtype=torch.bfloat16, temporal_dtype=torch.float32):
        self.page_size = 1
        assert layout in ["page_first", "page_first_direct"], f"Unsupported layout: {layout}"
        self.layout = layout
        self.pin_memory = False
        self.device = "cpu"
        self.num_mamba_layers = num_mamba_layers
        self.conv_state_shapes = [torch.Size(s) for s in conv_state_shapes]
        self.temporal_state_shape = torch.Size(temporal_state_shape)
        self.temporal_state_elem_size = int(np.prod(self.temporal_state_shape))
        self.conv_state_elem_sizes = [int(np.prod(s)) for s in self.conv_state_shapes]
        self.conv_dtype = conv_dtype
        self.temporal_dtype = temporal_dtype
        self.dtype = self.conv_dtype
        self.size_per_token = self.get_size_per_token()
        self.size = size
        self.page_num = self.size // self.page_size + 1
        self.size = self.page_num * self.page_size
        self.kv_buffer = self.init_kv_buffer()
        self.can_use_write_back_jit = True

    def init_kv_buffer(self):
        self.temporal_buffer = torch.zeros((self.size, self.num_mamba_layers, 1)
                                           + tuple(self.temporal_state_shape),
                                           dtype=self.temporal_dtype)
        self.conv_buffer = [torch.zeros((self.size, self.num_mamba_layers, 1) + tuple(s),
                                        dtype=self.conv_dtype) for s in self.conv_state_shapes]
        return [b for b in (self.temporal_buffer, *self.conv_buffer) if b.numel() > 0]

    def get_hybrid_pool_buffer(self):
        return [self.temporal_buffer, *self.conv_buffer]

    def get_size_per_token(self):
        conv = sum(e * _itemsize(self.conv_dtype) for e in self.conv_state_elem_sizes)
        return (conv + self.temporal_state_elem_size * _itemsize(self.temporal_dtype)) \
            * self.num_mamba_layers

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def _iter_page_tensors(self, index: int):
        yield self.temporal_buffer[index]
        for conv_buf in self.conv_buffer:
            yield conv_buf[index]

    @staticmethod
    def _flatten_tensor_bytes(tensor):
        return tensor.contiguous().view(torch.uint8).reshape(-1)

    def get_data_page(self, index, flat: bool = True):
        data_page = torch.cat([self._flatten_tensor_bytes(t) for t in self._iter_page_tensors(index)])
        return data_page.flatten() if flat else data_page

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.page_size * self.size_per_token, dtype=torch.uint8)

    def set_from_flat_data_page(self, index: int, data_page) -> None:
        flat = data_page.contiguous().view(torch.uint8).reshape(-1)
        start = 0
        for tensor in self._iter_page_tensors(index):
            n = tensor.numel() * tensor.element_size()
            tensor.copy_(flat[start:start + n].view(dtype=tensor.dtype).reshape(tensor.shape))
            start += n

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        if self.layout not in ["page_first", "page_first_direct"]:
            raise ValueError(f"Mamba storage zero-copy requires page_first layout, got {self.layout}")
        indices = indices.tolist()
        ptr_list, element_size_list = [], []
        temporal_base_ptr = self.temporal_buffer.data_ptr()
        conv_base_ptrs = [buf.data_ptr() for buf in self.conv_buffer]
        temporal_element_size = (self.page_size * self.num_mamba_layers
                                 * _itemsize(self.temporal_dtype) * self.temporal_state_elem_size)
        conv_element_sizes = [self.page_size * self.num_mamba_layers * _itemsize(self.conv_dtype)
                              * self.conv_state_elem_sizes[i] for i in range(len(self.conv_state_shapes))]
        for i in range(0, len(indices), self.page_size):
            if self.temporal_state_elem_size > 0:
                ptr_list.append(temporal_base_ptr + indices[i] * self.num_mamba_layers
                                * self.temporal_state_elem_size * _itemsize(self.temporal_dtype))
                element_size_list.append(temporal_element_size)
            for j in range(len(self.conv_buffer)):
                ptr_list.append(conv_base_ptrs[j] + indices[i] * self.num_mamba_layers
                                * self.conv_state_elem_sizes[j] * _itemsize(self.conv_dtype))
                element_size_list.append(conv_element_sizes[j])
        return ptr_list, element_size_list


class FakeDSAIndexerPoolHost(_BufferBytes):
    """DSAIndexerPoolHost: the DSA index keys (packed keys plus one fp32 scale
    per quant block, uint8) riding on the anchor MLA pool's pages: same
    page_size, layout, size and token slots as the anchor.  layer_first:
    index_k_with_scale_buffer (L, P', stride); page_first(_direct):
    (P', L, 1, stride), P' = (size + page_size + 1) // page_size, stride =
    bytes per token per layer * page_size.  get_page_buffer_meta is
    page-first only (one pointer per page), as SGLang's."""

    def __init__(self, anchor_host, *, layer_num: int = 3, index_head_dim: int = 16,
                 quant_block_size: int = 8):
        self.page_size = anchor_host.page_size
        self.layout = anchor_host.layout
        self.pin_memory = False
        self.device = "cpu"
        self.layer_num = layer_num
        self.indexer_dtype = torch.uint8
        self.dtype = self.indexer_dtype
        self.size = anchor_host.size
        self.page_num = anchor_host.page_num
        bytes_per_token_per_layer = index_head_dim + index_head_dim // quant_block_size * 4
        self.indexer_page_stride_size = bytes_per_token_per_layer * self.page_size
        self.indexer_layout_dim = self.indexer_page_stride_size * self.layer_num
        self.indexer_page_num = (self.size + self.page_size + 1) // self.page_size
        self.size_per_token = bytes_per_token_per_layer * self.layer_num
        self.can_use_jit = False
        self.can_use_write_back_jit = False
        self.init_kv_buffer()

    def init_kv_buffer(self):
        if self.layout == "layer_first":
            dims = (self.layer_num, self.indexer_page_num, self.indexer_page_stride_size)
        elif self.layout in ["page_first", "page_first_direct"]:
            dims = (self.indexer_page_num, self.layer_num, 1, self.indexer_page_stride_size)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.index_k_with_scale_buffer = torch.zeros(dims, dtype=self.indexer_dtype)

    def get_hybrid_pool_buffer(self):
        return [self.index_k_with_scale_buffer]

    def get_size_per_token(self):
        return self.size_per_token

    def get_data_page(self, index, flat: bool = True):
        page_idx = int(index) // self.page_size
        if self.layout == "layer_first":
            data_page = self.index_k_with_scale_buffer[:, page_idx:page_idx + 1, :]
        else:
            data_page = self.index_k_with_scale_buffer[page_idx:page_idx + 1, :, :, :]
        return data_page.flatten() if flat else data_page

    def get_dummy_flat_data_page(self):
        return torch.zeros((self.layer_num, self.indexer_page_stride_size),
                           dtype=self.indexer_dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page) -> None:
        page = self.get_data_page(index, flat=False)
        page.copy_(data_page.reshape(page.shape))

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        if self.layout not in ["page_first", "page_first_direct"]:
            raise ValueError(f"Unsupported layout: {self.layout}")
        ptr_list = []
        indices = indices.tolist()
        page_stride_bytes = self.layer_num * self.indexer_page_stride_size * _itemsize(self.indexer_dtype)
        base_ptr = self.index_k_with_scale_buffer.data_ptr()
        for i in range(0, len(indices), self.page_size):
            ptr_list.append(base_ptr + int(indices[i]) // self.page_size * page_stride_bytes)
        return ptr_list, [page_stride_bytes] * len(ptr_list)


def count_pool_hits(results):
    """SGLang's count_pool_hits (hicache_storage.py): the leading run of
    successes of each pool, which its controllers take the minimum of."""
    return {name: (rs.index(False) if False in rs else len(rs)) for name, rs in results.items()}
