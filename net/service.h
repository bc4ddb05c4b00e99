/*
 * service.h - one listening service of the wire protocol: accept, the peer
 * check and the connection cap, each connection's input buffer (inbuf.h)
 * and output with pause and drop thresholds, the handshake and frame
 * timeouts, malformed input (an ERROR frame naming the field, then the
 * close), and dispatch through a table per role {frame type -> handler}.
 * umbp-server (server/) and a worker's lookup service (lookup/) are two
 * owners of it; a future peer service or master is a third.
 *
 * What stays with the owner (hooks in struct net_service_ops): its words
 * (every log line that names an option or a counter is the owner's, so
 * messages stay the owner's own; the lines written here begin with the
 * owner's name for the connection), its handshake (on_hello picks the
 * role), what a connection holds and what ends with it (on_open,
 * on_close), and its scheduling policy: a handler may do part of a frame
 * and say NET_MORE, and a connection over its turn's budget
 * (slice_records) is handed to on_yield, where the owner queues it (held:
 * not read, no frame deadline) and later calls net_conn_process again.
 * A handler whose reply depends on work that completes later (a round trip
 * to another process) starts that work and says NET_WAIT: the frame stays
 * open and the connection waits (not read, no frame deadline, later frames
 * not handled, so replies still leave in request order) until the owner
 * calls net_conn_resume, which runs the handler on the same frame again to
 * write its reply.  The owner bounds that work; if the connection ends
 * first (on_close while waiting), the owner must drop what refers to it.
 *
 * Connections: an owner's struct embeds struct net_conn as its first
 * member (conn_size says how large the whole is; container_of gets it
 * back).  Input is read without blocking and cut into frames by
 * proto_frame_parse; whole frames are handled in order and their replies
 * appended to `out`, so replies leave in request order.  A connection
 * whose unsent output is above out_pause is paused (not read) until it is
 * below out_resume; one above out_max (not 0) is closed: the client is not
 * reading.  The deadline timer bounds a handshake (HELLO within
 * handshake_timeout_ms of the connect) and a frame (its last byte within
 * frame_timeout_ms of its first); it never runs while the service itself
 * is not reading the connection (held; paused or starved of in_budget
 * while holding none of it: one that holds some keeps its deadline, so a
 * client that stops reading its replies cannot keep the budget), nor for a
 * greeted one whose input is all whole frames: an idle client stays
 * connected.  Before HELLO the handshake deadline runs whatever happens.
 *
 * Threads: the loop thread of `loop` owns everything here.  Only the libev
 * callbacks here and the owner's own top-level callbacks call
 * net_conn_close; functions that can end a connection return a negative
 * code (why set) instead, so no caller touches a freed connection.
 */
#ifndef UMBP_NET_SERVICE_H
#define UMBP_NET_SERVICE_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "auth.h"
#include "listen.h"
#include "proto.h"
#include "tcp.h"

#define NET_MAX_TYPES 64  /* frame types a role table may name */
#define NET_CLOSE 1       /* close once the output is flushed (why set) */
#define NET_MORE 2        /* records left: call again with the same frame */
#define NET_WAIT 3        /* waiting for the owner's own work: net_conn_resume */

struct net_service;
struct net_conn;

/* A handler: 0, NET_CLOSE, NET_MORE, -EPROTO / -EMSGSIZE with `what`
 * naming the bad field (malformed), or another -errno (close; why set). */
typedef int (*net_frame_fn)(struct net_conn *c, const struct proto_frame *f);

/* What a role may send and who handles it; a NULL slot is "not allowed
 * for role <name>", a malformed frame that lists the allowed types. */
struct net_role {
    const char *name;
    net_frame_fn handlers[NET_MAX_TYPES];
};

struct net_conn {
    struct net_service *svc;
    struct net_conn *prev, *next;  /* the service's list */
    int fd;
    ev_io rio, wio;
    ev_timer deadline_w;           /* handshake_timeout_ms or frame_timeout_ms */
    uint64_t id;                   /* 1, 2, ... per service */
    pid_t pid;                     /* SO_PEERCRED at accept */
    uid_t uid;
    gid_t gid;
    const struct net_role *role;   /* NULL until on_hello picks one */
    bool paused;                   /* not reading: output above out_pause */
    bool was_paused;               /* ever (logged once) */
    bool held;                     /* the owner queued it (on_yield): not read */
    bool waiting;                  /* a handler said NET_WAIT: not read or handled */
    bool frame_open;               /* the head frame is part handled (NET_MORE) */
    bool starved;                  /* not reading: its frame waits for in_budget */
    struct net_conn *starved_next; /* the service's queue of those */
    size_t in_reserved;            /* budget granted at its wake, before it grew */
    uint8_t *in;                   /* unparsed input [0, in_len) */
    size_t in_len, in_cap;
    struct proto_buf out;          /* unsent output [out_off, out.len) */
    size_t out_off;
    char why[PROTO_ERRMSG_MAX];    /* why it is ending, for the owner's close line */
    /* TCP: the peer's address (for log lines; "" on a Unix socket), and
     * the shared-secret handshake (auth.h): our nonce, passed or not */
    char peer[NET_TCP_NAME_MAX];
    uint8_t auth_nonce[NET_AUTH_BYTES];
    bool authed;
};

enum net_refusal {
    NET_REFUSE_CRED,      /* SO_PEERCRED failed (err); cr is NULL */
    NET_REFUSE_PEER,      /* not an allowed peer (net_peer_rules) */
    NET_REFUSE_FULL,      /* max_conns are open */
    NET_REFUSE_NOMEM,     /* no memory for the connection, or on_open failed (err) */
};

