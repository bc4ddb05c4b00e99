/*
 * test_accept - umbp_accept_batch, the accept loop of umbp-server and the
 * lookup service: it hands every pending connection over (non-blocking,
 * close-on-exec), stops at the batch size, returns 0 on an empty backlog and
 * -EMFILE when the process is out of descriptors, after which the pending
 * connections are still there to be taken.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "util.h"

struct taken {
    int fds[64];
    int n;
    bool flags_ok;
};

static void take(void *ctx, int fd)
{
    struct taken *t = ctx;
    int fl = fcntl(fd, F_GETFL), fd_fl = fcntl(fd, F_GETFD);
    if (!(fl & O_NONBLOCK) || !(fd_fl & FD_CLOEXEC))
        t->flags_ok = false;
    if (t->n < 64)
        t->fds[t->n++] = fd;
    else
        close(fd);
}

static int listener(char *path, size_t len)
{
    snprintf(path, len, "/tmp/umbp-test-accept-%d.sock", (int)getpid());
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(fd, 64), 0);
    return fd;
}

static int dial(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

Test(accept, batches_drains_and_reports_descriptor_exhaustion)
{
    char path[108];
    int lfd = listener(path, sizeof(path));
    struct taken t = {.flags_ok = true};
    cr_assert_eq(umbp_accept_batch(lfd, 8, take, &t), 0, "empty backlog");
    cr_assert_eq(t.n, 0);

    int cl[12];
    for (int i = 0; i < 12; i++)
        cl[i] = dial(path);
    cr_assert_eq(umbp_accept_batch(lfd, 5, take, &t), 0);
    cr_assert_eq(t.n, 5, "a batch of 5 took %d", t.n);
    cr_assert(t.flags_ok, "accepted descriptors are non-blocking and close-on-exec");

    /* out of descriptors: the lowest free one is the limit */
    struct rlimit old, low;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    int probe = dup(0);
    close(probe);
    low = old;
    low.rlim_cur = (rlim_t)probe;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    int rc = umbp_accept_batch(lfd, 5, take, &t);
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
    cr_assert_eq(rc, -EMFILE, "got %d", rc);
    cr_assert_eq(t.n, 5);

    /* the rest waited in the backlog */
    cr_assert_eq(umbp_accept_batch(lfd, 64, take, &t), 0);
    cr_assert_eq(t.n, 12);
    for (int i = 0; i < t.n; i++)
        close(t.fds[i]);
    for (int i = 0; i < 12; i++)
        close(cl[i]);
    close(lfd);
    unlink(path);
}
