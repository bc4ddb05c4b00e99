/*
 * test_util.h - helpers shared by the umbp test suites (header only).
 *
 * Random data comes from a seeded xorshift64* generator, so a failure can be
 * replayed from the seed the test prints.  Destinations are poisoned before
 * every get so a byte the runtime forgot to write is caught.  Content that
 * must be recomputed later (the stress test) is derived from the key alone:
 * byte o of an object is byte (o % 8) of splitmix64(seed(key) + o / 8), so
 * any sub-range can be checked without keeping the object around.
 *
 * Waits use generous bounds (TU_WAIT_MS) only so a hang fails instead of
 * blocking the suite; no test asserts how long anything takes.
 */
#ifndef UMBP_TEST_UTIL_H
#define UMBP_TEST_UTIL_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "umbp/umbp.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define TU_HAVE_LSAN 1
#endif

#define TU_WAIT_MS 60000 /* bound on any single wait: avoids hangs only */
#define TU_POISON 0xA5

/* ---- random numbers ------------------------------------------------------ */

static inline uint64_t tu_splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

struct tu_rng {
    uint64_t s;
};

static inline void tu_rng_seed(struct tu_rng *r, uint64_t seed)
{
    r->s = tu_splitmix64(seed) | 1; /* xorshift state must not be 0 */
}

static inline uint64_t tu_rng_next(struct tu_rng *r)
{
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Uniform-enough value in [0, n); n > 0. */
static inline uint64_t tu_rng_below(struct tu_rng *r, uint64_t n)
{
    return tu_rng_next(r) % n;
}

/* Value in [lo, hi]. */
static inline uint64_t tu_rng_between(struct tu_rng *r, uint64_t lo, uint64_t hi)
{
    return lo + tu_rng_below(r, hi - lo + 1);
}

static inline void tu_fill_random(struct tu_rng *r, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len >= 8) {
        uint64_t v = tu_rng_next(r);
        memcpy(p, &v, 8);
        p += 8;
        len -= 8;
    }
    if (len) {
        uint64_t v = tu_rng_next(r);
        memcpy(p, &v, len);
    }
}

/* A seed from the clock, printed by the caller so a failure can be replayed:
 * UMBP_TEST_SEED=<seed> gives every test of the process that seed instead. */
static inline uint64_t tu_time_seed(void)
{
    const char *env = getenv("UMBP_TEST_SEED");
    if (env && *env) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(env, &end, 0);
        if (errno || *end || *env == '-') {
            fprintf(stderr, "UMBP_TEST_SEED=%s is not a seed (an integer 0 .. 2^64 - 1)\n", env);
            abort();
        }
        return v;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
}

/* ---- keys ----------------------------------------------------------------- */

static inline umbp_key_t tu_key_random(struct tu_rng *r)
{
    umbp_key_t k;
    tu_fill_random(r, k.bytes, sizeof(k.bytes));
    return k;
}

/* Deterministic distinct keys: (space, id) -> key. */
static inline umbp_key_t tu_key_id(uint64_t space, uint64_t id)
{
    umbp_key_t k;
    for (size_t i = 0; i < UMBP_KEY_SIZE / 8; i++) {
        uint64_t v = tu_splitmix64(space * 0x100000001b3ull + id * 4 + i);
        memcpy(&k.bytes[i * 8], &v, 8);
    }
    return k;
}

static inline bool tu_key_eq(const umbp_key_t *a, const umbp_key_t *b)
{
    return memcmp(a->bytes, b->bytes, UMBP_KEY_SIZE) == 0;
}

static inline uint64_t tu_key_seed(const umbp_key_t *k)
{
    uint64_t h = 0x6a09e667f3bcc909ull;
    for (size_t i = 0; i < UMBP_KEY_SIZE / 8; i++) {
        uint64_t v;
        memcpy(&v, &k->bytes[i * 8], 8);
        h = tu_splitmix64(h ^ v);
    }
    return h;
}

/* ---- content derived from the key ---------------------------------------------- */

