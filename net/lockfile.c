/*
 * lockfile.c - the lock file beside a Unix socket path (see lockfile.h).
 * Threads: the caller's; no state.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lockfile.h"

#define ATTEMPTS 8

/* The pid the holder wrote, if the file has any bytes. */
static bool holder_pid(int fd, long *pid)
{
    char buf[32] = "";
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    *pid = strtol(buf, NULL, 10);
    return true;
}

/* The file we locked is still the one at lock_path. */
static bool lock_is_current(const char *lock_path, int fd)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(lock_path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

void net_lock_take(const char *lock_path, struct net_lock_result *r)
{
    *r = (struct net_lock_result){.outcome = NET_LOCK_REPLACED, .fd = -1, .holder_pid = -1};
    for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
        int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
            r->outcome = NET_LOCK_OPEN_FAILED;
            r->err = errno;
            return;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
            int e = errno;
            if (e == EWOULDBLOCK) {
                r->outcome = NET_LOCK_HELD;
                r->holder_known = holder_pid(fd, &r->holder_pid);
            } else {
                r->outcome = NET_LOCK_FLOCK_FAILED;
                r->err = e;
            }
            close(fd);
            return;
        }
        if (lock_is_current(lock_path, fd)) {
            char pid[32];
            int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
                r->pid_failed = true;
                r->pid_errno = errno;
            }
            r->outcome = NET_LOCK_TAKEN;
            r->fd = fd;
            return;
        }
        close(fd);
    }
}

void net_lock_release(const char *lock_path, int fd)
{
    if (fd < 0)
        return;
    unlink(lock_path); /* while still locked: see lock_is_current */
    close(fd);
}
