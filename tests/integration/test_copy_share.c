/*
 * test_copy_share - stores keep a share of the copy workers while restores
 * never stop (runtime/copy.c: after COPY_HIGH_BURST high jobs taken while a
 * low job waits, a worker copies one low chunk).  One copy worker in both.
 *
 * puts_finish_before_a_stalled_get: deterministic.  The worker is held in
 * a get whose destination traps (gate A); meanwhile AHEAD gets, then a get
 * into a second trapped page (gate B), then 8 puts of two chunks each are
 * queued (the test waits until the rings hold them all).  Gate A opens.  The
 * puts must complete while the worker is held at gate B, i.e. before the
 * gets ahead of gate B's are all done: with strict priority (gets always
 * first) the worker reached gate B with every put still queued, and the puts
 * failed with UMBP_E_TIMEOUT at timeout_ms.
 *
 * puts_complete_while_gets_keep_the_high_ring_full: the realistic shape.  A
 * getter thread keeps GETS_IN_FLIGHT gets of 1 MiB in flight, resubmitting
 * each as it completes, and stops on its own after MAX_ROUNDS; puts must
 * complete before it stops.  (Under strict priority they completed only once
 * the high ring happened to drain: in 4 of 5 runs after 1,800-3,100 gets,
 * in 1 after the getter stopped; this test alone is not deterministic.)
 *
 * Threads other than the main one never call Criterion assertions (not
 * thread safe); they count, and the main thread asserts.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "rt.h" /* the copy rings: the deterministic test waits until they hold every job */
#include "test_util.h"
#include "umbp/umbp.h"

#define MiB (1024ull * 1024ull)
#define OBJ (1 * MiB)          /* two copy chunks */
#define GET_KEYS 16
#define GETS_IN_FLIGHT 32
#define PUTS 8
#define MAX_ROUNDS 4000        /* the getter stops here on its own */
#define GET_SPACE 0x6e7ull
#define PUT_SPACE 0x6e8ull

struct share {
    umbp_runtime_t *rt;
    uint8_t *src[GET_KEYS];
    uint8_t *dst[GETS_IN_FLIGHT];
    umbp_range_t rg[GETS_IN_FLIGHT];
    atomic_bool puts_done;           /* main -> getter: stop */
    atomic_bool getter_stopped;      /* getter: gave up at MAX_ROUNDS or failed */
    _Atomic uint64_t gets_done;      /* gets completed with status 0 */
    _Atomic uint64_t get_failures;   /* a submit, wait, status or byte check failed */
};

static int submit_get(struct share *s, int slot, uint64_t round, umbp_op_t **op)
{
    umbp_key_t k = tu_key_id(GET_SPACE, round % GET_KEYS);
    s->rg[slot] = (umbp_range_t){.ptr = s->dst[slot], .len = OBJ, .offset = 0};
    umbp_get_item_t it = {.key = k, .ranges = &s->rg[slot], .num_ranges = 1};
    return umbp_get(s->rt, &it, 1, op);
}

static void *getter(void *arg)
{
    struct share *s = arg;
    umbp_op_t *ops[GETS_IN_FLIGHT] = {0};
    uint64_t key_of_slot[GETS_IN_FLIGHT];
    uint64_t round = 0;
    for (int i = 0; i < GETS_IN_FLIGHT; i++, round++) {
        key_of_slot[i] = round;
        if (submit_get(s, i, round, &ops[i]) != 0)
            goto failed;
    }
    for (uint64_t r = 0; !atomic_load(&s->puts_done); r++) {
        int slot = (int)(r % GETS_IN_FLIGHT);
        if (umbp_op_wait(ops[slot], TU_WAIT_MS) != 0 || umbp_op_key_status(ops[slot], 0) != 0)
            goto failed;
        umbp_op_release(ops[slot]);
        ops[slot] = NULL;
        /* the first and last page only: a whole check would make the getter,
         * not the copy worker, the bottleneck, and the high ring would empty */
        umbp_key_t k = tu_key_id(GET_SPACE, key_of_slot[slot] % GET_KEYS);
        if (tu_check_from_key(&k, 0, s->dst[slot], 4096) != SIZE_MAX ||
            tu_check_from_key(&k, OBJ - 4096, s->dst[slot] + OBJ - 4096, 4096) != SIZE_MAX)
            goto failed;
        atomic_fetch_add(&s->gets_done, 1);
        if (round >= MAX_ROUNDS)
            break; /* stop resubmitting: the ring drains, puts may run */
        key_of_slot[slot] = round;
        if (submit_get(s, slot, round++, &ops[slot]) != 0)
            goto failed;
    }
    atomic_store(&s->getter_stopped, true);
    goto drain;
failed:
    atomic_fetch_add(&s->get_failures, 1);
    atomic_store(&s->getter_stopped, true);
drain:
    for (int i = 0; i < GETS_IN_FLIGHT; i++)
        if (ops[i]) {
            umbp_op_wait(ops[i], TU_WAIT_MS);
            umbp_op_release(ops[i]);
        }
    return NULL;
}

