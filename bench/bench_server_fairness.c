/*
 * bench_server_fairness - what one client's large frame costs another
 * client of the same umbp-server (a real server process, two blocking
 * clients over its socket: server/sync_client.c).
 *
 * A "small" client measures round trips of a 1-key LOOKUP:
 *   baseline  alone;
 *   loaded    while a "big" client keeps sending 60,000-key ACQUIREs (all
 *             hits, each followed by the 60,000-key RELEASE) back to back.
 * Printed: median, p99 and max of each, and the big client's frame time.
 * Before the server handled large frames in slices (SRV_SLICE_RECORDS), a
 * small request that arrived behind a large frame waited for all of it;
 * now it waits for about one slice.  Run it against another server binary
 * (argv[1]) to compare.
 *
 * Usage: bench_server_fairness [path/to/umbp-server] [rounds]
 * (default: the umbp-server built beside it; 20 big rounds).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"
#include "sync_client.h"

#ifndef UMBP_SERVER_BIN
#define UMBP_SERVER_BIN "umbp-server"
#endif

#define BIG 60000u
#define MAX_SAMPLES 2000000

static char sock_dir[128], sock_path[192];
static pid_t server_pid;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, int rc, const char *err)
{
    fprintf(stderr, "bench_server_fairness: %s: %d %s\n", what, rc, err ? err : "");
    exit(1);
}

static void server_stop(void)
{
    if (server_pid > 0) {
        kill(server_pid, SIGTERM);
        waitpid(server_pid, NULL, 0);
        server_pid = 0;
        rmdir(sock_dir); /* the server removed its socket and lock file */
    }
}

static void server_start(const char *bin)
{
    snprintf(sock_dir, sizeof(sock_dir), "/tmp/umbp-bench-fair-%d", (int)getpid());
    snprintf(sock_path, sizeof(sock_path), "%s/umbp-dp0.sock", sock_dir);
    mkdir(sock_dir, 0700);
    char json[512];
    snprintf(json, sizeof(json), "{\"capacity_bytes\": \"64MiB\", \"socket_dir\": \"%s\", "
             "\"log_level\": \"warn\", \"poll_wait\": \"off\"}", sock_dir);
    server_pid = fork();
    if (server_pid == 0) {
        execl(bin, bin, "--json", json, (char *)NULL);
        fprintf(stderr, "bench_server_fairness: cannot run %s\n", bin);
        _exit(127);
    }
    atexit(server_stop);
}

static void client(struct sync_client *c, uint8_t role, const char *name)
{
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION, .role = role,
                            .pid = (uint32_t)getpid(),
                            .write_deadline_ms = role == PROTO_ROLE_WORKER ? 60000 : 0};
    snprintf(h.engine_id, sizeof(h.engine_id), "%s", name);
    char err[512] = "";
    for (int i = 0; i < 400; i++) {
        if (sync_client_connect(c, sock_path, &h, 60000, err, sizeof(err)) == 0)
            return;
        usleep(25000);
    }
    die("connect", -1, err);
}

/* Sends b and reads the reply of its seq (skipping EVENTS). */
static void call(struct sync_client *c, struct proto_buf *b, uint64_t seq,
                 struct proto_frame *f)
{
    char err[256] = "";
    int rc = sync_client_send(c, b->data, b->len);
    if (rc < 0)
        die("send", rc, NULL);
    proto_buf_consume(b, b->len);
    do
        rc = sync_client_recv(c, f, err, sizeof(err));
    while (rc == 0 && f->type == PROTO_EVENTS);
    if (rc < 0 || f->seq != seq)
        die("reply", rc, err);
}

static umbp_key_t key(uint32_t i)
{
    umbp_key_t k;
    memset(&k, 0, sizeof(k));
    memcpy(k.bytes, "fair", 4);
    memcpy(k.bytes + 4, &i, sizeof(i));
    return k;
}

static struct sync_client big_c, small_c;
static uint64_t *tokens;
static volatile int big_running;
static int rounds = 20;
static double big_time[1000];

/* RESERVE + PUBLISH of BIG 256-byte objects, so ACQUIREs hit. */
static void big_fill(void)
{
    struct proto_buf b = {0};
    struct proto_frame f;
    uint64_t seq = big_c.next_seq++;
    proto_begin(&b, PROTO_RESERVE, seq, BIG, 0);
    for (uint32_t i = 0; i < BIG; i++) {
        struct proto_reserve_item it = {.key = key(i), .size = 256};
        proto_put_reserve_item(&b, &it);
    }
    proto_end(&b);
    call(&big_c, &b, seq, &f);
    for (uint32_t i = 0; i < BIG; i++) {
        struct proto_region_item r;
        if (proto_get_region_item(&f, i, &r) < 0 || r.status != 0)
            die("reserve", r.status, "(raise capacity_bytes)");
        tokens[i] = r.token;
    }
    seq = big_c.next_seq++;
    proto_begin(&b, PROTO_PUBLISH, seq, BIG, 0);
    for (uint32_t i = 0; i < BIG; i++) {
        struct proto_token_item it = {.key = key(i), .token = tokens[i]};
        proto_put_token_item(&b, &it);
    }
    proto_end(&b);
    call(&big_c, &b, seq, &f);
    proto_buf_free(&b);
}

