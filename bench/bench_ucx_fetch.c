/*
 * bench_ucx_fetch - a remote fetch over UCX (net/ucx.c) against a raw TCP
 * get of the same object between two processes, in the same run.
 *
 * The owner process (forked first, before either side touches UCX) holds
 * one object per size in a pool mapped with ucx_mem_map and serves it
 * four ways: FETCH active messages (its UCX node, on a libev loop driven
 * from the worker's event fd), the same from a second node holding a
 * cluster secret (every FETCH and DATA header carries a mac: the cost of
 * the data plane's authentication), one-sided ucp_get_nbx on the pool (the
 * packed rkey goes over a pipe: the variant kept for RDMA hosts; the
 * requester busy-polls it, because over tcp the emulated get's reply did
 * not wake a loop sleeping on the event fd), and a
 * raw TCP request/response server on 127.0.0.1 (a thread: read the 4-byte
 * object index, write the object).  The requester does, per round and per
 * size, `iters` gets one at a time with each method back to back, every
 * byte of every get verified outside the timed part, and prints GB/s, the
 * per-op p50 and the ratio to raw TCP; the summary is the median over
 * rounds of the per-round ratios (this machine's speed swings between
 * rounds).  Every line names the UCX transport in use; the AM fetch's lines
 * also say how UCX sent the bytes (eager, with the reply, or rendezvous).
 *
 * The owner's CPU time (every thread's schedstat under /proc/<pid>/task,
 * in ns) is read around each method's gets: "owner CPU" is the serving CPU
 * per GB sent, for the raw TCP server and for UCX, in the same run.
 *
 *   bench_ucx_fetch [rounds (5)] [--owner-netns NAME --owner-addr IPV4]
 *                   [--cpus OWNER,REQUESTER]
 * With --owner-netns the owner moves into network namespace NAME (a file
 * under /run/netns, made by `ip netns add`) before it opens any socket, and
 * the requester (started in another namespace with `ip netns exec`) reaches
 * its raw TCP server at IPV4: two hosts over a veth link
 * (bench/ucx_netns.sh sets that up).  --cpus pins the owner's and the
 * requester's threads to one CPU each (after the fork, before UCX starts):
 * two hosts do not share a core.
 * Environment: UCX_TLS (default tcp here) and UCX_NET_DEVICES (default lo)
 * choose the transport; nothing in umbp branches on it.
 */
#include <stdio.h>
#include <stdlib.h>

#ifndef UMBP_HAVE_UCX
int main(void)
{
    printf("bench_ucx_fetch: UCX not built (pkg-config found no ucx); run scripts/setup.sh\n");
    return 0;
}
#else

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "bench_util.h"
#include "ucx.h"

/* the cluster's secret of the "AM fetch + macs" nodes (ucx_wire.h's macs) */
#define BENCH_SECRET "bench_ucx_fetch: a secret of 32+ bytes"

#define NSIZES 3
/* UMBP_UCX_SPIN_US: both nodes progress this long before sleeping while a
 * fetch or a send is in flight (ucx_node_config.spin_us; 0 by default) */
static uint32_t spin_us(void)
{
    const char *v = getenv("UMBP_UCX_SPIN_US");
    return v ? (uint32_t)strtoul(v, NULL, 10) : 0;
}

static const uint64_t sizes[NSIZES] = { 4096, 256 << 10, 2 << 20 };
static const int iters[NSIZES] = { 2000, 200, 40 };
static const char *names[NSIZES] = { "4 KiB", "256 KiB", "2 MiB" };

static uint64_t slot(int i)
{
    uint64_t off = 0;
    for (int j = 0; j < i; j++)
        off += sizes[j];
    return off;
}

static const uint64_t POOL = (4096 + (256 << 10) + (2 << 20));

static void fill_pool(uint8_t *pool)
{
    for (int i = 0; i < NSIZES; i++)
        bench_fill(pool + slot(i), sizes[i], 1000 + (uint64_t)i);
}

static bool full_rw(int fd, void *buf, size_t len, bool wr)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = wr ? write(fd, p, len) : read(fd, p, len);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return false;
        }
        p += r;
        len -= (size_t)r;
    }
    return true;
}

/* ---- the owner -------------------------------------------------------------- */

static uint8_t *g_pool;

