/*
 * umbp - the administrator's tool for umbp-server: `umbp stat` (the pool,
 * the counters, every session), `umbp reset` (clear the pool for every
 * engine), `umbp ping`.  An ADMIN session over the server's socket (it maps
 * no pool), found from the same config as the engines' (--config), the
 * UMBP_* environment, or the flags.  Blocking, one thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "options.h"

#include "server_config.h"
#include "sync_client.h"
#include "util.h"


struct cli {
    const char *command;
    const char *config_file;
    const char *socket_dir, *instance;
    long dp_rank;                /* -1: from the config */
    long timeout_ms;
    char path[SHM_PATH_MAX];
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: umbp [options] stat|reset|ping\n"
            "\n"
            "  stat    the pool (used/capacity, objects, hit rate, evictions) and every\n"
            "          connected session (pid, uid, role, dp/tp, engine, namespace, leases)\n"
            "  reset   remove every object from the pool, for every engine on the host\n"
            "  ping    check that the server answers, and how fast\n"
            "\n"
            "options (the socket is found as the engines find it):\n"
            "  --config FILE     the engines' / server's JSON config\n"
            "  --socket-dir DIR  overrides socket_dir (default /tmp/umbp-<uid>)\n"
            "  --dp-rank N       overrides dp_rank\n"
            "  --instance NAME   overrides lookup_instance\n"
            "  --timeout-ms N    bound on each reply (default 5000)\n");
}

static char *read_file(const char *path)
{
    char err[512];
    char *text = umbp_config_file_read(path, err, sizeof(err));
    if (!text)
        fprintf(stderr, "umbp: --config %s\n", err);
    return text;
}

static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* 0, 1 (help shown) or -1 (error shown). */
static int parse_args(int argc, char **argv, struct cli *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (a[0] != '-') {
            if (c->command) {
                fprintf(stderr, "umbp: one command at a time ('%s' and '%s')\n", c->command, a);
                return -1;
            }
            c->command = a;
            continue;
        }
        bool ok = v != NULL;
        if (!strcmp(a, "--config"))
            c->config_file = v;
        else if (!strcmp(a, "--socket-dir"))
            c->socket_dir = v;
        else if (!strcmp(a, "--instance"))
            c->instance = v;
        else if (!strcmp(a, "--dp-rank"))
            ok = ok && parse_long(v, 0, 65535, &c->dp_rank);
        else if (!strcmp(a, "--timeout-ms"))
            ok = ok && parse_long(v, 1, 3600000, &c->timeout_ms);
        else {
            fprintf(stderr, "umbp: unknown option '%s'\n", a);
            usage(stderr);
            return -1;
        }
        if (!ok) {
            fprintf(stderr, "umbp: %s needs a %s\n", a,
                    !strcmp(a, "--dp-rank")      ? "number 0..65535"
                    : !strcmp(a, "--timeout-ms") ? "number of milliseconds 1..3600000"
                                                 : "value");
            return -1;
        }
        i++;
    }
    if (!c->command) {
        usage(stderr);
        return -1;
    }
    return 0;
}

/* The socket path from the config and the flags. */
static int resolve_path(struct cli *c)
{
    char *json = c->config_file ? read_file(c->config_file) : NULL, err[1024];
    struct srv_config *cfg = NULL;
    if (c->config_file && !json)
        return -1;
    int rc = srv_config_parse(json, &cfg, err, sizeof(err));
    free(json);
    if (rc < 0) {
        fprintf(stderr, "umbp: %s%s\n", c->config_file ? "--config: " : "", err);
        return -1;
    }
    if (c->socket_dir)
        snprintf(cfg->shm.socket_dir, sizeof(cfg->shm.socket_dir), "%s", c->socket_dir);
    if (c->instance)
        snprintf(cfg->shm.lookup_instance, sizeof(cfg->shm.lookup_instance), "%s",
                 c->instance);
    if (c->dp_rank >= 0)
        cfg->shm.dp_rank = c->dp_rank;
    rc = srv_config_socket_path(cfg, c->path, sizeof(c->path), err, sizeof(err));
    srv_config_free(cfg);
    if (rc < 0)
        fprintf(stderr, "umbp: %s\n", err);
    return rc < 0 ? -1 : 0;
}

/* ---- commands ------------------------------------------------------------------ */

