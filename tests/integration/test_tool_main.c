/*
 * test_tool_main.c - the daemons' one main (common/tool_main.c) through the
 * real umbp-server and umbp-master binaries: every argument error's exact
 * message and exit status, --help, an unreadable --config, a refused
 * option, and a served process stopped by SIGTERM or SIGINT (exit 0, its
 * stopping line) that survives a SIGPIPE.  Each tool must say the same with
 * its own name in front.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

struct tool {
    const char *bin, *name;
    const char *help_option; /* an option --help must list */
};

static const struct tool tools[] = {
    {UMBP_SERVER_BIN, "umbp-server", "socket_dir"},
    {UMBP_MASTER_BIN, "umbp-master", "heartbeat_dead_ms"},
};

static char dir[] = "/tmp/umbp-tool-main-XXXXXX";

static void setup(void)
{
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(tool_main, .init = setup, .fini = teardown);

/* Starts bin with args (NULL-terminated), stdout and stderr into files of dir. */
static pid_t start(const char *bin, const char *const *args)
{
    char out[256], err[256];
    snprintf(out, sizeof(out), "%s/out", dir);
    snprintf(err, sizeof(err), "%s/err", dir);
    /* no earlier run's text may be taken for this one's */
    unlink(out);
    unlink(err);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(99);
        const char *argv[16] = {bin};
        for (int i = 0; args[i] && i < 14; i++)
            argv[i + 1] = args[i];
        execv(bin, (char **)argv);
        _exit(98);
    }
    return pid;
}

/* Its exit status; killed and failed if it has not exited after 20 s. */
static int finish(pid_t pid)
{
    int st = 0;
    for (int i = 0; i < 2000; i++) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        cr_assert_geq(r, 0);
        if (r == pid) {
            cr_assert(WIFEXITED(st), "killed by signal %d", WTERMSIG(st));
            return WEXITSTATUS(st);
        }
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    cr_assert_fail("did not exit");
    return -1;
}

static int run(const struct tool *t, const char *const *args)
{
    return finish(start(t->bin, args));
}

static const char *err_text(void)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/err", dir);
    return tu_slurp(p);
}

static const char *out_text(void)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/out", dir);
    return tu_slurp(p);
}

static bool starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

Test(tool_main, argument_errors_exit_2_with_the_same_messages)
{
    for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
        const struct tool *t = &tools[i];
        char want[256], usage[128];
        snprintf(usage, sizeof(usage), "usage: %s [--config FILE | --json JSON]\n", t->name);

        cr_expect_eq(run(t, (const char *[]){"--bogus", NULL}), 2, "%s", t->name);
        snprintf(want, sizeof(want), "%s: unknown argument '--bogus'\n%s", t->name, usage);
        cr_expect(starts_with(err_text(), want), "%s: '%s'", t->name, err_text());
        cr_expect_str_empty(out_text(), "%s", t->name);

        cr_expect_eq(run(t, (const char *[]){"--json", NULL}), 2, "%s", t->name);
        snprintf(want, sizeof(want), "%s: missing the value of '--json'\n%s", t->name, usage);
        cr_expect(starts_with(err_text(), want), "%s: '%s'", t->name, err_text());

        cr_expect_eq(run(t, (const char *[]){"--config", "x.json", "--json", "{}", NULL}), 2);
        snprintf(want, sizeof(want), "%s: give --config or --json, not both\n", t->name);
        cr_expect_str_eq(err_text(), want, "%s", t->name);

        char missing[256];
        snprintf(missing, sizeof(missing), "%s/no-such.json", dir);
        cr_expect_eq(run(t, (const char *[]){"--config", missing, NULL}), 2, "%s", t->name);
        snprintf(want, sizeof(want), "%s: --config ", t->name);
        cr_expect(starts_with(err_text(), want) && strstr(err_text(), missing),
                  "%s: '%s' should name %s", t->name, err_text(), missing);
    }
}

Test(tool_main, help_lists_the_options_and_exits_0)
{
    for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
        const struct tool *t = &tools[i];
        /* --help wins wherever it stands, even after a bad argument's value */
        cr_expect_eq(run(t, (const char *[]){"--json", "{}", "--help", NULL}), 0, "%s", t->name);
        char want[128], row[128];
        snprintf(want, sizeof(want), "usage: %s [--config FILE | --json JSON]\n", t->name);
        snprintf(row, sizeof(row), "\n  %-22s default \"", t->help_option);
        cr_expect(starts_with(out_text(), want), "%s: '%s'", t->name, out_text());
        cr_expect(strstr(out_text(), row), "%s: --help should list %s", t->name, t->help_option);
        cr_expect_str_empty(err_text(), "%s", t->name);
    }
}

Test(tool_main, a_refused_option_exits_1_naming_it)
{
    for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
        const struct tool *t = &tools[i];
        char path[256];
        snprintf(path, sizeof(path), "%s/c.json", dir);
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        fputs("{\"no_such_option_zq\": 1}", f);
        fclose(f);
        cr_expect_eq(run(t, (const char *[]){"--config", path, NULL}), 1, "%s", t->name);
        char want[64];
        snprintf(want, sizeof(want), "%s: ", t->name);
        cr_expect(starts_with(err_text(), want) && strstr(err_text(), "no_such_option_zq"),
                  "%s: '%s'", t->name, err_text());
    }
}

/* Serves, waits for its serving line, sends SIGPIPE (ignored: it must go
 * on serving) then sig; it must exit 0 saying it stops. */
static void serve_and_stop(const struct tool *t, int sig)
{
    char json[512];
    if (strcmp(t->name, "umbp-server") == 0)
        snprintf(json, sizeof(json), "{\"socket_dir\": \"%s\", \"capacity_bytes\": \"16MiB\"}",
                 dir);
    else
        snprintf(json, sizeof(json), "{\"listen\": \"127.0.0.1:0\"}");
    pid_t pid = start(t->bin, (const char *[]){"--json", json, NULL});
    char serving[64], stopping[64];
    snprintf(serving, sizeof(serving), "%s: serving ", t->name);
    snprintf(stopping, sizeof(stopping), "\n%s: stopping", t->name);
    bool up = false;
    for (int i = 0; i < 2000 && !up; i++) {
        up = strstr(err_text(), serving) != NULL;
        if (!up) {
            cr_assert_eq(waitpid(pid, NULL, WNOHANG), 0, "%s exited: %s", t->name, err_text());
            usleep(10000);
        }
    }
    cr_assert(up, "%s never said it serves: '%s'", t->name, err_text());
    cr_assert_eq(kill(pid, SIGPIPE), 0);
    cr_assert_eq(kill(pid, sig), 0);
    cr_expect_eq(finish(pid), 0, "%s after signal %d", t->name, sig);
    cr_expect(strstr(err_text(), stopping), "%s: '%s'", t->name, err_text());
}

Test(tool_main, sigterm_and_sigint_stop_cleanly_sigpipe_is_ignored)
{
    for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
        serve_and_stop(&tools[i], SIGTERM);
        serve_and_stop(&tools[i], SIGINT);
    }
}
