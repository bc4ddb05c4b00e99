/*
 * session.h - one client connection of the wire protocol, sans I/O: the
 * calls outstanding at the server and the connection's life, with no
 * socket, thread or event loop of its own.
 *
 * The core is fed what happened (bytes read, a connect that completed or
 * failed, the peer gone, the time) and says what it wants next
 * (net_session_want: dial, read, write, watch the socket's directory, the
 * next deadline).  A driver does the I/O: session_ev.h on a libev loop (the
 * shm tier) and session_poll.h on the caller's thread with poll() (the
 * lookup client, the umbp tool).  Tests drive the core directly
 * (tests/unit/test_net_session.c).
 *
 * Calls.  A call is {first seq, frames, answered, deadline, orphan} plus
 * the owner's callbacks (struct net_call_ops).  The owner appends a call's
 * request frames to `out`, numbering them from `next_seq`, then pushes it.
 * The server answers one session in order, so the FIFO head is the call the
 * next reply belongs to; a reply of any other seq breaks the connection.
 *   on_reply       each reply of a live call;
 *   on_late_reply  each reply of an orphan (undo a late grant, or drop it);
 *   on_done        exactly once: 0 once its last reply is handled,
 *                  UMBP_E_TIMEOUT at its deadline (the call stays queued as
 *                  an orphan so that its late replies are consumed),
 *                  -ECONNRESET when the connection is lost,
 *                  UMBP_E_NOT_ATTEMPTED at stop or when pushed while not
 *                  connected;
 *   on_free        the session holds the call no more (after on_done; an
 *                  orphan's after its last late reply).
 * Before on_done the call is out of every list it will be looked for in
 * (or marked orphan), so on_done may push calls or stop the session.
 *
 * Connection.  DISCONNECTED -(backoff)-> CONNECTING (the driver dials)
 * -(connected)-> HELLO (the owner's HELLO sent) -(HELLO_OK adopted by the
 * owner)-> CONNECTED; EOF, an error, a malformed frame, or no HELLO_OK
 * within hello_timeout_ms go back to DISCONNECTED.  Backoff: 10 ms doubling
 * to backoff_max_ms, reset by a HELLO_OK.  Once connected once, while
 * disconnected the socket's directory is watched: the socket appearing
 * (net_session_appeared) starts an attempt at once, then quick retries
 * after 1, 2 and 4 ms (a server binds before it listens).  STOPPED refuses
 * everything for good.
 *
 * Health: UMBP_E_NOT_ATTEMPTED while not connected (with queue_in_hello,
 * while neither connected nor awaiting HELLO_OK), and while the peer
 * does not keep up, so that new work fails fast instead of queueing behind
 * it: with stall_ms 0, while an orphan is outstanding (single flight); with
 * stall_ms, while the oldest unanswered call (orphans too) is older than
 * that, whatever the calls' own deadlines (the shm tier: lookup_timeout_ms,
 * while a put's deadline is timeout_ms).  A server that holds a request for
 * the cluster says so (WAITING: the reply due next comes within arg ms);
 * that call then counts as keeping up until stall_ms past that bound.  A
 * WAITING about any other reply breaks the connection.
 *
 * Threads: none of its own; one thread at a time (the shm tier: the
 * runtime's loop thread; create and destroy: the creating thread).
 */
#ifndef UMBP_NET_SESSION_H
#define UMBP_NET_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "proto.h"

enum net_state {
    NET_DISCONNECTED, /* waiting for the backoff (or the directory) */
    NET_CONNECTING,   /* the driver dials */
    NET_HELLO,        /* HELLO sent, HELLO_OK awaited */
    NET_CONNECTED,
    NET_STOPPED,      /* net_session_stop ran: every call refused */
};

struct net_call;
struct net_session;

struct net_call_ops {
    /* A reply of the call (c->answered replies came before it): 0, or
     * negative and err says why (the connection is dropped as broken). */
    int (*on_reply)(struct net_call *c, const struct proto_frame *f, char *err, size_t errlen);
    /* The same for an orphan's late reply. */
    int (*on_late_reply)(struct net_call *c, const struct proto_frame *f, char *err,
                         size_t errlen);
    void (*on_done)(struct net_call *c, int status);
    void (*on_free)(struct net_call *c);
};

struct net_call {
    struct net_call *next;           /* the session's FIFO */
    const struct net_call_ops *ops;
    struct net_session *s;
    uint64_t first_seq;              /* of frames consecutive request frames */
    uint32_t frames, answered;
    uint64_t sent_ns, deadline_ns;   /* deadline 0: none */
    uint64_t wait_until_ns;          /* the server's WAITING: answered by then (0: none) */
    bool orphan;                     /* done(UMBP_E_TIMEOUT) ran, replies still due */
};

