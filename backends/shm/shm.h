/*
 * shm.h - the shm tier's private structures: one connection to the
 * umbp-server of this host (standalone mode) and the FIFO of calls waiting
 * for its replies.
 *
 * Files: shm_tier.c (the vtable and the members), shm_calls.c (frames out,
 * replies in, deadlines), shm_conn.c (the socket on the loop: read/write
 * watchers, losing and regaining the server, the socket_dir watch),
 * shm_attach.c (creation: find or start the server, the blocking
 * handshake).
 *
 * Threads.  Everything here belongs to the runtime's loop thread, except
 * during create and destroy (the creating thread, loop not running) and the
 * `maps` fields, which mapped_memory reads from a caller's thread under
 * map_lock.
 *
 * Invariants.
 *  - The server answers one session in order, so the FIFO head is the call
 *    the next reply belongs to; a call is {frames} request frames with
 *    consecutive sequence numbers, answered by as many replies.
 *  - done fires exactly once per call: when its last reply is handled, at its
 *    deadline (UMBP_E_TIMEOUT; the call stays queued as an orphan so that its
 *    late replies are consumed and undone), when the connection is lost
 *    (-ECONNRESET), or at stop (UMBP_E_NOT_ATTEMPTED).  Before calling done
 *    the call is out of every list it will be looked for in (or marked
 *    orphan), so a done callback may call the tier again.
 *  - Nothing is torn down from inside a member: a member that meets a dead
 *    socket arms `fail_timer`, and the loss is handled on the next loop
 *    iteration.
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
#include "shm_config.h"
#include "umbp/tier.h"

enum shm_kind {
    SHM_LOOKUP,
    SHM_RESERVE,
    SHM_PUBLISH,
    SHM_ACQUIRE,
    SHM_RELEASE,
    SHM_CLEAR,
    SHM_STATS, /* internal: refreshes usage(); no done */
    SHM_UNDO,  /* internal: releases a late lease; reply ignored */
};

struct shm_call {
    struct shm_call *next;
    enum shm_kind kind;
    uint16_t reply_type;      /* of the data frames */
    uint64_t first_seq;
    uint32_t frames;          /* request frames, the trailing STATS included */
    uint32_t data_frames;     /* frames carrying items (the others: STATS) */
    uint32_t answered;
    size_t n;                 /* items */
    struct umbp_tier_req **reqs; /* own copy of the pointers; NULL once orphaned */
    uint8_t *present;         /* lookup */
    umbp_key_t *keys;         /* orphaned reserve/acquire: to undo a late grant;
                                 SHM_UNDO: the leases' keys */
    uint64_t *tokens;         /* SHM_UNDO: the leases' tokens */
    umbp_tier_done_fn done;
    void *arg;
    int status;               /* clear: CLEAR_R's status */
    uint64_t sent_ns, deadline_ns; /* deadline 0: none (internal) */
    uint64_t lease_ns;        /* acquire: the lease asked for */
    bool orphan;
};

enum shm_state {
    SHM_DISCONNECTED, /* waiting for the backoff timer */
    SHM_CONNECTING,   /* non-blocking connect in progress */
    SHM_HELLO,        /* HELLO sent, HELLO_OK awaited */
    SHM_CONNECTED,
    SHM_STOPPED,      /* stop() ran: every call refused */
};

struct shm_map {
    void *addr;
    uint64_t size, pool_id;
};

struct shm_tier {
    struct umbp_tier base;
    struct shm_config cfg;
    char path[SHM_PATH_MAX];
    bool worker;              /* role worker: maps the pool */

    enum shm_state state;
    int fd;
    uint64_t epoch;           /* bumped per HELLO_OK; region.aux[0] */
    uint64_t server_lease_ms; /* HELLO_OK: the server's cap on a lease */
    uint64_t next_seq;
    struct proto_buf out;
    uint8_t *in;
    size_t in_off, in_len, in_cap; /* unparsed bytes: in[in_off, in_len) */
    int pending_fd;           /* an fd that came with the bytes in `in` */

    struct shm_call *head, *tail;
    uint32_t stats_inflight;  /* STATS frames sent, not yet answered */
    struct proto_stats stats;
    bool have_stats;

    /* the pool: maps[0..nmaps) every mapping ever made, the last one current */
    pthread_mutex_t map_lock;
    struct shm_map *maps;
    size_t nmaps;
    bool mapped_out;          /* mapped_memory() handed the current one out */

