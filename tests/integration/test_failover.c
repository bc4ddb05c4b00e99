/*
 * test_failover - umbp-master's high availability end to end, with real
 * processes only: one redis-server (tests/common/redis_fixture.h), two
 * umbp-master processes electing a leader through the lease in it
 * ("lease_url", a short "lease_ttl_ms" for the test), and up to three
 * umbp-dist-node processes whose master_address is the same redis:// URL
 * (they find the leader in Redis and follow it; tests/common/
 * dist_fixture.h).  Faults are real: kill -9 and SIGSTOP of the leader,
 * Redis killed and restarted empty, both masters restarted, a node joining
 * in the middle of a failover, a store that shows the leader at a lower
 * epoch than the leader claims.
 *
 * Who leads is read from Redis (GET umbp:<cluster>:leader, "<epoch>
 * <address> <owner>") and from each master's /metrics (umbp_master_leader,
 * umbp_master_epoch, umbp_master_takeovers_total).  Nodes keep no replicas
 * of what they fetch (cache_remote_fetches off), so every read of another
 * node's key asks the leader; every get is checked byte for byte and
 * `wrong` must be 0 in every answer, during the faults too.  Every wait is
 * a bounded loop on an outcome, with generous bounds (the lease plus 20 s);
 * the times measured (kill to takeover, kill to the first remote hit) are
 * printed, never asserted.
 *
 * Skips, saying why, without the rdma tier (UCX), hiredis or redis-server.
 */
#define DIST_TEST_NAME "test_failover"
#include "dist_fixture.h"
#include "dist_keys.h"
#include "redis_fixture.h"
#include "scrape.h"
#include "umbp/lookup.h"

#if !UMBP_HAVE_HIREDIS
Test(failover, skipped)
{
    cr_skip_test("built without hiredis (pkg-config hiredis; scripts/setup.sh installs "
                 "libhiredis-dev): umbp-master has no redis:// lease");
}
#else

#include <sys/stat.h>

#include "master_client.h"
#include "proto.h"

#define TTL_MS 1000                  /* lease_ttl_ms of the masters */
#define LEASE_TIMEOUT_MS 300         /* lease_timeout_ms: at most ttl / 3 */
#define FAILOVER_MS (TTL_MS + 20000) /* bound on any failover outcome */
#define SIZE (64 * 1024)
#define NKEYS 16

struct fo {
    struct redis r;
    char cluster[32];
    char url[160];
    char leader_key[96];
    struct master m[2];
    uint16_t metrics[2]; /* their metrics_port */
    struct node n[3];
    int nn;              /* nodes started (n[0 .. nn-1]; a killed one has pid 0) */
};

static struct fo *cur; /* for the log dumps of a failing check */

static void fo_dump(struct fo *f)
{
    dump_master_log();
    cr_log_error("redis-server's log (%s):\n%s", f->r.log, tu_slurp(f->r.log));
    for (int i = 0; i < f->nn; i++)
        cr_log_error("%s's log (%s):\n%s", f->n[i].name, f->n[i].log, tu_slurp(f->n[i].log));
}

/* cr_assert, printing every process's log first */
#define fo_assert(cond, ...)                                                               \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fo_dump(cur);                                                                  \
            cr_assert_fail(__VA_ARGS__);                                                   \
        }                                                                                  \
    } while (0)

/* ---- metrics ----------------------------------------------------------------------------- */

/* One series of master i: its value, -1 absent, -2 no answer (a stopped
 * or dead master: each step of the scrape is bounded by 1 s). */
static double metric(struct fo *f, int i, const char *series)
{
    char *body = tu_scrape("127.0.0.1", f->metrics[i], 1000, NULL, 0);
    if (!body)
        return -2;
    double v = tu_sample(body, series);
    free(body);
    return v;
}

/* Bounded wait until master i's series is `want`; the ms it took. */
static uint64_t wait_metric(struct fo *f, int i, const char *series, double want, uint64_t ms)
{
    uint64_t t0 = now_ms();
    double v;
    while ((v = metric(f, i, series)) != want) {
        fo_assert(now_ms() - t0 < ms, "master %d (%s): %s is %g after %llu ms, expected %g", i,
                  f->m[i].addr, series, v, (unsigned long long)ms, want);
        pause_ms(50);
    }
    return now_ms() - t0;
}

/* ---- the lease in Redis ------------------------------------------------------------------- */

/* Which master the leader key names: 0 or 1, -1 nobody (no key), -2 an
 * address that is neither, -3 Redis did not answer; *epoch its epoch. */
static int leader_in_redis(struct fo *f, uint64_t *epoch)
{
    *epoch = 0;
    redisReply *rep = redis_try_cmd(&f->r, "GET %s", f->leader_key);
    if (!rep)
        return -3;
    int who = -1;
    if (rep->type == REDIS_REPLY_STRING) {
        unsigned long long e = 0;
        char addr[128] = "";
        who = -2;
        if (sscanf(rep->str, "%llu %127s", &e, addr) == 2) {
            *epoch = e;
            for (int i = 0; i < 2; i++)
                if (f->m[i].addr[0] && !strcmp(addr, f->m[i].addr))
                    who = i;
        }
    }
    freeReplyObject(rep);
    return who;
}

/* Bounded wait until Redis names master `who` (-1: anyone of the two) with
 * an epoch above min_epoch; returns the master, *ms the time it took. */
static int wait_leader(struct fo *f, int who, uint64_t min_epoch, uint64_t *epoch,
                       uint64_t *ms)
{
    uint64_t t0 = now_ms(), e = 0;
    int l;
    for (;;) {
        l = leader_in_redis(f, &e);
        if (l >= 0 && (who < 0 || l == who) && e > min_epoch)
            break;
        fo_assert(now_ms() - t0 < FAILOVER_MS, "Redis never named %s%s with an epoch above "
                  "%llu within %d ms: GET %s -> %d (epoch %llu)",
                  who < 0 ? "a master" : "master ", who < 0 ? "" : f->m[who].addr,
                  (unsigned long long)min_epoch, FAILOVER_MS, f->leader_key, l,
                  (unsigned long long)e);
        pause_ms(20);
    }
    if (epoch)
        *epoch = e;
    if (ms)
        *ms = now_ms() - t0;
    return l;
}

/* ---- the cluster ----------------------------------------------------------------------- */

