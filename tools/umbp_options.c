/*
 * umbp-options - prints every option (core, each built-in tier, and the
 * scheduler's lookup client, which has a table of its own) with its
 * type, default, accepted range and meaning, as a Markdown table.  The
 * tables in docs/configuration.md are this program's output, and a test
 * (test_docs) checks that each row there is exactly the row it prints.
 */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "options.h"
#include "lookup_int.h"
#include "umbp/tier.h"

static void print_table(const char *title, const struct umbp_option *opts)
{
    printf("\n### %s\n\n| option | type | default | accepted | meaning |\n|---|---|---|---|---|\n",
           title);
    for (const struct umbp_option *o = opts; o && o->name; o++) {
        char row[2048];
        umbp_option_md_row(o, row, sizeof(row));
        printf("%s\n", row);
    }
}

int main(void)
{
    print_table("core (every mode)", umbp_core_options);
    for (size_t i = 0; umbp_tier_registry[i]; i++) {
        char title[64];
        snprintf(title, sizeof(title), "tier `%s`", umbp_tier_registry[i]->name);
        print_table(title, umbp_tier_registry[i]->options);
    }
    print_table("lookup client (umbp_lookup_client_create)", lookup_client_options);
    return 0;
}
