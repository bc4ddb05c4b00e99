/*
 * ffi_layout.c - prints what connector/umbp/_ffi.py must mirror: sizeof and
 * offsetof of every struct the Python package passes to libumbp, the error
 * codes and the size constants.  Built and run by test_ffi.py with `cc`.
 * Output lines: "struct NAME SIZE", "field NAME MEMBER OFFSET",
 * "const NAME VALUE".
 */
#include <stddef.h>
#include <stdio.h>

#include "umbp/gpu.h"
#include "umbp/keys.h"
#include "umbp/umbp.h"

#define S(t) printf("struct %s %zu\n", #t, sizeof(t))
#define F(t, m) printf("field %s %s %zu\n", #t, #m, offsetof(t, m))
#define C(n) printf("const %s %lld\n", #n, (long long)(n))

int main(void)
{
    S(umbp_kv_tensor_t);
    F(umbp_kv_tensor_t, base); F(umbp_kv_tensor_t, ndim); F(umbp_kv_tensor_t, shape);
    F(umbp_kv_tensor_t, stride); F(umbp_kv_tensor_t, elem_size); F(umbp_kv_tensor_t, block_dim);
    F(umbp_kv_tensor_t, kv_dim); F(umbp_kv_tensor_t, layer_dim);
    S(umbp_kv_xfer_opts_t);
    F(umbp_kv_xfer_opts_t, first_layer); F(umbp_kv_xfer_opts_t, num_layers);
    F(umbp_kv_xfer_opts_t, wait_event);
    S(umbp_mem_desc_t);
    F(umbp_mem_desc_t, addr); F(umbp_mem_desc_t, len); F(umbp_mem_desc_t, kind);
    F(umbp_mem_desc_t, device);
    S(umbp_ns_t);
    F(umbp_ns_t, bytes);
    S(umbp_cache_group_desc_t);
    F(umbp_cache_group_desc_t, kind); F(umbp_cache_group_desc_t, block_size);
    F(umbp_cache_group_desc_t, num_layers); F(umbp_cache_group_desc_t, dtype);
    S(umbp_ns_desc_t);
    F(umbp_ns_desc_t, model); F(umbp_ns_desc_t, revision); F(umbp_ns_desc_t, block_size);
    F(umbp_ns_desc_t, layout); F(umbp_ns_desc_t, dtype); F(umbp_ns_desc_t, groups);
    F(umbp_ns_desc_t, num_groups); F(umbp_ns_desc_t, tp); F(umbp_ns_desc_t, pp);
    F(umbp_ns_desc_t, pcp); F(umbp_ns_desc_t, dcp);
    S(umbp_rank_id_t);
    F(umbp_rank_id_t, tp); F(umbp_rank_id_t, pp); F(umbp_rank_id_t, pcp); F(umbp_rank_id_t, dcp);
    S(umbp_stats_t);
#define STAT(m) F(umbp_stats_t, m);
    STAT(capacity_bytes) STAT(used_bytes) STAT(num_objects) STAT(num_pending) STAT(num_leased)
    STAT(puts_ok) STAT(puts_existing) STAT(puts_failed) STAT(gets_ok) STAT(gets_miss)
    STAT(gets_failed) STAT(bytes_written) STAT(bytes_read) STAT(lookups) STAT(lookup_keys)
    STAT(lookup_hits) STAT(evictions) STAT(evicted_bytes) STAT(leases_expired)
    STAT(puts_waited_for_space) STAT(ops_timed_out) STAT(mailbox_full) STAT(events_dropped)
    STAT(kv_transfers) STAT(kv_prepare_ns) STAT(kv_launch_ns) STAT(kv_gpu_ns) STAT(kv_finish_ns)
    STAT(kv_queue_ns) STAT(kv_tier_ns) STAT(prewakes) STAT(reserved_ahead)
    STAT(reserved_ahead_used)
    S(umbp_kv_block_t);
    F(umbp_kv_block_t, key); F(umbp_kv_block_t, block);
    S(umbp_range_t);
    F(umbp_range_t, ptr); F(umbp_range_t, len); F(umbp_range_t, offset);
    S(umbp_put_item_t);
    F(umbp_put_item_t, key); F(umbp_put_item_t, object_size); F(umbp_put_item_t, ranges);
    F(umbp_put_item_t, num_ranges);
    S(umbp_get_item_t);
    F(umbp_get_item_t, key); F(umbp_get_item_t, ranges); F(umbp_get_item_t, num_ranges);
    S(umbp_event_t);
    F(umbp_event_t, type); F(umbp_event_t, key);
    C(UMBP_KEY_SIZE); C(UMBP_NS_SIZE); C(UMBP_NS_HEX_SIZE); C(UMBP_BLOCK_HASH_MAX);
    C(UMBP_KV_MAX_DIMS); C(UMBP_LOOKUP_TOUCH); C(UMBP_EVENT_STORED); C(UMBP_EVENT_REMOVED);
    C(UMBP_MODE_SHARED_POOL); C(UMBP_MODE_SESSIONS); C(UMBP_MODE_SHARED_LOOKUP);
#define ERR(name, value, text) C(name);
    UMBP_ERRORS(ERR)
    return 0;
}
