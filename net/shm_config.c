/*
 * shm_config.c - standalone mode's shared option table (see shm_config.h):
 * the shm tier's options, which umbp-server reads too.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shm_config.h"

#define OFF(f) offsetof(struct shm_config, f)

static const char *const roles[] = {"worker", "lookup", NULL};

const struct umbp_option shm_options[] = {
    {"socket_dir", UMBP_OPT_STRING, OFF(socket_dir), "", 0, 0, SHM_PATH_MAX, NULL,
     "standalone: directory of the server's socket (private: 0700, or 0770 with "
     "socket_group); empty = /tmp/umbp-<uid>"},
    {"lookup_instance", UMBP_OPT_STRING, OFF(lookup_instance), "", 0, 0, 32, NULL,
     "standalone: separates servers (and engines) on one host: the socket is "
     "umbp-dp<dp_rank>[-<lookup_instance>].sock"},
    {"dp_rank", UMBP_OPT_INT, OFF(dp_rank), "0", 0, 65535, 0, NULL,
     "standalone: data-parallel index in the socket path"},
    {"auto_start", UMBP_OPT_BOOL, OFF(auto_start), "false", 0, 0, 0, NULL,
     "standalone: start umbp-server when none answers (it gets this config's capacity and "
     "socket options; pool options come from its environment)"},
    {"server_path", UMBP_OPT_STRING, OFF(server_path), "umbp-server", 0, 0, 256, NULL,
     "standalone: the umbp-server binary auto_start runs (searched in PATH)"},
    {"startup_timeout_ms", UMBP_OPT_INT, OFF(startup_timeout_ms), "30000", 1, 600000, 0, NULL,
     "standalone: bound on reaching the server (and starting it) at creation"},
    {"reconnect_max_ms", UMBP_OPT_INT, OFF(reconnect_max_ms), "2000", 10, 60000, 0, NULL,
     "standalone: cap of the exponential backoff between reconnect attempts"},
    {"engine_id", UMBP_OPT_STRING, OFF(engine_id), "", 0, 0, 64, NULL,
     "standalone: this engine's name in the server's session list (default: the pid)"},
    {"namespace", UMBP_OPT_STRING, OFF(name_space), "", 0, 0, 64, NULL,
     "standalone: tenant namespace for the server's per-namespace quotas"},
    {"role", UMBP_OPT_STRING, OFF(role), "worker", 0, 0, 16, roles,
     "standalone: worker (maps the pool, every call) or lookup (an engine's scheduler: "
     "lookups only, no pool)"},
    {"reserve_ahead_bytes", UMBP_OPT_SIZE, OFF(reserve_ahead_bytes), "128MiB", 0,
     (double)(64ull << 30), 0, NULL,
     "standalone: pool space a worker keeps reserved ahead for its KV stores' objects "
     "(at most 1/32 of the pool, 1/16 of it divided among the server's sessions, 4096 "
     "objects; shared evenly by up to four object sizes), so a store's first reservation "
     "needs no round trip to the server; 0 = off"},
    {"reserve_ahead_hold_ms", UMBP_OPT_INT, OFF(reserve_ahead_hold_ms), "30000", 1000, 600000,
     0, NULL,
     "standalone: how long the server keeps a reservation made ahead (plus the write "
     "deadline); a worker hands one out only within 9/10 of it, and replaces it after "
     "about half"},
    {.name = NULL},
};

int shm_config_validate(const struct shm_config *c, char *err, size_t errlen)
{
    for (const char *p = c->lookup_instance; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-')) {
            snprintf(err, errlen, "lookup_instance=%s: only letters, digits, '.', '_' and '-'",
                     c->lookup_instance);
            return -EINVAL;
        }
    if (c->socket_dir[0] && c->socket_dir[0] != '/') {
        snprintf(err, errlen, "socket_dir=%s: must be an absolute path", c->socket_dir);
        return -EINVAL;
    }
    return 0;
}

void shm_config_socket_dir(const struct shm_config *c, char *out, size_t len)
{
    if (c->socket_dir[0])
        snprintf(out, len, "%s", c->socket_dir);
    else
        snprintf(out, len, "/tmp/umbp-%u", (unsigned)geteuid());
}
