/*
 * test_tier_call.c - how the runtime sees a tier instance (runtime/
 * tier_call.h): its capabilities are the instance's, set from the ops
 * table's static caps at creation unless the tier's create set its own
 * (umbp_tier_set_caps), and every optional member has its default.
 *
 * Fake tiers declared here: the runtime code under test never sees a tier's
 * name, only the ops table and the instance.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

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
