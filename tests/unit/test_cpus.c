/*
 * test_cpus - umbp_usable_cpus (common/cpus.c): the CPUs this process may
 * use are its affinity mask capped by its cgroup's CPU quota, not the
 * host's online count.  A child restricted to one CPU with sched_setaffinity
 * counts 1 (and poll_wait auto does not poll there); a child in a cgroup
 * with a quota of half a CPU counts 1 although its mask allows more; the
 * cpu.max and cfs parsers read the numbers right and ignore garbage.
 *
 * Each check that needs a fresh (uncached) answer runs in a forked child,
 * which reports through its exit status.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "options.h"
#include "util.h"

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof(dir), "/tmp/umbp-test-cpus-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static const char *write_file(const char *name, const char *text)
{
    static char path[8][128];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 128, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static void remove_dir(void)
{
    static const char *const names[] = {"cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"};
    char p[128];
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Runs fn in a forked child and returns its exit status. */
static int in_child(int (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(fn(arg));
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "child died");
    return WEXITSTATUS(st);
}

Test(cpus, cpu_max_parser, .fini = remove_dir)
{
    make_dir();
    static const struct {
        const char *text;
        int cpus;
    } cases[] = {
        {"max 100000\n", 0},      /* no limit */
        {"150000 100000\n", 2},   /* 1.5 CPUs' worth: rounds up */
        {"50000 100000\n", 1},
        {"200000 100000\n", 2},
        {"1000 1000", 1},
        {"6400000 100000\n", 64},
        {"garbage\n", 0},
        {"", 0},
        {"100000\n", 0},          /* no period */
        {"x 100000\n", 0},
        {"200000 0\n", 0},        /* period 0 */
        {"200000 abc\n", 0},
        {"-5 100000\n", 0},
        {"200000 100000 7\n", 0}, /* trailing junk */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *p = write_file("cpu.max", cases[i].text);
        cr_expect_eq(umbp_cpus_parse_cpu_max(p), cases[i].cpus, "cpu.max \"%s\"", cases[i].text);
    }
    char missing[128];
    snprintf(missing, sizeof(missing), "%s/nosuch", dir);
    cr_expect_eq(umbp_cpus_parse_cpu_max(missing), 0, "a missing file is no limit");
}

Test(cpus, cfs_parser, .fini = remove_dir)
{
    make_dir();
    static const struct {
        const char *quota, *period;
        int cpus;
    } cases[] = {
        {"-1\n", "100000\n", 0},   /* no limit */
        {"150000\n", "100000\n", 2},
        {"50000\n", "100000\n", 1},
        {"300000\n", "100000\n", 3},
        {"garbage\n", "100000\n", 0},
        {"150000\n", "garbage\n", 0},
        {"150000\n", "0\n", 0},
        {"", "100000\n", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *q = write_file("cpu.cfs_quota_us", cases[i].quota);
        const char *p = write_file("cpu.cfs_period_us", cases[i].period);
        cr_expect_eq(umbp_cpus_parse_cfs(q, p), cases[i].cpus, "quota \"%s\" period \"%s\"",
                     cases[i].quota, cases[i].period);
    }
    char missing[128];
    snprintf(missing, sizeof(missing), "%s/nosuch", dir);
    cr_expect_eq(umbp_cpus_parse_cfs(missing, missing), 0);
}

Test(cpus, within_the_online_count)
{
    int n = umbp_usable_cpus();
    cr_assert_geq(n, 1);
    cr_assert_leq(n, sysconf(_SC_NPROCESSORS_ONLN));
    cr_assert_eq(umbp_usable_cpus(), n, "cached: the same answer twice");
}

static int one_cpu_child(void *arg)
{
    (void)arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        return 100;
    int n = umbp_usable_cpus();
    /* poll_wait auto must not poll with one CPU; on always does */
    if (umbp_poll_wait_spins("auto") || !umbp_poll_wait_spins("on") ||
        umbp_poll_wait_spins("off"))
        return 101;
    return n;
}

Test(cpus, affinity_of_one_cpu_counts_one)
{
    cr_assert_eq(in_child(one_cpu_child, NULL), 1);
}

/* A real cgroup with a quota of half a CPU (v1 cpu controller or v2
 * cpu.max), the child moved into it: it counts 1 although its affinity mask
 * allows every CPU.  Needs root, a writable cgroup mount and two CPUs. */
struct cg {
    char path[256];
    bool v2;
};

static bool write_str(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    bool ok = write(fd, s, strlen(s)) == (ssize_t)strlen(s);
    close(fd);
    return ok;
}

static bool cg_make(struct cg *c)
{
    char f[320];
    if (access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", F_OK) == 0) {
        c->v2 = false;
        snprintf(c->path, sizeof(c->path), "/sys/fs/cgroup/cpu/umbp-test-cpus-%d", (int)getpid());
        if (mkdir(c->path, 0755) != 0)
            return false;
        snprintf(f, sizeof(f), "%s/cpu.cfs_period_us", c->path);
        if (!write_str(f, "100000"))
            return false;
        snprintf(f, sizeof(f), "%s/cpu.cfs_quota_us", c->path);
        return write_str(f, "50000");
    }
    if (access("/sys/fs/cgroup/cgroup.subtree_control", F_OK) == 0) {
        c->v2 = true;
        write_str("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
        snprintf(c->path, sizeof(c->path), "/sys/fs/cgroup/umbp-test-cpus-%d", (int)getpid());
        if (mkdir(c->path, 0755) != 0)
            return false;
        snprintf(f, sizeof(f), "%s/cpu.max", c->path);
        return write_str(f, "50000 100000");
    }
    return false;
}

static int quota_child(void *arg)
{
    struct cg *c = arg;
    char f[320], pid[32];
    snprintf(f, sizeof(f), "%s/cgroup.procs", c->path);
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    if (!write_str(f, pid))
        return 100;
    if (umbp_cpus_cgroup_quota() != 1)
        return 101;
    return umbp_usable_cpus();
}

Test(cpus, cgroup_quota_of_half_a_cpu_counts_one)
{
    cpu_set_t mask; /* not umbp_usable_cpus: the child would inherit its cache */
    if (sched_getaffinity(0, sizeof(mask), &mask) != 0 || CPU_COUNT(&mask) < 2)
        cr_skip_test("needs two usable CPUs to tell the quota from the affinity mask");
    struct cg c = {0};
    if (geteuid() != 0 || !cg_make(&c)) {
        if (c.path[0])
            rmdir(c.path);
        cr_skip_test("cannot create a cgroup with a CPU quota here (needs root and a "
                     "writable cgroup mount)");
    }
    int got = in_child(quota_child, &c);
    rmdir(c.path);
    cr_assert_neq(got, 100, "could not move the child into %s", c.path);
    cr_assert_neq(got, 101, "umbp_cpus_cgroup_quota did not find the quota of %s", c.path);
    cr_assert_eq(got, 1, "a half-CPU quota (%s) counts %d CPUs", c.v2 ? "v2" : "v1", got);
}
