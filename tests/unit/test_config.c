/*
 * test_config.c - every option: its default, values accepted, values refused
 * with a message naming the option (and, for bounds, the accepted range),
 * UMBP_* environment overrides, and size strings.
 *
 * Two levels: config_parse() (runtime/config.h) to read back what an option
 * stored without creating a pool, and umbp_runtime_create() for what a user
 * sees.  Table-driven checks run over every option of the core table and of
 * every registered tier, so a new option is covered (wrong type, bounds,
 * environment) the day it is added; the expected defaults below are the
 * documented ones and must be updated by hand when a default changes.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "test_util.h"
#include "umbp/tier.h"
#include "umbp/umbp.h"
#include "umbp/gpu.h"

#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)
#define TiB (1024ull * GiB)

/* ---- helpers -------------------------------------------------------------------- */

/* All option tables, as config.c sees them. */
struct table {
    const struct umbp_option *opts;
    const struct umbp_tier_ops *tier; /* NULL: core */
};

static size_t all_tables(struct table *t, size_t max)
{
    size_t n = 0;
    t[n++] = (struct table){umbp_core_options, NULL};
    for (size_t i = 0; umbp_tier_registry[i] && n < max; i++)
        if (umbp_tier_registry[i]->options)
            t[n++] = (struct table){umbp_tier_registry[i]->options, umbp_tier_registry[i]};
    return n;
}

/* The option called name and the parsed config struct it lives in. */
static const struct umbp_option *find_opt(struct rt_config *c, const char *name, void **base)
{
    struct table t[32];
    size_t nt = all_tables(t, 32);
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++)
            if (strcmp(o->name, name) == 0) {
                if (base)
                    *base = t[i].tier ? config_tier(c, t[i].tier) : (void *)&c->core;
                return o;
            }
    return NULL;
}

static struct rt_config *parse_ok(const char *json)
{
    struct rt_config *c = NULL;
    int rc = config_parse(json, &c);
    cr_assert_eq(rc, 0, "config_parse(%s) = %d: %s", json ? json : "NULL", rc, umbp_last_error());
    cr_assert_not_null(c);
    return c;
}