static void put_objects(struct share *s, uint64_t space, int n, uint8_t **bufs)
{
    umbp_op_t *ops[PUTS > GET_KEYS ? PUTS : GET_KEYS];
    umbp_range_t rg[PUTS > GET_KEYS ? PUTS : GET_KEYS];
    for (int i = 0; i < n; i++) {
        umbp_key_t k = tu_key_id(space, (uint64_t)i);
        tu_fill_from_key(&k, 0, bufs[i], OBJ);
        rg[i] = (umbp_range_t){.ptr = bufs[i], .len = OBJ, .offset = 0};
        umbp_put_item_t it = {.key = k, .object_size = OBJ, .ranges = &rg[i], .num_ranges = 1};
        cr_assert_eq(umbp_put(s->rt, &it, 1, &ops[i]), 0, "put %d: %s", i, umbp_last_error());
    }
    for (int i = 0; i < n; i++) {
        cr_assert_eq(umbp_op_wait(ops[i], TU_WAIT_MS), 0, "put %d did not complete", i);
        cr_assert_eq(umbp_op_key_status(ops[i], 0), 0, "put %d: %s", i,
                     umbp_strerror(umbp_op_key_status(ops[i], 0)));
        umbp_op_release(ops[i]);
    }
}

Test(copy_share, puts_complete_while_gets_keep_the_high_ring_full)
{
    struct share s = {0};
    s.rt = tu_create("{\"capacity_bytes\": \"128MiB\", \"copy_threads\": 1}");
    for (int i = 0; i < GET_KEYS; i++)
        cr_assert_not_null(s.src[i] = malloc(OBJ));
    for (int i = 0; i < GETS_IN_FLIGHT; i++)
        cr_assert_not_null(s.dst[i] = malloc(OBJ));
    uint8_t *pbuf[PUTS];
    for (int i = 0; i < PUTS; i++)
        cr_assert_not_null(pbuf[i] = malloc(OBJ));
    put_objects(&s, GET_SPACE, GET_KEYS, s.src);

    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, getter, &s), 0);
    /* steady state: every slot resubmitted at least once */
    while (atomic_load(&s.gets_done) < 2 * GETS_IN_FLIGHT && !atomic_load(&s.getter_stopped))
        tu_sleep_ms(1);
    uint64_t before = atomic_load(&s.gets_done);
    put_objects(&s, PUT_SPACE, PUTS, pbuf);
    bool getter_was_running = !atomic_load(&s.getter_stopped);
    uint64_t during = atomic_load(&s.gets_done) - before;
    atomic_store(&s.puts_done, true);
    pthread_join(t, NULL);

    cr_assert_eq(atomic_load(&s.get_failures), 0, "a get failed or returned wrong bytes");
    cr_assert(getter_was_running,
              "the puts completed only after the getter stopped resubmitting (%llu gets "
              "completed meanwhile, MAX_ROUNDS %d): stores starve behind restores",
              (unsigned long long)during, MAX_ROUNDS);
    cr_log_info("%llu gets completed while %d puts were in flight", (unsigned long long)during,
                PUTS);
    /* the puts stored the right bytes */
    for (int i = 0; i < PUTS; i++) {
        umbp_key_t k = tu_key_id(PUT_SPACE, (uint64_t)i);
        memset(pbuf[i], 0, OBJ);
        umbp_range_t rg = {.ptr = pbuf[i], .len = OBJ, .offset = 0};
        umbp_get_item_t it = {.key = k, .ranges = &rg, .num_ranges = 1};
        umbp_op_t *op;
        cr_assert_eq(umbp_get(s.rt, &it, 1, &op), 0);
        cr_assert_eq(umbp_op_wait(op, TU_WAIT_MS), 0);
        cr_assert_eq(umbp_op_key_status(op, 0), 0);
        umbp_op_release(op);
        cr_assert_eq(tu_check_from_key(&k, 0, pbuf[i], OBJ), SIZE_MAX, "put %d: wrong bytes", i);
    }
    umbp_runtime_destroy(s.rt);
    for (int i = 0; i < GET_KEYS; i++)
        free(s.src[i]);
    for (int i = 0; i < GETS_IN_FLIGHT; i++)
        free(s.dst[i]);
    for (int i = 0; i < PUTS; i++)
        free(pbuf[i]);
}