/* Master i on its ports of before, or fresh ones when one was taken
 * meanwhile (nodes find the leader through the lease store, and the tests
 * read its metrics on f->metrics[i], whatever they are). */
static void fo_master_start(struct fo *f, int i)
{
    for (int attempt = 0;; attempt++) {
        if (!f->metrics[i])
            f->metrics[i] = redis_free_port();
        snprintf(f->m[i].extra, sizeof(f->m[i].extra),
                 "\"lease_url\": \"%s\", \"lease_ttl_ms\": %d, \"lease_timeout_ms\": %d, "
                 "\"metrics_port\": %u",
                 f->url, TTL_MS, LEASE_TIMEOUT_MS, f->metrics[i]);
        if (master_try_start(&f->m[i]) == 0)
            return;
        fo_assert(attempt < 4, "umbp-master %d: its ports were taken five times; log:\n%s", i,
                  tu_slurp(f->m[i].log));
        cr_log_info("master %d: a port was taken (%s, metrics %u): new ones", i, f->m[i].addr,
                    f->metrics[i]);
        f->m[i].port = 0;
        f->metrics[i] = 0;
    }
}

static void fo_node_start(struct fo *f, int i)
{
    static const char *names[] = {"node0", "node1", "node2"};
    char json[1024];
    node_start(&f->n[i], names[i],
               node_json(json, sizeof(json), f->url, names[i], "\"cache_remote_fetches\": false"));
    if (f->nn < i + 1)
        f->nn = i + 1;
}

/* Redis, master 0 (which takes the lease: it is alone), then master 1 (a
 * standby), then `nodes` nodes following the URL. */
/* The fixture, zeroed, for `cluster`; Redis not started yet. */
static void fo_init(struct fo *f, const char *cluster)
{
    need_distributed();
    redis_need();
    memset(f, 0, sizeof(*f));
    cur = f;
    memset(dist_master_logs, 0, sizeof(dist_master_logs));
    snprintf(f->cluster, sizeof(f->cluster), "%s", cluster);
    snprintf(f->leader_key, sizeof(f->leader_key), "umbp:%s:leader", cluster);
}

static void fo_redis(struct fo *f, const char *cluster)
{
    fo_init(f, cluster);
    redis_start(&f->r);
    redis_url(&f->r, cluster, f->url, sizeof(f->url));
}

static void fo_cluster(struct fo *f, int nodes)
{
    fo_master_start(f, 0);
    wait_leader(f, 0, 0, NULL, NULL);
    fo_master_start(f, 1);
    for (int i = 0; i < nodes; i++)
        fo_node_start(f, i);
}

static void fo_start(struct fo *f, const char *cluster, int nodes)
{
    fo_redis(f, cluster);
    fo_cluster(f, nodes);
}

static void fo_stop(struct fo *f)
{
    for (int i = 0; i < f->nn; i++)
        node_stop(&f->n[i]);
    for (int i = 0; i < 2; i++)
        master_stop(&f->m[i]);
    redis_stop(&f->r);
}

/* The leader and the standby, as Redis and both masters' metrics say. */
static void fo_roles(struct fo *f, int *leader, int *standby, uint64_t *epoch)
{
    int l = wait_leader(f, -1, 0, epoch, NULL);
    wait_metric(f, l, "umbp_master_leader", 1, 10000);
    wait_metric(f, 1 - l, "umbp_master_leader", 0, 10000);
    double e = metric(f, l, "umbp_master_epoch");
    fo_assert(e == (double)*epoch, "the leader's umbp_master_epoch is %g, Redis says %llu", e,
              (unsigned long long)*epoch);
    cr_log_info("leader: master %d (%s), epoch %llu; standby: master %d (%s)", l, f->m[l].addr,
                (unsigned long long)*epoch, 1 - l, f->m[1 - l].addr);
    *leader = l;
    *standby = 1 - l;
}

/* A standby refuses HELLO, saying it is one. */
static void standby_refuses(struct fo *f, int i)
{
    struct mclient_config cfg = {.address = f->m[i].addr, .role = PROTO_ROLE_LOOKUP,
                                 .engine_id = "test_failover", .timeout_ms = 2000,
                                 .hello_timeout_ms = 5000};
    struct mclient *c;
    cr_assert_eq(mclient_create(&cfg, &c), 0);
    int rc = mclient_nodes(c);
    const char *why = mclient_last_error(c);
    cr_log_info("a lookup client at standby %s: %d %s", f->m[i].addr, rc, why);
    fo_assert(rc < 0, "standby %s answered NODES (%d)", f->m[i].addr, rc);
    fo_assert(why && strcasestr(why, "standby"), "the refusal does not say standby: '%s'",
              why ? why : "(null)");
    mclient_destroy(c);
}

/* Gets of (seed, NKEYS, SIZE) on n until all hit, bounded by FAILOVER_MS
 * (every answer is checked: `wrong` 0); the ms it took and the gets made. */
static uint64_t hit_within(struct fo *f, struct node *n, uint64_t seed, int *tries)
{
    uint64_t t0 = now_ms();
    struct got g = {0};
    int k = 0;
    dist_quiet = true;
    for (;;) {
        g = get(n, seed, NKEYS, SIZE);
        k++;
        if (g.hit == NKEYS)
            break;
        if (now_ms() - t0 >= FAILOVER_MS) {
            dist_quiet = false;
            fo_assert(0, "%s: seed %llu: %zu of %d keys hit after %d gets in %d ms (last: miss "
                      "%zu timeout %zu nattempt %zu reset %zu other %zu)", n->name,
                      (unsigned long long)seed, g.hit, NKEYS, k, FAILOVER_MS, g.miss, g.timeout,
                      g.nattempt, g.reset, g.other);
        }
        pause_ms(50);
    }
    dist_quiet = false;
    if (tries)
        *tries = k;
    return now_ms() - t0;
}

/* A put on `from` is read on `to` (a remote read through the leader). */
static uint64_t put_then_read(struct fo *f, struct node *from, struct node *to, uint64_t seed)
{
    put(from, seed, NKEYS, SIZE);
    int tries;
    uint64_t ms = hit_within(f, to, seed, &tries);
    cr_log_info("%s's seed %llu read on %s after %llu ms (%d gets)", from->name,
                (unsigned long long)seed, to->name, (unsigned long long)ms, tries);
    return ms;
}

