/*
 * test_dram_tier.c - the dram tier through its ops table, as the runtime
 * drives it: options table -> config -> create; reserve, write the bytes,
 * publish; acquire, read the bytes back, release; evict, clear, expire.
 *
 * The config is built from the tier's own option table (defaults and
 * overrides written as a user would), so a wrong offset or default in the
 * table fails here too.  Every completion must arrive inline, exactly once.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "umbp/tier.h"

/* backends/dram/dram_tier.c (the generated registry declares it the same way) */
extern const struct umbp_tier_ops umbp_tier_dram_ops;

#define KiB (1024ull)
#define MiB (1024ull * 1024ull)
#define OBJ (64 * KiB)
#define MAX_BATCH 128
#define MAX_EVENTS 4096

static const struct umbp_tier_ops *ops = &umbp_tier_dram_ops;

/* ---- config from the option table ------------------------------------- */

static const struct umbp_option *opt_find(const char *name)
{
    for (const struct umbp_option *o = ops->options; o->name; o++)
        if (!strcmp(o->name, name))
            return o;
    cr_assert_fail("no option %s", name);
    return NULL;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    uint64_t n = strtoull(s, &end, 10);

    if (!strcmp(end, "KiB") || !strcmp(end, "K"))
        return n << 10;
    if (!strcmp(end, "MiB") || !strcmp(end, "M"))
        return n << 20;
    if (!strcmp(end, "GiB") || !strcmp(end, "G"))
        return n << 30;
    cr_assert_str_empty(end, "bad size %s", s);
    return n;
}

static void opt_set(void *cfg, const char *name, const char *value)
{
    const struct umbp_option *o = opt_find(name);
    char *field = (char *)cfg + o->offset;

    switch (o->type) {
    case UMBP_OPT_BOOL:
        cr_assert(!strcmp(value, "true") || !strcmp(value, "false"));
        *(bool *)field = !strcmp(value, "true");
        break;
    case UMBP_OPT_INT:
        *(int64_t *)field = strtoll(value, NULL, 10);
        break;
    case UMBP_OPT_SIZE:
        *(uint64_t *)field = parse_size(value);
        break;
    case UMBP_OPT_DOUBLE:
        *(double *)field = strtod(value, NULL);
        break;
    case UMBP_OPT_STRING:
        cr_assert_lt(strlen(value), o->str_cap);
        strcpy(field, value);
        break;
    }
}

static void *cfg_defaults(void)
{
    void *cfg = calloc(1, ops->config_size);

    cr_assert_not_null(cfg);
    for (const struct umbp_option *o = ops->options; o->name; o++)
        opt_set(cfg, o->name, o->def);
    return cfg;
}

/* ---- harness ---------------------------------------------------------- */

static struct umbp_tier *T;
static void *cfg;
static struct umbp_core_config core;
static umbp_event_t events[MAX_EVENTS];
static size_t nevents;
static int nspace_freed, ndone, last_rc;

static void on_event(void *ctx, umbp_event_type_t type, const umbp_key_t *key)
{
    cr_assert_eq(ctx, &core);
    cr_assert_lt(nevents, MAX_EVENTS);
    events[nevents++] = (umbp_event_t){ type, *key };
}

static void on_space_freed(void *ctx)
{
    cr_assert_eq(ctx, &core);
    nspace_freed++;
}

static void on_done(void *arg, int rc)
{
    cr_assert_eq(arg, &ndone);
    ndone++;
    last_rc = rc;
}

static struct umbp_tier_env make_env(uint64_t capacity)
{
    core.lease_ttl_ms = 1000;
    return (struct umbp_tier_env){
        .core = &core,
        .capacity_bytes = capacity,
        .emit_event = on_event,
        .space_freed = on_space_freed,
        .ctx = &core,
    };
}

static int try_create(uint64_t capacity, char *err, size_t errlen)
{
    struct umbp_tier_env env = make_env(capacity);

    return ops->create(&env, cfg, &T, err, errlen);
}

static void create_tier(uint64_t capacity)
{
    char err[512] = "";
    int rc = try_create(capacity, err, sizeof(err));

    cr_assert_eq(rc, 0, "create: %d %s", rc, err);
    cr_assert_eq(T->ops, ops);
}

static void setup(void)
{
    cfg = cfg_defaults();
    create_tier(4 * MiB);
}

static void teardown(void)
{
    if (T)
        ops->destroy(T);
    T = NULL;
    free(cfg);
}

/* Runs a member that completes through `done`: inline, exactly once. */
#define INLINE(call)                                                        \
    do {                                                                    \
        ndone = 0;                                                          \
        call;                                                               \
        cr_assert_eq(ndone, 1, "done must be called exactly once, inline"); \
        cr_assert_eq(last_rc, 0);                                           \
    } while (0)

