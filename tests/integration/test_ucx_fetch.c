/*
 * test_ucx_fetch.c - remote fetch over UCX (net/ucx.c) between two real
 * processes on loopback, UCX_TLS=tcp, UCX_NET_DEVICES=lo.
 *
 * Each test forks an owner: its own libev loop, a UCX node serving a pool of
 * objects whose bytes derive from a per-run seed (tu_fill_from_key), the
 * pool mapped with ucx_mem_map; it hands its worker address over a pipe.
 * The test process is the requester: its own node and loop, destination
 * buffers in one mapped region, poisoned, with poisoned guards between
 * them.  Faults: kill -9 of the owner while it holds a fetch (the owner's
 * lease callback for the "hang" key reports on a pipe and blocks until told
 * to go on), SIGSTOP of the owner with the fetch timing out, then SIGCONT
 * and the owner's late replies (every lease it took released: its send
 * ended) while the requester keeps running, and the reused buffers
 * checked.  Outcomes asserted: statuses and bytes; never durations.
 */
#include <criterion/criterion.h>

#ifndef UMBP_HAVE_UCX
Test(ucx_fetch, skipped)
{
    cr_skip_test("UCX not built: pkg-config found no ucx; run scripts/setup.sh (libucx-dev)");
}
#else

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>

#include "test_util.h"
#include "ucx.h"
#include "ucx_wire.h"

#define MAX_OBJ 512

/* ---- the owner process ----------------------------------------------------- */

struct owner_spec {
    uint64_t space;      /* keys are tu_key_id(space, i) */
    int nobj;
    uint64_t size[MAX_OBJ];
    int hang;            /* index whose lease_take reports and blocks, or -1 */
    const char *secret;  /* the cluster's secret (ucx_node_config.auth), or NULL */
};

struct owner_state {
    const struct owner_spec *spec;
    umbp_key_t key[MAX_OBJ];
    uint8_t *obj[MAX_OBJ];
    int notify_fd, go_fd, rel_fd;
};

static int own_take(void *ctx, const umbp_key_t *key, const void **addr, uint64_t *size,
                    uint64_t *lease)
{
    struct owner_state *o = ctx;
    for (int i = 0; i < o->spec->nobj; i++)
        if (tu_key_eq(key, &o->key[i])) {
            if (i == o->spec->hang) {
                char c = 'H', g;
                (void)!write(o->notify_fd, &c, 1);
                (void)!read(o->go_fd, &g, 1); /* blocks: the owner is "stuck" */
            }
            *addr = o->obj[i];
            *size = o->spec->size[i];
            *lease = (uint64_t)i;
            return 0;
        }
    return -ENOENT;
}

static struct ucx_node *own_node;

/* 'R' per lease released; 'T' once the owner's own bound (serve_timeout_ms)
 * has force-closed a requester's endpoint */
static void own_release(void *ctx, uint64_t lease)
{
    struct owner_state *o = ctx;
    struct ucx_node_stats st;
    ucx_node_stats(own_node, &st);
    char c = st.serve_timeouts ? 'T' : 'R';
    (void)!write(o->rel_fd, &c, 1);
}

static void owner_main(const struct owner_spec *spec, int addr_fd, int notify_fd, int go_fd,
                       int rel_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct owner_state o = { .spec = spec, .notify_fd = notify_fd, .go_fd = go_fd,
                             .rel_fd = rel_fd };
    size_t total = 0;
    for (int i = 0; i < spec->nobj; i++)
        total += (spec->size[i] + 4095) & ~4095ull;
    uint8_t *pool = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pool == MAP_FAILED)
        _exit(2);
    size_t off = 0;
    for (int i = 0; i < spec->nobj; i++) {
        o.key[i] = tu_key_id(spec->space, (uint64_t)i);
        o.obj[i] = pool + off;
        tu_fill_from_key(&o.key[i], 0, o.obj[i], spec->size[i]);
        off += (spec->size[i] + 4095) & ~4095ull;
    }
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    struct ucx_serve_ops ops = { .lease_take = own_take, .lease_release = own_release, .ctx = &o };
    struct net_auth_key key;
    if (spec->secret)
        net_auth_key_from(spec->secret, strlen(spec->secret), &key);
    struct ucx_node_config cfg = { .loop = loop, .name = "owner", .serve = &ops,
                                   .serve_timeout_ms = 2000,
                                   .auth = spec->secret ? &key : NULL };
    struct ucx_node *n;
    if (ucx_node_create(&cfg, &n) || ucx_mem_map(n, pool, total))
        _exit(3);
    own_node = n;
    const void *addr;
    size_t len;
    ucx_node_address(n, &addr, &len);
    uint32_t l32 = (uint32_t)len;
    if (write(addr_fd, &l32, 4) != 4 || write(addr_fd, addr, len) != (ssize_t)len)
        _exit(4);
    close(addr_fd);
    ev_run(loop, 0); /* until killed */
    _exit(0);
}

struct owner {
    pid_t pid;
    int notify_rd, go_wr, rel_rd;
    uint8_t addr[1024];
    size_t addrlen;
};