/* At most one master says it leads, and Redis names that one. */
static void one_leader(struct fo *f, const char *when)
{
    uint64_t e;
    int l = leader_in_redis(f, &e);
    double v0 = metric(f, 0, "umbp_master_leader"), v1 = metric(f, 1, "umbp_master_leader");
    fo_assert(!(v0 == 1 && v1 == 1), "%s: both masters report leader=1 (Redis names %d, epoch "
              "%llu)", when, l, (unsigned long long)e);
    if (v0 == 1 || v1 == 1) {
        int who = v0 == 1 ? 0 : 1;
        fo_assert(l == who, "%s: master %d reports leader=1, Redis names %d (epoch %llu)", when,
                  who, l, (unsigned long long)e);
    }
}

TestSuite(failover, .init = no_sigpipe, .timeout = 600);

/* ---- kill -9 of the leader ---------------------------------------------------------------- */

Test(failover, kill9_of_the_leader_the_standby_takes_over)
{
    struct fo f;
    fo_start(&f, "kill9", 3);
    int L, S;
    uint64_t e0;
    fo_roles(&f, &L, &S, &e0);
    standby_refuses(&f, S);
    uint64_t t_ref = now_ms();
    double refused;
    while ((refused = metric(&f, S, "umbp_master_standby_refused_total")) < 1)
        fo_assert(now_ms() - t_ref < 10000, "umbp_master_standby_refused_total is %g on the "
                  "standby after it refused a client", refused);
    cr_log_info("standby refusals counted: %g (%llu ms after)", refused,
                (unsigned long long)(now_ms() - t_ref));
    put_then_read(&f, &f.n[0], &f.n[1], 1);
    put(&f.n[0], 2, NKEYS, SIZE); /* read for the first time after the failover */

    /* from the kill: node1 reads its remote keys over and over, and Redis
     * is read, until a get hits them all and Redis names the standby */
    master_signal(&f.m[L], SIGKILL);
    uint64_t t0 = now_ms(), hit_ms = 0, lease_ms = 0, e1 = 0;
    bool hit = false, took = false;
    int tries = 0;
    size_t misses = 0;
    dist_quiet = true;
    while (!hit || !took) {
        fo_assert(now_ms() - t0 < FAILOVER_MS, "after the kill: %s within %d ms",
                  hit ? "Redis never named the standby" : "node1 never hit its remote keys",
                  FAILOVER_MS);
        uint64_t e;
        if (!took && leader_in_redis(&f, &e) == S && e > e0) {
            took = true;
            lease_ms = now_ms() - t0;
            e1 = e;
        }
        if (!hit) {
            struct got g = get(&f.n[1], 1, NKEYS, SIZE); /* wrong == 0 asserted in each */
            tries++;
            misses += g.miss;
            if (g.hit == NKEYS) {
                hit = true;
                hit_ms = now_ms() - t0;
            }
        }
        pause_ms(20);
    }
    dist_quiet = false;
    cr_log_info("kill -9 of the leader: Redis names the standby (epoch %llu -> %llu) after "
                "%llu ms; the first remote hit after %llu ms (%d gets, %zu keys missed, 0 "
                "wrong)", (unsigned long long)e0, (unsigned long long)e1,
                (unsigned long long)lease_ms, (unsigned long long)hit_ms, tries, misses);
    wait_metric(&f, S, "umbp_master_leader", 1, 10000);
    double me = metric(&f, S, "umbp_master_epoch");
    fo_assert(me == (double)e1, "the new leader's umbp_master_epoch %g, Redis %llu", me,
              (unsigned long long)e1);
    double takeovers = metric(&f, S, "umbp_master_takeovers_total");
    fo_assert(takeovers >= 1, "umbp_master_takeovers_total %g on the new leader", takeovers);
    /* the others read through it: old keys and new ones */
    hit_within(&f, &f.n[2], 2, NULL);
    put_then_read(&f, &f.n[2], &f.n[0], 3);
    cr_assert_eq(get(&f.n[1], 1, NKEYS, SIZE).hit, NKEYS);
    fo_stop(&f);
}

/* A Redis that wants a password: masters and nodes name a file holding it
 * in the URL (?password_file=); the cluster elects, serves and fails over
 * as without one.  A master whose file holds a wrong password never leads
 * and says why. */
Test(failover, a_store_with_a_password_through_a_password_file)
{
    struct fo f;
    fo_init(&f, "pw");
    f.r.extra[0] = "--requirepass";
    f.r.extra[1] = "fo-pw-5521";
    f.r.password = "fo-pw-5521";
    redis_start(&f.r);
    char pw[64], bad[64];
    snprintf(pw, sizeof(pw), "/tmp/umbp-test-fo-pw.%d", (int)getpid());
    snprintf(bad, sizeof(bad), "/tmp/umbp-test-fo-bad.%d", (int)getpid());
    FILE *fp = fopen(pw, "w");
    cr_assert_not_null(fp);
    fputs("fo-pw-5521\n", fp);
    fclose(fp);
    chmod(pw, 0600);
    fp = fopen(bad, "w");
    cr_assert_not_null(fp);
    fputs("not-it-3307\n", fp);
    fclose(fp);
    chmod(bad, 0600);

    /* a master with the wrong password: never leads, says so */
    snprintf(f.url, sizeof(f.url), "redis://127.0.0.1:%u/pw?password_file=%s", f.r.port, bad);
    fo_master_start(&f, 1);
    bool said = false;
    for (int i = 0; i < 200 && !said; i++) {
        said = log_has(f.m[1].log, "refused");
        if (!said)
            pause_ms(25);
    }
    fo_assert(said, "the master with the wrong password never said the store refused it");
    uint64_t e;
    fo_assert(leader_in_redis(&f, &e) == -1, "somebody leads with a wrong password");
    master_stop(&f.m[1]);

    snprintf(f.url, sizeof(f.url), "redis://127.0.0.1:%u/pw?password_file=%s", f.r.port, pw);
    fo_cluster(&f, 2);
    int L, S;
    uint64_t e0, e1;
    fo_roles(&f, &L, &S, &e0);
    put_then_read(&f, &f.n[0], &f.n[1], 11);
    master_signal(&f.m[L], SIGKILL);
    wait_leader(&f, S, e0, &e1, NULL);
    wait_metric(&f, S, "umbp_master_leader", 1, 10000);
    put_then_read(&f, &f.n[1], &f.n[0], 12);
    hit_within(&f, &f.n[1], 11, NULL);
    fo_stop(&f);
    unlink(pw);
    unlink(bad);
}

