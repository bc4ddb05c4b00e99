/*
 * shm_config.h - the options of standalone mode shared by the shm client
 * tier and umbp-server (which reads the same config as its clients: both
 * must agree on where the socket is).  The table is shm_options[] in
 * shm_config.c; names are unique across every table (common/options.c
 * refuses duplicates).  In net/, not in the shm tier, because the server
 * reads it without linking any tier.  Caller's thread at creation.
 */
#ifndef UMBP_SHM_CONFIG_H
#define UMBP_SHM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/tier.h"

#define SHM_PATH_MAX 108 /* sizeof(sun_path) */

struct shm_config {
    char socket_dir[SHM_PATH_MAX];   /* "" = /tmp/umbp-<euid> */
    char lookup_instance[32];        /* "" or [A-Za-z0-9._-]+ */
    int64_t dp_rank;                 /* the DP index in the socket path */
    bool auto_start;                 /* spawn umbp-server if none answers */
    char server_path[256];           /* the binary auto_start runs */
    int64_t startup_timeout_ms;      /* connect + handshake at creation */
    int64_t reconnect_max_ms;        /* backoff cap after a lost server */
    char engine_id[64];              /* shown by `umbp stat`; "" = pid */
    char name_space[64];             /* tenant for quotas; "" = default */
    char role[16];                   /* worker | lookup */
    uint64_t reserve_ahead_bytes;    /* spares of the KV object size; 0 off */
    int64_t reserve_ahead_hold_ms;   /* how long one is kept unwritten */
};

extern const struct umbp_option shm_options[];

/* Cross-option checks (lookup_instance characters, ...); names the option. */
int shm_config_validate(const struct shm_config *c, char *err, size_t errlen);
/* The socket directory: socket_dir, or /tmp/umbp-<euid> when empty. */
void shm_config_socket_dir(const struct shm_config *c, char *out, size_t len);

#endif