/* The stored value of an option, written as text for comparison. */
static void value_text(struct rt_config *c, const char *name, char *out, size_t len)
{
    void *base;
    const struct umbp_option *o = find_opt(c, name, &base);
    cr_assert_not_null(o, "no option %s", name);
    const char *p = (const char *)base + o->offset;
    switch (o->type) {
    case UMBP_OPT_BOOL: snprintf(out, len, "%s", *(const bool *)p ? "true" : "false"); break;
    case UMBP_OPT_INT: snprintf(out, len, "%lld", (long long)*(const int64_t *)p); break;
    case UMBP_OPT_SIZE: snprintf(out, len, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case UMBP_OPT_DOUBLE: snprintf(out, len, "%.17g", *(const double *)p); break;
    case UMBP_OPT_STRING: snprintf(out, len, "%s", p); break;
    }
}

static void expect_value(struct rt_config *c, const char *name, const char *want)
{
    char got[512];
    value_text(c, name, got, sizeof(got));
    void *base;
    const struct umbp_option *o = find_opt(c, name, &base);
    if (o->type == UMBP_OPT_DOUBLE)
        cr_assert_eq(strtod(got, NULL), strtod(want, NULL), "%s = %s, want %s", name, got, want);
    else
        cr_assert_str_eq(got, want, "%s = %s, want %s", name, got, want);
}

/* Expects umbp_runtime_create(json) to fail with a message containing every
 * one of the NULL-terminated words. */
static void expect_refused_v(const char *json, const char *const *words)
{
    umbp_runtime_t *rt = (umbp_runtime_t *)(uintptr_t)0x1;
    int rc = umbp_runtime_create(json, &rt);
    if (rc == 0)
        tu_destroy(rt);
    cr_assert_lt(rc, 0, "accepted: %s", json);
    cr_assert_eq(rt, (umbp_runtime_t *)(uintptr_t)0x1, "*out set on failure: %s", json);
    const char *msg = umbp_last_error();
    cr_assert_not_null(msg);
    for (size_t i = 0; words[i]; i++)
        cr_assert_not_null(strstr(msg, words[i]), "config %s: message '%s' does not name '%s'",
                           json, msg, words[i]);
}

#define expect_refused(json, ...)                                         \
    do {                                                                  \
        const char *const w_[] = {__VA_ARGS__, NULL};                     \
        expect_refused_v(json, w_);                                       \
    } while (0)

static umbp_runtime_t *create_ok(const char *json)
{
    umbp_runtime_t *rt = NULL;
    int rc = umbp_runtime_create(json, &rt);
    cr_assert_eq(rc, 0, "umbp_runtime_create(%s) = %d: %s", json ? json : "NULL", rc,
                 umbp_last_error());
    return rt;
}

static uint64_t capacity_of(const char *json)
{
    umbp_runtime_t *rt = create_ok(json);
    umbp_stats_t s = tu_stats(rt);
    tu_destroy(rt);
    return s.capacity_bytes;
}

/* ---- defaults --------------------------------------------------------------------- */

/* Documented defaults, written independently of the option tables. */
static const struct {
    const char *name, *value;
} documented[] = {
    {"mode", "embedded"},
    {"tier", ""},
    {"rank", "0"},
    {"world_size", "1"},
    {"capacity_bytes", "0"}, /* unset: resolves to 1GiB */
    {"total_capacity_bytes", "0"},
    {"timeout_ms", "10000"},
    {"lookup_timeout_ms", "100"},
    {"put_wait_ms", "1000"},
    {"lease_ttl_ms", "30000"},
    {"load_failure_quarantine_ms", "0"},
    {"max_inflight_ops", "1024"},
    {"copy_threads", "2"},
    {"enable_events", "false"},
    {"event_queue_size", "65536"},
    {"log_level", "warn"},
    {"poll_wait", "auto"},
    {"gpu_backend", "auto"},
    {"gpu_device", "0"},
    {"gpu_max_ctas", "32"},
    {"gpu_threads_per_cta", "128"},
    {"gpu_staging_bytes", "268435456"},
    {"gpu_store_slice_blocks", "256"},
    {"gpu_load_head_blocks", "32"},
    {"gpu_warm_transfers", "16"},
    {"gpu_warm_store", "true"},
    {"gpu_store_method", "auto"},
    {"gpu_restore_method", "auto"},
    {"gpu_l2_discard_staging", "true"},
    {"gpu_evict_first_restore", "true"},
    {"gpu_ramp_overlapped", "false"},
    {"gpu_wait_poll", "true"},
    {"dram_use_shared_memory", "false"},
    {"dram_shm_name", ""},
    {"dram_use_hugepages", "false"},
    {"dram_hugepage_size", "2097152"},
    {"dram_numa_node", "-1"},
    {"dram_prefault", "false"},
    {"dram_high_watermark", "0.9"},
    {"dram_low_watermark", "0.7"},
    {"socket_dir", ""},
    {"lookup_instance", ""},
    {"dp_rank", "0"},
    {"auto_start", "false"},
    {"server_path", "umbp-server"},
    {"startup_timeout_ms", "30000"},
    {"reconnect_max_ms", "2000"},
    {"engine_id", ""},
    {"namespace", ""},
    {"role", "worker"},
    {"reserve_ahead_bytes", "134217728"},
    {"reserve_ahead_hold_ms", "30000"},
    {"loopback_map_one_in", "0"},
    /* the rdma tier (distributed mode), where UCX is */
    {"master_address", ""},
    {"secret_file", ""},
    {"node_host", ""},
    {"heartbeat_ms", "1000"},
    {"cache_remote_fetches", "true"},
    {"remote_cache_max_bytes", "67108864"},
    {"peer_failure_backoff_ms", "3000"},
    {"ucx_serve_timeout_ms", "10000"},
};

/* Options of the rdma tier: absent from a build without UCX. */
static bool rdma_option(const char *name)
{
    static const char *const names[] = {"master_address", "secret_file", "node_host",
                                        "heartbeat_ms", "cache_remote_fetches",
                                        "remote_cache_max_bytes", "peer_failure_backoff_ms",
                                        "ucx_serve_timeout_ms"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(names[i], name) == 0)
            return true;
    return false;
}
#define N_DOCUMENTED (sizeof(documented) / sizeof(documented[0]))

Test(config, documented_defaults)
{
    struct rt_config *c = parse_ok(NULL);
    for (size_t i = 0; i < N_DOCUMENTED; i++) {
        if (!find_opt(c, documented[i].name, NULL)) {
            /* dram options exist only when the dram tier is built in; the
             * gpu_* options arrive with the GPU copy engine */
            if (strncmp(documented[i].name, "gpu_", 4) == 0) {
                cr_log_warn("option %s does not exist (yet)", documented[i].name);
                continue;
            }
            cr_assert((strncmp(documented[i].name, "dram_", 5) == 0 && !umbp_tier_find("dram")) ||
                          (rdma_option(documented[i].name) && !umbp_tier_find("rdma")),
                      "documented option %s does not exist", documented[i].name);
            continue;
        }
        expect_value(c, documented[i].name, documented[i].value);
    }
    cr_assert_eq(c->rank_capacity, 1 * GiB, "default per-rank capacity %llu",
                 (unsigned long long)c->rank_capacity);
    config_free(c);
    /* "" and "{}" mean the same */
    c = parse_ok("");
    cr_assert_eq(c->rank_capacity, 1 * GiB);
    config_free(c);
    c = parse_ok("{}");
    cr_assert_eq(c->core.timeout_ms, 10000);
    config_free(c);
}

Test(config, every_core_option_is_documented_here)
{
    /* a core option added without a documented default fails here */
    for (const struct umbp_option *o = umbp_core_options; o->name; o++) {
        bool found = false;
        for (size_t i = 0; i < N_DOCUMENTED; i++)
            found = found || strcmp(documented[i].name, o->name) == 0;
        cr_assert(found, "core option %s has no expected default in test_config.c", o->name);
        cr_assert_not_null(o->help, "option %s has no help line", o->name);
    }
    struct table t[32];
    size_t nt = all_tables(t, 32);
    for (size_t i = 1; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++) {
            bool found = false;
            for (size_t k = 0; k < N_DOCUMENTED; k++)
                found = found || strcmp(documented[k].name, o->name) == 0;
            if (!found)
                cr_log_warn("tier %s option %s: default not checked by name here",
                            t[i].tier->name, o->name);
            cr_assert_not_null(o->help, "option %s has no help line", o->name);
        }
}

Test(config, defaults_create_a_runtime)
{
    umbp_runtime_t *rt = create_ok(NULL);
    umbp_stats_t s = tu_stats(rt);
    cr_assert_eq(s.capacity_bytes, 1 * GiB);
    tu_destroy(rt);
    rt = create_ok("");
    tu_destroy(rt);
    rt = create_ok("  { }  ");
    tu_destroy(rt);
}

/* ---- valid values are accepted and stored --------------------------------------------- */

static const struct {
    const char *json;
    const char *name, *value;
} accepted[] = {
    {"{\"mode\": \"embedded\"}", "mode", "embedded"},
    {"{\"tier\": \"dram\"}", "tier", "dram"},
    {"{\"rank\": 0}", "rank", "0"},
    {"{\"rank\": 65535, \"world_size\": 65536}", "rank", "65535"},
    {"{\"rank\": 3, \"world_size\": 4}", "rank", "3"},
    {"{\"world_size\": 1}", "world_size", "1"},
    {"{\"world_size\": 65536}", "world_size", "65536"},
    {"{\"capacity_bytes\": 1048576}", "capacity_bytes", "1048576"},
    {"{\"capacity_bytes\": \"1MiB\"}", "capacity_bytes", "1048576"},
    {"{\"capacity_bytes\": \"64TiB\"}", "capacity_bytes", "70368744177664"},
    {"{\"capacity_bytes\": 0}", "capacity_bytes", "0"},
    {"{\"total_capacity_bytes\": \"8MiB\", \"world_size\": 8}", "total_capacity_bytes", "8388608"},
    {"{\"total_capacity_bytes\": \"1024TiB\", \"world_size\": 65536}", "total_capacity_bytes",
     "1125899906842624"},
    {"{\"timeout_ms\": 1}", "timeout_ms", "1"},
    {"{\"timeout_ms\": 3600000}", "timeout_ms", "3600000"},
    {"{\"lookup_timeout_ms\": 1}", "lookup_timeout_ms", "1"},
    {"{\"lookup_timeout_ms\": 60000}", "lookup_timeout_ms", "60000"},
    {"{\"put_wait_ms\": 0}", "put_wait_ms", "0"},
    {"{\"put_wait_ms\": 3600000}", "put_wait_ms", "3600000"},
    {"{\"lease_ttl_ms\": 10}", "lease_ttl_ms", "10"},
    {"{\"lease_ttl_ms\": 3600000}", "lease_ttl_ms", "3600000"},
    {"{\"load_failure_quarantine_ms\": 0}", "load_failure_quarantine_ms", "0"},
    {"{\"load_failure_quarantine_ms\": 3600000}", "load_failure_quarantine_ms", "3600000"},
    {"{\"max_inflight_ops\": 4}", "max_inflight_ops", "4"},
    {"{\"max_inflight_ops\": 1048576}", "max_inflight_ops", "1048576"},
    {"{\"copy_threads\": 1}", "copy_threads", "1"},
    {"{\"copy_threads\": 64}", "copy_threads", "64"},
    {"{\"enable_events\": true}", "enable_events", "true"},
    {"{\"enable_events\": false}", "enable_events", "false"},
    {"{\"event_queue_size\": 16}", "event_queue_size", "16"},
    {"{\"event_queue_size\": 16777216}", "event_queue_size", "16777216"},
    {"{\"log_level\": \"error\"}", "log_level", "error"},
    {"{\"log_level\": \"warn\"}", "log_level", "warn"},
    {"{\"log_level\": \"info\"}", "log_level", "info"},
    {"{\"log_level\": \"debug\"}", "log_level", "debug"},
    {"{\"gpu_backend\": \"auto\"}", "gpu_backend", "auto"},
    {"{\"gpu_backend\": \"cuda\"}", "gpu_backend", "cuda"},
    {"{\"gpu_backend\": \"hip\"}", "gpu_backend", "hip"},
    {"{\"gpu_backend\": \"host\"}", "gpu_backend", "host"},
    {"{\"gpu_device\": 0}", "gpu_device", "0"},
    {"{\"gpu_device\": 1023}", "gpu_device", "1023"},
    {"{\"gpu_max_ctas\": 1}", "gpu_max_ctas", "1"},
    {"{\"gpu_store_method\": \"kernel\"}", "gpu_store_method", "kernel"},
    {"{\"gpu_store_method\": \"dma\"}", "gpu_store_method", "dma"},
    {"{\"gpu_restore_method\": \"kernel\"}", "gpu_restore_method", "kernel"},
    {"{\"gpu_restore_method\": \"staged\"}", "gpu_restore_method", "staged"},
    {"{\"gpu_max_ctas\": 1024}", "gpu_max_ctas", "1024"},
    {"{\"gpu_staging_bytes\": \"1MiB\"}", "gpu_staging_bytes", "1048576"},
    {"{\"gpu_staging_bytes\": \"16GiB\"}", "gpu_staging_bytes", "17179869184"},
    {"{\"gpu_store_slice_blocks\": 0}", "gpu_store_slice_blocks", "0"},
    {"{\"gpu_store_slice_blocks\": 16777216}", "gpu_store_slice_blocks", "16777216"},
    {"{\"dram_use_shared_memory\": true}", "dram_use_shared_memory", "true"},
    {"{\"dram_use_shared_memory\": true, \"dram_shm_name\": \"umbp-x\"}", "dram_shm_name",
     "umbp-x"},
    {"{\"dram_use_hugepages\": true}", "dram_use_hugepages", "true"},
    {"{\"dram_hugepage_size\": \"2MiB\"}", "dram_hugepage_size", "2097152"},
    {"{\"dram_hugepage_size\": \"1GiB\"}", "dram_hugepage_size", "1073741824"},
    {"{\"dram_hugepage_size\": 1073741824}", "dram_hugepage_size", "1073741824"},
    {"{\"dram_numa_node\": -1}", "dram_numa_node", "-1"},
    {"{\"dram_numa_node\": 0}", "dram_numa_node", "0"},
    {"{\"dram_numa_node\": 1023}", "dram_numa_node", "1023"},
    {"{\"dram_prefault\": true}", "dram_prefault", "true"},
    {"{\"dram_high_watermark\": 0.01, \"dram_low_watermark\": 0}", "dram_high_watermark", "0.01"},
    {"{\"dram_high_watermark\": 0.01, \"dram_low_watermark\": 0.0}", "dram_low_watermark", "0"},
    {"{\"dram_high_watermark\": 1, \"dram_low_watermark\": 0.99}", "dram_high_watermark", "1"},
    {"{\"dram_high_watermark\": 1.0, \"dram_low_watermark\": 0.99}", "dram_low_watermark",
     "0.99"},
};

Test(config, valid_values_accepted_and_stored)
{
    for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
        if (strncmp(accepted[i].name, "dram_", 5) == 0 && !umbp_tier_find("dram"))
            continue;
        struct rt_config *probe = parse_ok(NULL);
        bool exists = find_opt(probe, accepted[i].name, NULL) != NULL;
        config_free(probe);
        if (!exists && strncmp(accepted[i].name, "gpu_", 4) == 0)
            continue; /* not built yet */
        struct rt_config *c = parse_ok(accepted[i].json);
        expect_value(c, accepted[i].name, accepted[i].value);
        config_free(c);
    }
}

