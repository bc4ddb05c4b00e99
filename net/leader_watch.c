/*
 * leader_watch.c - the leader as the lease store says, read by a thread
 * (leader_watch.h).  The thread owns the store connection (struct lease);
 * holder, why, max_epoch and the poke flag are shared under mu.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "leader_watch.h"
#include "util.h"

#define POKE_MIN_MS 20

struct leader_watch {
    struct leader_watch_config cfg;
    char url[LEASE_URL_MAX];
    struct lease *store;              /* the thread's */
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;                /* CLOCK_MONOTONIC */
    bool stop, poked;
    bool have;                        /* holder is a read */
    struct lease_holder holder;
    char why[LEASE_URL_MAX + 400];
    uint64_t max_epoch;
};

static bool same(const struct lease_holder *a, const struct lease_holder *b)
{
    return a->epoch == b->epoch && strcmp(a->address, b->address) == 0;
}

/* One read of the store; on_change if the holder changed. */
static void read_once(struct leader_watch *w)
{
    struct lease_holder h;
    char err[512];
    int rc = lease_leader(w->store, &h, err, sizeof(err));
    pthread_mutex_lock(&w->mu);
    bool had = w->have, changed;
    struct lease_holder old = w->holder;
    uint64_t went_back = 0;
    if (rc == 1) {
        w->have = true;
        w->holder = h;
        /* epochs only rise in a store that lives on; one that shows a lower
         * leader was emptied (a restart without persistence): it is the
         * authority, so its leader is followed from there on, not refused
         * as deposed for good */
        if (h.epoch < w->max_epoch)
            went_back = w->max_epoch;
        if (h.epoch > w->max_epoch || went_back)
            w->max_epoch = h.epoch;
        changed = !had || !same(&old, &h);
    } else {
        w->have = false;
        if (rc == 0)
            snprintf(w->why, sizeof(w->why), "no umbp-master holds the lease in %s", w->url);
        else
            snprintf(w->why, sizeof(w->why), "cannot read the leader: %s", err);
        changed = had;
    }
    pthread_mutex_unlock(&w->mu);
    if (went_back)
        umbp_log(UMBP_LOG_WARN, "%s names %s with epoch %llu, below the %llu it showed before: "
                 "the store was emptied; following its leader", w->url, h.address,
                 (unsigned long long)h.epoch, (unsigned long long)went_back);
    if (rc < 0 && had)
        umbp_log(UMBP_LOG_WARN, "%s (the last leader known: %s, epoch %llu)", err, old.address,
                      (unsigned long long)old.epoch);
    if (changed && w->cfg.on_change)
        w->cfg.on_change(w->cfg.arg);
}

static void deadline_in(struct timespec *ts, uint64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void *run(void *arg)
{
    struct leader_watch *w = arg;
    pthread_setname_np(pthread_self(), "umbp-leader");
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec ts;
        deadline_in(&ts, w->cfg.poll_ms);
        while (!w->stop && !w->poked &&
               pthread_cond_timedwait(&w->cv, &w->mu, &ts) != ETIMEDOUT)
            ;
        if (w->stop)
            break;
        bool poked = w->poked;
        w->poked = false;
        pthread_mutex_unlock(&w->mu);
        read_once(w);
        if (poked) { /* rate limit: a storm of failed dials is one read per 20 ms */
            struct timespec rl = {.tv_nsec = POKE_MIN_MS * 1000000L};
            nanosleep(&rl, NULL);
        }
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int leader_watch_start(const struct leader_watch_config *cfg, struct leader_watch **out,
                       char *err, size_t errlen)
{
    struct leader_watch *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->cfg = *cfg;
    snprintf(w->url, sizeof(w->url), "%s", cfg->url);
    w->cfg.url = w->url;
    if (!w->cfg.poll_ms)
        w->cfg.poll_ms = 250;
    if (!w->cfg.timeout_ms)
        w->cfg.timeout_ms = 500;
    int rc = lease_open(w->url, w->cfg.timeout_ms, &w->store, err, errlen);
    if (rc < 0) {
        free(w);
        return rc;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&w->mu, NULL);
    snprintf(w->why, sizeof(w->why), "the leader in %s was not read yet", w->url);
    void (*cb)(void *) = w->cfg.on_change;
    w->cfg.on_change = NULL; /* the first read is not news */
    read_once(w);
    w->cfg.on_change = cb;
    if ((rc = pthread_create(&w->th, NULL, run, w)) != 0) {
        snprintf(err, errlen, "cannot start the leader watch: %s", strerror(rc));
        leader_watch_stop(w);
        return -rc;
    }
    w->started = true;
    *out = w;
    return 0;
}

void leader_watch_stop(struct leader_watch *w)
{
    if (!w)
        return;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->th, NULL);
    }
    lease_close(w->store);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

int leader_watch_get(struct leader_watch *w, struct lease_holder *out, char *why, size_t len)
{
    pthread_mutex_lock(&w->mu);
    int rc = w->have ? 1 : 0;
    if (rc)
        *out = w->holder;
    else if (why && len)
        snprintf(why, len, "%s", w->why);
    pthread_mutex_unlock(&w->mu);
    return rc;
}

uint64_t leader_watch_max_epoch(struct leader_watch *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t e = w->max_epoch;
    pthread_mutex_unlock(&w->mu);
    return e;
}

void leader_watch_poke(struct leader_watch *w)
{
    pthread_mutex_lock(&w->mu);
    w->poked = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

const char *leader_watch_url(const struct leader_watch *w) { return w->url; }
