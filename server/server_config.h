/*
 * server_config.h - umbp-server's configuration: the same JSON (and UMBP_*
 * environment) as its clients, parsed against five option tables at once:
 * the core (capacity, lease_ttl_ms, log_level), the dram_* table (the pool),
 * the standalone table shared with the shm tier (socket_dir, dp_rank,
 * lookup_instance), the distributed table (master_address ...: with it the
 * server is a node of a cluster, node.h) and the server's own (srv_options[]
 * in server_config.c).
 * Options of the other tables that only clients use are accepted and
 * ignored, so one file can configure an engine and its server.
 *
 * The umbp tool parses the same way, to find the socket of a config.
 * Caller's thread; no shared state.
 */
#ifndef UMBP_SERVER_CONFIG_H
#define UMBP_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shm_config.h"
#include "umbp/tier.h"

#define SRV_MAX_IDS 64     /* entries of allowed_uids / allowed_gids */
#define SRV_MAX_QUOTAS 64  /* entries of namespace_quotas */
#define SRV_MAX_SESSIONS 4096 /* a SESSIONS_R frame lists at most 4096 */

/* The server's own options, as the table fills them. */
struct srv_options {
    char allowed_uids[512];
    char allowed_gids[512];
    char socket_group[64];
    int64_t max_sessions;
    int64_t session_warm_keys;
    int64_t handshake_timeout_ms;
    int64_t frame_timeout_ms;
    char namespace_quotas[2048];
    uint64_t event_backlog_bytes;
    uint64_t input_budget_bytes;
    int64_t adopt_grace_ms;
    int64_t metrics_port;
    char metrics_address[64];
    bool populate_pool;
};

struct srv_quota {
    char name_space[64];
    uint64_t bytes;
};

/* Everything resolved: the tables' structs plus what the server options
 * say once parsed (ids, the socket group, quotas). */
struct srv_config {
    struct umbp_core_config core;
    void *dram;                     /* the dram tier's config struct */
    struct shm_config shm;
    struct srv_options opt;
    void *node;                     /* the distributed options (node.h), or NULL:
                                       a server built without UCX */
    bool is_node;                   /* master_address given */
    uint64_t capacity;              /* the core's resolved rank capacity */
    uid_t uids[SRV_MAX_IDS];        /* allowed besides the server's euid */
    size_t nuids;
    gid_t gids[SRV_MAX_IDS];
    size_t ngids;
    bool has_group;                 /* socket_group given */
    gid_t sock_gid;
    struct srv_quota quotas[SRV_MAX_QUOTAS]; /* parsed; namespaces 1..nquotas */
    size_t nquotas;
};

extern const struct umbp_option srv_options[];

/* Parses json (NULL or "" = defaults) into a new config; every check that
 * does not need the machine's state beyond user and group names.  On
 * failure err names the option and the fix. */
int srv_config_parse(const char *json, struct srv_config **out, char *err, size_t errlen);
void srv_config_free(struct srv_config *c);

/* The socket path the config names: socket_dir (or its default), dp_rank,
 * lookup_instance. */
int srv_config_socket_path(const struct srv_config *c, char *out, size_t outlen, char *err,
                           size_t errlen);

#endif /* UMBP_SERVER_CONFIG_H */
