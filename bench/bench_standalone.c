/*
 * bench_standalone - standalone mode (a real umbp-server process, clients
 * over its Unix socket and shared pool) against embedded mode and plain
 * memcpy, all measured in the same run.
 *
 *  1. Prefix lookup of 1,000 keys: standalone round trip vs embedded,
 *     median and p99.  Target: <= 200 us median standalone.
 *  2. Host put/get of 256 KiB and 2 MiB objects through the shm tier vs
 *     single-threaded memcpy of the same bytes.  Target: >= 0.8x.
 *  3. Metadata rate: puts (reserve + publish) and gets (acquire + release)
 *     of 256-byte objects in batches of 64, from 1, 2, 4 and 8 clients (one
 *     runtime each, one thread each): keys/s and scaling.
 *
 * Usage: bench_standalone [path/to/umbp-server] [scale]
 * (default: the umbp-server built beside this benchmark; scale 1 = 256 MiB
 * of put/get per size).  Prints SKIP when standalone mode is not built.
 */
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

#ifndef UMBP_SERVER_BIN
#define UMBP_SERVER_BIN "umbp-server"
#endif

static char sock_dir[128];
static pid_t server_pid;

static void server_stop(void)
{
    if (server_pid > 0) {
        kill(server_pid, SIGTERM);
        waitpid(server_pid, NULL, 0);
        server_pid = 0;
    }
}

static void server_start(const char *bin, const char *capacity)
{
    snprintf(sock_dir, sizeof(sock_dir), "/tmp/umbp-bench-%d", (int)getpid());
    mkdir(sock_dir, 0700);
    char json[512];
    snprintf(json, sizeof(json),
             "{\"capacity_bytes\": \"%s\", \"socket_dir\": \"%s\", \"log_level\": \"warn\"}",
             capacity, sock_dir);
    server_pid = fork();
    if (server_pid == 0) {
        execl(bin, bin, "--json", json, (char *)NULL);
        fprintf(stderr, "bench_standalone: cannot run %s\n", bin);
        _exit(127);
    }
    atexit(server_stop);
}

/* A standalone runtime, retried while the server comes up. */
static umbp_runtime_t *standalone_rt(const char *extra)
{
    char cfg[512];
    snprintf(cfg, sizeof(cfg),
             "{\"mode\": \"standalone\", \"socket_dir\": \"%s\", \"lookup_timeout_ms\": 5000, "
             "\"startup_timeout_ms\": 200, \"log_level\": \"error\"%s}",
             sock_dir, extra ? extra : "");
    for (int i = 0; i < 200; i++) {
        umbp_runtime_t *rt;
        if (umbp_runtime_create(cfg, &rt) == 0)
            return rt;
        int st;
        if (waitpid(server_pid, &st, WNOHANG) == server_pid) {
            fprintf(stderr, "bench_standalone: umbp-server exited\n");
            server_pid = 0;
            exit(1);
        }
        usleep(50000);
    }
    fprintf(stderr, "bench_standalone: no server: %s\n", umbp_last_error());
    exit(1);
}

/* ---- 1. lookups -------------------------------------------------------------- */

#define NKEYS 1000

static void lookup_times(umbp_runtime_t *rt, int iters, double *med, double *p99)
{
    static umbp_key_t keys[NKEYS];
    static uint8_t payload[4096];
    umbp_range_t r = {payload, sizeof(payload), 0};
    umbp_put_item_t items[NKEYS];
    for (size_t i = 0; i < NKEYS; i++) {
        keys[i] = bench_key(11, i);
        items[i] = (umbp_put_item_t){keys[i], sizeof(payload), &r, 1};
    }
    umbp_op_t *op;
    if (umbp_put(rt, items, NKEYS, &op) < 0)
        exit(1);
    bench_wait_ok(op, "put");
    double *t = malloc(sizeof(double) * (size_t)iters);
    for (int i = 0; i < iters; i++) {
        size_t prefix = 0;
        double t0 = bench_now();
        int rc = umbp_lookup(rt, keys, NKEYS, NULL, &prefix, 0);
        t[i] = bench_now() - t0;
        if (rc != 0 || prefix != NKEYS) {
            fprintf(stderr, "lookup: %s, prefix %zu\n", umbp_strerror(rc), prefix);
            exit(1);
        }
    }
    qsort(t, (size_t)iters, sizeof(double), cmp_double);
    *med = t[iters / 2] * 1e6;
    *p99 = t[(size_t)iters * 99 / 100] * 1e6;
    free(t);
}

