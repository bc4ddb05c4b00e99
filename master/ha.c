/*
 * ha.c - the lease thread of umbp-master (ha.h): take the lease as a
 * standby, keep it as the leader, step down only for a higher epoch.
 *
 * Owner string: "<hostname>/<pid>/<16 hex of randomness>", unique per
 * process, so a master restarted under the same pid is another owner.
 *
 * Threads: run() is the lease thread; everything in struct master_ha but
 * `view` (under mu) is its own.  The loop thread learns of changes through
 * the master's role_w (ev_async) and reads view.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ha.h"
#include "master_int.h"
#include "util.h"

struct master_ha {
    struct umbp_master *m;
    struct lease *store;
    char address[NET_TCP_NAME_MAX], owner[LEASE_OWNER_MAX];
    uint64_t ttl_ms, retry_ms, renew_ms;
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;              /* CLOCK_MONOTONIC: stop wakes the thread */
    bool stop;                      /* under mu */
    struct ha_view view;            /* under mu */
    /* the lease thread's */
    struct lease_holder mine;       /* epoch 0: not leading */
    uint64_t seen;                  /* the highest epoch seen */
    bool warned;                    /* the store error was logged (once per outage) */
    uint64_t hold_off_until_ns;     /* standby: no acquire before (after an outage) */
};

static void ring(struct master_ha *h) { ev_async_send(h->m->loop, &h->m->role_w); }

/* Sleeps ms or until stop; true if stopping. */
static bool nap(struct master_ha *h, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&h->mu);
    while (!h->stop && pthread_cond_timedwait(&h->cv, &h->mu, &ts) != ETIMEDOUT)
        ;
    bool stop = h->stop;
    pthread_mutex_unlock(&h->mu);
    return stop;
}

static void store_error(struct master_ha *h, const char *err)
{
    pthread_mutex_lock(&h->mu);
    h->view.errors++;
    snprintf(h->view.why, sizeof(h->view.why), "%s", err);
    pthread_mutex_unlock(&h->mu);
    if (!h->warned)
        umbp_log(UMBP_LOG_WARN, "umbp-master: the lease store failed: %s; %s", err,
                 h->mine.epoch ? "leading on (only a higher epoch deposes this master)"
                               : "standing by (a master without the lease never serves)");
    h->warned = true;
}

static void store_ok(struct master_ha *h)
{
    if (h->warned) {
        umbp_log(UMBP_LOG_INFO, "umbp-master: lease store %s reachable again",
                 lease_url_of(h->store));
        /* a standby gives a sitting leader one lease to re-take its key
         * (an empty store after a restart) before it competes */
        if (!h->mine.epoch)
            h->hold_off_until_ns = umbp_now_ns() + h->ttl_ms * 1000000ull;
    }
    h->warned = false;
    pthread_mutex_lock(&h->mu);
    h->view.why[0] = 0;
    pthread_mutex_unlock(&h->mu);
}

static void saw(struct master_ha *h, const struct lease_holder *other)
{
    if (other->epoch > h->seen)
        h->seen = other->epoch;
    pthread_mutex_lock(&h->mu);
    h->view.holder = *other;
    pthread_mutex_unlock(&h->mu);
}

/* Standby: one attempt to take the lease. */
static void try_acquire(struct master_ha *h)
{
    struct lease_holder got;
    char err[512];
    if (umbp_now_ns() < h->hold_off_until_ns) { /* still watch the store */
        int rc = lease_leader(h->store, &got, err, sizeof(err));
        if (rc < 0)
            store_error(h, err);
        else if (rc == 1)
            saw(h, &got);
        return;
    }
    int rc = lease_acquire(h->store, h->address, h->owner, h->ttl_ms, h->seen, &got, err,
                           sizeof(err));
    if (rc < 0) {
        store_error(h, err);
        return;
    }
    store_ok(h);
    saw(h, &got);
    if (rc == 0)
        return;
    h->mine = got;
    pthread_mutex_lock(&h->mu);
    h->view.leader = true;
    h->view.epoch = got.epoch;
    h->view.takeovers++;
    pthread_mutex_unlock(&h->mu);
    umbp_log(UMBP_LOG_INFO, "umbp-master: took the lease in %s: leading as %s, epoch %" PRIu64,
             lease_url_of(h->store), h->address, got.epoch);
    ring(h);
}