/* What the owner does at the connection's turns; every member required. */
struct net_session_ops {
    /* Appends the HELLO frame to s->out (seq from s->next_seq++). */
    int (*hello)(struct net_session *s, char *err, size_t errlen);
    /* HELLO_OK or HELLO_ERR, with the fd that came with it (-1: none; the
     * callee owns it): 0 adopts the session, negative refuses it (err). */
    int (*welcome)(struct net_session *s, const struct proto_frame *f, int fd, char *err,
                   size_t errlen);
    /* Any frame before the FIFO sees it: 1 handled (EVENTS), 0 a reply
     * (or, before HELLO_OK, not acceptable yet), negative: drop the
     * connection (err says why: an ERROR frame, an unexpected type). */
    int (*on_frame)(struct net_session *s, const struct proto_frame *f, char *err,
                    size_t errlen);
    /* Connected after an outage of down_ms; by_dir: the attempt came from
     * the socket appearing. */
    void (*on_up)(struct net_session *s, uint64_t down_ms, bool by_dir);
    /* The connection is gone (calls are failed right after this):
     * was_connected, or an attempt failed; news: a reason unlike the last
     * one's, and not merely "no server there" (ENOENT, ECONNREFUSED). */
    void (*on_down)(struct net_session *s, const char *why, bool was_connected, bool news);
};

/* What the driver supplies: close the transport (the core dropped the
 * connection), and look again at net_session_want (output or a deadline
 * changed outside a driver's call).  Either may be NULL (tests). */
struct net_session_io {
    void (*close)(void *drv);
    void (*update)(void *drv);
    void *drv;
};

struct net_session_config {
    const char *peer;                /* "the server": in the reasons given */
    uint64_t backoff_max_ms;         /* >= 10 */
    uint64_t hello_timeout_ms;       /* dial + HELLO -> HELLO_OK */
    const char *hello_timeout_name;  /* the option: "startup_timeout_ms" */
    uint64_t stall_ms;               /* health; 0: an orphan */
    /* Calls may be pushed while HELLO_OK is awaited: they go out behind the
     * HELLO, so a fresh connection costs no extra round trip (the lookup
     * client); health then counts HELLO as up, and a refused HELLO fails
     * them with -ECONNRESET.  false: pushed only while CONNECTED (the shm
     * tier: nothing waits behind a handshake that may be refused). */
    bool queue_in_hello;
    /* The shared-secret handshake (auth.h) before HELLO, or NULL: none.
     * With a key, HELLO goes out only after the server's AUTH_CHALLENGE
     * (behind our AUTH), and HELLO_OK counts only after an AUTH_OK whose
     * MAC proves the server holds the secret.  Without one, an
     * AUTH_CHALLENGE drops the connection saying a secret is needed. */
    const struct net_auth_key *auth;
};

struct net_want {
    bool dial;                       /* connect now, then net_session_dialing */
    bool read, write;
    bool watch_dir;                  /* disconnected after having been connected */
    uint64_t deadline_ns;            /* 0: none; net_session_tick at or after it
                                        (a tick finding nothing due is harmless) */
};

struct net_session {
    struct net_session_config cfg;
    const struct net_session_ops *ops;
    struct net_session_io io;
    void *owner;
    enum net_state state;
    uint64_t gen;                    /* bumped each time a connection is dropped */
    /* the owner appends whole frames here, numbered from next_seq */
    struct proto_buf out;
    uint64_t next_seq;
    uint8_t *in;
    size_t in_off, in_len, in_cap;   /* unparsed bytes: in[in_off, in_len) */
    int pending_fd;                  /* an fd that came with the bytes in `in` */
    struct net_call *head, *tail;
    size_t orphans;
    uint64_t call_deadline_ns;       /* no live call's deadline is earlier (kept
                                        lazily: a push lowers it, a tick
                                        recomputes it; 0: none) */
    bool dialing;                    /* CONNECTING: the driver has dialled */
    uint64_t hello_deadline_ns;      /* CONNECTING, HELLO */
    uint64_t retry_ns;               /* DISCONNECTED: the next attempt */
    uint64_t backoff_ms;
    uint64_t lost_ns;                /* when the connection was lost; 0: never */
    bool was_up;                     /* connected once: watch the directory */
    unsigned quick_left;             /* quick retries after the socket appeared */
    uint64_t quick_ms;
    bool quick_armed;                /* retry_ns is a quick retry */
    bool by_dir;                     /* the attempt under way came from the directory */
    char last_why[128];              /* why the last attempt failed */
    /* the shared-secret handshake: what is awaited, and both nonces */
    enum { NET_AUTH_NONE, NET_AUTH_CHALLENGE, NET_AUTH_OK } auth_wait;
    uint8_t auth_sn[NET_AUTH_BYTES], auth_cn[NET_AUTH_BYTES];
};

