/*
 * config.h - runtime options: the core table, the tiers' tables, JSON and
 * UMBP_* environment parsing.  Used on the caller's thread at creation only.
 */
#ifndef UMBP_CONFIG_H
#define UMBP_CONFIG_H

#include "umbp/tier.h"

struct rt_config {
    struct umbp_core_config core;
    uint64_t rank_capacity;          /* resolved per-rank capacity */
    size_t num_tiers;                /* entries of umbp_tier_registry */
    void **tier_cfg;                 /* one parsed config per registered tier */
};

extern const struct umbp_option umbp_core_options[];

/* Parses json (NULL/"" = {}) and the environment.  0, or a negative code with
 * the message in umbp_last_error(). */
int config_parse(const char *json, struct rt_config **out);
void config_free(struct rt_config *c);
void *config_tier(struct rt_config *c, const struct umbp_tier_ops *ops);

/* Parses one option value written as text (environment form). */
int option_parse_text(const struct umbp_option *o, const char *text, void *base,
                      char *err, size_t errlen);
/* Parses a size: 4096, "64KiB", "2MiB", "1GiB", "4G", "512k". */
int parse_size(const char *s, uint64_t *out);

/* Names of the tiers a mode composes, NULL-terminated. */
const char *const *mode_tiers(const char *mode);

#endif
