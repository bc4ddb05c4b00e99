/*
 * options.c - option tables (struct umbp_option) and their parsing, shared by
 * the runtime (runtime/config.c), umbp-server and the umbp tool.
 *
 * Defaults are written as text and parsed by the same code as user input, so
 * a default can never bypass validation.  The JSON (parsed with json-c) is
 * applied first, then UMBP_<NAME> environment variables override it.
 * Unknown names are refused so typos surface; a name declared by two tables
 * is refused too (it would otherwise silently set the first one only).
 * Stateless; any thread.
 */
#include <ctype.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

/* ---- sizes -------------------------------------------------------------- */

int parse_size(const char *s, uint64_t *out)
{
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s))
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -ERANGE;
    while (isspace((unsigned char)*end))
        end++;
    static const struct { const char *suffix; unsigned shift; } units[] = {
        {"", 0},      {"b", 0},      {"k", 10},  {"kb", 10}, {"kib", 10}, {"m", 20},
        {"mb", 20},   {"mib", 20},   {"g", 30},  {"gb", 30}, {"gib", 30}, {"t", 40},
        {"tb", 40},   {"tib", 40},
    };
    char unit[8] = {0};
    size_t ul = strlen(end);
    while (ul && isspace((unsigned char)end[ul - 1]))
        ul--;
    if (ul >= sizeof(unit))
        return -EINVAL;
    for (size_t i = 0; i < ul; i++)
        unit[i] = (char)tolower((unsigned char)end[i]);
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(unit, units[i].suffix) == 0) {
            if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
                return -ERANGE;
            *out = (uint64_t)v << units[i].shift;
            return 0;
        }
    }
    return -EINVAL;
}

/* ---- one option ----------------------------------------------------------- */

static int check_bounds(const struct umbp_option *o, double v, char *err, size_t errlen)
{
    if (isnan(v) || v < o->min || v > o->max) {
        if (o->type == UMBP_OPT_DOUBLE)
            snprintf(err, errlen, "%s: must be between %g and %g, got %g", o->name, o->min,
                     o->max, v);
        else /* integers print exactly */
            snprintf(err, errlen, "%s: must be between %.0f and %.0f, got %.0f", o->name,
                     o->min, o->max, v);
        return -EINVAL;
    }
    return 0;
}

