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
"""
from __future__ import annotations

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


def page_indices(pool: FakeHostPool, pages) -> torch.Tensor:
    """host_indices for whole pages (token slots of each page, in order)."""
    ps = pool.page_size
    return torch.tensor([p * ps + t for p in pages for t in range(ps)], dtype=torch.int64)


class FakeSidecarHostPool:
    """A non-KV host pool of SGLang's hybrid models (Mamba/SWA state, DSA
    indexer), as far as a storage backend sees it at registration: the
    controller hands it over with its PoolName through register_mem_host_pool_v2
    (hybrid_cache_controller.attach_storage_backend / register_host_pool_entry)."""

    def __init__(self, page_size: int = 4, num_pages: int = 8, layout: str = "page_first"):
        self.layout = layout
        self.page_size = page_size
        self.size = num_pages * page_size
        self.size_per_token = 64
        self.kv_buffer = None
