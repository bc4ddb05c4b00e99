/*
 * server_config.c - the server's option table and the parse of a whole
 * server config (see server_config.h): umbp_options_apply over the core,
 * dram, standalone and server tables, then every table's cross-option
 * checks, then the server options' own syntax (id lists, the socket group,
 * quotas) into plain arrays.  Messages name the option and the fix.
 * Caller's thread; no shared state.
 */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "dram_options.h"
#include "fdpass.h"
#include "node.h"
#include "options.h"
#include "proto.h"
#include "server_config.h"

#define OFF(f) offsetof(struct srv_options, f)

const struct umbp_option srv_options[] = {
    {"allowed_uids", UMBP_OPT_STRING, OFF(allowed_uids), "", 0, 0, 512, NULL,
     "server: users (uids or names, comma separated) that may connect besides the "
     "server's own; empty = the server's user only"},
    {"allowed_gids", UMBP_OPT_STRING, OFF(allowed_gids), "", 0, 0, 512, NULL,
     "server: groups (gids or names, comma separated) whose members (primary or "
     "supplementary group) may connect"},
    {"socket_group", UMBP_OPT_STRING, OFF(socket_group), "", 0, 0, 64, NULL,
     "server: group (name or gid) given access to socket_dir (0770) and the socket (0660); "
     "empty = both private to the server's user (0700, 0600)"},
    {"max_sessions", UMBP_OPT_INT, OFF(max_sessions), "1024", 1, SRV_MAX_SESSIONS, 0, NULL,
     "server: connected clients at most; more are refused (and counted)"},
    {"session_warm_keys", UMBP_OPT_INT, OFF(session_warm_keys), "1024", 0, 65536, 0, NULL,
     "server: at an engine worker's HELLO its session makes room, pages touched, for this "
     "many reservations, as many leases and a reply of this many keys, so that its first "
     "store and restore grow no table and fault no page in (about 290 KiB a session at "
     "1024); 0 = everything grows on demand"},
    {"handshake_timeout_ms", UMBP_OPT_INT, OFF(handshake_timeout_ms), "5000", 10, 3600000, 0,
     NULL,
     "server: a client that has not sent its whole HELLO this long after connecting is "
     "disconnected (it would hold one of max_sessions)"},
    {"frame_timeout_ms", UMBP_OPT_INT, OFF(frame_timeout_ms), "30000", 10, 3600000, 0, NULL,
     "server: a frame whose last byte has not come this long after its first ends its "
     "session; an idle client with no partial frame is never timed out"},
    {"input_budget_bytes", UMBP_OPT_SIZE, OFF(input_budget_bytes), "1GiB", 8 << 20,
     1099511627776.0, 0, NULL,
     "server: what all sessions' unfinished frames may hold together beyond each session's "
     "first 64 KiB; a session whose frame needs more waits, not read, until other frames "
     "complete or their sessions end, first come first served (its frame_timeout_ms paused "
     "while it holds none of it)"},
    {"namespace_quotas", UMBP_OPT_STRING, OFF(namespace_quotas), "", 0, 0, 2048, NULL,
     "server: per-namespace byte limits, e.g. \"ns=4GiB,ns2=512MiB\": a namespace past its "
     "quota evicts its own least recently used objects; workers' spares hold at most 1/8 "
     "of a quota (clients declare their namespace with the namespace option)"},
    {"adopt_grace_ms", UMBP_OPT_INT, OFF(adopt_grace_ms), "30000", 0, 3600000, 0, NULL,
     "server: with a named pool (dram_shm_name) adopted after a restart, how long the "
     "regions of the dead server's unfinished puts stay out of use when their journal "
     "record carries no writer deadline (a pool written by a release before protocol "
     "version 2); others are held exactly until their writers' declared deadlines"},
    {"event_backlog_bytes", UMBP_OPT_SIZE, OFF(event_backlog_bytes), "16MiB", 64 << 10,
     1 << 30, 0, NULL,
     "server: unsent bytes above which a subscriber's events are dropped (and counted as "
     "lost)"},
    {"metrics_port", UMBP_OPT_INT, OFF(metrics_port), "0", 0, 65535, 0, NULL,
     "server: TCP port of the Prometheus /metrics endpoint; 0 = off"},
    {"metrics_address", UMBP_OPT_STRING, OFF(metrics_address), "127.0.0.1", 0, 0, 64, NULL,
     "server: address (IPv4 or IPv6) the /metrics endpoint listens on"},
    {"populate_pool", UMBP_OPT_BOOL, OFF(populate_pool), "true", 0, 0, 0, NULL,
     "server: once serving, a background thread allocates every page of the pool "
     "(MADV_POPULATE_WRITE, contents untouched), so engine workers' registrations do not "
     "fault the pool in and their first transfers do not meet unallocated pages"},
    {.name = NULL},
};

/* ---- lists of "a,b,c" ------------------------------------------------------ */