static bool fd_read_bounded(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t got = 0;
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (got < len && tu_now_ms() < end) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t r = read(fd, p + got, len - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return got == len;
}

/* The owner's worker address, written length first on fd (closed after). */
static void owner_read_address(struct owner *ow, int fd)
{
    uint32_t l32 = 0;
    cr_assert(fd_read_bounded(fd, &l32, 4), "the owner gave no address (exit?)");
    cr_assert(l32 > 0 && l32 <= sizeof(ow->addr));
    cr_assert(fd_read_bounded(fd, ow->addr, l32));
    ow->addrlen = l32;
    close(fd);
}

static void owner_start(struct owner *ow, const struct owner_spec *spec)
{
    int a[2], nt[2], go[2], rl[2];
    cr_assert(pipe(a) == 0 && pipe(nt) == 0 && pipe(go) == 0 && pipe(rl) == 0);
    ow->pid = fork();
    cr_assert(ow->pid >= 0);
    if (ow->pid == 0) {
        close(a[0]);
        close(nt[0]);
        close(go[1]);
        close(rl[0]);
        owner_main(spec, a[1], nt[1], go[0], rl[1]);
    }
    close(a[1]);
    close(nt[1]);
    close(go[0]);
    close(rl[1]);
    ow->notify_rd = nt[0];
    ow->go_wr = go[1];
    ow->rel_rd = rl[0];
    owner_read_address(ow, a[0]);
}

/* the pipes of an owner that is gone (reaped) */
static void owner_close(struct owner *ow)
{
    close(ow->notify_rd);
    close(ow->go_wr);
    close(ow->rel_rd);
}

static void owner_stop(struct owner *ow)
{
    kill(ow->pid, SIGKILL);
    waitpid(ow->pid, NULL, 0);
    owner_close(ow);
}

/* ---- the requester ------------------------------------------------------------ */

struct req {
    struct ev_loop *loop;
    struct ucx_node *node;
    struct ucx_peer *peer;
    uint8_t *pool;
    size_t pool_len;
    ev_timer tick;
};

struct waiter {
    bool done;
    int calls;
};

static void on_done(void *arg, struct ucx_fetch_item *items, uint32_t n)
{
    struct waiter *w = arg;
    w->done = true;
    w->calls++;
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents) {}

static void ucx_env(void)
{
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
}

static void req_init_secret(struct req *r, struct owner *ow, size_t pool_len,
                            const char *secret)
{
    r->loop = ev_loop_new(EVFLAG_AUTO);
    struct net_auth_key key;
    if (secret)
        net_auth_key_from(secret, strlen(secret), &key);
    struct ucx_node_config cfg = { .loop = r->loop, .name = "requester",
                                   .auth = secret ? &key : NULL };
    cr_assert(ucx_node_create(&cfg, &r->node) == 0, "%s", umbp_last_error());
    r->pool_len = pool_len;
    r->pool = mmap(NULL, pool_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(r->pool != MAP_FAILED);
    tu_poison(r->pool, pool_len);
    cr_assert(ucx_mem_map(r->node, r->pool, pool_len) == 0, "%s", umbp_last_error());
    cr_assert(ucx_peer_create(r->node, ow->addr, ow->addrlen, &r->peer) == 0, "%s",
              umbp_last_error());
    /* the loop never sleeps longer than this, so bounded waits end */
    ev_timer_init(&r->tick, on_tick, 0.01, 0.01);
    ev_timer_start(r->loop, &r->tick);
}

static void req_init(struct req *r, struct owner *ow, size_t pool_len)
{
    req_init_secret(r, ow, pool_len, NULL);
}

static void req_fini(struct req *r)
{
    ev_timer_stop(r->loop, &r->tick);
    ucx_node_destroy(r->node);
    munmap(r->pool, r->pool_len);
    ev_loop_destroy(r->loop);
}

static void run_until(struct req *r, bool *flag)
{
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (!*flag && tu_now_ms() < end)
        ev_run(r->loop, EVRUN_ONCE);
}

/* runs the loop until fd is readable; false past TU_WAIT_MS */
static bool run_until_fd(struct req *r, int fd)
{
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (tu_now_ms() < end) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        if (poll(&pfd, 1, 0) == 1)
            return true;
        ev_run(r->loop, EVRUN_ONCE);
    }
    return false;
}

static void run_for(struct req *r, unsigned ms)
{
    uint64_t end = tu_now_ms() + ms;
    while (tu_now_ms() < end)
        ev_run(r->loop, EVRUN_ONCE);
}

/* items[i] fetches object idx[i] into the pool at a 4 KiB-aligned offset
 * with a 4 KiB poisoned guard after each; returns the bytes used */
static size_t lay_out(struct req *r, struct ucx_fetch_item *items, const int *idx, int n,
                      const struct owner_spec *spec, uint64_t slack)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        items[i].key = tu_key_id(spec->space, (uint64_t)idx[i]);
        uint64_t sz = idx[i] < spec->nobj ? spec->size[idx[i]] : 4096;
        items[i].dst = r->pool + off;
        items[i].cap = sz + slack;
        off += ((sz + slack + 4095) & ~4095ull) + 4096;
        cr_assert(off <= r->pool_len);
    }
    return off;
}

static void expect_bytes(const struct ucx_fetch_item *it, const struct owner_spec *spec, int idx)
{
    cr_assert_eq(it->status, 0, "key %d: status %d (%s)", idx, it->status,
                 umbp_strerror(it->status));
    cr_assert_eq(it->size, spec->size[idx], "key %d: size %llu, stored %llu", idx,
                 (unsigned long long)it->size, (unsigned long long)spec->size[idx]);
    size_t bad = tu_check_from_key(&it->key, 0, it->dst, it->size);
    cr_assert_eq(bad, SIZE_MAX, "key %d: byte %zu differs", idx, bad);
    /* nothing past the object: the rest of its slot and the guard */
    uint64_t slot = ((it->cap + 4095) & ~4095ull) + 4096;
    cr_assert(tu_is_poisoned((uint8_t *)it->dst + it->size, slot - it->size),
              "key %d: bytes written past its end", idx);
}

static uint64_t seed_now(void)
{
    uint64_t s = tu_time_seed();
    cr_log_info("seed %llu", (unsigned long long)s);
    return s;
}

/* After the owner was killed: UCX reported the death (no fetch ended by its
 * timeout), then the requester and the owner's pipes are closed. */
static void end_after_owner_died(struct req *r, struct owner *ow)
{
    struct ucx_node_stats st;
    ucx_node_stats(r->node, &st);
    cr_assert_eq(st.timeouts, 0);
    cr_assert_geq(st.peer_errors, 1);
    req_fini(r);
    owner_close(ow);
}

/* ---- tests --------------------------------------------------------------------- */

