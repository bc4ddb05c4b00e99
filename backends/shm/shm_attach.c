/*
 * shm_attach.c - attaching to the host's umbp-server when the tier is
 * created: find it at its socket (or start it, with auto_start), then the
 * blocking handshake HELLO -> HELLO_OK (+ the pool's fd) and a first STATS.
 *
 * Caller's thread, before the loop thread exists; may block, always bounded
 * by startup_timeout_ms.  Also the HELLO_OK adoption that the loop thread
 * uses on every reconnect (shm_welcome).
 *
 * auto_start is race-free across processes and threads: whoever finds no
 * server takes an exclusive flock on "<socket>.start", looks again (another
 * creator may have started one meanwhile) and only then spawns umbp-server,
 * detached (double fork, setsid; it outlives this engine by design), then
 * polls the socket until it answers.  The server gets the options this
 * tier can see (core capacity, socket, log level) as --json; pool options
 * (dram_*, the server's own) come from its config file or the UMBP_*
 * environment, which it inherits.
 */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"

static uint64_t now_ms(void) { return umbp_now_ns() / 1000000ull; }

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- finding the server --------------------------------------------------- */

/* One blocking connect: 0 and *out, or -errno. */
static int connect_once(const char *path, int *out)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    *out = fd;
    return 0;
}

int shm_check_peer(int fd, const char *path, char *err, size_t errlen)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
        snprintf(err, errlen, "cannot ask who serves %s: %s", path, strerror(errno));
        return -errno;
    }
    if (cr.uid != geteuid() && cr.uid != 0) {
        snprintf(err, errlen, "the umbp-server at %s runs as uid %u, not as this process's "
                 "uid %u; refusing its pool (use a socket_dir of your own)", path,
                 (unsigned)cr.uid, (unsigned)geteuid());
        return -EACCES;
    }
    return 0;
}

static int no_server(const struct shm_tier *st, int why, char *err, size_t errlen)
{
    snprintf(err, errlen, "no umbp-server answers at %s (%s); start one (umbp-server --config "
             "<file> with the same socket_dir, dp_rank=%lld and lookup_instance=\"%s\") or set "
             "auto_start", st->path, strerror(-why), (long long)st->cfg.dp_rank,
             st->cfg.lookup_instance);
    return -ECONNREFUSED;
}

int shm_denied(const struct shm_tier *st, int why, char *err, size_t errlen)
{
    char dir[SHM_PATH_MAX];
    struct stat ds, ss;
    shm_config_socket_dir(&st->cfg, dir, sizeof(dir));
    unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
    const char *fix = "run as that user, or have its umbp-server share it with a group of "
                      "this user (socket_group, with allowed_gids)";
    if (stat(dir, &ds) == 0 && faccessat(AT_FDCWD, dir, X_OK, AT_EACCESS) < 0)
        snprintf(err, errlen, "permission denied on the socket directory %s (owner uid %u, "
                 "group %u, mode %04o): this process (uid %u, gid %u) cannot search it to "
                 "reach %s; %s", dir, (unsigned)ds.st_uid, (unsigned)ds.st_gid,
                 (unsigned)(ds.st_mode & 07777), uid, gid, st->path, fix);
    else if (stat(st->path, &ss) == 0)
        snprintf(err, errlen, "permission denied on the socket %s (owner uid %u, group %u, "
                 "mode %04o): this process (uid %u, gid %u) cannot write it; %s", st->path,
                 (unsigned)ss.st_uid, (unsigned)ss.st_gid, (unsigned)(ss.st_mode & 07777),
                 uid, gid, fix);
    else
        snprintf(err, errlen, "permission denied on the socket directory %s (or socket "
                 "%s): %s (this process: uid %u, gid %u); %s", dir, st->path,
                 strerror(-why), uid, gid, fix);
    return why;
}

/* ---- auto_start ------------------------------------------------------------ */

static int make_dir(const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0700) == 0 || errno == EEXIST)
        return 0;
    snprintf(err, errlen, "auto_start: cannot create socket_dir %s: %s", dir, strerror(errno));
    return -errno;
}

