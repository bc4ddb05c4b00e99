/*
 * lookup_options.c - the lookup client's options: one table, parsed by the
 * same machinery as a runtime's (common/options.c: JSON, then UMBP_*
 * variables; unknown names refused), then the rules between them.
 * Constant table; caller's thread.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "lookup_int.h"
#include "master_client.h"
#include "options.h"
#include "tcp.h"

#define OFF(f) offsetof(struct lookup_client_config, f)

#define MODE_NAME(mode, tier, flags) mode,
static const char *const modes[] = {UMBP_MODES(MODE_NAME) NULL};
#undef MODE_NAME

const struct umbp_option lookup_client_options[] = {
    {"mode", UMBP_OPT_STRING, OFF(mode), "embedded", 0, 0, 16, modes,
     "the engine's mode: embedded asks each worker rank's lookup service, standalone asks "
     "umbp-server, distributed asks umbp-master (which knows every node's keys within a "
     "heartbeat)"},
    {"lookup_timeout_ms", UMBP_OPT_INT, OFF(lookup_timeout_ms), "1000", 1, 60000, 0, NULL,
     "bound on one query, all ranks together"},
    {"namespace", UMBP_OPT_STRING, OFF(name_space), "", 0, 0, 64, NULL,
     "embedded: the engine's namespace, 32 hex digits (required); standalone: the tenant "
     "namespace of the session (optional)"},
    {"lookup_dir", UMBP_OPT_STRING, OFF(lookup_dir), "", 0, 0, LK_PATH_MAX, NULL,
     "embedded: directory of the ranks' lookup sockets (created 0700); empty = "
     "$XDG_RUNTIME_DIR/umbp, or /tmp/umbp-<uid> without XDG_RUNTIME_DIR"},
    {"lookup_instance", UMBP_OPT_STRING, OFF(lookup_instance), "", 0, 0, 32, NULL,
     "separates engines on one host: part of the lookup socket's name (embedded) or of the "
     "server's socket (standalone)"},
    {"dp_index", UMBP_OPT_INT, OFF(dp_index), "0", 0, 65535, 0, NULL,
     "data-parallel index of the engine (in the socket path)"},
    {"num_ranks", UMBP_OPT_INT, OFF(num_ranks), "1", 1, 4096, 0, NULL,
     "ranks of the engine; a query's rows name ranks below it"},
    {"socket_dir", UMBP_OPT_STRING, OFF(socket_dir), "", 0, 0, LK_PATH_MAX, NULL,
     "standalone: directory of the server's socket; empty = /tmp/umbp-<uid>"},
    {"startup_timeout_ms", UMBP_OPT_INT, OFF(startup_timeout_ms), "30000", 1, 600000, 0, NULL,
     "standalone: bound on reaching the server at creation"},
    {"reconnect_max_ms", UMBP_OPT_INT, OFF(reconnect_max_ms), "2000", 10, 60000, 0, NULL,
     "standalone: cap of the backoff between reconnect attempts"},
    {"engine_id", UMBP_OPT_STRING, OFF(engine_id), "", 0, 0, 64, NULL,
     "standalone, distributed: this scheduler's name in the server's session list or the "
     "master's log (default: the pid)"},
    {"master_address", UMBP_OPT_STRING, OFF(master_address), "", 0, 0, 256, NULL,
     "distributed: umbp-master's host:port, or redis://host:port/<cluster> (or "
     "redis+sentinel://h:p,h:p/<service>/<cluster>; rediss:// and rediss+sentinel:// over "
     "TLS)[?password_file=PATH[&user=NAME]]"
     "[&tls_ca_file=PATH][&tls_cert_file=PATH&tls_key_file=PATH][&tls_server_name=NAME] where the masters elect a "
     "leader: the client follows it (required)"},
    {"secret_file", UMBP_OPT_STRING, OFF(secret_file), "", 0, 0, 512, NULL,
     "distributed: the cluster's shared secret (as the nodes'); empty = none (a master on "
     "loopback only)"},
    {.name = NULL},
};

int lookup_client_config_parse(const char *json, struct lookup_client_config *c, char *err,
                               size_t errlen)
{
    struct umbp_opt_table t = {lookup_client_options, c, "lookup client"};
    int rc;
    memset(c, 0, sizeof(*c));
    if ((rc = umbp_options_apply(&t, 1, json, err, errlen)) < 0 ||
        (rc = lookup_check_instance(c->lookup_instance, err, errlen)) < 0)
        return rc;
    unsigned flags;
    if ((rc = umbp_mode_props(c->mode, &flags, err, errlen)) < 0)
        return rc;
    /* the ranks serve the lookups, or a server session does, or the master */
    c->ask_master = (flags & UMBP_MODE_SHARED_LOOKUP) && !(flags & UMBP_MODE_SESSIONS);
    c->ask_server = (flags & UMBP_MODE_SHARED_LOOKUP) && !c->ask_master;
    if (c->ask_master) {
        if (!c->master_address[0]) {
            snprintf(err, errlen, "master_address: required in %s mode (umbp-master's "
                     "host:port or its redis:// lease store, as the nodes have it)", c->mode);
            return -EINVAL;
        }
        return mclient_check_address(c->master_address, c->secret_file[0] != 0, err, errlen);
    }
    if (!c->ask_server) {
        if (!c->name_space[0]) {
            snprintf(err, errlen, "namespace: required in embedded mode (the engine's "
                     "namespace, %d hex digits, as its workers serve it)",
                     UMBP_LOOKUP_NS_HEX_LEN);
            return -EINVAL;
        }
        if ((rc = lookup_check_ns(c->name_space, "namespace", err, errlen)) < 0)
            return rc;
        if (c->lookup_dir[0] && c->lookup_dir[0] != '/') {
            snprintf(err, errlen, "lookup_dir=%s: must be an absolute path", c->lookup_dir);
            return -EINVAL;
        }
    } else if (c->socket_dir[0] && c->socket_dir[0] != '/') {
        snprintf(err, errlen, "socket_dir=%s: must be an absolute path", c->socket_dir);
        return -EINVAL;
    }
    return 0;
}
