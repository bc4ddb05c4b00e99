/*
 * dram_options.h - the store's dram_* options, as the dram tier and
 * umbp-server both read them: each parses the same options and builds the
 * same store from them (one option table, one store).
 * Caller's thread; no state.
 */
#ifndef UMBP_DRAM_OPTIONS_H
#define UMBP_DRAM_OPTIONS_H

#include "umbp/tier.h"

struct dram_store_params;

/* The dram_* option table and the size of the config struct it fills. */
const struct umbp_option *umbp_dram_options(size_t *config_size);
/* Cross-option checks of a filled config (names the options in err). */
int umbp_dram_validate_config(const void *cfg, char *err, size_t errlen);
/* Store parameters (pool, capacity, watermarks) from a filled config; the
 * caller sets the hooks.  p->pool.shm_name points into cfg. */
int umbp_dram_store_params(const void *cfg, uint64_t capacity, struct dram_store_params *p);

#endif /* UMBP_DRAM_OPTIONS_H */
