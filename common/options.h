/*
 * options.h - option tables (struct umbp_option, umbp/tier.h) parsed from
 * JSON and UMBP_* environment variables (common/options.c).  Used by the
 * runtime, umbp-server and the umbp tool.  Stateless; any thread.
 */
#ifndef UMBP_COMMON_OPTIONS_H
#define UMBP_COMMON_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/tier.h"

/* One table and the struct its offsets point into. */
struct umbp_opt_table {
    const struct umbp_option *opts; /* terminated by a NULL name */
    void *base;
    const char *owner;              /* "core", a tier name, "server": messages */
};

/* Applies every table's defaults, then the JSON object (NULL or "" = {}),
 * then UMBP_<NAME> environment variables.  Refuses unknown names, values of
 * the wrong type or out of range, and a name declared by two tables; the
 * message (naming the option and the accepted range) goes to err. */
int umbp_options_apply(const struct umbp_opt_table *t, size_t nt, const char *json, char *err,
                       size_t errlen);

/* The option name of the tables closest to key (a typo or two away), or
 * NULL; and the "unknown option" message, with that name as a hint. */
const char *umbp_options_closest(const struct umbp_opt_table *t, size_t nt, const char *key);
void umbp_options_unknown(const struct umbp_opt_table *t, size_t nt, const char *key, char *err,
                          size_t errlen);

/* The option's row of docs/configuration.md's tables, as umbp-options
 * prints it: | `name` | type | `default` | accepted | meaning | (no newline).
 * Returns the length snprintf would (truncated to len). */
int umbp_option_md_row(const struct umbp_option *o, char *buf, size_t len);

/* A JSON config file's text (malloc'd, NUL-terminated), at most 1 MiB;
 * NULL with err naming the file and why. */
#define UMBP_CONFIG_FILE_MAX (1u << 20)
char *umbp_config_file_read(const char *path, char *err, size_t errlen);

/* Parses one option value written as text (environment form). */
int option_parse_text(const struct umbp_option *o, const char *text, void *base,
                      char *err, size_t errlen);
/* Parses a size: 4096, "64KiB", "2MiB", "1GiB", "4G", "512k". */
int parse_size(const char *s, uint64_t *out);

/* The core table (common/core_options.c) and its cross-option checks; on
 * success *rank_capacity is this rank's resolved capacity. */
extern const struct umbp_option umbp_core_options[];
int umbp_core_validate(const struct umbp_core_config *core, uint64_t *rank_capacity, char *err,
                       size_t errlen);

/* The modes the `mode` option accepts: for each, the tier that declares it
 * in its ops->modes when that tier is built (its primary tier), and its
 * properties (UMBP_MODE_*, umbp/umbp.h), which connectors read through
 * umbp_mode_flags() instead of comparing names.  One table: the option's
 * accepted values, the lookup client's and the connectors' come from it, and
 * a mode whose tier is not built is refused naming that tier.  A new mode is
 * one row.  distributed's flags: the design's (a cluster-wide pool indexed
 * by umbp-master), until its tier lands. */
#define UMBP_MODES(X)                                                              \
    X("embedded", "dram", 0)                                                       \
    X("standalone", "shm",                                                         \
      UMBP_MODE_SHARED_POOL | UMBP_MODE_SESSIONS | UMBP_MODE_SHARED_LOOKUP)        \
    X("distributed", "rdma", UMBP_MODE_SHARED_POOL | UMBP_MODE_SHARED_LOOKUP)
/* The tier mode needs; NULL for a mode not in the table. */
const char *umbp_mode_tier(const char *mode);
/* mode's UMBP_MODE_* flags in *flags; -EINVAL (and err listing the modes)
 * for a mode not in the table.  Whether its tier is built is not asked. */
int umbp_mode_props(const char *mode, unsigned *flags, char *err, size_t errlen);

/* poll_wait's rule, for every thread that may poll before sleeping (waiters,
 * the runtime's loop, umbp-server's loop, the shm client): "on", or "auto"
 * where this process may use at least UMBP_POLL_MIN_CPUS CPUs
 * (umbp_usable_cpus: affinity and cgroup quota, not the host's count). */
#define UMBP_POLL_MIN_CPUS 8
bool umbp_poll_wait_spins(const char *poll_wait);

#endif
