/*
 * bench_kv_engines - several engines (processes), each bound to its own GPU,
 * sharing one umbp-server: the two-engine picture of a host with one engine
 * per GPU.
 *
 *  1. Engine 0 stores a 10,000-token prefix (625 blocks) from its GPU;
 *     every other engine restores it on its own GPU into a poisoned KV cache
 *     and checks every byte.
 *  2. Each engine restores the prefix `rounds` times alone, then all engines
 *     at once; baseline from the same run: each engine's contiguous pinned
 *     host-to-device copy of the same bytes, alone and all at once (the host
 *     side, memory and root complex, is shared).  GB/s and ratios per engine.
 *
 * Usage: bench_kv_engines [rounds] [backend] [gpus] [engines] [layers] [chunk_kib]
 *   defaults: 30 cuda 2 2 24 16.  Engine e runs on GPU e % gpus, so gpus 1
 *   puts every engine on GPU 0 (one link, shared).  The host backend (device
 *   memory is host memory) checks the cross-process path on a machine with
 *   no GPU.  The benchmark starts the umbp-server built beside it.
 * Prints SKIP and exits 0 without the device or standalone mode.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"
#include "umbp/gpu.h"
#include "umbp/umbp.h"

#ifndef UMBP_SERVER_BIN
#define UMBP_SERVER_BIN "umbp-server"
#endif

#define NBLK 625
#define BS 16
#define MAX_ENGINES 8

struct result {
    int rc;
    double best_s, median_s;
    char msg[200];
};

struct setup {
    const struct gpu_ops *o;
    const char *backend;
    int rounds, layers, gpu, engine;
    size_t chunk, layer_bytes, total;
    char sock_dir[128];
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint8_t pattern(int layer, size_t i) { return (uint8_t)(i * 131 + (size_t)layer * 7 + (i >> 12)); }

static umbp_key_t key_of(int i)
{
    umbp_key_t k;
    memset(&k, 0, sizeof(k));
    memcpy(k.bytes, "engines", 7);
    memcpy(k.bytes + 8, &i, sizeof(i));
    return k;
}

/* ---- an engine (a child process) ------------------------------------------ */

struct engine {
    struct setup s;
    umbp_runtime_t *rt;
    umbp_kv_handle_t kv;
    void **dev;
    void *pinned, *dcont;
    uint8_t *host;
};

#define FAIL(r, ...)                                                                  \
    do {                                                                              \
        (r)->rc = 1;                                                                  \
        snprintf((r)->msg, sizeof((r)->msg), __VA_ARGS__);                            \
        return;                                                                       \
    } while (0)

static void engine_open(struct engine *e, struct result *r)
{
    const struct setup *s = &e->s;
    char cfg[512];
    snprintf(cfg, sizeof(cfg),
             "{\"mode\":\"standalone\",\"socket_dir\":\"%s\",\"gpu_backend\":\"%s\","
             "\"gpu_device\":%d,\"log_level\":\"error\"}",
             s->sock_dir, s->backend, s->gpu);
    if (umbp_runtime_create(cfg, &e->rt) < 0)
        FAIL(r, "engine %d: runtime: %s", s->engine, umbp_last_error());
    int prev;
    if (gpu_device_enter(s->o, s->gpu, &prev) < 0)
        FAIL(r, "engine %d: GPU %d: %s", s->engine, s->gpu, umbp_gpu_last_error());
    e->dev = calloc((size_t)s->layers, sizeof(void *));
    umbp_kv_tensor_t *t = calloc((size_t)s->layers, sizeof(*t));
    e->host = malloc(s->layer_bytes);
    for (int l = 0; l < s->layers; l++) {
        if (gpu_dev_alloc(s->o, s->layer_bytes, &e->dev[l]) < 0)
            FAIL(r, "engine %d: device alloc", s->engine);
        /* engine 0 holds the prefix; the others a poisoned cache */
        for (size_t i = 0; i < s->layer_bytes; i++)
            e->host[i] = s->engine == 0 ? pattern(l, i) : 0xA5;
        if (gpu_memcpy_sync(s->o, e->dev[l], e->host, s->layer_bytes) < 0)
            FAIL(r, "engine %d: upload", s->engine);
        t[l].base = e->dev[l];
        t[l].ndim = 4;
        t[l].shape[0] = 2, t[l].shape[1] = NBLK, t[l].shape[2] = BS;
        t[l].shape[3] = (int64_t)(s->chunk / (BS * 2));
        umbp_kv_tensor_set_contiguous(&t[l]);
        t[l].elem_size = 2;
        t[l].block_dim = 1;
        t[l].kv_dim = 0;
        t[l].layer_dim = -1;
    }
    if (gpu_host_alloc(s->o, s->total, &e->pinned) < 0 || gpu_dev_alloc(s->o, s->total, &e->dcont) < 0)
        FAIL(r, "engine %d: baseline buffers", s->engine);
    memset(e->pinned, 0x3c, s->total);
    gpu_device_leave(s->o, s->gpu, prev);
    if (umbp_kv_register(e->rt, t, (uint32_t)s->layers, &e->kv) < 0)
        FAIL(r, "engine %d: register: %s", s->engine, umbp_last_error());
    free(t);
}