static int own_take(void *ctx, const umbp_key_t *key, const void **addr, uint64_t *size,
                    uint64_t *lease)
{
    int i = key->bytes[0];
    if (i >= NSIZES)
        return -ENOENT;
    *addr = g_pool + slot(i);
    *size = sizes[i];
    *lease = 0;
    return 0;
}

static void own_release(void *ctx, uint64_t lease) {}

static void *tcp_serve(void *arg)
{
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        uint32_t i;
        while (full_rw(fd, &i, 4, false) && i < NSIZES)
            if (!full_rw(fd, g_pool + slot((int)i), sizes[i], true))
                break;
        close(fd);
    }
    return NULL;
}

/* This thread (and the threads it starts) on CPU cpu; nothing for -1. */
static void pin(const char *who, int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set))
        fprintf(stderr, "%s: cannot pin to CPU %d: %s\n", who, cpu, strerror(errno));
}

static void owner_main(int out, const char *netns, int cpu)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pin("owner", cpu);
    if (netns) {
        char path[320];
        snprintf(path, sizeof(path), "/run/netns/%s", netns);
        int nfd = open(path, O_RDONLY | O_CLOEXEC);
        if (nfd < 0 || setns(nfd, CLONE_NEWNET)) {
            fprintf(stderr, "owner: cannot enter network namespace %s: %s\n", path,
                    strerror(errno));
            _exit(6);
        }
        close(nfd);
    }
    g_pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fill_pool(g_pool);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET,
                              .sin_addr.s_addr = htonl(netns ? INADDR_ANY : INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    if (bind(lfd, (void *)&sa, sizeof(sa)) || listen(lfd, 4) || getsockname(lfd, (void *)&sa, &sl))
        _exit(2);
    pthread_t th;
    pthread_create(&th, NULL, tcp_serve, (void *)(intptr_t)lfd);

    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    struct ucx_serve_ops ops = { .lease_take = own_take, .lease_release = own_release };
    struct ucx_node_config cfg = { .loop = loop, .name = "bench-owner", .serve = &ops,
                                   .spin_us = spin_us() };
    struct ucx_node *n;
    if (ucx_node_create(&cfg, &n) || ucx_mem_map(n, g_pool, POOL)) {
        fprintf(stderr, "owner: %s\n", umbp_last_error());
        _exit(3);
    }
    void *rkey;
    size_t rklen;
    if (ucp_rkey_pack(ucx_node_context(n), ucx_node_memh(n), &rkey, &rklen) != UCS_OK)
        _exit(4);
    const void *addr;
    size_t alen;
    ucx_node_address(n, &addr, &alen);
    struct net_auth_key key;
    net_auth_key_from(BENCH_SECRET, strlen(BENCH_SECRET), &key);
    struct ucx_node_config mcfg = cfg;
    mcfg.name = "bench-owner-mac";
    mcfg.auth = &key;
    struct ucx_node *nm;
    if (ucx_node_create(&mcfg, &nm) || ucx_mem_map(nm, g_pool, POOL)) {
        fprintf(stderr, "owner (macs): %s\n", umbp_last_error());
        _exit(3);
    }
    const void *maddr;
    size_t malen;
    ucx_node_address(nm, &maddr, &malen);
    uint32_t m32 = (uint32_t)malen;
    uint32_t a32 = (uint32_t)alen, r32 = (uint32_t)rklen;
    uint64_t base = (uint64_t)(uintptr_t)g_pool;
    uint16_t port = sa.sin_port;
    if (!full_rw(out, &a32, 4, true) || !full_rw(out, (void *)addr, alen, true) ||
        !full_rw(out, &r32, 4, true) || !full_rw(out, rkey, rklen, true) ||
        !full_rw(out, &base, 8, true) || !full_rw(out, &port, 2, true) ||
        !full_rw(out, &m32, 4, true) || !full_rw(out, (void *)maddr, malen, true))
        _exit(5);
    ucp_rkey_buffer_release(rkey);
    ev_run(loop, 0);
    _exit(0);
}

/* ---- the requester ------------------------------------------------------------ */

struct flag {
    bool done;
};

static void on_done(void *arg, struct ucx_fetch_item *items, uint32_t n)
{
    ((struct flag *)arg)->done = true;
}

static void on_get(void *req, ucs_status_t st, void *arg)
{
    ucp_request_free(req);
    ((struct flag *)arg)->done = true;
    if (st != UCS_OK) {
        fprintf(stderr, "ucp_get_nbx: %s\n", ucs_status_string(st));
        exit(1);
    }
}

