/*
 * config.c - option tables and their parsing.
 *
 * Every option lives in exactly one table: umbp_core_options here, or a
 * tier's ops->options.  Defaults are written as text and parsed by the same
 * code as user input, so a default can never bypass validation.  The JSON
 * (parsed with json-c) is applied first, then UMBP_<NAME> environment
 * variables override it.  Unknown names are refused so typos surface.
 */
#include <ctype.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "rt.h"

#define OFF(f) offsetof(struct umbp_core_config, f)
#define MiB (1024.0 * 1024.0)
#define TiB (1024.0 * 1024.0 * 1024.0 * 1024.0)

static const char *const modes[] = {"embedded", "standalone", "distributed", NULL};
static const char *const levels[] = {"error", "warn", "info", "debug", NULL};
static const char *const gpu_backends[] = {"auto", "cuda", "hip", "host", NULL};
static const char *const auto_on_off[] = {"auto", "on", "off", NULL};

const struct umbp_option umbp_core_options[] = {
    {"mode", UMBP_OPT_STRING, OFF(mode), "embedded", 0, 0, 32, modes,
     "composition of tiers: embedded (dram), standalone (shm), distributed (dram+rdma)"},
    {"tier", UMBP_OPT_STRING, OFF(tier), "", 0, 0, 32, NULL,
     "run on this registered tier instead of the mode's primary one (tests, experiments)"},
    {"rank", UMBP_OPT_INT, OFF(rank), "0", 0, 65535, 0, NULL, "this worker's rank in its engine"},
    {"world_size", UMBP_OPT_INT, OFF(world_size), "1", 1, 65536, 0, NULL,
     "ranks per engine (total_capacity_bytes is split over them)"},
    {"capacity_bytes", UMBP_OPT_SIZE, OFF(capacity_bytes), "0", 0, 64 * TiB, 0, NULL,
     "pool capacity of this rank (default 1GiB when neither capacity option is set)"},
    {"total_capacity_bytes", UMBP_OPT_SIZE, OFF(total_capacity_bytes), "0", 0, 1024 * TiB, 0,
     NULL, "pool capacity of the whole engine, split evenly over world_size ranks"},
    {"timeout_ms", UMBP_OPT_INT, OFF(timeout_ms), "10000", 1, 3600000, 0, NULL,
     "bound on every data operation; past it the op completes with UMBP_E_TIMEOUT"},
    {"lookup_timeout_ms", UMBP_OPT_INT, OFF(lookup_timeout_ms), "100", 1, 60000, 0, NULL,
     "bound on one umbp_lookup call"},
    {"put_wait_ms", UMBP_OPT_INT, OFF(put_wait_ms), "1000", 0, 3600000, 0, NULL,
     "how long a put into a full pool waits for eviction before -ENOSPC"},
    {"lease_ttl_ms", UMBP_OPT_INT, OFF(lease_ttl_ms), "30000", 10, 3600000, 0, NULL,
     "read lease lifetime; a reader that holds a lease longer may see UMBP_E_STALE"},
    {"load_failure_quarantine_ms", UMBP_OPT_INT, OFF(load_failure_quarantine_ms), "0", 0,
     3600000, 0, NULL, "after a failed load, the key counts as a miss this long (0 = off)"},
    {"max_inflight_ops", UMBP_OPT_INT, OFF(max_inflight_ops), "1024", 4, 1 << 20, 0, NULL,
     "operations in flight per runtime; more are refused with -EAGAIN"},
    {"copy_threads", UMBP_OPT_INT, OFF(copy_threads), "2", 1, 64, 0, NULL,
     "host copy worker threads"},
    {"enable_events", UMBP_OPT_BOOL, OFF(enable_events), "false", 0, 0, 0, NULL,
     "queue stored/removed events for umbp_events_drain"},
    {"event_queue_size", UMBP_OPT_INT, OFF(event_queue_size), "65536", 16, 1 << 24, 0, NULL,
     "events kept before the oldest are dropped (and counted as lost)"},
    {"log_level", UMBP_OPT_STRING, OFF(log_level), "warn", 0, 0, 16, levels,
     "error, warn, info or debug"},
    {"poll_wait", UMBP_OPT_STRING, OFF(poll_wait), "auto", 0, 0, 8, auto_on_off,
     "poll briefly before sleeping (waiters; the loop during GPU transfers): auto = on "
     "with at least 8 cores"},
    {"gpu_backend", UMBP_OPT_STRING, OFF(gpu_backend), "auto", 0, 0, 16, gpu_backends,
     "GPU runtime of umbp_kv_*: auto (CUDA, then HIP), cuda, hip, or host (device memory is "
     "host memory; tests)"},
    {"gpu_device", UMBP_OPT_INT, OFF(gpu_device), "0", 0, 1023, 0, NULL,
     "GPU ordinal (within the backend) that this rank's KV cache lives on"},
    {"gpu_max_ctas", UMBP_OPT_INT, OFF(gpu_max_ctas), "8", 1, 1024, 0, NULL,
     "thread blocks (at most one SM each) a KV copy kernel may occupy"},
    {"gpu_staging_bytes", UMBP_OPT_SIZE, OFF(gpu_staging_bytes), "64MiB", 1 << 20, 16.0 * (1ull << 30), 0,
     NULL, "device staging buffer of the staged copy method"},
    {"gpu_store_slice_blocks", UMBP_OPT_INT, OFF(gpu_store_slice_blocks), "128", 0, 1 << 24, 0, NULL,
     "umbp_kv_store batches larger than this run as slices that overlap reservation "
     "and publish with copying (0: never split; loads stay one transfer)"},
    {NULL},
};

