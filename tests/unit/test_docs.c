/*
 * test_docs - docs/configuration.md must list every option that the core and
 * every built-in tier accept, the lookup client's and umbp-master's, each in
 * its own section and as umbp-options prints it (type, default, range,
 * meaning), so the page cannot drift from the option tables; and
 * docs/protocol.md must give every record the size the codec uses.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "options.h"
#include "proto.h"
#include "lookup_int.h"
#include "umbp/tier.h"

/* docs/<name>, whole (static: one page at a time). */
static char *read_page(const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/docs/%s", UMBP_SOURCE_DIR, name);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "docs/%s is missing", name);
    static char buf[1 << 18];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    cr_assert_lt(n, sizeof(buf) - 1, "docs/%s is too long for this test", name);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static char *read_doc(void) { return read_page("configuration.md"); }

/* docs/configuration.md's section under heading (up to the next "### "),
 * as a string of its own (static: one at a time). */
static const char *section(const char *doc, const char *heading)
{
    static char sec[1 << 16];
    const char *at = strstr(doc, heading);
    cr_assert_not_null(at, "docs/configuration.md has no section \"%s\"", heading);
    const char *end = strstr(at + strlen(heading), "\n### ");
    size_t n = end ? (size_t)(end - at) : strlen(at);
    cr_assert_lt(n, sizeof(sec), "section %s is too long for this test", heading);
    memcpy(sec, at, n);
    sec[n] = 0;
    return sec;
}

/* Each option's row in sec is the row umbp-options prints (type, default,
 * accepted values, meaning), the meaning optionally followed by more text
 * of the page's own (links, measurements). */
static void check_table(const char *sec, const struct umbp_option *opts)
{
    for (const struct umbp_option *o = opts; o && o->name; o++) {
        char name[160];
        snprintf(name, sizeof(name), "| `%s` | ", o->name);
        const char *at = strstr(sec, name);
        cr_expect_not_null(at, "docs/configuration.md has no row for option %s", o->name);
        if (!at)
            continue;
        char row[2048];
        umbp_option_md_row(o, row, sizeof(row));
        size_t n = strlen(row) - 2; /* without the closing " |": the page may add */
        const char *eol = strchr(at, '\n');
        size_t have = eol ? (size_t)(eol - at) : strlen(at);
        cr_expect(have >= n && strncmp(at, row, n) == 0,
                  "docs/configuration.md: the row of %s is not what umbp-options prints "
                  "(regenerate it):\n  page: %.*s\n  code: %s", o->name, (int)have, at, row);
    }
}

Test(docs, configuration_lists_every_option)
{
    const char *doc = read_doc();
    check_table(section(doc, "### core (every mode)"), umbp_core_options);
    for (size_t i = 0; umbp_tier_registry[i]; i++) {
        char heading[64];
        snprintf(heading, sizeof(heading), "### tier `%s`", umbp_tier_registry[i]->name);
        check_table(section(doc, heading), umbp_tier_registry[i]->options);
    }
}

/* The lookup client's table is its own (some names are the runtime's too,
 * with other defaults): its rows are looked for in its own section. */
Test(docs, configuration_lists_the_lookup_client_options)
{
    const char *doc = read_doc();
    check_table(section(doc, "### lookup client (umbp_lookup_client_create)"),
                lookup_client_options);
}

/* umbp-master's table (master/master_config.c, compiled into this test):
 * its rows are looked for in its own section. */
extern const struct umbp_option master_options[];

Test(docs, configuration_lists_the_master_options)
{
    const char *doc = read_doc();
    check_table(section(doc, "### umbp-master ("), master_options);
}

/* docs/protocol.md names each record with its size, "name (N)": the sizes
 * net/proto.h encodes and decodes. */
Test(docs, protocol_gives_every_record_its_size)
{
    const char *doc = read_page("protocol.md");
    static const struct { const char *name; size_t size; } recs[] = {
        {"hello", PROTO_HELLO_SIZE},          {"welcome", PROTO_WELCOME_SIZE},
        {"reserve item", PROTO_RESERVE_ITEM_SIZE}, {"token item", PROTO_TOKEN_ITEM_SIZE},
        {"rename item", PROTO_RENAME_ITEM_SIZE}, {"region item", PROTO_REGION_ITEM_SIZE},
        {"event item", PROTO_EVENT_ITEM_SIZE}, {"error", PROTO_ERROR_SIZE},
        {"stats", PROTO_STATS_SIZE},          {"session item", PROTO_SESSION_ITEM_SIZE},
        {"auth", PROTO_AUTH_SIZE},            {"register", PROTO_REGISTER_SIZE},
        {"node event", PROTO_NODE_EVENT_SIZE}, {"ack", PROTO_ACK_SIZE},
        {"location", PROTO_LOCATION_SIZE},    {"node info", PROTO_NODE_INFO_SIZE},
    };
    for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++) {
        char want[64];
        snprintf(want, sizeof(want), "| %s (%zu)", recs[i].name, recs[i].size);
        char alt[64]; /* "| auth (64): ..." and the record lists "**name** (N)" */
        snprintf(alt, sizeof(alt), "**%s** (%zu)", recs[i].name, recs[i].size);
        cr_expect(strstr(doc, want) || strstr(doc, alt),
                  "docs/protocol.md does not give record \"%s\" its size %zu", recs[i].name,
                  recs[i].size);
        /* and no other size for it */
        char other[64];
        snprintf(other, sizeof(other), "| %s (", recs[i].name);
        for (const char *at = strstr(doc, other); at; at = strstr(at + 1, other)) {
            size_t got = strtoull(at + strlen(other), NULL, 10);
            cr_expect_eq(got, recs[i].size, "docs/protocol.md gives record \"%s\" %zu bytes; "
                         "net/proto.h: %zu", recs[i].name, got, recs[i].size);
        }
    }
}
