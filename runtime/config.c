/*
 * config.c - the runtime's options: the core table and every registered
 * tier's table, parsed together (common/options.c), then checked: the core's
 * cross-option rules, and validate_config of every tier the runtime uses:
 * the primary tier and the children it declares (ops->uses), theirs, and so
 * on (only those: a tier that is not used does not veto a config).
 *
 * A mode is declared by the tier it runs on (ops->modes); a known mode whose
 * tier is not built is refused naming that tier (the table of known modes
 * and their tiers is UMBP_MODES, common/options.h) and the modes that are.
 *
 * Every option lives in exactly one table: umbp_core_options
 * (common/core_options.c), or a tier's ops->options; a name in two tables
 * is refused at creation.
 *
 * umbp_config_check() and umbp_mode_flags() answer connectors before any
 * runtime exists: the same parse, and the mode table's row.
 */
#include <errno.h>
#include <stdbool.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "options.h"
#include "rt.h"
#include "tier_call.h"

/* The tier whose table declares name; *core when the core table does;
 * NULL and !*core when no table does. */
static const struct umbp_tier_ops *option_owner(const char *name, bool *core)
{
    *core = false;
    for (const struct umbp_option *o = umbp_core_options; o->name; o++)
        if (strcmp(o->name, name) == 0) {
            *core = true;
            return NULL;
        }
    for (size_t k = 0; umbp_tier_registry[k]; k++)
        for (const struct umbp_option *o = umbp_tier_registry[k]->options; o && o->name; o++)
            if (strcmp(o->name, name) == 0)
                return umbp_tier_registry[k];
    return NULL;
}

/* Whether top is x or uses it, directly or through its children. */
static bool tier_reaches(const struct umbp_tier_ops *top, const struct umbp_tier_ops *x,
                         unsigned depth)
{
    if (top == x)
        return true;
    if (depth >= CONFIG_MAX_USED)
        return false;
    for (const char *const *u = top->uses; u && *u; u++) {
        const struct umbp_tier_ops *child = umbp_tier_find(*u);
        if (child && tier_reaches(child, x, depth + 1))
            return true;
    }
    return false;
}

/* name, an option of some tier: 0 if the runtime uses that tier (its
 * primary tier or a child of it), else -EINVAL and err saying whose option
 * it is. */
static int foreign_option(const char *name, const char *mode, const struct umbp_tier_ops *primary,
                          char *err, size_t errlen)
{
    bool core;
    const struct umbp_tier_ops *owner = option_owner(name, &core);
    if (core || owner == NULL || tier_reaches(primary, owner, 0))
        return 0;
    unsigned flags = 0;
    char e[256];
    (void)umbp_mode_props(mode, &flags, e, sizeof(e));
    snprintf(err, errlen, "%s: an option of the '%s' tier, which mode '%s' does not use (it runs "
             "on the '%s' tier)%s", name, owner->name, mode, primary->name,
             (flags & UMBP_MODE_SESSIONS) ? "; the pool and its options are the server's: set them "
                                            "in umbp-server's config" : "");
    return -EINVAL;
}

/* Options given in the JSON (not the environment, which a server and its
 * clients may share) must be the core's or the runtime's tier's: another
 * tier's would be parsed and then ignored. */
static int refuse_foreign_options(const char *json, const struct umbp_core_config *core,
                                  const struct umbp_tier_ops *primary, char *err, size_t errlen)
{
    if (!json || !*json)
        return 0;
    json_object *root = json_tokener_parse(json); /* valid: umbp_options_apply took it */
    if (!root || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return 0;
    }
    int rc = 0;
    json_object_object_foreach(root, key, val) {
        (void)val;
        if ((rc = foreign_option(key, core->mode, primary, err, errlen)) < 0)
            break;
    }
    json_object_put(root);
    return rc;
}

/* Defaults that depend on the mode, for options the user did not set (in
 * the JSON or the environment): distributed mode quarantines a key whose
 * load failed for 30 s (a dead owner's keys would otherwise be retried at
 * every get until the master drops them). */