    ev_io rio, wio;
    ev_timer deadline_timer;  /* the earliest call deadline (lazily) */
    ev_timer stats_timer;     /* periodic STATS */
    ev_timer reconnect_timer; /* backoff; handshake bound while connecting */
    ev_timer fail_timer;      /* a member met a dead socket */
    ev_idle poll_w;           /* with may_spin: the loop polls while calls are
                                 outstanding, so a reply is taken without a
                                 wake-up (poll_wait, as the runtime's own) */
    bool may_spin;
    int fail_errno;
    uint64_t backoff_ms;
    uint64_t lost_ns;         /* when the server was lost; 0 when never */
    char last_why[128];       /* why the last reconnect attempt failed */
    /* while disconnected, the socket's directory is watched (inotify): the
     * socket (re)appearing starts an attempt at once, then quick retries
     * (1, 2, 4 ms: the server binds before it listens); the backoff timer
     * stays the fallback */
    int ino_fd;               /* -1: not yet needed; -2: unavailable or stopped */
    int ino_wd;               /* the directory's watch; -1: none (connected,
                                 or the directory is gone: re-added per attempt) */
    ev_io ino_w;
    const char *sock_name;    /* the socket's name within the directory */
    unsigned quick_left;      /* quick retries left after the socket appeared */
    uint64_t quick_ms;
    bool quick_armed;         /* reconnect_timer holds a quick retry */
    bool by_dir;              /* the attempt under way came from the directory */
    uint64_t fast_stats_until_ns; /* a reserve met a full pool: poll faster */
};

static inline struct shm_tier *to_shm_tier(struct umbp_tier *t)
{
    return umbp_container_of(t, struct shm_tier, base);
}

extern const struct umbp_tier_ops umbp_tier_shm_ops;

/* ---- shm_attach.c: creation (caller's thread, may block) ----------------- */

/* Connects to (or auto-starts) the server and completes the blocking
 * handshake; on success st->fd is a connected non-blocking socket, the pool
 * is mapped and st->stats filled. */
int shm_attach(struct shm_tier *st, char *err, size_t errlen);
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
/* The HELLO record this tier sends; shm_send_hello appends it to st->out. */
void shm_hello_fill(const struct shm_tier *st, struct proto_hello *h);
int shm_send_hello(struct shm_tier *st);
/* HELLO_OK (with st->pending_fd) or HELLO_ERR: adopts the pool or fails
 * naming the server's message. */
int shm_hello_reply(struct shm_tier *st, const struct proto_frame *f, bool *same, char *err,
                    size_t errlen);
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

/* ---- shm_calls.c: the FIFO (loop thread) ---------------------------------- */

struct shm_call *shm_call_new(struct shm_tier *st, enum shm_kind kind,
                              struct umbp_tier_req *const *reqs, size_t n, umbp_tier_done_fn done,
                              void *arg);
/* Appends the call's frames to st->out (arg: LOOKUP flags / ACQUIRE ttl),
 * queues it and writes.  Completes it with an error inline if the frames
 * cannot be built. */
void shm_call_send(struct shm_tier *st, struct shm_call *c, uint32_t arg, bool trailing_stats);
void shm_call_free(struct shm_call *c);
/* One reply or unsolicited frame; negative = protocol error (err says why). */
int shm_handle_frame(struct shm_tier *st, const struct proto_frame *f, char *err, size_t errlen);
/* Completes every queued call with rc (orphans dropped) and empties the FIFO. */
void shm_calls_fail_all(struct shm_tier *st, int rc);
void shm_deadline_arm(struct shm_tier *st, uint64_t deadline_ns);
void shm_on_deadline(struct ev_loop *loop, ev_timer *w, int revents);
/* RELEASE of leases whose reply is not waited for. */
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

/* ---- shm_conn.c: the socket on the loop ------------------------------------ */

void shm_conn_init(struct shm_tier *st);
/* The input buffer (also used by the blocking handshake).  shm_in_read: one
 * recvmsg into it: bytes, 0 on EOF, -EAGAIN, -errno (-EPROTO: an fd too
 * many).  shm_in_next: the next whole frame in it: its size, 0 if none
 * yet, negative if malformed (err says why).  shm_in_consume drops it. */
long shm_in_read(struct shm_tier *st);
long shm_in_next(struct shm_tier *st, struct proto_frame *f, char *err, size_t errlen);
void shm_in_consume(struct shm_tier *st, long bytes);
/* Starts the watchers on a connected socket (also from create). */
void shm_conn_start(struct shm_tier *st);
/* Tries to write st->out now; arms the write watcher for the rest. */
void shm_conn_flush(struct shm_tier *st);
/* The connection is gone: complete every call, close, schedule a reconnect. */
void shm_conn_lost(struct shm_tier *st, const char *why);
/* Stops every watcher and timer, and closes the directory watch. */
void shm_conn_stop_watchers(struct shm_tier *st);
void shm_conn_close(struct shm_tier *st);
/* The current pool mapping (loop thread). */
static inline const struct shm_map *shm_current_map(const struct shm_tier *st)
{
    return st->nmaps ? &st->maps[st->nmaps - 1] : NULL;
}

#endif