static void bench_lookups(void)
{
    umbp_runtime_t *emb = bench_runtime("{\"capacity_bytes\": \"64MiB\"}");
    umbp_runtime_t *sa = standalone_rt(NULL);
    double em, ep, sm, sp;
    lookup_times(emb, 2000, &em, &ep);
    lookup_times(sa, 2000, &sm, &sp);
    printf("1. lookup of %d keys, 2000 times (target: standalone median <= 200 us)\n", NKEYS);
    printf("   embedded (baseline)   median %7.1f us  p99 %7.1f us\n", em, ep);
    printf("   standalone            median %7.1f us  p99 %7.1f us   (%.2fx embedded)\n", sm,
           sp, sm / em);
    umbp_clear(sa);
    umbp_runtime_destroy(sa);
    umbp_runtime_destroy(emb);
}

/* ---- 2. put/get vs memcpy ---------------------------------------------------- */

static void bench_putget_threads(double scale, int threads);

static void bench_putget(double scale)
{
    printf("2. host put/get through the shm tier vs memcpy (best of 5; target >= 0.8x)\n");
    for (int threads = 1; threads <= 2; threads++)
        bench_putget_threads(scale, threads);
}

static void bench_putget_threads(double scale, int threads)
{
    char extra[96];
    snprintf(extra, sizeof(extra), ", \"copy_threads\": %d, \"timeout_ms\": 60000", threads);
    umbp_runtime_t *rt = standalone_rt(extra);
    static const size_t sizes[] = {256u << 10, 2u << 20};
    for (int si = 0; si < 2; si++) {
        size_t obj = sizes[si], nobj = (size_t)(scale * (256u << 20)) / obj;
        if (nobj < 4)
            nobj = 4;
        size_t total = nobj * obj;
        uint8_t *src = malloc(total), *dst = malloc(total);
        bench_fill(src, total, 3);
        memset(dst, 0, total);
        umbp_range_t *rg = calloc(nobj, sizeof(*rg));
        umbp_put_item_t *pi = calloc(nobj, sizeof(*pi));
        umbp_get_item_t *gi = calloc(nobj, sizeof(*gi));
        double bm = 1e9, bp = 1e9, bg = 1e9;
        for (int r = 0; r < 5; r++) {
            double t0 = bench_now();
            memcpy(dst, src, total);
            double t = bench_now() - t0;
            bm = t < bm ? t : bm;
            t = bench_pass(rt, src, obj, nobj, 100 + (uint64_t)r, true, rg, pi, gi);
            bp = t < bp ? t : bp;
            memset(dst, 0, total);
            t = bench_pass(rt, dst, obj, nobj, 100 + (uint64_t)r, false, rg, pi, gi);
            bg = t < bg ? t : bg;
            if (memcmp(src, dst, total) != 0) {
                fprintf(stderr, "restored bytes differ\n");
                exit(1);
            }
            umbp_clear(rt);
        }
        printf("   %4zu KiB objects, %d copy thread%s: memcpy %6.2f GB/s; put %6.2f GB/s (%.2fx)  "
               "get %6.2f GB/s (%.2fx)\n", obj >> 10, threads, threads > 1 ? "s" : " ",
               total / bm / 1e9, total / bp / 1e9, bm / bp,
               total / bg / 1e9, bm / bg);
        free(src), free(dst), free(rg), free(pi), free(gi);
    }
    umbp_runtime_destroy(rt);
}

/* ---- 3. metadata rate ---------------------------------------------------------- */