Test(ucx_fetch, sizes_byte_exact)
{
    ucx_env();
    static struct owner_spec spec;
    spec.space = seed_now();
    spec.nobj = 3;
    spec.size[0] = 4096;
    spec.size[1] = 256 << 10;
    spec.size[2] = 2 << 20;
    spec.hang = -1;
    struct owner ow;
    owner_start(&ow, &spec);
    struct req r;
    req_init(&r, &ow, 8 << 20);
    /* no tick: each ev_run(EVRUN_ONCE) must end by the library's own wake-ups
     * (the batch's done comes in an iteration of its own), else this hangs */
    ev_timer_stop(r.loop, &r.tick);
    /* where tcp is the only transport, net/ucx.c makes objects up to 1 MiB
     * go eager (UCX's own threshold sends 256 KiB by rendezvous over tcp) */
    static const bool eager[3] = { true, true, false };
    for (int k = 0; k < 3; k++) {
        struct ucx_fetch_item it;
        int idx = k;
        tu_poison(r.pool, r.pool_len);
        lay_out(&r, &it, &idx, 1, &spec, 0);
        struct ucx_node_stats before, after;
        ucx_node_stats(r.node, &before);
        struct waiter w = { 0 };
        cr_assert_eq(ucx_fetch(r.peer, &it, 1, 30000, on_done, &w), 0);
        run_until(&r, &w.done);
        cr_assert(w.done && w.calls == 1);
        expect_bytes(&it, &spec, idx);
        ucx_node_stats(r.node, &after);
        cr_assert_eq(after.data_eager - before.data_eager, eager[k] ? 1 : 0,
                     "%llu bytes: want %s", (unsigned long long)spec.size[k],
                     eager[k] ? "eager" : "rendezvous");
        cr_assert_eq(after.data_rndv - before.data_rndv, eager[k] ? 0 : 1,
                     "%llu bytes: want %s", (unsigned long long)spec.size[k],
                     eager[k] ? "eager" : "rendezvous");
    }
    const char *tr = ucx_peer_transport(r.peer);
    cr_log_info("transport %s (UCX_TLS=%s)", tr, ucx_node_transports(r.node));
    cr_assert(strstr(tr, "tcp"), "transport \"%s\" over UCX_TLS=tcp", tr);
    struct ucx_node_stats st;
    ucx_node_stats(r.node, &st);
    cr_assert_eq(st.fetch_keys, 3);
    cr_assert_eq(st.timeouts + st.peer_errors + st.bad_messages + st.late_dropped, 0);
    req_fini(&r);
    owner_stop(&ow);
}

/* UCX_RNDV_THRESH in the environment wins over umbp's 1 MiB: at 64k the
 * owner (which reads it as it starts; the sender chooses the protocol) sends
 * 256 KiB by rendezvous, 4 KiB still eager; the bytes are right either way. */
Test(ucx_fetch, rndv_thresh_from_the_environment_wins)
{
    ucx_env();
    setenv("UCX_RNDV_THRESH", "64k", 1);
    static struct owner_spec spec;
    spec.space = seed_now();
    spec.nobj = 2;
    spec.size[0] = 4096;
    spec.size[1] = 256 << 10;
    spec.hang = -1;
    struct owner ow;
    owner_start(&ow, &spec);
    struct req r;
    req_init(&r, &ow, 4 << 20);
    int idx[2] = { 0, 1 };
    struct ucx_fetch_item items[2];
    lay_out(&r, items, idx, 2, &spec, 0);
    struct waiter w = { 0 };
    cr_assert_eq(ucx_fetch(r.peer, items, 2, 30000, on_done, &w), 0);
    run_until(&r, &w.done);
    cr_assert(w.done && w.calls == 1);
    expect_bytes(&items[0], &spec, 0);
    expect_bytes(&items[1], &spec, 1);
    struct ucx_node_stats st;
    ucx_node_stats(r.node, &st);
    cr_assert_eq(st.data_eager, 1, "4 KiB: eager");
    cr_assert_eq(st.data_rndv, 1, "256 KiB under UCX_RNDV_THRESH=64k: rendezvous");
    req_fini(&r);
    owner_stop(&ow);
}

Test(ucx_fetch, many_keys_one_batch)
{
    ucx_env();
    static struct owner_spec spec;
    spec.space = seed_now();
    struct tu_rng rng;
    tu_rng_seed(&rng, spec.space);
    spec.nobj = 400;
    for (int i = 0; i < spec.nobj; i++)
        spec.size[i] = i % 50 == 0 ? tu_rng_between(&rng, 100 << 10, 1 << 20)
                                   : tu_rng_between(&rng, 1, 64 << 10);
    spec.hang = -1;
    struct owner ow;
    owner_start(&ow, &spec);
    struct req r;
    req_init(&r, &ow, 64 << 20);
    static struct ucx_fetch_item items[MAX_OBJ];
    static int idx[MAX_OBJ];
    for (int i = 0; i < spec.nobj; i++)
        idx[i] = spec.nobj - 1 - i; /* another order than stored */
    lay_out(&r, items, idx, spec.nobj, &spec, 100);
    struct waiter w = { 0 };
    cr_assert_eq(ucx_fetch(r.peer, items, (uint32_t)spec.nobj, 30000, on_done, &w), 0);
    run_until(&r, &w.done);
    cr_assert(w.done && w.calls == 1);
    for (int i = 0; i < spec.nobj; i++)
        expect_bytes(&items[i], &spec, idx[i]);
    req_fini(&r);
    owner_stop(&ow);
}

Test(ucx_fetch, miss_and_too_small)
{
    ucx_env();
    static struct owner_spec spec;
    spec.space = seed_now();
    spec.nobj = 3;
    spec.size[0] = 5000;
    spec.size[1] = 70000;
    spec.size[2] = 300000;
    spec.hang = -1;
    struct owner ow;
    owner_start(&ow, &spec);
    struct req r;
    req_init(&r, &ow, 8 << 20);
    int idx[4] = { 0, 777, 1, 2 }; /* 777: no such key */
    struct ucx_fetch_item items[4];
    lay_out(&r, items, idx, 4, &spec, 0);
    items[3].cap = spec.size[2] - 1; /* one byte short */
    struct waiter w = { 0 };
    cr_assert_eq(ucx_fetch(r.peer, items, 4, 30000, on_done, &w), 0);
    run_until(&r, &w.done);
    cr_assert(w.done);
    expect_bytes(&items[0], &spec, 0);
    expect_bytes(&items[2], &spec, 1);
    cr_assert_eq(items[1].status, -ENOENT, "missing key: %d", items[1].status);
    cr_assert(tu_is_poisoned(items[1].dst, 8192));
    cr_assert_eq(items[3].status, -EMSGSIZE, "short buffer: %d", items[3].status);
    cr_assert_eq(items[3].size, spec.size[2]);
    cr_assert(tu_is_poisoned(items[3].dst, spec.size[2]));
    req_fini(&r);
    owner_stop(&ow);
}