/* Writes bytes [off, off + len) of key k's object into buf. */
static inline void tu_fill_from_key(const umbp_key_t *k, uint64_t off, void *buf, size_t len)
{
    uint64_t seed = tu_key_seed(k);
    uint8_t *p = buf;
    uint64_t o = off;
    while (len && (o & 7)) {
        *p++ = (uint8_t)(tu_splitmix64(seed + o / 8) >> (8 * (o & 7)));
        o++;
        len--;
    }
    while (len >= 8) {
        uint64_t v = tu_splitmix64(seed + o / 8);
        memcpy(p, &v, 8); /* little endian: byte i is bits 8i..8i+7 */
        p += 8;
        o += 8;
        len -= 8;
    }
    while (len) {
        *p++ = (uint8_t)(tu_splitmix64(seed + o / 8) >> (8 * (o & 7)));
        o++;
        len--;
    }
}

/* Offset inside buf of the first byte that differs from key k's object at
 * [off, off + len), or SIZE_MAX when all match. */
static inline size_t tu_check_from_key(const umbp_key_t *k, uint64_t off, const void *buf,
                                       size_t len)
{
    uint8_t tmp[4096];
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        size_t n = len - done < sizeof(tmp) ? len - done : sizeof(tmp);
        tu_fill_from_key(k, off + done, tmp, n);
        if (memcmp(tmp, p + done, n) != 0) {
            for (size_t i = 0; i < n; i++)
                if (tmp[i] != p[done + i])
                    return done + i;
        }
        done += n;
    }
    return SIZE_MAX;
}

/* ---- poison ------------------------------------------------------------------- */

static inline void tu_poison(void *buf, size_t len) { memset(buf, TU_POISON, len); }

static inline bool tu_is_poisoned(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    for (size_t i = 0; i < len; i++)
        if (p[i] != TU_POISON)
            return false;
    return true;
}

/* First differing offset of two buffers, or SIZE_MAX. */
static inline size_t tu_first_diff(const void *a, const void *b, size_t len)
{
    if (memcmp(a, b, len) == 0)
        return SIZE_MAX;
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < len; i++)
        if (x[i] != y[i])
            return i;
    return SIZE_MAX;
}

/* ---- time ---------------------------------------------------------------------- */

static inline uint64_t tu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void tu_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* ---- files --------------------------------------------------------------------- */

/* A file's text (a process's log, mostly), to search or to print in a
 * failure: its first MiB, in a static buffer the next call overwrites
 * (copy what must outlive it); "" while the file cannot be read (a log not
 * written yet). */
/* the file's bytes from offset from on (the first MiB of them) */
static inline char *tu_slurp_from(const char *path, size_t from)
{
    static char buf[1 << 20];
    FILE *f = fopen(path, "r");
    size_t n = f && fseek(f, (long)from, SEEK_SET) == 0 ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
    return buf;
}

static inline char *tu_slurp(const char *path) { return tu_slurp_from(path, 0); }

/* The part of a spawned process's log path that names this test process:
 * its pid and a nonce drawn once per pid (a Criterion test is a fork of the
 * runner: a tag the runner drew would carry the runner's pid).  A path from
 * the pid alone is taken again when pids wrap (pid_max 32,768 on these
 * machines, and /tmp keeps earlier runs' logs): opened with O_APPEND, the
 * log then starts with another run's lines, and a test counting lines in it
 * fails (clean-clone CI, 2026-12-06: test_distributed's C had asked "node 1"
 * four times, two of them in an earlier run). */
