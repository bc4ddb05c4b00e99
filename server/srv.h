/*
 * srv.h - umbp-server's private structures, shared by its files:
 *
 *   server.c    create / run / stop / destroy; the housekeeping timer
 *               (lease expiry, watermark eviction)
 *   listen.c    the socket directory, the lock that keeps one server per
 *               socket path, the listening socket (net/listen.c), the words
 *               of a refused connection
 *   session.c   one client over net/service.c (which owns its socket,
 *               buffers, frame loop, pause and deadlines): the service's
 *               options and hooks, the run queue, disconnect (its leases
 *               and reservations end)
 *   requests.c  the handshake, one handler per request type, the role
 *               tables (which role may send what), slicing
 *   events.c    STORED / REMOVED fan-out to the sessions that asked for it
 *   track.c     a session's reservations and leases, keyed by token
 *   metrics.c   the /metrics endpoint (metrics_port), its HTTP thread
 *   server_config.c  the options (also used by the umbp tool)
 *   sync_client.c    a blocking client for the umbp tool and the tests
 *
 * Fairness: one loop turn handles at most SRV_SLICE_RECORDS records of one
 * session (a frame's records, or one per frame without records).  A frame
 * of more is handled in slices: its reply is built in the session's
 * `reply` buffer slice by slice and appended to `out` whole when the last
 * slice is done (events for that session wait in `held` meanwhile, so they
 * still follow the reply they came from).  A session with work left (a
 * frame part handled, or whole frames over its budget) is queued on the
 * server's run queue and not read; an ev_idle of the highest priority
 * gives every queued session one more slice per loop turn, round-robin,
 * after which the loop polls every socket again.  So a 65,536-key frame
 * delays another client's request by one slice, not by the whole frame,
 * and a session's replies still leave in request order.  (While any
 * session is queued, the idle watchers of lower priority, background
 * eviction and poll_wait, wait; the housekeeping tick still evicts a slice
 * per tick.)
 *
 * Timeouts: one ev_timer per session bounds a handshake (HELLO within
 * handshake_timeout_ms of the connect) and a frame (its last byte within
 * frame_timeout_ms of its first); it runs only while such a wait is on,
 * never while the server itself is not reading the session (paused,
 * queued), and never for a greeted session whose input is all whole
 * frames: an idle engine stays connected.
 *
 * Threads: the loop thread that runs umbp_server_run owns every field of
 * every struct here; only the ev_async `stop_w` is poked from outside
 * (and metrics.c's own ev_async, from its HTTP thread: see metrics.c).
 * populate_pool's thread (server.c) reads only the pool's mapping and
 * populate_stop, and is joined before the pool is unmapped.
 * Functions that can end a session return a negative code instead of
 * freeing it; only the libev callbacks (the tops of the call chains) call
 * session_close, so no caller ever touches a freed session.
 */
#ifndef UMBP_SERVER_SRV_H
#define UMBP_SERVER_SRV_H

#include <ev.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "listen.h"
#include "node.h"
#include "proto.h"
#include "service.h"
#include "server_config.h"
#include "store.h"
#include "store_ops.h"

/* A session's unsent output is bounded: above SRV_OUT_PAUSE the session's
 * requests wait (its socket is not read) until the output drains below
 * SRV_OUT_RESUME, so replies alone stay near PAUSE; a backlog above
 * SRV_OUT_MAX (events pile up, the client is not reading) disconnects it. */
#define SRV_OUT_PAUSE (4u << 20)
#define SRV_OUT_RESUME (1u << 20)
#define SRV_OUT_MAX (64u << 20)
#define SRV_IN_INITIAL (64u << 10)
#define SRV_EVICT_INLINE_MAX 4096 /* objects one reserve may evict for its key */
#define SRV_EVICT_SLICE 1024      /* objects one background slice evicts */
#define SRV_SLICE_RECORDS 4096    /* records one session handles per loop turn */

/* Tokens a session holds, keyed by token (track.c).  Reservations keep
 * their key (abort needs it); leases keep nothing. */
struct srv_track_slot {
    uint64_t token;                /* 0: empty */
    umbp_key_t key;                /* reservations only */
};

struct srv_track {
    struct srv_track_slot *slots;  /* open addressing, linear probing */
    size_t cap;                    /* a power of two */
    bool keep_keys;
    uint64_t n;
};

struct umbp_server;
struct srv_metrics;

/* The frame at the head of a session's input while it is handled in
 * slices (see Fairness above).  A handler does records [from, to) and
 * writes its reply into *out: &ss->out when the whole frame fits this
 * turn, else &ss->reply, where the frame stays open between slices. */
struct srv_batch {
    struct proto_buf *out;
    uint32_t from, to;
    bool open;                     /* a slice is done and more are due */
    bool may_evict;                /* RESERVE: an inline eviction may still free room */
    bool rewind;                   /* the slice waited (SRV_WAIT): run it again */
    uint64_t busy_ns;              /* handling time of its slices so far */
};

/* A client: net/service.c's connection (socket, buffers, deadline, role)
 * and what the server keeps for it. */