/* The owner takes the fetch, serves some keys, then blocks on the hang key
 * and is killed: every key in flight (that batch's rest and a second batch
 * behind it) fails with the peer's error, long before the 60 s timeout; a
 * key that landed is byte-exact; the next fetch to the dead owner ends. */
Test(ucx_fetch, owner_killed_mid_fetch)
{
    ucx_env();
    static struct owner_spec spec;
    spec.space = seed_now();
    spec.nobj = 17;
    for (int i = 0; i < spec.nobj; i++)
        spec.size[i] = 2 << 20;
    spec.hang = 4;
    struct owner ow;
    owner_start(&ow, &spec);
    struct req r;
    req_init(&r, &ow, 64 << 20);
    int ia[6] = { 0, 1, 2, 3, 4, 5 }, ib[8] = { 8, 9, 10, 11, 12, 13, 14, 15 };
    struct ucx_fetch_item a[6], b[8];
    size_t used = lay_out(&r, a, ia, 6, &spec, 0);
    struct req rb = r;
    rb.pool += used;
    rb.pool_len -= used;
    lay_out(&rb, b, ib, 8, &spec, 0);
    struct waiter wa = { 0 }, wb = { 0 };
    cr_assert_eq(ucx_fetch(r.peer, a, 6, 60000, on_done, &wa), 0);
    cr_assert_eq(ucx_fetch(r.peer, b, 8, 60000, on_done, &wb), 0);
    /* run the loop until the owner reports it is inside the hang key */
    cr_assert(run_until_fd(&r, ow.notify_rd), "owner never reached the hang key");
    kill(ow.pid, SIGKILL);
    waitpid(ow.pid, NULL, 0);
    bool both = false;
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    while (!both && tu_now_ms() < end) {
        ev_run(r.loop, EVRUN_ONCE);
        both = wa.done && wb.done;
    }
    cr_assert(both, "fetches in flight did not end after the owner died");
    int landed = 0;
    for (int i = 0; i < 6; i++) {
        cr_assert_neq(a[i].status, UMBP_E_TIMEOUT, "key %d ended by timeout, not the error", i);
        if (a[i].status == 0) {
            expect_bytes(&a[i], &spec, ia[i]);
            landed++;
        } else
            cr_assert_eq(a[i].status, -ECONNRESET, "key %d: %d", i, a[i].status);
    }
    cr_assert_eq(a[4].status, -ECONNRESET, "the key the owner died in");
    cr_assert_eq(a[5].status, -ECONNRESET);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(b[i].status, -ECONNRESET, "second batch key %d: %d", i, b[i].status);
    cr_log_info("%d of 4 keys served before the kill landed", landed);
    /* the next fetch to the dead owner ends, one way or the other */
    struct waiter wc = { 0 };
    int rc = ucx_fetch(r.peer, a, 1, 60000, on_done, &wc);
    if (rc == 0) {
        run_until(&r, &wc.done);
        cr_assert(wc.done);
        cr_assert_neq(a[0].status, 0);
    }
    end_after_owner_died(&r, &ow);
}

/* The owner stopped (SIGSTOP) before the requester's first fetch, so the
 * endpoint to it is still in UCX wireup when the owner is killed: the
 * fetch ends with -ECONNRESET (not by its timeout), nothing lands, and the
 * requester lives on.  Found by test_distributed: the FETCH's send
 * callback, called by UCX while it purged the failing endpoint, closed the
 * endpoint from in there and UCX 1.13.1 aborted the process
 * (wireup_ep.c:494); failed 3 of 3 before the close moved to the loop. */
Test(ucx_fetch, owner_killed_while_the_endpoint_is_in_wireup)
{
    ucx_env();
    static struct owner_spec spec;
    spec.space = seed_now();
    spec.nobj = 4;
    for (int i = 0; i < spec.nobj; i++)
        spec.size[i] = 64 << 10;
    struct owner ow;
    owner_start(&ow, &spec);
    tu_kill_wait(ow.pid, SIGSTOP);
    struct req r;
    req_init(&r, &ow, 8 << 20);
    int idx[4] = { 0, 1, 2, 3 };
    struct ucx_fetch_item it[4];
    size_t used = lay_out(&r, it, idx, 4, &spec, 0);
    struct waiter w = { 0 };
    cr_assert_eq(ucx_fetch(r.peer, it, 4, 60000, on_done, &w), 0);
    run_for(&r, 300); /* the wireup waits on the stopped owner */
    cr_assert(!w.done, "a fetch from a stopped owner ended before it was killed");
    kill(ow.pid, SIGKILL);
    waitpid(ow.pid, NULL, 0);
    run_until(&r, &w.done);
    cr_assert(w.done, "the fetch did not end after the owner died");
    for (int i = 0; i < 4; i++)
        cr_assert_eq(it[i].status, -ECONNRESET, "key %d: %d", i, it[i].status);
    cr_assert(tu_is_poisoned(r.pool, used), "bytes landed from a dead owner");
    end_after_owner_died(&r, &ow);
}

/* The owner takes the fetch and stops (blocked in its lease callback, then
 * SIGSTOPped): the fetch ends by its timeout, the endpoint is force-closed,
 * the buffers are reused (poisoned again); the owner continues and sends
 * every reply late (each lease it took is released: its send ended) while
 * the requester runs: nothing lands.  Then a new fetch reconnects and
 * lands byte-exact. */