/* ---- sizes -------------------------------------------------------------- */

int parse_size(const char *s, uint64_t *out)
{
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s))
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -ERANGE;
    while (isspace((unsigned char)*end))
        end++;
    static const struct { const char *suffix; unsigned shift; } units[] = {
        {"", 0},      {"b", 0},      {"k", 10},  {"kb", 10}, {"kib", 10}, {"m", 20},
        {"mb", 20},   {"mib", 20},   {"g", 30},  {"gb", 30}, {"gib", 30}, {"t", 40},
        {"tb", 40},   {"tib", 40},
    };
    char unit[8] = {0};
    size_t ul = strlen(end);
    while (ul && isspace((unsigned char)end[ul - 1]))
        ul--;
    if (ul >= sizeof(unit))
        return -EINVAL;
    for (size_t i = 0; i < ul; i++)
        unit[i] = (char)tolower((unsigned char)end[i]);
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(unit, units[i].suffix) == 0) {
            if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
                return -ERANGE;
            *out = (uint64_t)v << units[i].shift;
            return 0;
        }
    }
    return -EINVAL;
}

/* ---- one option ----------------------------------------------------------- */

static int check_bounds(const struct umbp_option *o, double v, char *err, size_t errlen)
{
    if (isnan(v) || v < o->min || v > o->max) {
        if (o->type == UMBP_OPT_DOUBLE)
            snprintf(err, errlen, "%s: must be between %g and %g, got %g", o->name, o->min,
                     o->max, v);
        else /* integers print exactly */
            snprintf(err, errlen, "%s: must be between %.0f and %.0f, got %.0f", o->name,
                     o->min, o->max, v);
        return -EINVAL;
    }
    return 0;
}