Test(config, per_rank_capacity_resolution)
{
    struct rt_config *c = parse_ok("{\"total_capacity_bytes\": \"64MiB\", \"world_size\": 4, "
                                   "\"rank\": 3}");
    cr_assert_eq(c->rank_capacity, 16 * MiB);
    config_free(c);
    c = parse_ok("{\"capacity_bytes\": \"3MiB\", \"world_size\": 4}");
    cr_assert_eq(c->rank_capacity, 3 * MiB, "capacity_bytes is per rank, not split");
    config_free(c);
    cr_assert_eq(capacity_of("{\"total_capacity_bytes\": \"64MiB\", \"world_size\": 4}"), 16 * MiB);
    cr_assert_eq(capacity_of("{\"capacity_bytes\": \"4MiB\"}"), 4 * MiB);
}

/* A few values through a real runtime: they must not just parse but work. */
Test(config, dram_options_create_working_runtimes)
{
    if (!umbp_tier_find("dram"))
        cr_skip_test("the dram tier is not built in");
    static const char *const ok[] = {
        "{\"capacity_bytes\": \"4MiB\", \"dram_prefault\": true}",
        "{\"capacity_bytes\": \"4MiB\", \"dram_numa_node\": 0}",
        "{\"capacity_bytes\": \"4MiB\", \"dram_use_shared_memory\": true}",
        /* huge pages fall back to 4 KiB pages with a warning */
        "{\"capacity_bytes\": \"4MiB\", \"dram_use_hugepages\": true, \"log_level\": \"error\"}",
        "{\"capacity_bytes\": \"4MiB\", \"dram_use_hugepages\": true, "
        "\"dram_hugepage_size\": \"1GiB\", \"log_level\": \"error\"}",
        "{\"capacity_bytes\": \"4MiB\", \"dram_high_watermark\": 0.5, "
        "\"dram_low_watermark\": 0.1}",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        umbp_runtime_t *rt = create_ok(ok[i]);
        struct tu_rng r;
        tu_rng_seed(&r, i);
        struct tu_obj o;
        tu_obj_init(&o, &r, tu_key_random(&r), 100000, 3, false);
        tu_put_ok(rt, &o, 1);
        tu_expect_obj(rt, &o);
        tu_obj_free(&o);
        tu_destroy(rt);
    }
}

/* ---- every option: wrong JSON type, out of bounds (table driven) ------------------------ */

Test(config, wrong_json_type_names_the_option)
{
    struct table t[32];
    size_t nt = all_tables(t, 32);
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++) {
            const char *wrong[4];
            size_t nw = 0;
            switch (o->type) {
            case UMBP_OPT_BOOL:
                wrong[nw++] = "1";
                wrong[nw++] = "\"true\"";
                break;
            case UMBP_OPT_INT:
                wrong[nw++] = "\"5\"";
                wrong[nw++] = "1.5";
                wrong[nw++] = "true";
                break;
            case UMBP_OPT_SIZE:
                wrong[nw++] = "true";
                wrong[nw++] = "1.5";
                wrong[nw++] = "-1";
                break;
            case UMBP_OPT_DOUBLE:
                wrong[nw++] = "\"0.5\"";
                wrong[nw++] = "false";
                break;
            case UMBP_OPT_STRING:
                wrong[nw++] = "5";
                wrong[nw++] = "true";
                break;
            }
            wrong[nw++] = "null";
            for (size_t k = 0; k < nw; k++) {
                char json[256];
                snprintf(json, sizeof(json), "{\"%s\": %s}", o->name, wrong[k]);
                expect_refused(json, o->name);
            }
            /* arrays and objects are never an option's value */
            char json[256];
            snprintf(json, sizeof(json), "{\"%s\": [1]}", o->name);
            expect_refused(json, o->name);
            snprintf(json, sizeof(json), "{\"%s\": {}}", o->name);
            expect_refused(json, o->name);
        }
}

/* A NUL inside a JSON string cut the value short without a word
 * ("/run/umbp\u0000/../x" became "/run/umbp"). */