/* Redis behind Sentinel (redis+sentinel://): the primary is killed and the
 * sentinel promotes its replica; the leader renews there and leads on, a
 * kill -9 of the leader then hands the lease to the standby through the
 * new primary, and nodes read each other's keys throughout (0 wrong). */
Test(failover, through_sentinels_redis_and_then_the_leader_fail_over)
{
    struct fo f;
    fo_init(&f, "sen");
    struct redis rep, sen;
    redis_start_with_sentinel(&f.r, &rep, &sen, "svc", NULL);
    snprintf(f.url, sizeof(f.url), "redis+sentinel://127.0.0.1:%u/svc/sen", sen.port);
    fo_cluster(&f, 2);
    int L, S;
    uint64_t e0, e1;
    fo_roles(&f, &L, &S, &e0);
    put_then_read(&f, &f.n[0], &f.n[1], 21);

    /* Redis's primary dies once the replica has the lease (replication is
     * asynchronous); the sentinel promotes the replica, and the fixture
     * reads the new primary from then on */
    char want[1024];
    snprintf(want, sizeof(want), "%s", redis_str(&f.r, "GET %s", f.leader_key));
    uint64_t t0 = now_ms();
    while (strcmp(redis_str(&rep, "GET %s", f.leader_key), want) != 0) {
        fo_assert(now_ms() - t0 < 10000, "the replica never got the lease '%s'", want);
        pause_ms(10);
    }
    redis_signal(&f.r, SIGKILL);
    struct redis old = f.r;
    f.r = rep;
    t0 = now_ms();
    for (;;) {
        redisReply *x = redis_try_cmd(&f.r, "INFO replication");
        bool promoted = x && x->type == REDIS_REPLY_STRING && strstr(x->str, "role:master");
        if (x)
            freeReplyObject(x);
        if (promoted)
            break;
        fo_assert(now_ms() - t0 < FAILOVER_MS, "the sentinel never promoted the replica");
        pause_ms(20);
    }
    cr_log_info("Redis's primary killed: the replica promoted after %llu ms",
                (unsigned long long)(now_ms() - t0));
    /* the lease may have expired while Redis failed over (here the lease is
     * 1 s and the failover about as long): then a master takes it in the
     * new primary, either one; one leader, named by Redis and by its
     * metrics, and nodes read through it */
    int l = wait_leader(&f, -1, e0 - 1, &e1, NULL);
    wait_metric(&f, l, "umbp_master_leader", 1, 10000);
    wait_metric(&f, 1 - l, "umbp_master_leader", 0, 10000);
    one_leader(&f, "after Redis's failover");
    cr_log_info("after Redis's failover master %d leads, epoch %llu (was master %d, epoch %llu)",
                l, (unsigned long long)e1, L, (unsigned long long)e0);
    put_then_read(&f, &f.n[1], &f.n[0], 22);
    L = l;
    S = 1 - l;
    e0 = e1;

    /* then the leader dies: the standby takes the lease in the new primary */
    master_signal(&f.m[L], SIGKILL);
    wait_leader(&f, S, e0, &e1, NULL);
    wait_metric(&f, S, "umbp_master_leader", 1, 10000);
    put_then_read(&f, &f.n[0], &f.n[1], 23);
    hit_within(&f, &f.n[1], 21, NULL);
    fo_stop(&f); /* stops f.r: the promoted replica */
    redis_stop(&sen);
    redis_stop(&old);
}

/* ---- the scheduler's lookup client ----------------------------------------------------- */

/* umbp_lookup_client_query of node 0's keys until every one is present
 * (bounded); the milliseconds it took. */
static uint64_t lookup_until_found(struct fo *f, umbp_lookup_client_t *c, const umbp_key_t *keys,
                                   size_t n)
{
    uint64_t t0 = now_ms();
    for (;;) {
        size_t prefix = 0;
        uint8_t present[NKEYS];
        int rc = umbp_lookup_client_query(c, keys, n, 1, NULL, present, &prefix);
        if (prefix == n)
            return now_ms() - t0;
        fo_assert(now_ms() - t0 < FAILOVER_MS, "the lookup client never found node0's keys "
                  "(last rc %d: %s, prefix %zu)", rc, umbp_strerror(rc), prefix);
        pause_ms(20);
    }
}

/* The scheduler's lookup client (its own master client, on the poll
 * driver) given the redis:// URL finds the leader, and after a kill -9 of
 * the leader finds the same keys through the new one. */
Test(failover, the_schedulers_lookup_client_follows_the_leader)
{
    struct fo f;
    fo_start(&f, "lookupc", 1);
    int L, S;
    uint64_t e0;
    fo_roles(&f, &L, &S, &e0);
    put(&f.n[0], 7, NKEYS, SIZE);
    umbp_key_t keys[NKEYS];
    for (size_t i = 0; i < NKEYS; i++)
        keys[i] = dist_key_of(1, 7, i);
    char json[512];
    snprintf(json, sizeof(json), "{\"mode\": \"distributed\", \"master_address\": \"%s\", "
             "\"lookup_timeout_ms\": 500}", f.url);
    umbp_lookup_client_t *c = NULL;
    cr_assert_eq(umbp_lookup_client_create(json, &c), 0, "%s", umbp_last_error());
    uint64_t first = lookup_until_found(&f, c, keys, NKEYS);
    master_signal(&f.m[L], SIGKILL);
    uint64_t again = lookup_until_found(&f, c, keys, NKEYS);
    cr_log_info("lookup client: node0's keys found %llu ms after start, and %llu ms after the "
                "leader's kill -9", (unsigned long long)first, (unsigned long long)again);
    umbp_lookup_client_destroy(c);
    fo_stop(&f);
}

/* ---- SIGSTOP of the leader past its lease ------------------------------------------------- */

