/*
 * shm.h - the shm tier's private structures: one connection to the
 * umbp-server of this host (standalone mode) and the FIFO of calls waiting
 * for its replies.
 *
 * Files: shm_tier.c (the vtable and the members), shm_calls.c (frames out,
 * replies in, undoing late grants), shm_conn.c (the tier's side of the
 * connection: HELLO, HELLO_OK, EVENTS, what it logs when the server goes
 * and comes back), shm_ahead.c (reservations made ahead of their keys),
 * shm_attach.c (creation: find or start the server, the
 * blocking handshake).  The connection itself - the FIFO of calls,
 * deadlines, orphans, reconnecting with backoff, the socket_dir watch - is
 * a client session of net/ (net/session.h) on the runtime's loop
 * (net/session_ev.h).
 *
 * Threads.  Everything here belongs to the runtime's loop thread, except
 * during create and destroy (the creating thread, loop not running) and the
 * `maps` fields, which mapped_memory reads from a caller's thread under
 * map_lock.
 *
 * Invariants.
 *  - The session's rules hold (net/session.h): replies in order, a call is
 *    {frames} request frames with consecutive sequence numbers, done fires
 *    exactly once per call (answered, UMBP_E_TIMEOUT leaving an orphan whose
 *    late grants are undone here, -ECONNRESET, UMBP_E_NOT_ATTEMPTED at
 *    stop), and a done callback may call the tier again.
 *  - Nothing is torn down from inside a member: a member that meets a dead
 *    socket has the driver report it on the next loop iteration.
 *  - Pool mappings are never unmapped while the tier lives: copies in flight
 *    may still use an old one after a reconnect to a new pool.
 */
#ifndef UMBP_SHM_H
#define UMBP_SHM_H

#include <ev.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "fdpass.h"
#include "inbuf.h"
#include "proto.h"
#include "session.h"
#include "session_ev.h"
#include "shm_config.h"
#include "umbp/tier.h"

enum shm_kind {
    SHM_LOOKUP,
    SHM_RESERVE,
    SHM_PUBLISH,
    SHM_PUBLISH_AS, /* some reservations made ahead (shm_ahead.c) */
    SHM_ACQUIRE,
    SHM_RELEASE,
    SHM_CLEAR,
    SHM_STATS, /* internal: refreshes usage(); no done */
    SHM_UNDO,  /* internal: releases a late lease; reply ignored */
};

struct shm_call {
    struct net_call nc;       /* first seq, frames (the trailing STATS
                                 included), answered, deadline, orphan */
    struct shm_tier *st;
    enum shm_kind kind;
    uint16_t reply_type;      /* of the data frames */
    uint32_t data_frames;     /* frames carrying items (the others: STATS) */
    size_t n;                 /* items */
    struct umbp_tier_req **reqs; /* own copy of the pointers; NULL once orphaned */
    uint8_t *present;         /* lookup */
    umbp_key_t *keys;         /* orphaned reserve/acquire: to undo a late grant;
                                 SHM_UNDO: the leases' keys */
    uint64_t *tokens;         /* SHM_UNDO: the leases' tokens */
    umbp_tier_done_fn done;
    void *arg;
    int status;               /* clear: CLEAR_R's status */
    uint64_t lease_ns;        /* acquire: the lease asked for */
};

struct shm_map {
    void *addr;
    uint64_t size, pool_id;
};

/* A reservation made ahead of its key (shm_ahead.c). */
struct shm_spare {
    uint64_t id;              /* its placeholder key's counter (never 0) */
    void *addr;               /* its region in the mapping of its session */
    uint64_t token;
    uint64_t usable_until_ns; /* handed out only before this */
};

/* The spares of one object size. */
struct shm_ahead_size {
    uint64_t size;            /* the object size */
    size_t want;              /* spares to keep: its share of the budget */
    size_t cap;               /* v's room: 2 want at its largest (replacements) */
    struct shm_spare *v;      /* [0, n) in the order granted, oldest first */
    size_t n;
    uint64_t epoch;           /* the session that granted them */
    uint64_t rest_until_ns;   /* its last refill came back short (a full pool, a
                                 quota): none before this but at a check */
};

#define SHM_AHEAD_SIZES 4     /* object sizes with spares, the first hinted */