static void *big_loop(void *arg)
{
    struct proto_buf b = {0};
    struct proto_frame f;
    (void)arg;
    for (int r = 0; r < rounds; r++) {
        uint64_t seq = big_c.next_seq++;
        proto_begin(&b, PROTO_ACQUIRE, seq, BIG, 5000);
        for (uint32_t i = 0; i < BIG; i++) {
            umbp_key_t k = key(i);
            proto_put_key(&b, &k);
        }
        proto_end(&b);
        double t0 = now_s();
        call(&big_c, &b, seq, &f);
        big_time[r] = now_s() - t0;
        for (uint32_t i = 0; i < BIG; i++) {
            struct proto_region_item it;
            proto_get_region_item(&f, i, &it);
            tokens[i] = it.token;
        }
        seq = big_c.next_seq++;
        proto_begin(&b, PROTO_RELEASE, seq, BIG, 0);
        for (uint32_t i = 0; i < BIG; i++) {
            struct proto_token_item it = {.key = key(i), .token = tokens[i]};
            proto_put_token_item(&b, &it);
        }
        proto_end(&b);
        call(&big_c, &b, seq, &f);
    }
    proto_buf_free(&b);
    big_running = 0;
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *v, size_t n)
{
    size_t over1 = 0, over10 = 0;
    for (size_t i = 0; i < n; i++)
        over1 += v[i] > 1e-3, over10 += v[i] > 10e-3;
    qsort(v, n, sizeof(*v), cmp_double);
    printf("%-30s n=%-6zu median %7.1f us  p99 %8.1f us  p99.9 %8.1f us  max %8.1f us  "
           ">1ms %5.2f%%  >10ms %5.2f%%\n", what, n, v[n / 2] * 1e6,
           v[(size_t)((double)n * 0.99)] * 1e6, v[(size_t)((double)n * 0.999)] * 1e6,
           v[n - 1] * 1e6, 100.0 * (double)over1 / (double)n, 100.0 * (double)over10 / (double)n);
}

/* 1-key LOOKUP round trips until `stop` (a count, or big_running == 0). */
static size_t small_rtts(double *out, size_t count, bool while_big)
{
    struct proto_buf b = {0};
    struct proto_frame f;
    umbp_key_t k = key(7);
    size_t n = 0;
    while (n < MAX_SAMPLES && (while_big ? big_running : n < count)) {
        uint64_t seq = small_c.next_seq++;
        proto_begin(&b, PROTO_LOOKUP, seq, 1, 0);
        proto_put_key(&b, &k);
        proto_end(&b);
        double t0 = now_s();
        call(&small_c, &b, seq, &f);
        out[n++] = now_s() - t0;
    }
    proto_buf_free(&b);
    return n;
}

int main(int argc, char **argv)
{
    const char *bin = argc > 1 && argv[1][0] ? argv[1] : UMBP_SERVER_BIN;
    if (argc > 2)
        rounds = atoi(argv[2]) > 0 && atoi(argv[2]) <= 1000 ? atoi(argv[2]) : 20;
    signal(SIGPIPE, SIG_IGN);
    server_start(bin);
    client(&big_c, PROTO_ROLE_WORKER, "big");
    client(&small_c, PROTO_ROLE_LOOKUP, "small");
    tokens = calloc(BIG, sizeof(*tokens));
    double *lat = calloc(MAX_SAMPLES, sizeof(*lat));
    if (!tokens || !lat)
        die("calloc", -1, NULL);
    big_fill();

    printf("server %s: a 1-key LOOKUP's round trip, alone and while another client sends "
           "%u-key ACQUIRE + RELEASE frames back to back (%d rounds)\n", bin, BIG, rounds);
    report("baseline (alone)", lat, small_rtts(lat, 20000, false));
    big_running = 1;
    pthread_t t;
    pthread_create(&t, NULL, big_loop, NULL);
    size_t n = small_rtts(lat, 0, true);
    pthread_join(t, NULL);
    report("while 60,000-key frames run", lat, n);
    report("the 60,000-key ACQUIRE", big_time, (size_t)rounds);
    sync_client_close(&small_c);
    sync_client_close(&big_c);
    free(lat);
    free(tokens);
    return 0;
}