Test(ucx_fetch, owner_stopped_times_out_nothing_lands_late)
{
    ucx_env();
    static struct owner_spec spec;
    spec.space = seed_now();
    spec.nobj = 6;
    for (int i = 0; i < spec.nobj; i++)
        spec.size[i] = i < 3 ? 4096 : (2 << 20);
    spec.hang = 0;
    struct owner ow;
    owner_start(&ow, &spec);
    struct req r;
    req_init(&r, &ow, 32 << 20);
    int idx[6] = { 0, 1, 2, 3, 4, 5 };
    struct ucx_fetch_item it[6];
    /* connect first (wire-up is not what this test bounds): key 5 */
    lay_out(&r, it, &idx[5], 1, &spec, 0);
    struct waiter w0 = { 0 };
    cr_assert_eq(ucx_fetch(r.peer, it, 1, 30000, on_done, &w0), 0);
    run_until(&r, &w0.done);
    expect_bytes(&it[0], &spec, 5);
    tu_poison(r.pool, r.pool_len);
    lay_out(&r, it, idx, 6, &spec, 0);
    struct waiter w = { 0 };
    cr_assert_eq(ucx_fetch(r.peer, it, 6, 2000, on_done, &w), 0);
    cr_assert(run_until_fd(&r, ow.notify_rd), "owner never got the fetch");
    char c;
    cr_assert(read(ow.notify_rd, &c, 1) == 1);
    tu_kill_wait(ow.pid, SIGSTOP);
    run_until(&r, &w.done);
    cr_assert(w.done);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(it[i].status, UMBP_E_TIMEOUT, "key %d: %d", i, it[i].status);
    struct ucx_node_stats st;
    ucx_node_stats(r.node, &st);
    cr_assert_eq(st.timeouts, 1);
    cr_assert_geq(st.force_closes, 1);
    /* the warm-up's lease was released before the owner read the stale
     * fetch (same connection, in order), and the owner is stopped: count
     * releases from here */
    char rel[6];
    while (poll(&(struct pollfd){ .fd = ow.rel_rd, .events = POLLIN }, 1, 0) == 1)
        (void)!read(ow.rel_rd, rel, 1);
    /* the caller reuses its buffers */
    tu_poison(r.pool, r.pool_len);
    kill(ow.pid, SIGCONT);
    cr_assert(write(ow.go_wr, "g", 1) == 1);
    /* every lease the owner took is released once UCX ended its send: by
     * then each late reply has been sent or has failed (the 2 MiB ones to
     * the closed requester end by the owner's own bound, serve_timeout_ms) */
    uint64_t end = tu_now_ms() + TU_WAIT_MS;
    size_t got = 0;
    while (got < 6 && tu_now_ms() < end) {
        ev_run(r.loop, EVRUN_ONCE);
        struct pollfd pfd = { .fd = ow.rel_rd, .events = POLLIN };
        if (poll(&pfd, 1, 0) == 1) {
            ssize_t n = read(ow.rel_rd, rel + got, sizeof(rel) - got);
            if (n > 0)
                got += (size_t)n;
        }
    }
    cr_assert_eq(got, 6, "the owner released %zu of 6 leases", got);
    /* the 2 MiB replies (rendezvous) to the closed requester were ended by
     * the owner's bound, not left to UCX (which took 20 s to minutes) */
    cr_assert(memchr(rel, 'T', sizeof(rel)), "no lease was released by the owner's bound");
    run_for(&r, 300); /* anything still in the sockets arrives now */
    cr_assert(tu_is_poisoned(r.pool, r.pool_len), "a late reply landed in a reused buffer");
    ucx_node_stats(r.node, &st);
    cr_log_info("late replies dropped: %llu", (unsigned long long)st.late_dropped);
    /* the peer reconnects: a new fetch lands (key 0 no longer hangs: the
     * owner's go pipe has no byte left, so give it one) */
    cr_assert(write(ow.go_wr, "g", 1) == 1);
    struct waiter w2 = { 0 };
    cr_assert_eq(ucx_fetch(r.peer, it, 6, 30000, on_done, &w2), 0);
    run_until(&r, &w2.done);
    cr_assert(w2.done);
    for (int i = 0; i < 6; i++)
        expect_bytes(&it[i], &spec, idx[i]);
    req_fini(&r);
    owner_stop(&ow);
}

/* ---- the cluster's secret: the macs of FETCH and DATA ----------------------- */

#define SECRET "a cluster secret of 32 bytes...."

static void secret_spec(struct owner_spec *spec, const char *secret)
{
    spec->space = seed_now();
    spec->nobj = 3;
    spec->size[0] = 4096;     /* eager */
    spec->size[1] = 256 << 10;
    spec->size[2] = 2 << 20;  /* rendezvous */
    spec->hang = -1;
    spec->secret = secret;
}

/* An owner of the three objects holding owner_secret, a requester holding
 * req_secret, one fetch of all three (timeout_ms): the requester's stats
 * after it in *st; the caller checks the items, then secret_end. */
struct secret_run {
    struct owner_spec spec;
    struct owner ow;
    struct req r;
    struct ucx_fetch_item it[3];
    struct ucx_node_stats st;
};

static void secret_fetch(struct secret_run *s, const char *owner_secret, const char *req_secret,
                         uint32_t timeout_ms)
{
    ucx_env();
    secret_spec(&s->spec, owner_secret);
    owner_start(&s->ow, &s->spec);
    req_init_secret(&s->r, &s->ow, 8 << 20, req_secret);
    int idx[3] = {0, 1, 2};
    lay_out(&s->r, s->it, idx, 3, &s->spec, 0);
    struct waiter w = { 0 };
    cr_assert_eq(ucx_fetch(s->r.peer, s->it, 3, timeout_ms, on_done, &w), 0);
    run_until(&s->r, &w.done);
    cr_assert(w.done && w.calls == 1);
    ucx_node_stats(s->r.node, &s->st);
}

static void secret_end(struct secret_run *s)
{
    req_fini(&s->r);
    owner_stop(&s->ow);
}

/* Every key failed with status, its buffer untouched. */
static void expect_all(const struct secret_run *s, int status)
{
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(s->it[k].status, status, "key %d: %d", k, s->it[k].status);
        cr_assert(tu_is_poisoned(s->it[k].dst, s->it[k].cap), "key %d's buffer was written", k);
    }
}

/* Both hold the secret: every object byte-exact, eager and rendezvous, no
 * mac refused on either side. */
Test(ucx_fetch, a_shared_secret_fetches_byte_exact)
{
    static struct secret_run s;
    secret_fetch(&s, SECRET, SECRET, 30000);
    for (int k = 0; k < 3; k++)
        expect_bytes(&s.it[k], &s.spec, k);
    cr_assert_eq(s.st.bad_macs + s.st.refused + s.st.bad_messages, 0);
    secret_end(&s);
}

