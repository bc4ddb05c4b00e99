"""C structs of include/umbp/*.h, mirrored for ctypes and numpy.

Structs passed one at a time (a KV tensor, a namespace description, the
stats) are ctypes Structures.  Structs passed as arrays on hot paths (KV
blocks, put/get items, ranges, events) are numpy structured dtypes with
explicit offsets and itemsize, so a batch is built by vectorised assignment
and handed to C as one pointer.  connector/tests/test_ffi.py compiles a C
program that prints sizeof/offsetof of every struct here and compares.

Only x86-64 / aarch64 Linux (LP64) is supported: pointers and size_t are 8
bytes, enums are 4.
"""
import ctypes

import numpy as np

KEY_SIZE = 32
NS_SIZE = 16
NS_HEX_SIZE = 2 * NS_SIZE + 1
BLOCK_HASH_MAX = 64
KV_MAX_DIMS = 8

c_key = ctypes.c_uint8 * KEY_SIZE


class KvTensor(ctypes.Structure):  # umbp_kv_tensor_t
    _fields_ = [
        ("base", ctypes.c_void_p),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_int64 * KV_MAX_DIMS),
        ("stride", ctypes.c_int64 * KV_MAX_DIMS),
        ("elem_size", ctypes.c_uint32),
        ("block_dim", ctypes.c_int32),
        ("kv_dim", ctypes.c_int32),
        ("layer_dim", ctypes.c_int32),
    ]


class KvXferOpts(ctypes.Structure):  # umbp_kv_xfer_opts_t
    _fields_ = [
        ("first_layer", ctypes.c_uint32),
        ("num_layers", ctypes.c_uint32),
        ("wait_event", ctypes.c_void_p),
    ]


class MemDesc(ctypes.Structure):  # umbp_mem_desc_t
    _fields_ = [
        ("addr", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("kind", ctypes.c_int),
        ("device", ctypes.c_int),
    ]


class Ns(ctypes.Structure):  # umbp_ns_t
    _fields_ = [("bytes", ctypes.c_uint8 * NS_SIZE)]


class CacheGroupDesc(ctypes.Structure):  # umbp_cache_group_desc_t
    _fields_ = [
        ("kind", ctypes.c_char_p),
        ("block_size", ctypes.c_uint32),
        ("num_layers", ctypes.c_uint32),
        ("dtype", ctypes.c_char_p),
    ]


class NsDesc(ctypes.Structure):  # umbp_ns_desc_t
    _fields_ = [
        ("model", ctypes.c_char_p),
        ("revision", ctypes.c_char_p),
        ("block_size", ctypes.c_uint32),
        ("layout", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("groups", ctypes.POINTER(CacheGroupDesc)),
        ("num_groups", ctypes.c_uint32),
        ("tp", ctypes.c_uint32),
        ("pp", ctypes.c_uint32),
        ("pcp", ctypes.c_uint32),
        ("dcp", ctypes.c_uint32),
    ]


class RankId(ctypes.Structure):  # umbp_rank_id_t
    _fields_ = [
        ("tp", ctypes.c_uint32),
        ("pp", ctypes.c_uint32),
        ("pcp", ctypes.c_uint32),
        ("dcp", ctypes.c_uint32),
    ]


STATS_FIELDS = (
    "capacity_bytes", "used_bytes", "num_objects", "num_pending", "num_leased",
    "puts_ok", "puts_existing", "puts_failed",
    "gets_ok", "gets_miss", "gets_failed",
    "bytes_written", "bytes_read",
    "lookups", "lookup_keys", "lookup_hits",
    "evictions", "evicted_bytes",
    "leases_expired", "puts_waited_for_space", "ops_timed_out",
    "mailbox_full", "events_dropped",
    "kv_transfers", "kv_prepare_ns", "kv_launch_ns", "kv_gpu_ns", "kv_finish_ns",
    "kv_queue_ns", "kv_tier_ns", "prewakes",
    "reserved_ahead", "reserved_ahead_used",
)


class Stats(ctypes.Structure):  # umbp_stats_t
    _fields_ = [(f, ctypes.c_uint64) for f in STATS_FIELDS]


# ---- arrays of structs (numpy) -------------------------------------------

# umbp_kv_block_t: key[32], uint64 block
KV_BLOCK_DT = np.dtype({"names": ["key", "block"],
                        "formats": ["V32", "<u8"],
                        "offsets": [0, 32], "itemsize": 40})
# umbp_range_t: void *ptr, uint64 len, uint64 offset
RANGE_DT = np.dtype({"names": ["ptr", "len", "offset"],
                     "formats": ["<u8", "<u8", "<u8"],
                     "offsets": [0, 8, 16], "itemsize": 24})
# umbp_put_item_t: key[32], uint64 object_size, const umbp_range_t *ranges,
# uint32 num_ranges (+4 padding)
PUT_ITEM_DT = np.dtype({"names": ["key", "object_size", "ranges", "num_ranges"],
                        "formats": ["V32", "<u8", "<u8", "<u4"],
                        "offsets": [0, 32, 40, 48], "itemsize": 56})
# umbp_get_item_t: key[32], const umbp_range_t *ranges, uint32 num_ranges
GET_ITEM_DT = np.dtype({"names": ["key", "ranges", "num_ranges"],
                        "formats": ["V32", "<u8", "<u4"],
                        "offsets": [0, 32, 40], "itemsize": 48})
# umbp_event_t: enum type (int), key[32]; 4-byte aligned
EVENT_DT = np.dtype({"names": ["type", "key"],
                     "formats": ["<i4", "V32"],
                     "offsets": [0, 4], "itemsize": 36})

# name -> (sizeof, {field: offset}) as this module lays them out; the layout
# test compares every entry with the C compiler's answer.
def layouts():
    out = {}
    for cname, st in (("umbp_kv_tensor_t", KvTensor), ("umbp_kv_xfer_opts_t", KvXferOpts),
                      ("umbp_mem_desc_t", MemDesc), ("umbp_ns_t", Ns),
                      ("umbp_cache_group_desc_t", CacheGroupDesc), ("umbp_ns_desc_t", NsDesc),
                      ("umbp_rank_id_t", RankId), ("umbp_stats_t", Stats)):
        out[cname] = (ctypes.sizeof(st),
                      {f[0]: getattr(st, f[0]).offset for f in st._fields_})
    for cname, dt in (("umbp_kv_block_t", KV_BLOCK_DT), ("umbp_range_t", RANGE_DT),
                      ("umbp_put_item_t", PUT_ITEM_DT), ("umbp_get_item_t", GET_ITEM_DT),
                      ("umbp_event_t", EVENT_DT)):
        out[cname] = (dt.itemsize, {n: dt.fields[n][1] for n in dt.names})
    return out