static int parse_bool_text(const char *t, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(t, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(t, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -EINVAL;
}

static int set_string(const struct umbp_option *o, const char *t, void *base, char *err,
                      size_t errlen)
{
    if (strlen(t) >= o->str_cap) {
        snprintf(err, errlen, "%s: longer than %zu characters", o->name, o->str_cap - 1);
        return -EINVAL;
    }
    if (o->choices) {
        bool ok = false;
        for (size_t i = 0; o->choices[i]; i++)
            ok = ok || strcmp(o->choices[i], t) == 0;
        if (!ok) {
            char list[256] = "";
            for (size_t i = 0; o->choices[i]; i++) {
                if (i)
                    strncat(list, ", ", sizeof(list) - strlen(list) - 1);
                strncat(list, o->choices[i], sizeof(list) - strlen(list) - 1);
            }
            snprintf(err, errlen, "%s: must be one of %s, got '%s'", o->name, list, t);
            return -EINVAL;
        }
    }
    memcpy((char *)base + o->offset, t, strlen(t) + 1);
    return 0;
}

int option_parse_text(const struct umbp_option *o, const char *t, void *base, char *err,
                      size_t errlen)
{
    void *dst = (char *)base + o->offset;
    char *end;
    switch (o->type) {
    case UMBP_OPT_BOOL:
        if (parse_bool_text(t, (bool *)dst) < 0) {
            snprintf(err, errlen, "%s: must be true or false, got '%s'", o->name, t);
            return -EINVAL;
        }
        return 0;
    case UMBP_OPT_INT: {
        errno = 0;
        long long v = strtoll(t, &end, 10);
        if (errno || end == t || *end) {
            snprintf(err, errlen, "%s: must be an integer, got '%s'", o->name, t);
            return -EINVAL;
        }
        if (check_bounds(o, (double)v, err, errlen) < 0)
            return -EINVAL;
        *(int64_t *)dst = v;
        return 0;
    }
    case UMBP_OPT_SIZE: {
        uint64_t v;
        if (parse_size(t, &v) < 0) {
            snprintf(err, errlen,
                     "%s: must be a byte count such as 1073741824, \"512MiB\" or \"4GiB\", got '%s'",
                     o->name, t);
            return -EINVAL;
        }
        if (check_bounds(o, (double)v, err, errlen) < 0)
            return -EINVAL;
        *(uint64_t *)dst = v;
        return 0;
    }
    case UMBP_OPT_DOUBLE: {
        errno = 0;
        double v = strtod(t, &end);
        if (errno || end == t || *end) {
            snprintf(err, errlen, "%s: must be a number, got '%s'", o->name, t);
            return -EINVAL;
        }
        if (check_bounds(o, v, err, errlen) < 0)
            return -EINVAL;
        *(double *)dst = v;
        return 0;
    }
    case UMBP_OPT_STRING:
        return set_string(o, t, base, err, errlen);
    }
    return -EINVAL;
}

static const char *json_type_word(json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double: return "a number";
    case json_type_int: return "an integer";
    case json_type_object: return "an object";
    case json_type_array: return "an array";
    case json_type_string: return "a string";
    }
    return "?";
}

/* A JSON string with a NUL inside (\u0000): C would see only what precedes
 * it ("/run/umbp\u0000/../x" as "/run/umbp"), so it is refused. */
static bool has_nul(json_object *v, const struct umbp_option *o, char *err, size_t errlen)
{
    const char *t = json_object_get_string(v);
    if (strlen(t) == (size_t)json_object_get_string_len(v))
        return false;
    snprintf(err, errlen, "%s: the string holds a NUL byte (\\u0000) after \"%.64s\"; remove "
             "it", o->name, t);
    return true;
}

static int option_parse_json(const struct umbp_option *o, json_object *v, void *base,
                             char *err, size_t errlen)
{
    enum json_type jt = json_object_get_type(v);
    char text[64];
    switch (o->type) {
    case UMBP_OPT_BOOL:
        if (jt != json_type_boolean)
            goto wrong;
        *(bool *)((char *)base + o->offset) = json_object_get_boolean(v);
        return 0;
    case UMBP_OPT_INT:
        if (jt != json_type_int)
            goto wrong;
        snprintf(text, sizeof(text), "%lld", (long long)json_object_get_int64(v));
        if (json_object_get_int64(v) == INT64_MAX || json_object_get_int64(v) == INT64_MIN) {
            snprintf(err, errlen, "%s: integer out of range", o->name);
            return -EINVAL;
        }
        return option_parse_text(o, text, base, err, errlen);
    case UMBP_OPT_SIZE:
        if (jt == json_type_string)
            return has_nul(v, o, err, errlen)
                       ? -EINVAL
                       : option_parse_text(o, json_object_get_string(v), base, err, errlen);
        if (jt != json_type_int || json_object_get_int64(v) < 0)
            goto wrong;
        snprintf(text, sizeof(text), "%lld", (long long)json_object_get_int64(v));
        return option_parse_text(o, text, base, err, errlen);
    case UMBP_OPT_DOUBLE:
        if (jt != json_type_double && jt != json_type_int)
            goto wrong;
        snprintf(text, sizeof(text), "%.17g", json_object_get_double(v));
        return option_parse_text(o, text, base, err, errlen);
    case UMBP_OPT_STRING:
        if (jt != json_type_string)
            goto wrong;
        if (has_nul(v, o, err, errlen))
            return -EINVAL;
        return option_parse_text(o, json_object_get_string(v), base, err, errlen);
    }
wrong:
    snprintf(err, errlen, "%s: expected %s, got %s", o->name,
             o->type == UMBP_OPT_BOOL     ? "true or false"
             : o->type == UMBP_OPT_INT    ? "an integer"
             : o->type == UMBP_OPT_SIZE   ? "a non-negative integer or a size string like \"4GiB\""
             : o->type == UMBP_OPT_DOUBLE ? "a number"
                                          : "a string",
             json_type_word(v));
    return -EINVAL;
}

/* ---- tables --------------------------------------------------------------- */

static const struct umbp_option *find_option(const struct umbp_opt_table *t, size_t nt, const char *name,
                                             void **base)
{
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++)
            if (strcmp(o->name, name) == 0) {
                *base = t[i].base;
                return o;
            }
    return NULL;
}

