/*
 * leader_lease.c - the store-independent half of the leader lease
 * (leader_lease.h): the
 * store URL, the leader value "<epoch> <address> <owner>" both ways, and
 * the dispatch to a store's ops (leader_lease_int.h).  Errors are prefixed with
 * the store's URL here, once, so every message names which store failed.
 *
 * Threads: stateless but for struct lease, one caller at a time.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "leader_lease_int.h"

#define EPOCH_MAX (1ull << 53) /* exact in the store's Lua numbers */

int lease_is_url(const char *s) { return s && strstr(s, "://") != NULL; }

static int cluster_ok(const char *c, size_t n)
{
    if (n == 0 || n >= LEASE_CLUSTER_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)c[i]) && c[i] != '.' && c[i] != '_' && c[i] != '-')
            return 0;
    return 1;
}

/* A name to verify in a certificate: a DNS name or an IP address (IPv6
 * without brackets). */
static int server_name_ok(const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)v[i]) && v[i] != '.' && v[i] != '-' && v[i] != '_' &&
            v[i] != ':')
            return 0;
    return n > 0;
}

/* "password_file=PATH&user=NAME&...": each at most once, nothing else; the
 * tls_* ones only on a rediss URL. */
static int parse_query(const char *q, const char *what, const char *s, struct lease_url *out,
                       char *err, size_t errlen)
{
    const struct {
        const char *key;
        size_t off, cap;
        bool tls;
    } params[] = {
        {"password_file", offsetof(struct lease_url, password_file), LEASE_PATH_MAX, false},
        {"user", offsetof(struct lease_url, user), LEASE_USER_MAX, false},
        {"sentinel_password_file", offsetof(struct lease_url, sentinel_password_file),
         LEASE_PATH_MAX, false},
        {"tls_ca_file", offsetof(struct lease_url, tls_ca_file), LEASE_PATH_MAX, true},
        {"tls_cert_file", offsetof(struct lease_url, tls_cert_file), LEASE_PATH_MAX, true},
        {"tls_key_file", offsetof(struct lease_url, tls_key_file), LEASE_PATH_MAX, true},
        {"tls_server_name", offsetof(struct lease_url, tls_server_name), NET_TCP_HOST_MAX, true},
    };
    while (*q) {
        const char *amp = strchr(q, '&'), *end = amp ? amp : q + strlen(q);
        const char *eq = memchr(q, '=', (size_t)(end - q));
        size_t klen = eq ? (size_t)(eq - q) : (size_t)(end - q);
        const char *v = eq ? eq + 1 : end;
        size_t vlen = (size_t)(end - v);
        size_t k = 0, np = sizeof(params) / sizeof(params[0]);
        while (k < np && (strlen(params[k].key) != klen || memcmp(q, params[k].key, klen) != 0))
            k++;
        if (k == np) {
            snprintf(err, errlen, "%s \"%s\": unknown parameter \"%.*s\" (known: password_file, "
                     "user, sentinel_password_file; with rediss: tls_ca_file, tls_cert_file, "
                     "tls_key_file, tls_server_name)", what, s, (int)klen, q);
            return -EINVAL;
        }
        if (params[k].tls && !out->tls) {
            snprintf(err, errlen, "%s \"%s\": parameter \"%.*s\" is for TLS: use rediss:// "
                     "(or rediss+sentinel://) instead of %s://", what, s, (int)klen, q,
                     out->scheme);
            return -EINVAL;
        }
        char *dst = (char *)out + params[k].off;
        size_t cap = params[k].cap;
        if (dst[0]) {
            snprintf(err, errlen, "%s \"%s\": parameter \"%.*s\" given twice", what, s,
                     (int)klen, q);
            return -EINVAL;
        }
        bool printable = true;
        for (size_t i = 0; i < vlen; i++)
            printable = printable && isgraph((unsigned char)v[i]);
        if (!eq || vlen == 0 || vlen >= cap || !printable) {
            snprintf(err, errlen, "%s \"%s\": parameter \"%.*s\" needs a value of 1 .. %zu "
                     "printable bytes", what, s, (int)klen, q, cap - 1);
            return -EINVAL;
        }
        if (dst == out->tls_server_name && !server_name_ok(v, vlen)) {
            snprintf(err, errlen, "%s \"%s\": tls_server_name \"%.*s\" is not a host name or "
                     "an IP address (letters, digits, '.', '-', '_', ':'; an IPv6 address "
                     "without brackets)", what, s, (int)vlen, v);
            return -EINVAL;
        }
        memcpy(dst, v, vlen);
        dst[vlen] = 0;
        q = amp ? amp + 1 : end;
    }
    if (out->user[0] && !out->password_file[0]) {
        snprintf(err, errlen, "%s \"%s\": user needs a password_file", what, s);
        return -EINVAL;
    }
    if (!out->tls_cert_file[0] != !out->tls_key_file[0]) {
        snprintf(err, errlen, "%s \"%s\": tls_cert_file and tls_key_file go together (a "
                 "client certificate and its key): give both or neither", what, s);
        return -EINVAL;
    }
    return 0;
}

