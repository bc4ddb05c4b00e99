/*
 * cpus.c - how many CPUs this process may actually use: umbp_usable_cpus().
 *
 * The online count (sysconf) is the host's; an engine in a container limited
 * to 2 CPUs on a 128-core host may run on 2.  Two things limit it:
 *   - its affinity mask (sched_getaffinity: taskset, cpusets);
 *   - its cgroup's CPU bandwidth quota: cgroup v2 `cpu.max` ("max 100000":
 *     none; "200000 100000": 2 CPUs' worth), cgroup v1 `cpu.cfs_quota_us` /
 *     `cpu.cfs_period_us` under the cpu controller's mount (-1: none).  A
 *     quota of q per period p is ceil(q / p) CPUs; the cgroup's ancestors up
 *     to the mount's root limit it too, so the smallest along the way counts.
 * The answer is the affinity count capped by the quota, at least 1.  Files
 * that are missing or that do not parse are ignored (no limit from them).
 *
 * Decides whether waiters, the loop threads (runtime, umbp-server, the shm
 * client) poll before sleeping (poll_wait: auto) and how many key-derivation
 * helpers start (runtime/par.c).  Computed once per process (pthread_once)
 * and cached: a later change of the affinity or the quota is not seen.  Any
 * thread.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

/* ---- the quota files ----------------------------------------------------------------- */

/* ceil(quota / period) as CPUs; 0 = no limit (or a value that makes no sense) */
static int quota_cpus(long long quota, long long period)
{
    if (quota <= 0 || period <= 0)
        return 0;
    long long n = (quota + period - 1) / period;
    return n > INT_MAX ? 0 : (int)n;
}

/* Reads the whole (short) file into buf; -errno if it cannot. */
static int read_small(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = 0;
    return 0;
}

/* One integer followed only by whitespace; false for anything else. */
static bool parse_ll(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno)
        return false;
    while (*end == ' ' || *end == '\n' || *end == '\t')
        end++;
    if (*end)
        return false;
    *out = v;
    return true;
}

int umbp_cpus_parse_cpu_max(const char *path)
{
    char buf[128], quota[64];
    long long period;
    if (read_small(path, buf, sizeof(buf)) < 0)
        return 0;
    char *sp = strchr(buf, ' ');
    if (!sp || (size_t)(sp - buf) >= sizeof(quota))
        return 0;
    memcpy(quota, buf, (size_t)(sp - buf));
    quota[sp - buf] = 0;
    if (!parse_ll(sp + 1, &period) || period <= 0)
        return 0;
    if (strcmp(quota, "max") == 0)
        return 0;
    long long q;
    return parse_ll(quota, &q) ? quota_cpus(q, period) : 0;
}

int umbp_cpus_parse_cfs(const char *quota_path, const char *period_path)
{
    char qb[64], pb[64];
    long long q, p;
    if (read_small(quota_path, qb, sizeof(qb)) < 0 || read_small(period_path, pb, sizeof(pb)) < 0 ||
        !parse_ll(qb, &q) || !parse_ll(pb, &p))
        return 0;
    return quota_cpus(q, p); /* a quota of -1 is "none" */
}

/* ---- finding this process's cgroup ----------------------------------------------------- */

/* True if the comma-separated list holds item. */
static bool list_has(const char *list, const char *item)
{
    size_t n = strlen(item);
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && strncmp(p, item, n) == 0)
            return true;
        p = comma ? comma + 1 : NULL;
    }
    return false;
}

struct cg_mount {
    char root[PATH_MAX];  /* the cgroup the mount shows at its top */
    char point[PATH_MAX]; /* where it is mounted */
    bool found;
};

/* The cgroup2 mount and the v1 mount carrying the cpu controller. */
static void find_mounts(struct cg_mount *v2, struct cg_mount *v1)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        /* id parent major:minor root point options [optional...] - fstype source superopts */
        char root[PATH_MAX], point[PATH_MAX];
        if (sscanf(line, "%*s %*s %*s %4095s %4095s", root, point) != 2)
            continue;
        const char *sep = strstr(line, " - ");
        if (!sep)
            continue;
        char fstype[64], source[256], opts[1024];
        if (sscanf(sep + 3, "%63s %255s %1023s", fstype, source, opts) != 3)
            continue;
        struct cg_mount *m = NULL;
        if (strcmp(fstype, "cgroup2") == 0 && !v2->found)
            m = v2;
        else if (strcmp(fstype, "cgroup") == 0 && !v1->found && list_has(opts, "cpu"))
            m = v1;
        if (m) {
            snprintf(m->root, sizeof(m->root), "%s", root);
            snprintf(m->point, sizeof(m->point), "%s", point);
            m->found = true;
        }
    }
    fclose(f);
}

