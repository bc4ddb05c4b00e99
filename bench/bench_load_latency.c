/*
 * bench_load_latency - how long restores take while stores are in flight,
 * and (--mix) how long stores take while restores never stop, each against
 * a baseline from the same run.
 *
 * Default: a 64 KiB get (one engine block of a small model) is timed from
 * umbp_get to completion, `samples` times: first with nothing else in flight
 * (the baseline), then while 1 GiB of puts (2 MiB objects, 8 batches of 64 in
 * flight at once) keeps every copy worker busy.  Gets are copied before puts
 * and a put yields between 512 KiB chunks, so the loaded latency should stay
 * within a chunk's copy time of the idle one.  Prints p50 and p99 of both and
 * their ratio.  Usage: bench_load_latency [samples] [copy_threads]
 *
 * --mix: a sustained mix as an engine under load makes it.  A getter thread
 * keeps MIX_GETS gets of 256 KiB in flight (resubmitting each as it
 * completes); the main thread keeps MIX_PUTS puts of 1 MiB in flight until
 * `samples` have completed.  Three phases in one run: gets alone and puts
 * alone (the baselines), then both at once; prints p50/p99 of the load and
 * the store latency in each.  Under strict priority for gets the stores of
 * the mixed phase waited until the high ring drained (runtime/copy.c keeps
 * them a share); the getter stops on its own after MIX_MAX_GETS gets, so the
 * phase ends either way, and the count of puts that completed while gets
 * still ran is printed.  Usage: bench_load_latency --mix [samples]
 * [copy_threads]
 */
#include <pthread.h>
#include <stdatomic.h>

#include "bench_util.h"

#define SMALL (64u << 10)
#define BULK_OBJ (2u << 20)
#define BULK_BATCH 64
#define BULK_DEPTH 8

static double time_get(umbp_runtime_t *rt, umbp_key_t key, uint8_t *dst)
{
    umbp_range_t rg = {dst, SMALL, 0};
    umbp_get_item_t it = {key, &rg, 1};
    umbp_op_t *op;
    double t0 = bench_now();
    int rc;
    while ((rc = umbp_get(rt, &it, 1, &op)) == -EAGAIN)
        ;
    if (rc < 0) {
        fprintf(stderr, "get: %s\n", umbp_strerror(rc));
        exit(1);
    }
    bench_wait_ok(op, "small get");
    return bench_now() - t0;
}

static void pct(double *v, size_t n, double *p50, double *p99)
{
    qsort(v, n, sizeof(*v), cmp_double);
    *p50 = v[n / 2];
    *p99 = v[(size_t)((double)n * 0.99)];
}


/* ---- --mix --------------------------------------------------------------------- */

#define MIX_GET_OBJ (256u << 10)
#define MIX_PUT_OBJ (1u << 20)
#define MIX_GET_KEYS 64
#define MIX_GETS 256          /* gets in flight (an engine had ~350 ops per client) */
#define MIX_PUTS 16           /* puts in flight */
#define MIX_MAX_GETS 40000    /* the getter stops here on its own */

struct mix {
    umbp_runtime_t *rt;
    uint8_t *dst;             /* MIX_GETS slots of MIX_GET_OBJ */
    atomic_bool stop, stopped;
    double *lat;              /* get latencies, up to cap */
    size_t cap;
    _Atomic size_t n;         /* gets completed */
    _Atomic size_t misses;
};

static umbp_op_t *mix_submit_get(struct mix *m, size_t slot, uint64_t round, umbp_range_t *rg)
{
    *rg = (umbp_range_t){m->dst + slot * MIX_GET_OBJ, MIX_GET_OBJ, 0};
    umbp_get_item_t it = {bench_key(1, round % MIX_GET_KEYS), rg, 1};
    umbp_op_t *op;
    int rc;
    while ((rc = umbp_get(m->rt, &it, 1, &op)) == -EAGAIN)
        ;
    if (rc < 0) {
        fprintf(stderr, "get: %s\n", umbp_strerror(rc));
        exit(1);
    }
    return op;
}