/* Each password file the URL names can be read (at open: a missing one, or
 * one others may read, shows at startup). */
static int check_password_files(const struct lease_url *u, const char *url, char *err,
                                size_t errlen)
{
    const char *files[2] = {u->password_file, u->sentinel_password_file};
    for (int i = 0; i < 2; i++) {
        if (!files[i][0])
            continue;
        char pw[LEASE_PASSWORD_MAX + 1], e2[LEASE_PATH_MAX + 96];
        int rc = lease_password_read(files[i], pw, sizeof(pw), e2, sizeof(e2));
        explicit_bzero(pw, sizeof(pw));
        if (rc < 0) {
            snprintf(err, errlen, "%s: %s", url, e2);
            return rc;
        }
    }
    return 0;
}

int lease_password_read(const char *path, char *buf, size_t cap, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "password_file %s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    const char *bad = fstat(fd, &st) < 0     ? "cannot stat it"
                      : !S_ISREG(st.st_mode) ? "not a regular file"
                      : (st.st_mode & 077)   ? "group or others may use it (chmod 600)"
                                             : NULL;
    if (bad) {
        snprintf(err, errlen, "password_file %s: %s", path, bad);
        close(fd);
        return -EACCES;
    }
    char tmp[LEASE_PASSWORD_MAX + 2];
    ssize_t n = read(fd, tmp, sizeof(tmp));
    close(fd);
    size_t len = 0;
    while (n > 0 && len < (size_t)n && tmp[len] != '\n' && tmp[len] != '\r')
        len++;
    int rc = 0;
    if (n < 0) {
        rc = -errno;
        snprintf(err, errlen, "password_file %s: read: %s", path, strerror(-rc));
    } else if (len == 0 || len > LEASE_PASSWORD_MAX || len >= cap) {
        rc = -EINVAL;
        snprintf(err, errlen, "password_file %s: the password (its first line) must be 1 .. %d "
                 "bytes", path, LEASE_PASSWORD_MAX);
    } else {
        memcpy(buf, tmp, len);
        buf[len] = 0;
        rc = (int)len;
    }
    explicit_bzero(tmp, sizeof(tmp));
    return rc;
}

