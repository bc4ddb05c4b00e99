/*
 * bench_dist - distributed mode end to end on one machine, through the
 * public API: a real umbp-master, an owner process (a node) that puts
 * `objects` objects of `size` bytes, and the reader (this process, another
 * node) that gets them all: first from the owner (LOCATE at the master,
 * UCX fetch into its slice, kept as replicas), then again from its own
 * slice.  Prints GB/s of both and their ratio, per round; every byte is
 * compared with the owner's (regenerated from the seed) in buffers
 * poisoned before each get.  Exit 1 on a wrong byte or a failed get.
 *
 * With --server the reader is an engine of a host whose umbp-server is the
 * node (standalone mode; the server fetches into its pool and keeps the
 * replicas): the same two columns, through the server.
 *
 * It is also the ThreadSanitizer pass's node (scripts/test.sh): two
 * runtimes in distributed mode, their loop, copy and UCX paths, the
 * master's client on the loop; with --server, a server hosting the node.
 *
 *   bench_dist [--server] [rounds (3)] [objects (64)] [size (524288)]
 * Environment: UMBP_MASTER, UMBP_SERVER (default: the ones this build
 * made), UCX_TLS and UCX_NET_DEVICES (default tcp over lo).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "umbp/umbp.h"

#ifndef UMBP_MASTER_BIN
#define UMBP_MASTER_BIN "umbp-master"
#endif
#ifndef UMBP_SERVER_BIN
#define UMBP_SERVER_BIN "umbp-server"
#endif

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void key_of(uint64_t seed, uint32_t i, umbp_key_t *k)
{
    for (int w = 0; w < 4; w++) {
        uint64_t v = mix(seed * 1000003u + i * 4u + (uint64_t)w);
        memcpy(k->bytes + 8 * w, &v, 8);
    }
}

static void fill(uint64_t seed, uint32_t i, uint8_t *b, size_t n)
{
    uint64_t s = mix(seed ^ ((uint64_t)i << 32));
    for (size_t j = 0; j + 8 <= n; j += 8) {
        s = mix(s);
        memcpy(b + j, &s, 8);
    }
}

static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static pid_t start_master(const char *addr)
{
    const char *bin = getenv("UMBP_MASTER") ? getenv("UMBP_MASTER") : UMBP_MASTER_BIN;
    char json[256];
    snprintf(json, sizeof(json), "{\"listen\": \"%s\", \"log_level\": \"warn\"}", addr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(bin, "umbp-master", "--json", json, (char *)NULL);
        _exit(127);
    }
    usleep(300000); /* bounded: the owner's runtime retries its connection */
    return pid;
}

/* --server: the reader's host's umbp-server, a node of the cluster, with
 * its socket in dir; waits (bounded) until the socket is there. */
static pid_t start_server(const char *master, const char *dir, size_t cap)
{
    const char *bin = getenv("UMBP_SERVER") ? getenv("UMBP_SERVER") : UMBP_SERVER_BIN;
    char json[512], sock[256];
    snprintf(json, sizeof(json),
             "{\"socket_dir\": \"%s\", \"capacity_bytes\": %zu, \"master_address\": \"%s\", "
             "\"heartbeat_ms\": 50, \"node_host\": \"reader-server\", \"log_level\": \"warn\", "
             "\"timeout_ms\": 60000, \"lookup_timeout_ms\": 10000}", dir, cap, master);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(bin, "umbp-server", "--json", json, (char *)NULL);
        _exit(127);
    }
    snprintf(sock, sizeof(sock), "%s/umbp-dp0.sock", dir);
    for (int i = 0; i < 1000 && access(sock, F_OK) != 0; i++)
        usleep(10000);
    return pid;
}