/* ---- deterministic: two gates ------------------------------------------------- */

/* Two PROT_NONE pages; a copy that writes page i faults, and the SIGSEGV
 * handler (on the copy worker) holds it until gate i opens, then makes that
 * page writable and returns, so the memcpy resumes. */
#define PAGE 4096
static struct {
    uint8_t *mem;
    atomic_int hit[2], open[2];
} gate;

static void gate_handler(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uint8_t *a = si->si_addr;
    if (!gate.mem || a < gate.mem || a >= gate.mem + 2 * PAGE) {
        signal(sig, SIG_DFL); /* a real crash: fault again, unhandled */
        return;
    }
    int i = (int)((a - gate.mem) / PAGE);
    atomic_store(&gate.hit[i], 1);
    while (!atomic_load(&gate.open[i])) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    mprotect(gate.mem + (size_t)i * PAGE, PAGE, PROT_READ | PROT_WRITE);
}

static void gates_arm(void)
{
    void *m = mmap(NULL, 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(m != MAP_FAILED);
    gate.mem = m;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = gate_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGSEGV, &sa, NULL), 0);
}

/* Gets queued ahead of gate B's: more than the PUTS puts' share needs (each
 * put is two chunks, each after at most COPY_HIGH_BURST = 4 gets: 8 puts
 * finish within 4 + 8 * 2 * 4 = 68 gets), with room to spare. */
#define AHEAD 160
#define SMALL (64 * 1024) /* their size: one chunk each */

static umbp_op_t *get_into(umbp_runtime_t *rt, uint64_t id, void *dst, uint64_t len)
{
    umbp_range_t rg = {.ptr = dst, .len = len, .offset = 0};
    umbp_get_item_t it = {.key = tu_key_id(GET_SPACE, id), .ranges = &rg, .num_ranges = 1};
    umbp_op_t *op;
    cr_assert_eq(umbp_get(rt, &it, 1, &op), 0, "%s", umbp_last_error());
    return op;
}

