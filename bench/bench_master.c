/*
 * bench_master - umbp-master on loopback, one core for the master (taskset
 * is the caller's): LOCATE of 1,000 keys (p50, p99), heartbeat events/s,
 * lookups/s, and the relearn of 1M keys from one node (one RESYNC of
 * 65,535-key frames, pipelined).  The baseline, measured in the same run:
 * the protocol's round trip with nothing to do (NODES with the current
 * epoch: an empty reply), so the LOCATE cost above it is the directory's
 * and the 32 KiB of keys each way.
 *
 *   build/bench/bench_master [iterations]
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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
    printf("lookups: %.0f locates/s = %.0f keys/s from one client (sequential)\n",
           (double)iters * 1e9 / (double)sum, (double)iters * NK * 1e9 / (double)sum);

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