/* The owner holds the secret, the requester none (or another): every key is
 * refused with -EACCES at once, its buffer untouched, and the requester
 * counts the refusals. */
Test(ucx_fetch, an_owner_with_the_secret_refuses_a_requester_without_it)
{
    static struct secret_run s;
    secret_fetch(&s, SECRET, NULL, 30000);
    expect_all(&s, -EACCES);
    cr_assert_eq(s.st.refused, 3);
    secret_end(&s);
}

Test(ucx_fetch, an_owner_with_the_secret_refuses_a_requester_with_another)
{
    static struct secret_run s;
    secret_fetch(&s, SECRET, "another secret, also 32 bytes...", 30000);
    expect_all(&s, -EACCES);
    cr_assert_eq(s.st.refused, 3);
    secret_end(&s);
}

/* The requester holds the secret and the owner does not: the owner's
 * answers (a stand-in for a forger that knows the request id) carry no
 * right mac, so none is taken: the keys time out, their buffers untouched,
 * and every answer is counted as a wrong mac. */
Test(ucx_fetch, a_requester_with_the_secret_takes_no_answer_without_its_mac)
{
    static struct secret_run s;
    secret_fetch(&s, NULL, SECRET, 1000);
    expect_all(&s, UMBP_E_TIMEOUT);
    cr_assert_eq(s.st.bad_macs, 3);
    cr_assert_eq(s.st.fetch_keys, 0);
    secret_end(&s);
}

/* ---- an owner that answers twice: the requester's guards against bad DATA ------ */

/* A raw UCP worker, not a ucx_node: it parses each FETCH with the wire
 * decoders and answers every key with a right mac, but sends some answers
 * twice, one for an index the FETCH does not have and one for a request id
 * nobody asked: what a buggy owner, or a holder of the secret replaying its
 * answers, would send.  Keys: 0 is 2 MiB (rendezvous; its duplicate follows
 * at once, while the first is being received), 1 is 4 KiB (eager; its
 * duplicate follows after it landed), 2 is 4 KiB, sent last. */
struct rogue {
    struct net_auth_key key;
    uint8_t *obj[3];
    uint8_t *forged[3]; /* tap mode: other bytes of each object's size */
    uint64_t size[3];
    umbp_key_t keys[3];
    struct ucx_data_hdr pending[16]; /* answers to send, filled by the FETCH handler */
    const void *payload[16];
    int route[16]; /* how each goes: ROUTE_* */
    ucp_ep_h ep;
    ucp_ep_h tap_ep; /* tap mode: a connection of the rogue's own to the requester */
    int npending;
    int pause_after; /* sends this many, waits for them and 200 ms, then the rest */
    int fetches;
    bool tap;
};

enum {
    ROUTE_REPLY,    /* on the FETCH's connection, UCP_AM_SEND_FLAG_REPLY: as an owner */
    ROUTE_NO_REPLY, /* on the FETCH's connection, without the flag */
    ROUTE_TAP,      /* on the rogue's own connection to the requester, with the flag */
};

static void rogue_answer(struct rogue *g, uint64_t req_id, uint32_t index, const uint8_t *nonce,
                         int obj)
{
    struct ucx_data_hdr *h = &g->pending[g->npending];
    memset(h, 0, sizeof(*h));
    h->req_id = req_id;
    h->index = index;
    h->size = g->size[obj];
    ucx_wire_data_mac(g->key.k, h, nonce, h->mac);
    g->route[g->npending] = ROUTE_REPLY;
    g->payload[g->npending++] = g->obj[obj];
}

/* An answer with the owner's right header and mac but other bytes, as a tap
 * that replayed the FETCH to the owner would hold, sent on route. */
static void rogue_forge(struct rogue *g, uint64_t req_id, uint32_t index, const uint8_t *nonce,
                        int obj, int route)
{
    rogue_answer(g, req_id, index, nonce, obj);
    g->route[g->npending - 1] = route;
    g->payload[g->npending - 1] = g->forged[obj];
}

static ucs_status_t rogue_on_fetch(void *arg, const void *header, size_t header_length,
                                   void *data, size_t length, const ucp_am_recv_param_t *param)
{
    struct rogue *g = arg;
    struct ucx_fetch_hdr h;
    char err[160];
    if (ucx_wire_fetch_parse(header, header_length, data, length, &h, err, sizeof(err)) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || h.n != 3 ||
        !ucx_wire_fetch_mac_ok(g->key.k, &h, data))
        _exit(10); /* the test's requester sent something else */
    for (uint32_t i = 0; i < 3; i++) {
        struct ucx_fetch_rec r;
        ucx_wire_fetch_rec(data, i, &r);
        if (!tu_key_eq(&r.key, &g->keys[i]))
            _exit(11);
    }
    g->ep = param->reply_ep;
    g->npending = 0;
    g->pause_after = 0;
    if (g->tap && g->fetches++ == 0) {
        /* forged answers first, on the rogue's own connection and on the
         * FETCH's without the reply flag; the owner's own 200 ms later */
        for (uint32_t i = 0; i < 3; i++) {
            rogue_forge(g, h.req_id, i, h.nonce, (int)i, ROUTE_TAP);
            rogue_forge(g, h.req_id, i, h.nonce, (int)i, ROUTE_NO_REPLY);
        }
        g->pause_after = g->npending;
        for (uint32_t i = 0; i < 3; i++)
            rogue_answer(g, h.req_id, i, h.nonce, (int)i);
    } else if (g->tap) {
        for (uint32_t i = 0; i < 3; i++)
            rogue_answer(g, h.req_id, i, h.nonce, (int)i);
    } else if (g->fetches++ == 0) {
        rogue_answer(g, h.req_id, 0, h.nonce, 0);
        rogue_answer(g, h.req_id, 0, h.nonce, 0);     /* while the first is received */
        rogue_answer(g, h.req_id, 1, h.nonce, 1);
        rogue_answer(g, h.req_id, 1, h.nonce, 1);     /* after the first landed */
        rogue_answer(g, h.req_id, 7, h.nonce, 1);     /* an index the FETCH has not */
        rogue_answer(g, h.req_id ^ 1, 2, h.nonce, 2); /* a request nobody made */
        rogue_answer(g, h.req_id, 2, h.nonce, 2);
    } else { /* a second fetch, answered once each: the requester still works */
        for (uint32_t i = 0; i < 3; i++)
            rogue_answer(g, h.req_id, i, h.nonce, (int)i);
    }
    return UCS_OK;
}