/* One "host[:port]" of an URL (port `dflt` if omitted) into host/port. */
static int parse_addr(const char *a, size_t n, uint16_t dflt, const char *what, const char *s,
                      char *host, size_t hostlen, uint16_t *port, char *err, size_t errlen)
{
    char addr[NET_TCP_HOST_MAX + 16];
    if (n == 0 || n >= sizeof(addr) - 6) {
        snprintf(err, errlen, "%s \"%s\": %s", what, s,
                 n ? "an address is too long" : "no host");
        return -EINVAL;
    }
    memcpy(addr, a, n);
    addr[n] = 0;
    const char *close_br = addr[0] == '[' ? strchr(addr, ']') : NULL;
    const char *colon = close_br ? strchr(close_br, ':') : strrchr(addr, ':');
    if (!colon)
        snprintf(addr + n, sizeof(addr) - n, ":%u", dflt);
    char e2[256];
    if (net_tcp_split(addr, what, host, hostlen, port, e2, sizeof(e2)) < 0 || *port == 0 ||
        !host[0]) {
        snprintf(err, errlen, "%s \"%s\": the store's address \"%s\" is not host:port with a "
                 "port in 1 .. 65535", what, s, addr);
        return -EINVAL;
    }
    return 0;
}

int lease_url_parse(const char *s, const char *what, struct lease_url *out, char *err,
                    size_t errlen)
{
    memset(out, 0, sizeof(*out));
    const char *sep = s ? strstr(s, "://") : NULL;
    if (!sep || sep == s || (size_t)(sep - s) >= sizeof(out->scheme)) {
        snprintf(err, errlen, "%s \"%s\": not a store URL; write redis://host:port/<cluster>",
                 what, s ? s : "");
        return -EINVAL;
    }
    memcpy(out->scheme, s, (size_t)(sep - s));
    bool sentinel = !strcmp(out->scheme, "redis+sentinel") ||
                    !strcmp(out->scheme, "rediss+sentinel");
    out->tls = !strcmp(out->scheme, "rediss") || !strcmp(out->scheme, "rediss+sentinel");
    if (strcmp(out->scheme, "redis") != 0 && !sentinel && !out->tls) {
        snprintf(err, errlen, "%s \"%s\": unknown store \"%s\" (known: redis, which also "
                 "serves Valkey, and redis+sentinel; rediss and rediss+sentinel over TLS)",
                 what, s, out->scheme);
        return -EINVAL;
    }
    char form[96];
    snprintf(form, sizeof(form), sentinel ? "%s://host:port,host:port/<service>/<cluster>"
                                          : "%s://host:port/<cluster>", out->scheme);
    const char *hp = sep + 3, *slash = strchr(hp, '/');
    if (!slash || slash == hp) {
        snprintf(err, errlen, "%s \"%s\": no %s; write %s", what, s,
                 slash ? "host" : "cluster name after the address", form);
        return -EINVAL;
    }
    const char *cluster = slash + 1;
    if (sentinel) { /* <service>/ first */
        const char *svc = cluster, *s2 = strchr(svc, '/');
        size_t n = s2 ? (size_t)(s2 - svc) : 0;
        if (!s2 || !cluster_ok(svc, n)) {
            snprintf(err, errlen, "%s \"%s\": the service (the primary's name in the "
                     "sentinels) must be 1 .. %d letters, digits, '.', '_' or '-', then "
                     "/<cluster>; write %s", what, s, LEASE_CLUSTER_MAX - 1, form);
            return -EINVAL;
        }
        memcpy(out->service, svc, n);
        out->service[n] = 0;
        cluster = s2 + 1;
    }
    const char *query = strchr(cluster, '?');
    size_t clen = query ? (size_t)(query - cluster) : strlen(cluster);
    if (!cluster_ok(cluster, clen)) {
        snprintf(err, errlen, "%s \"%s\": the cluster name \"%.*s\" must be 1 .. %d letters, "
                 "digits, '.', '_' or '-'", what, s, (int)clen, cluster, LEASE_CLUSTER_MAX - 1);
        return -EINVAL;
    }
    if (query && parse_query(query + 1, what, s, out, err, errlen) < 0)
        return -EINVAL;
    if (!sentinel) {
        if (parse_addr(hp, (size_t)(slash - hp), 6379, what, s, out->host, sizeof(out->host),
                       &out->port, err, errlen) < 0)
            return -EINVAL;
    } else {
        for (const char *a = hp; a < slash;) {
            const char *comma = memchr(a, ',', (size_t)(slash - a));
            const char *end = comma ? comma : slash;
            if (out->nsentinels == LEASE_SENTINELS_MAX) {
                snprintf(err, errlen, "%s \"%s\": more than %d sentinels", what, s,
                         LEASE_SENTINELS_MAX);
                return -EINVAL;
            }
            unsigned i = out->nsentinels++;
            if (parse_addr(a, (size_t)(end - a), 26379, what, s, out->sentinel_host[i],
                           sizeof(out->sentinel_host[i]), &out->sentinel_port[i], err,
                           errlen) < 0)
                return -EINVAL;
            a = comma ? comma + 1 : slash;
            if (comma && a == slash) {
                snprintf(err, errlen, "%s \"%s\": no host after the last ','", what, s);
                return -EINVAL;
            }
        }
        memcpy(out->host, out->sentinel_host[0], sizeof(out->host));
        out->port = out->sentinel_port[0];
    }
    memcpy(out->cluster, cluster, clen);
    out->cluster[clen] = 0;
    return 0;
}