static void *mix_getter(void *arg)
{
    struct mix *m = arg;
    umbp_op_t *ops[MIX_GETS];
    umbp_range_t rg[MIX_GETS];
    double t0[MIX_GETS];
    uint64_t round = 0;
    for (size_t i = 0; i < MIX_GETS; i++, round++) {
        t0[i] = bench_now();
        ops[i] = mix_submit_get(m, i, round, &rg[i]);
    }
    for (size_t r = 0;; r++) {
        size_t slot = r % MIX_GETS;
        if (umbp_op_wait(ops[slot], 60000) != 0) {
            fprintf(stderr, "get did not complete\n");
            exit(1);
        }
        double t = bench_now();
        if (umbp_op_key_status(ops[slot], 0) != 0)
            atomic_fetch_add(&m->misses, 1);
        umbp_op_release(ops[slot]);
        size_t n = atomic_fetch_add(&m->n, 1);
        if (n < m->cap)
            m->lat[n] = t - t0[slot];
        if (atomic_load(&m->stop) || round >= MIX_MAX_GETS) {
            atomic_store(&m->stopped, true);
            for (size_t k = 1; k < MIX_GETS; k++) { /* the rest in flight */
                umbp_op_wait(ops[(r + k) % MIX_GETS], 60000);
                umbp_op_release(ops[(r + k) % MIX_GETS]);
            }
            return NULL;
        }
        t0[slot] = bench_now();
        ops[slot] = mix_submit_get(m, slot, round++, &rg[slot]);
    }
}

/* Puts `samples` objects, MIX_PUTS in flight; latencies into lat.  Counts
 * those that completed while the getter (if any) still ran. */
static size_t mix_puts(umbp_runtime_t *rt, const uint8_t *src, size_t samples, uint64_t round,
                       double *lat, struct mix *getter)
{
    umbp_op_t *ops[MIX_PUTS];
    umbp_range_t rg[MIX_PUTS];
    double t0[MIX_PUTS];
    size_t submitted = 0, done = 0, while_gets = 0;
    for (; submitted < MIX_PUTS && submitted < samples; submitted++) {
        size_t s = submitted;
        rg[s] = (umbp_range_t){(void *)src, MIX_PUT_OBJ, 0};
        umbp_put_item_t it = {bench_key(round, submitted), MIX_PUT_OBJ, &rg[s], 1};
        t0[s] = bench_now();
        while (umbp_put(rt, &it, 1, &ops[s]) == -EAGAIN)
            ;
    }
    while (done < samples) {
        size_t s = done % MIX_PUTS;
        bench_wait_ok(ops[s], "put");
        lat[done++] = bench_now() - t0[s];
        if (getter && !atomic_load(&getter->stopped))
            while_gets++;
        if (submitted < samples) {
            rg[s] = (umbp_range_t){(void *)src, MIX_PUT_OBJ, 0};
            umbp_put_item_t it = {bench_key(round, submitted++), MIX_PUT_OBJ, &rg[s], 1};
            t0[s] = bench_now();
            while (umbp_put(rt, &it, 1, &ops[s]) == -EAGAIN)
                ;
        }
    }
    return while_gets;
}

static void mix_store_gets(umbp_runtime_t *rt, const uint8_t *src)
{
    for (size_t i = 0; i < MIX_GET_KEYS; i++) {
        umbp_range_t rg = {(void *)src, MIX_GET_OBJ, 0};
        umbp_put_item_t it = {bench_key(1, i), MIX_GET_OBJ, &rg, 1};
        umbp_op_t *op;
        if (umbp_put(rt, &it, 1, &op) < 0)
            exit(1);
        bench_wait_ok(op, "put of a get object");
    }
}

