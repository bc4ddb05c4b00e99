/*
 * bench_master - umbp-master on loopback, one core for the master (taskset
 * is the caller's): LOCATE of 1,000 keys (p50, p99), heartbeat events/s,
 * lookups/s, and the relearn of 1M keys from one node (one RESYNC of
 * 65,535-key frames, pipelined).  The baseline, measured in the same run:
 * the protocol's round trip with nothing to do (NODES with the current
 * epoch: an empty reply), so the LOCATE cost above it is the directory's
 * and the 32 KiB of keys each way.
 *
 * Against Redis (issue 16's bar), in the same run: a redis-server it starts
 * itself (a free port, --save '' --appendonly no, a fresh --dir under /tmp,
 * killed at the end) holding the same 1,000 keys as members of one set; one
 * SMISMEMBER of the 1,000 keys per iteration (hiredis, binary-safe
 * arguments), p50 and p99 next to LOCATE's, and Redis's PING round trip next
 * to the empty one.  SMISMEMBER answers membership (a 0 or 1 per key), not
 * each key's owners and size as LOCATE does: the same batch shape and the
 * same hash lookups, less to say.  Skipped, saying why, without hiredis at
 * build time or redis-server on PATH.
 *
 *   build/bench/bench_master [iterations]
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef UMBP_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

#include "bench_proc.h"
#include "master_client.h"
#include "tcp.h"
#include "umbp/tier.h"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static umbp_key_t key_of(uint32_t i)
{
    umbp_key_t k;
    memset(&k, 0, sizeof(k));
    memcpy(k.bytes, &i, 4);
    k.bytes[31] = 0xa5;
    return k;
}

static pid_t start_master(const char *addr)
{
    char json[256];
    snprintf(json, sizeof(json), "{\"listen\": \"%s\", \"log_level\": \"warn\", "
             "\"heartbeat_suspect_ms\": 60000, \"heartbeat_dead_ms\": 120000}", addr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(UMBP_MASTER_BIN, "umbp-master", "--json", json, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static struct mclient *connect_as(const char *addr, uint8_t role, uint64_t timeout_ms)
{
    struct mclient_config cfg = {.address = addr, .role = role, .engine_id = "bench",
                                 .timeout_ms = timeout_ms, .hello_timeout_ms = 5000};
    struct mclient *c;
    if (mclient_create(&cfg, &c) < 0)
        exit(1);
    for (int i = 0; i < 500 && mclient_nodes(c) < 0; i++)
        usleep(10000);
    return c;
}

#ifdef UMBP_HAVE_HIREDIS
/* redis-server on PATH, or NULL */
static const char *find_redis(char *buf, size_t len)
{
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        snprintf(buf, len, "%.*s/redis-server", (int)n, path);
        if (n && access(buf, X_OK) == 0)
            return buf;
        path += n + (path[n] == ':');
    }
    return NULL;
}

static int redis_ok(redisReply *r, int type)
{
    int ok = r && r->type == type;
    freeReplyObject(r);
    return ok;
}

/* SMISMEMBER of the n keys against a redis-server of its own: *p50 and *p99
 * (ns) of SMISMEMBER and of PING; 0, or -1 with why. */