#define META_OBJ 256
#define META_BATCH 64

struct meta_arg {
    int id;
    size_t batches;
    double put_s, get_s;
};

static void *meta_client(void *p)
{
    struct meta_arg *a = p;
    umbp_runtime_t *rt = standalone_rt(", \"timeout_ms\": 60000");
    uint8_t buf[META_BATCH][META_OBJ];
    umbp_range_t rg[META_BATCH];
    umbp_put_item_t pi[META_BATCH];
    umbp_get_item_t gi[META_BATCH];
    for (int pass_no = 0; pass_no < 2; pass_no++) {
        double t0 = bench_now();
        for (size_t b = 0; b < a->batches; b++) {
            for (int i = 0; i < META_BATCH; i++) {
                umbp_key_t k = bench_key(1000 + (uint64_t)a->id, b * META_BATCH + (size_t)i);
                rg[i] = (umbp_range_t){buf[i], META_OBJ, 0};
                pi[i] = (umbp_put_item_t){k, META_OBJ, &rg[i], 1};
                gi[i] = (umbp_get_item_t){k, &rg[i], 1};
            }
            umbp_op_t *op;
            int rc;
            do
                rc = pass_no == 0 ? umbp_put(rt, pi, META_BATCH, &op) : umbp_get(rt, gi, META_BATCH, &op);
            while (rc == -EAGAIN);
            if (rc < 0)
                exit(1);
            bench_wait_ok(op, pass_no == 0 ? "meta put" : "meta get");
        }
        double t = bench_now() - t0;
        if (pass_no == 0)
            a->put_s = t;
        else
            a->get_s = t;
    }
    umbp_runtime_destroy(rt);
    return NULL;
}

static void bench_metadata(double scale)
{
    printf("3. metadata: %d-byte objects, batches of %d, one runtime and thread per client\n",
           META_OBJ, META_BATCH);
    double base_put = 0, base_get = 0;
    for (int nc = 1; nc <= 8; nc *= 2) {
        struct meta_arg a[8];
        pthread_t th[8];
        size_t batches = (size_t)(scale * 400);
        for (int c = 0; c < nc; c++) {
            a[c] = (struct meta_arg){.id = nc * 10 + c, .batches = batches};
            pthread_create(&th[c], NULL, meta_client, &a[c]);
        }
        double put = 0, get = 0;
        for (int c = 0; c < nc; c++) {
            pthread_join(th[c], NULL);
            put += (double)(batches * META_BATCH) / a[c].put_s;
            get += (double)(batches * META_BATCH) / a[c].get_s;
        }
        if (nc == 1)
            base_put = put, base_get = get;
        printf("   %d client%s  put (reserve+publish) %6.2f M keys/s (%.2fx)   get "
               "(acquire+release) %6.2f M keys/s (%.2fx)\n", nc, nc > 1 ? "s" : " ", put / 1e6,
               put / base_put, get / 1e6, get / base_get);
        umbp_runtime_t *rt = standalone_rt(NULL);
        umbp_clear(rt);
        umbp_runtime_destroy(rt);
    }
}

int main(int argc, char **argv)
{
    const char *bin = argc > 1 && argv[1][0] ? argv[1] : UMBP_SERVER_BIN;
    double scale = argc > 2 ? atof(argv[2]) : 1.0;
    if (scale <= 0)
        scale = 1.0;
    umbp_runtime_t *probe;
    if (umbp_runtime_create("{\"mode\": \"standalone\", \"log_level\": \"error\"}", &probe) == 0) {
        umbp_runtime_destroy(probe);
    } else if (strstr(umbp_last_error(), "tiers built in")) {
        printf("SKIP: bench_standalone: this libumbp has no standalone mode\n");
        return 0;
    }
    server_start(bin, "3GiB");
    printf("bench_standalone: umbp-server %s, socket dir %s\n", bin, sock_dir);
    bench_lookups();
    bench_putget(scale);
    bench_metadata(scale);
    server_stop();
    return 0;
}
