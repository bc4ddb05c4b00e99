/*
 * leader_watch.h - a client's view of which umbp-master leads, read from
 * the lease store (leader_lease.h) by a thread of its own, so no caller's thread
 * (a runtime's loop, an engine's scheduler) ever waits on the store.
 *
 * The thread reads the leader every poll_ms, and at once (at most every
 * 20 ms) when poked (a dial failed, a master refused us).  It keeps the
 * last holder read and the highest epoch the store has shown: a master
 * below it is deposed and must be refused (a master's own claim never
 * raises it).  on_change runs on the watch's thread, without its
 * lock, when the holder read differs from the last one (epoch or
 * address); it must not block (an ev_async_send).
 *
 * Threads: start and stop on the owner's thread; get, max_epoch and poke
 * from any thread (a mutex).
 */
#ifndef UMBP_NET_LEADER_WATCH_H
#define UMBP_NET_LEADER_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "leader_lease.h"

struct leader_watch_config {
    const char *url;                  /* redis://host:port/<cluster> */
    uint64_t poll_ms;                 /* between reads (0: 250) */
    uint64_t timeout_ms;              /* each read's bound (0: 500) */
    void (*on_change)(void *arg);     /* optional */
    void *arg;
};

struct leader_watch;

/* Starts the thread; its first read is done before this returns, bounded
 * by timeout_ms (so a client's first dial knows the leader).  0, or
 * -EINVAL / -ENOTSUP (the URL, named in err) or -errno. */
int leader_watch_start(const struct leader_watch_config *cfg, struct leader_watch **out,
                       char *err, size_t errlen);
void leader_watch_stop(struct leader_watch *w);

/* The last holder read: 1 and *out; 0 and why (nobody holds the lease, or
 * the store's error). */
int leader_watch_get(struct leader_watch *w, struct lease_holder *out, char *why, size_t len);
/* The highest epoch the store has shown (0: none yet); back to the store's
 * leader's when the store shows a lower one (it was emptied). */
uint64_t leader_watch_max_epoch(struct leader_watch *w);
/* Read again now (rate-limited). */
void leader_watch_poke(struct leader_watch *w);
const char *leader_watch_url(const struct leader_watch *w);

#endif /* UMBP_NET_LEADER_WATCH_H */
