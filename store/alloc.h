/*
 * alloc.h - the dram tier's allocator over a pool's byte range [0, capacity).
 *
 * Hands out offsets, never touches the pool's bytes: all metadata lives in
 * malloc'd block descriptors, because the pool is user data.  Sizes are
 * rounded up to DRAM_ALLOC_ALIGN and every offset is a multiple of it.
 * Single-threaded: the tier's loop thread owns it.
 */
#ifndef UMBP_DRAM_ALLOC_H
#define UMBP_DRAM_ALLOC_H

#include <stdint.h>
#include <stddef.h>

#define DRAM_ALLOC_ALIGN 256u

struct dram_alloc;

/* Bytes a request of `size` occupies (size rounded up to DRAM_ALLOC_ALIGN).
 * size must be at most UINT64_MAX - DRAM_ALLOC_ALIGN. */
static inline uint64_t dram_alloc_round(uint64_t size)
{
    return (size + DRAM_ALLOC_ALIGN - 1) & ~(uint64_t)(DRAM_ALLOC_ALIGN - 1);
}

/* Manages [0, capacity rounded down to DRAM_ALLOC_ALIGN).  -EINVAL if that
 * is 0, -ENOMEM. */
int dram_alloc_create(uint64_t capacity, struct dram_alloc **out);
/* Makes the records of `blocks` blocks now (touched), so that splitting
 * the free space into that many does not fault in memory; -ENOMEM. */
int dram_alloc_prefill(struct dram_alloc *a, size_t blocks);
/* Block records made so far, in use or free (tests). */
size_t dram_alloc_records(const struct dram_alloc *a);
/* One allocation, for dram_alloc_create_used. */
struct dram_alloc_range {
    uint64_t off, size;
};

/* Manages [0, capacity) with `used` already allocated (a pool adopted after
 * a restart): sorted by offset, aligned, not overlapping, inside capacity,
 * else -EINVAL.  -ENOMEM. */
int dram_alloc_create_used(uint64_t capacity, const struct dram_alloc_range *used, size_t n,
                           struct dram_alloc **out);
/* Frees the metadata; outstanding allocations are simply forgotten. */
void dram_alloc_destroy(struct dram_alloc *a);

/* Best fit: 0 and *off, -EINVAL for size 0, -ENOSPC when no free block is
 * large enough, -ENOMEM when a descriptor cannot be allocated. */
int dram_alloc_get(struct dram_alloc *a, uint64_t size, uint64_t *off);
/* Frees the allocation starting at off and merges it with free neighbours.
 * -ENOENT if off is not the start of a live allocation (nothing changes). */
int dram_alloc_put(struct dram_alloc *a, uint64_t off);

uint64_t dram_alloc_capacity(const struct dram_alloc *a);
uint64_t dram_alloc_used(const struct dram_alloc *a);   /* rounded bytes */
uint64_t dram_alloc_largest_free(const struct dram_alloc *a);
size_t dram_alloc_free_blocks(const struct dram_alloc *a);

/* Walks every block and both trees; 0 if every invariant holds, otherwise a
 * negative number identifying the first broken one.  O(n): tests only. */
int dram_alloc_check(const struct dram_alloc *a);

#endif /* UMBP_DRAM_ALLOC_H */