/* Leader: one renewal. */
static void renew(struct master_ha *h)
{
    struct lease_holder other;
    char err[512];
    uint64_t t0 = umbp_now_ns();
    int rc = lease_renew(h->store, &h->mine, h->ttl_ms, &other, err, sizeof(err));
    uint64_t ns = umbp_now_ns() - t0;
    if (rc < 0) {
        store_error(h, err);
        return;
    }
    store_ok(h);
    if (rc == 1) {
        pthread_mutex_lock(&h->mu);
        h->view.renews++;
        h->view.renew_ns_sum += ns;
        if (ns > h->view.renew_ns_max)
            h->view.renew_ns_max = ns;
        h->view.holder = h->mine;
        pthread_mutex_unlock(&h->mu);
        return;
    }
    if (other.epoch)
        saw(h, &other);
    else if (h->mine.epoch + 1 > h->seen)
        h->seen = h->mine.epoch + 1; /* the counter passed ours */
    umbp_log(UMBP_LOG_WARN, "umbp-master: lost the lease (epoch %" PRIu64 ") in %s: %s%s%s; "
             "stepping down", h->mine.epoch, lease_url_of(h->store),
             other.epoch ? other.address : "a later epoch was handed out",
             other.epoch ? " leads now" : "", other.epoch ? "" : " while this master was away");
    memset(&h->mine, 0, sizeof(h->mine));
    pthread_mutex_lock(&h->mu);
    h->view.leader = false;
    h->view.epoch = 0;
    pthread_mutex_unlock(&h->mu);
    ring(h);
}

static void *run(void *arg)
{
    struct master_ha *h = arg;
    pthread_setname_np(pthread_self(), "umbp-lease");
    for (;;) {
        if (h->mine.epoch)
            renew(h);
        else
            try_acquire(h);
        /* a leader that cannot reach the store tries as often as a standby,
         * so it re-takes its key first when the store comes back empty */
        if (nap(h, h->mine.epoch && !h->warned ? h->renew_ms : h->retry_ms))
            break;
    }
    return NULL;
}

int ha_start(struct umbp_master *m, const char *address, struct master_ha **out, char *err,
             size_t errlen)
{
    struct master_ha *h = calloc(1, sizeof(*h));
    if (!h)
        return -ENOMEM;
    h->m = m;
    h->ttl_ms = (uint64_t)m->o.lease_ttl_ms;
    h->renew_ms = h->ttl_ms / 3;
    h->retry_ms = h->ttl_ms / 10;
    h->retry_ms = h->retry_ms < 50 ? 50 : h->retry_ms > 500 ? 500 : h->retry_ms;
    snprintf(h->address, sizeof(h->address), "%s", address);
    char host[128] = "";
    gethostname(host, sizeof(host) - 1);
    for (char *p = host; *p; p++)
        if (*p <= ' ' || *p > '~')
            *p = '_';
    unsigned char r[8];
    randombytes_buf(r, sizeof(r));
    snprintf(h->owner, sizeof(h->owner), "%.60s/%ld/%02x%02x%02x%02x%02x%02x%02x%02x", host,
             (long)getpid(), r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&h->mu, NULL);
    int rc = lease_open(m->o.lease_url, (uint64_t)m->o.lease_timeout_ms, &h->store, err, errlen);
    if (rc < 0) {
        ha_stop(h);
        return rc;
    }
    if ((rc = pthread_create(&h->th, NULL, run, h)) != 0) {
        snprintf(err, errlen, "cannot start the lease thread: %s", strerror(rc));
        ha_stop(h);
        return -rc;
    }
    h->started = true;
    umbp_log(UMBP_LOG_INFO, "umbp-master: standby as %s (owner %s) until it takes the lease "
             "in %s", h->address, h->owner, m->o.lease_url);
    *out = h;
    return 0;
}

void ha_stop(struct master_ha *h)
{
    if (!h)
        return;
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->stop = true;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->th, NULL);
    }
    if (h->store && h->mine.epoch) {
        char err[512];
        if (lease_release(h->store, &h->mine, err, sizeof(err)) < 0)
            umbp_log(UMBP_LOG_WARN, "umbp-master: cannot release the lease: %s (a standby "
                     "takes it when it expires)", err);
        else
            umbp_log(UMBP_LOG_INFO, "umbp-master: released the lease (epoch %" PRIu64 ")",
                     h->mine.epoch);
    }
    lease_close(h->store);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

void ha_view(struct master_ha *h, struct ha_view *out)
{
    pthread_mutex_lock(&h->mu);
    *out = h->view;
    pthread_mutex_unlock(&h->mu);
}