struct shm_ahead {
    struct shm_ahead_size s[SHM_AHEAD_SIZES];
    unsigned nsizes;          /* sizes hinted and given a share, in order */
    bool filling;             /* a RESERVE for spares is outstanding (one at a time) */
    unsigned turn;            /* the size a refill looks at first (round robin) */
    bool draining;            /* the runtime shuts down: no refill from now on */
    uint8_t prefix[UMBP_KEY_SIZE - 8]; /* placeholder keys: prefix, then the id */
    uint64_t next_id;
    ev_timer timer;           /* refills (when the session is idle), retiring */
    uint64_t taken, filled;   /* spares handed out, spares granted */
};

struct shm_tier {
    struct umbp_tier base;
    struct shm_config cfg;
    char path[SHM_PATH_MAX];
    bool worker;              /* role worker: maps the pool */

    struct net_session sess;  /* the connection, its calls, reconnecting */
    struct net_ev drv;        /* sess on the runtime's loop; drv.fd: the socket
                                 (the blocking attach's, before the loop runs) */
    uint64_t epoch;           /* bumped per HELLO_OK; region.aux[0] */
    uint64_t server_lease_ms; /* HELLO_OK: the server's cap on a lease */
    bool same_pool;           /* the last HELLO_OK kept the pool */
    char name[SHM_PATH_MAX + 32]; /* "umbp-server at <path>", for the logs */

    uint32_t stats_inflight;  /* STATS frames sent, not yet answered */
    struct proto_stats stats;
    bool have_stats;

    /* the pool: maps[0..nmaps) every mapping ever made, the last one current */
    pthread_mutex_t map_lock;
    struct shm_map *maps;
    size_t nmaps;
    bool mapped_out;          /* mapped_memory() handed the current one out */

    ev_timer stats_timer;     /* periodic STATS */
    ev_idle poll_w;           /* with may_spin: the loop polls while calls are
                                 outstanding, so a reply is taken without a
                                 wake-up (poll_wait, as the runtime's own) */
    bool may_spin;
    uint64_t fast_stats_until_ns; /* a reserve met a full pool: poll faster */
    struct shm_ahead ahead;
};

static inline struct shm_tier *to_shm_tier(struct umbp_tier *t)
{
    return umbp_container_of(t, struct shm_tier, base);
}

extern const struct umbp_tier_ops umbp_tier_shm_ops;

/* ---- shm_attach.c: creation (caller's thread, may block) ----------------- */

/* Connects to (or auto-starts) the server and completes the blocking
 * handshake; on success st->drv.fd is a connected non-blocking socket, the pool
 * is mapped and st->stats filled. */
int shm_attach(struct shm_tier *st, char *err, size_t errlen);
/* Writes the session's output, waiting for the socket up to deadline
 * (CLOCK_MONOTONIC, in ms): 0, -ETIMEDOUT, or the socket's error.  Creation
 * and stop only: it blocks the calling thread. */
int shm_flush_blocking(struct shm_tier *st, uint64_t deadline);
/* The write deadline a worker declares at HELLO (proto.h): no copy of ours
 * writes into a region later than this after its grant - an op ends by
 * timeout_ms from its submission, which precedes the grant, and its copies
 * stop at the next chunk once it has (copy.c), or when the connection that
 * granted the region is lost; SHM_WRITE_SLACK_MS covers the chunk or the
 * GPU transfer already under way. */
#define SHM_WRITE_SLACK_MS 1000
static inline uint32_t shm_write_deadline_ms(const struct umbp_core_config *core)
{
    return (uint32_t)core->timeout_ms + SHM_WRITE_SLACK_MS;
}
/* The HELLO record this tier sends; shm_send_hello appends it to the
 * session's output. */
void shm_hello_fill(const struct shm_tier *st, struct proto_hello *h);
int shm_send_hello(struct shm_tier *st);
/* HELLO_OK (with fd, the one that came with it, or -1) or HELLO_ERR: adopts
 * the pool or fails naming the server's message; closes fd either way. */
int shm_hello_reply(struct shm_tier *st, const struct proto_frame *f, int fd, bool *same,
                    char *err, size_t errlen);
/* Adopts a HELLO_OK: checks it, maps the pool (worker) or closes the fd.
 * Loop thread on reconnect, caller's thread at creation. */
int shm_welcome(struct shm_tier *st, const struct proto_frame *f, int fd, bool *same_pool,
                char *err, size_t errlen);