Test(failover, a_leader_stopped_past_its_lease_is_deposed_and_never_serves_again)
{
    struct fo f;
    fo_start(&f, "stop", 3);
    int L, S;
    uint64_t e0, e1, lease_ms;
    fo_roles(&f, &L, &S, &e0);
    put_then_read(&f, &f.n[0], &f.n[1], 1);

    master_signal(&f.m[L], SIGSTOP);
    wait_leader(&f, S, e0, &e1, &lease_ms);
    cr_log_info("leader stopped: Redis names the standby (epoch %llu -> %llu) after %llu ms",
                (unsigned long long)e0, (unsigned long long)e1, (unsigned long long)lease_ms);
    int tries;
    uint64_t ms = hit_within(&f, &f.n[1], 1, &tries);
    cr_log_info("leader stopped: a remote hit %llu ms later (%d gets)", (unsigned long long)ms,
                tries);
    pause_ms(TTL_MS); /* stopped for longer than the lease, and then some */

    master_signal(&f.m[L], SIGCONT);
    uint64_t t1 = now_ms();
    uint64_t down = wait_metric(&f, L, "umbp_master_leader", 0, 10000);
    cr_log_info("the woken master reports leader=0 after %llu ms", (unsigned long long)down);
    /* for a few leases: the woken one never leads again; nodes read on */
    size_t misses = 0;
    int gets = 0;
    while (now_ms() - t1 < 4 * TTL_MS) {
        uint64_t e;
        int l = leader_in_redis(&f, &e);
        fo_assert(l == S && e == e1, "after SIGCONT Redis names %d (epoch %llu), not the new "
                  "leader %d (epoch %llu)", l, (unsigned long long)e, S, (unsigned long long)e1);
        fo_assert(metric(&f, L, "umbp_master_leader") == 0, "the woken master leads again");
        dist_quiet = true;
        struct got g = get(&f.n[1], 1, NKEYS, SIZE); /* wrong == 0 asserted in each */
        dist_quiet = false;
        misses += g.miss;
        gets++;
        pause_ms(100);
    }
    cr_log_info("after SIGCONT: %d gets of %d keys through the new leader, %zu misses", gets,
                NKEYS, misses);
    cr_expect_eq(misses, 0, "the woken master disturbed the nodes: %zu misses", misses);
    standby_refuses(&f, L);
    put_then_read(&f, &f.n[2], &f.n[0], 2);
    fo_assert(metric(&f, S, "umbp_master_leader") == 1, "the new leader stepped down");
    fo_stop(&f);
}

/* ---- Redis killed, then back empty ------------------------------------------------------- */

Test(failover, redis_killed_the_leader_serves_on_and_back_empty_there_is_one_leader)
{
    struct fo f;
    fo_start(&f, "rkill", 3);
    int L, S;
    uint64_t e0;
    fo_roles(&f, &L, &S, &e0);
    put_then_read(&f, &f.n[0], &f.n[1], 1);

    redis_signal(&f.r, SIGKILL);
    uint64_t t0 = now_ms();
    /* an unreachable store deposes nobody: the sitting leader serves on */
    int gets = 0;
    while (now_ms() - t0 < 4 * TTL_MS) {
        struct got g = get(&f.n[1], 1, NKEYS, SIZE);
        fo_assert(g.hit == NKEYS, "Redis down: %zu of %d remote keys hit", g.hit, NKEYS);
        gets++;
        pause_ms(200);
    }
    fo_assert(metric(&f, L, "umbp_master_leader") == 1, "the leader stepped down with Redis "
              "gone");
    fo_assert(metric(&f, S, "umbp_master_leader") == 0, "the standby leads with Redis gone");
    cr_log_info("Redis down %llu ms: %d gets all hit", (unsigned long long)(now_ms() - t0), gets);
    put_then_read(&f, &f.n[2], &f.n[0], 2);
    double errs = metric(&f, L, "umbp_master_lease_errors_total");
    cr_log_info("the leader's umbp_master_lease_errors_total: %g", errs);

    /* back on the same port, empty */
    redis_start(&f.r);
    uint64_t t1 = now_ms(), settle = 2 * TTL_MS + 1000, last_e = 0;
    int samples = 0, seen[2] = {0, 0};
    bool key_back = false;
    while (now_ms() - t1 < settle + 5000) {
        uint64_t e;
        int l = leader_in_redis(&f, &e);
        if (l >= 0) {
            if (!key_back)
                cr_log_info("the leader key is back %llu ms after Redis: master %d, epoch %llu",
                            (unsigned long long)(now_ms() - t1), l, (unsigned long long)e);
            key_back = true;
            fo_assert(e >= last_e, "the epoch went back: %llu after %llu",
                      (unsigned long long)e, (unsigned long long)last_e);
            fo_assert(e >= e0, "an epoch (%llu) below the one before the outage (%llu)",
                      (unsigned long long)e, (unsigned long long)e0);
            last_e = e;
        }
        fo_assert(l != -2, "the leader key names neither master");
        if (now_ms() - t1 >= settle) {
            one_leader(&f, "after Redis came back");
            fo_assert(l >= 0, "nobody leads %llu ms after Redis came back (GET %s: %d, epoch "
                      "%llu; metrics leader %g/%g)", (unsigned long long)(now_ms() - t1),
                      f.leader_key, l, (unsigned long long)e,
                      metric(&f, 0, "umbp_master_leader"), metric(&f, 1, "umbp_master_leader"));
            seen[l]++;
            samples++;
        } else {
            double v0 = metric(&f, 0, "umbp_master_leader");
            double v1 = metric(&f, 1, "umbp_master_leader");
            if (v0 == 1 && v1 == 1)
                cr_log_info("settling, %llu ms after Redis came back: both report leader=1",
                            (unsigned long long)(now_ms() - t1));
        }
        pause_ms(100);
    }
    fo_assert(!(seen[0] && seen[1]), "the leader changed after the settle: master 0 in %d "
              "samples, master 1 in %d", seen[0], seen[1]);
    int l = seen[0] ? 0 : 1;
    cr_log_info("after Redis came back: master %d leads (it %s), epoch %llu; %d samples with "
                "one leader", l, l == L ? "led before" : "was the standby",
                (unsigned long long)last_e, samples);
    if (l != L)
        fo_assert(last_e > e0, "the standby took over with epoch %llu, not above %llu",
                  (unsigned long long)last_e, (unsigned long long)e0);
    hit_within(&f, &f.n[1], 1, NULL);
    put_then_read(&f, &f.n[0], &f.n[2], 3);
    fo_stop(&f);
}

/* ---- both masters restarted --------------------------------------------------------------- */

