/*
 * server_fixture.h - a private umbp-server for a test process (header only).
 *
 * Tests of standalone mode start a real server (the binary the build made,
 * UMBP_SERVER_BIN, from tests/CMakeLists.txt) in a temporary socket_dir of
 * their own, so parallel test processes never meet.  The server gets the
 * same JSON as the runtime under test (it accepts the clients' options and
 * ignores the ones it has no use for) plus that socket_dir; its stdout and
 * stderr go to server.log in the directory, which is printed when it fails
 * to start.  PR_SET_PDEATHSIG kills it if the test process dies first.
 *
 * One test thread drives a fixture; nothing here is thread-safe.
 */
#ifndef UMBP_SERVER_FIXTURE_H
#define UMBP_SERVER_FIXTURE_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

struct tu_server {
    pid_t pid;          /* 0: not running */
    char dir[64];       /* "" until the first start */
    char sock[128];     /* <dir>/umbp-dp<dp_rank>[-<instance>].sock */
};

static inline bool tu_server_built(void)
{
#ifdef UMBP_SERVER_BIN
    return access(UMBP_SERVER_BIN, X_OK) == 0;
#else
    return false;
#endif
}

/* json with `member` ("\"name\": value") added as its last member. */
static inline void tu_json_add(char *out, size_t outlen, const char *json, const char *member)
{
    const char *end = strrchr(json, '}');
    cr_assert_not_null(end, "not a JSON object: %s", json);
    const char *p = json;
    while (*p == ' ' || *p == '{')
        p++;
    bool empty = p == end;
    int n = snprintf(out, outlen, "%.*s%s%s}", (int)(end - json), json, empty ? "" : ", ",
                     member);
    cr_assert(n > 0 && (size_t)n < outlen, "JSON too long: %s", json);
}

static inline void tu_server_cleanup(struct tu_server *s);

/* Fixtures of this process with a directory, cleaned at exit too (a failed
 * assertion ends the test before its own cleanup). */
static struct tu_server *tu_servers_live[8];

static inline void tu_servers_at_exit(void)
{
    for (size_t i = 0; i < 8; i++)
        if (tu_servers_live[i])
            tu_server_cleanup(tu_servers_live[i]);
}

static inline void tu_server_track(struct tu_server *s)
{
    static bool registered;
    if (!registered && atexit(tu_servers_at_exit) == 0)
        registered = true;
    for (size_t i = 0; i < 8; i++)
        if (tu_servers_live[i] == s)
            return;
    for (size_t i = 0; i < 8; i++)
        if (!tu_servers_live[i]) {
            tu_servers_live[i] = s;
            return;
        }
}

/* The directory, once: a private temp dir (0700). */
static inline const char *tu_server_dir(struct tu_server *s)
{
    if (!s->dir[0]) {
        tu_server_track(s);
        snprintf(s->dir, sizeof(s->dir), "/tmp/umbp-test-XXXXXX");
        cr_assert_not_null(mkdtemp(s->dir), "mkdtemp: %s", strerror(errno));
        snprintf(s->sock, sizeof(s->sock), "%s/umbp-dp0.sock", s->dir);
    }
    return s->dir;
}

/* The "socket_dir" member to add to a runtime's JSON. */
static inline void tu_server_member(struct tu_server *s, char *out, size_t outlen)
{
    snprintf(out, outlen, "\"socket_dir\": \"%s\"", tu_server_dir(s));
}

/* runtime JSON + this fixture's socket_dir. */
static inline void tu_server_json(struct tu_server *s, char *out, size_t outlen,
                                  const char *json)
{
    char m[160];
    tu_server_member(s, m, sizeof(m));
    tu_json_add(out, outlen, json, m);
}

static inline bool tu_server_answers(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t len = strlen(path);
    if (len >= sizeof(a.sun_path))
        return false;
    memcpy(a.sun_path, path, len + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static inline void tu_server_print_log(const struct tu_server *s)
{
    char path[160], line[512];
    snprintf(path, sizeof(path), "%s/server.log", s->dir);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof(line), f))
        cr_log_error("umbp-server: %s", line);
    if (f)
        fclose(f);
}

/* Starts the server with `json` (a runtime's config; socket_dir is added)
 * and waits until its socket answers.  Waits for dp_rank 0 unless `sock`
 * was set by the caller after tu_server_dir. */
static inline void tu_server_start(struct tu_server *s, const char *json)
{
    cr_assert(tu_server_built(), "umbp-server was not built");
    cr_assert_eq(s->pid, 0, "a server of this fixture is already running");
    char cfg[4096];
    tu_server_json(s, cfg, sizeof(cfg), json ? json : "{}");
    char log[160];
    snprintf(log, sizeof(log), "%s/server.log", s->dir);
#ifdef UMBP_SERVER_BIN
    pid_t pid = tu_spawn_server(UMBP_SERVER_BIN, cfg, log);
#else
    pid_t pid = tu_spawn_server("/nonexistent/umbp-server", cfg, log);
#endif
    s->pid = pid;
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (!tu_server_answers(s->sock)) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            tu_server_print_log(s);
            cr_assert_fail("umbp-server exited during startup (status 0x%x); config %s", st, cfg);
        }
        cr_assert(tu_now_ms() < end, "umbp-server never answered at %s", s->sock);
        tu_sleep_ms(2);
    }
}

/* Sends sig (SIGSTOP, SIGCONT, ...) to the running server. */
static inline void tu_server_signal(struct tu_server *s, int sig)
{
    cr_assert_gt(s->pid, 0, "no server running");
    tu_kill_wait(s->pid, sig);
}

/* SIGKILL and reap; nothing if not running. */
static inline void tu_server_stop(struct tu_server *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGCONT); /* a stopped process dies of SIGKILL too, but be plain */
    kill(s->pid, SIGKILL);
    while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    s->pid = 0;
}

/* Stops the server and removes the directory and the files in it. */
static inline void tu_server_cleanup(struct tu_server *s)
{
    tu_server_stop(s);
    if (!s->dir[0])
        return;
    tu_rmdir_flat(s->dir);
    s->dir[0] = 0;
    for (size_t i = 0; i < 8; i++)
        if (tu_servers_live[i] == s)
            tu_servers_live[i] = NULL;
}

#endif /* UMBP_SERVER_FIXTURE_H */