struct srv_session {
    struct net_conn conn;          /* first: to_session() */
    struct umbp_server *srv;
    bool events;                   /* asked for EVENTS frames */
    struct proto_hello hello;
    uint64_t write_deadline_ns;    /* hello.write_deadline_ms: a reservation's
                                      writer is done by grant + this */
    unsigned ns;                   /* the store namespace of hello.name_space */
    uint64_t events_lost;          /* dropped since the last EVENTS frame */
    uint64_t requests;
    struct srv_track reservations, leases;
    struct srv_batch batch;
    struct proto_buf reply;        /* a sliced frame's reply being built */
    struct proto_buf held;         /* EVENTS frames waiting for that reply */
    struct srv_session *run_next;  /* on the run queue while conn.held */
    /* a node's server (node.h): this slice's keys the store lacked, asked
     * of the cluster; node_idx maps a slice record to its key in the call
     * (UINT32_MAX: not asked) */
    bool node_asked;
    struct srv_node_call *node_call;
    uint32_t *node_idx;
};

static inline struct srv_session *to_session(struct net_conn *c)
{
    return (struct srv_session *)c;
}

static inline bool session_greeted(const struct srv_session *ss)
{
    return ss->conn.role != NULL;
}

/* Every session: for (SESSIONS_EACH(s, ss)) ... (ss may not be closed in
 * the body; events.c keeps the next one itself). */
#define SESSIONS_EACH(s, ss)                                                            \
    struct srv_session *ss = (struct srv_session *)(s)->svc.conns; ss;                  \
    ss = (struct srv_session *)ss->conn.next

struct srv_counters {
    uint64_t lookups, lookup_keys, lookup_hits;
    uint64_t reserves, publishes, acquires, acquire_hits;
    uint64_t protocol_errors, refused_connections;
};

struct umbp_server {
    struct srv_config *cfg;
    /* namespaces: id -> name ("" is 0, the default); ids 1.. are the
     * namespace_quotas entries, then those of an adopted pool's objects,
     * then names as sessions declare them */
    char ns_names[DRAM_STORE_MAX_NS][PROTO_NAME_MAX];
    unsigned nns;
    bool ns_full_warned;
    struct ev_loop *loop;
    struct dram_store *store;        /* the pool's store: server.c, metrics.c */
    struct srv_store st;             /* what requests and sessions use (store_ops.h) */
    const struct dram_pool *pool;
    uint64_t pool_id;
    uint64_t lease_ttl_ms;           /* the cap on a client's lease ttl */
    char dir[SHM_PATH_MAX];
    char sock_path[SHM_PATH_MAX];
    char lock_path[SHM_PATH_MAX + 8];
    int lock_fd;
    struct net_listener listener;    /* net/listen.h */
    struct net_service svc;          /* accept, sessions' I/O (net/service.h) */
    ev_async stop_w;
    ev_timer tick_w;                 /* lease expiry, eviction check */
    ev_idle evict_w;                 /* more eviction slices while idle */
    /* poll_wait (core option): for SRV_POLL_NS after a request the loop
     * polls instead of sleeping, so a client's next request (the publish
     * after a reserve, the release after an acquire) is taken without a
     * wake-up, and for up to SRV_POLL_PENDING_NS after a store's or a
     * read's request while any session holds reservations (its publishes
     * follow its copies; workers' spares are held all the time, so only a
     * request of the data path counts: an idle worker's STATS does not keep
     * the loop polling); only where cores are to spare */
    ev_idle poll_w;
    bool may_spin;
    uint64_t last_request_ns;
    uint64_t last_data_ns;           /* the last request of the data path */
    uint64_t poll_recheck_ns;        /* next walk of the sessions */
    ev_prepare flush_w;              /* events out, once per loop iteration */
    /* populate_pool: the thread that allocates the pool's pages after the
     * server starts serving (server.c); it only reads pool and populate_stop */
    pthread_t populate_thread;
    bool populate_started;
    _Atomic bool populate_stop;
    ev_idle run_w;                   /* a slice for each queued session per turn */
    struct srv_session *runq, **runq_tail;
    size_t nrunq;
    bool evicting;                   /* above high: evicting down to low */
    uint64_t subscribers;            /* sessions with events */
    struct proto_event_item *events; /* this iteration's events */
    size_t nevents, events_cap;
    uint64_t events_unqueued;        /* events no memory could queue */
    bool any_lost;                   /* a subscriber has events_lost > 0 */
    struct srv_counters c;
    struct srv_metrics *metrics;     /* NULL: metrics_port 0 */
    struct srv_node *node;           /* master_address: a node of a cluster (node.h) */
};

/* server.c: the namespace id of a name (new names get the next id; when
 * all are taken, 0 and one warning). */
unsigned srv_namespace_id(struct umbp_server *s, const char *name);

/* server.c: a request was handled (keeps the loop polling a while). */
void srv_note_request(struct umbp_server *s);

/* listen.c */
int srv_listen_open(struct umbp_server *s, char *err, size_t errlen);
int srv_listen_bind(struct umbp_server *s, char *err, size_t errlen);
/* Stops listening and removes the socket; with release_lock also the
 * lock file.  Idempotent. */
void srv_listen_close(struct umbp_server *s, bool release_lock);