static int parse_bool_text(const char *t, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(t, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(t, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -EINVAL;
}

static int set_string(const struct umbp_option *o, const char *t, void *base, char *err,
                      size_t errlen)
{
    if (strlen(t) >= o->str_cap) {
        snprintf(err, errlen, "%s: longer than %zu characters", o->name, o->str_cap - 1);
        return -EINVAL;
    }
    if (o->choices) {
        bool ok = false;
        for (size_t i = 0; o->choices[i]; i++)
            ok = ok || strcmp(o->choices[i], t) == 0;
        if (!ok) {
            char list[256] = "";
            for (size_t i = 0; o->choices[i]; i++) {
                if (i)
                    strncat(list, ", ", sizeof(list) - strlen(list) - 1);
                strncat(list, o->choices[i], sizeof(list) - strlen(list) - 1);
            }
            snprintf(err, errlen, "%s: must be one of %s, got '%s'", o->name, list, t);
            return -EINVAL;
        }
    }
    memcpy((char *)base + o->offset, t, strlen(t) + 1);
    return 0;
}

int option_parse_text(const struct umbp_option *o, const char *t, void *base, char *err,
                      size_t errlen)
{
    void *dst = (char *)base + o->offset;
    char *end;
    switch (o->type) {
    case UMBP_OPT_BOOL:
        if (parse_bool_text(t, (bool *)dst) < 0) {
            snprintf(err, errlen, "%s: must be true or false, got '%s'", o->name, t);
            return -EINVAL;
        }
        return 0;
    case UMBP_OPT_INT: {
        errno = 0;
        long long v = strtoll(t, &end, 10);
        if (errno || end == t || *end) {
            snprintf(err, errlen, "%s: must be an integer, got '%s'", o->name, t);
            return -EINVAL;
        }
        if (check_bounds(o, (double)v, err, errlen) < 0)
            return -EINVAL;
        *(int64_t *)dst = v;
        return 0;
    }
    case UMBP_OPT_SIZE: {
        uint64_t v;
        if (parse_size(t, &v) < 0) {
            snprintf(err, errlen,
                     "%s: must be a byte count such as 1073741824, \"512MiB\" or \"4GiB\", got '%s'",
                     o->name, t);
            return -EINVAL;
        }
        if (check_bounds(o, (double)v, err, errlen) < 0)
            return -EINVAL;
        *(uint64_t *)dst = v;
        return 0;
    }
    case UMBP_OPT_DOUBLE: {
        errno = 0;
        double v = strtod(t, &end);
        if (errno || end == t || *end) {
            snprintf(err, errlen, "%s: must be a number, got '%s'", o->name, t);
            return -EINVAL;
        }
        if (check_bounds(o, v, err, errlen) < 0)
            return -EINVAL;
        *(double *)dst = v;
        return 0;
    }
    case UMBP_OPT_STRING:
        return set_string(o, t, base, err, errlen);
    }
    return -EINVAL;
}

static const char *json_type_word(json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double: return "a number";
    case json_type_int: return "an integer";
    case json_type_object: return "an object";
    case json_type_array: return "an array";
    case json_type_string: return "a string";
    }
    return "?";
}

static int option_parse_json(const struct umbp_option *o, json_object *v, void *base,
                             char *err, size_t errlen)
{
    enum json_type jt = json_object_get_type(v);
    char text[64];
    switch (o->type) {
    case UMBP_OPT_BOOL:
        if (jt != json_type_boolean)
            goto wrong;
        *(bool *)((char *)base + o->offset) = json_object_get_boolean(v);
        return 0;
    case UMBP_OPT_INT:
        if (jt != json_type_int)
            goto wrong;
        snprintf(text, sizeof(text), "%lld", (long long)json_object_get_int64(v));
        if (json_object_get_int64(v) == INT64_MAX || json_object_get_int64(v) == INT64_MIN) {
            snprintf(err, errlen, "%s: integer out of range", o->name);
            return -EINVAL;
        }
        return option_parse_text(o, text, base, err, errlen);
    case UMBP_OPT_SIZE:
        if (jt == json_type_string)
            return option_parse_text(o, json_object_get_string(v), base, err, errlen);
        if (jt != json_type_int || json_object_get_int64(v) < 0)
            goto wrong;
        snprintf(text, sizeof(text), "%lld", (long long)json_object_get_int64(v));
        return option_parse_text(o, text, base, err, errlen);
    case UMBP_OPT_DOUBLE:
        if (jt != json_type_double && jt != json_type_int)
            goto wrong;
        snprintf(text, sizeof(text), "%.17g", json_object_get_double(v));
        return option_parse_text(o, text, base, err, errlen);
    case UMBP_OPT_STRING:
        if (jt != json_type_string)
            goto wrong;
        return option_parse_text(o, json_object_get_string(v), base, err, errlen);
    }
wrong:
    snprintf(err, errlen, "%s: expected %s, got %s", o->name,
             o->type == UMBP_OPT_BOOL     ? "true or false"
             : o->type == UMBP_OPT_INT    ? "an integer"
             : o->type == UMBP_OPT_SIZE   ? "a non-negative integer or a size string like \"4GiB\""
             : o->type == UMBP_OPT_DOUBLE ? "a number"
                                          : "a string",
             json_type_word(v));
    return -EINVAL;
}

/* ---- tables --------------------------------------------------------------- */

struct table_ref {
    const struct umbp_option *opts;
    void *base;
};

static size_t collect_tables(struct rt_config *c, struct table_ref *t, size_t max)
{
    size_t n = 0;
    t[n++] = (struct table_ref){umbp_core_options, &c->core};
    for (size_t i = 0; i < c->num_tiers && n < max; i++)
        if (umbp_tier_registry[i]->options)
            t[n++] = (struct table_ref){umbp_tier_registry[i]->options, c->tier_cfg[i]};
    return n;
}

static const struct umbp_option *find_option(struct table_ref *t, size_t nt, const char *name,
                                             void **base)
{
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++)
            if (strcmp(o->name, name) == 0) {
                *base = t[i].base;
                return o;
            }
    return NULL;
}

static int apply_defaults(struct table_ref *t, size_t nt, char *err, size_t errlen)
{
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++)
            if (option_parse_text(o, o->def, t[i].base, err, errlen) < 0)
                return -EINVAL; /* a bad default is our bug; still refuse */
    return 0;
}