static umbp_key_t key(int id)
{
    umbp_key_t k;

    memset(&k, 0xA5, sizeof(k));
    memcpy(k.bytes, &id, sizeof(id));
    return k;
}

static struct umbp_tier_req req(int id, uint64_t size)
{
    return (struct umbp_tier_req){ .key = key(id), .size = size };
}

static void ptrs(struct umbp_tier_req *r, size_t n, struct umbp_tier_req **p)
{
    cr_assert_leq(n, MAX_BATCH);
    for (size_t i = 0; i < n; i++)
        p[i] = &r[i];
}

static void t_reserve(struct umbp_tier_req *r, size_t n)
{
    struct umbp_tier_req *p[MAX_BATCH];

    ptrs(r, n, p);
    INLINE(ops->reserve(T, p, n, on_done, &ndone));
}

static void t_publish(struct umbp_tier_req *r, size_t n)
{
    struct umbp_tier_req *p[MAX_BATCH];

    ptrs(r, n, p);
    INLINE(ops->publish(T, p, n, on_done, &ndone));
}

static void t_abort(struct umbp_tier_req *r, size_t n)
{
    struct umbp_tier_req *p[MAX_BATCH];

    ptrs(r, n, p);
    ops->abort(T, p, n);
}

static void t_acquire(struct umbp_tier_req *r, size_t n, uint64_t ttl_ms)
{
    struct umbp_tier_req *p[MAX_BATCH];

    ptrs(r, n, p);
    INLINE(ops->acquire(T, p, n, ttl_ms, on_done, &ndone));
}

static void t_release(struct umbp_tier_req *r, size_t n)
{
    struct umbp_tier_req *p[MAX_BATCH];

    ptrs(r, n, p);
    INLINE(ops->release(T, p, n, on_done, &ndone));
}

static bool t_present(int id, bool touch)
{
    struct umbp_tier_req r = req(id, 0), *p = &r;
    uint8_t present = 0xee;

    INLINE(ops->lookup(T, &p, 1, &present, touch, on_done, &ndone));
    cr_assert(present == 0 || present == 1);
    return present;
}

static void t_clear(void)
{
    INLINE(ops->clear(T, on_done, &ndone));
}

static struct umbp_tier_usage t_usage(void)
{
    struct umbp_tier_usage u;

    memset(&u, 0xee, sizeof(u));
    ops->usage(T, &u);
    return u;
}

static uint8_t pattern(int seed, uint64_t i)
{
    return (uint8_t)(seed * 131 + i * 7 + (i >> 11));
}

static void fill(const struct umbp_region *r, int seed)
{
    for (uint64_t i = 0; i < r->size; i++)
        ((uint8_t *)r->addr)[i] = pattern(seed, i);
}

static void expect_bytes(const struct umbp_region *r, int seed)
{
    const uint8_t *b = r->addr;
    uint64_t i = 0;

    while (i < r->size && b[i] == pattern(seed, i))
        i++;
    cr_assert_eq(i, r->size, "byte %llu of object %d differs",
                 (unsigned long long)i, seed);
}

/* A whole put: reserve, write, publish. */
static void put(int id, uint64_t size)
{
    struct umbp_tier_req r = req(id, size);

    t_reserve(&r, 1);
    cr_assert_eq(r.status, 0, "reserve %d: %d", id, r.status);
    fill(&r.region, id);
    t_publish(&r, 1);
    cr_assert_eq(r.status, 0, "publish %d: %d", id, r.status);
}

/* A whole get: acquire, check every byte, release. */
static void get(int id)
{
    struct umbp_tier_req r = req(id, 0);

    t_acquire(&r, 1, 1000);
    cr_assert_eq(r.status, 0, "acquire %d: %d", id, r.status);
    expect_bytes(&r.region, id);
    t_release(&r, 1);
    cr_assert_eq(r.status, 0, "release %d: %d", id, r.status);
}

static void expect_events(const umbp_event_type_t *types, const int *ids,
                          size_t n)
{
    cr_assert_eq(nevents, n, "%zu events, want %zu", nevents, n);
    for (size_t i = 0; i < n; i++) {
        umbp_key_t k = key(ids[i]);

        cr_assert_eq(events[i].type, types[i], "event %zu type", i);
        cr_assert_arr_eq(events[i].key.bytes, k.bytes, UMBP_KEY_SIZE,
                         "event %zu is for key %d", i, ids[i]);
    }
    nevents = 0;
}

#define STORED UMBP_EVENT_STORED
#define REMOVED UMBP_EVENT_REMOVED
#define EVENTS(types, ids)                                                  \
    expect_events((umbp_event_type_t[])types, (int[])ids,                   \
                  sizeof((int[])ids) / sizeof(int))
#define L(...) { __VA_ARGS__ }

TestSuite(dram_tier, .init = setup, .fini = teardown);

/* ---- options and creation --------------------------------------------- */

