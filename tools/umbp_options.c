/*
 * umbp-options - prints every option (core, each built-in tier, and the
 * scheduler's lookup client, which has a table of its own) with its
 * type, default, accepted range and meaning, as a Markdown table.  The
 * tables in docs/configuration.md are this program's output, and a test
 * checks that every option appears there.
 */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "lookup_int.h"
#include "umbp/tier.h"

static const char *type_name(enum umbp_opt_type t)
{
    switch (t) {
    case UMBP_OPT_BOOL: return "bool";
    case UMBP_OPT_INT: return "integer";
    case UMBP_OPT_SIZE: return "size";
    case UMBP_OPT_DOUBLE: return "number";
    case UMBP_OPT_STRING: return "string";
    }
    return "?";
}

static void print_size(double v)
{
    static const char *const units[] = {"", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (v >= 1024 && u < 5 && (unsigned long long)v % 1024 == 0)
        v /= 1024, u++;
    printf("%.0f%s", v, units[u]);
}

static void print_range(const struct umbp_option *o)
{
    switch (o->type) {
    case UMBP_OPT_BOOL: printf("true, false"); break;
    case UMBP_OPT_SIZE:
        print_size(o->min);
        printf(" .. ");
        print_size(o->max);
        break;
    case UMBP_OPT_INT:
    case UMBP_OPT_DOUBLE: printf("%g .. %g", o->min, o->max); break;
    case UMBP_OPT_STRING:
        if (!o->choices) {
            printf("up to %zu characters", o->str_cap - 1);
            break;
        }
        for (size_t i = 0; o->choices[i]; i++)
            printf("%s`%s`", i ? ", " : "", o->choices[i]);
        break;
    }
}

static void print_table(const char *title, const struct umbp_option *opts)
{
    printf("\n### %s\n\n| option | type | default | accepted | meaning |\n|---|---|---|---|---|\n",
           title);
    for (const struct umbp_option *o = opts; o && o->name; o++) {
        printf("| `%s` | %s | `%s` | ", o->name, type_name(o->type), o->def[0] ? o->def : "\"\"");
        print_range(o);
        printf(" | %s |\n", o->help);
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