static umbp_runtime_t *node(const char *master, const char *name, size_t cap)
{
    char cfg[512];
    snprintf(cfg, sizeof(cfg),
             "{\"mode\": \"distributed\", \"master_address\": \"%s\", \"capacity_bytes\": %zu, "
             "\"heartbeat_ms\": 50, \"node_host\": \"%s\", \"log_level\": \"warn\", "
             "\"timeout_ms\": 60000, \"lookup_timeout_ms\": 10000}",
             master, cap, name);
    umbp_runtime_t *rt = NULL;
    int rc = umbp_runtime_create(cfg, &rt);
    if (rc) {
        fprintf(stderr, "bench_dist: %s: umbp_runtime_create: %s\n", name, umbp_last_error());
        exit(2);
    }
    return rt;
}

static int wait_op(umbp_op_t *op, size_t n, const char *what)
{
    int rc = umbp_op_wait(op, 120000);
    size_t ok = umbp_op_num_ok(op);
    if (rc || ok != n) {
        fprintf(stderr, "bench_dist: %s: %zu of %zu ok (wait %d, first status %d)\n", what, ok, n,
                rc, umbp_op_key_status(op, 0));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    bool via_server = argc > 1 && strcmp(argv[1], "--server") == 0;
    if (via_server)
        argc--, argv++;
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    uint32_t nobj = argc > 2 ? (uint32_t)atoi(argv[2]) : 64;
    size_t size = argc > 3 ? (size_t)atoll(argv[3]) : 524288;
    if (rounds < 1 || nobj < 1 || nobj > 65536 || size < 8 || size % 8) {
        fprintf(stderr, "usage: bench_dist [--server] [rounds >= 1] [objects 1..65536] "
                "[size, a multiple of 8]\n");
        return 2;
    }
    if (umbp_mode_flags("distributed") < 0) {
        printf("bench_dist: this libumbp has no distributed mode (%s)\n", umbp_last_error());
        return 0;
    }
    setenv("UCX_TLS", "tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);
    setenv("UCX_MEM_EVENTS", "no", 0);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%d", free_port());
    pid_t mpid = start_master(master);
    size_t total = (size_t)nobj * size, cap = 2 * (size_t)rounds * total + (64u << 20);
    uint64_t seed = (uint64_t)time(NULL);
    int ready[2], done[2];
    if (pipe(ready) || pipe(done))
        return 2;
    pid_t owner = fork();
    if (owner == 0) { /* the owner node: every round's objects, then waits */
        close(ready[0]);
        close(done[1]);
        umbp_runtime_t *rt = node(master, "owner", cap);
        uint8_t *buf = malloc(size);
        for (int r = 0; r < rounds; r++)
            for (uint32_t i = 0; i < nobj; i++) {
                umbp_key_t k;
                key_of(seed + (uint64_t)r, i, &k);
                fill(seed + (uint64_t)r, i, buf, size);
                umbp_range_t rg = {.ptr = buf, .len = size, .offset = 0};
                umbp_put_item_t it = {.key = k, .object_size = size, .ranges = &rg,
                                      .num_ranges = 1};
                umbp_op_t *op;
                if (umbp_put(rt, &it, 1, &op) || wait_op(op, 1, "owner put"))
                    _exit(1);
                umbp_op_release(op);
            }
        usleep(300000); /* its last events reach the master (heartbeat_ms 50) */
        if (write(ready[1], "r", 1) != 1)
            _exit(1);
        char c;
        while (read(done[0], &c, 1) > 0) {
        }
        free(buf);
        umbp_runtime_destroy(rt);
        _exit(0);
    }
    close(ready[1]);
    close(done[0]);
    char c;
    if (read(ready[0], &c, 1) != 1) {
        fprintf(stderr, "bench_dist: the owner failed\n");
        return 1;
    }
    umbp_runtime_t *rt;
    pid_t spid = 0;
    char sdir[64] = "";
    if (via_server) {
        snprintf(sdir, sizeof(sdir), "/tmp/bench_dist.XXXXXX");
        if (!mkdtemp(sdir))
            return 2;
        spid = start_server(master, sdir, cap);
        char cfg[256];
        snprintf(cfg, sizeof(cfg), "{\"mode\": \"standalone\", \"socket_dir\": \"%s\", "
                 "\"log_level\": \"warn\", \"timeout_ms\": 120000, \"lookup_timeout_ms\": 20000}",
                 sdir);
        if (umbp_runtime_create(cfg, &rt)) {
            fprintf(stderr, "bench_dist: the server's engine: %s\n", umbp_last_error());
            return 2;
        }
    } else {
        rt = node(master, "reader", cap);
    }
    uint8_t *dst = malloc(total), *ref = malloc(size);
    umbp_key_t *keys = calloc(nobj, sizeof(*keys));
    umbp_get_item_t *items = calloc(nobj, sizeof(*items));
    umbp_range_t *rgs = calloc(nobj, sizeof(*rgs));
    uint8_t *present = malloc(nobj);
    int bad = 0;
    printf("bench_dist: %u objects of %zu bytes per round, %d rounds, UCX_TLS=%s, the reader %s; "
           "every byte verified\n", nobj, size, rounds, getenv("UCX_TLS"),
           via_server ? "an engine of its host's umbp-server (the node)" : "a node itself");
    printf("round  remote GB/s  local GB/s  remote/local\n");
    for (int r = 0; r < rounds && !bad; r++) {
        for (uint32_t i = 0; i < nobj; i++) {
            key_of(seed + (uint64_t)r, i, &keys[i]);
            rgs[i] = (umbp_range_t){.ptr = dst + (size_t)i * size, .len = size, .offset = 0};
            items[i] = (umbp_get_item_t){.key = keys[i], .ranges = &rgs[i], .num_ranges = 1};
        }
        /* the reader's lookup sees the owner's keys (bounded) */
        size_t prefix = 0;
        for (int t = 0; t < 200; t++) {
            umbp_lookup(rt, keys, nobj, present, &prefix, 0);
            if (prefix == nobj)
                break;
            usleep(20000);
        }
        double gbs[2];
        for (int pass = 0; pass < 2 && !bad; pass++) {
            memset(dst, 0xA5, total);
            umbp_op_t *op;
            double t0 = now_s();
            if (umbp_get(rt, items, nobj, &op) || wait_op(op, nobj, pass ? "local get" : "remote get")) {
                bad = 1;
                break;
            }
            gbs[pass] = (double)total / (now_s() - t0) / 1e9;
            umbp_op_release(op);
            for (uint32_t i = 0; i < nobj; i++) {
                fill(seed + (uint64_t)r, i, ref, size);
                if (memcmp(ref, dst + (size_t)i * size, size)) {
                    fprintf(stderr, "bench_dist: round %d object %u: wrong bytes (%s get)\n", r, i,
                            pass ? "local" : "remote");
                    bad = 1;
                    break;
                }
            }
        }
        if (!bad)
            printf("%5d  %11.2f  %10.2f  %11.3f\n", r, gbs[0], gbs[1], gbs[0] / gbs[1]);
    }
    umbp_runtime_destroy(rt);
    if (spid > 0) {
        kill(spid, SIGTERM);
        int sst;
        waitpid(spid, &sst, 0);
        char path[128];
        snprintf(path, sizeof(path), "%s/umbp-dp0.sock.lock", sdir);
        unlink(path);
        rmdir(sdir);
        if (!WIFEXITED(sst) || WEXITSTATUS(sst)) {
            fprintf(stderr, "bench_dist: umbp-server exited with status 0x%x\n", sst);
            bad = 1;
        }
    }
    close(done[1]);
    int st;
    waitpid(owner, &st, 0);
    kill(mpid, SIGTERM);
    waitpid(mpid, NULL, 0);
    free(dst);
    free(ref);
    free(keys);
    free(items);
    free(rgs);
    free(present);
    if (!bad && (!WIFEXITED(st) || WEXITSTATUS(st))) {
        fprintf(stderr, "bench_dist: the owner exited with %d\n", st);
        bad = 1;
    }
    return bad;
}