static void rogue_sent(void *req, ucs_status_t status, void *arg) {}

static void rogue_progress(ucp_worker_h w, ucp_worker_h tw)
{
    ucp_worker_progress(w);
    if (tw)
        ucp_worker_progress(tw);
}

static void rogue_main(struct rogue *g, int addr_fd, int req_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ucp_config_t *cfg;
    ucp_context_h ctx;
    ucp_worker_h w, tw = NULL;
    ucp_params_t prm = { .field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM };
    ucp_worker_params_t wp = { .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                               .thread_mode = UCS_THREAD_MODE_SINGLE };
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK || ucp_init(&prm, cfg, &ctx) != UCS_OK ||
        ucp_worker_create(ctx, &wp, &w) != UCS_OK)
        _exit(3);
    ucp_config_release(cfg);
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = UCX_AM_FETCH,
        .cb = rogue_on_fetch,
        .arg = g,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
    };
    ucp_address_t *addr;
    size_t len;
    if (ucp_worker_set_am_recv_handler(w, &ap) != UCS_OK ||
        ucp_worker_get_address(w, &addr, &len) != UCS_OK)
        _exit(4);
    uint32_t l32 = (uint32_t)len;
    if (write(addr_fd, &l32, 4) != 4 || write(addr_fd, addr, len) != (ssize_t)len)
        _exit(5);
    close(addr_fd);
    /* tap mode: the requester's address, then a connection to it from a
     * worker of its own (a tap is another process; an endpoint of the
     * owner's worker to the requester would be paired with the
     * requester's endpoint to it: UCX matches the two as one connection) */
    if (g->tap) {
        static uint8_t raddr[4096];
        if (read(req_fd, &l32, 4) != 4 || l32 == 0 || l32 > sizeof(raddr) ||
            read(req_fd, raddr, l32) != (ssize_t)l32)
            _exit(6);
        ucp_ep_params_t ep = { .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                               .address = (const ucp_address_t *)raddr };
        if (ucp_worker_create(ctx, &wp, &tw) != UCS_OK || ucp_ep_create(tw, &ep, &g->tap_ep) != UCS_OK)
            _exit(7);
    }
    /* a header stays UCX's until its send completes: one set per fetch */
    static uint8_t wire[2][16][UCX_DATA_HDR_LEN];
    for (;;) {
        rogue_progress(w, tw);
        if (!g->npending) {
            usleep(100);
            continue;
        }
        int n = g->npending;
        g->npending = 0;
        for (int i = 0; i < n; i++) {
            uint8_t *hdr = wire[g->fetches > 1][i];
            ucx_wire_data_hdr_put(hdr, &g->pending[i]);
            ucp_request_param_t sp = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS,
                .cb.send = rogue_sent,
                .flags = (g->pending[i].size > 65536 ? UCP_AM_SEND_FLAG_RNDV
                                                     : UCP_AM_SEND_FLAG_EAGER) |
                         (g->route[i] == ROUTE_NO_REPLY ? 0 : UCP_AM_SEND_FLAG_REPLY),
            };
            /* sent in order, never waited for: the duplicates follow at once */
            void *req = ucp_am_send_nbx(g->route[i] == ROUTE_TAP ? g->tap_ep : g->ep, UCX_AM_DATA,
                                        hdr, UCX_DATA_HDR_LEN, g->payload[i], g->pending[i].size,
                                        &sp);
            bool last = i + 1 == n || i + 1 == g->pause_after;
            if (UCS_PTR_IS_PTR(req)) {
                while (ucp_request_check_status(req) == UCS_INPROGRESS && last)
                    rogue_progress(w, tw); /* the last one: its buffers stay ours */
                if (ucp_request_check_status(req) != UCS_INPROGRESS)
                    ucp_request_free(req);
            }
            if (i + 1 == g->pause_after) /* the forged ones reach the requester first */
                for (int t = 0; t < 2000; t++) {
                    rogue_progress(w, tw);
                    usleep(100);
                }
        }
    }
}

/* Forks the rogue and reads its worker's address into ow; with tap_wr, also
 * a pipe on which the test then writes the requester's address (tap mode). */
static void rogue_start(struct rogue *g, struct owner *ow, int *tap_wr)
{
    int a[2], b[2] = {-1, -1};
    cr_assert(pipe(a) == 0 && (!tap_wr || pipe(b) == 0));
    ow->pid = fork();
    cr_assert(ow->pid >= 0);
    if (ow->pid == 0) {
        close(a[0]);
        if (tap_wr)
            close(b[1]);
        rogue_main(g, a[1], b[0]);
    }
    close(a[1]);
    if (tap_wr) {
        close(b[0]);
        *tap_wr = b[1];
    }
    owner_read_address(ow, a[0]);
    /* owner_stop closes these: make them harmless */
    ow->notify_rd = open("/dev/null", O_RDONLY);
    ow->go_wr = open("/dev/null", O_WRONLY);
    ow->rel_rd = open("/dev/null", O_RDONLY);
}

/* One fetch of the rogue's three keys into a poisoned pool: it must end,
 * the rogue must still run, and after 200 ms more (whatever it sent after
 * the last key arrives) each key holds exactly its bytes.  *st: the
 * requester's counters then. */
static void rogue_round(struct req *r, const struct owner_spec *spec, const struct owner *ow,
                        int round, struct ucx_node_stats *st)
{
    struct ucx_fetch_item it[3];
    int idx[3] = {0, 1, 2};
    tu_poison(r->pool, r->pool_len);
    lay_out(r, it, idx, 3, spec, 0);
    struct waiter w = { 0 };
    cr_assert_eq(ucx_fetch(r->peer, it, 3, 30000, on_done, &w), 0);
    run_until(r, &w.done);
    cr_assert(w.done && w.calls == 1, "round %d: the fetch did not end", round);
    int wst = 0;
    cr_assert_eq(waitpid(ow->pid, &wst, WNOHANG), 0, "round %d: the rogue exited (status %d)",
                 round, WIFEXITED(wst) ? WEXITSTATUS(wst) : -WTERMSIG(wst));
    run_for(r, 200);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(it[k].status, 0, "round %d, key %d: status %d", round, k, it[k].status);
        expect_bytes(&it[k], spec, k);
    }
    ucx_node_stats(r->node, st);
    cr_log_info("round %d: bad %llu, late %llu, eager %llu, rndv %llu, bad macs %llu", round,
                (unsigned long long)st->bad_messages, (unsigned long long)st->late_dropped,
                (unsigned long long)st->data_eager, (unsigned long long)st->data_rndv,
                (unsigned long long)st->bad_macs);
}

