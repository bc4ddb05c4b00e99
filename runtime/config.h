/*
 * config.h - runtime options: the core table, the tiers' tables, JSON and
 * UMBP_* environment parsing.  Used on the caller's thread at creation only.
 */
#ifndef UMBP_CONFIG_H
#define UMBP_CONFIG_H

#include "options.h"
#include "umbp/tier.h"

#define CONFIG_MAX_USED 8 /* tiers one runtime may use, children included */

struct rt_config {
    struct umbp_core_config core;
    uint64_t rank_capacity;          /* resolved per-rank capacity */
    size_t num_tiers;                /* entries of umbp_tier_registry */
    void **tier_cfg;                 /* one parsed config per registered tier */
    const struct umbp_tier_ops *primary; /* the tier the mode (or `tier`) names */
    /* every tier the runtime uses: the primary and, through ops->uses, its
     * children and theirs; each one's validate_config passed */
    const struct umbp_tier_ops *used[CONFIG_MAX_USED];
    size_t num_used;
};


/* Parses json (NULL/"" = {}) and the environment.  0, or a negative code with
 * the message in umbp_last_error(). */
int config_parse(const char *json, struct rt_config **out);
void config_free(struct rt_config *c);
void *config_tier(struct rt_config *c, const struct umbp_tier_ops *ops);

/* Validates every tier that `top` uses (itself, then ops->uses, depth
 * first) with its parsed options, recording them in c->used.  Negative with
 * err naming the tier and the option; a tier named in uses that is not
 * built, or a cycle, is refused. */
int config_use_tiers(struct rt_config *c, const struct umbp_tier_ops *top, char *err,
                     size_t errlen);

/* env->create_child of the runtime's tiers: env->options is the rt_config. */
int config_create_child(const struct umbp_tier_env *env, const char *name,
                        struct umbp_tier **out, char *err, size_t errlen);

/* The primary tier of a config: the `tier` override, or the registered tier
 * whose ops->modes declares core->mode.  Negative with err naming why. */
int config_primary_tier(const struct umbp_core_config *core, const struct umbp_tier_ops **out,
                        char *err, size_t errlen);

#endif