/* Edit distance of a and b (at most 63 bytes each are compared). */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strnlen(a, 63), lb = strnlen(b, 63);
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *umbp_options_closest(const struct umbp_opt_table *t, size_t nt, const char *key)
{
    const char *best = NULL;
    size_t bd = (size_t)-1, len = strlen(key);
    size_t limit = len / 3 > 2 ? len / 3 : 2; /* a typo or two, more for long names */
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++) {
            size_t d = edit_distance(key, o->name);
            if (d < bd) {
                bd = d;
                best = o->name;
            }
        }
    return bd <= limit ? best : NULL;
}

void umbp_options_unknown(const struct umbp_opt_table *t, size_t nt, const char *key, char *err,
                          size_t errlen)
{
    const char *close = umbp_options_closest(t, nt, key);
    if (close)
        snprintf(err, errlen, "unknown option '%s' (did you mean '%s'? see docs/configuration.md)",
                 key, close);
    else
        snprintf(err, errlen, "unknown option '%s' (see docs/configuration.md)", key);
}

static int apply_defaults(const struct umbp_opt_table *t, size_t nt, char *err, size_t errlen)
{
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++)
            if (option_parse_text(o, o->def, t[i].base, err, errlen) < 0)
                return -EINVAL; /* a bad default is our bug; still refuse */
    return 0;
}

static int apply_json(const char *json, const struct umbp_opt_table *t, size_t nt, char *err, size_t errlen)
{
    if (!json || !*json)
        return 0;
    json_tokener *tok = json_tokener_new();
    if (!tok) {
        snprintf(err, errlen, "out of memory parsing the config");
        return -ENOMEM;
    }
    size_t len = strlen(json);
    /* len + 1: the terminating NUL tells json-c the input ends (a bare
     * number would otherwise wait for more digits) */
    json_object *root = json_tokener_parse_ex(tok, json, (int)len + 1);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (used > len)
        used = len;
    if (!root && jerr == json_tokener_success) {
        snprintf(err, errlen, "config must be a JSON object, got null");
        return -EINVAL;
    }
    if (!root || jerr != json_tokener_success) {
        snprintf(err, errlen, "config is not valid JSON: %s",
                 json_tokener_error_desc(root ? jerr : (jerr == json_tokener_continue
                                                            ? json_tokener_error_parse_eof
                                                            : jerr)));
        json_object_put(root);
        return -EINVAL;
    }
    while (used < len && isspace((unsigned char)json[used]))
        used++;
    int rc = 0;
    if (used != len) {
        snprintf(err, errlen, "config: unexpected text after the JSON object at byte %zu", used);
        rc = -EINVAL;
        goto out;
    }
    if (!json_object_is_type(root, json_type_object)) {
        snprintf(err, errlen, "config must be a JSON object, got %s", json_type_word(root));
        rc = -EINVAL;
        goto out;
    }
    json_object_object_foreach(root, key, val) {
        void *base;
        const struct umbp_option *o = find_option(t, nt, key, &base);
        if (!o) {
            umbp_options_unknown(t, nt, key, err, errlen);
            rc = -EINVAL;
            goto out;
        }
        if ((rc = option_parse_json(o, val, base, err, errlen)) < 0)
            goto out;
    }
out:
    json_object_put(root);
    return rc;
}

static int apply_env(const struct umbp_opt_table *t, size_t nt, char *err, size_t errlen)
{
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++) {
            char var[96] = "UMBP_";
            for (size_t k = 0; o->name[k] && k + 6 < sizeof(var); k++)
                var[5 + k] = (char)toupper((unsigned char)o->name[k]);
            const char *v = getenv(var);
            if (!v)
                continue;
            char sub[400];
            if (option_parse_text(o, v, t[i].base, sub, sizeof(sub)) < 0) {
                snprintf(err, errlen, "%s (from environment %s)", sub, var);
                return -EINVAL;
            }
        }
    return 0;
}