static void mix_getter_start(struct mix *m, pthread_t *t)
{
    atomic_store(&m->stop, false);
    atomic_store(&m->stopped, false);
    atomic_store(&m->n, 0);
    if (pthread_create(t, NULL, mix_getter, m) != 0)
        exit(1);
    while (atomic_load(&m->n) < 2 * MIX_GETS) /* steady state */
        ;
    atomic_store(&m->n, 0);
}

static void print_pct(const char *what, double *v, size_t n)
{
    double p50, p99;
    pct(v, n, &p50, &p99);
    printf("  %-34s p50 %9.1f us  p99 %9.1f us  (%zu)\n", what, p50 * 1e6, p99 * 1e6, n);
}

static int mix_main(size_t samples, int threads)
{
    char cfg[256];
    snprintf(cfg, sizeof(cfg),
             "{\"capacity_bytes\": \"3GiB\", \"copy_threads\": %d, \"max_inflight_ops\": 1024, "
             "\"timeout_ms\": 60000, \"dram_prefault\": true}", threads);
    umbp_runtime_t *rt = bench_runtime(cfg);
    uint8_t *src = malloc(MIX_PUT_OBJ);
    bench_fill(src, MIX_PUT_OBJ, 3);
    /* warm-up: the puts' first pass over the pool pays its page faults (and
     * would make the baseline look slow); every measured pass reuses it */
    double *warm = calloc(samples, sizeof(double));
    mix_puts(rt, src, samples, 4, warm, NULL);
    free(warm);
    umbp_clear(rt);
    mix_store_gets(rt, src);
    struct mix m = {.rt = rt, .dst = malloc((size_t)MIX_GETS * MIX_GET_OBJ), .cap = 1u << 20};
    m.lat = calloc(m.cap, sizeof(double));
    double *put_alone = calloc(samples, sizeof(double)), *put_mixed = calloc(samples, sizeof(double));

    /* 1. gets alone */
    pthread_t t;
    mix_getter_start(&m, &t);
    while (atomic_load(&m.n) < 20 * MIX_GETS)
        ;
    atomic_store(&m.stop, true);
    pthread_join(t, NULL);
    size_t ng_alone = atomic_load(&m.n) < m.cap ? atomic_load(&m.n) : m.cap;
    double *get_alone = malloc(ng_alone * sizeof(double));
    memcpy(get_alone, m.lat, ng_alone * sizeof(double));

    /* 2. puts alone */
    mix_puts(rt, src, samples, 2, put_alone, NULL);
    umbp_clear(rt);
    mix_store_gets(rt, src);

    /* 3. both */
    mix_getter_start(&m, &t);
    size_t while_gets = mix_puts(rt, src, samples, 3, put_mixed, &m);
    atomic_store(&m.stop, true);
    pthread_join(t, NULL);
    size_t ng_mixed = atomic_load(&m.n) < m.cap ? atomic_load(&m.n) : m.cap;

    printf("mix: %d gets of 256 KiB and %d puts of 1 MiB in flight, %d copy threads\n",
           MIX_GETS, MIX_PUTS, threads);
    print_pct("load, gets alone (baseline):", get_alone, ng_alone);
    print_pct("load, with puts:", m.lat, ng_mixed);
    print_pct("store, puts alone (baseline):", put_alone, samples);
    print_pct("store, with gets:", put_mixed, samples);
    printf("  puts completed while gets ran:    %zu of %zu (getter stops after %d gets)\n",
           while_gets, samples, MIX_MAX_GETS);
    if (atomic_load(&m.misses))
        printf("  get misses: %zu\n", atomic_load(&m.misses));
    umbp_runtime_destroy(rt);
    free(src), free(m.dst), free(m.lat), free(put_alone), free(put_mixed), free(get_alone);
    return 0;
}