static int redis_smismember(const umbp_key_t *keys, size_t n, int iters, uint64_t *sm,
                            uint64_t *ping, uint64_t *cpu_ns, char *why, size_t whylen)
{
    char bin[4096], dir[] = "/tmp/bench_master_redis.XXXXXX", portstr[16];
    int fd, rc = -1;
    uint16_t port;
    if (!find_redis(bin, sizeof(bin))) {
        snprintf(why, whylen, "redis-server is not on PATH");
        return -1;
    }
    if (net_tcp_listen("127.0.0.1:0", "bench", 1, &fd, &port, NULL, 0) < 0 || !mkdtemp(dir)) {
        snprintf(why, whylen, "no free port or no directory under /tmp");
        return -1;
    }
    close(fd);
    snprintf(portstr, sizeof(portstr), "%u", port);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 1);
        execl(bin, "redis-server", "--port", portstr, "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--dir", dir, "--daemonize", "no", "--loglevel", "warning",
              (char *)NULL);
        _exit(127);
    }
    redisContext *c = NULL;
    for (int i = 0; i < 500; i++) {
        if ((c = redisConnect("127.0.0.1", port)) && !c->err &&
            redis_ok(redisCommand(c, "PING"), REDIS_REPLY_STATUS))
            break;
        if (c)
            redisFree(c);
        c = NULL;
        usleep(10000);
    }
    const char **argv = calloc(n + 2, sizeof(*argv));
    size_t *lens = calloc(n + 2, sizeof(*lens));
    uint64_t *lat = calloc((size_t)iters, sizeof(*lat)), *pl = calloc((size_t)iters, 8);
    if (!c || !argv || !lens || !lat || !pl) {
        snprintf(why, whylen, "redis-server did not answer on port %u", port);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        argv[i + 2] = (const char *)keys[i].bytes;
        lens[i + 2] = UMBP_KEY_SIZE;
    }
    argv[1] = "set";
    lens[1] = 3;
    argv[0] = "SADD";
    lens[0] = 4;
    redisReply *r = redisCommandArgv(c, (int)n + 2, argv, lens);
    if (!r || r->type != REDIS_REPLY_INTEGER || (size_t)r->integer != n) {
        snprintf(why, whylen, "SADD: %s", r && r->type == REDIS_REPLY_ERROR ? r->str : "failed");
        freeReplyObject(r);
        goto out;
    }
    freeReplyObject(r);
    argv[0] = "SMISMEMBER";
    lens[0] = 10;
    uint64_t c0 = proc_cpu_ns(pid);
    for (int i = 0; i < iters; i++) {
        uint64_t s = umbp_now_ns();
        if (!redis_ok(redisCommand(c, "PING"), REDIS_REPLY_STATUS))
            goto fail;
        pl[i] = umbp_now_ns() - s;
        s = umbp_now_ns();
        r = redisCommandArgv(c, (int)n + 2, argv, lens);
        lat[i] = umbp_now_ns() - s;
        int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == n;
        for (size_t k = 0; ok && k < n; k++)
            ok = r->element[k]->type == REDIS_REPLY_INTEGER && r->element[k]->integer == 1;
        freeReplyObject(r);
        if (!ok)
            goto fail;
    }
    *cpu_ns = proc_cpu_ns(pid) - c0;
    qsort(lat, (size_t)iters, 8, cmp_u64);
    qsort(pl, (size_t)iters, 8, cmp_u64);
    sm[0] = lat[iters / 2];
    sm[1] = lat[iters * 99 / 100];
    ping[0] = pl[iters / 2];
    ping[1] = pl[iters * 99 / 100];
    rc = 0;
    goto out;
fail:
    snprintf(why, whylen, "SMISMEMBER or PING failed: %s", c->err ? c->errstr : "a wrong reply");