/* Splits s at commas into trimmed, non-empty items; fn gets each.  An
 * empty item ("1,,2") is an error of the option `name`. */
static int for_each_item(const char *name, const char *s,
                         int (*fn)(const char *item, void *arg, char *err, size_t errlen),
                         void *arg, char *err, size_t errlen)
{
    char item[256];
    while (*s) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        while (len && isspace((unsigned char)*s))
            s++, len--;
        while (len && isspace((unsigned char)s[len - 1]))
            len--;
        if (len == 0 || len >= sizeof(item)) {
            snprintf(err, errlen, "%s: %s item in the list; write items separated by single "
                     "commas, e.g. 1000,1001", name, len ? "an overlong" : "an empty");
            return -EINVAL;
        }
        memcpy(item, s, len);
        item[len] = '\0';
        int rc = fn(item, arg, err, errlen);
        if (rc < 0)
            return rc;
        if (!end)
            break;
        s = end + 1;
        if (!*s) {
            snprintf(err, errlen, "%s: the list ends with a comma; remove it", name);
            return -EINVAL;
        }
    }
    return 0;
}

static bool parse_id_number(const char *s, unsigned long *out)
{
    char *end;
    if (!isdigit((unsigned char)*s))
        return false;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v >= (unsigned long)UINT32_MAX)
        return false;
    *out = v;
    return true;
}

struct id_list {
    const char *option;
    bool groups;
    unsigned *ids; /* uid_t and gid_t are both unsigned int on Linux */
    size_t *n;
};

_Static_assert(sizeof(uid_t) == sizeof(unsigned) && sizeof(gid_t) == sizeof(unsigned),
               "uid_t and gid_t are unsigned int");

/* A user or group as a number or a name (name service lookup). */
static int resolve_id(const char *s, bool group, unsigned *out)
{
    unsigned long v;
    if (parse_id_number(s, &v)) {
        *out = (unsigned)v;
        return 0;
    }
    char buf[4096];
    if (group) {
        struct group g, *res = NULL;
        if (getgrnam_r(s, &g, buf, sizeof(buf), &res) != 0 || !res)
            return -ENOENT;
        *out = res->gr_gid;
    } else {
        struct passwd p, *res = NULL;
        if (getpwnam_r(s, &p, buf, sizeof(buf), &res) != 0 || !res)
            return -ENOENT;
        *out = res->pw_uid;
    }
    return 0;
}

static int add_id(const char *item, void *arg, char *err, size_t errlen)
{
    struct id_list *l = arg;
    if (*l->n == SRV_MAX_IDS) {
        snprintf(err, errlen, "%s: more than %d entries; use a group (allowed_gids) instead",
                 l->option, SRV_MAX_IDS);
        return -EINVAL;
    }
    if (resolve_id(item, l->groups, &l->ids[*l->n]) < 0) {
        snprintf(err, errlen, "%s: '%s' is neither a %s number nor a known %s name; write "
                 "numbers or names separated by commas, e.g. %s",
                 l->option, item, l->groups ? "group" : "user", l->groups ? "group" : "user",
                 l->groups ? "1000,gpu-users" : "1000,alice");
        return -EINVAL;
    }
    (*l->n)++;
    return 0;
}

/* ---- namespace quotas ----------------------------------------------------------- */

static int add_quota(const char *item, void *arg, char *err, size_t errlen)
{
    struct srv_config *c = arg;
    const char *eq = strchr(item, '=');
    if (!eq || eq == item || !eq[1]) {
        snprintf(err, errlen, "namespace_quotas: '%s' is not <namespace>=<size>; write e.g. "
                 "\"tenant-a=4GiB,tenant-b=512MiB\"", item);
        return -EINVAL;
    }
    size_t nlen = (size_t)(eq - item);
    while (nlen && isspace((unsigned char)item[nlen - 1]))
        nlen--;
    if (nlen >= sizeof(c->quotas[0].name_space)) {
        snprintf(err, errlen, "namespace_quotas: namespace '%.*s' is longer than %zu "
                 "characters (the namespace option's limit)", (int)nlen, item,
                 sizeof(c->quotas[0].name_space) - 1);
        return -EINVAL;
    }
    if (c->nquotas == SRV_MAX_QUOTAS) {
        snprintf(err, errlen, "namespace_quotas: more than %d namespaces", SRV_MAX_QUOTAS);
        return -EINVAL;
    }
    struct srv_quota *q = &c->quotas[c->nquotas];
    memcpy(q->name_space, item, nlen);
    q->name_space[nlen] = '\0';
    for (size_t i = 0; i < c->nquotas; i++)
        if (strcmp(c->quotas[i].name_space, q->name_space) == 0) {
            snprintf(err, errlen, "namespace_quotas: namespace '%s' appears twice; keep one",
                     q->name_space);
            return -EINVAL;
        }
    if (parse_size(eq + 1, &q->bytes) < 0 || q->bytes == 0) {
        snprintf(err, errlen, "namespace_quotas: '%s' for namespace '%s' is not a positive "
                 "size; write e.g. 4GiB or 536870912", eq + 1, q->name_space);
        return -EINVAL;
    }
    if (q->bytes > c->capacity) {
        snprintf(err, errlen, "namespace_quotas: %s=%s exceeds the pool (capacity %llu "
                 "bytes); lower the quota or raise capacity_bytes", q->name_space, eq + 1,
                 (unsigned long long)c->capacity);
        return -EINVAL;
    }
    c->nquotas++;
    return 0;
}