Test(config, a_nul_inside_a_string_is_refused)
{
    expect_refused("{\"tier\": \"dram\\u0000/../x\"}", "tier", "NUL");
    expect_refused("{\"capacity_bytes\": \"8MiB\\u0000x\"}", "capacity_bytes");
}

Test(config, out_of_bounds_names_the_option_and_range)
{
    struct table t[32];
    size_t nt = all_tables(t, 32);
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++) {
            char json[256];
            switch (o->type) {
            case UMBP_OPT_INT: {
                char lo[32], hi[32];
                snprintf(lo, sizeof(lo), "%lld", (long long)o->min);
                snprintf(hi, sizeof(hi), "%lld", (long long)o->max);
                snprintf(json, sizeof(json), "{\"%s\": %lld}", o->name, (long long)o->min - 1);
                expect_refused(json, o->name, lo, hi);
                snprintf(json, sizeof(json), "{\"%s\": %lld}", o->name, (long long)o->max + 1);
                expect_refused(json, o->name, lo, hi);
                snprintf(json, sizeof(json), "{\"%s\": 99999999999999999999}", o->name);
                expect_refused(json, o->name);
                snprintf(json, sizeof(json), "{\"%s\": -9223372036854775808}", o->name);
                expect_refused(json, o->name);
                break;
            }
            case UMBP_OPT_SIZE: {
                char lo[32], hi[32];
                snprintf(lo, sizeof(lo), "%llu", (unsigned long long)o->min);
                snprintf(hi, sizeof(hi), "%llu", (unsigned long long)o->max);
                if (o->min > 0) {
                    snprintf(json, sizeof(json), "{\"%s\": %llu}", o->name,
                             (unsigned long long)o->min - 1);
                    expect_refused(json, o->name, lo, hi);
                }
                snprintf(json, sizeof(json), "{\"%s\": %llu}", o->name,
                         (unsigned long long)o->max + 1);
                expect_refused(json, o->name, lo, hi);
                snprintf(json, sizeof(json), "{\"%s\": \"%lluKiB\"}", o->name,
                         (unsigned long long)o->max / 1024 + 1);
                expect_refused(json, o->name, lo, hi);
                break;
            }
            case UMBP_OPT_DOUBLE: {
                double below = o->min - fmax(1e-6, fabs(o->min) * 1e-6);
                double above = o->max + fmax(1e-6, fabs(o->max) * 1e-6);
                snprintf(json, sizeof(json), "{\"%s\": %.17g}", o->name, below);
                expect_refused(json, o->name, "between");
                snprintf(json, sizeof(json), "{\"%s\": %.17g}", o->name, above);
                expect_refused(json, o->name, "between");
                snprintf(json, sizeof(json), "{\"%s\": NaN}", o->name);
                expect_refused(json, o->name);
                snprintf(json, sizeof(json), "{\"%s\": Infinity}", o->name);
                expect_refused(json, o->name);
                break;
            }
            case UMBP_OPT_STRING: {
                char *long_s = malloc(o->str_cap + 1);
                memset(long_s, 'a', o->str_cap);
                long_s[o->str_cap] = '\0';
                char *j = malloc(o->str_cap + 64);
                sprintf(j, "{\"%s\": \"%s\"}", o->name, long_s);
                expect_refused(j, o->name);
                free(j);
                free(long_s);
                if (o->choices) {
                    snprintf(json, sizeof(json), "{\"%s\": \"nosuch\"}", o->name);
                    expect_refused(json, o->name, o->choices[0]);
                    snprintf(json, sizeof(json), "{\"%s\": \"\"}", o->name);
                    expect_refused(json, o->name);
                    /* choices are case-sensitive */
                    char up[64];
                    snprintf(up, sizeof(up), "%s", o->choices[0]);
                    up[0] = (char)(up[0] - 32);
                    snprintf(json, sizeof(json), "{\"%s\": \"%s\"}", o->name, up);
                    expect_refused(json, o->name);
                }
                break;
            }
            case UMBP_OPT_BOOL:
                break;
            }
        }
}

Test(config, every_default_passes_through_the_environment)
{
    /* the environment form of every default is accepted */
    struct table t[32];
    size_t nt = all_tables(t, 32);
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++) {
            char var[128] = "UMBP_";
            for (size_t k = 0; o->name[k]; k++)
                var[5 + k] = (char)(o->name[k] >= 'a' && o->name[k] <= 'z' ? o->name[k] - 32
                                                                            : o->name[k]);
            setenv(var, o->def, 1);
            struct rt_config *c = NULL;
            int rc = config_parse("{\"capacity_bytes\": \"4MiB\"}", &c);
            cr_assert_eq(rc, 0, "%s=%s refused: %s", var, o->def, umbp_last_error());
            config_free(c);
            unsetenv(var);
        }
}

Test(config, bad_environment_value_names_the_variable)
{
    struct table t[32];
    size_t nt = all_tables(t, 32);
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++) {
            char var[128] = "UMBP_";
            for (size_t k = 0; o->name[k]; k++)
                var[5 + k] = (char)(o->name[k] >= 'a' && o->name[k] <= 'z' ? o->name[k] - 32
                                                                            : o->name[k]);
            const char *bad = o->type == UMBP_OPT_BOOL     ? "maybe"
                              : o->type == UMBP_OPT_STRING ? NULL
                              : o->type == UMBP_OPT_DOUBLE ? "0.5x"
                                                           : "12abc";
            if (o->type == UMBP_OPT_STRING && !o->choices)
                continue;
            if (o->type == UMBP_OPT_STRING)
                bad = "nosuch";
            setenv(var, bad, 1);
            expect_refused("{\"capacity_bytes\": \"4MiB\"}", var, o->name);
            setenv(var, "", 1);
            expect_refused("{\"capacity_bytes\": \"4MiB\"}", var, o->name);
            unsetenv(var);
        }
}

/* ---- refusals by name ------------------------------------------------------------------ */

Test(config, unknown_option_refused)
{
    expect_refused("{\"capacity\": 1048576}", "capacity", "unknown");
    expect_refused("{\"Capacity_Bytes\": 1048576}", "Capacity_Bytes");
    expect_refused("{\"capacity_bytes\": \"4MiB\", \"dram_watermark\": 0.5}", "dram_watermark");
    expect_refused("{\"\": 1}", "unknown");
    expect_refused("{\"nested\": {\"capacity_bytes\": 1}}", "nested");
}

/* A typo names the option it is closest to; a name far from every option
 * gets no guess. */
Test(config, unknown_option_names_the_closest)
{
    expect_refused("{\"capcity_bytes\": 1048576}", "unknown option 'capcity_bytes'",
                   "did you mean 'capacity_bytes'?");
    expect_refused("{\"gpu_warm_transfer\": 1}", "did you mean 'gpu_warm_transfers'?");
    expect_refused("{\"zzzz\": 1}", "unknown option 'zzzz' (see docs/configuration.md)");
}

/* An option of a tier the runtime does not use is refused from the JSON,
 * naming its tier (it would be parsed, then ignored); from the environment,
 * which a server and its clients may share, it is not. */
