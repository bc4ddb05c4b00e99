/*
 * lookup_path.c - where a rank's lookup service listens.
 *
 * The path is {dir}/umbp-lk-{24 hex}.sock: the hex digits are the first 12
 * bytes of XXH3-128 over (namespace, lookup_instance, dp index, rank), so
 * engines of different models, instances and DP ranks on one host never
 * meet, and the name fits sun_path whatever the namespace.  A file name
 * needs no cryptographic hash; keys themselves are derived elsewhere.
 *
 * Stateless; any thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "listen.h"
#include "lookup_int.h"
#include "util.h"

void lookup_default_dir(char *out, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && xdg[0] == '/')
        snprintf(out, len, "%s%sumbp", xdg, xdg[strlen(xdg) - 1] == '/' ? "" : "/");
    else
        snprintf(out, len, "/tmp/umbp-%u", (unsigned)geteuid());
}

static bool is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int lookup_check_ns(const char *s, const char *what, char *err, size_t errlen)
{
    size_t n = s ? strlen(s) : 0;
    bool ok = n == UMBP_LOOKUP_NS_HEX_LEN;
    for (size_t i = 0; ok && i < n; i++)
        ok = is_hex(s[i]);
    if (!ok) {
        snprintf(err, errlen, "%s: must be %d hex digits (the engine's namespace digest), "
                 "got '%.80s'", what, UMBP_LOOKUP_NS_HEX_LEN, s ? s : "(null)");
        return -EINVAL;
    }
    return 0;
}

int lookup_check_instance(const char *s, char *err, size_t errlen)
{
    if (strlen(s) > UMBP_LOOKUP_INSTANCE_MAX) {
        snprintf(err, errlen, "lookup_instance: longer than %d characters ('%.80s')",
                 UMBP_LOOKUP_INSTANCE_MAX, s);
        return -EINVAL;
    }
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-')) {
            snprintf(err, errlen, "lookup_instance=%s: only letters, digits, '.', '_' and '-' "
                     "may appear", s);
            return -EINVAL;
        }
    return 0;
}

int lookup_socket_path(const char *dir, const char *ns_hex, const char *instance,
                       uint32_t dp_index, uint32_t rank, char *buf, size_t len, char *err,
                       size_t errlen)
{
    char def[LK_PATH_MAX], path[LK_PATH_MAX], in[UMBP_LOOKUP_NS_HEX_LEN + 1 + 32 + 24];
    int rc;

    if (!buf || !len) {
        snprintf(err, errlen, "umbp_lookup_socket_path: buf must not be NULL");
        return -EINVAL;
    }
    if (!instance)
        instance = "";
    if ((rc = lookup_check_ns(ns_hex, "namespace", err, errlen)) < 0 ||
        (rc = lookup_check_instance(instance, err, errlen)) < 0)
        return rc;
    if (!dir || !dir[0]) {
        lookup_default_dir(def, sizeof(def));
        dir = def;
    }
    if (dir[0] != '/') {
        snprintf(err, errlen, "lookup_dir=%.200s: must be an absolute path", dir);
        return -EINVAL;
    }
    /* ns (lower case) \0 instance \0 dp \0 rank */
    size_t k = 0;
    for (size_t i = 0; i < UMBP_LOOKUP_NS_HEX_LEN; i++)
        in[k++] = (char)(ns_hex[i] >= 'A' && ns_hex[i] <= 'F' ? ns_hex[i] - 'A' + 'a' : ns_hex[i]);
    in[k++] = '\0';
    k += (size_t)snprintf(in + k, sizeof(in) - k, "%s", instance) + 1;
    k += (size_t)snprintf(in + k, sizeof(in) - k, "%u", (unsigned)dp_index) + 1;
    k += (size_t)snprintf(in + k, sizeof(in) - k, "%u", (unsigned)rank);
    XXH128_canonical_t h;
    XXH128_canonicalFromHash(&h, XXH3_128bits(in, k));
    char hex[25];
    for (int i = 0; i < 12; i++)
        snprintf(hex + 2 * i, 3, "%02x", h.digest[i]);
    const char *sep = dir[strlen(dir) - 1] == '/' ? "" : "/";
    int n = snprintf(path, sizeof(path), "%s%sumbp-lk-%s.sock", dir, sep, hex);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        snprintf(err, errlen, "lookup socket path %.200s%sumbp-lk-%s.sock: %d bytes, over the "
                 "%zu a Unix socket address holds; shorten lookup_dir", dir, sep, hex, n,
                 sizeof(path) - 1);
        return -ENAMETOOLONG;
    }
    if ((size_t)n >= len) {
        snprintf(err, errlen, "lookup socket path %s: %d bytes, the buffer holds %zu", path, n,
                 len - 1);
        return -ERANGE;
    }
    memcpy(buf, path, (size_t)n + 1);
    return 0;
}

int umbp_lookup_socket_path(const char *dir, const char *ns_hex, const char *instance,
                            uint32_t dp_index, uint32_t rank, char *buf, size_t len)
{
    char err[512];
    int rc = lookup_socket_path(dir, ns_hex, instance, dp_index, rank, buf, len, err,
                                sizeof(err));
    if (rc < 0)
        umbp_set_error("%s", err);
    return rc;
}

/* The rules are net/listen.c's (ownership and mode only for the default
 * directory: one given is the operator's choice); the words are ours. */
int lookup_dir_prepare(const char *dir, bool is_default, const char *what, char *err,
                       size_t errlen)
{
    struct net_dir_rules rules = {
        .mode = 0700, .follow_links = !is_default, .check_owner = is_default,
        .deny_write = is_default ? 0002 : 0,
    };
    struct net_dir_result r;
    net_dir_prepare(dir, &rules, &r);
    switch (r.outcome) {
    case NET_DIR_OK:
        return 0;
    case NET_DIR_MKDIR_FAILED:
        snprintf(err, errlen, "%s=%s: cannot create it (mkdir: %s); create its parent, or "
                 "choose another %s", what, dir, strerror(r.err), what);
        return -r.err;
    case NET_DIR_STAT_FAILED:
        snprintf(err, errlen, "%s=%s: %s", what, dir, strerror(r.err));
        return -r.err;
    case NET_DIR_NOT_DIR:
        snprintf(err, errlen, "%s=%s: not a directory; remove it, or choose another %s", what,
                 dir, what);
        return -ENOTDIR;
    case NET_DIR_NOT_OWNER:
    case NET_DIR_WRITABLE:
        snprintf(err, errlen, "%s=%s (the default): %s, so another user could plant sockets "
                 "in it; remove it, or set %s to a directory of your own", what, dir,
                 r.outcome == NET_DIR_NOT_OWNER ? "owned by another user" : "writable by others",
                 what);
        return -EPERM;
    case NET_DIR_CHOWN_FAILED: /* not asked for: no share_group */
    case NET_DIR_CHMOD_FAILED:
        break;
    }
    snprintf(err, errlen, "%s=%s: %s", what, dir, strerror(r.err));
    return -r.err;
}
