"""umbp: Python bindings of the umbp KV-cache offload runtime (ctypes).

    import umbp
    rt = umbp.Runtime({"capacity_bytes": "8GiB"})
    kv = rt.register_kv_caches(kv_caches)            # torch tensors, layer order
    ns = umbp.Namespace.derive(model, revision, block_size, layout, dtype)
    keys = umbp.derive_keys(ns, rank=(tp, 0, 0, 0), hashes=block_hashes)
    job = rt.store_blocks(kv, keys, block_ids); job.wait(); job.statuses

The API is specified in docs/python.md.  torch is optional: only
register_kv_caches and wait_event use torch objects, and they are duck-typed.
"""
from . import _lib
from ._ffi import KEY_SIZE, NS_SIZE, NS_HEX_SIZE, BLOCK_HASH_MAX
from ._lib import UmbpError, LibraryTooOld, strerror, last_error
from .keys import Namespace, derive_keys
from .runtime import Runtime, Job, KVCache, keys_array
from .lookup import LookupClient, lookup_socket_path
from .modes import ModeProperties, mode_properties, check_config

__version__ = "0.1.0"

library_path = _lib.path

# include/umbp/umbp.h UMBP_ERRORS (connector/tests/test_ffi.py checks them
# against the header)
ERRORS = {
    "E_INPROGRESS": -4097,
    "E_NOT_ATTEMPTED": -4098,
    "E_TIMEOUT": -4099,
    "E_STALE": -4100,
    "E_SHAPE": -4101,
    "E_DUPLICATE_KEY": -4102,
    "E_QUARANTINED": -4103,
    "E_KV_NDIM": -4201,
    "E_KV_ROLE": -4202,
    "E_KV_SHAPE": -4203,
    "E_KV_STRIDE": -4204,
    "E_KV_MISMATCH": -4205,
    "E_KV_RANGE": -4206,
    "E_GPU_UNREGISTERED": -4207,
}
globals().update(ERRORS)

EVENT_STORED = 1
EVENT_REMOVED = 2


def gpu_backends_built():
    """Names of the GPU backends compiled into the library ("host" always)."""
    bits = _lib.umbp_gpu_backends_built()
    return [name for b, name in ((1, "host"), (2, "cuda"), (3, "hip")) if bits & (1 << b)]


def has_lookup_service():
    """Whether the loaded libumbp has the lookup service (include/umbp/lookup.h)."""
    return all(_lib.has(n) for n in _lib._OPTIONAL)


__all__ = ["UmbpError", "LibraryTooOld", "strerror", "last_error", "KEY_SIZE", "NS_SIZE",
           "Namespace", "derive_keys", "Runtime", "Job", "KVCache", "LookupClient",
           "lookup_socket_path", "ModeProperties", "mode_properties", "check_config", "gpu_backends_built", "has_lookup_service", "library_path",
           "ERRORS", "EVENT_STORED", "EVENT_REMOVED"] + list(ERRORS)