#define DISTRIBUTED_QUARANTINE_MS 30000

static bool option_given(const char *json, const char *name, const char *env)
{
    if (getenv(env))
        return true;
    json_object *root = json && *json ? json_tokener_parse(json) : NULL;
    bool given = root && json_object_is_type(root, json_type_object) &&
                 json_object_object_get_ex(root, name, NULL);
    json_object_put(root);
    return given;
}

static void mode_defaults(const char *json, struct umbp_core_config *core)
{
    if (strcmp(core->mode, "distributed") == 0 &&
        !option_given(json, "load_failure_quarantine_ms", "UMBP_LOAD_FAILURE_QUARANTINE_MS"))
        core->load_failure_quarantine_ms = DISTRIBUTED_QUARANTINE_MS;
}

int config_parse(const char *json, struct rt_config **out)
{
    char err[512] = "";
    struct rt_config *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    while (umbp_tier_registry[c->num_tiers])
        c->num_tiers++;
    c->tier_cfg = calloc(c->num_tiers ? c->num_tiers : 1, sizeof(void *));
    if (!c->tier_cfg)
        goto nomem;
    for (size_t i = 0; i < c->num_tiers; i++) {
        size_t sz = umbp_tier_registry[i]->config_size;
        if (!(c->tier_cfg[i] = calloc(1, sz ? sz : 1)))
            goto nomem;
    }
    struct umbp_opt_table t[32];
    size_t nt = 0;
    t[nt++] = (struct umbp_opt_table){umbp_core_options, &c->core, "core"};
    for (size_t i = 0; i < c->num_tiers && nt < 32; i++)
        if (umbp_tier_registry[i]->options)
            t[nt++] = (struct umbp_opt_table){umbp_tier_registry[i]->options, c->tier_cfg[i],
                                              umbp_tier_registry[i]->name};
    int rc;
    if ((rc = umbp_options_apply(t, nt, json, err, sizeof(err))) < 0 ||
        (rc = umbp_core_validate(&c->core, &c->rank_capacity, err, sizeof(err))) < 0 ||
        (rc = config_primary_tier(&c->core, &c->primary, err, sizeof(err))) < 0)
        goto fail;
    mode_defaults(json, &c->core);
    if ((rc = config_use_tiers(c, c->primary, err, sizeof(err))) < 0 ||
        (rc = refuse_foreign_options(json, &c->core, c->primary, err, sizeof(err))) < 0)
        goto fail;
    *out = c;
    return 0;
nomem:
    snprintf(err, sizeof(err), "out of memory parsing the config");
    rc = -ENOMEM;
fail:
    umbp_set_error("%s", err);
    config_free(c);
    return rc;
}

static bool is_used(const struct rt_config *c, const struct umbp_tier_ops *ops)
{
    for (size_t i = 0; i < c->num_used; i++)
        if (c->used[i] == ops)
            return true;
    return false;
}

static int use_tier(struct rt_config *c, const struct umbp_tier_ops *ops, unsigned depth,
                    char *err, size_t errlen)
{
    if (is_used(c, ops))
        return 0; /* validated already (two parents may share a child) */
    if (depth >= CONFIG_MAX_USED || c->num_used == CONFIG_MAX_USED) {
        snprintf(err, errlen, "tier %s: its children (ops->uses) nest deeper than %d tiers "
                 "or form a cycle", ops->name, CONFIG_MAX_USED);
        return -EINVAL;
    }
    int rc;
    void *cfg = config_tier(c, ops);
    if (ops->validate_config && (rc = ops->validate_config(cfg, &c->core, err, errlen)) < 0)
        return rc;
    c->used[c->num_used++] = ops;
    for (const char *const *u = ops->uses; u && *u; u++) {
        const struct umbp_tier_ops *child = umbp_tier_find(*u);
        if (!child) {
            snprintf(err, errlen, "tier %s uses tier %s, which this libumbp does not have",
                     ops->name, *u);
            return -ENOTSUP;
        }
        if ((rc = use_tier(c, child, depth + 1, err, errlen)) < 0)
            return rc;
    }
    return 0;
}

