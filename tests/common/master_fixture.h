/*
 * master_fixture.h - a real umbp-master process for tests: started on a
 * free loopback port with extra options, waited for until it accepts
 * (bounded), signalled, and killed with its test (PR_SET_PDEATHSIG).
 * Needs UMBP_MASTER_BIN (the build defines it).
 */
#ifndef UMBP_TEST_MASTER_FIXTURE_H
#define UMBP_TEST_MASTER_FIXTURE_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcp.h"
#include "test_util.h"

#ifndef UMBP_MASTER_BIN
#error "UMBP_MASTER_BIN must name the umbp-master binary"
#endif

struct master {
    pid_t pid;
    uint16_t port;
    char addr[64];
    char log[128];
};

static inline uint16_t free_port(void)
{
    int fd;
    uint16_t port;
    cr_assert_eq(net_tcp_listen("127.0.0.1:0", "test", 1, &fd, &port, NULL, 0), 0);
    close(fd);
    return port;
}

static inline bool accepts(uint16_t port)
{
    char a[64];
    int fd;
    snprintf(a, sizeof(a), "127.0.0.1:%u", port);
    int rc = net_tcp_connect(a, &fd);
    if (rc == -EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        int e = 0;
        socklen_t l = sizeof(e);
        rc = poll(&p, 1, 1000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l) == 0 && !e
                 ? 0 : -1;
    }
    if (rc != -ECONNREFUSED && rc != -EADDRNOTAVAIL)
        close(fd);
    return rc == 0;
}

/* Starts umbp-master on m->port (0: a free one) with extra options (JSON
 * members, without braces). */
static inline void master_start(struct master *m, const char *extra)
{
    if (!m->port)
        m->port = free_port();
    snprintf(m->addr, sizeof(m->addr), "127.0.0.1:%u", m->port);
    if (!m->log[0])
        snprintf(m->log, sizeof(m->log), "/tmp/test_master.%s.%u.log", tu_run_tag(), m->port);
    char json[1024];
    snprintf(json, sizeof(json), "{\"listen\": \"%s\", \"log_level\": \"info\"%s%s}", m->addr,
             extra && *extra ? ", " : "", extra ? extra : "");
    m->pid = fork();
    cr_assert_geq(m->pid, 0);
    if (m->pid == 0) {
        int fd = open(m->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test leaves no master behind */
        execl(UMBP_MASTER_BIN, "umbp-master", "--json", json, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1000 && !accepts(m->port); i++) {
        int st;
        cr_assert_eq(waitpid(m->pid, &st, WNOHANG), 0, "umbp-master exited; see %s", m->log);
        usleep(10000);
    }
    cr_assert(accepts(m->port), "umbp-master does not accept on %s", m->addr);
}

static inline void master_kill(struct master *m, int sig)
{
    int st;
    kill(m->pid, sig);
    if (sig == SIGKILL || sig == SIGTERM)
        waitpid(m->pid, &st, 0);
}

#endif /* UMBP_TEST_MASTER_FIXTURE_H */
