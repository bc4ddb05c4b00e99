/*
 * util.h - services shared by the runtime, the tiers, umbp-server and the
 * umbp tool (common/util.c, common/cpus.c): logging with a process-wide
 * level, the per-thread last error message, time, key hashing, the CPUs this
 * process may use.  The tier-facing ones (umbp_log, umbp_now_ns,
 * umbp_key_hash) are declared in umbp/tier.h; this header adds what umbp's
 * own programs need.  Any thread.
 */
#ifndef UMBP_COMMON_UTIL_H
#define UMBP_COMMON_UTIL_H

#include "umbp/tier.h"

/* Errors: remember a message for umbp_last_error() and log it once. */
void umbp_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same message for umbp_last_error without logging it: for a query
 * whose "no" is an answer, not a failure (umbp_option_lookup). */
void umbp_set_answer(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void umbp_log_set_level(enum umbp_log_level l);
int umbp_log_level_parse(const char *s, enum umbp_log_level *out);

/* Accepts up to `batch` connections from a non-blocking listening socket
 * (non-blocking, close-on-exec) and hands each to one(ctx, fd).  0 when the
 * backlog is empty or the batch is done; -errno when the process is out of
 * descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), where a
 * level-triggered caller pauses its watcher instead of spinning on the
 * backlog.  Used by umbp-server and the workers' lookup service. */
int umbp_accept_batch(int listen_fd, int batch, void (*one)(void *ctx, int fd), void *ctx);

/* The CPUs this process may use (common/cpus.c): its affinity mask capped
 * by its cgroup's CPU quota, at least 1.  Computed once, then cached; any
 * thread.  Use it, not the online count, to decide whether to poll or to
 * start helper threads. */
int umbp_usable_cpus(void);
/* Its parts, for tests: CPUs allowed by a cgroup v2 cpu.max file
 * ("200000 100000" -> 2), by cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us
 * files, and by this process's cgroups; 0 = no limit (also for a missing
 * or unreadable file).  umbp_cpus_cgroup_quota uses static buffers: one
 * thread at a time (umbp_usable_cpus calls it once). */
int umbp_cpus_parse_cpu_max(const char *path);
int umbp_cpus_parse_cfs(const char *quota_path, const char *period_path);
int umbp_cpus_cgroup_quota(void);

#endif
