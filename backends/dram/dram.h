/*
 * dram.h - what other parts of umbp need from the dram tier beyond the
 * vtable: umbp-server parses the same dram_* options and builds the same
 * store from them (one option table, one store).
 * Caller's thread; no state.
 */
#ifndef UMBP_DRAM_H
#define UMBP_DRAM_H

#include "umbp/tier.h"

struct dram_store_params;

/* The vtable, also listed in the generated registry. */
extern const struct umbp_tier_ops umbp_tier_dram_ops;

/* The dram_* option table and the size of the config struct it fills. */
const struct umbp_option *umbp_dram_options(size_t *config_size);
/* Cross-option checks of a filled config (names the options in err). */
int umbp_dram_validate_config(const void *cfg, char *err, size_t errlen);
/* Store parameters (pool, capacity, watermarks) from a filled config; the
 * caller sets the hooks.  p->pool.shm_name points into cfg. */
int umbp_dram_store_params(const void *cfg, uint64_t capacity, struct dram_store_params *p);

#endif /* UMBP_DRAM_H */