static inline const char *tu_run_tag(void)
{
    static char tag[48];
    static pid_t of;
    if (of != getpid()) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t nonce = tu_splitmix64((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
        of = getpid();
        snprintf(tag, sizeof(tag), "%d.%08llx", (int)of, (unsigned long long)(nonce >> 32));
    }
    return tag;
}

/* ---- a destination that stalls the copy that writes it ------------------------- */

/*
 * The only way to hold a read lease from outside the runtime: make a get's
 * destination inaccessible (PROT_NONE).  The copy worker that writes it
 * faults; the SIGSEGV handler (on that worker) announces the hit and waits
 * until the test releases it, then makes the pages writable and returns, so
 * the memcpy resumes.  While it waits, every key of that get op stays
 * leased.  One trap per process (each Criterion test runs in its own).
 */
struct tu_trap {
    uint8_t *mem;
    size_t len;
    atomic_int hit, release;
};

static struct tu_trap tu_trap_g;

static void tu_trap_handler(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uint8_t *a = si->si_addr;
    if (!tu_trap_g.mem || a < tu_trap_g.mem || a >= tu_trap_g.mem + tu_trap_g.len) {
        signal(sig, SIG_DFL); /* a real crash: fault again, unhandled */
        return;
    }
    atomic_store(&tu_trap_g.hit, 1);
    while (!atomic_load(&tu_trap_g.release)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    mprotect(tu_trap_g.mem, tu_trap_g.len, PROT_READ | PROT_WRITE);
}

/* Traps whole pages [p, p + len) that are already mapped (a put's source,
 * filled beforehand): the first copy that reads or writes them stalls. */
static inline void tu_trap_pages(uint8_t *p, size_t len)
{
    tu_trap_g.mem = p;
    tu_trap_g.len = len;
    atomic_store(&tu_trap_g.hit, 0);
    atomic_store(&tu_trap_g.release, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = tu_trap_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGSEGV, &sa, NULL), 0);
    cr_assert_eq(mprotect(p, len, PROT_NONE), 0);
}

/* Maps len bytes (rounded to pages) that stall the first write; returns them. */
static inline uint8_t *tu_trap_arm(size_t len)
{
    size_t pg = 4096;
    len = (len + pg - 1) / pg * pg;
    void *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(m != MAP_FAILED);
    tu_trap_pages(m, len);
    return m;
}

/* Waits until a copy worker is stalled in the trap. */
static inline void tu_trap_wait_hit(void)
{
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (!atomic_load(&tu_trap_g.hit)) {
        cr_assert(tu_now_ms() < end, "no copy ever reached the trapped pages");
        tu_sleep_ms(1);
    }
}

static inline void tu_trap_release(void) { atomic_store(&tu_trap_g.release, 1); }

static inline void tu_trap_free(void)
{
    tu_trap_release();
    munmap(tu_trap_g.mem, tu_trap_g.len);
    tu_trap_g.mem = NULL;
}

/* ---- stopping another process ------------------------------------------------------ */

/* Whether every thread of pid is stopped ('T' or 't' in /proc/<pid>/task/<tid>/stat;
 * an exited thread not yet reaped, 'Z', runs nothing either), at least one 'T'. */
static inline bool tu_all_threads_stopped(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool all = true, any = false; /* any: a thread in 'T' */
    struct dirent *e;
    while (all && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[384], buf[512];
        snprintf(path, sizeof(path), "%s/%s/stat", dir, e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue; /* the thread exited */
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = 0;
        const char *rp = strrchr(buf, ')'); /* "tid (comm) S ..." */
        char state = rp && rp[1] == ' ' ? rp[2] : '?';
        any = any || state == 'T' || state == 't';
        all = state == 'T' || state == 't' || state == 'Z';
    }
    closedir(d);
    return any && all;
}

/* SIGSTOP, and wait until the process has stopped.  kill() returns once
 * the signal is queued: one of the target's threads must still run to take
 * it and stop the others, and meanwhile another thread (its event loop,
 * woken by a request) may go on serving.  On a loaded 2-vCPU machine that
 * lasted long enough for a stopped owner to answer a fetch.  Bounded
 * (TU_WAIT_MS); any other signal is only sent. */
static inline void tu_kill_wait(pid_t pid, int sig)
{
    cr_assert_eq(kill(pid, sig), 0, "kill(%d, %d): %s", (int)pid, sig, strerror(errno));
    if (sig != SIGSTOP)
        return;
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (!tu_all_threads_stopped(pid)) {
        cr_assert(tu_now_ms() < end, "process %d did not stop within %d ms of SIGSTOP",
                  (int)pid, TU_WAIT_MS);
        tu_sleep_ms(1);
    }
}

/* ---- runtimes ------------------------------------------------------------------- */

/* umbp_runtime_create with a printf-formatted JSON config; 0 or its error. */
static inline int tu_try_create(umbp_runtime_t **rt, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline int tu_try_create(umbp_runtime_t **rt, const char *fmt, ...)
{
    char json[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(json, sizeof(json), fmt, ap);
    va_end(ap);
    return umbp_runtime_create(json, rt);
}

/* Creates a runtime or fails the test with the runtime's message. */
static inline umbp_runtime_t *tu_create(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline umbp_runtime_t *tu_create(const char *fmt, ...)
{
    char json[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(json, sizeof(json), fmt, ap);
    va_end(ap);
    umbp_runtime_t *rt = NULL;
    int rc = umbp_runtime_create(json, &rt);
    cr_assert_eq(rc, 0, "umbp_runtime_create(%s) = %d (%s): %s", json, rc, umbp_strerror(rc),
                 umbp_last_error());
    cr_assert_not_null(rt);
    return rt;
}

/*
 * In the sanitizer build, fails the test if LeakSanitizer finds unreachable
 * blocks now.  Criterion ignores LeakSanitizer's report at process exit, so
 * tests call this themselves (tu_destroy does, after the runtime is gone).
 */
static inline void tu_check_leaks(void)
{
#ifdef TU_HAVE_LSAN
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0,
                 "LeakSanitizer found leaked blocks (report above)");
#endif
}

static inline void tu_destroy(umbp_runtime_t *rt)
{
    umbp_runtime_destroy(rt);
    tu_check_leaks();
}

/* Waits for op to complete or fails the test after TU_WAIT_MS. */
static inline void tu_wait(umbp_op_t *op)
{
    int rc = umbp_op_wait(op, TU_WAIT_MS);
    cr_assert_eq(rc, 0, "operation did not complete within %d ms (rc %d)", TU_WAIT_MS, rc);
    cr_assert_eq(umbp_op_test(op), 0);
}

static inline umbp_stats_t tu_stats(umbp_runtime_t *rt)
{
    umbp_stats_t s;
    memset(&s, 0, sizeof(s));
    /* bounded by lookup_timeout_ms: on a loaded machine, ask again */
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    int rc;
    while ((rc = umbp_get_stats(rt, &s)) == UMBP_E_TIMEOUT && tu_now_ms() < end)
        ;
    cr_assert_eq(rc, 0, "umbp_get_stats = %d (%s)", rc, umbp_strerror(rc));
    return s;
}

/* Polls stats until pred holds or timeout_ms passes (the bound only avoids a
 * hang).  Returns whether pred held; *out gets the last snapshot. */
static inline bool tu_wait_stats(umbp_runtime_t *rt, bool (*pred)(const umbp_stats_t *, void *),
                                 void *arg, unsigned timeout_ms, umbp_stats_t *out)
{
    uint64_t end = tu_now_ms() + timeout_ms;
    for (;;) {
        umbp_stats_t s = tu_stats(rt);
        if (out)
            *out = s;
        if (pred(&s, arg))
            return true;
        if (tu_now_ms() >= end)
            return false;
        tu_sleep_ms(2);
    }
}

/* ---- objects -------------------------------------------------------------------- */

#define TU_MAX_RANGES 16

/* One object to put: its bytes and a tiling of them into ranges. */
struct tu_obj {
    umbp_key_t key;
    uint64_t size;
    uint8_t *data;
    umbp_range_t ranges[TU_MAX_RANGES];
    uint32_t nranges;
};

/* Cuts [0, size) into nranges non-empty contiguous pieces of random length. */
static inline uint32_t tu_tile(struct tu_rng *r, uint8_t *data, uint64_t size, uint32_t nranges,
                               umbp_range_t *out)
{
    if (nranges > size)
        nranges = (uint32_t)size;
    if (nranges == 0)
        nranges = 1;
    uint64_t off = 0;
    for (uint32_t i = 0; i < nranges; i++) {
        uint64_t left = size - off, pieces = nranges - i;
        uint64_t len = pieces == 1 ? left : tu_rng_between(r, 1, left - (pieces - 1));
        out[i] = (umbp_range_t){data + off, len, off};
        off += len;
    }
    return nranges;
}

/* An object of `size` random bytes (or bytes derived from the key when
 * from_key) split into nranges pieces. */
static inline void tu_obj_init(struct tu_obj *o, struct tu_rng *r, umbp_key_t key, uint64_t size,
                               uint32_t nranges, bool from_key)
{
    cr_assert(nranges <= TU_MAX_RANGES);
    o->key = key;
    o->size = size;
    o->data = malloc(size ? size : 1);
    cr_assert_not_null(o->data);
    if (from_key)
        tu_fill_from_key(&key, 0, o->data, size);
    else
        tu_fill_random(r, o->data, size);
    o->nranges = tu_tile(r, o->data, size, nranges, o->ranges);
}

static inline void tu_obj_free(struct tu_obj *o)
{
    free(o->data);
    o->data = NULL;
}

static inline umbp_put_item_t tu_obj_item(const struct tu_obj *o)
{
    return (umbp_put_item_t){o->key, o->size, o->ranges, o->nranges};
}

/* Puts objs[0..n) as one batch and waits; status (if not NULL) gets each
 * key's status.  Returns umbp_put's submit code. */
static inline int tu_put_objs(umbp_runtime_t *rt, const struct tu_obj *objs, size_t n, int *status)
{
    umbp_put_item_t *items = calloc(n, sizeof(*items));
    cr_assert_not_null(items);
    for (size_t i = 0; i < n; i++)
        items[i] = tu_obj_item(&objs[i]);
    umbp_op_t *op = NULL;
    int rc = umbp_put(rt, items, n, &op);
    free(items);
    if (rc != 0)
        return rc;
    tu_wait(op);
    cr_assert_eq(umbp_op_num_keys(op), n);
    for (size_t i = 0; i < n; i++) {
        int s = umbp_op_key_status(op, i);
        if (status)
            status[i] = s;
    }
    umbp_op_release(op);
    return 0;
}

/* Puts and expects every key to be stored (status 0). */
static inline void tu_put_ok(umbp_runtime_t *rt, const struct tu_obj *objs, size_t n)
{
    int *st = calloc(n, sizeof(int));
    cr_assert_not_null(st);
    int rc = tu_put_objs(rt, objs, n, st);
    cr_assert_eq(rc, 0, "umbp_put submit = %d (%s)", rc, umbp_strerror(rc));
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(st[i], 0, "put key %zu: status %d (%s)", i, st[i], umbp_strerror(st[i]));
    free(st);
}

/* Gets the whole object of key into buf (poisoned first); returns the key's
 * status (or the submit error). */
static inline int tu_get_whole(umbp_runtime_t *rt, umbp_key_t key, void *buf, uint64_t size)
{
    tu_poison(buf, size);
    umbp_range_t rg = {buf, size, 0};
    umbp_get_item_t it = {key, &rg, 1};
    umbp_op_t *op = NULL;
    int rc = umbp_get(rt, &it, 1, &op);
    if (rc != 0)
        return rc;
    tu_wait(op);
    rc = umbp_op_key_status(op, 0);
    umbp_op_release(op);
    return rc;
}

/* Expects obj to be readable and byte-exact. */
static inline void tu_expect_obj(umbp_runtime_t *rt, const struct tu_obj *o)
{
    uint8_t *buf = malloc(o->size + 64);
    cr_assert_not_null(buf);
    tu_poison(buf, o->size + 64);
    int rc = tu_get_whole(rt, o->key, buf + 32, o->size);
    cr_assert_eq(rc, 0, "get of a stored object: %d (%s)", rc, umbp_strerror(rc));
    size_t d = tu_first_diff(buf + 32, o->data, o->size);
    cr_assert_eq(d, SIZE_MAX, "restored object differs at byte %zu of %llu", d,
                 (unsigned long long)o->size);
    cr_assert(tu_is_poisoned(buf, 32) && tu_is_poisoned(buf + 32 + o->size, 32),
              "get wrote outside its destination range");
    free(buf);
}

/* Lookup of one key: 1 present, 0 absent (fails the test on an error). */
static inline int tu_present(umbp_runtime_t *rt, umbp_key_t key)
{
    uint8_t p = 0xff;
    size_t prefix = 99;
    int rc = umbp_lookup(rt, &key, 1, &p, &prefix, 0);
    cr_assert_eq(rc, 0, "umbp_lookup = %d (%s)", rc, umbp_strerror(rc));
    cr_assert(p == 0 || p == 1);
    cr_assert_eq(prefix, (size_t)p);
    return p;
}

/* Starts `bin --json json` with stdout and stderr appended to `log` (mode
 * 0600); PR_SET_PDEATHSIG kills it if the test process dies first, so a
 * failed test leaves no server behind.  Returns the child's pid. */
static inline pid_t tu_spawn_server(const char *bin, const char *json, const char *log)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork failed");
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1); /* the parent died before the prctl */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(bin, "umbp-server", "--json", json, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Removes dir, a directory of plain files (one level), and every file in
 * it; nothing where dir is empty or already gone. */
static inline void tu_rmdir_flat(const char *dir)
{
    if (!dir[0])
        return;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[4096 + 256 + 2];
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* Removes a named pool (dram_shm_name) and its journal, namespace-name and
 * owner files from /dev/shm; what is absent is skipped. */
static inline void tu_rm_named_pool(const char *name)
{
    static const char *const suffix[] = {"", ".meta", ".ns", ".owner"};
    for (size_t i = 0; i < sizeof(suffix) / sizeof(suffix[0]); i++) {
        char p[160];
        snprintf(p, sizeof(p), "/dev/shm/%s%s", name, suffix[i]);
        unlink(p);
    }
}

#endif /* UMBP_TEST_UTIL_H */
