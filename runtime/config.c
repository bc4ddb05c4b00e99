/*
 * config.c - the runtime's options: the core table and every registered
 * tier's table, parsed together (common/options.c), then checked: the core's
 * cross-option rules, and validate_config of the tiers the mode composes
 * (only those: a tier that is not used does not veto a config).
 *
 * Every option lives in exactly one table: umbp_core_options here, or a
 * tier's ops->options; a name in two tables is refused at creation.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "options.h"
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
    struct umbp_opt_table t[32];
    size_t nt = 0;
    t[nt++] = (struct umbp_opt_table){umbp_core_options, &c->core, "core"};
    for (size_t i = 0; i < c->num_tiers && nt < 32; i++)
        if (umbp_tier_registry[i]->options)
            t[nt++] = (struct umbp_opt_table){umbp_tier_registry[i]->options, c->tier_cfg[i],
                                              umbp_tier_registry[i]->name};
    int rc;
    if ((rc = umbp_options_apply(t, nt, json, err, sizeof(err))) < 0 ||
        (rc = validate_core(c, err, sizeof(err))) < 0 ||
        (rc = config_primary_tier(&c->core, &c->primary, err, sizeof(err))) < 0)
        goto fail;
    const struct umbp_tier_ops *ops = c->primary;
    if (ops->validate_config &&
        (rc = ops->validate_config(config_tier(c, ops), &c->core, err, sizeof(err))) < 0)
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
        char have[256];
        tier_names(have, sizeof(have));
        snprintf(err, errlen, "mode: '%s' needs a tier that this libumbp does not have "
                 "(tiers built in: %s); use mode \"embedded\"", mode, have);
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
