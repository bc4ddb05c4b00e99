/*
 * test_par - the caller's parallel-for (runtime/par.c) and the key
 * derivation that uses it: every index is run exactly once per job, jobs
 * from several threads at once and back to back never mix, and a forked
 * child (which has no helper threads) still derives every key.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "par.h"
#include "util.h"
#include "umbp/keys.h"

/* Two helpers even on a small machine (the default there is none), so the
 * parallel path is what runs; each test is its own process. */
static void want_helpers(void) { setenv("UMBP_PAR_THREADS", "2", 1); }

struct count_job {
    _Atomic uint32_t *hits;
    uint32_t tag; /* written into seen[] so a range of another job shows */
    uint32_t *seen;
};

static void count_range(void *arg, size_t lo, size_t hi)
{
    struct count_job *j = arg;
    for (size_t i = lo; i < hi; i++) {
        atomic_fetch_add(&j->hits[i], 1);
        j->seen[i] = j->tag;
    }
}

static void run_count(size_t n, size_t chunk, uint32_t tag)
{
    _Atomic uint32_t *hits = calloc(n ? n : 1, sizeof(*hits));
    uint32_t *seen = calloc(n ? n : 1, sizeof(*seen));
    struct count_job j = {hits, tag, seen};
    par_for(n, chunk, count_range, &j);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(atomic_load(&hits[i]), 1, "n %zu chunk %zu: index %zu ran %u times", n, chunk,
                     i, atomic_load(&hits[i]));
        cr_assert_eq(seen[i], tag, "index %zu written by another job", i);
    }
    free(hits);
    free(seen);
}

Test(par, every_index_exactly_once, .init = want_helpers)
{
    cr_assert_eq(par_helpers(), 2);
    static const size_t sizes[] = {0, 1, 31, 32, 33, 64, 100, 511, 512, 513, 4097};
    static const size_t chunks[] = {0, 1, 7, 32, 1000};
    uint32_t tag = 1;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
        for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++)
            run_count(sizes[s], chunks[c], tag++);
    /* back to back: the helpers must not take chunks of a finished job */
    for (int r = 0; r < 2000; r++)
        run_count(257, 8, 100000u + (uint32_t)r);
}

static void *count_thread(void *arg)
{
    uint32_t base = (uint32_t)(uintptr_t)arg * 1000000u;
    for (uint32_t r = 0; r < 300; r++)
        run_count(300 + r % 7, 16, base + r);
    return NULL;
}

Test(par, concurrent_callers, .init = want_helpers)
{
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, count_thread, (void *)(i + 1)), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
}

/* 1,000 keys from parallel derivation equal the keys derived one at a time,
 * into a poisoned output. */
static int derive_check(void)
{
    enum { N = 1000, HL = 32 };
    umbp_ns_t ns;
    if (umbp_ns_from_string("test-par", &ns) < 0)
        return 1;
    uint8_t *h = malloc(N * HL);
    umbp_key_t *batch = malloc(N * sizeof(*batch)), one;
    for (int i = 0; i < N * HL; i++)
        h[i] = (uint8_t)(i * 131 + 7);
    memset(batch, 0xA5, N * sizeof(*batch));
    umbp_rank_id_t r = {3, 1, 0, 0};
    int bad = umbp_keys_derive(&ns, &r, 2, h, HL, N, batch) != 0;
    for (int i = 0; i < N && !bad; i++)
        bad = umbp_keys_derive(&ns, &r, 2, h + i * HL, HL, 1, &one) != 0 ||
              memcmp(one.bytes, batch[i].bytes, UMBP_KEY_SIZE) != 0;
    free(h);
    free(batch);
    return bad;
}

static void *derive_thread(void *arg)
{
    (void)arg;
    for (int r = 0; r < 20; r++)
        if (derive_check())
            return (void *)1;
    return NULL;
}

Test(par, parallel_derivation_equals_serial, .init = want_helpers)
{
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, derive_thread, NULL), 0);
    for (int i = 0; i < 3; i++) {
        void *rv;
        pthread_join(t[i], &rv);
        cr_assert_null(rv, "thread %d derived a wrong key", i);
    }
}

Test(par, forked_child_derives_without_the_parents_helpers, .init = want_helpers)
{
    cr_assert_eq(derive_check(), 0); /* the parent's pool is running */
    cr_assert_eq(par_helpers(), 2);
    for (int k = 0; k < 3; k++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0)
            _exit(derive_check() == 0 && derive_check() == 0 ? 0 : 3);
        int st;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %d", k, st);
    }
    cr_assert_eq(derive_check(), 0);
}

/* A bad UMBP_PAR_THREADS is reported (a warning naming it) and the default
 * kept: none below 4 CPUs, else one fewer than the CPUs, at most 3. */
static void bad_helpers(void) { setenv("UMBP_PAR_THREADS", "9", 1); }

Test(par, bad_variable_keeps_the_default, .init = bad_helpers)
{
    long cpus = umbp_usable_cpus();
    int want = cpus >= 4 ? (int)(cpus - 1 > 3 ? 3 : cpus - 1) : 0;
    cr_assert_eq(par_helpers(), want);
    run_count(1000, 32, 42); /* and jobs still run every index once */
}