/* Exclusive flock on <socket>.start, polled so it stays bounded. */
static int lock_start(const struct shm_tier *st, uint64_t deadline, int *out, char *err,
                      size_t errlen)
{
    char lp[SHM_PATH_MAX + 16];
    snprintf(lp, sizeof(lp), "%s.start", st->path);
    int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "auto_start: cannot open the start lock %s: %s", lp,
                 strerror(errno));
        return -errno;
    }
    while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || now_ms() >= deadline) {
            snprintf(err, errlen, "auto_start: the start lock %s stayed taken for "
                     "startup_timeout_ms=%lld (another process starting umbp-server hangs?)",
                     lp, (long long)st->cfg.startup_timeout_ms);
            close(fd);
            return -ETIMEDOUT;
        }
        sleep_ms(5);
    }
    *out = fd;
    return 0;
}

/* The options the server should share with this client, as JSON. */
static char *server_json(const struct shm_tier *st, const char *dir)
{
    const struct umbp_core_config *core = st->base.env.core;
    json_object *o = json_object_new_object();
    if (!o)
        return NULL;
    if (core->capacity_bytes || core->total_capacity_bytes)
        json_object_object_add(o, "capacity_bytes",
                               json_object_new_int64((int64_t)st->base.env.capacity_bytes));
    json_object_object_add(o, "socket_dir", json_object_new_string(dir));
    if (st->cfg.lookup_instance[0])
        json_object_object_add(o, "lookup_instance",
                               json_object_new_string(st->cfg.lookup_instance));
    json_object_object_add(o, "dp_rank", json_object_new_int64(st->cfg.dp_rank));
    json_object_object_add(o, "log_level", json_object_new_string(core->log_level));
    char *s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
    return s;
}

/* What the spawned processes report through the pipe. */
struct spawn_note {
    char tag; /* 'P': the server's pid; 'E': errno of fork/exec */
    int value;
};

static void note(int fd, char tag, int value)
{
    struct spawn_note n = {tag, value};
    ssize_t r = write(fd, &n, sizeof(n));
    (void)r;
}

/* The grandchild: a detached session, fresh signal state, log as stdio. */
static void exec_server(char *const argv[], int logfd, int nullfd, int notefd)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP)
            signal(s, SIG_DFL);
    setsid();
    dup2(nullfd, 0);
    dup2(logfd, 1);
    dup2(logfd, 2);
#ifdef SYS_close_range
    syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
#endif
    execvp(argv[0], argv);
    note(notefd, 'E', errno);
    _exit(127);
}

/* Reads the notes until both writers are gone (exec closes the last). */
static void read_notes(int fd, uint64_t deadline, pid_t *pid, int *exec_errno)
{
    struct spawn_note n;
    for (;;) {
        uint64_t now = now_ms();
        struct pollfd p = {fd, POLLIN, 0};
        if (now >= deadline || poll(&p, 1, (int)(deadline - now)) <= 0)
            return;
        ssize_t r = read(fd, &n, sizeof(n));
        if (r < 0 && errno == EINTR)
            continue;
        if (r != (ssize_t)sizeof(n))
            return;
        if (n.tag == 'P')
            *pid = n.value;
        else
            *exec_errno = n.value;
    }
}

