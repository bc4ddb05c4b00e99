/*
 * test_tier_call.c - how the runtime sees a tier instance (runtime/
 * tier_call.h): its capabilities are the instance's, set from the ops
 * table's static caps at creation unless the tier's create set its own
 * (umbp_tier_set_caps), and every optional member has its default.
 *
 * Child tiers (env->create_child, runtime/config.c): created from the
 * options the runtime parsed for them, with the parent's callbacks, and
 * only when the parent declares them (ops->uses), whose options are then
 * validated with the parent's.
 *
 * Fake tiers declared here: the runtime code under test never sees a tier's
 * name, only the ops table and the instance.  The children are registered
 * tiers (loopback, dram), created for real.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <ev.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#include "tier_call.h"

struct fake_tier {
    struct umbp_tier base;
    uint32_t want_caps;
    bool set_caps;
};

static int fake_create(const struct umbp_tier_env *env, const void *cfg,
                       struct umbp_tier **out, char *err, size_t errlen)
{
    (void)env, (void)err, (void)errlen;
    const struct fake_tier *proto = cfg;
    struct fake_tier *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    *f = *proto;
    if (f->set_caps)
        umbp_tier_set_caps(&f->base, f->want_caps);
    *out = &f->base;
    return 0;
}

static void fake_destroy(struct umbp_tier *t) { free(t); }

static const struct umbp_tier_ops fake_ops = {
    .name = "fake",
    .caps = UMBP_TIER_CAP_MAPPED | UMBP_TIER_CAP_EVICTS_LOCALLY,
    .create = fake_create,
    .destroy = fake_destroy,
};

static struct umbp_tier *make(const struct fake_tier *proto)
{
    struct umbp_tier_env env = {.capacity_bytes = 1};
    struct umbp_tier *t = NULL;
    char err[64];
    cr_assert_eq(fake_ops.create(&env, proto, &t, err, sizeof(err)), 0);
    tier_instance_init(t, &fake_ops, &env);
    cr_assert_eq(t->ops, &fake_ops);
    cr_assert_eq(t->env.capacity_bytes, 1);
    return t;
}

Test(tier_call, caps_default_to_the_ops_table)
{
    struct fake_tier proto = {0};
    struct umbp_tier *t = make(&proto);
    cr_assert_eq(tier_caps(t), UMBP_TIER_CAP_MAPPED | UMBP_TIER_CAP_EVICTS_LOCALLY);
    fake_destroy(t);
}

Test(tier_call, create_narrows_caps)
{
    /* an instance whose options make its regions unmapped */
    struct fake_tier proto = {.set_caps = true, .want_caps = UMBP_TIER_CAP_EVICTS_LOCALLY};
    struct umbp_tier *t = make(&proto);
    cr_assert_eq(tier_caps(t), UMBP_TIER_CAP_EVICTS_LOCALLY,
                 "the runtime replaced the caps create set");
    fake_destroy(t);
}

Test(tier_call, create_narrows_caps_to_none)
{
    struct fake_tier proto = {.set_caps = true, .want_caps = 0};
    struct umbp_tier *t = make(&proto);
    cr_assert_eq(tier_caps(t), 0);
    fake_destroy(t);
}

Test(tier_call, create_extends_caps)
{
    struct fake_tier proto = {.set_caps = true,
                              .want_caps = UMBP_TIER_CAP_MAPPED | UMBP_TIER_CAP_REMOTE};
    struct umbp_tier *t = make(&proto);
    cr_assert_eq(tier_caps(t), UMBP_TIER_CAP_MAPPED | UMBP_TIER_CAP_REMOTE);
    fake_destroy(t);
}

static void done_rc(void *arg, int rc) { *(int *)arg = rc; }

Test(tier_call, optional_members_have_defaults)
{
    struct fake_tier proto = {0};
    struct umbp_tier *t = make(&proto);
    struct umbp_region r = {0};
    int rc = 1;
    tier_read(t, &r, NULL, 0, done_rc, &rc);
    cr_assert_eq(rc, -ENOTSUP);
    rc = 1;
    tier_write(t, &r, NULL, 0, done_rc, &rc);
    cr_assert_eq(rc, -ENOTSUP);
    void *a;
    size_t len;
    cr_assert_eq(tier_mapped_memory(t, &a, &len), -ENOTSUP);
    cr_assert_eq(tier_health(t), 0);
    bool more = true;
    cr_assert_eq(tier_evict(t, 0, 0, 1, &more), 0);
    cr_assert(!more);
    void *h = (void *)1;
    cr_assert_eq(tier_mem_register(t, &len, sizeof(len), UMBP_MEM_HOST, 0, &h), -ENOTSUP);
    cr_assert_null(h);
    tier_mem_deregister(t, h); /* nothing, and no NULL slot called */
    fake_destroy(t);
}

/* ---- child tiers ------------------------------------------------------------ */

static const char *const parent_uses[] = {"loopback", NULL};
static const struct umbp_tier_ops parent_ops = {
    .name = "parent",
    .uses = parent_uses,
    .create = fake_create,
    .destroy = fake_destroy,
};

static const char *const uses_dram[] = {"dram", NULL};
static const struct umbp_tier_ops parent_of_dram_ops = {
    .name = "parent_of_dram", .uses = uses_dram, .create = fake_create, .destroy = fake_destroy,
};

static const char *const uses_missing[] = {"no_such_tier", NULL};
static const struct umbp_tier_ops parent_of_missing_ops = {
    .name = "parent_of_missing", .uses = uses_missing, .create = fake_create,
    .destroy = fake_destroy,
};

