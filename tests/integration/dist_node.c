/*
 * umbp-dist-node - one umbp runtime in a process of its own, driven line by
 * line over stdin, for the distributed-mode tests (test_distributed,
 * tests/netns/test_distributed_netns.sh, scripts/two_hosts.sh).  It uses
 * libumbp only through the public API (umbp/umbp.h, umbp/gpu.h).
 *
 *   umbp-dist-node '<json config>'
 *
 * After umbp_runtime_create it prints `ready`, or `error <rc> <message>` and
 * exits 2.  Then one command per line, exactly one answer line each
 * (flushed; only answers go to stdout: whatever the libraries print there
 * goes to stderr):
 *
 *   put <seed> <count> <size>     ok <stored>             | err <rc> <msg>
 *   get <seed> <count> <size>     ok <hit> <miss> <wrong> dirty=<n> quar=<n> timeout=<n>
 *                                   nattempt=<n> reset=<n> other=<n>
 *   aget <seed> <count> <size>    ok submitted            (a get left in flight)
 *   await                         the answer of that get, as `get` gives it
 *   lookup <seed> <count>         ok <present> <prefix> <rc>
 *   kvlookup <seed> <count>       the same for kv keys (kvput's)
 *   kvput <seed> <nblocks>        ok <stored>
 *   kvget <seed> <nblocks>        ok <hit> <miss> <wrong> ... (as get)
 *   stats                         ok <name>=<value> ...
 *   quit                          ok bye (then the runtime is destroyed)
 *
 * Key i of seed s is 32 bytes of a splitmix64 stream of (s, i); its object's
 * bytes come from a xorshift stream of (s, i, size), so any process computes
 * the expected bytes of any key.  kv keys live in another key space than
 * put keys.  Gets land in buffers poisoned with 0xA5 and are compared byte
 * for byte:
 *   hit    status 0 and every byte right;
 *   miss   status not 0;
 *   wrong  status 0 with a byte wrong, or a "clean" miss (-ENOENT,
 *          quarantined, not attempted) whose buffer is not all poison;
 *   dirty  a miss that may leave undefined bytes by the API (timeout,
 *          connection reset, stale, I/O error) whose buffer was written:
 *          allowed, counted so tests can see it;
 *   quar / timeout / nattempt / reset / other: misses by status (quarantined,
 *          UMBP_E_TIMEOUT, UMBP_E_NOT_ATTEMPTED, -ECONNRESET, any but -ENOENT).
 * Every wait is bounded (umbp_op_wait with the runtime's timeout plus a
 * margin); an op still open past it is answered `err -4097 op still in
 * flight` and the process exits 3 (a hang is a failure, never a wait).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist_keys.h"
#include "umbp/gpu.h"
#include "umbp/umbp.h"

#define POISON 0xA5
#define MAX_COUNT 100000
#define MAX_SIZE (64ull << 20)
#define MAX_TOTAL (1ull << 30)  /* count * size of one command */
#define BATCH 256               /* keys per op */
#define WAIT_MS 120000          /* bound on one op: far past any timeout_ms the tests use */

/* KV cache: L layers of (2, NB, BS, H, D) bf16, as a FlashAttention cache. */
#define KV_L 4
#define KV_NB 256
#define KV_BS 16
#define KV_H 2
#define KV_D 64
#define KV_ESZ 2
#define KV_CHUNK ((size_t)KV_BS * KV_H * KV_D * KV_ESZ)
#define KV_LAYER ((size_t)2 * KV_NB * KV_CHUNK)

static umbp_runtime_t *rt;
static FILE *ans; /* the answers: the original stdout (fd 1 is stderr: UCX logs to stdout) */

/* ---- keys and bytes ------------------------------------------------------------ */

/* keys: dist_key_of (dist_keys.h), shared with the tests */

static void fill(uint8_t *p, size_t n, uint64_t space, uint64_t seed, uint64_t i)
{
    uint64_t x = dist_splitmix64(dist_splitmix64(seed * 31 + space) ^ (i * 0x9e3779b97f4a7c15ull)) | 1;
    size_t o = 0;
    for (; o + 8 <= n; o += 8) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        uint64_t v = x * 0x2545f4914f6cdd1dull;
        memcpy(p + o, &v, 8);
    }
    if (o < n) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        uint64_t v = x * 0x2545f4914f6cdd1dull;
        memcpy(p + o, &v, n - o);
    }
}

