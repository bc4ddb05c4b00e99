/*
 * fuzz_ucx_tls.c - the reader of a UCX transport list (net/ucx_tls.c), which
 * gets UCX_TLS from the process's environment: bytes its operator wrote,
 * read by every node at start.
 *
 * Input: the list's bytes (up to the first NUL, as getenv returns them).
 * Properties, each an abort() when broken:
 *   - both answers equal those of a model written here without strtok:
 *     split the first 255 bytes (after a leading '^' for names_tcp) at
 *     commas, skip empty names; names_tcp: a name "tcp" or "all", inverted
 *     by '^'; tcp_only: no '^', every name "tcp" or "self", and one "tcp";
 *   - tcp_only implies names_tcp;
 *   - neither call changes the caller's string.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "ucx_tls.h"

#define READ_MAX 255 /* what ucx_tls.c reads of a list */

/* calls fn(name, len, arg) for each non-empty comma-separated name in
 * s[0, n); stops when it returns false */
static void each_name(const char *s, size_t n, bool (*fn)(const char *, size_t, void *), void *arg)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] != ',')
            j++;
        if (j > i && !fn(s + i, j - i, arg))
            return;
        i = j + 1;
    }
}

static bool is(const char *t, size_t len, const char *name)
{
    return len == strlen(name) && !memcmp(t, name, len);
}

static bool note_tcp_or_all(const char *t, size_t len, void *arg)
{
    if (is(t, len, "tcp") || is(t, len, "all"))
        *(bool *)arg = true;
    return true;
}

struct only {
    bool tcp, other;
};

static bool note_only(const char *t, size_t len, void *arg)
{
    struct only *o = arg;
    if (is(t, len, "tcp"))
        o->tcp = true;
    else if (!is(t, len, "self"))
        o->other = true;
    return !o->other;
}

static bool model_names_tcp(const char *s)
{
    bool except = s[0] == '^';
    const char *list = s + except;
    size_t n = strnlen(list, READ_MAX);
    bool named = false;
    each_name(list, n, note_tcp_or_all, &named);
    return except ? !named : named;
}

static bool model_tcp_only(const char *s)
{
    if (s[0] == '^')
        return false;
    struct only o = {false, false};
    each_name(s, strnlen(s, READ_MAX), note_only, &o);
    return o.tcp && !o.other;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1), *copy = malloc(size + 1);
    if (s == NULL || copy == NULL) {
        free(s);
        free(copy);
        return 0;
    }
    memcpy(s, data, size);
    s[size] = '\0';
    memcpy(copy, s, size + 1);

    bool names = ucx_tls_names_tcp(s);
    bool only = ucx_tls_tcp_only(s);
    FZ_CHECK(memcmp(s, copy, size + 1) == 0);
    FZ_CHECK(names == model_names_tcp(s));
    FZ_CHECK(only == model_tcp_only(s));
    FZ_CHECK(!only || names);
    free(s);
    free(copy);
    return 0;
}