Test(dram_tier, option_table_and_defaults)
{
    static const char *const names[] = {
        "dram_use_shared_memory", "dram_shm_name", "dram_use_hugepages",
        "dram_hugepage_size", "dram_numa_node", "dram_prefault",
        "dram_high_watermark", "dram_low_watermark",
    };
    size_t n = 0;
    char err[256] = "";

    for (const struct umbp_option *o = ops->options; o->name; o++, n++) {
        cr_assert_lt(o->offset, ops->config_size, "%s", o->name);
        cr_assert_not_null(o->def, "%s", o->name);
        cr_assert_not_null(o->help, "%s", o->name);
    }
    cr_assert_eq(n, sizeof(names) / sizeof(names[0]));
    for (size_t i = 0; i < n; i++)
        opt_find(names[i]);
    cr_assert_eq(opt_find("dram_numa_node")->min, -1);
    cr_assert_eq(opt_find("dram_numa_node")->max, 1023);
    cr_assert_eq(ops->validate_config(cfg, &core, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(ops->name, "dram");
    cr_assert_eq(t_usage().high_watermark_bytes, (uint64_t)((double)t_usage().capacity_bytes * 0.9));
    cr_assert_eq(t_usage().low_watermark_bytes, (uint64_t)((double)t_usage().capacity_bytes * 0.7));
}

static void expect_invalid(const char *name, const char *value,
                           const char *const *words)
{
    void *bad = cfg_defaults();
    char err[512] = "";

    opt_set(bad, name, value);
    cr_assert_eq(ops->validate_config(bad, &core, err, sizeof(err)), -EINVAL,
                 "%s=%s accepted", name, value);
    for (; *words; words++)
        cr_assert(strstr(err, *words), "message lacks '%s': %s", *words, err);
    free(bad);
}

Test(dram_tier, validate_config_names_options)
{
    expect_invalid("dram_hugepage_size", "4MiB",
                   (const char *[]){ "dram_hugepage_size", "2MiB", "1GiB", NULL });
    expect_invalid("dram_low_watermark", "0.9",
                   (const char *[]){ "dram_low_watermark", "dram_high_watermark", NULL });
    expect_invalid("dram_numa_node", "-2",
                   (const char *[]){ "dram_numa_node", "-1", "1023", NULL });
    expect_invalid("dram_shm_name", "umbp-x",
                   (const char *[]){ "dram_shm_name", "dram_use_shared_memory", NULL });

    void *c = cfg_defaults();
    char err[512] = "";

    opt_set(c, "dram_use_shared_memory", "true");
    opt_set(c, "dram_shm_name", "a/b");
    cr_assert_eq(ops->validate_config(c, &core, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "dram_shm_name"), "%s", err);
    opt_set(c, "dram_hugepage_size", "1GiB");
    opt_set(c, "dram_shm_name", "ok-name");
    opt_set(c, "dram_high_watermark", "0.5");
    opt_set(c, "dram_low_watermark", "0.4");
    cr_assert_eq(ops->validate_config(c, &core, err, sizeof(err)), 0, "%s", err);
    free(c);
}

Test(dram_tier, create_refuses_bad_config_and_zero_capacity)
{
    struct umbp_tier *saved = T;
    char err[512] = "";

    cr_assert_eq(try_create(0, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "capacity_bytes"), "%s", err);
    opt_set(cfg, "dram_hugepage_size", "4MiB");
    cr_assert_eq(try_create(MiB, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "dram_hugepage_size"), "%s", err);
    opt_set(cfg, "dram_hugepage_size", "2MiB");
    opt_set(cfg, "dram_numa_node", "1000");
    cr_assert_eq(try_create(MiB, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "dram_numa_node"), "%s", err);
    cr_assert_eq(T, saved, "out untouched on failure");
}

Test(dram_tier, watermarks_come_from_the_config)
{
    ops->destroy(T);
    opt_set(cfg, "dram_high_watermark", "0.8");
    opt_set(cfg, "dram_low_watermark", "0.25");
    create_tier(MiB);
    cr_assert_eq(t_usage().high_watermark_bytes, (uint64_t)(MiB * 0.8));
    cr_assert_eq(t_usage().low_watermark_bytes, MiB / 4);
}

Test(dram_tier, shared_named_pool_through_options)
{
    char name[64], path[96];
    struct stat st;

    snprintf(name, sizeof(name), "umbp-test-tier-%d", (int)getpid());
    snprintf(path, sizeof(path), "/dev/shm/%s", name);
    ops->destroy(T);
    opt_set(cfg, "dram_use_shared_memory", "true");
    opt_set(cfg, "dram_shm_name", name);
    opt_set(cfg, "dram_prefault", "true");
    create_tier(MiB);
    cr_assert_eq(stat(path, &st), 0, "%s exists", path);
    put(1, 100 * KiB);
    get(1);
    ops->destroy(T);
    T = NULL;
    cr_assert_eq(stat(path, &st), -1, "%s removed by destroy", path);
}

/* ---- put and get ------------------------------------------------------ */

Test(dram_tier, put_get_round_trip_any_size)
{
    uint64_t sizes[] = { 1, 255, 256, 257, OBJ, MiB + 13, 2 * MiB };
    size_t n = sizeof(sizes) / sizeof(sizes[0]);
    struct umbp_tier_usage u;

    for (size_t i = 0; i < n; i++)
        put((int)i, sizes[i]);
    for (size_t i = 0; i < n; i++) {
        struct umbp_tier_req r = req((int)i, 0);

        t_acquire(&r, 1, 1000);
        cr_assert_eq(r.status, 0);
        cr_assert_eq(r.region.size, sizes[i], "object size, not rounded");
        expect_bytes(&r.region, (int)i);
        t_release(&r, 1);
        cr_assert_eq(r.status, 0);
    }
    u = t_usage();
    cr_assert_eq(u.capacity_bytes, 4 * MiB);
    cr_assert_eq(u.num_objects, n);
    cr_assert_eq(u.num_pending, 0);
    cr_assert_eq(u.num_leased, 0);
    cr_assert_eq(u.used_bytes, 256 + 256 + 256 + 512 + OBJ + MiB + 256 + 2 * MiB);
}

Test(dram_tier, pending_is_invisible_until_published)
{
    struct umbp_tier_req w = req(7, OBJ), r = req(7, 0);
    struct umbp_tier_usage u;

    t_reserve(&w, 1);
    cr_assert_eq(w.status, 0);
    cr_assert_not_null(w.region.addr);
    cr_assert_eq(w.region.size, OBJ);
    u = t_usage();
    cr_assert_eq(u.num_pending, 1);
    cr_assert_eq(u.num_objects, 0);
    cr_assert_eq(u.used_bytes, OBJ);
    cr_assert_not(t_present(7, false));
    cr_assert_not(t_present(7, true));
    t_acquire(&r, 1, 1000);
    cr_assert_eq(r.status, -ENOENT, "a pending object cannot be read");
    cr_assert_eq(ops->evict(T, 0, 0, 100, NULL), 0, "pending is never evicted");
    t_clear();
    cr_assert_eq(t_usage().num_pending, 1, "clear leaves pending alone");
    EVENTS(L(), L());
    fill(&w.region, 7);
    t_publish(&w, 1);
    cr_assert_eq(w.status, 0);
    EVENTS(L(STORED), L(7));
    cr_assert(t_present(7, false));
    get(7);
}

Test(dram_tier, first_writer_wins)
{
    struct umbp_tier_req a = req(3, OBJ), b = req(3, 2 * OBJ);

    t_reserve(&a, 1);
    cr_assert_eq(a.status, 0);
    t_reserve(&b, 1);
    cr_assert_eq(b.status, UMBP_TIER_EXISTS, "pending key exists");
    fill(&a.region, 3);
    t_publish(&a, 1);
    b = req(3, 2 * OBJ);
    t_reserve(&b, 1);
    cr_assert_eq(b.status, UMBP_TIER_EXISTS, "published key exists");
    cr_assert_eq(t_usage().used_bytes, OBJ, "the second put took no space");
    get(3);
}

Test(dram_tier, reserve_errors_and_no_inline_eviction)
{
    struct umbp_tier_req r = req(1, 0);
    int n = 0;

    t_reserve(&r, 1);
    cr_assert_eq(r.status, -EINVAL, "size 0");
    r = req(1, 4 * MiB + 1);
    t_reserve(&r, 1);
    cr_assert_eq(r.status, -EFBIG, "larger than the pool: never fits");
    for (n = 0; n < 64; n++)
        put(n, OBJ);
    r = req(100, OBJ);
    t_reserve(&r, 1);
    cr_assert_eq(r.status, -ENOSPC);
    r = req(100, 1);
    t_reserve(&r, 1);
    cr_assert_eq(r.status, -ENOSPC);
    cr_assert_eq(t_usage().num_objects, 64, "nothing was evicted inline");
    cr_assert_eq(nevents, 64, "only the STORED events");
    for (n = 0; n < 64; n++)
        get(n);
}

Test(dram_tier, batch_statuses_are_per_key)
{
    struct umbp_tier_req r[4] = { req(1, OBJ), req(2, 0), req(1, OBJ), req(3, 8 * MiB) };

    t_reserve(r, 4);
    cr_assert_eq(r[0].status, 0);
    cr_assert_eq(r[1].status, -EINVAL);
    cr_assert_eq(r[2].status, UMBP_TIER_EXISTS, "same key earlier in the batch");
    cr_assert_eq(r[3].status, -EFBIG);
    cr_assert_eq(t_usage().num_pending, 1);
}

Test(dram_tier, publish_checks_the_reservation_token)
{
    struct umbp_tier_req w = req(5, OBJ), bad;

    t_reserve(&w, 1);
    bad = w;
    bad.region.token ^= 0x1234;
    t_publish(&bad, 1);
    cr_assert_eq(bad.status, -ENOENT);
    cr_assert_not(t_present(5, false));
    fill(&w.region, 5);
    t_publish(&w, 1);
    cr_assert_eq(w.status, 0);
    t_publish(&w, 1);
    cr_assert_eq(w.status, -ENOENT, "already published");
    bad = req(6, OBJ);
    t_publish(&bad, 1);
    cr_assert_eq(bad.status, -ENOENT, "never reserved");
    EVENTS(L(STORED), L(5));
    get(5);
}

Test(dram_tier, failed_requests_are_left_alone)
{
    struct umbp_tier_req w[3] = { req(1, OBJ), req(1, OBJ), req(2, OBJ) };
    struct umbp_tier_req g[2] = { req(1, 0), req(99, 0) };

    t_reserve(w, 3);
    cr_assert_eq(w[1].status, UMBP_TIER_EXISTS);
    fill(&w[0].region, 1);
    w[2].status = -EIO;     /* the runtime's copy into it failed */
    t_publish(w, 3);
    cr_assert_eq(w[0].status, 0);
    cr_assert_eq(w[1].status, UMBP_TIER_EXISTS, "kept, not overwritten");
    cr_assert_eq(w[2].status, -EIO);
    cr_assert_not(t_present(2, false), "a failed copy is never published");
    EVENTS(L(STORED), L(1));
    t_abort(&w[2], 1);      /* abort drops it whatever its status */
    cr_assert_eq(t_usage().num_pending, 0);
    cr_assert_eq(t_usage().used_bytes, OBJ);

    t_acquire(g, 2, 1000);
    cr_assert_eq(g[0].status, 0);
    cr_assert_eq(g[1].status, -ENOENT);
    g[1].region.token = g[0].region.token; /* garbage must not be used */
    t_release(g, 2);
    cr_assert_eq(g[0].status, 0);
    cr_assert_eq(g[1].status, -ENOENT, "a miss stays a miss");
    cr_assert_eq(t_usage().num_leased, 0);
}

Test(dram_tier, abort_leaves_previous_state)
{
    struct umbp_tier_req w = req(9, OBJ), stale;

    t_reserve(&w, 1);
    cr_assert_eq(w.status, 0);
    t_abort(&w, 1);
    cr_assert_not(t_present(9, false));
    cr_assert_eq(t_usage().used_bytes, 0);
    cr_assert_eq(t_usage().num_pending, 0);
    cr_assert_eq(nspace_freed, 1, "a waiting put may now fit");

    w = req(9, OBJ);
    t_reserve(&w, 1);
    cr_assert_eq(w.status, 0, "the key is free again");
    stale = w;
    fill(&w.region, 9);
    t_publish(&w, 1);
    t_abort(&stale, 1); /* token of a published object: nothing happens */
    cr_assert(t_present(9, false));
    get(9);
    EVENTS(L(STORED), L(9));
}

/* ---- leases, eviction, clear ------------------------------------------ */

static void put_n(int n)
{
    for (int i = 0; i < n; i++)
        put(i, OBJ);
    nevents = 0;
}

Test(dram_tier, evict_from_lru_tail_with_touch)
{
    bool more = false;
    uint64_t freed;

    put_n(5);               /* LRU, newest first: 4 3 2 1 0 */
    cr_assert(t_present(0, false));
    cr_assert(t_present(1, true)); /* 1 4 3 2 0 */
    nspace_freed = 0;
    freed = ops->evict(T, 0, 0, 2, &more);
    cr_assert_eq(freed, 2 * OBJ);
    cr_assert(more, "stopped on max_objects");
    EVENTS(L(REMOVED, REMOVED), L(0, 2));
    cr_assert_eq(nspace_freed, 1, "space_freed once per evict call");
    cr_assert_not(t_present(0, false));
    cr_assert(t_present(1, false));

    freed = ops->evict(T, OBJ, 0, 100, &more); /* down to one object */
    cr_assert_eq(freed, 2 * OBJ);
    cr_assert_not(more);
    EVENTS(L(REMOVED, REMOVED), L(3, 4));
    get(1);
    struct umbp_tier_usage u = t_usage();
    cr_assert_eq(u.evictions, 4);
    cr_assert_eq(u.evicted_bytes, 4 * OBJ);
    cr_assert_eq(u.used_bytes, OBJ);
    cr_assert_eq(u.num_objects, 1);

    nspace_freed = 0;
    cr_assert_eq(ops->evict(T, OBJ, 0, 100, &more), 0, "already at target");
    cr_assert_eq(nspace_freed, 0, "nothing freed, no space_freed");
}

Test(dram_tier, acquire_refreshes_lru)
{
    struct umbp_tier_req r = req(0, 0);

    put_n(3);               /* 2 1 0 */
    t_acquire(&r, 1, 1000); /* 0 2 1 */
    t_release(&r, 1);
    ops->evict(T, 2 * OBJ, 0, 100, NULL);
    EVENTS(L(REMOVED), L(1));
}

Test(dram_tier, leased_objects_are_never_evicted)
{
    struct umbp_tier_req r[2] = { req(0, 0), req(0, 0) };
    bool more = true;

    put_n(3);
    t_acquire(r, 2, 1000); /* two leases on the oldest object */
    cr_assert_eq(r[0].status, 0);
    cr_assert_eq(r[1].status, 0);
    cr_assert_neq(r[0].region.token, r[1].region.token);
    cr_assert_eq(t_usage().num_leased, 1, "objects, not leases");
    cr_assert_eq(ops->evict(T, 0, 0, 100, &more), 2 * OBJ);
    cr_assert_not(more);
    EVENTS(L(REMOVED, REMOVED), L(1, 2)); /* acquire made 0 the newest */
    cr_assert(t_present(0, false));
    expect_bytes(&r[0].region, 0);
    t_release(&r[0], 1);
    cr_assert_eq(r[0].status, 0);
    cr_assert_eq(ops->evict(T, 0, 0, 100, &more), 0, "one lease still holds it");
    t_release(&r[1], 1);
    cr_assert_eq(r[1].status, 0);
    cr_assert_eq(t_usage().num_leased, 0);
    cr_assert_eq(ops->evict(T, 0, 0, 100, &more), OBJ);
    EVENTS(L(REMOVED), L(0));
}

Test(dram_tier, expired_lease_then_eviction_then_release_is_stale)
{
    struct umbp_tier_req r = req(0, 0);
    uint64_t now;

    put_n(2);
    t_acquire(&r, 1, 50);
    cr_assert_eq(r.status, 0);
    now = umbp_now_ns();
    ops->expire_leases(T, now);
    cr_assert_eq(t_usage().leases_expired, 0, "not due yet");
    cr_assert_eq(ops->evict(T, 0, 0, 100, NULL), OBJ, "the leased one survives");
    ops->expire_leases(T, now + 100 * 1000000ull);
    cr_assert_eq(t_usage().leases_expired, 1);
    cr_assert_eq(t_usage().num_leased, 0);
    cr_assert_eq(ops->evict(T, 0, 0, 100, NULL), OBJ, "expired: evictable");
    put(0, OBJ);    /* same key again, quite possibly the same bytes */
    t_release(&r, 1);
    cr_assert_eq(r.status, UMBP_E_STALE);
}

Test(dram_tier, expired_lease_on_resident_object_releases_ok)
{
    struct umbp_tier_req r = req(4, 0);

    put(4, OBJ);
    t_acquire(&r, 1, 10);
    ops->expire_leases(T, umbp_now_ns() + 20 * 1000000ull);
    cr_assert_eq(t_usage().leases_expired, 1);
    expect_bytes(&r.region, 4);
    t_release(&r, 1);
    cr_assert_eq(r.status, 0, "expired, but the object was never freed");
    t_release(&r, 1);   /* status 0 in: a release is attempted */
    cr_assert_eq(r.status, UMBP_E_STALE, "released twice");
}

Test(dram_tier, expired_records_are_forgotten_after_retention)
{
    struct umbp_tier_req r = req(4, 0), kept = req(4, 0);
    uint64_t now = umbp_now_ns(), sec = 1000000000ull;

    put(4, OBJ);
    t_acquire(&r, 1, 10);
    t_acquire(&kept, 1, 10);
    ops->expire_leases(T, now + 30 * sec);
    t_release(&kept, 1);
    cr_assert_eq(kept.status, 0, "30 s late: still remembered");
    ops->expire_leases(T, now + 61 * sec);
    t_release(&r, 1);
    cr_assert_eq(r.status, UMBP_E_STALE,
                 "61 s late: forgotten, so it cannot vouch for the bytes");
    cr_assert(t_present(4, false));
    get(4);
}

Test(dram_tier, unknown_tokens_are_stale)
{
    struct umbp_tier_req r = req(1, 0);
    uint64_t tokens[] = { 0, 1, UINT64_MAX, 0x100000000ull, 0x500000007ull };

    put(1, OBJ);
    for (size_t i = 0; i < sizeof(tokens) / sizeof(tokens[0]); i++) {
        r.status = 0;
        r.region.token = tokens[i];
        t_release(&r, 1);
        cr_assert_eq(r.status, UMBP_E_STALE, "token %llx",
                     (unsigned long long)tokens[i]);
    }
    t_acquire(&r, 1, 1000);
    t_release(&r, 1);
    cr_assert_eq(r.status, 0);
    t_acquire(&r, 1, 1000); /* the slot is reused with a new generation */
    struct umbp_tier_req old = r;
    old.region.token -= 1ull << 32;
    t_release(&old, 1);
    cr_assert_eq(old.status, UMBP_E_STALE, "previous generation");
    t_release(&r, 1);
    cr_assert_eq(r.status, 0);
}

Test(dram_tier, varying_ttls_expire_in_deadline_order)
{
    struct umbp_tier_req a = req(1, 0), b = req(2, 0), c = req(3, 0);
    uint64_t now = umbp_now_ns();

    put(1, OBJ);
    put(2, OBJ);
    put(3, OBJ);
    t_acquire(&a, 1, 100000);
    t_acquire(&b, 1, 10);
    t_acquire(&c, 1, 5000);
    ops->expire_leases(T, now + 1000 * 1000000ull);
    cr_assert_eq(t_usage().leases_expired, 1);
    cr_assert_eq(t_usage().num_leased, 2);
    nevents = 0;
    ops->evict(T, 0, 0, 100, NULL);
    EVENTS(L(REMOVED), L(2));
    ops->expire_leases(T, now + 10000 * 1000000ull);
    cr_assert_eq(t_usage().leases_expired, 2);
    ops->evict(T, 0, 0, 100, NULL);
    EVENTS(L(REMOVED), L(3));
    t_release(&a, 1);
    cr_assert_eq(a.status, 0);
    t_release(&b, 1);
    cr_assert_eq(b.status, UMBP_E_STALE);
    t_release(&c, 1);
    cr_assert_eq(c.status, UMBP_E_STALE);
}

Test(dram_tier, clear_dooms_read_objects_until_release)
{
    struct umbp_tier_req r = req(1, 0), again = req(1, 0);
    struct umbp_tier_usage u;

    put_n(3);
    t_acquire(&r, 1, 1000);
    nspace_freed = 0;
    t_clear();
    EVENTS(L(REMOVED, REMOVED, REMOVED), L(0, 2, 1));
    cr_assert_eq(nspace_freed, 1);
    u = t_usage();
    cr_assert_eq(u.num_objects, 0);
    cr_assert_eq(u.num_leased, 1);
    cr_assert_eq(u.used_bytes, OBJ, "the doomed object still holds its bytes");
    cr_assert_not(t_present(1, false), "doomed: invisible");
    t_acquire(&again, 1, 1000);
    cr_assert_eq(again.status, -ENOENT);

    put(1, 2 * OBJ);    /* a new object under the same key */
    cr_assert(t_present(1, false));
    expect_bytes(&r.region, 1);  /* the reader's bytes are intact */
    nspace_freed = 0;
    t_release(&r, 1);
    cr_assert_eq(r.status, 0);
    cr_assert_eq(nspace_freed, 1, "freeing the doomed object frees space");
    u = t_usage();
    cr_assert_eq(u.used_bytes, 2 * OBJ);
    cr_assert_eq(u.num_leased, 0);
    cr_assert_eq(u.num_objects, 1);
    EVENTS(L(STORED), L(1));
    get(1);
    nevents = 0;
    t_clear();
    EVENTS(L(REMOVED), L(1));
    cr_assert_eq(t_usage().used_bytes, 0);
}

Test(dram_tier, doomed_object_freed_when_its_lease_expires)
{
    struct umbp_tier_req r = req(2, 0);

    put(2, OBJ);
    t_acquire(&r, 1, 5);
    t_clear();
    cr_assert_eq(t_usage().used_bytes, OBJ);
    nspace_freed = 0;
    ops->expire_leases(T, umbp_now_ns() + 10 * 1000000ull);
    cr_assert_eq(t_usage().used_bytes, 0);
    cr_assert_eq(nspace_freed, 1);
    t_release(&r, 1);
    cr_assert_eq(r.status, UMBP_E_STALE, "freed before the release");
}

Test(dram_tier, expired_lease_on_doomed_object_still_held_by_another)
{
    struct umbp_tier_req shortl = req(2, 0), longl = req(2, 0);

    put(2, OBJ);
    t_acquire(&shortl, 1, 5);
    t_acquire(&longl, 1, 100000);
    t_clear();
    ops->expire_leases(T, umbp_now_ns() + 10 * 1000000ull);
    cr_assert_eq(t_usage().used_bytes, OBJ, "the other reader pins it");
    t_release(&shortl, 1);
    cr_assert_eq(shortl.status, 0, "bytes were never freed");
    t_release(&longl, 1);
    cr_assert_eq(longl.status, 0);
    cr_assert_eq(t_usage().used_bytes, 0);
}

Test(dram_tier, events_follow_publish_order)
{
    struct umbp_tier_req r[3] = { req(30, OBJ), req(10, OBJ), req(20, OBJ) };

    t_reserve(r, 3);
    t_publish(r, 3);
    EVENTS(L(STORED, STORED, STORED), L(30, 10, 20));
}

Test(dram_tier, many_leases_grow_the_table)
{
    enum { N = 1000 };
    static struct umbp_tier_req r[N];

    put(1, OBJ);
    for (int i = 0; i < N; i++) {
        r[i] = req(1, 0);
        t_acquire(&r[i], 1, 1000);
        cr_assert_eq(r[i].status, 0);
    }
    cr_assert_eq(ops->evict(T, 0, 0, 10, NULL), 0);
    for (int i = 0; i < N; i += 2)
        t_release(&r[i], 1);
    ops->expire_leases(T, umbp_now_ns() + 2000 * 1000000ull);
    cr_assert_eq(t_usage().leases_expired, N / 2);
    cr_assert_eq(t_usage().num_leased, 0);
    for (int i = 1; i < N; i += 2) {
        t_release(&r[i], 1);
        cr_assert_eq(r[i].status, 0);
    }
}

/* Random traffic against a model: which keys are visible and how big they
 * are.  Eviction is the only thing the model does not predict key by key,
 * so it learns it from REMOVED events and checks them for plausibility. */
struct model {
    bool visible[200];
    uint64_t size[200];
    uint64_t used;
    uint64_t x;
};

static uint64_t model_rand(struct model *m)
{
    m->x = m->x * 6364136223846793005ull + 1442695040888963407ull;
    return m->x >> 24;
}

static void model_events(struct model *m, int expect_stored)
{
    for (size_t e = 0; e < nevents; e++) {
        int id = *(int *)events[e].key.bytes;

        if (events[e].type == STORED) {
            cr_assert_eq(id, expect_stored, "STORED only for the publish");
            m->visible[id] = true;
            m->used += (m->size[id] + 255) / 256 * 256;
        } else {
            cr_assert(m->visible[id], "REMOVED for invisible key %d", id);
            m->visible[id] = false;
            m->used -= (m->size[id] + 255) / 256 * 256;
        }
    }
    nevents = 0;
}

#define MODEL_CAP (512 * KiB)

static void model_put(struct model *m, int id, bool abort_it)
{
    struct umbp_tier_req r = req(id, 1 + model_rand(m) % (12 * KiB));

    t_reserve(&r, 1);
    if (r.status == -ENOSPC) {
        cr_assert_gt(m->used + r.size, MODEL_CAP / 2, "ENOSPC while half empty");
        ops->evict(T, MODEL_CAP / 2, 0, 1000, NULL);
        model_events(m, -1);
        return;
    }
    cr_assert_eq(r.status, m->visible[id] ? UMBP_TIER_EXISTS : 0, "key %d", id);
    if (r.status)
        return;
    fill(&r.region, id);
    if (abort_it) {
        t_abort(&r, 1);
        return;
    }
    m->size[id] = r.size;
    t_publish(&r, 1);
    cr_assert_eq(nevents, 1);
    model_events(m, id);
}

static void model_get(struct model *m, int id)
{
    struct umbp_tier_req r = req(id, 0);

    t_acquire(&r, 1, 1000);
    cr_assert_eq(r.status, m->visible[id] ? 0 : -ENOENT, "key %d", id);
    if (r.status)
        return;
    cr_assert_eq(r.region.size, m->size[id]);
    expect_bytes(&r.region, id);
    t_release(&r, 1);
    cr_assert_eq(r.status, 0);
}

Test(dram_tier, random_traffic_against_a_model, .timeout = 60)
{
    static struct model m = { .x = 12345 };
    struct umbp_tier_usage u;
    uint64_t n = 0;

    ops->destroy(T);
    create_tier(MODEL_CAP);
    for (int step = 0; step < 20000; step++) {
        int id = (int)(model_rand(&m) % 200), op = (int)(model_rand(&m) % 10);

        if (op < 5)
            model_put(&m, id, op == 0);
        else if (op < 9)
            model_get(&m, id);
        else {
            ops->evict(T, model_rand(&m) % MODEL_CAP, 0, 1 + op, NULL);
            model_events(&m, -1);
        }
        cr_assert_eq(t_usage().used_bytes, m.used, "step %d", step);
    }
    for (int k = 0; k < 200; k++) {
        cr_assert_eq(t_present(k, false), m.visible[k], "key %d", k);
        n += m.visible[k];
    }
    u = t_usage();
    cr_assert_eq(u.num_objects, n);
    cr_assert_eq(u.num_pending, 0);
    cr_assert_eq(u.num_leased, 0);
    cr_assert_gt(u.evictions, 0, "the run was meant to fill the pool");
    t_clear();
    cr_assert_eq(t_usage().used_bytes, 0);
}