static int xfer(struct engine *e, bool store)
{
    umbp_kv_block_t b[NBLK];
    for (int i = 0; i < NBLK; i++)
        b[i] = (umbp_kv_block_t){key_of(i), (uint64_t)i};
    umbp_op_t *op;
    int rc = store ? umbp_kv_store(e->rt, e->kv, b, NBLK, NULL, &op)
                   : umbp_kv_load(e->rt, e->kv, b, NBLK, NULL, &op);
    if (rc < 0)
        return rc;
    rc = umbp_op_wait(op, 60000) == 0 && umbp_op_num_ok(op) == NBLK ? 0 : -EIO;
    umbp_op_release(op);
    return rc;
}

static void engine_store(struct engine *e, struct result *r)
{
    if (xfer(e, true) < 0)
        FAIL(r, "engine %d: store failed", e->s.engine);
}

static void engine_verify(struct engine *e, struct result *r)
{
    const struct setup *s = &e->s;
    if (xfer(e, false) < 0)
        FAIL(r, "engine %d: restore failed", s->engine);
    int prev;
    gpu_device_enter(s->o, s->gpu, &prev);
    for (int l = 0; l < s->layers; l++) {
        if (gpu_memcpy_sync(s->o, e->host, e->dev[l], s->layer_bytes) < 0)
            FAIL(r, "engine %d: download", s->engine);
        for (size_t i = 0; i < s->layer_bytes; i++)
            if (e->host[i] != pattern(l, i)) {
                gpu_device_leave(s->o, s->gpu, prev);
                FAIL(r, "engine %d (GPU %d): layer %d byte %zu is 0x%02x, expected 0x%02x",
                     s->engine, s->gpu, l, i, e->host[i], pattern(l, i));
            }
    }
    gpu_device_leave(s->o, s->gpu, prev);
}

/* `rounds` timed restores (or contiguous copies): best and median */
static void engine_time(struct engine *e, bool baseline, struct result *r)
{
    const struct setup *s = &e->s;
    double *t = calloc((size_t)s->rounds, sizeof(double));
    int prev;
    for (int i = 0; i < s->rounds; i++) {
        double t0 = now();
        int rc;
        if (baseline) {
            gpu_device_enter(s->o, s->gpu, &prev);
            rc = gpu_memcpy_sync(s->o, e->dcont, e->pinned, s->total);
            gpu_device_leave(s->o, s->gpu, prev);
        } else {
            rc = xfer(e, false);
        }
        t[i] = now() - t0;
        if (rc < 0) {
            free(t);
            FAIL(r, "engine %d: %s failed", s->engine, baseline ? "copy" : "restore");
        }
    }
    qsort(t, (size_t)s->rounds, sizeof(double), cmp_double);
    r->best_s = t[0];
    r->median_s = t[s->rounds / 2];
    free(t);
}

static void engine_main(struct setup s, int cmd_fd, int res_fd)
{
    struct engine e = {.s = s};
    struct result r = {0};
    engine_open(&e, &r);
    if (write(res_fd, &r, sizeof(r)) != sizeof(r) || r.rc)
        _exit(1);
    char c;
    while (read(cmd_fd, &c, 1) == 1 && c != 'q') {
        memset(&r, 0, sizeof(r));
        switch (c) {
        case 's': engine_store(&e, &r); break;
        case 'v': engine_verify(&e, &r); break;
        case 'b': engine_time(&e, true, &r); break;
        case 'r': engine_time(&e, false, &r); break;
        default: snprintf(r.msg, sizeof(r.msg), "unknown command"); r.rc = 1;
        }
        if (write(res_fd, &r, sizeof(r)) != sizeof(r))
            _exit(1);
    }
    umbp_runtime_destroy(e.rt);
    _exit(0);
}

