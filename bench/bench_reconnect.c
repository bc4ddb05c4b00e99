/*
 * bench_reconnect - how soon a standalone client is back after its
 * umbp-server is killed and a new one started: the time from the new
 * server's socket appearing (the bench removes the killed server's socket;
 * the path is polled every 100 us) to the client's first successful put (retried every 100 us; while
 * disconnected a put fails at once).
 *
 * Each run SIGKILLs the server, waits a different outage (so the client's
 * backoff is at a different step when the server returns), starts a new
 * server with an empty pool and measures.  The client keeps its defaults
 * (reconnect_max_ms 2000).  Baseline: none in the same run; the numbers
 * before the directory watch come from running this file against the
 * previous shm tier (docs/benchmarks.md).
 *
 * Usage: bench_reconnect [path/to/umbp-server or ""] [runs (12)]
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

#ifndef UMBP_SERVER_BIN
#define UMBP_SERVER_BIN "umbp-server"
#endif

static char sock_dir[128], sock_path[192];
static pid_t server_pid;

static void server_kill(void)
{
    if (server_pid > 0) {
        kill(server_pid, SIGKILL);
        waitpid(server_pid, NULL, 0);
        server_pid = 0;
    }
}

static void server_start(const char *bin)
{
    char json[512];
    snprintf(json, sizeof(json),
             "{\"capacity_bytes\": \"64MiB\", \"socket_dir\": \"%s\", \"log_level\": \"error\"}",
             sock_dir);
    server_pid = fork();
    if (server_pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1); /* its "serving" line */
        dup2(null, 2);
        execl(bin, bin, "--json", json, (char *)NULL);
        fprintf(stderr, "bench_reconnect: cannot run %s\n", bin);
        _exit(127);
    }
}

static ino_t sock_ino(void)
{
    struct stat sb;
    return stat(sock_path, &sb) == 0 ? sb.st_ino : 0;
}

static int put_one(umbp_runtime_t *rt, uint64_t i)
{
    static uint8_t buf[4096];
    umbp_range_t r = {buf, sizeof(buf), 0};
    umbp_put_item_t it = {bench_key(77, i), sizeof(buf), &r, 1};
    umbp_op_t *op = NULL;
    int rc = umbp_put(rt, &it, 1, &op);
    if (rc == 0) {
        rc = umbp_op_wait(op, 5000) == 0 ? umbp_op_key_status(op, 0) : -ETIMEDOUT;
        umbp_op_release(op);
    }
    return rc;
}

int main(int argc, char **argv)
{
    const char *bin = argc > 1 && argv[1][0] ? argv[1] : UMBP_SERVER_BIN;
    int runs = argc > 2 ? atoi(argv[2]) : 12;
    if (access(bin, X_OK) != 0) {
        printf("SKIP: no umbp-server at %s\n", bin);
        return 0;
    }
    snprintf(sock_dir, sizeof(sock_dir), "/tmp/umbp-bench-rc-%d", (int)getpid());
    snprintf(sock_path, sizeof(sock_path), "%s/umbp-dp0.sock", sock_dir);
    mkdir(sock_dir, 0700);
    atexit(server_kill);
    server_start(bin);
    char cfg[512];
    snprintf(cfg, sizeof(cfg), "{\"mode\": \"standalone\", \"socket_dir\": \"%s\", "
             "\"log_level\": \"error\"}", sock_dir);
    umbp_runtime_t *rt = NULL;
    for (int i = 0; i < 4000 && sock_ino() == 0; i++)
        usleep(1000);
    for (int i = 0; i < 400 && umbp_runtime_create(cfg, &rt) != 0; i++)
        usleep(10000);
    if (!rt) {
        fprintf(stderr, "bench_reconnect: no server: %s\n", umbp_last_error());
        return 1;
    }
    uint64_t n = 0;
    if (put_one(rt, n++) != 0) {
        fprintf(stderr, "bench_reconnect: the first put failed\n");
        return 1;
    }
    double *ms = calloc((size_t)runs, sizeof(double));
    printf("run  outage_ms  socket->first_put_ms\n");
    for (int r = 0; r < runs; r++) {
        server_kill();
        unlink(sock_path); /* the dead server's: the new one's shows up as new */
        usleep((useconds_t)(40 + (r * 137) % 1500) * 1000u); /* 40 .. 1.5 s, spread */
        server_start(bin);
        double t0 = bench_now();
        while (sock_ino() == 0 && bench_now() - t0 < 30)
            usleep(100);
        double t_sock = bench_now();
        while (put_one(rt, n++) != 0 && bench_now() - t_sock < 30)
            usleep(100);
        ms[r] = (bench_now() - t_sock) * 1e3;
        printf("%3d  %9d  %8.2f\n", r, 40 + (r * 137) % 1500, ms[r]);
        fflush(stdout);
    }
    qsort(ms, (size_t)runs, sizeof(double), cmp_double);
    printf("socket appeared -> first successful put, %d runs: min %.2f ms, median %.2f ms, "
           "max %.2f ms\n", runs, ms[0], ms[runs / 2], ms[runs - 1]);
    umbp_runtime_destroy(rt);
    server_kill();
    char p[256];
    const char *names[] = {"umbp-dp0.sock", "umbp-dp0.sock.lock", NULL};
    for (int i = 0; names[i]; i++) {
        snprintf(p, sizeof(p), "%s/%s", sock_dir, names[i]);
        unlink(p);
    }
    rmdir(sock_dir);
    free(ms);
    return 0;
}