int config_use_tiers(struct rt_config *c, const struct umbp_tier_ops *top, char *err,
                     size_t errlen)
{
    c->num_used = 0;
    return use_tier(c, top, 0, err, errlen);
}

int config_create_child(const struct umbp_tier_env *env, const char *name,
                        struct umbp_tier **out, char *err, size_t errlen)
{
    struct rt_config *c = (struct rt_config *)env->options;
    const struct umbp_tier_ops *ops = umbp_tier_find(name);
    if (!c || !ops || !is_used(c, ops)) {
        snprintf(err, errlen, "child tier %s: not declared in the parent tier's ops->uses, "
                 "so its options were not validated; add it there", name);
        return -EINVAL;
    }
    char cerr[400] = "";
    struct umbp_tier *t = NULL;
    int rc = ops->create(env, config_tier(c, ops), &t, cerr, sizeof(cerr));
    if (rc < 0) {
        snprintf(err, errlen, "child tier %s: %s", name, cerr[0] ? cerr : umbp_strerror(rc));
        return rc;
    }
    tier_instance_init(t, ops, env);
    *out = t;
    return 0;
}

void config_free(struct rt_config *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->tier_cfg && i < c->num_tiers; i++)
        free(c->tier_cfg[i]);
    free(c->tier_cfg);
    free(c);
}

void *config_tier(struct rt_config *c, const struct umbp_tier_ops *ops)
{
    for (size_t i = 0; i < c->num_tiers; i++)
        if (umbp_tier_registry[i] == ops)
            return c->tier_cfg[i];
    return NULL;
}

static void tier_names(char *have, size_t len)
{
    have[0] = 0;
    for (size_t k = 0; umbp_tier_registry[k]; k++) {
        if (k)
            strncat(have, ", ", len - strlen(have) - 1);
        strncat(have, umbp_tier_registry[k]->name, len - strlen(have) - 1);
    }
}

/* The modes the built tiers declare, in registry order. */
static void built_modes(char *out, size_t len)
{
    out[0] = 0;
    for (size_t k = 0; umbp_tier_registry[k]; k++)
        for (const char *const *m = umbp_tier_registry[k]->modes; m && *m; m++) {
            if (out[0])
                strncat(out, ", ", len - strlen(out) - 1);
            strncat(out, *m, len - strlen(out) - 1);
        }
    if (!out[0])
        snprintf(out, len, "none");
}

/* The tier that declares mode in its ops->modes; -ENOTSUP if none, -EINVAL
 * if two do (a build error in spirit: refused at every creation). */
static int mode_tier(const char *mode, const struct umbp_tier_ops **out, char *err,
                     size_t errlen)
{
    const struct umbp_tier_ops *found = NULL;
    for (size_t k = 0; umbp_tier_registry[k]; k++)
        for (const char *const *m = umbp_tier_registry[k]->modes; m && *m; m++)
            if (strcmp(*m, mode) == 0) {
                if (found) {
                    snprintf(err, errlen, "mode '%s' is declared by two tiers (%s and %s)",
                             mode, found->name, umbp_tier_registry[k]->name);
                    return -EINVAL;
                }
                found = umbp_tier_registry[k];
            }
    if (!found) {
        char built[256], have[256];
        built_modes(built, sizeof(built));
        tier_names(have, sizeof(have));
        const char *need = umbp_mode_tier(mode);
        if (need)
            snprintf(err, errlen, "mode: '%s' needs the '%s' tier, which this libumbp does not "
                     "have; built modes: %s (tiers built in: %s)", mode, need, built, have);
        else
            snprintf(err, errlen, "mode: '%s' needs a tier that this libumbp does not have; "
                     "built modes: %s (tiers built in: %s)", mode, built, have);
        return -ENOTSUP;
    }
    *out = found;
    return 0;
}