static int apply_json(const char *json, struct table_ref *t, size_t nt, char *err, size_t errlen)
{
    if (!json || !*json)
        return 0;
    json_tokener *tok = json_tokener_new();
    if (!tok) {
        snprintf(err, errlen, "out of memory parsing the config");
        return -ENOMEM;
    }
    size_t len = strlen(json);
    /* len + 1: the terminating NUL tells json-c the input ends (a bare
     * number would otherwise wait for more digits) */
    json_object *root = json_tokener_parse_ex(tok, json, (int)len + 1);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (used > len)
        used = len;
    if (!root && jerr == json_tokener_success) {
        snprintf(err, errlen, "config must be a JSON object, got null");
        return -EINVAL;
    }
    if (!root || jerr != json_tokener_success) {
        snprintf(err, errlen, "config is not valid JSON: %s",
                 json_tokener_error_desc(root ? jerr : (jerr == json_tokener_continue
                                                            ? json_tokener_error_parse_eof
                                                            : jerr)));
        json_object_put(root);
        return -EINVAL;
    }
    while (used < len && isspace((unsigned char)json[used]))
        used++;
    int rc = 0;
    if (used != len) {
        snprintf(err, errlen, "config: unexpected text after the JSON object at byte %zu", used);
        rc = -EINVAL;
        goto out;
    }
    if (!json_object_is_type(root, json_type_object)) {
        snprintf(err, errlen, "config must be a JSON object, got %s", json_type_word(root));
        rc = -EINVAL;
        goto out;
    }
    json_object_object_foreach(root, key, val) {
        void *base;
        const struct umbp_option *o = find_option(t, nt, key, &base);
        if (!o) {
            snprintf(err, errlen, "unknown option '%s' (see docs/configuration.md)", key);
            rc = -EINVAL;
            goto out;
        }
        if ((rc = option_parse_json(o, val, base, err, errlen)) < 0)
            goto out;
    }
out:
    json_object_put(root);
    return rc;
}

static int apply_env(struct table_ref *t, size_t nt, char *err, size_t errlen)
{
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++) {
            char var[96] = "UMBP_";
            for (size_t k = 0; o->name[k] && k + 6 < sizeof(var); k++)
                var[5 + k] = (char)toupper((unsigned char)o->name[k]);
            const char *v = getenv(var);
            if (!v)
                continue;
            char sub[400];
            if (option_parse_text(o, v, t[i].base, sub, sizeof(sub)) < 0) {
                snprintf(err, errlen, "%s (from environment %s)", sub, var);
                return -EINVAL;
            }
        }
    return 0;
}

static int validate_core(struct rt_config *c, char *err, size_t errlen)
{
    struct umbp_core_config *k = &c->core;
    if (k->capacity_bytes && k->total_capacity_bytes) {
        snprintf(err, errlen, "capacity_bytes and total_capacity_bytes are mutually exclusive; set one");
        return -EINVAL;
    }
    if (k->rank >= k->world_size) {
        snprintf(err, errlen, "rank: must be below world_size (%lld), got %lld",
                 (long long)k->world_size, (long long)k->rank);
        return -EINVAL;
    }
    uint64_t cap = k->capacity_bytes;
    if (k->total_capacity_bytes)
        cap = k->total_capacity_bytes / (uint64_t)k->world_size;
    if (!k->capacity_bytes && !k->total_capacity_bytes)
        cap = 1ull << 30;
    if (cap < (1u << 20)) {
        snprintf(err, errlen, "%s: the per-rank capacity must be at least 1MiB, got %llu bytes",
                 k->total_capacity_bytes ? "total_capacity_bytes" : "capacity_bytes",
                 (unsigned long long)cap);
        return -EINVAL;
    }
    c->rank_capacity = cap;
    return 0;
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
    struct table_ref t[32];
    size_t nt = collect_tables(c, t, 32);
    int rc;
    if ((rc = apply_defaults(t, nt, err, sizeof(err))) < 0 ||
        (rc = apply_json(json, t, nt, err, sizeof(err))) < 0 ||
        (rc = apply_env(t, nt, err, sizeof(err))) < 0 ||
        (rc = validate_core(c, err, sizeof(err))) < 0)
        goto fail;
    for (size_t i = 0; i < c->num_tiers; i++) {
        const struct umbp_tier_ops *ops = umbp_tier_registry[i];
        if (ops->validate_config &&
            (rc = ops->validate_config(c->tier_cfg[i], &c->core, err, sizeof(err))) < 0)
            goto fail;
    }
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

const char *const *mode_tiers(const char *mode)
{
    static const char *const embedded[] = {"dram", NULL};
    static const char *const standalone[] = {"shm", NULL};
    static const char *const distributed[] = {"dram", "rdma", NULL};
    if (strcmp(mode, "standalone") == 0)
        return standalone;
    if (strcmp(mode, "distributed") == 0)
        return distributed;
    return embedded;
}
