/*
 * bench_lookup_client - the scheduler's lookup of 1,000 blocks on every rank.
 *
 * Two worker processes (embedded runtimes, ranks 0 and 1) each store 1,000
 * small objects under their own keys and serve lookups on their sockets
 * (umbp_lookup_serve); this process, which owns no pool, asks both at once
 * with umbp_lookup_client_query (2 rows of 1,000 keys: one round trip per
 * rank).  Baseline from the same run: umbp_lookup of 1,000 keys in a
 * runtime of this process (what a scheduler sharing the worker's process
 * pays, no socket).  Target (design brief): one round trip per rank per
 * batch; the lookup of 1,000 keys <= 200 us standalone round trip.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "umbp/lookup.h"

#define NKEYS 1000
#define NS "0123456789abcdef0123456789abcdef"

static char dir[64];

static umbp_runtime_t *stored_runtime(uint64_t round)
{
    umbp_runtime_t *rt = bench_runtime("{\"capacity_bytes\":\"64MiB\"}");
    static uint8_t payload[256];
    bench_fill(payload, sizeof(payload), round);
    umbp_range_t r = {payload, sizeof(payload), 0};
    static umbp_put_item_t items[NKEYS];
    for (size_t i = 0; i < NKEYS; i++)
        items[i] = (umbp_put_item_t){bench_key(round, i), sizeof(payload), &r, 1};
    umbp_op_t *op;
    if (umbp_put(rt, items, NKEYS, &op) < 0)
        exit(1);
    bench_wait_ok(op, "put");
    return rt;
}

static int quit_pipe[2];

static pid_t worker(uint32_t rank, int ready)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    umbp_runtime_t *rt = stored_runtime(10 + rank);
    if (umbp_lookup_serve(rt, dir, NS, "", 0, rank) < 0) {
        fprintf(stderr, "serve: %s\n", umbp_last_error());
        _exit(1);
    }
    char c = 1;
    if (write(ready, &c, 1) != 1)
        _exit(1);
    close(quit_pipe[1]);
    while (read(quit_pipe[0], &c, 1) > 0) /* until the parent closes it */
        ;
    umbp_runtime_destroy(rt); /* removes its socket */
    _exit(0);
}

static void summarize(double *t, int n, double *median, double *p99)
{
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    *median = t[n / 2] * 1e6;
    *p99 = t[(size_t)n * 99 / 100] * 1e6;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    snprintf(dir, sizeof(dir), "/tmp/umbp-blc-%d", (int)getpid());
    int p[2];
    if (pipe(p) < 0 || pipe(quit_pipe) < 0)
        return 1;
    pid_t w[2];
    for (uint32_t r = 0; r < 2; r++)
        w[r] = worker(r, p[1]);
    for (int r = 0; r < 2; r++) {
        char c;
        if (read(p[0], &c, 1) != 1) {
            fprintf(stderr, "a worker failed to start\n");
            return 1;
        }
    }
    umbp_lookup_client_t *cl;
    char opts[256];
    snprintf(opts, sizeof(opts),
             "{\"namespace\":\"%s\",\"num_ranks\":2,\"lookup_dir\":\"%s\",\"lookup_timeout_ms\":5000}",
             NS, dir);
    if (umbp_lookup_client_create(opts, &cl) < 0) {
        fprintf(stderr, "client: %s\n", umbp_last_error());
        return 1;
    }
    static umbp_key_t keys[2 * NKEYS];
    for (size_t i = 0; i < NKEYS; i++) {
        keys[i] = bench_key(10, i);
        keys[NKEYS + i] = bench_key(11, i);
    }
    double *t = malloc(sizeof(double) * (size_t)iters);
    for (int i = 0; i < iters + 50; i++) { /* the first 50 warm up (dial, HELLO) */
        size_t prefix = 0;
        double t0 = bench_now();
        int rc = umbp_lookup_client_query(cl, keys, NKEYS, 2, NULL, NULL, &prefix);
        double dt = bench_now() - t0;
        if (rc != 0 || prefix != NKEYS) {
            fprintf(stderr, "query: %s, prefix %zu\n", umbp_strerror(rc), prefix);
            return 1;
        }
        if (i >= 50)
            t[i - 50] = dt;
    }
    double mc, pc, mb, pb;
    summarize(t, iters, &mc, &pc);
    umbp_runtime_t *rt = stored_runtime(10);
    for (int i = 0; i < iters; i++) {
        size_t prefix = 0;
        double t0 = bench_now();
        int rc = umbp_lookup(rt, keys, NKEYS, NULL, &prefix, 0);
        t[i] = bench_now() - t0;
        if (rc != 0 || prefix != NKEYS)
            return 1;
    }
    summarize(t, iters, &mb, &pb);
    printf("bench_lookup_client: %d queries of 2 ranks x %d keys (one round trip per rank, in "
           "parallel)\n", iters, NKEYS);
    printf("  baseline umbp_lookup, 1000 keys, in process  median %7.1f us  p99 %7.1f us\n", mb, pb);
    printf("  lookup client, 2 ranks x 1000 keys           median %7.1f us  p99 %7.1f us  "
           "(%.2fx baseline)\n", mc, pc, mc / mb);
    umbp_runtime_destroy(rt);
    umbp_lookup_client_destroy(cl);
    close(quit_pipe[1]);
    for (int r = 0; r < 2; r++)
        waitpid(w[r], NULL, 0);
    rmdir(dir);
    return 0;
}