Test(failover, both_masters_restarted_one_leads_and_nodes_resync)
{
    struct fo f;
    fo_start(&f, "both", 3);
    int L, S;
    uint64_t e0, e1, ms;
    fo_roles(&f, &L, &S, &e0);
    put_then_read(&f, &f.n[0], &f.n[1], 1);
    put(&f.n[2], 2, NKEYS, SIZE);
    master_signal(&f.m[0], SIGKILL);
    master_signal(&f.m[1], SIGKILL);
    uint64_t t0 = now_ms();
    fo_master_start(&f, 0); /* same ports, same logs */
    fo_master_start(&f, 1);
    int l = wait_leader(&f, -1, e0, &e1, &ms);
    cr_log_info("both restarted: master %d leads with epoch %llu (was %llu) %llu ms after the "
                "kill", l, (unsigned long long)e1, (unsigned long long)e0,
                (unsigned long long)(now_ms() - t0));
    int tries;
    uint64_t hit = hit_within(&f, &f.n[1], 1, &tries);
    cr_log_info("the first remote hit %llu ms after the kill (%d gets)",
                (unsigned long long)(now_ms() - t0), tries);
    (void)hit;
    hit_within(&f, &f.n[0], 2, NULL);
    put_then_read(&f, &f.n[1], &f.n[2], 3);
    wait_metric(&f, l, "umbp_master_nodes{state=\"alive\"}", 3, FAILOVER_MS);
    one_leader(&f, "after both restarted");
    fo_stop(&f);
}

/* The store emptied (a Redis restarted without persistence, as the docs
 * allow) while both masters restarted too: the master that takes the empty
 * store starts again at epoch 1, below what the running nodes have seen
 * (42).  The store is the authority: the nodes follow its leader, register
 * and read each other's new keys.  Found by an outside reading: the nodes
 * kept the highest epoch they had seen and refused the new leader as
 * deposed, for good (every remote key a miss until every engine restarted). */
Test(failover, the_store_emptied_and_both_masters_restarted_nodes_follow_epoch_one)
{
    struct fo f;
    fo_redis(&f, "wiped");
    redis_do(&f.r, "SET umbp:%s:epoch 41", f.cluster);
    fo_cluster(&f, 2);
    int L, S;
    uint64_t e0, e1, ms;
    fo_roles(&f, &L, &S, &e0);
    fo_assert(e0 == 42, "the first epoch is %llu, expected 42", (unsigned long long)e0);
    put_then_read(&f, &f.n[0], &f.n[1], 1);
    master_signal(&f.m[0], SIGKILL);
    master_signal(&f.m[1], SIGKILL);
    redis_restart_same_port(&f.r);
    fo_master_start(&f, 0); /* new processes: they have seen no epoch */
    fo_master_start(&f, 1);
    int l = wait_leader(&f, -1, 0, &e1, &ms);
    fo_assert(e1 < e0, "the empty store's first epoch is %llu, not below %llu",
              (unsigned long long)e1, (unsigned long long)e0);
    cr_log_info("master %d took the empty store with epoch %llu", l, (unsigned long long)e1);
    put_then_read(&f, &f.n[0], &f.n[1], 2); /* both nodes registered with it */
    put_then_read(&f, &f.n[1], &f.n[0], 3);
    one_leader(&f, "after the store was emptied");
    fo_stop(&f);
}

/* ---- a node joins during a failover ------------------------------------------------------- */

Test(failover, a_node_started_during_a_failover_joins_the_new_leader)
{
    struct fo f;
    fo_start(&f, "join", 2);
    int L, S;
    uint64_t e0, e1, ms;
    fo_roles(&f, &L, &S, &e0);
    put_then_read(&f, &f.n[0], &f.n[1], 1);
    master_signal(&f.m[L], SIGKILL);
    uint64_t t0 = now_ms();
    fo_node_start(&f, 2); /* Redis still names the dead leader */
    cr_log_info("node2 ready %llu ms after the kill", (unsigned long long)(now_ms() - t0));
    wait_leader(&f, S, e0, &e1, &ms);
    int tries;
    hit_within(&f, &f.n[2], 1, &tries);
    cr_log_info("node2 read node0's keys %llu ms after the kill (%d gets)",
                (unsigned long long)(now_ms() - t0), tries);
    put_then_read(&f, &f.n[2], &f.n[0], 2);
    wait_metric(&f, S, "umbp_master_nodes{state=\"alive\"}", 3, FAILOVER_MS);
    fo_stop(&f);
}

/* ---- a clean stop of the leader ---------------------------------------------------------- */

Test(failover, a_leader_stopped_cleanly_releases_the_lease)
{
    struct fo f;
    fo_start(&f, "term", 2);
    int L, S;
    uint64_t e0, e1, ms;
    fo_roles(&f, &L, &S, &e0);
    put_then_read(&f, &f.n[0], &f.n[1], 1);
    uint64_t t0 = now_ms();
    cr_assert_eq(kill(f.m[L].pid, SIGTERM), 0);
    int st;
    while (waitpid(f.m[L].pid, &st, WNOHANG) != f.m[L].pid) {
        fo_assert(now_ms() - t0 < 10000, "umbp-master did not exit on SIGTERM");
        pause_ms(10);
    }
    f.m[L].pid = 0;
    uint64_t exit_ms = now_ms() - t0, e;
    int l = leader_in_redis(&f, &e);
    cr_log_info("SIGTERM: the leader exited after %llu ms (status %d); Redis names %d (epoch "
                "%llu)", (unsigned long long)exit_ms, st, l, (unsigned long long)e);
    fo_assert(!(l == L && e == e0), "the leader exited without releasing the lease: Redis "
              "still names it (epoch %llu)", (unsigned long long)e);
    wait_leader(&f, S, e0, &e1, &ms);
    cr_log_info("the standby took over %llu ms after the SIGTERM (epoch %llu)",
                (unsigned long long)(now_ms() - t0), (unsigned long long)e1);
    int tries;
    hit_within(&f, &f.n[1], 1, &tries);
    cr_log_info("the first remote hit %llu ms after the SIGTERM (%d gets)",
                (unsigned long long)(now_ms() - t0), tries);
    fo_stop(&f);
}

/* ---- Redis stalled past the lease ------------------------------------------------------ */