static struct ev_loop *g_loop;

static void run_until(struct flag *f)
{
    while (!f->done)
        ev_run(g_loop, EVRUN_ONCE);
}

static void verify(const uint8_t *got, int i, const char *how)
{
    if (memcmp(got, g_pool + slot(i), sizes[i])) {
        fprintf(stderr, "%s %s: bytes differ\n", how, names[i]);
        exit(1);
    }
}

/* every thread's run time of process pid, in ns (schedstat's first field) */
static uint64_t proc_cpu_ns(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    uint64_t sum = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char f[384];
        snprintf(f, sizeof(f), "%s/%s/schedstat", path, e->d_name);
        FILE *fp = fopen(f, "r");
        unsigned long long ns;
        if (fp && fscanf(fp, "%llu", &ns) == 1)
            sum += ns;
        if (fp)
            fclose(fp);
    }
    closedir(d);
    return sum;
}

enum { M_TCP, M_AM, M_AM_MAC, M_GET, NM };
static const char *mnames[NM] = { "raw TCP get", "UCX AM fetch", "AM fetch + macs",
                                  "ucp_get_nbx busy" };

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rounds = 5;
    const char *owner_netns = NULL, *owner_addr = NULL;
    int owner_cpu = -1, cpu = -1;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--owner-netns") && a + 1 < argc)
            owner_netns = argv[++a];
        else if (!strcmp(argv[a], "--owner-addr") && a + 1 < argc)
            owner_addr = argv[++a];
        else if (!strcmp(argv[a], "--cpus") && a + 1 < argc &&
                 sscanf(argv[a + 1], "%d,%d", &owner_cpu, &cpu) == 2 && owner_cpu >= 0 &&
                 cpu >= 0)
            a++;
        else if (argv[a][0] >= '0' && argv[a][0] <= '9')
            rounds = atoi(argv[a]);
        else {
            fprintf(stderr, "usage: bench_ucx_fetch [rounds] [--owner-netns NAME --owner-addr "
                            "IPV4] [--cpus OWNER,REQUESTER]\n");
            return 2;
        }
    }
    if (!owner_netns != !owner_addr) {
        fprintf(stderr, "bench_ucx_fetch: --owner-netns and --owner-addr go together\n");
        return 2;
    }
    if (rounds < 1)
        rounds = 1;
    setenv("UCX_TLS", getenv("UCX_TLS") ? getenv("UCX_TLS") : "tcp", 1);
    setenv("UCX_NET_DEVICES", getenv("UCX_NET_DEVICES") ? getenv("UCX_NET_DEVICES") : "lo", 1);
    int pp[2];
    if (pipe(pp))
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(pp[0]);
        owner_main(pp[1], owner_netns, owner_cpu);
    }
    close(pp[1]);
    uint32_t a32, r32, m32;
    static uint8_t addr[4096], rkbuf[4096], maddr[4096];
    uint64_t base;
    uint16_t port;
    if (!full_rw(pp[0], &a32, 4, false) || a32 > sizeof(addr) || !full_rw(pp[0], addr, a32, false) ||
        !full_rw(pp[0], &r32, 4, false) || r32 > sizeof(rkbuf) ||
        !full_rw(pp[0], rkbuf, r32, false) || !full_rw(pp[0], &base, 8, false) ||
        !full_rw(pp[0], &port, 2, false) || !full_rw(pp[0], &m32, 4, false) ||
        m32 > sizeof(maddr) || !full_rw(pp[0], maddr, m32, false)) {
        fprintf(stderr, "owner did not start\n");
        return 1;
    }
    pin("requester", cpu);
    /* the expected bytes, computed as the owner did */
    g_pool = malloc(POOL);
    fill_pool(g_pool);

    g_loop = ev_loop_new(EVFLAG_AUTO);
    struct ucx_node_config cfg = { .loop = g_loop, .name = "bench-requester",
                                   .spin_us = spin_us() };
    struct ucx_node *n;
    struct ucx_peer *peer;
    uint8_t *dst = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(dst, 0, POOL);
    if (ucx_node_create(&cfg, &n) || ucx_mem_map(n, dst, POOL) ||
        ucx_peer_create(n, addr, a32, &peer)) {
        fprintf(stderr, "requester: %s\n", umbp_last_error());
        return 1;
    }
    struct net_auth_key key;
    net_auth_key_from(BENCH_SECRET, strlen(BENCH_SECRET), &key);
    struct ucx_node_config mcfg = cfg;
    mcfg.name = "bench-requester-mac";
    mcfg.auth = &key;
    struct ucx_node *nm;
    struct ucx_peer *mpeer;
    if (ucx_node_create(&mcfg, &nm) || ucx_mem_map(nm, dst, POOL) ||
        ucx_peer_create(nm, maddr, m32, &mpeer)) {
        fprintf(stderr, "requester (macs): %s\n", umbp_last_error());
        return 1;
    }
    ucp_ep_h ep = ucx_peer_ep(peer);
    ucp_rkey_h rkey;
    if (ucp_ep_rkey_unpack(ep, rkbuf, &rkey) != UCS_OK) {
        fprintf(stderr, "ucp_ep_rkey_unpack failed\n");
        return 1;
    }
    int tfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = port,
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (owner_addr && inet_pton(AF_INET, owner_addr, &sa.sin_addr) != 1) {
        fprintf(stderr, "bench_ucx_fetch: --owner-addr '%s' is not an IPv4 address\n", owner_addr);
        return 2;
    }
    int one = 1;
    setsockopt(tfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(tfd, (void *)&sa, sizeof(sa))) {
        perror("connect");
        return 1;
    }

    /* warm every path once (UCX wire-up, first rendezvous) */
    for (int i = 0; i < 2 * NSIZES; i++) {
        struct ucx_fetch_item it = { .dst = dst, .cap = sizes[i % NSIZES] };
        it.key.bytes[0] = (uint8_t)(i % NSIZES);
        struct flag f = { 0 };
        int rc = ucx_fetch(i < NSIZES ? peer : mpeer, &it, 1, 10000, on_done, &f);
        if (rc) {
            fprintf(stderr, "ucx_fetch: %s\n", umbp_strerror(rc));
            return 1;
        }
        run_until(&f);
        if (it.status) {
            fprintf(stderr, "warm-up fetch: %s\n", umbp_strerror(it.status));
            return 1;
        }
    }
    const char *tr = ucx_peer_transport(peer);
    printf("bench_ucx_fetch: UCX %s, UCX_TLS=%s, transport in use: %s; %d rounds; one get in "
           "flight; spin %u us; owner %s; every byte verified\n", ucp_get_version_string(),
           ucx_node_transports(n), tr, rounds, spin_us(),
           owner_netns ? owner_netns : "on loopback in this namespace");

    static double gbps[NSIZES][NM][64], p50[NSIZES][NM][64];
    static double lat[2000];
    static uint64_t own_ns[NSIZES][NM], own_bytes[NSIZES][NM];
    static uint64_t n_eager[NSIZES], n_rndv[NSIZES]; /* how the AM fetch's bytes came */
    if (rounds > 64)
        rounds = 64;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < NSIZES; i++)
            for (int m = 0; m < NM; m++) {
                double busy = 0;
                uint64_t c0 = proc_cpu_ns(pid);
                struct ucx_node_stats s0, s1;
                ucx_node_stats(n, &s0);
                for (int k = 0; k < iters[i]; k++) {
                    memset(dst, 0, 64);
                    double t0 = bench_now();
                    if (m == M_TCP) {
                        uint32_t idx = (uint32_t)i;
                        if (!full_rw(tfd, &idx, 4, true) || !full_rw(tfd, dst, sizes[i], false)) {
                            fprintf(stderr, "raw TCP get failed\n");
                            return 1;
                        }
                    } else if (m == M_AM || m == M_AM_MAC) {
                        struct ucx_fetch_item it = { .dst = dst, .cap = sizes[i] };
                        it.key.bytes[0] = (uint8_t)i;
                        struct flag f = { 0 };
                        if (ucx_fetch(m == M_AM ? peer : mpeer, &it, 1, 10000, on_done, &f)) {
                            fprintf(stderr, "ucx_fetch refused\n");
                            return 1;
                        }
                        run_until(&f);
                        if (it.status) {
                            fprintf(stderr, "fetch: %s\n", umbp_strerror(it.status));
                            return 1;
                        }
                    } else {
                        struct flag f = { 0 };
                        ucp_request_param_t prm = {
                            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                            UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH,
                            .cb.send = on_get,
                            .user_data = &f,
                            .memh = ucx_node_memh(n),
                        };
                        void *req = ucp_get_nbx(ep, dst, sizes[i], base + slot(i), rkey, &prm);
                        if (UCS_PTR_IS_ERR(req)) {
                            fprintf(stderr, "ucp_get_nbx: %s\n",
                                    ucs_status_string(UCS_PTR_STATUS(req)));
                            return 1;
                        }
                        /* busy progress: with the worker's event fd alone the
                         * emulated get's reply did not wake this loop (UCX
                         * 1.13.1 over tcp); the variant is for RDMA hosts */
                        while (req && !f.done)
                            ucp_worker_progress(ucx_node_worker(n));
                    }
                    double dt = bench_now() - t0;
                    busy += dt;
                    lat[k] = dt;
                    verify(dst, i, mnames[m]);
                }
                own_ns[i][m] += proc_cpu_ns(pid) - c0;
                ucx_node_stats(n, &s1);
                n_eager[i] += s1.data_eager - s0.data_eager;
                n_rndv[i] += s1.data_rndv - s0.data_rndv;
                own_bytes[i][m] += sizes[i] * (uint64_t)iters[i];
                qsort(lat, (size_t)iters[i], sizeof(double), cmp_double);
                gbps[i][m][r] = (double)sizes[i] * iters[i] / busy / 1e9;
                p50[i][m][r] = lat[iters[i] / 2] * 1e6;
            }

    printf("%-8s %-16s %9s %10s %14s %20s   (transport %s)\n", "size", "method", "GB/s",
           "p50 us", "x raw TCP", "owner CPU s/GB", tr);
    for (int i = 0; i < NSIZES; i++)
        for (int m = 0; m < NM; m++) {
            double g[64], l[64], ratio[64], lr[64];
            for (int r = 0; r < rounds; r++) {
                g[r] = gbps[i][m][r];
                l[r] = p50[i][m][r];
                ratio[r] = gbps[i][m][r] / gbps[i][M_TCP][r];
                lr[r] = p50[i][m][r] / p50[i][M_TCP][r];
            }
            qsort(g, (size_t)rounds, sizeof(double), cmp_double);
            qsort(l, (size_t)rounds, sizeof(double), cmp_double);
            qsort(ratio, (size_t)rounds, sizeof(double), cmp_double);
            qsort(lr, (size_t)rounds, sizeof(double), cmp_double);
            double own = (double)own_ns[i][m] / (double)own_bytes[i][m];  /* ns/B = s/GB */
            double cpu_tcp = (double)own_ns[i][M_TCP] / (double)own_bytes[i][M_TCP];
            /* the AM fetch's protocol: UCX's eager (with the reply) or rendezvous */
            const char *proto = m != M_AM ? "" : !n_rndv[i] ? ", eager" : !n_eager[i] ? ", rndv"
                                                                                      : ", mixed";
            printf("%-8s %-16s %9.3f %10.1f %8.2fx GB/s  p50 %.2fx   owner CPU %.3f s/GB "
                   "(%.2fx raw TCP's)   [%s%s]\n",
                   names[i], mnames[m], g[rounds / 2], l[rounds / 2], ratio[rounds / 2],
                   lr[rounds / 2], own, own / cpu_tcp, tr, proto);
        }
    for (int i = 0; i < NSIZES; i++) {
        double mr[64];
        for (int r = 0; r < rounds; r++)
            mr[r] = gbps[i][M_AM_MAC][r] / gbps[i][M_AM][r];
        qsort(mr, (size_t)rounds, sizeof(double), cmp_double);
        printf("%-8s macs: %.3fx the AM fetch's GB/s without them (median of per-round "
               "ratios)\n", names[i], mr[rounds / 2]);
    }
    struct ucx_node_stats st, sm;
    ucx_node_stats(n, &st);
    ucx_node_stats(nm, &sm);
    printf("requester: %llu fetches, %llu timeouts, %llu peer errors; with macs %llu fetches, "
           "%llu wrong macs\n", (unsigned long long)st.fetches, (unsigned long long)st.timeouts,
           (unsigned long long)st.peer_errors, (unsigned long long)sm.fetches,
           (unsigned long long)sm.bad_macs);
    ucx_node_destroy(nm);
    ucp_rkey_destroy(rkey);
    close(tfd);
    ucx_node_destroy(n);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 0;
}
#endif
