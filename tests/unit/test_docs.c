/*
 * test_docs - docs/configuration.md must list every option that the core and
 * every built-in tier accept, and the lookup client's, with its default, so
 * the page cannot drift from the option tables.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "lookup_int.h"
#include "umbp/tier.h"

static char *read_doc(void)
{
    FILE *f = fopen(UMBP_SOURCE_DIR "/docs/configuration.md", "r");
    cr_assert_not_null(f, "docs/configuration.md is missing");
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void check_table(const char *doc, const struct umbp_option *opts)
{
    for (const struct umbp_option *o = opts; o && o->name; o++) {
        char row[160];
        snprintf(row, sizeof(row), "| `%s` | ", o->name);
        const char *at = strstr(doc, row);
        cr_expect_not_null(at, "docs/configuration.md has no row for option %s", o->name);
        if (!at)
            continue;
        char def[96];
        snprintf(def, sizeof(def), "`%s`", o->def[0] ? o->def : "\"\"");
        const char *eol = strchr(at, '\n');
        const char *d = strstr(at, def);
        cr_expect(d && d < eol, "docs/configuration.md: option %s should show default %s",
                  o->name, def);
    }
}

Test(docs, configuration_lists_every_option)
{
    const char *doc = read_doc();
    check_table(doc, umbp_core_options);
    for (size_t i = 0; umbp_tier_registry[i]; i++)
        check_table(doc, umbp_tier_registry[i]->options);
}

/* The lookup client's table is its own (some names are the runtime's too,
 * with other defaults): its rows are looked for in its own section. */
Test(docs, configuration_lists_the_lookup_client_options)
{
    const char *doc = read_doc();
    const char *sec = strstr(doc, "### lookup client (umbp_lookup_client_create)");
    cr_assert_not_null(sec, "docs/configuration.md has no lookup client section");
    check_table(sec, lookup_client_options);
}

/* umbp-master's table (master/master_config.c, compiled into this test):
 * its rows are looked for in its own section. */
extern const struct umbp_option master_options[];

Test(docs, configuration_lists_the_master_options)
{
    const char *doc = read_doc();
    const char *sec = strstr(doc, "### umbp-master (");
    cr_assert_not_null(sec, "docs/configuration.md has no umbp-master section");
    check_table(sec, master_options);
}