/* ---- the whole config ---------------------------------------------------------------- */

static int check_server_options(struct srv_config *c, char *err, size_t errlen)
{
    struct srv_options *o = &c->opt;
    struct id_list u = {"allowed_uids", false, c->uids, &c->nuids};
    struct id_list g = {"allowed_gids", true, c->gids, &c->ngids};
    int rc;
    if ((rc = for_each_item("allowed_uids", o->allowed_uids, add_id, &u, err, errlen)) < 0 ||
        (rc = for_each_item("allowed_gids", o->allowed_gids, add_id, &g, err, errlen)) < 0 ||
        (rc = for_each_item("namespace_quotas", o->namespace_quotas, add_quota, c, err,
                            errlen)) < 0)
        return rc;
    if (o->socket_group[0]) {
        if (resolve_id(o->socket_group, true, &c->sock_gid) < 0) {
            snprintf(err, errlen, "socket_group: '%s' is neither a group number nor a known "
                     "group name; create the group or leave socket_group empty",
                     o->socket_group);
            return -EINVAL;
        }
        c->has_group = true;
    }
    unsigned char addr[16];
    if (inet_pton(AF_INET, o->metrics_address, addr) != 1 &&
        inet_pton(AF_INET6, o->metrics_address, addr) != 1) {
        snprintf(err, errlen, "metrics_address: '%s' is not an IPv4 or IPv6 address; write "
                 "e.g. 127.0.0.1", o->metrics_address);
        return -EINVAL;
    }
    return 0;
}

/* The pool must be shareable: the server hands its fd to every worker. */
static void force_shared_memory(void *dram)
{
    size_t size;
    for (const struct umbp_option *o = umbp_dram_options(&size); o->name; o++)
        if (strcmp(o->name, "dram_use_shared_memory") == 0)
            *(bool *)((char *)dram + o->offset) = true;
}

int srv_config_parse(const char *json, struct srv_config **out, char *err, size_t errlen)
{
    size_t dram_size;
    const struct umbp_option *dram_opts = umbp_dram_options(&dram_size);
    struct srv_config *c = calloc(1, sizeof(*c));
    if (!c || !(c->dram = calloc(1, dram_size))) {
        snprintf(err, errlen, "out of memory parsing the config");
        srv_config_free(c);
        return -ENOMEM;
    }
    size_t node_size;
    const struct umbp_option *node_opts = srv_node_options(&node_size);
    if (node_opts && !(c->node = calloc(1, node_size))) {
        snprintf(err, errlen, "out of memory parsing the config");
        srv_config_free(c);
        return -ENOMEM;
    }
    struct umbp_opt_table t[] = {
        {umbp_core_options, &c->core, "core"},
        {dram_opts, c->dram, "dram"},
        {shm_options, &c->shm, "shm"},
        {srv_options, &c->opt, "server"},
        {node_opts, c->node, "distributed"}, /* last: absent without UCX */
    };
    int rc;
    if ((rc = umbp_options_apply(t, sizeof(t) / sizeof(t[0]) - !node_opts, json, err,
                                 errlen)) < 0)
        goto fail;
    c->is_node = c->node && srv_node_wanted(c->node);
    if (c->is_node && (rc = srv_node_validate(c->node, &c->core, err, errlen)) < 0)
        goto fail;
    force_shared_memory(c->dram);
    if ((rc = umbp_core_validate(&c->core, &c->capacity, err, errlen)) < 0 ||
        (rc = umbp_dram_validate_config(c->dram, err, errlen)) < 0 ||
        (rc = shm_config_validate(&c->shm, err, errlen)) < 0 ||
        (rc = check_server_options(c, err, errlen)) < 0)
        goto fail;
    *out = c;
    return 0;
fail:
    srv_config_free(c);
    return rc;
}

void srv_config_free(struct srv_config *c)
{
    if (!c)
        return;
    free(c->dram);
    free(c->node);
    free(c);
}

int srv_config_socket_path(const struct srv_config *c, char *out, size_t outlen, char *err,
                           size_t errlen)
{
    char dir[SHM_PATH_MAX];
    shm_config_socket_dir(&c->shm, dir, sizeof(dir));
    return proto_socket_path(dir, (unsigned)c->shm.dp_rank, c->shm.lookup_instance, out,
                             outlen, err, errlen);
}