Test(copy_share, puts_finish_before_a_stalled_get)
{
    struct share s = {0};
    /* timeout_ms: how long strict priority took to fail (the puts time out) */
    s.rt = tu_create("{\"capacity_bytes\": \"128MiB\", \"copy_threads\": 1, "
                     "\"timeout_ms\": 5000}");
    for (int i = 0; i < GET_KEYS; i++)
        cr_assert_not_null(s.src[i] = malloc(OBJ));
    put_objects(&s, GET_SPACE, GET_KEYS, s.src);
    uint8_t *small = malloc((size_t)AHEAD * SMALL), *pbuf[PUTS];
    cr_assert_not_null(small);
    for (int i = 0; i < PUTS; i++)
        cr_assert_not_null(pbuf[i] = malloc(OBJ));
    gates_arm();

    umbp_op_t *held = get_into(s.rt, 0, gate.mem, PAGE); /* gate A */
    while (!atomic_load(&gate.hit[0]))
        tu_sleep_ms(1);
    umbp_op_t *ahead[AHEAD];
    for (int i = 0; i < AHEAD; i++)
        ahead[i] = get_into(s.rt, (uint64_t)i % GET_KEYS, small + (size_t)i * SMALL, SMALL);
    umbp_op_t *last = get_into(s.rt, 1, gate.mem + PAGE, PAGE); /* gate B */
    umbp_op_t *puts[PUTS];
    umbp_range_t rg[PUTS];
    for (int i = 0; i < PUTS; i++) {
        umbp_key_t k = tu_key_id(PUT_SPACE, (uint64_t)i);
        tu_fill_from_key(&k, 0, pbuf[i], OBJ);
        rg[i] = (umbp_range_t){.ptr = pbuf[i], .len = OBJ, .offset = 0};
        umbp_put_item_t it = {.key = k, .object_size = OBJ, .ranges = &rg[i], .num_ranges = 1};
        cr_assert_eq(umbp_put(s.rt, &it, 1, &puts[i]), 0, "%s", umbp_last_error());
    }
    /* every job queued behind the held worker (one job per op: each is
     * smaller than two job minimums) */
    struct copy_pool *cp = &((struct umbp_runtime *)s.rt)->copy;
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (ck_ring_size(&cp->ring_hi) != AHEAD + 1 || ck_ring_size(&cp->ring_lo) != PUTS) {
        cr_assert(tu_now_ms() < end, "jobs never queued: high %u low %u",
                  ck_ring_size(&cp->ring_hi), ck_ring_size(&cp->ring_lo));
        tu_sleep_ms(1);
    }
    atomic_store(&gate.open[0], 1);

    /* the puts complete while the worker is held at gate B */
    for (int i = 0; i < PUTS; i++) {
        cr_assert_eq(umbp_op_wait(puts[i], TU_WAIT_MS), 0, "put %d never completed", i);
        int st = umbp_op_key_status(puts[i], 0);
        cr_assert_eq(st, 0, "put %d: %s (stores starved behind %d queued gets)", i,
                     umbp_strerror(st), AHEAD);
    }
    cr_assert_eq(umbp_op_test(last), UMBP_E_INPROGRESS, "gate B's get is still held");
    atomic_store(&gate.open[1], 1);

    cr_assert_eq(umbp_op_wait(held, TU_WAIT_MS), 0);
    cr_assert_eq(umbp_op_wait(last, TU_WAIT_MS), 0);
    cr_assert_eq(umbp_op_key_status(held, 0), 0);
    cr_assert_eq(umbp_op_key_status(last, 0), 0);
    umbp_key_t k0 = tu_key_id(GET_SPACE, 0), k1 = tu_key_id(GET_SPACE, 1);
    cr_assert_eq(tu_check_from_key(&k0, 0, gate.mem, PAGE), SIZE_MAX);
    cr_assert_eq(tu_check_from_key(&k1, 0, gate.mem + PAGE, PAGE), SIZE_MAX);
    for (int i = 0; i < AHEAD; i++) {
        cr_assert_eq(umbp_op_wait(ahead[i], TU_WAIT_MS), 0);
        cr_assert_eq(umbp_op_key_status(ahead[i], 0), 0, "get %d", i);
        umbp_key_t k = tu_key_id(GET_SPACE, (uint64_t)i % GET_KEYS);
        cr_assert_eq(tu_check_from_key(&k, 0, small + (size_t)i * SMALL, SMALL), SIZE_MAX);
        umbp_op_release(ahead[i]);
    }
    umbp_op_release(held);
    umbp_op_release(last);
    for (int i = 0; i < PUTS; i++)
        umbp_op_release(puts[i]);
    umbp_runtime_destroy(s.rt);
    munmap(gate.mem, 2 * PAGE);
    gate.mem = NULL;
    for (int i = 0; i < GET_KEYS; i++)
        free(s.src[i]);
    for (int i = 0; i < PUTS; i++)
        free(pbuf[i]);
    free(small);
}