static void print_bytes(uint64_t b)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4)
        v /= 1024, u++;
    printf(u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

static void print_stats(const char *path, const struct proto_stats *s)
{
    printf("umbp-server at %s\n", path);
    printf("pool:      ");
    print_bytes(s->used_bytes);
    printf(" used of ");
    print_bytes(s->capacity_bytes);
    printf(" (%.1f%%); %llu objects, %llu being written, %llu being read\n",
           pct(s->used_bytes, s->capacity_bytes), (unsigned long long)s->num_objects,
           (unsigned long long)s->num_pending, (unsigned long long)s->num_leased);
    printf("lookups:   %llu calls, %llu keys, %llu hits", (unsigned long long)s->lookups,
           (unsigned long long)s->lookup_keys, (unsigned long long)s->lookup_hits);
    if (s->lookup_keys)
        printf(" (hit rate %.1f%%)\n", pct(s->lookup_hits, s->lookup_keys));
    else
        printf(" (hit rate -)\n");
    printf("stores:    %llu keys reserved, %llu published\n", (unsigned long long)s->reserves,
           (unsigned long long)s->publishes);
    printf("loads:     %llu keys asked, %llu found\n", (unsigned long long)s->acquires,
           (unsigned long long)s->acquire_hits);
    printf("evictions: %llu objects, ", (unsigned long long)s->evictions);
    print_bytes(s->evicted_bytes);
    printf("; %llu leases expired\n", (unsigned long long)s->leases_expired);
    printf("clients:   %llu sessions; %llu protocol errors, %llu refused connections\n",
           (unsigned long long)s->sessions, (unsigned long long)s->protocol_errors,
           (unsigned long long)s->refused_connections);
    printf("writers:   %llu regions held for ended sessions' writers, %llu reservations "
           "expired unfinished\n", (unsigned long long)s->held_regions,
           (unsigned long long)s->reservations_expired);
}

static void print_sessions(const struct proto_frame *f)
{
    static const char *const roles[] = {"worker", "lookup", "admin"};
    printf("\n%6s %8s %6s %-7s %7s  %-20s %-16s %7s %7s %9s\n", "id", "pid", "uid", "role",
           "dp/tp", "engine", "namespace", "leases", "pending", "requests");
    for (uint32_t i = 0; i < f->n; i++) {
        struct proto_session_item it;
        if (proto_get_session_item(f, i, &it) < 0)
            continue;
        char dptp[24];
        snprintf(dptp, sizeof(dptp), "%u/%u", it.dp_rank, it.tp_rank);
        printf("%6llu %8u %6u %-7s %7s  %-20s %-16s %7llu %7llu %9llu\n",
               (unsigned long long)it.session_id, it.pid, it.uid, roles[it.role], dptp,
               it.engine_id[0] ? it.engine_id : "-", it.name_space[0] ? it.name_space : "-",
               (unsigned long long)it.leases, (unsigned long long)it.reservations,
               (unsigned long long)it.requests);
    }
}

static int cmd_stat(struct sync_client *sc, const char *path, char *err, size_t errlen)
{
    struct proto_frame f;
    struct proto_stats st;
    int rc = sync_client_call(sc, PROTO_STATS, &f, err, errlen);
    if (rc < 0)
        return rc;
    if (f.type != PROTO_STATS_R || proto_get_stats(&f, &st) < 0) {
        snprintf(err, errlen, "STATS answered with %s", proto_type_name(f.type));
        return -EPROTO;
    }
    print_stats(path, &st);
    if ((rc = sync_client_call(sc, PROTO_SESSIONS, &f, err, errlen)) < 0)
        return rc;
    if (f.type != PROTO_SESSIONS_R) {
        snprintf(err, errlen, "SESSIONS answered with %s", proto_type_name(f.type));
        return -EPROTO;
    }
    print_sessions(&f);
    return 0;
}

static int cmd_reset(struct sync_client *sc, const char *path, char *err, size_t errlen)
{
    struct proto_frame f;
    int rc = sync_client_call(sc, PROTO_CLEAR, &f, err, errlen);
    if (rc < 0)
        return rc;
    if (f.type != PROTO_CLEAR_R || (int32_t)f.arg != 0) {
        snprintf(err, errlen, "CLEAR failed: %s, status %d", proto_type_name(f.type),
                 (int32_t)f.arg);
        return -EPROTO;
    }
    printf("cleared the pool of %s (every engine's objects; reads in progress finish)\n",
           path);
    return 0;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static int cmd_ping(struct sync_client *sc, const char *path, char *err, size_t errlen)
{
    struct proto_frame f;
    uint64_t t0 = now_us();
    int rc = sync_client_call(sc, PROTO_PING, &f, err, errlen);
    if (rc < 0)
        return rc;
    printf("pong from %s in %llu us (session %llu)\n", path,
           (unsigned long long)(now_us() - t0), (unsigned long long)sc->welcome.session_id);
    return 0;
}

int main(int argc, char **argv)
{
    struct cli c = {.dp_rank = -1, .timeout_ms = 5000};
    int rc = parse_args(argc, argv, &c);
    if (rc)
        return rc > 0 ? 0 : 2;
    int (*cmd)(struct sync_client *, const char *, char *, size_t) =
        !strcmp(c.command, "stat")    ? cmd_stat
        : !strcmp(c.command, "reset") ? cmd_reset
        : !strcmp(c.command, "ping")  ? cmd_ping
                                      : NULL;
    if (!cmd) {
        fprintf(stderr, "umbp: unknown command '%s' (stat, reset or ping)\n", c.command);
        return 2;
    }
    umbp_log_set_level(UMBP_LOG_ERROR);
    if (resolve_path(&c) < 0)
        return 2;
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                            .role = PROTO_ROLE_ADMIN, .pid = (uint32_t)getpid()};
    snprintf(h.engine_id, sizeof(h.engine_id), "umbp-%s", c.command);
    struct sync_client sc;
    char err[512] = "";
    rc = sync_client_connect(&sc, c.path, &h, (int)c.timeout_ms, err, sizeof(err));
    if (rc == 0)
        rc = cmd(&sc, c.path, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "umbp %s: %s\n", c.command, err);
    sync_client_close(&sc);
    return rc < 0 ? 1 : 0;
}