static int spawn_fds(const struct shm_tier *st, int *logfd, int *nullfd, int pipefd[2],
                     char *err, size_t errlen)
{
    char lp[SHM_PATH_MAX + 16];
    snprintf(lp, sizeof(lp), "%s.log", st->path);
    *logfd = open(lp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    *nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (*logfd < 0 || *nullfd < 0 || pipe2(pipefd, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "auto_start: cannot open the server's log %s: %s", lp,
                 strerror(errno));
        if (*logfd >= 0)
            close(*logfd);
        if (*nullfd >= 0)
            close(*nullfd);
        return -EIO;
    }
    return 0;
}

/* Starts umbp-server detached; *pid is its pid (0 if unknown). */
static int spawn_server(const struct shm_tier *st, const char *dir, uint64_t deadline,
                        pid_t *pid, char *err, size_t errlen)
{
    char *json = server_json(st, dir);
    if (!json) {
        snprintf(err, errlen, "auto_start: out of memory");
        return -ENOMEM;
    }
    char *argv[] = {(char *)st->cfg.server_path, "--json", json, NULL};
    int logfd, nullfd, pfd[2], exec_errno = 0;
    int rc = spawn_fds(st, &logfd, &nullfd, pfd, err, errlen);
    if (rc < 0)
        goto out;
    pid_t c = fork();
    if (c == 0) {
        pid_t g = fork();
        if (g == 0)
            exec_server(argv, logfd, nullfd, pfd[1]);
        note(pfd[1], g > 0 ? 'P' : 'E', g > 0 ? g : errno);
        _exit(0);
    }
    close(pfd[1]);
    close(logfd);
    close(nullfd);
    if (c < 0) {
        exec_errno = errno;
    } else {
        while (waitpid(c, NULL, 0) < 0 && errno == EINTR)
            ;
        read_notes(pfd[0], deadline, pid, &exec_errno);
    }
    close(pfd[0]);
    if (exec_errno) {
        snprintf(err, errlen, "auto_start: cannot run server_path=%s: %s; set server_path to "
                 "the umbp-server binary (or put it in PATH)", st->cfg.server_path,
                 strerror(exec_errno));
        rc = -exec_errno;
    }
out:
    free(json);
    return rc;
}

/* The log's size now: what a server spawned next writes starts there. */
static off_t log_size(const char *sock)
{
    char lp[SHM_PATH_MAX + 16];
    struct stat sb;
    snprintf(lp, sizeof(lp), "%s.log", sock);
    return stat(lp, &sb) == 0 ? sb.st_size : 0;
}

/* The last non-empty line the spawned server wrote to its log past offset
 * start (what it said before it died: the dynamic loader's "error while
 * loading shared libraries: ..." on a host without a library it links, or
 * the server's own error; never an earlier server's line), as printable
 * text of at most len - 1 bytes; "" when there is none. */
static void log_tail(const char *sock, off_t start, char *out, size_t len)
{
    char lp[SHM_PATH_MAX + 16], buf[512];
    out[0] = '\0';
    snprintf(lp, sizeof(lp), "%s.log", sock);
    int fd = open(lp, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    off_t end = lseek(fd, 0, SEEK_END);
    off_t from = end > (off_t)sizeof(buf) - 1 ? end - (off_t)sizeof(buf) + 1 : 0;
    if (from < start)
        from = start;
    ssize_t n = end > from ? pread(fd, buf, (size_t)(end - from), from) : 0;
    close(fd);
    if (n <= 0)
        return;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        n--;
    ssize_t b = n;
    while (b > 0 && buf[b - 1] != '\n')
        b--;
    size_t k = 0;
    for (ssize_t i = b; i < n && k + 1 < len; i++)
        out[k++] = buf[i] >= 0x20 && buf[i] < 0x7f ? buf[i] : '?';
    out[k] = '\0';
}

/* Polls the socket until the spawned server answers. */
static int wait_server(const struct shm_tier *st, pid_t pid, off_t log_start, uint64_t deadline,
                       int *fd, char *err, size_t errlen)
{
    char said[256];
    for (;;) {
        if (connect_once(st->path, fd) == 0)
            return 0;
        if (pid > 0 && kill(pid, 0) < 0 && errno == ESRCH) {
            log_tail(st->path, log_start, said, sizeof(said));
            snprintf(err, errlen, "auto_start: umbp-server (pid %d) exited during startup%s%s; "
                     "its log is %s.log", (int)pid, said[0] ? ", saying: " : "", said,
                     st->path);
            return -ECONNREFUSED;
        }
        if (now_ms() >= deadline) {
            log_tail(st->path, log_start, said, sizeof(said));
            snprintf(err, errlen, "auto_start: umbp-server (pid %d) did not answer at %s "
                     "within startup_timeout_ms=%lld%s%s%s; its log is %s.log", (int)pid,
                     st->path, (long long)st->cfg.startup_timeout_ms,
                     said[0] ? " (its log's last line: " : "", said, said[0] ? ")" : "",
                     st->path);
            return -ETIMEDOUT;
        }
        sleep_ms(10);
    }
}

static int auto_start(const struct shm_tier *st, uint64_t deadline, int *fd, char *err,
                      size_t errlen)
{
    char dir[SHM_PATH_MAX];
    shm_config_socket_dir(&st->cfg, dir, sizeof(dir));
    int lock = -1, rc = make_dir(dir, err, errlen);
    if (rc < 0 || (rc = lock_start(st, deadline, &lock, err, errlen)) < 0)
        return rc;
    pid_t pid = 0;
    off_t log_start = log_size(st->path);
    if (connect_once(st->path, fd) == 0) /* another creator started it meanwhile */
        rc = 0;
    else if ((rc = spawn_server(st, dir, deadline, &pid, err, errlen)) == 0 &&
             (rc = wait_server(st, pid, log_start, deadline, fd, err, errlen)) == 0)
        umbp_log(UMBP_LOG_INFO, "auto_start: started umbp-server (pid %d) at %s", (int)pid,
                 st->path);
    close(lock); /* releases the flock */
    return rc;
}

/* ---- the blocking handshake ---------------------------------------------- */

/* One recvmsg into the session's input: bytes, 0 on EOF, -EAGAIN, -errno
 * (-EPROTO: an fd too many). */
static long in_read(struct shm_tier *st)
{
    uint8_t *p;
    size_t room;
    int fd = -1;
    if (net_session_in_space(&st->sess, &p, &room) < 0)
        return -ENOMEM;
    long r = proto_recv_with_fd(st->drv.fd, p, room, &fd);
    if (r < 0)
        return r;
    if (net_session_in_commit(&st->sess, (size_t)r, fd) < 0)
        return -EPROTO;
    return r;
}

static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, (int)(deadline - now));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -errno;
    }
}