struct net_service_ops {
    /* The start of this connection's log lines ("session 7 (pid 123)"). */
    void (*name)(const struct net_conn *c, char *buf, size_t len);
    /* Accepted and allocated: the owner's part (0, or -errno: refused as
     * NET_REFUSE_NOMEM).  Optional. */
    int (*on_open)(struct net_conn *c);
    /* A connection refused before it was opened: the owner logs and counts
     * it, and may write to fd (a HELLO_ERR); the service closes fd. */
    void (*on_refuse)(struct net_service *s, int fd, const struct ucred *cr,
                      enum net_refusal why, int err);
    /* The first frame (any type: the owner says what a non-HELLO is).  Sets
     * c->role on success; returns as a handler does. */
    int (*on_hello)(struct net_conn *c, const struct proto_frame *f, char *what,
                    size_t whatlen);
    /* Runs handler h on f, charging *budget (optional: h(c, f), charging 1). */
    int (*run)(struct net_conn *c, net_frame_fn h, const struct proto_frame *f,
               uint32_t *budget);
    /* After a process pass that handled frames or has more (optional). */
    void (*on_processed)(struct net_conn *c);
    /* Work is left over this turn's budget: queue c (set c->held) and call
     * net_conn_process later.  Required with slice_records. */
    void (*on_yield)(struct net_conn *c);
    /* A malformed frame (after the log line): count it.  Optional. */
    void (*on_malformed)(struct net_conn *c);
    /* A deadline passed: the owner's log line and c->why.  Required with
     * handshake or frame timeouts. */
    void (*on_timeout)(struct net_conn *c, bool handshake);
    /* A client failed the shared-secret handshake (after the log line and
     * its HELLO_ERR): count it.  Optional. */
    void (*on_auth_failed)(struct net_conn *c);
    /* accept failed (out of descriptors): the owner's log line. */
    void (*on_accept_error)(struct net_service *s, int err, double retry_s);
    /* Ending: the owner's log line (c->why) and what the connection held;
     * the service then closes and frees it. */
    void (*on_close)(struct net_conn *c);
};

struct net_service_params {
    struct ev_loop *loop;
    const struct net_service_ops *ops;
    void *owner;
    size_t conn_size;              /* >= sizeof(struct net_conn), net_conn first */
    struct net_peer_rules peer;    /* Unix: SO_PEERCRED; unused with tcp */
    /* A TCP listener: no peer credentials (pid 0, uid and gid -1 in
     * net_conn), the peer's address in net_conn.peer. */
    bool tcp;
    /* The shared-secret handshake before HELLO (auth.h), or NULL: none.
     * A TCP service that any other host can reach should have one. */
    const struct net_auth_key *auth;
    unsigned max_conns;
    int accept_batch;
    double accept_retry_s;
    size_t in_initial;
    /* What every connection's input may hold beyond in_initial, together
     * (0: no bound; else at least PROTO_HDR_SIZE + PROTO_MAX_BODY).  A
     * connection whose partial frame needs more stops reading until others'
     * frames complete or their connections end, first come first served;
     * while it holds nothing beyond in_initial its frame deadline does not
     * run (it starts again when the connection is read).  A grown input is
     * given back as soon as it is empty.  Before HELLO nothing grows: a
     * first frame larger than in_initial ends the connection.  Its option's
     * name, for the log line: in_budget_option. */
    size_t in_budget;
    const char *in_budget_option;
    size_t out_pause, out_resume;  /* pause above, resume below */
    size_t out_keep;               /* an empty output buffer larger than this is freed */
    size_t out_max;                /* close above (0: never) */
    int64_t handshake_timeout_ms;  /* 0: none */
    int64_t frame_timeout_ms;      /* 0: none */
    uint32_t slice_records;        /* records per connection per turn (0: no limit) */
};

struct net_service {
    struct net_service_params p;
    int listen_fd;                 /* -1: not accepting */
    ev_io accept_w;
    ev_timer accept_retry_w;       /* out of descriptors: accept later */
    struct net_conn *conns;
    unsigned nconns;
    uint64_t next_id;
    size_t in_over;                /* inputs' bytes beyond in_initial, reserved included */
    struct net_conn *starved_head, *starved_tail;
    uint64_t starved_total;        /* connections that waited for in_budget */
    uint64_t starved_logged_ns;    /* its warning: at most once a minute */
};

void net_service_init(struct net_service *s, const struct net_service_params *p);
/* Accepts on listen_fd (non-blocking, listening) from now on. */
void net_service_start(struct net_service *s, int listen_fd);
/* Stops accepting (the owner closes the socket).  Idempotent. */
void net_service_stop_accepting(struct net_service *s);
/* Closes every connection (why copied into each first). */
void net_service_close_all(struct net_service *s, const char *why);

/* Opens a connection on an accepted fd whose peer was checked (cr), as
 * accept does after its checks.  NULL: no memory (fd is not closed). */
struct net_conn *net_service_adopt(struct net_service *s, int fd, const struct ucred *cr);

/* Handles the whole frames in c's input (see above), then flushes.  < 0:
 * the caller closes c. */
int net_conn_process(struct net_conn *c);
/* After a handler's NET_WAIT: the owner's work is done; runs the handler
 * on the open frame again, then the frames behind it, as net_conn_process
 * (< 0: the caller closes c). */
int net_conn_resume(struct net_conn *c);
/* Sends what it can now; arms or disarms the write watcher.  < 0: close c
 * (why set; over out_max logged). */
int net_conn_flush(struct net_conn *c);
size_t net_conn_backlog(const struct net_conn *c);
/* Ends c: on_close, then its socket, watchers and buffers.  Frees c. */
void net_conn_close(struct net_conn *c);

#endif /* UMBP_NET_SERVICE_H */