/* A second DATA for a key, one for an index the FETCH does not have and one
 * for a request id nobody made, all with right macs: each is dropped and
 * counted, the keys land byte-exact exactly once, nothing is written past
 * them, and a later fetch from the same owner still lands.  The duplicate
 * of the rendezvous key arrives while the first is being received: before
 * the guard it replaced the receive the batch waited for. */
Test(ucx_fetch, a_duplicate_or_stray_answer_is_dropped_and_the_fetch_lands_once)
{
    ucx_env();
    static struct rogue g;
    static struct owner_spec spec; /* the sizes and keys, for lay_out and expect_bytes */
    spec.space = seed_now();
    spec.nobj = 3;
    spec.size[0] = 2 << 20;
    spec.size[1] = 4096;
    spec.size[2] = 4096;
    spec.hang = -1;
    net_auth_key_from(SECRET, strlen(SECRET), &g.key);
    for (int i = 0; i < 3; i++) {
        g.keys[i] = tu_key_id(spec.space, (uint64_t)i);
        g.size[i] = spec.size[i];
        g.obj[i] = malloc(spec.size[i]);
        cr_assert(g.obj[i]);
        tu_fill_from_key(&g.keys[i], 0, g.obj[i], spec.size[i]);
    }
    struct owner ow = { 0 };
    rogue_start(&g, &ow, NULL);
    struct req r;
    req_init_secret(&r, &ow, 8 << 20, SECRET);
    for (int round = 0; round < 2; round++) {
        struct ucx_node_stats st;
        rogue_round(&r, &spec, &ow, round, &st);
        /* four answers dropped: the two duplicates and the stray index (bad:
         * their batch is live), the unknown request id (late).  A stray
         * arriving after the batch finished would count as late instead, so
         * the sum is what holds whatever the arrival order; with the
         * rendezvous duplicate taken it is 3 */
        cr_assert_eq(st.bad_messages + st.late_dropped, 4,
                     "round %d: %llu answers dropped as bad, %llu as late: 4 were sent",
                     round, (unsigned long long)st.bad_messages,
                     (unsigned long long)st.late_dropped);
        cr_assert_geq(st.late_dropped, 1, "the unknown request id was taken");
        cr_assert_eq(st.bad_macs, 0);
        cr_assert_eq(st.fetch_keys, 3 * (uint64_t)(round + 1), "keys landed more than once");
    }
    req_fini(&r);
    owner_stop(&ow);
    for (int i = 0; i < 3; i++)
        free(g.obj[i]);
}

/* A tap that replayed a FETCH to its owner over a connection of its own
 * holds the owner's answer headers, macs included, and could send them to
 * the requester ahead of the owner with bytes of its own.  The rogue does
 * that: for each key a forged answer (right header and mac, other bytes) on
 * a connection of its own to the requester, and one on the FETCH's
 * connection without the reply flag (no connection named), then 200 ms
 * later the owner's answers.  The forged ones are dropped and counted, each
 * key lands once with the owner's bytes, and a second fetch still lands.
 * Before answers were bound to the FETCH's connection, the forged bytes
 * landed and the fetch ended with them. */
Test(ucx_fetch, an_answer_on_another_connection_is_dropped_even_with_its_mac)
{
    ucx_env();
    static struct rogue g;
    static struct owner_spec spec;
    spec.space = seed_now();
    spec.nobj = 3;
    spec.size[0] = 2 << 20; /* rendezvous */
    spec.size[1] = 4096;
    spec.size[2] = 100;
    spec.hang = -1;
    g.tap = true;
    net_auth_key_from(SECRET, strlen(SECRET), &g.key);
    for (int i = 0; i < 3; i++) {
        g.keys[i] = tu_key_id(spec.space, (uint64_t)i);
        g.size[i] = spec.size[i];
        g.obj[i] = malloc(spec.size[i]);
        g.forged[i] = malloc(spec.size[i]);
        cr_assert(g.obj[i] && g.forged[i]);
        tu_fill_from_key(&g.keys[i], 0, g.obj[i], spec.size[i]);
        memset(g.forged[i], 0x3C, spec.size[i]);
    }
    struct owner ow = { 0 };
    int tap_wr = -1;
    rogue_start(&g, &ow, &tap_wr);
    struct req r;
    req_init_secret(&r, &ow, 8 << 20, SECRET);
    const void *raddr;
    size_t rlen;
    ucx_node_address(r.node, &raddr, &rlen);
    uint32_t l32 = (uint32_t)rlen;
    cr_assert(write(tap_wr, &l32, 4) == 4 && write(tap_wr, raddr, rlen) == (ssize_t)rlen);
    close(tap_wr);
    for (int round = 0; round < 2; round++) {
        struct ucx_node_stats st;
        rogue_round(&r, &spec, &ow, round, &st);
        /* six forged answers, all in the first round: dropped as bad while the
         * fetch waited (as sent, 200 ms ahead), or as late had one come after */
        cr_assert_eq(st.bad_messages + st.late_dropped, 6,
                     "round %d: %llu answers dropped as bad, %llu as late: 6 were forged", round,
                     (unsigned long long)st.bad_messages, (unsigned long long)st.late_dropped);
        cr_assert_eq(st.bad_macs, 0);
        cr_assert_eq(st.fetch_keys, 3 * (uint64_t)(round + 1), "keys landed more than once");
    }
    req_fini(&r);
    owner_stop(&ow);
    for (int i = 0; i < 3; i++) {
        free(g.obj[i]);
        free(g.forged[i]);
    }
}


#endif