Test(config, another_tiers_option_is_refused_naming_the_tier)
{
    if (!umbp_tier_find("shm") || !umbp_tier_find("dram"))
        cr_skip_test("needs the dram and shm tiers");
    expect_refused("{\"socket_dir\": \"/tmp\"}", "socket_dir", "the 'shm' tier",
                   "mode 'embedded' does not use", "runs on the 'dram' tier");
    expect_refused("{\"mode\": \"standalone\", \"dram_shm_name\": \"x\"}", "dram_shm_name",
                   "the 'dram' tier", "mode 'standalone'", "umbp-server's config");
    setenv("UMBP_SOCKET_DIR", "/tmp", 1);
    struct rt_config *c = parse_ok("{\"capacity_bytes\": \"4MiB\"}");
    config_free(c);
    unsetenv("UMBP_SOCKET_DIR");
    /* the tier a config names explicitly (tier) is the one it uses */
    c = parse_ok("{\"tier\": \"shm\", \"socket_dir\": \"/tmp\"}");
    config_free(c);
}

/* umbp_option_lookup: what a connector asks instead of keeping lists. */
Test(config, option_lookup_answers_per_mode)
{
    cr_assert_eq(umbp_option_lookup("capacity_bytes", "embedded"), 0);
    cr_assert_eq(umbp_option_lookup("capacity_bytes", "standalone"), 0);
    cr_assert_eq(umbp_option_lookup("dram_shm_name", "embedded"), 0);
    cr_assert_eq(umbp_option_lookup("socket_dir", "standalone"), 0);
    cr_assert_eq(umbp_option_lookup("socket_dir", "embedded"), -EINVAL);
    cr_assert_not_null(strstr(umbp_last_error(), "the 'shm' tier"), "%s", umbp_last_error());
    cr_assert_eq(umbp_option_lookup("dram_shm_name", "standalone"), -EINVAL);
    cr_assert_not_null(strstr(umbp_last_error(), "the 'dram' tier"), "%s", umbp_last_error());
    cr_assert_eq(umbp_option_lookup("capcity_bytes", "embedded"), -ENOENT);
    cr_assert_not_null(strstr(umbp_last_error(), "did you mean 'capacity_bytes'?"), "%s",
                       umbp_last_error());
    cr_assert_eq(umbp_option_lookup("capacity_bytes", "bogus"), -EINVAL);
    cr_assert_not_null(strstr(umbp_last_error(), "bogus"), "%s", umbp_last_error());
    cr_assert_eq(umbp_option_lookup(NULL, "embedded"), -EINVAL);
    cr_assert_eq(umbp_option_lookup("capacity_bytes", NULL), -EINVAL);
}

