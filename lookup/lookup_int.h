/*
 * lookup_int.h - private to lookup/ (and the runtime's hooks into it).
 *
 *   lookup_path.c     socket paths, the default directory, making it
 *   lookup_serve.c    the worker's service on the runtime's loop thread
 *                     (lookup_serve.h: what the runtime hands it)
 *   lookup_client.c   the scheduler's client (embedded: one connection per
 *                     rank; standalone: one lookup-role runtime)
 *   lookup_options.c  the client's option table
 *
 * The service and the client speak the lookup role of the standalone
 * protocol (net/proto.h): HELLO / HELLO_OK, then LOOKUP / LOOKUP_R
 * (and PING, STATS), with the codec's encoders and decoders.
 */
#ifndef UMBP_LOOKUP_INT_H
#define UMBP_LOOKUP_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/lookup.h"
#include "umbp/tier.h"

#define LK_PATH_MAX 108 /* sizeof(sun_path) */

/* ---- paths (lookup_path.c) -------------------------------------------- */

/* The default lookup directory ($XDG_RUNTIME_DIR/umbp or /tmp/umbp-<euid>). */
void lookup_default_dir(char *out, size_t len);
/* The path, as umbp_lookup_socket_path, with the message in err. */
int lookup_socket_path(const char *dir, const char *ns_hex, const char *instance,
                       uint32_t dp_index, uint32_t rank, char *buf, size_t len, char *err,
                       size_t errlen);
/* 0 if s is 32 hex digits; else -EINVAL and err names `what`. */
int lookup_check_ns(const char *s, const char *what, char *err, size_t errlen);
int lookup_check_instance(const char *s, char *err, size_t errlen);
/* Creates dir 0700 when missing and checks it is a directory; the default
 * one (is_default) must also be owned by this user and not writable by
 * others, since another user could otherwise plant sockets in it.  `what`
 * names the option in messages. */
int lookup_dir_prepare(const char *dir, bool is_default, const char *what, char *err,
                       size_t errlen);

/* ---- the client's options (lookup_options.c) --------------------------- */

struct lookup_client_config {
    char mode[16];                  /* a mode of UMBP_MODES (common/options.h) */
    bool ask_server;                /* its UMBP_MODE_SHARED_LOOKUP: the server, not the ranks */
    char lookup_dir[LK_PATH_MAX];   /* "" = the default */
    char lookup_instance[32];
    char name_space[64];            /* embedded: 32 hex, required */
    int64_t dp_index;
    int64_t num_ranks;
    int64_t lookup_timeout_ms;
    char socket_dir[LK_PATH_MAX];   /* standalone */
    int64_t startup_timeout_ms;
    int64_t reconnect_max_ms;
    char engine_id[64];
    bool ask_master;                /* distributed: umbp-master's index */
    char master_address[256];       /* distributed */
    char secret_file[512];          /* distributed */
};

extern const struct umbp_option lookup_client_options[];
/* Parses json (and UMBP_* variables) into c and checks the cross-option
 * rules; the message goes to err. */
int lookup_client_config_parse(const char *json, struct lookup_client_config *c, char *err,
                               size_t errlen);

/* ---- the runtime's hooks (runtime/lookup_host.c, over lookup_serve.h;
 * loop thread unless said) ----- */

struct umbp_runtime;
struct msg_hdr;
/* MSG_LOOKUP_SERVE arrived: start accepting. */
void lookup_service_start(struct umbp_runtime *rt, struct msg_hdr *m);
/* Shutdown began (on_stop): close every connection, remove the socket. */
void lookup_service_stop(struct umbp_runtime *rt);
/* After the loop thread has ended (free_runtime): whatever is left. */
void lookup_service_free(struct umbp_runtime *rt);

#endif