/* session.c */
/* The sessions' service (net/service.c) with the server's options and
 * hooks; create runs it once the loop exists. */
void session_service_init(struct umbp_server *s);
/* A session on an accepted fd as accept opens it after its checks (the
 * fuzz target's way in).  NULL: no memory. */
struct srv_session *session_open(struct umbp_server *s, int fd, pid_t pid, uid_t uid,
                                 gid_t gid);
/* Ends the session: every lease it holds is released now, and every
 * reservation orphaned (its region kept until its writer's deadline: the
 * client may still be copying); one log line with why. */
void session_close(struct srv_session *ss);
/* The server's run queue watcher (init once, stop at destroy). */
void session_runq_init(struct umbp_server *s);
void session_runq_stop(struct umbp_server *s);
/* Sends what it can now; arms or disarms the write watcher.  < 0: the
 * session must be closed (why says why). */
static inline int session_flush(struct srv_session *ss) { return net_conn_flush(&ss->conn); }
static inline size_t session_backlog(const struct srv_session *ss)
{
    return net_conn_backlog(&ss->conn);
}
/* A worker greeted: with session_warm_keys N > 0, room for N reservations
 * and N leases in its token tables, and in its reply and output buffers
 * for a reply of N regions, every page of them touched, and of its input
 * buffer as much as a request of N tokens takes, so that its first
 * requests fault no memory in and grow no table.  Unwarmed, the first
 * restore of a 10,000-token prefix on an H200 host spent 199-300 us in the
 * server's ACQUIRE against 101-183 warmed (steady 89-162), and a 2-vCPU
 * VM's first store paid 200-300 us in two of its RESERVEs.  Without memory
 * nothing changes: they grow when needed, as they would anyway. */
void session_warm(struct srv_session *ss);
/* A sliced frame's reply is complete in `reply`: it, then the EVENTS held
 * for the session meanwhile, go to `out`.  0, -ENOMEM. */
int session_reply_done(struct srv_session *ss);
/* "session 7 (pid 123)" for log lines. */
#define SESSION_FMT "session %llu (pid %d)"
#define SESSION_ARGS(ss) (unsigned long long)(ss)->conn.id, (int)(ss)->conn.pid

/* listen.c: the service's accept hooks (refusals, accept errors). */
void srv_listen_refuse(struct net_service *svc, int fd, const struct ucred *cr,
                       enum net_refusal why, int err);
void srv_listen_accept_error(struct net_service *svc, int err, double retry_s);

/* requests.c: the handshake (the service's on_hello: picks the role whose
 * frame table applies from then on) and one slice of a frame (the
 * service's run: records [from, to), at most *budget of them; *budget is
 * charged what was done, at least 1).  Both return 0: done; NET_MORE:
 * records are left, call again with the same frame; NET_CLOSE when the
 * session must end after its output is flushed (HELLO_ERR sent, out of
 * memory; why says why); or -EPROTO with `what` naming the field when the
 * frame is malformed. */
#define SRV_CLOSE NET_CLOSE
#define SRV_MORE NET_MORE
#define SRV_WAIT NET_WAIT /* the slice waits for the cluster (node.h) */
int srv_handle_hello(struct net_conn *c, const struct proto_frame *f, char *what,
                     size_t whatlen);
int srv_run_frame(struct net_conn *c, net_frame_fn h, const struct proto_frame *f,
                  uint32_t *budget);
/* requests.c: the store's reserve, evicting for this key once when the pool
 * is full (a client's RESERVE, and a node's fetch: node.c). */
int srv_reserve_evicting(struct umbp_server *s, unsigned ns, const umbp_key_t *key,
                         uint64_t size, uint64_t until, bool ahead, struct srv_region *r,
                         bool *may_evict);
/* requests.c: frees what a slice asked the cluster (node.h). */
void srv_node_slice_done(struct srv_session *ss);

/* server.c: starts background eviction if usage is above the high
 * watermark. */
void srv_evict_check(struct umbp_server *s);

/* events.c */
void srv_events_emit(void *ctx, umbp_event_type_t type, const umbp_key_t *key, uint64_t size);
void srv_events_flush(struct umbp_server *s);
void srv_events_subscribe(struct srv_session *ss);
void srv_events_unsubscribe(struct srv_session *ss);

/* track.c */
int track_init(struct srv_track *t, bool keep_keys);
/* Room for `tokens` without a growth, the table's pages touched: 0 or
 * -ENOMEM (the table as it was). */
int track_presize(struct srv_track *t, size_t tokens);
void track_fini(struct srv_track *t);
/* 0, -ENOMEM; token 0 and ~0 are never handed out by the store. */
int track_add(struct srv_track *t, uint64_t token, const umbp_key_t *key);
/* true if token was tracked (with key, when keys are kept): it is no more. */
bool track_take(struct srv_track *t, uint64_t token, const umbp_key_t *key);
/* Calls fn for every token and forgets them all. */
void track_drain(struct srv_track *t, void (*fn)(void *arg, uint64_t token,
                                                 const umbp_key_t *key), void *arg);

#endif /* UMBP_SERVER_SRV_H */