static int check_unique(const struct umbp_opt_table *t, size_t nt, char *err, size_t errlen)
{
    for (size_t i = 0; i < nt; i++)
        for (const struct umbp_option *o = t[i].opts; o->name; o++)
            for (size_t j = i; j < nt; j++)
                for (const struct umbp_option *p = j == i ? o + 1 : t[j].opts; p->name; p++)
                    if (strcmp(o->name, p->name) == 0) {
                        snprintf(err, errlen, "option '%s' is declared by two option tables "
                                 "(%s and %s); rename one", o->name,
                                 t[i].owner ? t[i].owner : "?", t[j].owner ? t[j].owner : "?");
                        return -EINVAL;
                    }
    return 0;
}

int umbp_options_apply(const struct umbp_opt_table *t, size_t nt, const char *json, char *err,
                       size_t errlen)
{
    int rc;
    if ((rc = check_unique(t, nt, err, errlen)) < 0 ||
        (rc = apply_defaults(t, nt, err, errlen)) < 0 ||
        (rc = apply_json(json, t, nt, err, errlen)) < 0 ||
        (rc = apply_env(t, nt, err, errlen)) < 0)
        return rc;
    return 0;
}

char *umbp_config_file_read(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(UMBP_CONFIG_FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, UMBP_CONFIG_FILE_MAX + 1, f) : 0;
    bool bad = !buf || ferror(f) || n > UMBP_CONFIG_FILE_MAX;
    fclose(f);
    if (bad) {
        snprintf(err, errlen, "%s: %s", path,
                 n > UMBP_CONFIG_FILE_MAX ? "larger than 1 MiB" : "cannot read it");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* ---- the documentation's rows (umbp-options, test_docs) ------------------ */

static const char *md_type(enum umbp_opt_type t)
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

/* A size with the largest binary unit that divides it. */
static int md_size(char *b, size_t len, double v)
{
    static const char *const units[] = {"", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (v >= 1024 && u < 5 && (unsigned long long)v % 1024 == 0)
        v /= 1024, u++;
    return snprintf(b, len, "%.0f%s", v, units[u]);
}

/* Integers exactly (%g printed 1.04858e+06 for 1048576); numbers as %g. */
static int md_num(char *b, size_t len, enum umbp_opt_type t, double v)
{
    return t == UMBP_OPT_INT ? snprintf(b, len, "%.0f", v) : snprintf(b, len, "%g", v);
}

int umbp_option_md_row(const struct umbp_option *o, char *buf, size_t len)
{
    char acc[512] = "", lo[48], hi[48];
    size_t n = 0;
    switch (o->type) {
    case UMBP_OPT_BOOL: snprintf(acc, sizeof(acc), "true, false"); break;
    case UMBP_OPT_SIZE:
        md_size(lo, sizeof(lo), o->min);
        md_size(hi, sizeof(hi), o->max);
        snprintf(acc, sizeof(acc), "%s .. %s", lo, hi);
        break;
    case UMBP_OPT_INT:
    case UMBP_OPT_DOUBLE:
        md_num(lo, sizeof(lo), o->type, o->min);
        md_num(hi, sizeof(hi), o->type, o->max);
        snprintf(acc, sizeof(acc), "%s .. %s", lo, hi);
        break;
    case UMBP_OPT_STRING:
        if (!o->choices) {
            snprintf(acc, sizeof(acc), "up to %zu characters", o->str_cap - 1);
            break;
        }
        for (size_t i = 0; o->choices[i] && n < sizeof(acc); i++) {
            int w = snprintf(acc + n, sizeof(acc) - n, "%s`%s`", i ? ", " : "", o->choices[i]);
            n += w > 0 ? (size_t)w : 0;
        }
        break;
    }
    return snprintf(buf, len, "| `%s` | %s | `%s` | %s | %s |", o->name, md_type(o->type),
                    o->def[0] ? o->def : "\"\"", acc, o->help);
}