out:
    if (c)
        redisFree(c);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    /* --save '' writes nothing; remove whatever it left anyway (no subdirectories) */
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char f[sizeof(dir) + 300];
        snprintf(f, sizeof(f), "%s/%s", dir, e->d_name);
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlink(f);
    }
    if (d)
        closedir(d);
    if (rmdir(dir) < 0)
        fprintf(stderr, "could not remove %s: %s\n", dir, strerror(errno));
    free(argv);
    free(lens);
    free(lat);
    free(pl);
    return rc;
}
#endif

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 5000;
    int fd;
    uint16_t port;
    char addr[64];
    if (net_tcp_listen("127.0.0.1:0", "bench", 1, &fd, &port, NULL, 0) < 0)
        return 1;
    close(fd);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    pid_t master = start_master(addr);
    struct mclient *node = connect_as(addr, PROTO_ROLE_NODE, 60000);
    struct mclient *look = connect_as(addr, PROTO_ROLE_LOOKUP, 2000);

    struct proto_register r = {.host = "bench-host", .pid = (uint32_t)getpid(), .start_ns = 1,
                               .capacity_bytes = 1ull << 40, .addr_len = 16};
    struct proto_ack a;
    if (mclient_register(node, &r, &a) < 0) {
        fprintf(stderr, "register: %s\n", mclient_last_error(node));
        return 1;
    }

    /* heartbeat events/s: bundles of 128 (a node's bound), STORED */
    enum { BUNDLE = 128 };
    struct proto_node_event ev[BUNDLE];
    uint64_t seq = 0, t0 = umbp_now_ns(), nev = 0;
    while (umbp_now_ns() - t0 < 2000000000ull) {
        for (int i = 0; i < BUNDLE; i++)
            ev[i] = (struct proto_node_event){.seq = ++seq, .kind = PROTO_NODE_STORED,
                                              .key = key_of((uint32_t)seq), .size = 4096};
        if (mclient_heartbeat(node, seq, 0, ev, BUNDLE, &a) < 0 || a.action != PROTO_ACK_OK)
            return 1;
        nev += BUNDLE;
    }
    double hb_s = (double)(umbp_now_ns() - t0) / 1e9;
    printf("heartbeat: %llu events in %.2f s = %.0f events/s (bundles of %d, one round trip "
           "each)\n", (unsigned long long)nev, hb_s, (double)nev / hb_s, BUNDLE);

    /* LOCATE of 1,000 stored keys vs an empty round trip */
    enum { NK = 1000 };
    umbp_key_t keys[NK];
    struct proto_location loc[NK];
    for (uint32_t i = 0; i < NK; i++)
        keys[i] = key_of(1 + i * 7);
    uint64_t *lat = calloc((size_t)iters, sizeof(*lat)), *rtt = calloc((size_t)iters, 8);
    uint64_t mcpu = proc_cpu_ns(master);
    for (int i = 0; i < iters; i++) {
        uint64_t s = umbp_now_ns();
        if (mclient_nodes(look) < 0)
            return 1;
        rtt[i] = umbp_now_ns() - s;
        s = umbp_now_ns();
        if (mclient_locate(look, keys, NK, loc) < 0)
            return 1;
        lat[i] = umbp_now_ns() - s;
    }
    mcpu = proc_cpu_ns(master) - mcpu;
    size_t hits = 0;
    for (uint32_t i = 0; i < NK; i++)
        hits += loc[i].nrep > 0;
    qsort(lat, (size_t)iters, 8, cmp_u64);
    qsort(rtt, (size_t)iters, 8, cmp_u64);
    uint64_t sum = 0;
    for (int i = 0; i < iters; i++)
        sum += lat[i];
    printf("locate 1000 keys (%zu hits): p50 %.1f us, p99 %.1f us over %d; baseline empty "
           "round trip p50 %.1f us, p99 %.1f us; ratio p50 %.2f\n", hits,
           lat[iters / 2] / 1e3, lat[iters * 99 / 100] / 1e3, iters, rtt[iters / 2] / 1e3,
           rtt[iters * 99 / 100] / 1e3, (double)lat[iters / 2] / (double)rtt[iters / 2]);
    printf("lookups: %.0f locates/s = %.0f keys/s from one client (sequential); the master's "
           "CPU per iteration (LOCATE + empty round trip) %.1f us\n",
           (double)iters * 1e9 / (double)sum, (double)iters * NK * 1e9 / (double)sum,
           (double)mcpu / iters / 1e3);
#ifdef UMBP_HAVE_HIREDIS
    {
        uint64_t sm[2], ping[2], rcpu = 0;
        char why[256];
        if (redis_smismember(keys, NK, iters, sm, ping, &rcpu, why, sizeof(why)) == 0)
            printf("redis SMISMEMBER of the same 1000 keys (membership only, no owners): p50 "
                   "%.1f us, p99 %.1f us; LOCATE / SMISMEMBER p50 %.2f, p99 %.2f; redis PING "
                   "p50 %.1f us, p99 %.1f us (empty round trip / PING p50 %.2f); redis-server's "
                   "CPU per iteration (SMISMEMBER + PING) %.1f us, the master's / redis's %.2f\n",
                   sm[0] / 1e3, sm[1] / 1e3, (double)lat[iters / 2] / (double)sm[0],
                   (double)lat[iters * 99 / 100] / (double)sm[1], ping[0] / 1e3, ping[1] / 1e3,
                   (double)rtt[iters / 2] / (double)ping[0], (double)rcpu / iters / 1e3,
                   rcpu ? (double)mcpu / (double)rcpu : 0.0);
        else
            printf("redis SMISMEMBER: skipped (%s)\n", why);
    }
#else
    printf("redis SMISMEMBER: skipped (built without hiredis: libhiredis-dev)\n");
#endif

    /* relearn of 1M keys from one node */
    enum { NR = 1 << 20 };
    umbp_key_t *rk = malloc(NR * sizeof(*rk));
    uint64_t *rs = malloc(NR * sizeof(*rs));
    for (uint32_t i = 0; i < NR; i++) {
        rk[i] = key_of(0x40000000u + i);
        rs[i] = 4096;
    }
    t0 = umbp_now_ns();
    int rc = mclient_resync(node, seq, 0, rk, rs, NR, 0, &a);
    double rl = (double)(umbp_now_ns() - t0) / 1e9;
    printf("relearn: %d keys in one RESYNC (%d frames) %.3f s = %.0f keys/s (rc %d)\n", NR,
           (NR + 65534) / 65535, rl, NR / rl, rc);
    mclient_destroy(node);
    mclient_destroy(look);
    kill(master, SIGTERM);
    waitpid(master, NULL, 0);
    free(lat);
    free(rtt);
    free(rk);
    free(rs);
    return rc < 0;
}