/* ---- the leader value ---------------------------------------------------------------- */

static const char *field(const char *p, const char *end, size_t *n)
{
    const char *q = p;
    while (q < end && *q != ' ')
        q++;
    *n = (size_t)(q - p);
    return q;
}

int lease_value_parse(const char *v, size_t len, struct lease_holder *out, char *err,
                      size_t errlen)
{
    const char *p = v, *end = v + len, *q;
    size_t n;
    struct lease_holder h;
    memset(&h, 0, sizeof(h));

    q = field(p, end, &n);
    if (n == 0 || n > 16) {
        snprintf(err, errlen, "leader value: the epoch is %s", n ? "too long" : "missing");
        return -EPROTO;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') {
            snprintf(err, errlen, "leader value: the epoch is not a decimal number");
            return -EPROTO;
        }
        h.epoch = h.epoch * 10 + (uint64_t)(p[i] - '0');
    }
    if (h.epoch == 0 || h.epoch > EPOCH_MAX) {
        snprintf(err, errlen, "leader value: epoch %" PRIu64 " outside 1 .. 2^53", h.epoch);
        return -EPROTO;
    }
    if (q == end) {
        snprintf(err, errlen, "leader value: no address after the epoch");
        return -EPROTO;
    }
    p = q + 1;
    q = field(p, end, &n);
    if (n == 0 || n >= sizeof(h.address)) {
        snprintf(err, errlen, "leader value: the address is %s", n ? "too long" : "empty");
        return -EPROTO;
    }
    memcpy(h.address, p, n);
    char host[NET_TCP_HOST_MAX], e2[256];
    uint16_t port;
    if (memchr(h.address, 0, n) || net_tcp_split(h.address, "leader", host, sizeof(host), &port,
                                                 e2, sizeof(e2)) < 0 || port == 0 || !host[0]) {
        snprintf(err, errlen, "leader value: the address is not host:port");
        return -EPROTO;
    }
    if (q == end) {
        snprintf(err, errlen, "leader value: no owner after the address");
        return -EPROTO;
    }
    p = q + 1;
    q = field(p, end, &n);
    if (n == 0 || n >= sizeof(h.owner) || q != end) {
        snprintf(err, errlen, "leader value: the owner is %s",
                 q != end ? "followed by more fields" : n ? "too long" : "empty");
        return -EPROTO;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isgraph((unsigned char)p[i])) {
            snprintf(err, errlen, "leader value: the owner has a byte that is not printable");
            return -EPROTO;
        }
    }
    memcpy(h.owner, p, n);
    *out = h;
    return 0;
}