int shm_flush_blocking(struct shm_tier *st, uint64_t deadline)
{
    while (st->sess.out.len) {
        size_t sent = 0;
        int rc = proto_out_send(st->drv.fd, &st->sess.out, &sent);
        proto_buf_consume(&st->sess.out, sent);
        if (rc < 0)
            return rc;
        if (!st->sess.out.len)
            break;
        rc = wait_fd(st->drv.fd, POLLOUT, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Waits for the next frame of a type in want[2] (EVENTS before it are
 * dropped: the runtime is not ready for them yet). */
static int recv_frame(struct shm_tier *st, const uint16_t want[2], uint64_t deadline,
                      struct proto_frame *f, long *used, char *err, size_t errlen)
{
    for (;;) {
        long r = net_session_in_next(&st->sess, f, err, errlen);
        if (r < 0)
            return (int)r;
        if (r > 0 && (f->type == want[0] || f->type == want[1])) {
            *used = r;
            return 0;
        }
        if (r > 0 && f->type != PROTO_EVENTS) {
            snprintf(err, errlen, "the server answered %s where %s was due",
                     proto_type_name(f->type), proto_type_name(want[0]));
            return -EPROTO;
        }
        if (r > 0) {
            net_session_in_consume(&st->sess, r);
            continue;
        }
        int rc = wait_fd(st->drv.fd, POLLIN, deadline);
        if (rc == 0) {
            r = in_read(st);
            rc = r == 0 ? -ECONNRESET : r < 0 && r != -EAGAIN ? (int)r : 0;
        }
        if (rc < 0) {
            snprintf(err, errlen, "%s", rc == -ETIMEDOUT ? "no answer within startup_timeout_ms"
                     : rc == -ECONNRESET ? "the server closed the connection" : strerror(-rc));
            return rc;
        }
    }
}

void shm_hello_fill(const struct shm_tier *st, struct proto_hello *h)
{
    const struct umbp_tier_env *env = &st->base.env;
    memset(h, 0, sizeof(*h));
    h->magic = PROTO_MAGIC;
    h->version = PROTO_VERSION;
    h->role = st->worker ? PROTO_ROLE_WORKER : PROTO_ROLE_LOOKUP;
    h->flags = env->core->enable_events ? PROTO_HELLO_EVENTS : 0;
    h->pid = (uint32_t)getpid();
    h->dp_rank = (uint32_t)st->cfg.dp_rank;
    h->tp_rank = (uint32_t)env->core->rank;
    if (st->worker)
        h->write_deadline_ms = shm_write_deadline_ms(env->core);
    if (st->cfg.engine_id[0])
        snprintf(h->engine_id, sizeof(h->engine_id), "%s", st->cfg.engine_id);
    else
        snprintf(h->engine_id, sizeof(h->engine_id), "pid-%u", h->pid);
    snprintf(h->name_space, sizeof(h->name_space), "%s", st->cfg.name_space);
}

int shm_send_hello(struct shm_tier *st)
{
    struct proto_hello h;
    shm_hello_fill(st, &h);
    int rc = proto_begin(&st->sess.out, PROTO_HELLO, st->sess.next_seq++, 1, 0);
    if (rc == 0) {
        proto_put_hello(&st->sess.out, &h);
        rc = proto_end(&st->sess.out);
    }
    return rc;
}

int shm_hello_reply(struct shm_tier *st, const struct proto_frame *f, int fd, bool *same,
                    char *err, size_t errlen)
{
    if (f->type == PROTO_HELLO_ERR) {
        struct proto_error e = {0};
        if (fd >= 0)
            close(fd);
        if (proto_get_error(f, &e) < 0)
            snprintf(e.message, sizeof(e.message), "(malformed HELLO_ERR)");
        snprintf(err, errlen, "umbp-server at %s refused this client: %s (%s)", st->path,
                 e.message, umbp_strerror(e.status));
        return e.status < 0 ? e.status : -EPROTO;
    }
    char why[256] = "";
    int rc = shm_welcome(st, f, fd, same, why, sizeof(why));
    if (rc < 0)
        snprintf(err, errlen, "umbp-server at %s: %s", st->path, why);
    return rc;
}

static int first_stats(struct shm_tier *st, uint64_t deadline, char *err, size_t errlen)
{
    static const uint16_t want[2] = {PROTO_STATS_R, PROTO_STATS_R};
    struct proto_frame f;
    long used;
    char why[256] = "";
    int rc = proto_put_empty(&st->sess.out, PROTO_STATS, st->sess.next_seq++, 0);
    if (rc == 0)
        rc = shm_flush_blocking(st, deadline);
    if (rc == 0)
        rc = recv_frame(st, want, deadline, &f, &used, why, sizeof(why));
    if (rc == 0 && (rc = proto_get_stats(&f, &st->stats)) == 0)
        net_session_in_consume(&st->sess, used);
    if (rc < 0)
        snprintf(err, errlen, "umbp-server at %s: first STATS failed: %s", st->path,
                 why[0] ? why : strerror(-rc));
    st->have_stats = rc == 0;
    return rc;
}

static int handshake(struct shm_tier *st, uint64_t deadline, char *err, size_t errlen)
{
    static const uint16_t want[2] = {PROTO_HELLO_OK, PROTO_HELLO_ERR};
    struct proto_frame f;
    long used;
    char why[256] = "";
    int rc = shm_check_peer(st->drv.fd, st->path, err, errlen);
    if (rc < 0)
        return rc;
    /* a HELLO that meets a closed socket (EPIPE, ECONNRESET) is read on: a
     * server that refused this peer sent HELLO_ERR before closing */
    if (fcntl(st->drv.fd, F_SETFL, fcntl(st->drv.fd, F_GETFL) | O_NONBLOCK) < 0 ||
        (rc = shm_send_hello(st)) < 0 ||
        ((rc = shm_flush_blocking(st, deadline)) < 0 && rc != -EPIPE && rc != -ECONNRESET) ||
        (rc = recv_frame(st, want, deadline, &f, &used, why, sizeof(why))) < 0) {
        snprintf(err, errlen, "handshake with umbp-server at %s failed: %s (startup_timeout_ms"
                 "=%lld)", st->path, why[0] ? why : strerror(rc ? -rc : errno),
                 (long long)st->cfg.startup_timeout_ms);
        return rc ? rc : -errno;
    }
    bool same;
    int fd = st->sess.pending_fd;
    st->sess.pending_fd = -1;
    if ((rc = shm_hello_reply(st, &f, fd, &same, err, errlen)) < 0)
        return rc;
    net_session_in_consume(&st->sess, used);
    st->epoch = 1;
    return first_stats(st, deadline, err, errlen);
}

int shm_attach(struct shm_tier *st, char *err, size_t errlen)
{
    uint64_t deadline = now_ms() + (uint64_t)st->cfg.startup_timeout_ms;
    int rc = connect_once(st->path, &st->drv.fd);
    if (rc == -EACCES || rc == -EPERM) /* a server is there; starting one will not help */
        return shm_denied(st, rc, err, errlen);
    if (rc < 0 && !st->cfg.auto_start)
        return no_server(st, rc, err, errlen);
    if (rc < 0 && (rc = auto_start(st, deadline, &st->drv.fd, err, errlen)) < 0)
        return rc;
    return handshake(st, deadline, err, errlen);
}

/* ---- HELLO_OK: the pool ----------------------------------------------------- */

static int map_pool(struct shm_tier *st, const struct proto_welcome *w, int fd, char *err,
                    size_t errlen)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0 || (uint64_t)sb.st_size < w->pool_size) {
        snprintf(err, errlen, "the pool's fd holds %lld bytes, HELLO_OK says %llu",
                 (long long)sb.st_size, (unsigned long long)w->pool_size);
        close(fd);
        return -EPROTO;
    }
    void *a = mmap(NULL, w->pool_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the pool */
    if (a == MAP_FAILED) {
        snprintf(err, errlen, "cannot map the pool (%llu bytes): %s",
                 (unsigned long long)w->pool_size, strerror(e));
        return -e;
    }
    /* shared memory gets transparent huge pages only when asked (and when
     * shmem_enabled is advise or within_size): fewer TLB misses in copies */
    madvise(a, w->pool_size, MADV_HUGEPAGE);
    struct shm_map *m = realloc(st->maps, (st->nmaps + 1) * sizeof(*m));
    if (!m) {
        munmap(a, w->pool_size);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_lock(&st->map_lock);
    st->maps = m;
    st->maps[st->nmaps++] = (struct shm_map){a, w->pool_size, w->pool_id};
    bool was_out = st->mapped_out;
    st->mapped_out = false;
    pthread_mutex_unlock(&st->map_lock);
    if (was_out && st->base.env.mapping_changed) {
        /* the GPU registered the old pool: the runtime registers this one
         * before its next KV transfer */
        umbp_log(UMBP_LOG_INFO, "umbp-server at %s serves a new pool; the runtime registers "
                 "it with the GPU before the next KV transfer", st->path);
        st->base.env.mapping_changed(st->base.env.ctx);
    }
    return 0;
}

int shm_welcome(struct shm_tier *st, const struct proto_frame *f, int fd, bool *same_pool,
                char *err, size_t errlen)
{
    struct proto_welcome w = {0};
    *same_pool = false;
    if (proto_get_welcome(f, &w, err, errlen) < 0)
        goto refuse;
    st->server_lease_ms = w.lease_ttl_ms;
    if (w.version != PROTO_VERSION) {
        snprintf(err, errlen, "the server speaks protocol version %u, this client %u",
                 w.version, PROTO_VERSION);
        goto refuse;
    }
    if (!st->worker) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    if (fd < 0 || w.pool_size == 0 || w.capacity_bytes > w.pool_size) {
        snprintf(err, errlen, "HELLO_OK %s", fd < 0 ? "came without the pool's fd"
                 : "has a pool smaller than its capacity");
        goto refuse;
    }
    const struct shm_map *cur = shm_current_map(st);
    if (cur && cur->pool_id == w.pool_id && cur->size == w.pool_size) {
        close(fd);
        *same_pool = true;
        return 0;
    }
    return map_pool(st, &w, fd, err, errlen);
refuse:
    if (fd >= 0)
        close(fd);
    return -EPROTO;
}