/* This process's cgroup paths: the v2 one ("0::/x") and the v1 cpu one. */
static void find_cgroups(char *v2, char *v1, size_t len)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = 0;
        if (strcmp(line, "0") == 0 && c1[1] == 0)
            snprintf(v2, len, "%s", c2 + 1);
        else if (list_has(c1 + 1, "cpu"))
            snprintf(v1, len, "%s", c2 + 1);
    }
    fclose(f);
}

/* The smallest quota from the process's cgroup up to the top of the mount;
 * 0 if none. */
static int walk_quota(const struct cg_mount *m, const char *cgroup, bool v2)
{
    if (!m->found || !cgroup[0])
        return 0;
    /* the cgroup path is seen from the namespace's root; the mount shows m->root */
    const char *rel = cgroup;
    size_t rl = strlen(m->root);
    if (strcmp(m->root, "/") != 0) {
        if (strncmp(cgroup, m->root, rl) != 0 || (cgroup[rl] && cgroup[rl] != '/'))
            return 0; /* not under this mount: nothing to read */
        rel = cgroup + rl;
    }
    char dir[PATH_MAX], a[PATH_MAX + 32], b[PATH_MAX + 32];
    if (snprintf(dir, sizeof(dir), "%s%s", m->point, rel) >= (int)sizeof(dir))
        return 0;
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dir[--dl] = 0;
    size_t top = strlen(m->point);
    int best = 0;
    for (;;) {
        int n;
        if (v2) {
            snprintf(a, sizeof(a), "%s/cpu.max", dir);
            n = umbp_cpus_parse_cpu_max(a);
        } else {
            snprintf(a, sizeof(a), "%s/cpu.cfs_quota_us", dir);
            snprintf(b, sizeof(b), "%s/cpu.cfs_period_us", dir);
            n = umbp_cpus_parse_cfs(a, b);
        }
        if (n > 0 && (best == 0 || n < best))
            best = n;
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < top)
            break;
        *slash = 0; /* the parent: stop after the mount point itself */
    }
    return best;
}

int umbp_cpus_cgroup_quota(void)
{
    static struct cg_mount v2m, v1m; /* large: only ever one caller (the once) */
    static char v2[PATH_MAX], v1[PATH_MAX];
    memset(&v2m, 0, sizeof(v2m));
    memset(&v1m, 0, sizeof(v1m));
    v2[0] = v1[0] = 0;
    find_mounts(&v2m, &v1m);
    find_cgroups(v2, v1, sizeof(v2));
    int a = walk_quota(&v2m, v2, true), b = walk_quota(&v1m, v1, false);
    return a && b ? (a < b ? a : b) : a ? a : b;
}

/* ---- the answer ---------------------------------------------------------------------------- */

static int usable;
static pthread_once_t usable_once = PTHREAD_ONCE_INIT;

static void usable_compute(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n = online > 0 ? (int)online : 1;
    cpu_set_t *set = NULL;
    /* masks can be larger than cpu_set_t on big hosts: grow until it fits */
    for (int size = 1024; size <= (1 << 18); size *= 2) {
        set = CPU_ALLOC((size_t)size);
        if (!set)
            break;
        size_t bytes = CPU_ALLOC_SIZE((size_t)size);
        if (sched_getaffinity(0, bytes, set) == 0) {
            int c = CPU_COUNT_S(bytes, set);
            if (c > 0)
                n = c;
            CPU_FREE(set);
            break;
        }
        CPU_FREE(set);
        if (errno != EINVAL)
            break;
    }
    int quota = umbp_cpus_cgroup_quota();
    if (quota > 0 && quota < n)
        n = quota;
    usable = n < 1 ? 1 : n;
}

int umbp_usable_cpus(void)
{
    pthread_once(&usable_once, usable_compute);
    return usable;
}