#define NET_BACKOFF_MIN_MS 10
#define NET_QUICK_RETRIES 3          /* after the socket appeared: 1, 2, 4 ms */

/* state DISCONNECTED, nothing scheduled: net_session_adopt (a connection
 * the owner made by itself) or net_session_retry_now to begin. */
void net_session_init(struct net_session *s, const struct net_session_config *cfg,
                      const struct net_session_ops *ops, void *owner);
/* Frees the buffers; calls still queued get on_free only (never on_done:
 * the owner abandoned them). */
void net_session_destroy(struct net_session *s);

/* ---- the driver's side ----------------------------------------------------------- */

void net_session_want(const struct net_session *s, struct net_want *w);
/* Time passed: expires calls, ends a handshake past hello_timeout_ms,
 * starts an attempt whose backoff is over. */
void net_session_tick(struct net_session *s, uint64_t now);
/* The driver began connecting (after want.dial). */
void net_session_dialing(struct net_session *s, uint64_t now);
/* The transport is connected (and the peer checked): HELLO goes out. */
void net_session_connected(struct net_session *s, uint64_t now);
/* The connection (or the attempt) is gone; why as logged.  The core closes
 * the transport through io.close, fails every call with -ECONNRESET and
 * schedules the next attempt. */
void net_session_lost(struct net_session *s, uint64_t now, const char *why);
/* The socket's name appeared in its directory. */
void net_session_appeared(struct net_session *s, uint64_t now);
/* Input: room for at least 64 KiB more (-ENOMEM), then the bytes read
 * (n > 0) and the fd that came with them (-1: none), which handles every
 * whole frame; n == 0 is EOF.  Returns 0, or -1 once the connection is
 * gone (dropped here or from a callback). */
int net_session_in_space(struct net_session *s, uint8_t **p, size_t *room);
int net_session_input(struct net_session *s, uint64_t now, size_t n, int fd);
/* A driver's read turn (session_io.c): up to max_reads reads of *fdp (the
 * driver's socket, re-read each time: a callback may close it) into the
 * core.  0 when the socket would block, the core dropped the connection or
 * the reads are done; -errno of a failed recv, which the driver reports
 * (net_session_lost, in its own words). */
int net_session_read(struct net_session *s, const int *fdp, int max_reads);
/* Handles the whole frames already buffered (left by a blocking handshake). */
int net_session_process(struct net_session *s, uint64_t now);
/* Output: out.data[0, out.len) waits; drop what was written. */
void net_session_wrote(struct net_session *s, size_t n);

/* ---- the owner's side ------------------------------------------------------------- */

/* Queues c (its frames already in out) with a deadline (0: none) and asks
 * the driver to write.  The owner pushes only while connected (or awaiting
 * HELLO_OK, with queue_in_hello): otherwise
 * on_done(UMBP_E_NOT_ATTEMPTED) and on_free run at once, and frames
 * appended meanwhile never go out (each connection starts with an empty
 * output). */
void net_session_push(struct net_session *s, struct net_call *c,
                      const struct net_call_ops *ops, uint32_t frames, uint64_t first_seq,
                      uint64_t now, uint64_t deadline_ns);
/* Frames with no reply (ABORT) were appended: ask the driver to write. */
void net_session_flush(struct net_session *s);
/* A connection made outside the core (a blocking handshake at creation,
 * its bytes in `in`): state CONNECTED. */
void net_session_adopt(struct net_session *s, uint64_t now);
/* Disconnected: the next attempt now (not waiting for the backoff). */
void net_session_retry_now(struct net_session *s, uint64_t now);
/* Fails every call with UMBP_E_NOT_ATTEMPTED and refuses everything after. */
void net_session_stop(struct net_session *s);
int net_session_health(const struct net_session *s, uint64_t now);
/* The oldest call still queued (orphans too), or NULL. */
static inline const struct net_call *net_session_oldest(const struct net_session *s)
{
    return s->head;
}
/* The input buffer for a blocking reader (the handshake at creation). */
long net_session_in_next(struct net_session *s, struct proto_frame *f, char *err,
                         size_t errlen);
void net_session_in_consume(struct net_session *s, long bytes);
/* Records n bytes read into the space net_session_in_space gave, with the
 * fd that came with them, without handling them: 0, or -EPROTO (a second
 * fd: only HELLO_OK carries one). */
int net_session_in_commit(struct net_session *s, size_t n, int fd);

#endif /* UMBP_NET_SESSION_H */