/* ---- the driver ------------------------------------------------------------ */

static int cmd[MAX_ENGINES], res[MAX_ENGINES], nengines;
static pid_t pids[MAX_ENGINES], server_pid;

static void stop_all(void)
{
    for (int i = 0; i < nengines; i++)
        if (pids[i] > 0) {
            if (write(cmd[i], "q", 1) != 1)
                kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
    if (server_pid > 0) {
        kill(server_pid, SIGTERM);
        waitpid(server_pid, NULL, 0);
    }
}

/* Sends c to the engines in [lo, hi) at once, then collects their results. */
static void run_cmd(char c, int lo, int hi, struct result *out)
{
    for (int i = lo; i < hi; i++)
        if (write(cmd[i], &c, 1) != 1)
            exit(1);
    for (int i = lo; i < hi; i++) {
        if (read(res[i], &out[i], sizeof(out[i])) != sizeof(out[i])) {
            fprintf(stderr, "bench_kv_engines: engine %d died\n", i);
            stop_all();
            exit(1);
        }
        if (out[i].rc) {
            fprintf(stderr, "bench_kv_engines: %s\n", out[i].msg);
            stop_all();
            exit(1);
        }
    }
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 30;
    const char *backend = argc > 2 ? argv[2] : "cuda";
    int gpus = argc > 3 ? atoi(argv[3]) : 2;
    nengines = argc > 4 ? atoi(argv[4]) : 2;
    int layers = argc > 5 ? atoi(argv[5]) : 24;
    size_t chunk = (size_t)(argc > 6 ? atoi(argv[6]) : 16) << 10;
    const char *bad = rounds < 1                               ? "rounds must be >= 1"
                      : gpus < 1                               ? "gpus must be >= 1"
                      : nengines < 2 || nengines > MAX_ENGINES ? "engines must be 2..8"
                      : layers < 1 || layers > 256             ? "layers must be 1..256"
                      : chunk < 1024 || chunk > (1u << 20)     ? "chunk_kib must be 1..1024"
                      : strcmp(backend, "cuda") && strcmp(backend, "hip") && strcmp(backend, "host")
                          ? "backend must be cuda, hip or host"
                          : NULL;
    if (bad) {
        fprintf(stderr, "bench_kv_engines: %s\nusage: bench_kv_engines [rounds] [backend] [gpus] "
                "[engines 2..%d] [layers] [chunk_kib]\n", bad, MAX_ENGINES);
        return 2;
    }
    umbp_gpu_backend_t b = strcmp(backend, "hip") == 0    ? UMBP_GPU_BACKEND_HIP
                           : strcmp(backend, "host") == 0 ? UMBP_GPU_BACKEND_HOST
                                                          : UMBP_GPU_BACKEND_CUDA;
    /* probed in a child: a CUDA context in this process would not survive
     * the fork of the engines */
    int ndev = 0, pp[2];
    char why[200] = "";
    if (pipe(pp) < 0)
        return 1;
    pid_t probe = fork();
    if (probe == 0) {
        int n = 0;
        char w[200] = "";
        if (umbp_gpu_backend_probe(b, &n) < 0) {
            n = -1;
            snprintf(w, sizeof(w), "%s", umbp_gpu_last_error());
        }
        if (write(pp[1], &n, sizeof(n)) != sizeof(n) || write(pp[1], w, sizeof(w)) != sizeof(w))
            _exit(1);
        _exit(0);
    }
    close(pp[1]);
    if (read(pp[0], &ndev, sizeof(ndev)) != sizeof(ndev) || read(pp[0], why, sizeof(why)) != sizeof(why))
        ndev = -1;
    close(pp[0]);
    waitpid(probe, NULL, 0);
    why[sizeof(why) - 1] = '\0';
    if (ndev < 0) {
        printf("SKIP: bench_kv_engines: no %s device: %s\n", backend, why);
        return 0;
    }
    if (ndev < gpus) {
        printf("SKIP: bench_kv_engines: %d %s device(s), %d asked for\n", ndev, backend, gpus);
        return 0;
    }
    if (access(UMBP_SERVER_BIN, X_OK) != 0) {
        printf("SKIP: bench_kv_engines: no umbp-server (%s)\n", UMBP_SERVER_BIN);
        return 0;
    }
    struct setup s = {.o = gpu_backend_ops(b), .backend = backend, .rounds = rounds,
                      .layers = layers, .chunk = chunk};
    s.layer_bytes = 2 * (size_t)NBLK * chunk;
    s.total = s.layer_bytes * (size_t)layers;
    snprintf(s.sock_dir, sizeof(s.sock_dir), "/tmp/umbp-engines-%d", (int)getpid());
    mkdir(s.sock_dir, 0700);
    char json[512];
    snprintf(json, sizeof(json),
             "{\"capacity_bytes\": %zu, \"socket_dir\": \"%s\", \"dram_prefault\": true, "
             "\"log_level\": \"warn\"}", s.total * 2 + (64u << 20), s.sock_dir);
    if ((server_pid = fork()) == 0) {
        execl(UMBP_SERVER_BIN, UMBP_SERVER_BIN, "--json", json, (char *)NULL);
        _exit(127);
    }
    char sock[200];
    snprintf(sock, sizeof(sock), "%s/umbp-dp0.sock", s.sock_dir);
    for (int i = 0; i < 300 && access(sock, F_OK) != 0; i++)
        usleep(20000); /* the server's socket appears when it serves */
    fflush(stdout);
    for (int i = 0; i < nengines; i++) {
        int c[2], r[2];
        if (pipe(c) < 0 || pipe(r) < 0)
            return 1;
        s.engine = i;
        s.gpu = i % gpus;
        if ((pids[i] = fork()) == 0) {
            close(c[1]);
            close(r[0]);
            engine_main(s, c[0], r[1]);
        }
        close(c[0]);
        close(r[1]);
        cmd[i] = c[1];
        res[i] = r[0];
    }
    struct result out[MAX_ENGINES];
    for (int i = 0; i < nengines; i++)
        if (read(res[i], &out[i], sizeof(out[i])) != sizeof(out[i]) || out[i].rc) {
            fprintf(stderr, "bench_kv_engines: engine %d did not start: %s\n", i,
                    out[i].rc ? out[i].msg : "died");
            stop_all();
            return 1;
        }
    printf("bench_kv_engines: %d engines on %d %s GPU(s), one umbp-server; %d layers x %zu KiB, "
           "%d blocks (%.0f MiB), best and median of %d\n", nengines, gpus, backend, layers,
           chunk >> 10, NBLK, (double)s.total / (1 << 20), rounds);
    run_cmd('s', 0, 1, out);
    run_cmd('v', 1, nengines, out);
    printf("  stored from GPU 0, restored on every other engine's GPU: every byte verified\n");

    struct result base_alone[MAX_ENGINES], rest_alone[MAX_ENGINES];
    struct result base_all[MAX_ENGINES], rest_all[MAX_ENGINES];
    for (int i = 0; i < nengines; i++) {
        run_cmd('b', i, i + 1, base_alone);
        run_cmd('r', i, i + 1, rest_alone);
    }
    run_cmd('b', 0, nengines, base_all);
    run_cmd('r', 0, nengines, rest_all);
    double gb = (double)s.total / 1e9;
    printf("  engine GPU | contiguous alone | restore alone (ratio)  | contiguous together | "
           "restore together (ratio)   [GB/s, best / median]\n");
    double sum_c = 0, sum_r = 0;
    for (int i = 0; i < nengines; i++) {
        printf("  %6d %3d | %6.2f / %6.2f  | %6.2f / %6.2f (%.3fx) | %6.2f / %6.2f     | "
               "%6.2f / %6.2f (%.3fx)\n",
               i, i % gpus, gb / base_alone[i].best_s, gb / base_alone[i].median_s,
               gb / rest_alone[i].best_s, gb / rest_alone[i].median_s,
               base_alone[i].best_s / rest_alone[i].best_s, gb / base_all[i].best_s,
               gb / base_all[i].median_s, gb / rest_all[i].best_s, gb / rest_all[i].median_s,
               base_all[i].median_s / rest_all[i].median_s);
        sum_c += gb / base_all[i].median_s;
        sum_r += gb / rest_all[i].median_s;
    }
    printf("  together, sum of medians: contiguous %.2f GB/s, restore %.2f GB/s (%.3fx)\n", sum_c,
           sum_r, sum_r / sum_c);
    fflush(stdout);
    stop_all();
    char cmdline[300];
    snprintf(cmdline, sizeof(cmdline), "rm -rf %s", s.sock_dir);
    if (system(cmdline) != 0)
        return 1;
    return 0;
}