int config_primary_tier(const struct umbp_core_config *core, const struct umbp_tier_ops **out,
                        char *err, size_t errlen)
{
    if (!core->tier[0])
        return mode_tier(core->mode, out, err, errlen);
    const struct umbp_tier_ops *ops = umbp_tier_find(core->tier);
    if (!ops) {
        char have[256];
        tier_names(have, sizeof(have));
        snprintf(err, errlen, "tier: no tier named '%s' is built in (tiers built in: %s)",
                 core->tier, have);
        return -ENOTSUP;
    }
    *out = ops;
    return 0;
}

static void add_values(json_object *o, const struct umbp_option *opts, const void *base)
{
    for (const struct umbp_option *op = opts; op && op->name; op++) {
        const char *p = (const char *)base + op->offset;
        json_object *v = NULL;
        switch (op->type) {
        case UMBP_OPT_BOOL: v = json_object_new_boolean(*(const bool *)p); break;
        case UMBP_OPT_INT: v = json_object_new_int64(*(const int64_t *)p); break;
        case UMBP_OPT_SIZE: v = json_object_new_uint64(*(const uint64_t *)p); break;
        case UMBP_OPT_DOUBLE: v = json_object_new_double(*(const double *)p); break;
        case UMBP_OPT_STRING: v = json_object_new_string(p); break;
        }
        json_object_object_add(o, op->name, v);
    }
}

int umbp_config_check(const char *json_config, char *resolved, size_t len)
{
    struct rt_config *c = NULL;
    int rc = config_parse(json_config, &c);
    if (rc < 0 || !resolved)
        goto out;
    json_object *o = json_object_new_object();
    if (!o) {
        rc = -ENOMEM;
        goto out;
    }
    add_values(o, umbp_core_options, &c->core);
    add_values(o, c->primary->options, config_tier(c, c->primary));
    const char *text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
    if (!text || strlen(text) >= len) {
        umbp_set_error("umbp_config_check: the resolved config needs %zu bytes, got %zu",
                       text ? strlen(text) + 1 : 0, len);
        rc = text ? -ENOSPC : -ENOMEM;
    } else {
        memcpy(resolved, text, strlen(text) + 1);
    }
    json_object_put(o);
out:
    config_free(c);
    return rc;
}

int umbp_mode_flags(const char *mode)
{
    char err[512];
    unsigned flags;
    const struct umbp_tier_ops *ops;
    int rc;
    if ((rc = umbp_mode_props(mode, &flags, err, sizeof(err))) < 0 ||
        (rc = mode_tier(mode, &ops, err, sizeof(err))) < 0) {
        umbp_set_error("%s", err);
        return rc;
    }
    return (int)flags;
}

int umbp_option_lookup(const char *name, const char *mode)
{
    char err[512];
    unsigned flags;
    const struct umbp_tier_ops *ops;
    int rc;
    if (!name || !mode) {
        umbp_set_error("umbp_option_lookup: name and mode are required");
        return -EINVAL;
    }
    if ((rc = umbp_mode_props(mode, &flags, err, sizeof(err))) < 0 ||
        (rc = mode_tier(mode, &ops, err, sizeof(err))) < 0) {
        umbp_set_answer("%s", err);
        return rc;
    }
    bool core;
    if (option_owner(name, &core) == NULL && !core) {
        struct umbp_opt_table t[32];
        size_t nt = 0;
        t[nt++] = (struct umbp_opt_table){umbp_core_options, NULL, "core"};
        for (size_t k = 0; umbp_tier_registry[k] && nt < 32; k++)
            if (umbp_tier_registry[k]->options)
                t[nt++] = (struct umbp_opt_table){umbp_tier_registry[k]->options, NULL,
                                                  umbp_tier_registry[k]->name};
        umbp_options_unknown(t, nt, name, err, sizeof(err));
        umbp_set_answer("%s", err);
        return -ENOENT;
    }
    if ((rc = foreign_option(name, mode, ops, err, sizeof(err))) < 0) {
        umbp_set_answer("%s", err);
        return rc;
    }
    return 0;
}