/* Redis SIGSTOPped for three leases: the leader serves on (an unreachable
 * store deposes nobody); the commands that timed out meanwhile (the
 * standby's acquires, the leader's renewals) may still run when Redis
 * wakes.  After a settle: one leader, named by Redis, epochs never went
 * back, and the nodes read on. */
Test(failover, redis_stalled_past_the_lease_then_one_leader)
{
    struct fo f;
    fo_start(&f, "rstop", 3);
    int L, S;
    uint64_t e0;
    fo_roles(&f, &L, &S, &e0);
    put_then_read(&f, &f.n[0], &f.n[1], 1);
    redis_signal(&f.r, SIGSTOP);
    uint64_t t0 = now_ms();
    int gets = 0;
    while (now_ms() - t0 < 3 * TTL_MS) {
        struct got g = get(&f.n[1], 1, NKEYS, SIZE);
        fo_assert(g.hit == NKEYS, "Redis stopped: %zu of %d remote keys hit", g.hit, NKEYS);
        gets++;
        pause_ms(200);
    }
    fo_assert(metric(&f, L, "umbp_master_leader") == 1, "the leader stepped down with Redis "
              "stopped");
    cr_log_info("Redis stopped %llu ms: %d gets all hit", (unsigned long long)(now_ms() - t0),
                gets);
    redis_signal(&f.r, SIGCONT);
    uint64_t t1 = now_ms(), settle = 2 * TTL_MS + 1000, last_e = 0;
    int seen[2] = {0, 0}, settle_gets = 0;
    size_t settle_misses = 0;
    while (now_ms() - t1 < settle + 4000) {
        uint64_t e;
        int l = leader_in_redis(&f, &e);
        if (l >= 0) {
            fo_assert(e >= last_e && e >= e0, "the epoch went back: %llu after %llu (before "
                      "the stall %llu)", (unsigned long long)e, (unsigned long long)last_e,
                      (unsigned long long)e0);
            if (e != last_e)
                cr_log_info("%llu ms after Redis woke: it names master %d, epoch %llu; their "
                            "metrics: leader %g/%g", (unsigned long long)(now_ms() - t1), l,
                            (unsigned long long)e, metric(&f, 0, "umbp_master_leader"),
                            metric(&f, 1, "umbp_master_leader"));
            last_e = e;
        }
        if (now_ms() - t1 < settle) { /* the nodes meanwhile (printed, not asserted) */
            dist_quiet = true;
            settle_misses += get(&f.n[1], 1, NKEYS, SIZE).miss;
            dist_quiet = false;
            settle_gets++;
        }
        if (now_ms() - t1 >= settle) {
            one_leader(&f, "after Redis woke");
            fo_assert(l >= 0, "nobody leads %llu ms after Redis woke (GET %s: %d, epoch %llu; "
                      "metrics leader %g/%g)", (unsigned long long)(now_ms() - t1),
                      f.leader_key, l, (unsigned long long)e,
                      metric(&f, 0, "umbp_master_leader"), metric(&f, 1, "umbp_master_leader"));
            seen[l]++;
        } else if (metric(&f, 0, "umbp_master_leader") == 1 &&
                   metric(&f, 1, "umbp_master_leader") == 1) {
            cr_log_info("settling, %llu ms after Redis woke: both report leader=1",
                        (unsigned long long)(now_ms() - t1));
        }
        pause_ms(100);
    }
    fo_assert(!(seen[0] && seen[1]), "the leader changed after the settle");
    int l = seen[0] ? 0 : 1;
    cr_log_info("after Redis woke: master %d leads (it %s), epoch %llu (was %llu); in the "
                "settle node1 missed %zu keys in %d gets of %d", l,
                l == L ? "led before" : "was the standby", (unsigned long long)last_e,
                (unsigned long long)e0, settle_misses, settle_gets, NKEYS);
    hit_within(&f, &f.n[1], 1, NULL);
    put_then_read(&f, &f.n[2], &f.n[0], 2);
    fo_stop(&f);
}

/* ---- Redis lost its data and a master that never saw the epoch starts --------------------- */

/* The leader holds epoch 42 (the counter was at 41).  Redis restarts empty
 * and the standby restarts too, so it has seen no epoch; it reaches the
 * empty store before the leader's next renewal (forced here by stopping
 * the leader for that moment; with the standby retrying every ttl/10 and
 * the leader renewing every ttl/3 the same order is the likely one anyway)
 * and takes epoch 1.  After a settle there must still be one leader, and
 * nodes (old ones, and one started afterwards) must reach each other's
 * keys through it. */
Test(failover, an_empty_store_and_a_master_that_never_saw_the_epoch_one_leader)
{
    struct fo f;
    fo_redis(&f, "fresh");
    redis_do(&f.r, "SET umbp:%s:epoch 41", f.cluster);
    fo_cluster(&f, 2);
    int L, S;
    uint64_t e0;
    fo_roles(&f, &L, &S, &e0);
    fo_assert(e0 == 42, "the first epoch is %llu, expected 42", (unsigned long long)e0);
    put_then_read(&f, &f.n[0], &f.n[1], 1);

    master_signal(&f.m[S], SIGKILL);
    master_signal(&f.m[L], SIGSTOP);
    redis_restart_same_port(&f.r);
    fo_master_start(&f, S); /* a new process: it has seen no epoch */
    uint64_t e1, ms;
    wait_leader(&f, S, 0, &e1, &ms);
    cr_log_info("the restarted master took the empty store with epoch %llu", (unsigned long long)e1);
    master_signal(&f.m[L], SIGCONT);

    uint64_t t1 = now_ms(), settle = 2 * TTL_MS + 1000;
    int bad = 0, samples = 0;
    while (now_ms() - t1 < settle + 3000) {
        if (now_ms() - t1 >= settle) {
            uint64_t e;
            int l = leader_in_redis(&f, &e);
            double v0 = metric(&f, 0, "umbp_master_leader");
            double v1 = metric(&f, 1, "umbp_master_leader");
            double p0 = metric(&f, 0, "umbp_master_epoch");
            double p1 = metric(&f, 1, "umbp_master_epoch");
            if ((v0 == 1 && v1 == 1) || (v0 == 1 && l != 0) || (v1 == 1 && l != 1)) {
                if (!bad)
                    cr_log_error("%llu ms after: master 0 leader=%g epoch=%g, master 1 "
                                 "leader=%g epoch=%g; Redis names %d (epoch %llu)",
                                 (unsigned long long)(now_ms() - t1), v0, p0, v1, p1, l,
                                 (unsigned long long)e);
                bad++;
            }
            samples++;
        }
        pause_ms(100);
    }
    /* a node that starts now follows whatever Redis names */
    fo_node_start(&f, 2);
    cr_expect_eq(bad, 0, "%d of %d samples after the settle had two leaders, or a leader "
                 "Redis does not name", bad, samples);
    put(&f.n[2], 2, NKEYS, SIZE);
    hit_within(&f, &f.n[0], 2, NULL); /* the old node reads the new node's keys */
    hit_within(&f, &f.n[2], 1, NULL); /* and the other way */
    fo_stop(&f);
}