static bool all_poison(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != POISON)
            return false;
    return true;
}

/* ---- answers --------------------------------------------------------------------- */

static void answer(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void answer(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(ans, fmt, ap);
    va_end(ap);
    fputc('\n', ans);
    fflush(ans);
}

static void answer_err(int rc, const char *what)
{
    const char *le = umbp_last_error();
    answer("err %d %s: %s%s%s", rc, what, umbp_strerror(rc), le && *le ? "; " : "",
           le && *le ? le : "");
}

/* Waits for op within the bound; exits 3 if it is still open (a hang). */
static void wait_bounded(umbp_op_t *op)
{
    if (umbp_op_wait(op, WAIT_MS) != 0) {
        answer("err %d op still in flight after %d ms", UMBP_E_INPROGRESS, WAIT_MS);
        _exit(3);
    }
}

/* ---- tallies of gets ------------------------------------------------------------- */

struct tally {
    size_t hit, miss, wrong, dirty, quar, timeout, nattempt, reset, other;
};

static void tally_key(struct tally *t, int st, const uint8_t *got, const uint8_t *want,
                      size_t n)
{
    if (st == 0) {
        if (memcmp(got, want, n) == 0)
            t->hit++;
        else
            t->wrong++;
        return;
    }
    t->miss++;
    if (st == UMBP_E_QUARANTINED)
        t->quar++;
    else if (st == UMBP_E_TIMEOUT)
        t->timeout++;
    else if (st == UMBP_E_NOT_ATTEMPTED)
        t->nattempt++;
    else if (st == -ECONNRESET)
        t->reset++;
    else if (st != -ENOENT)
        t->other++;
    if (!all_poison(got, n)) {
        /* undefined bytes are allowed only where the API says so */
        bool may_write = st == UMBP_E_TIMEOUT || st == UMBP_E_STALE || st == -ECONNRESET ||
                         st == -EIO || st == -ECANCELED || st == -EPIPE;
        if (may_write)
            t->dirty++;
        else
            t->wrong++;
    }
}

static void answer_tally(const struct tally *t)
{
    answer("ok %zu %zu %zu dirty=%zu quar=%zu timeout=%zu nattempt=%zu reset=%zu other=%zu",
           t->hit, t->miss, t->wrong, t->dirty, t->quar, t->timeout, t->nattempt, t->reset,
           t->other);
}

/* ---- put / get -------------------------------------------------------------------- */

static bool parse_shape(const char *args, uint64_t *seed, uint64_t *count, uint64_t *size)
{
    char extra;
    if (sscanf(args, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %c", seed, count, size, &extra) != 3) {
        answer("err %d usage: <seed> <count> <size>", -EINVAL);
        return false;
    }
    if (*count < 1 || *count > MAX_COUNT || *size < 1 || *size > MAX_SIZE ||
        *count * *size > MAX_TOTAL) {
        answer("err %d count must be 1..%d, size 1..%llu, count*size <= %llu", -EINVAL,
               MAX_COUNT, (unsigned long long)MAX_SIZE, (unsigned long long)MAX_TOTAL);
        return false;
    }
    return true;
}

static void cmd_put(const char *args)
{
    uint64_t seed, count, size;
    if (!parse_shape(args, &seed, &count, &size))
        return;
    uint8_t *buf = malloc(BATCH * size);
    umbp_put_item_t *it = calloc(BATCH, sizeof(*it));
    umbp_range_t *rg = calloc(BATCH, sizeof(*rg));
    if (!buf || !it || !rg) {
        answer("err %d cannot allocate %llu bytes", -ENOMEM, (unsigned long long)(BATCH * size));
        goto out;
    }
    size_t stored = 0;
    for (uint64_t base = 0; base < count; base += BATCH) {
        size_t n = count - base < BATCH ? (size_t)(count - base) : BATCH;
        for (size_t j = 0; j < n; j++) {
            fill(buf + j * size, size, 1, seed, base + j);
            rg[j] = (umbp_range_t){buf + j * size, size, 0};
            it[j] = (umbp_put_item_t){dist_key_of(1, seed, base + j), size, &rg[j], 1};
        }
        umbp_op_t *op;
        int rc = umbp_put(rt, it, n, &op);
        if (rc) {
            answer_err(rc, "umbp_put");
            goto out;
        }
        wait_bounded(op);
        stored += umbp_op_num_ok(op);
        umbp_op_release(op);
    }
    answer("ok %zu", stored);
out:
    free(buf);
    free(it);
    free(rg);
}

/* One get in flight at a time (aget .. await); get = aget + await. */
static struct {
    bool busy;
    uint64_t seed, count, size;
    uint8_t *buf;
    umbp_get_item_t *it;
    umbp_range_t *rg;
    umbp_op_t **ops;
    size_t nops;
    int err;
} pend;

static void pend_free(void)
{
    free(pend.buf);
    free(pend.it);
    free(pend.rg);
    free(pend.ops);
    memset(&pend, 0, sizeof(pend));
}

static bool get_submit(const char *args)
{
    if (pend.busy) {
        answer("err %d a get is already in flight (await it)", -EBUSY);
        return false;
    }
    uint64_t seed, count, size;
    if (!parse_shape(args, &seed, &count, &size))
        return false;
    pend.seed = seed, pend.count = count, pend.size = size;
    pend.buf = malloc(count * size);
    pend.it = calloc(count, sizeof(*pend.it));
    pend.rg = calloc(count, sizeof(*pend.rg));
    pend.ops = calloc((count + BATCH - 1) / BATCH, sizeof(*pend.ops));
    if (!pend.buf || !pend.it || !pend.rg || !pend.ops) {
        answer("err %d cannot allocate %llu bytes", -ENOMEM, (unsigned long long)(count * size));
        pend_free();
        return false;
    }
    memset(pend.buf, POISON, count * size);
    for (uint64_t i = 0; i < count; i++) {
        pend.rg[i] = (umbp_range_t){pend.buf + i * size, size, 0};
        pend.it[i] = (umbp_get_item_t){dist_key_of(1, seed, i), &pend.rg[i], 1};
    }
    for (uint64_t base = 0; base < count; base += BATCH) {
        size_t n = count - base < BATCH ? (size_t)(count - base) : BATCH;
        int rc = umbp_get(rt, pend.it + base, n, &pend.ops[pend.nops]);
        if (rc) {
            /* the ops submitted so far still complete; await reports them */
            pend.err = rc;
            break;
        }
        pend.nops++;
    }
    pend.busy = true;
    return true;
}

static void get_await(void)
{
    if (!pend.busy) {
        answer("err %d no get in flight", -EINVAL);
        return;
    }
    struct tally t = {0};
    uint8_t *want = malloc(pend.size);
    for (size_t o = 0; o < pend.nops; o++) {
        umbp_op_t *op = pend.ops[o];
        wait_bounded(op);
        for (size_t j = 0; j < umbp_op_num_keys(op); j++) {
            uint64_t i = (uint64_t)o * BATCH + j;
            fill(want, pend.size, 1, pend.seed, i);
            tally_key(&t, umbp_op_key_status(op, j), pend.buf + i * pend.size, want, pend.size);
        }
        umbp_op_release(op);
    }
    free(want);
    if (pend.err)
        answer_err(pend.err, "umbp_get");
    else
        answer_tally(&t);
    pend_free();
}

/* space 1: put keys (lookup), 2: kv keys (kvlookup) */
static void cmd_lookup(const char *args, int space)
{
    uint64_t seed, count;
    char extra;
    if (sscanf(args, "%" SCNu64 " %" SCNu64 " %c", &seed, &count, &extra) != 2 || count < 1 ||
        count > MAX_COUNT) {
        answer("err %d usage: %s <seed> <count 1..%d>", -EINVAL,
               space == 2 ? "kvlookup" : "lookup", MAX_COUNT);
        return;
    }
    umbp_key_t *k = malloc(count * sizeof(*k));
    uint8_t *present = calloc(count, 1);
    for (uint64_t i = 0; i < count; i++)
        k[i] = dist_key_of(space, seed, i);
    size_t prefix = 0, n = 0;
    int rc = umbp_lookup(rt, k, count, present, &prefix, 0);
    for (uint64_t i = 0; i < count; i++)
        n += present[i] != 0;
    answer("ok %zu %zu %d", n, prefix, rc);
    free(k);
    free(present);
}

/* ---- the KV path ---------------------------------------------------------------- */

static struct {
    bool registered;
    umbp_kv_handle_t h;
    uint8_t *layer[KV_L];
} kv;

/* The bytes of block b's K (kvi 0) or V (1) chunk of layer l for key i. */
static void kv_expect(uint8_t *p, uint64_t seed, uint64_t i, int l, int kvi)
{
    fill(p, KV_CHUNK, 2, seed * 8 + (uint64_t)(l * 2 + kvi), i);
}

static uint8_t *kv_chunk(int l, int kvi, uint64_t block)
{
    return kv.layer[l] + ((size_t)kvi * KV_NB + block) * KV_CHUNK;
}

static bool kv_setup(void)
{
    if (kv.registered)
        return true;
    umbp_kv_tensor_t t[KV_L];
    for (int l = 0; l < KV_L; l++) {
        kv.layer[l] = aligned_alloc(4096, KV_LAYER);
        if (!kv.layer[l]) {
            answer("err %d cannot allocate the KV cache", -ENOMEM);
            return false;
        }
        memset(&t[l], 0, sizeof(t[l]));
        t[l].base = kv.layer[l];
        t[l].ndim = 5;
        int64_t shape[5] = {2, KV_NB, KV_BS, KV_H, KV_D};
        memcpy(t[l].shape, shape, sizeof(shape));
        umbp_kv_tensor_set_contiguous(&t[l]);
        t[l].elem_size = KV_ESZ;
        t[l].block_dim = 1;
        t[l].kv_dim = 0;
        t[l].layer_dim = -1;
    }
    int rc = umbp_kv_register(rt, t, KV_L, &kv.h);
    if (rc) {
        answer_err(rc, "umbp_kv_register (the config needs \"gpu_backend\":\"host\")");
        return false;
    }
    kv.registered = true;
    return true;
}

static bool kv_args(const char *args, uint64_t *seed, uint64_t *n)
{
    char extra;
    if (sscanf(args, "%" SCNu64 " %" SCNu64 " %c", seed, n, &extra) != 2 || *n < 1 ||
        *n > KV_NB) {
        answer("err %d usage: <seed> <nblocks 1..%d>", -EINVAL, KV_NB);
        return false;
    }
    return kv_setup();
}

static void cmd_kvput(const char *args)
{
    uint64_t seed, n;
    if (!kv_args(args, &seed, &n))
        return;
    umbp_kv_block_t *b = calloc(n, sizeof(*b));
    for (uint64_t i = 0; i < n; i++) {
        for (int l = 0; l < KV_L; l++)
            for (int kvi = 0; kvi < 2; kvi++)
                kv_expect(kv_chunk(l, kvi, i), seed, i, l, kvi);
        b[i] = (umbp_kv_block_t){dist_key_of(2, seed, i), i};
    }
    umbp_op_t *op;
    int rc = umbp_kv_store(rt, kv.h, b, n, NULL, &op);
    if (rc) {
        answer_err(rc, "umbp_kv_store");
    } else {
        wait_bounded(op);
        answer("ok %zu", umbp_op_num_ok(op));
        umbp_op_release(op);
    }
    free(b);
}

static void cmd_kvget(const char *args)
{
    uint64_t seed, n;
    if (!kv_args(args, &seed, &n))
        return;
    for (int l = 0; l < KV_L; l++)
        memset(kv.layer[l], POISON, KV_LAYER);
    /* block i of the load is block n-1-i of the cache: not where it was stored */
    umbp_kv_block_t *b = calloc(n, sizeof(*b));
    for (uint64_t i = 0; i < n; i++)
        b[i] = (umbp_kv_block_t){dist_key_of(2, seed, i), n - 1 - i};
    umbp_op_t *op;
    int rc = umbp_kv_load(rt, kv.h, b, n, NULL, &op);
    if (rc) {
        answer_err(rc, "umbp_kv_load");
        free(b);
        return;
    }
    wait_bounded(op);
    struct tally t = {0};
    uint8_t *got = malloc(2 * KV_L * KV_CHUNK), *want = malloc(2 * KV_L * KV_CHUNK);
    for (uint64_t i = 0; i < n; i++) {
        for (int l = 0; l < KV_L; l++)
            for (int kvi = 0; kvi < 2; kvi++) {
                size_t o = (size_t)(l * 2 + kvi) * KV_CHUNK;
                memcpy(got + o, kv_chunk(l, kvi, n - 1 - i), KV_CHUNK);
                kv_expect(want + o, seed, i, l, kvi);
            }
        tally_key(&t, umbp_op_key_status(op, i), got, want, 2 * KV_L * KV_CHUNK);
    }
    umbp_op_release(op);
    answer_tally(&t);
    free(got);
    free(want);
    free(b);
}

static void cmd_stats(void)
{
    umbp_stats_t s;
    int rc = umbp_get_stats(rt, &s);
    if (rc) {
        answer_err(rc, "umbp_get_stats");
        return;
    }
#define F(x) (unsigned long long)s.x
    answer("ok capacity_bytes=%llu used_bytes=%llu num_objects=%llu num_pending=%llu "
           "num_leased=%llu puts_ok=%llu puts_existing=%llu puts_failed=%llu gets_ok=%llu "
           "gets_miss=%llu gets_failed=%llu bytes_written=%llu bytes_read=%llu lookups=%llu "
           "lookup_keys=%llu lookup_hits=%llu evictions=%llu evicted_bytes=%llu "
           "leases_expired=%llu puts_waited_for_space=%llu ops_timed_out=%llu "
           "mailbox_full=%llu events_dropped=%llu",
           F(capacity_bytes), F(used_bytes), F(num_objects), F(num_pending), F(num_leased),
           F(puts_ok), F(puts_existing), F(puts_failed), F(gets_ok), F(gets_miss),
           F(gets_failed), F(bytes_written), F(bytes_read), F(lookups), F(lookup_keys),
           F(lookup_hits), F(evictions), F(evicted_bytes), F(leases_expired),
           F(puts_waited_for_space), F(ops_timed_out), F(mailbox_full), F(events_dropped));
#undef F
}

/* ---- main ------------------------------------------------------------------------- */

static const char *arg_of(const char *line, const char *cmd)
{
    size_t n = strlen(cmd);
    if (strncmp(line, cmd, n) != 0 || (line[n] != ' ' && line[n] != 0))
        return NULL;
    return line + n;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: umbp-dist-node '<json config>'\n"
                        "  then one command per stdin line: put|get|aget <seed> <count> <size>,"
                        " await, lookup|kvlookup <seed> <count>,\n"
                        "  kvput|kvget <seed> <nblocks>, stats, quit\n");
        return 2;
    }
    /* Libraries print to stdout (UCX's log lines do, by default): answers go
     * to a private copy of the original stdout, and fd 1 becomes stderr, so
     * nothing but answers reaches the reader. */
    fflush(stdout);
    int afd = dup(1);
    if (afd < 0 || dup2(2, 1) < 0 || !(ans = fdopen(afd, "w"))) {
        perror("umbp-dist-node: stdout");
        return 2;
    }
    int rc = umbp_runtime_create(argv[1], &rt);
    if (rc) {
        answer("error %d %s", rc, umbp_last_error());
        return 2;
    }
    answer("ready");
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        const char *a;
        if ((a = arg_of(line, "put")))
            cmd_put(a);
        else if ((a = arg_of(line, "get"))) {
            if (get_submit(a))
                get_await();
        } else if ((a = arg_of(line, "aget"))) {
            if (get_submit(a))
                answer("ok submitted");
        } else if (arg_of(line, "await"))
            get_await();
        else if ((a = arg_of(line, "lookup")))
            cmd_lookup(a, 1);
        else if ((a = arg_of(line, "kvlookup")))
            cmd_lookup(a, 2);
        else if ((a = arg_of(line, "kvput")))
            cmd_kvput(a);
        else if ((a = arg_of(line, "kvget")))
            cmd_kvget(a);
        else if (arg_of(line, "stats"))
            cmd_stats();
        else if (arg_of(line, "quit")) {
            answer("ok bye");
            break;
        } else
            answer("err %d unknown command '%.40s' (put, get, aget, await, lookup, kvlookup, "
                   "kvput, kvget, stats, quit)", -EINVAL, line);
    }
    free(line);
    if (pend.busy) /* a get left in flight: wait for it so its buffers outlive it */
        for (size_t o = 0; o < pend.nops; o++)
            umbp_op_wait(pend.ops[o], WAIT_MS);
    if (kv.registered)
        umbp_kv_deregister(rt, kv.h);
    umbp_runtime_destroy(rt);
    for (int l = 0; l < KV_L; l++)
        free(kv.layer[l]);
    pend_free();
    return 0;
}