/* connect() met EACCES/EPERM (why): err says whether the socket directory
 * or the socket keeps this process out, with its owner and mode; returns
 * why. */
int shm_denied(const struct shm_tier *st, int why, char *err, size_t errlen);
/* The server's uid must be ours (or root). */
int shm_check_peer(int fd, const char *path, char *err, size_t errlen);

/* ---- shm_calls.c: calls (loop thread) -------------------------------------- */

struct shm_call *shm_call_new(struct shm_tier *st, enum shm_kind kind,
                              struct umbp_tier_req *const *reqs, size_t n, umbp_tier_done_fn done,
                              void *arg);
/* Appends the call's frames to the session's output (arg: LOOKUP flags /
 * ACQUIRE ttl), queues it and writes.  Completes it with an error inline if
 * the frames cannot be built. */
void shm_call_send(struct shm_tier *st, struct shm_call *c, uint32_t arg, bool trailing_stats);
void shm_call_free(struct shm_call *c);
/* The session's on_frame (net/session.h): EVENTS handled (1), ERROR and
 * frames a client never gets refused (negative, err says why), replies
 * left to the FIFO (0). */
int shm_on_frame(struct net_session *s, const struct proto_frame *f, char *err, size_t errlen);
/* An UNDO call (RELEASE frames, no reply awaited) with room for n keys and
 * tokens, to be filled and sent with shm_call_send; NULL (logged: the
 * leases then expire on the server) when out of memory. */
struct shm_call *shm_release_new(struct shm_tier *st, size_t n);
void shm_send_release(struct shm_tier *st, const umbp_key_t *keys, const uint64_t *tokens,
                      size_t n);
/* Sends STATS (unless one is outstanding and !force). */
void shm_stats_request(struct shm_tier *st, bool force);
void shm_on_stats_timer(struct ev_loop *loop, ev_timer *w, int revents);
/* Fire-and-forget frames: ABORT of (key, token) pairs. */
void shm_send_abort(struct shm_tier *st, const umbp_key_t *keys, const uint64_t *tokens,
                    size_t n);

/* ---- shm_ahead.c: reservations made ahead of their keys (loop thread) ---- */

void shm_ahead_init(struct shm_tier *st);
/* The tier's reserve_ahead member: keep spares for objects of size bytes
 * too (the first SHM_AHEAD_SIZES sizes hinted share the budget evenly;
 * nothing when reserve_ahead_bytes is 0). */
void shm_ahead_hint(struct umbp_tier *t, uint64_t size);
/* Grants reqs[0..n) from the spares and returns true when all n can be
 * (their size, enough usable spares, this session's); else false, nothing
 * changed.  A granted region's aux[1] is the spare's id (0: an ordinary
 * reservation): publish and abort name it by its placeholder key. */
bool shm_ahead_take(struct shm_tier *st, struct umbp_tier_req *const *reqs, size_t n);
/* The placeholder key of spare id. */
void shm_ahead_key(const struct shm_tier *st, uint64_t id, umbp_key_t *out);
/* Refill soon (a new session: conn_up). */
void shm_ahead_kick(struct shm_tier *st);
/* The tier's drain member: no refill from now on; true while one is
 * unanswered (the runtime waits for it, so that stop aborts its spares). */
bool shm_ahead_drain(struct shm_tier *st);
/* Spares held, every size. */
uint64_t shm_ahead_held(const struct shm_tier *st);
/* Forget every spare, aborting them at the server when abort_them (stop);
 * a lost session took them with it (conn_down). */
void shm_ahead_drop(struct shm_tier *st, bool abort_them);
void shm_ahead_destroy(struct shm_tier *st);

/* ---- shm_conn.c: the tier's side of the connection ---------------------------- */

/* The session and its driver (not started), the poll watcher. */
void shm_conn_init(struct shm_tier *st);
/* Starts the driver on the socket shm_attach connected (also the periodic
 * STATS); the session is adopted as connected. */
void shm_conn_start(struct shm_tier *st);
/* stop, destroy: every watcher off, no reconnecting after this. */
void shm_conn_stop_watchers(struct shm_tier *st);
/* A call went out: with may_spin, the loop polls for its reply. */
void shm_conn_poll(struct shm_tier *st);
/* The current pool mapping (loop thread). */
static inline const struct shm_map *shm_current_map(const struct shm_tier *st)
{
    return st->nmaps ? &st->maps[st->nmaps - 1] : NULL;
}

#endif