/* ---- a master claiming an epoch the store does not show ------------------------------- */

/* How many times `what` occurs in the file at path. */
static int log_count(const char *path, const char *what)
{
    int n = 0;
    for (const char *p = tu_slurp(path); (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* The store names the leader's own address at an epoch below the one the
 * leader serves under, as a store rewritten behind the masters would: a
 * node that reads it must refuse that master's HELLO_OK, dial after dial,
 * and never take the master's word for the higher epoch (a faulty master
 * claiming a huge one would lock it out of the real leader).  The leader
 * cannot put its value back meanwhile: Redis denies it EVAL (an ACL), so
 * its renewals fail and, a store error deposing nobody, it leads on; that
 * keeps the mismatch for as long as the test looks, where a renewal would
 * end it within ttl / 3.  Given EVAL back, its next renewal takes its key
 * back at its own epoch, and the node joins and reads byte-exact. */
Test(failover, a_master_above_the_stores_epoch_is_refused_until_the_store_shows_it)
{
    struct fo f;
    fo_redis(&f, "above");
    redis_do(&f.r, "SET umbp:%s:epoch 41", f.cluster);
    fo_master_start(&f, 0); /* alone: no standby takes over meanwhile */
    uint64_t e;
    wait_leader(&f, 0, 0, &e, NULL);
    fo_assert(e == 42, "the first epoch is %llu, expected 42", (unsigned long long)e);
    wait_metric(&f, 0, "umbp_master_epoch", 42, 10000); /* what its HELLO_OK carries */
    fo_node_start(&f, 0); /* reads epoch 42: welcomed */
    wait_metric(&f, 0, "umbp_master_nodes{state=\"alive\"}", 1, FAILOVER_MS);
    put(&f.n[0], 2, NKEYS, SIZE);

    /* the renewals fail first, so nothing puts back the value written next */
    redis_do(&f.r, "ACL SETUSER default -eval");
    uint64_t t0 = now_ms();
    double errs;
    while ((errs = metric(&f, 0, "umbp_master_lease_errors_total")) < 1) {
        fo_assert(now_ms() - t0 < FAILOVER_MS, "the leader's renewals never failed without "
                  "EVAL (umbp_master_lease_errors_total %g)", errs);
        pause_ms(20);
    }
    char low[256];
    const char *v = redis_str(&f.r, "GET %s", f.leader_key);
    fo_assert(strncmp(v, "42 ", 3) == 0, "the leader key is '%s', expected epoch 42", v);
    snprintf(low, sizeof(low), "41%.240s", v + 2); /* the same address and owner, epoch 41 */
    redis_do(&f.r, "SET %s %s", f.leader_key, low);
    cr_log_info("the store says '%s'; the leader serves under epoch 42", low);

    /* node1 reads 41 and dials the address: refused, and again at every dial */
    fo_node_start(&f, 1);
    char refusal[160], hello[64];
    snprintf(refusal, sizeof(refusal), "the master at %s claims epoch 42, above the 41 ",
             f.m[0].addr);
    fo_assert(log_has(f.n[1].log, refusal), "node1 never logged '%s...'", refusal);
    snprintf(hello, sizeof(hello), "engine 'node1:%d'", (int)f.n[1].pid);
    int hellos;
    t0 = now_ms();
    while ((hellos = log_count(f.m[0].log, hello)) < 3) {
        double regs = metric(&f, 0, "umbp_master_registers_total");
        fo_assert(regs == 1, "after %d HELLOs node1 registered with the master that claims an "
                  "epoch the store does not show (umbp_master_registers_total %g)", hellos, regs);
        fo_assert(now_ms() - t0 < FAILOVER_MS, "node1 said HELLO %d times: it stopped dialling "
                  "the master after the refusal", hellos);
        pause_ms(50);
    }
    put(&f.n[1], 1, NKEYS, SIZE); /* stored on node1 alone: the index cannot hear of it */
    fo_assert(metric(&f, 0, "umbp_master_registers_total") == 1, "node1 registered with the "
              "master that claims an epoch the store does not show");
    fo_assert(metric(&f, 0, "umbp_master_nodes{state=\"alive\"}") == 1, "node1 is alive at "
              "the master");
    fo_assert(lookup(&f.n[0], 1, NKEYS, NULL) == 0, "node0 found node1's keys");
    fo_assert(lookup(&f.n[1], 2, NKEYS, NULL) == 0, "node1 found node0's keys");
    fo_assert(get(&f.n[1], 2, NKEYS, SIZE).hit == 0, "node1 read node0's keys");
    fo_assert(leader_in_redis(&f, &e) == 0 && e == 41, "the store changed meanwhile: epoch "
              "%llu", (unsigned long long)e); /* the mismatch lasted while we looked */
    fo_assert(!strstr(tu_slurp(f.n[0].log), "claims epoch"), "node0 (welcomed at 42) refused");
    cr_log_info("node1: %d HELLOs to the master, each refused", hellos);

    /* the leader's next renewal takes its key back at 42: node1 joins */
    redis_do(&f.r, "ACL SETUSER default +eval");
    wait_leader(&f, 0, 41, &e, NULL);
    fo_assert(e == 42, "the leader took its key back at epoch %llu", (unsigned long long)e);
    until_found(&f.n[0], 1, NKEYS, NKEYS);
    hit_within(&f, &f.n[0], 1, NULL);
    hit_within(&f, &f.n[1], 2, NULL);
    wait_metric(&f, 0, "umbp_master_nodes{state=\"alive\"}", 2, FAILOVER_MS);
    fo_stop(&f);
}

#endif /* UMBP_HAVE_HIREDIS */