int lease_primary_parse(const char *host, size_t hostlen, const char *port, size_t portlen,
                        char *hostout, size_t hostcap, uint16_t *portout, char *err,
                        size_t errlen)
{
    if (hostlen == 0 || hostlen >= hostcap) {
        snprintf(err, errlen, "sentinel reply: the primary's host is %s",
                 hostlen ? "too long" : "empty");
        return -EPROTO;
    }
    for (size_t i = 0; i < hostlen; i++) {
        if (!isgraph((unsigned char)host[i])) {
            snprintf(err, errlen, "sentinel reply: the primary's host has a byte that is not "
                     "printable");
            return -EPROTO;
        }
    }
    uint32_t p = 0;
    bool digits = portlen >= 1 && portlen <= 5;
    for (size_t i = 0; digits && i < portlen; i++) {
        digits = port[i] >= '0' && port[i] <= '9';
        p = p * 10 + (uint32_t)(port[i] - '0');
    }
    if (!digits || p == 0 || p > 65535) {
        snprintf(err, errlen, "sentinel reply: the primary's port is not 1 .. 65535");
        return -EPROTO;
    }
    memcpy(hostout, host, hostlen);
    hostout[hostlen] = 0;
    *portout = (uint16_t)p;
    return 0;
}

int lease_value_format(const struct lease_holder *h, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%" PRIu64 " %s %s", h->epoch, h->address, h->owner);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ---- dispatch ------------------------------------------------------------------------ */

int lease_open(const char *url, uint64_t timeout_ms, struct lease **out, char *err,
               size_t errlen)
{
    struct lease_url u;
    int rc = lease_url_parse(url, "the lease store", &u, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = check_password_files(&u, url, err, errlen)) < 0)
        return rc;
#ifdef UMBP_HAVE_HIREDIS
    struct lease *l;
    char e2[512] = "";
    if ((rc = lease_redis_open(&u, &l, e2, sizeof(e2))) < 0) {
        snprintf(err, errlen, "%s: %s", url, e2[0] ? e2 : strerror(-rc));
        return rc;
    }
    snprintf(l->url, sizeof(l->url), "%s", url);
    l->u = u;
    l->timeout_ms = timeout_ms ? timeout_ms : 1000;
    *out = l;
    return 0;
#else
    snprintf(err, errlen, "%s: this build has no Redis client: install libhiredis-dev "
             "(scripts/setup.sh) and rebuild", url);
    return -ENOTSUP;
#endif
}

void lease_close(struct lease *l)
{
    if (l)
        l->ops->close(l);
}

const char *lease_url_of(const struct lease *l) { return l->url; }

/* err <- "<url>: <what the store said>" */
static int named(const struct lease *l, int rc, char *err, size_t errlen)
{
    if (rc < 0 && err && errlen) {
        char tmp[512];
        snprintf(tmp, sizeof(tmp), "%s", err);
        snprintf(err, errlen, "%s: %s", l->url, tmp);
    }
    return rc;
}

int lease_acquire(struct lease *l, const char *address, const char *owner, uint64_t ttl_ms,
                  uint64_t min_epoch, struct lease_holder *out, char *err, size_t errlen)
{
    err[0] = 0;
    return named(l, l->ops->acquire(l, address, owner, ttl_ms, min_epoch, out, err, errlen),
                 err, errlen);
}

int lease_renew(struct lease *l, const struct lease_holder *mine, uint64_t ttl_ms,
                struct lease_holder *out, char *err, size_t errlen)
{
    err[0] = 0;
    return named(l, l->ops->renew(l, mine, ttl_ms, out, err, errlen), err, errlen);
}

int lease_release(struct lease *l, const struct lease_holder *mine, char *err, size_t errlen)
{
    err[0] = 0;
    return named(l, l->ops->release(l, mine, err, errlen), err, errlen);
}

int lease_leader(struct lease *l, struct lease_holder *out, char *err, size_t errlen)
{
    err[0] = 0;
    return named(l, l->ops->leader(l, out, err, errlen), err, errlen);
}
