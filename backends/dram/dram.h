/*
 * dram.h - what the runtime needs from the dram tier beyond the vtable.
 *
 * The evictor actor computes its targets from usage() and the watermarks
 * configured for this tier (dram_high_watermark, dram_low_watermark).
 * Loop thread or creating thread; the values never change after create.
 */
#ifndef UMBP_DRAM_H
#define UMBP_DRAM_H

#include "umbp/tier.h"

/* The vtable, also listed in the generated registry. */
extern const struct umbp_tier_ops umbp_tier_dram_ops;

/* The configured watermarks, as fractions of capacity_bytes.  t must come
 * from umbp_tier_dram_ops.create; for any other tier they return -1.0. */
double umbp_dram_high_watermark(struct umbp_tier *t);
double umbp_dram_low_watermark(struct umbp_tier *t);

#endif /* UMBP_DRAM_H */