int main(int argc, char **argv)
{
    bool mix = argc > 1 && strcmp(argv[1], "--mix") == 0;
    if (mix)
        argc--, argv++;
    size_t samples = argc > 1 ? strtoul(argv[1], NULL, 10) : 400;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    if (samples < 10)
        samples = 10;
    if (mix)
        return mix_main(samples, threads);
    char cfg[256];
    snprintf(cfg, sizeof(cfg),
             "{\"capacity_bytes\": \"3GiB\", \"copy_threads\": %d, \"max_inflight_ops\": 64, "
             "\"put_wait_ms\": 60000, \"timeout_ms\": 60000, \"dram_prefault\": true}", threads);
    umbp_runtime_t *rt = bench_runtime(cfg);
    uint8_t *small = malloc(SMALL), *dst = malloc(SMALL);
    bench_fill(small, SMALL, 1);
    umbp_key_t skey = bench_key(0, 0);
    umbp_range_t srg = {small, SMALL, 0};
    umbp_put_item_t spi = {skey, SMALL, &srg, 1};
    umbp_op_t *op;
    if (umbp_put(rt, &spi, 1, &op) < 0)
        return 1;
    bench_wait_ok(op, "small put");

    size_t nbulk = (1ull << 30) / BULK_OBJ;
    uint8_t *bulk = malloc((size_t)BULK_OBJ * nbulk);
    bench_fill(bulk, (size_t)BULK_OBJ * nbulk, 2);
    umbp_range_t *br = calloc(nbulk, sizeof(*br));
    umbp_put_item_t *bi = calloc(nbulk, sizeof(*bi));

    double *idle = calloc(samples, sizeof(double)), *busy = calloc(samples, sizeof(double));
    for (size_t i = 0; i < samples; i++)
        idle[i] = time_get(rt, skey, dst);

    size_t got = 0;
    for (uint64_t round = 1; got < samples; round++) {
        umbp_op_t *ring[BULK_DEPTH];
        size_t nring = 0;
        for (size_t i0 = 0; i0 < nbulk && nring < BULK_DEPTH; i0 += BULK_BATCH) {
            size_t n = nbulk - i0 < BULK_BATCH ? nbulk - i0 : BULK_BATCH;
            for (size_t i = i0; i < i0 + n; i++) {
                br[i] = (umbp_range_t){bulk + i * BULK_OBJ, BULK_OBJ, 0};
                bi[i] = (umbp_put_item_t){bench_key(round, i), BULK_OBJ, &br[i], 1};
            }
            if (umbp_put(rt, &bi[i0], n, &ring[nring]) == 0)
                nring++;
        }
        /* sample while the bulk puts are being copied */
        for (size_t k = 0; k < samples / 8 + 1 && got < samples; k++)
            busy[got++] = time_get(rt, skey, dst);
        for (size_t r = 0; r < nring; r++) {
            umbp_op_wait(ring[r], 60000);
            umbp_op_release(ring[r]);
        }
        umbp_clear(rt);
        spi.key = skey;
        if (umbp_put(rt, &spi, 1, &op) == 0)
            bench_wait_ok(op, "small put");
    }
    if (memcmp(dst, small, SMALL) != 0) {
        fprintf(stderr, "restored bytes differ\n");
        return 1;
    }
    double i50, i99, b50, b99;
    pct(idle, samples, &i50, &i99);
    pct(busy, samples, &b50, &b99);
    printf("64 KiB get, %d copy threads, %zu samples each\n", threads, samples);
    printf("  idle (baseline):        p50 %8.1f us  p99 %8.1f us\n", i50 * 1e6, i99 * 1e6);
    printf("  under 1 GiB of puts:    p50 %8.1f us  p99 %8.1f us\n", b50 * 1e6, b99 * 1e6);
    printf("  ratio loaded/idle:      p50 %6.2fx    p99 %6.2fx\n", b50 / i50, b99 / i99);
    umbp_runtime_destroy(rt);
    free(small), free(dst), free(bulk), free(br), free(bi), free(idle), free(busy);
    return 0;
}
