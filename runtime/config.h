/*
 * config.h - runtime options: the core table, the tiers' tables, JSON and
 * UMBP_* environment parsing.  Used on the caller's thread at creation only.
 */
#ifndef UMBP_CONFIG_H
#define UMBP_CONFIG_H

#include "options.h"
#include "umbp/tier.h"

struct rt_config {
    struct umbp_core_config core;
    uint64_t rank_capacity;          /* resolved per-rank capacity */
    size_t num_tiers;                /* entries of umbp_tier_registry */
    void **tier_cfg;                 /* one parsed config per registered tier */
    const struct umbp_tier_ops *primary; /* the tier the mode (or `tier`) names */
};


/* Parses json (NULL/"" = {}) and the environment.  0, or a negative code with
 * the message in umbp_last_error(). */
int config_parse(const char *json, struct rt_config **out);
void config_free(struct rt_config *c);
void *config_tier(struct rt_config *c, const struct umbp_tier_ops *ops);

/* The primary tier of a config: the `tier` override, or the registered tier
 * whose ops->modes declares core->mode.  Negative with err naming why. */
int config_primary_tier(const struct umbp_core_config *core, const struct umbp_tier_ops **out,
                        char *err, size_t errlen);

#endif