Test(config, malformed_json_refused)
{
    static const char *const bad[] = {
        "{",
        "}",
        "{\"capacity_bytes\": }",
        "{\"capacity_bytes\" 1048576}",
        "{capacity_bytes: 1048576}",
        "{\"capacity_bytes\": \"4MiB\"",
        "not json",
        "{\"a\": \"unterminated}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_refused(bad[i], "JSON");
}

/* json-c stops at the end of the first value and ignores what follows; a
 * config with trailing garbage must still be refused, or a typo such as a
 * stray brace silently drops the options after it. */
Test(config, trailing_garbage_refused)
{
    /* BUG (runtime/config.c apply_json): json_tokener_parse_verbose() ignores
     * everything after the first complete value, so these are accepted. */
    expect_refused("{\"capacity_bytes\": \"4MiB\"} garbage", "JSON");
    expect_refused("{\"capacity_bytes\": \"4MiB\"}, {\"timeout_ms\": 5}", "JSON");
    expect_refused("{}}", "JSON");
}

Test(config, non_object_json_refused)
{
    static const char *const bad[] = {"[]", "[{\"capacity_bytes\": 1}]", "42", "\"4MiB\"", "true",
                                      "null"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        umbp_runtime_t *rt = NULL;
        int rc = umbp_runtime_create(bad[i], &rt);
        if (rc == 0)
            tu_destroy(rt);
        cr_assert_lt(rc, 0, "accepted %s", bad[i]);
        cr_assert_neq(umbp_last_error()[0], '\0', "no message for %s", bad[i]);
        if (strcmp(bad[i], "null") != 0) /* json-c parses null as "no object" */
            cr_assert_not_null(strstr(umbp_last_error(), "object"), "%s: '%s'", bad[i],
                               umbp_last_error());
    }
}

Test(config, capacity_options_mutually_exclusive)
{
    expect_refused("{\"capacity_bytes\": \"4MiB\", \"total_capacity_bytes\": \"8MiB\"}",
                   "capacity_bytes", "total_capacity_bytes");
}

Test(config, rank_must_be_below_world_size)
{
    expect_refused("{\"rank\": 1}", "rank", "world_size");
    expect_refused("{\"rank\": 4, \"world_size\": 4}", "rank", "world_size");
    expect_refused("{\"rank\": 65535, \"world_size\": 100}", "rank");
    struct rt_config *c = parse_ok("{\"rank\": 3, \"world_size\": 4}");
    config_free(c);
}

Test(config, gpu_threads_per_cta_is_whole_warps)
{
    expect_refused("{\"gpu_threads_per_cta\": 100}", "gpu_threads_per_cta", "multiple of 32");
    expect_refused("{\"gpu_threads_per_cta\": 33}", "gpu_threads_per_cta");
    expect_refused("{\"gpu_threads_per_cta\": 544}", "gpu_threads_per_cta");
    expect_refused("{\"gpu_threads_per_cta\": 16}", "gpu_threads_per_cta");
    static const char *const ok[] = {"{\"gpu_threads_per_cta\": 32}",
                                     "{\"gpu_threads_per_cta\": 512}",
                                     "{\"gpu_threads_per_cta\": 96}"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        config_free(parse_ok(ok[i]));
}

Test(config, per_rank_capacity_at_least_1MiB)
{
    expect_refused("{\"capacity_bytes\": 1048575}", "capacity_bytes", "1MiB");
    expect_refused("{\"capacity_bytes\": \"64KiB\"}", "capacity_bytes");
    expect_refused("{\"capacity_bytes\": 1}", "capacity_bytes");
    expect_refused("{\"total_capacity_bytes\": \"4MiB\", \"world_size\": 8}",
                   "total_capacity_bytes");
    expect_refused("{\"total_capacity_bytes\": 1048575}", "total_capacity_bytes");
    struct rt_config *c = parse_ok("{\"total_capacity_bytes\": \"8MiB\", \"world_size\": 8}");
    cr_assert_eq(c->rank_capacity, 1 * MiB);
    config_free(c);
}

Test(config, size_strings)
{
    static const struct {
        const char *s;
        uint64_t v;
    } good[] = {
        {"0", 0},
        {"4096", 4096},
        {"64KiB", 64 * 1024},
        {"64kib", 64 * 1024},
        {"64K", 64 * 1024},
        {"64k", 64 * 1024},
        {"64KB", 64 * 1024},
        {"2MiB", 2 * MiB},
        {"2M", 2 * MiB},
        {"2mb", 2 * MiB},
        {"1GiB", 1 * GiB},
        {"4G", 4 * GiB},
        {"4g", 4 * GiB},
        {"4GB", 4 * GiB},
        {"1TiB", 1 * TiB},
        {"2T", 2 * TiB},
        {"512B", 512},
        {"512b", 512},
        {" 8MiB ", 8 * MiB},
        {"8 MiB", 8 * MiB},
        {"16383GiB", 16383 * GiB},
        {"18446744073709551615", UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        uint64_t v = 12345;
        int rc = parse_size(good[i].s, &v);
        cr_assert_eq(rc, 0, "parse_size(\"%s\") = %d", good[i].s, rc);
        cr_assert_eq(v, good[i].v, "parse_size(\"%s\") = %llu, want %llu", good[i].s,
                     (unsigned long long)v, (unsigned long long)good[i].v);
    }
    static const char *const bad[] = {
        "",       " ",        "abc",    "-1",     "+5",         "1.5GiB",  "4X",
        "GiB",    "4 G B",    "4GiBs",  "0x100",  "4 GiB x",    "1e6",     "4Gi",
        "4iB",    "18446744073709551616", "17179869184GiB",     "16777216TiB", "4\tG\n5",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 12345;
        int rc = parse_size(bad[i], &v);
        cr_assert_lt(rc, 0, "parse_size(\"%s\") accepted (%llu)", bad[i], (unsigned long long)v);
        cr_assert_eq(v, 12345, "parse_size(\"%s\") wrote its output on failure", bad[i]);
        char json[128];
        snprintf(json, sizeof(json), "{\"capacity_bytes\": \"%s\"}", bad[i]);
        expect_refused(json, "capacity_bytes");
    }
    /* through a real option */
    struct rt_config *c = parse_ok("{\"capacity_bytes\": \"4G\"}");
    cr_assert_eq(c->core.capacity_bytes, 4 * GiB);
    config_free(c);
    c = parse_ok("{\"capacity_bytes\": \"2MiB\"}");
    cr_assert_eq(c->rank_capacity, 2 * MiB);
    config_free(c);
    /* 64KiB parses but is below the 1MiB minimum: the message says so */
    expect_refused("{\"capacity_bytes\": \"64KiB\"}", "capacity_bytes", "1MiB");
}

Test(config, mode_and_tier_names)
{
    expect_refused("{\"mode\": \"bogus\"}", "mode", "embedded", "standalone", "distributed");
    /* a mode no built-in tier declares (ops->modes) is refused, naming the
     * mode, the tier it needs and the modes there are */
    static const char *const modes[] = {"standalone", "distributed"};
    for (size_t m = 0; m < 2; m++) {
        bool declared = false;
        for (size_t k = 0; umbp_tier_registry[k]; k++)
            for (const char *const *d = umbp_tier_registry[k]->modes; d && *d; d++)
                declared = declared || strcmp(*d, modes[m]) == 0;
        char json[64], need[64];
        snprintf(json, sizeof(json), "{\"mode\": \"%s\"}", modes[m]);
        snprintf(need, sizeof(need), "needs the '%s' tier", umbp_mode_tier(modes[m]));
        if (!declared)
            expect_refused(json, "mode", modes[m], need, "built modes", "embedded");
    }
    expect_refused("{\"tier\": \"nosuch\"}", "tier", "nosuch");
    expect_refused("{\"tier\": \"DRAM\"}", "tier", "DRAM");
    /* the message lists the tiers that exist */
    expect_refused("{\"tier\": \"nosuch\"}", umbp_tier_registry[0] ? umbp_tier_registry[0]->name
                                                                   : "tier");
    for (size_t i = 0; umbp_tier_registry[i]; i++) {
        char json[128];
        /* the rdma tier needs its master's address */
        snprintf(json, sizeof(json), "{\"tier\": \"%s\", \"capacity_bytes\": \"4MiB\"%s}",
                 umbp_tier_registry[i]->name,
                 strcmp(umbp_tier_registry[i]->name, "rdma") == 0
                     ? ", \"master_address\": \"127.0.0.1:7390\"" : "");
        struct rt_config *c = parse_ok(json);
        config_free(c);
    }
    expect_refused("{\"log_level\": \"verbose\"}", "log_level", "debug");
    expect_refused("{\"gpu_restore_method\": \"fast\"}", "gpu_restore_method", "staged");
}

/* The regression of issue 14: refusing "distributed" named only the tiers
 * that are built, not the one that is missing. */
Test(config, distributed_names_the_missing_rdma_tier)
{
    if (umbp_tier_find("rdma"))
        cr_skip_test("this build has the rdma tier");
    expect_refused("{\"mode\": \"distributed\"}", "mode", "distributed", "'rdma' tier",
                   "does not have", "built modes: embedded");
    const char *msg = umbp_last_error();
    cr_assert_eq(strstr(msg, "standalone") != NULL, umbp_tier_find("shm") != NULL,
                 "built modes list standalone exactly when shm is built: %s", msg);
}

/* Distributed mode's options: the master's address is required and
 * checked, a send's bound must end before its lease, and failed loads are
 * quarantined 30 s unless the user says otherwise. */
Test(config, distributed_options)
{
    if (!umbp_tier_find("rdma"))
        cr_skip_test("this build has no rdma tier (no UCX)");
    expect_refused("{\"mode\": \"distributed\"}", "master_address", "umbp-master");
    expect_refused("{\"mode\": \"distributed\", \"master_address\": \"nohost\"}",
                   "master_address", "nohost");
    expect_refused("{\"mode\": \"distributed\", \"master_address\": \"127.0.0.1:0\"}",
                   "master_address", "port 0");
    expect_refused("{\"mode\": \"distributed\", \"master_address\": \"127.0.0.1:7390\", "
                   "\"heartbeat_ms\": 5}", "heartbeat_ms");
    /* the lease store's URL: checked, and off-host only with a secret */
    expect_refused("{\"mode\": \"distributed\", \"master_address\": \"redis://h:1\"}",
                   "master_address", "cluster");
    expect_refused("{\"mode\": \"distributed\", \"master_address\": "
                   "\"redis://10.0.0.9:6379/prod\"}", "master_address", "secret_file");
#ifdef UMBP_HAVE_HIREDIS
    config_free(parse_ok("{\"mode\": \"distributed\", \"master_address\": "
                         "\"redis://127.0.0.1:6379/prod\"}"));
#endif
    /* another tier's option is refused; the dram slice's are the mode's */
    expect_refused("{\"mode\": \"distributed\", \"master_address\": \"127.0.0.1:7390\", "
                   "\"socket_dir\": \"/tmp\"}", "socket_dir", "distributed");
    struct rt_config *c = parse_ok("{\"mode\": \"distributed\", \"master_address\": "
                                   "\"127.0.0.1:7390\", \"dram_high_watermark\": 0.8}");
    cr_assert_eq(c->core.load_failure_quarantine_ms, 30000);
    config_free(c);
    c = parse_ok("{\"mode\": \"distributed\", \"master_address\": \"127.0.0.1:7390\", "
                 "\"load_failure_quarantine_ms\": 0}");
    cr_assert_eq(c->core.load_failure_quarantine_ms, 0);
    config_free(c);
    c = parse_ok("{\"mode\": \"embedded\"}");
    cr_assert_eq(c->core.load_failure_quarantine_ms, 0);
    config_free(c);
    cr_assert_eq(umbp_mode_flags("distributed"),
                 (int)(UMBP_MODE_SHARED_POOL | UMBP_MODE_SHARED_LOOKUP));
}

/* The mode table (common/options.h) agrees with what the built tiers
 * declare, so the tier it names for a missing mode is the right one. */
Test(config, mode_table_matches_the_tiers)
{
    for (size_t k = 0; umbp_tier_registry[k]; k++)
        for (const char *const *m = umbp_tier_registry[k]->modes; m && *m; m++) {
            const char *t = umbp_mode_tier(*m);
            cr_assert_not_null(t, "tier %s declares mode %s, which the mode table lacks",
                               umbp_tier_registry[k]->name, *m);
            cr_assert_str_eq(t, umbp_tier_registry[k]->name, "mode %s", *m);
        }
    cr_assert_null(umbp_mode_tier("bogus"));
}

/* umbp_mode_flags reads the mode table's row: connectors branch on these. */
Test(config, mode_flags_come_from_the_mode_table)
{
    if (umbp_tier_find("dram"))
        cr_assert_eq(umbp_mode_flags("embedded"), 0);
    if (umbp_tier_find("shm"))
        cr_assert_eq(umbp_mode_flags("standalone"),
                     (int)(UMBP_MODE_SHARED_POOL | UMBP_MODE_SESSIONS | UMBP_MODE_SHARED_LOOKUP));
    cr_assert_eq(umbp_mode_flags("bogus"), -EINVAL);
    const char *msg = umbp_last_error();
    cr_assert(strstr(msg, "mode") && strstr(msg, "bogus") && strstr(msg, "embedded") &&
              strstr(msg, "distributed"), "%s", msg);
    cr_assert_eq(umbp_mode_flags(NULL), -EINVAL);
    if (!umbp_tier_find("rdma")) {
        cr_assert_eq(umbp_mode_flags("distributed"), -ENOTSUP);
        cr_assert(strstr(umbp_last_error(), "'rdma' tier"), "%s", umbp_last_error());
    }
}

/* umbp_config_check refuses what umbp_runtime_create refuses, with the same
 * message, and creates nothing. */
Test(config, config_check_is_the_runtime_parse)
{
    static const char *const bad[] = {
        "{\"copy_threads\": 0}", "{\"copy_threads\": \"two\"}", "{\"no_such\": 1}",
        "{\"capacity_bytes\": \"4MiB\", \"total_capacity_bytes\": \"8MiB\"}",
        "{\"mode\": \"bogus\"}", "{\"rank\": 2, \"world_size\": 2}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_lt(umbp_config_check(bad[i], NULL, 0), 0, "%s", bad[i]);
        char want[512];
        snprintf(want, sizeof(want), "%s", umbp_last_error());
        umbp_runtime_t *rt = NULL;
        cr_assert_lt(umbp_runtime_create(bad[i], &rt), 0, "%s", bad[i]);
        cr_assert_str_eq(umbp_last_error(), want, "%s", bad[i]);
    }
    char out[8192];
    cr_assert_eq(umbp_config_check("{\"copy_threads\": 4, \"capacity_bytes\": \"4MiB\"}", out,
                                   sizeof(out)), 0, "%s", umbp_last_error());
    /* the resolved values: given, and defaults */
    cr_assert(strstr(out, "\"copy_threads\":4"), "%s", out);
    cr_assert(strstr(out, "\"capacity_bytes\":4194304"), "%s", out);
    cr_assert(strstr(out, "\"timeout_ms\":10000"), "%s", out);
    cr_assert(strstr(out, "\"mode\":\"embedded\""), "%s", out);
    cr_assert_eq(umbp_config_check(NULL, out, 16), -ENOSPC);
    cr_assert(strstr(umbp_last_error(), "bytes"), "%s", umbp_last_error());
    cr_assert_eq(umbp_config_check(NULL, NULL, 0), 0, "%s", umbp_last_error());
}

/* ---- dram options ------------------------------------------------------------------------ */

Test(config, dram_option_checks)
{
    if (!umbp_tier_find("dram"))
        cr_skip_test("the dram tier is not built in");
    expect_refused("{\"dram_hugepage_size\": \"4MiB\"}", "dram_hugepage_size", "2MiB", "1GiB");
    expect_refused("{\"dram_hugepage_size\": \"3MiB\"}", "dram_hugepage_size");
    expect_refused("{\"dram_hugepage_size\": \"1MiB\"}", "dram_hugepage_size");
    expect_refused("{\"dram_hugepage_size\": \"2GiB\"}", "dram_hugepage_size");
    expect_refused("{\"dram_hugepage_size\": 4096}", "dram_hugepage_size");
    expect_refused("{\"dram_low_watermark\": 0.9, \"dram_high_watermark\": 0.9}",
                   "dram_low_watermark", "dram_high_watermark");
    expect_refused("{\"dram_low_watermark\": 0.95, \"dram_high_watermark\": 0.9}",
                   "dram_low_watermark", "dram_high_watermark");
    expect_refused("{\"dram_high_watermark\": 0.5}", "dram_low_watermark", "dram_high_watermark");
    expect_refused("{\"dram_high_watermark\": 0}", "dram_high_watermark");
    expect_refused("{\"dram_high_watermark\": 1.5}", "dram_high_watermark");
    expect_refused("{\"dram_low_watermark\": -0.1}", "dram_low_watermark");
    expect_refused("{\"dram_low_watermark\": 1}", "dram_low_watermark");
    expect_refused("{\"capacity_bytes\": \"4MiB\", \"dram_numa_node\": 1000}", "dram_numa_node");
    expect_refused("{\"dram_numa_node\": 1024}", "dram_numa_node");
    expect_refused("{\"dram_numa_node\": -2}", "dram_numa_node");
    expect_refused("{\"dram_shm_name\": \"umbp-x\"}", "dram_shm_name", "dram_use_shared_memory");
    expect_refused("{\"dram_use_shared_memory\": true, \"dram_shm_name\": \"a/b\"}",
                   "dram_shm_name");
    expect_refused("{\"dram_use_shared_memory\": true, \"dram_shm_name\": \"..\"}",
                   "dram_shm_name");
    expect_refused("{\"dram_use_shared_memory\": true, \"dram_shm_name\": \"/abs\"}",
                   "dram_shm_name");
}

Test(config, dram_shm_name_taken_refused)
{
    if (!umbp_tier_find("dram"))
        cr_skip_test("the dram tier is not built in");
    char json[256];
    snprintf(json, sizeof(json),
             "{\"capacity_bytes\": \"4MiB\", \"dram_use_shared_memory\": true, "
             "\"dram_shm_name\": \"umbp-cfgtest-%d\"}",
             (int)getpid());
    umbp_runtime_t *rt = create_ok(json);
    /* a second runtime on the same name is refused, naming the option */
    expect_refused(json, "dram_shm_name");
    /* and did not take the first one's file away */
    struct tu_rng r;
    tu_rng_seed(&r, 7);
    struct tu_obj o;
    tu_obj_init(&o, &r, tu_key_random(&r), 5000, 1, false);
    tu_put_ok(rt, &o, 1);
    tu_expect_obj(rt, &o);
    tu_obj_free(&o);
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm/umbp-cfgtest-%d", (int)getpid());
    cr_assert_eq(access(path, F_OK), 0, "the first runtime's shm file disappeared");
    tu_destroy(rt);
    cr_assert_neq(access(path, F_OK), 0, "destroy left %s behind", path);
    /* the name is free again */
    rt = create_ok(json);
    tu_destroy(rt);
}

/* ---- environment overrides ---------------------------------------------------------------- */

Test(config, environment_wins_over_json)
{
    setenv("UMBP_CAPACITY_BYTES", "8MiB", 1);
    cr_assert_eq(capacity_of("{\"capacity_bytes\": \"4MiB\"}"), 8 * MiB);
    cr_assert_eq(capacity_of(NULL), 8 * MiB);
    unsetenv("UMBP_CAPACITY_BYTES");
    cr_assert_eq(capacity_of("{\"capacity_bytes\": \"4MiB\"}"), 4 * MiB);

    setenv("UMBP_TIMEOUT_MS", "1234", 1);
    setenv("UMBP_ENABLE_EVENTS", "yes", 1);
    setenv("UMBP_LOG_LEVEL", "error", 1);
    struct rt_config *c = parse_ok("{\"timeout_ms\": 5, \"enable_events\": false}");
    cr_assert_eq(c->core.timeout_ms, 1234);
    cr_assert(c->core.enable_events);
    cr_assert_str_eq(c->core.log_level, "error");
    config_free(c);
    static const char *const yes[] = {"1", "true", "TRUE", "on", "Yes"};
    static const char *const no[] = {"0", "false", "off", "NO"};
    for (size_t i = 0; i < 5; i++) {
        setenv("UMBP_ENABLE_EVENTS", yes[i], 1);
        c = parse_ok(NULL);
        cr_assert(c->core.enable_events, "UMBP_ENABLE_EVENTS=%s", yes[i]);
        config_free(c);
    }
    for (size_t i = 0; i < 4; i++) {
        setenv("UMBP_ENABLE_EVENTS", no[i], 1);
        c = parse_ok("{\"enable_events\": true}");
        cr_assert(!c->core.enable_events, "UMBP_ENABLE_EVENTS=%s", no[i]);
        config_free(c);
    }
    unsetenv("UMBP_TIMEOUT_MS");
    unsetenv("UMBP_ENABLE_EVENTS");
    unsetenv("UMBP_LOG_LEVEL");

    if (umbp_tier_find("dram")) {
        setenv("UMBP_DRAM_HIGH_WATERMARK", "0.6", 1);
        setenv("UMBP_DRAM_LOW_WATERMARK", "0.2", 1);
        c = parse_ok("{\"dram_high_watermark\": 0.95}");
        expect_value(c, "dram_high_watermark", "0.6");
        expect_value(c, "dram_low_watermark", "0.2");
        config_free(c);
        setenv("UMBP_DRAM_HIGH_WATERMARK", "nan", 1);
        expect_refused(NULL, "UMBP_DRAM_HIGH_WATERMARK", "dram_high_watermark");
        unsetenv("UMBP_DRAM_HIGH_WATERMARK");
        unsetenv("UMBP_DRAM_LOW_WATERMARK");
    }
    /* cross-option checks see the environment's values */
    setenv("UMBP_TOTAL_CAPACITY_BYTES", "8MiB", 1);
    expect_refused("{\"capacity_bytes\": \"4MiB\"}", "capacity_bytes", "total_capacity_bytes");
    unsetenv("UMBP_TOTAL_CAPACITY_BYTES");
    setenv("UMBP_WORLD_SIZE", "2", 1);
    expect_refused("{\"rank\": 2}", "rank");
    unsetenv("UMBP_WORLD_SIZE");
}

Test(config, bad_environment_values)
{
    setenv("UMBP_CAPACITY_BYTES", "lots", 1);
    expect_refused("{\"capacity_bytes\": \"4MiB\"}", "UMBP_CAPACITY_BYTES", "capacity_bytes");
    setenv("UMBP_CAPACITY_BYTES", "100TiB", 1);
    expect_refused(NULL, "UMBP_CAPACITY_BYTES", "capacity_bytes");
    unsetenv("UMBP_CAPACITY_BYTES");
    setenv("UMBP_TIMEOUT_MS", "0", 1);
    expect_refused(NULL, "UMBP_TIMEOUT_MS", "timeout_ms");
    setenv("UMBP_TIMEOUT_MS", "10 ms", 1);
    expect_refused(NULL, "UMBP_TIMEOUT_MS", "timeout_ms");
    unsetenv("UMBP_TIMEOUT_MS");
    setenv("UMBP_MODE", "Embedded", 1);
    expect_refused(NULL, "UMBP_MODE", "mode");
    unsetenv("UMBP_MODE");
    setenv("UMBP_ENABLE_EVENTS", "2", 1);
    expect_refused(NULL, "UMBP_ENABLE_EVENTS", "enable_events");
    unsetenv("UMBP_ENABLE_EVENTS");
    /* after the environment is fixed, creation works again */
    umbp_runtime_t *rt = create_ok("{\"capacity_bytes\": \"4MiB\"}");
    tu_destroy(rt);
}

/* ---- messages --------------------------------------------------------------------------- */

Test(config, last_error_is_per_thread_and_never_null)
{
    cr_assert_not_null(umbp_last_error());
    expect_refused("{\"timeout_ms\": 0}", "timeout_ms");
    /* a success does not invent a message; the old one may stay */
    umbp_runtime_t *rt = create_ok("{\"capacity_bytes\": \"4MiB\"}");
    tu_destroy(rt);
    cr_assert_not_null(umbp_last_error());
}

static void *other_thread(void *arg)
{
    const char **out = arg;
    *out = umbp_last_error();
    return NULL;
}

Test(config, last_error_of_another_thread_is_empty)
{
    expect_refused("{\"timeout_ms\": 0}", "timeout_ms");
    const char *msg = NULL;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, other_thread, &msg), 0);
    pthread_join(t, NULL);
    cr_assert_not_null(msg);
    cr_assert_str_eq(msg, "", "another thread sees this thread's error");
}

/* Two tables declaring one name would make the second unreachable: refused. */
Test(config, duplicate_option_names_refused)
{
    struct a { int64_t x; } va;
    struct b { int64_t y; } vb;
    static const struct umbp_option ta[] = {
        {"same_name", UMBP_OPT_INT, offsetof(struct a, x), "1", 0, 10, 0, NULL, "a"}, {NULL}};
    static const struct umbp_option tb[] = {
        {"same_name", UMBP_OPT_INT, offsetof(struct b, y), "2", 0, 10, 0, NULL, "b"}, {NULL}};
    struct umbp_opt_table t[] = {{ta, &va, "tier_a"}, {tb, &vb, "tier_b"}};
    char err[256] = "";
    cr_assert_eq(umbp_options_apply(t, 2, "{}", err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "same_name") && strstr(err, "tier_a") && strstr(err, "tier_b"), "%s",
              err);
    cr_assert_eq(umbp_options_apply(t, 1, "{\"same_name\": 3}", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(va.x, 3);
}

/* umbp_strerror names every code of the one error list, the KV ones too. */
Test(config, strerror_names_every_code)
{
    static const int codes[] = {
#define X(name, value, text) name,
        UMBP_ERRORS(X)
#undef X
    };
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        const char *s = umbp_strerror(codes[i]);
        cr_assert(s && *s && !strstr(s, "unknown"), "code %d: '%s'", codes[i], s);
        cr_assert_str_eq(umbp_gpu_strerror(codes[i]), s, "code %d", codes[i]);
    }
    cr_assert(strstr(umbp_strerror(UMBP_E_KV_STRIDE), "stride"));
    cr_assert(strstr(umbp_strerror(-4999), "unknown"));
}
