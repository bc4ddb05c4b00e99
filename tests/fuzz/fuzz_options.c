/*
 * fuzz_options.c - the reader of a config (common/options.c): the JSON an
 * engine, umbp-server or the umbp tool is given (a file, --json, a
 * connector's kv_connector_extra_config) and UMBP_<OPTION> environment
 * variables, parsed into the core's option table.
 *
 * Input: JSON text, then optionally a NUL and one environment assignment
 * NAME=VALUE (set for this parse only).  Properties, each an abort() when
 * broken:
 *   - the reader answers 0 or a negative code with a message;
 *   - an accepted config has every integer, size and number within its
 *     option's bounds, every string NUL-terminated within its array and
 *     one of its choices where it has them;
 *   - the same input parses the same way twice (no state kept).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "options.h"

static void check_accepted(const struct umbp_core_config *c)
{
    for (const struct umbp_option *o = umbp_core_options; o->name; o++) {
        const char *p = (const char *)c + o->offset;
        double v;
        switch (o->type) {
        case UMBP_OPT_BOOL: continue;
        case UMBP_OPT_INT: v = (double)*(const int64_t *)p; break;
        case UMBP_OPT_SIZE: v = (double)*(const uint64_t *)p; break;
        case UMBP_OPT_DOUBLE: v = *(const double *)p; break;
        case UMBP_OPT_STRING: {
            size_t n = strnlen(p, o->str_cap);
            FZ_CHECK(n < o->str_cap);
            if (o->choices) {
                bool one = false;
                for (size_t i = 0; o->choices[i]; i++)
                    one |= !strcmp(p, o->choices[i]);
                FZ_CHECK(one);
            }
            continue;
        }
        default: FZ_CHECK(0);
        }
        FZ_CHECK(v >= o->min && v <= o->max);
    }
}

static int parse(const char *json, struct umbp_core_config *c, char *err, size_t errlen)
{
    memset(c, 0xa5, sizeof(*c));
    struct umbp_opt_table t = {umbp_core_options, c, "core"};
    err[0] = 0;
    return umbp_options_apply(&t, 1, json, err, errlen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16)
        return 0;
    char *in = malloc(size + 2);
    FZ_CHECK(in);
    memcpy(in, data, size);
    in[size] = in[size + 1] = 0;
    const char *json = in, *env = in + strlen(in) + 1; /* "" when no NUL */
    char name[128] = "";
    const char *eq = env < in + size ? strchr(env, '=') : NULL;
    if (eq && eq > env && (size_t)(eq - env) < sizeof(name) && !memchr(env, ' ', eq - env)) {
        memcpy(name, env, (size_t)(eq - env));
        name[eq - env] = 0;
        setenv(name, eq + 1, 1);
    }
    struct umbp_core_config a, b;
    char ea[512], eb[512];
    int ra = parse(json, &a, ea, sizeof(ea));
    int rb = parse(json, &b, eb, sizeof(eb));
    if (name[0])
        unsetenv(name);
    FZ_CHECK(ra == rb);
    if (ra < 0) {
        FZ_CHECK(ea[0] != 0);
        FZ_CHECK(!strcmp(ea, eb));
    } else {
        FZ_CHECK(ra == 0);
        check_accepted(&a);
    }
    free(in);
    return 0;
}