struct counts {
    int runtime_events, parent_events, parent_freed;
};

static void runtime_emit(void *ctx, umbp_event_type_t type, const umbp_key_t *key)
{
    (void)type, (void)key;
    ((struct counts *)ctx)->runtime_events++;
}

static void parent_emit(void *ctx, umbp_event_type_t type, const umbp_key_t *key)
{
    (void)key;
    if (type == UMBP_EVENT_STORED)
        ((struct counts *)ctx)->parent_events++;
}

static void parent_freed(void *ctx) { ((struct counts *)ctx)->parent_freed++; }

static struct rt_config *parse(const char *json)
{
    struct rt_config *c = NULL;
    cr_assert_eq(config_parse(json, &c), 0, "%s: %s", json, umbp_last_error());
    return c;
}

Test(tier_call, child_from_its_parsed_options_with_interposed_callbacks)
{
    /* loopback_map_one_in = 1: the child maps every region and says so in
     * its caps, which only its parsed options can have told it */
    struct rt_config *c = parse("{\"tier\": \"loopback\", \"loopback_map_one_in\": 1, "
                                "\"capacity_bytes\": \"4MiB\"}");
    char err[512] = "";
    cr_assert_eq(config_use_tiers(c, &parent_ops, err, sizeof(err)), 0, "%s", err);
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    struct counts n = {0};
    struct umbp_tier_env env = {
        .loop = loop, .core = &c->core, .capacity_bytes = c->rank_capacity,
        .emit_event = runtime_emit, .ctx = &n,
        .create_child = config_create_child, .options = c,
    };
    struct umbp_tier_env child_env = env; /* the parent's own callbacks */
    child_env.emit_event = parent_emit;
    child_env.space_freed = parent_freed;
    child_env.capacity_bytes = 1 << 20;
    struct umbp_tier *child = NULL;
    cr_assert_eq(env.create_child(&child_env, "loopback", &child, err, sizeof(err)), 0, "%s",
                 err);
    cr_assert_eq(child->ops, umbp_tier_find("loopback"));
    cr_assert(tier_caps(child) & UMBP_TIER_CAP_MAPPED, "the child's options did not reach it");
    cr_assert_eq(child->env.emit_event, parent_emit);
    cr_assert_eq(child->env.capacity_bytes, 1 << 20);
    /* a put through the child: its event goes to the parent, not the runtime */
    struct umbp_tier_req q = {.size = 4096};
    memset(q.key.bytes, 7, sizeof(q.key.bytes));
    struct umbp_tier_req *p[1] = {&q};
    int rc = 1;
    tier_reserve(child, p, 1, done_rc, &rc);
    cr_assert_eq(rc, 0);
    cr_assert_eq(q.status, 0);
    cr_assert_not_null(q.region.addr);
    memset(q.region.addr, 0x5a, 4096);
    tier_publish(child, p, 1, done_rc, &rc);
    cr_assert_eq(q.status, 0);
    cr_assert_eq(n.parent_events, 1);
    cr_assert_eq(n.runtime_events, 0, "the child reported to the runtime, past its parent");
    tier_clear(child, done_rc, &rc);
    tier_stop(child);
    child->ops->destroy(child);
    ev_loop_destroy(loop);
    config_free(c);
}

Test(tier_call, child_not_declared_in_uses_refused)
{
    struct rt_config *c = parse("{\"capacity_bytes\": \"4MiB\"}");
    char err[512] = "";
    cr_assert_eq(config_use_tiers(c, &parent_ops, err, sizeof(err)), 0, "%s", err);
    struct umbp_tier_env env = {.core = &c->core, .capacity_bytes = c->rank_capacity,
                                .create_child = config_create_child, .options = c};
    struct umbp_tier *child = (struct umbp_tier *)&env;
    cr_assert_eq(config_create_child(&env, "dram", &child, err, sizeof(err)), -EINVAL);
    cr_assert_eq(child, (struct umbp_tier *)&env, "out set on failure");
    cr_assert_not_null(strstr(err, "ops->uses"), "%s", err);
    cr_assert_not_null(strstr(err, "dram"), "%s", err);
    config_free(c);
}

Test(tier_call, every_used_tier_is_validated)
{
    /* the dram options are wrong, but no used tier reads them: accepted
     * (from the environment: given in the JSON, another tier's option is
     * refused by name, test_config) */
    setenv("UMBP_DRAM_LOW_WATERMARK", "0.95", 1);
    setenv("UMBP_DRAM_HIGH_WATERMARK", "0.9", 1);
    struct rt_config *c = parse("{\"tier\": \"loopback\"}");
    unsetenv("UMBP_DRAM_LOW_WATERMARK");
    unsetenv("UMBP_DRAM_HIGH_WATERMARK");
    cr_assert_eq(c->num_used, 1);
    cr_assert_eq(c->used[0], umbp_tier_find("loopback"));
    /* a tier whose child is dram: the child's options are checked too */
    char err[512] = "";
    int rc = config_use_tiers(c, &parent_of_dram_ops, err, sizeof(err));
    cr_assert_eq(rc, -EINVAL, "a child's invalid options were accepted");
    cr_assert_not_null(strstr(err, "dram_low_watermark"), "%s", err);
    /* a child that is not built */
    rc = config_use_tiers(c, &parent_of_missing_ops, err, sizeof(err));
    cr_assert_eq(rc, -ENOTSUP);
    cr_assert_not_null(strstr(err, "no_such_tier"), "%s", err);
    config_free(c);
}
