/*
 * records.h - fixed-size records (the store's objects, the allocator's
 * blocks) carved from chunks whose pages are touched when the chunk is made.
 *
 * While a pool fills for the first time every object takes new records,
 * and records from malloc lie on heap pages never touched before: one page
 * fault per ~20 objects, which made a reservation cost 0.5-0.7 us a key on
 * the development VM instead of 0.1 (and more on the H200 host's VM),
 * on the loop thread while a store waited.  The store makes as many records
 * up front as a full pool of KV objects needs (records_prefill), touched
 * once, off the critical path; past them a chunk of 256 is made at a time.
 * A free record is poisoned under ASan, so a use after free is still caught.
 * Single-threaded: the owner's (the tier's loop thread's).
 */
#ifndef UMBP_DRAM_RECORDS_H
#define UMBP_DRAM_RECORDS_H

#include <stddef.h>

struct dram_records;

/* Records of `size` bytes; none made yet. -ENOMEM. */
int dram_records_create(size_t size, struct dram_records **out);
/* Makes free records until at least n exist in all; -ENOMEM. */
int dram_records_prefill(struct dram_records *r, size_t n);
/* A zeroed record, or NULL when no memory is left. */
void *dram_records_get(struct dram_records *r);
/* Returns a record from this set (NULL does nothing). */
void dram_records_put(struct dram_records *r, void *rec);
/* Frees every record, in use or not. */
void dram_records_destroy(struct dram_records *r);
/* Records made so far, in use or free (tests). */
size_t dram_records_made(const struct dram_records *r);

#endif /* UMBP_DRAM_RECORDS_H */
