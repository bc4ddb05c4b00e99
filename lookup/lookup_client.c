/*
 * lookup_client.c - the scheduler's lookup client: how long a prefix of a
 * request's blocks is present on every rank, with no pool of its own.
 *
 * Embedded mode: one client session per rank (net/session.h) with its
 * worker's lookup service (lookup_serve.c), driven on the caller's thread
 * by the poll() driver (net/session_poll.h), dialled lazily and kept.  A
 * query groups its rows by rank and pushes one call per rank: LOOKUP
 * frames of at most 65,536 keys (behind the HELLO on a fresh connection,
 * queue_in_hello: the handshake costs no extra round trip), whose deadline
 * is the query's (lookup_timeout_ms), then runs every asked rank's session
 * in one poll() until each call is done or that deadline passed.  Answers
 * land in the client's scratch, never in the caller's memory; a reply that
 * comes after its call timed out goes to on_late_reply, which checks and
 * drops it.
 *
 * What the session does for each rank: matching replies to calls in order,
 * the deadline, the orphan a timed-out call leaves, single flight (stall_ms
 * 0: health is UMBP_E_NOT_ATTEMPTED while an orphan is outstanding, so
 * later queries do not ask the rank; its rows miss), and the backoff of a
 * rank whose connection failed (refused, closed, a malformed or unexpected
 * frame): 10 ms doubling to 1 s, reset by a HELLO_OK.  What this file
 * keeps: when to start an attempt (a query that has rows for the rank, its
 * backoff over: nothing happens between queries), reading what a stuck
 * rank sent since, without waiting, at the start of each query (once every
 * late reply has been read it is asked again), dropping a rank still stuck
 * after 10 x lookup_timeout_ms (at least 5 s), so that a wedged process
 * that never closes does not miss forever, and one watch (inotify, read
 * without waiting at each query) on the lookup directory, from the first
 * failure on: a rank's socket created, moved in or chmod-ed (a restarted
 * worker) starts its attempt at once (net_session_appeared), so the next
 * query dials it; without inotify the backoff alone.  The log lines and
 * return codes are this client's own (the session's reasons are reworded
 * where they differ).
 *
 * Standalone mode: a runtime of role lookup (the shm tier: one lookup
 * session with umbp-server, its own deadlines and single flight) and one
 * umbp_lookup of every row's keys together; the prefix is the least over
 * the rows.
 *
 * Threads: the caller's, one at a time per client (umbp/lookup.h).  Nothing
 * here blocks past the query's deadline: sockets are non-blocking and the
 * only wait is poll() bounded by it.
 */
#include <errno.h>
#include <json-c/json.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "lookup_int.h"
#include "master_client.h"
#include "proto.h"
#include "session.h"
#include "session_poll.h"
#include "util.h"

#define MAX_KEYS (1u << 24)        /* rows * n per query, as umbp_lookup */
#define BACKOFF_MAX_MS 1000

struct umbp_lookup_client;

/* A rank's call: one query's LOOKUP frames to it. */
struct lk_call {
    struct net_call nc;            /* first: the session's */
    struct lk_rank *r;
    size_t keys;                   /* over all its frames */
};

struct lk_rank {
    struct umbp_lookup_client *c;
    uint32_t rank;
    char path[LK_PATH_MAX];
    struct net_session s;
    struct net_poll d;
    uint64_t hello_seq;
    bool stuck;                    /* a call timed out; its replies still due */
    uint64_t stuck_ns;             /* since when */
    bool failed;                   /* a connection or attempt failed once: watch */
    bool left_idle;                /* closed with nothing due: dial at the next query */
    int fail_rc;                   /* the code of the failure being reported (0: none) */
    int dial_errno;                /* a dial's socket() or connect() failed with it */
    int last_rc;                   /* the code of the last failure */
    uint64_t lost_gen;             /* the query in which a dial last failed */
    /* the query in progress */
    size_t first, nrows;           /* its rows: order[first .. first + nrows) */
    struct lk_call *call;          /* this query's call, until done */
    struct lk_call *spare;         /* a freed call, kept for the next query */
    int rc;
};

struct umbp_lookup_client {
    struct lookup_client_config cfg;
    bool standalone;
    umbp_runtime_t *rt;            /* standalone: role lookup */
    struct mclient *master;        /* distributed: umbp-master (its poll() driver) */
    struct net_auth_key key;
    struct proto_location *locs;   /* distributed: a LOCATE's answers */
    size_t locs_cap;
    struct lk_rank *ranks;         /* embedded: num_ranks */
    size_t nranks;
    uint64_t gen;                  /* queries so far */
    size_t n;                      /* keys per row of the query in progress */
    uint8_t *ans;                  /* rows * n answers of the query */
    size_t ans_cap;
    size_t *order;                 /* rows grouped by rank */
    size_t order_cap;
    struct pollfd *pfd;
    struct net_poll **run;         /* the ranks this query drives */
    size_t waiting;                /* calls of this query not done */
    char dir[LK_PATH_MAX];         /* embedded: where the ranks' sockets are */
    int ino_fd;                    /* watching dir since a rank failed; -1: not yet,
                                      -2: no inotify */
};

static uint64_t now_ns(void) { return umbp_now_ns(); }

/* How long a stuck rank keeps its connection. */
static uint64_t stuck_limit_ms(const struct umbp_lookup_client *c)
{
    uint64_t ms = 10ull * (uint64_t)c->cfg.lookup_timeout_ms;
    return ms < 5000 ? 5000 : ms;
}

/* ---- the lookup directory's watch ------------------------------------------------ */

/* From the first failure on. */
static void dir_watch(struct umbp_lookup_client *c)
{
    if (c->ino_fd != -1)
        return;
    c->ino_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (c->ino_fd >= 0 &&
        inotify_add_watch(c->ino_fd, c->dir, IN_CREATE | IN_MOVED_TO | IN_ATTRIB | IN_ONLYDIR) < 0) {
        close(c->ino_fd);
        c->ino_fd = -1;
    }
    if (c->ino_fd < 0) {
        umbp_log(UMBP_LOG_DEBUG, "lookup client: cannot watch %s (%s); failed ranks are "
                 "redialled after their backoff only", c->dir, strerror(errno));
        c->ino_fd = -2;
    }
}

/* A rank's socket (re)appeared: its attempt starts now (all disconnected
 * ranks' on an overflowed queue).  Never waits. */
static void dir_events(struct umbp_lookup_client *c, uint64_t now)
{
    if (c->ino_fd < 0)
        return;
    _Alignas(struct inotify_event) char buf[4096];
    ssize_t n;
    while ((n = read(c->ino_fd, buf, sizeof(buf))) > 0) {
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *e = (const struct inotify_event *)p;
            p += sizeof(*e) + e->len;
            for (size_t k = 0; k < c->nranks; k++) {
                struct lk_rank *r = &c->ranks[k];
                const char *name = strrchr(r->path, '/');
                if (r->s.state == NET_DISCONNECTED &&
                    ((e->mask & IN_Q_OVERFLOW) ||
                     (e->len && name && strcmp(e->name, name + 1) == 0)))
                    net_session_appeared(&r->s, now);
            }
        }
    }
}

/* ---- what a rank's session asks of this client -------------------------------------- */

static int rank_hello(struct net_session *s, char *err, size_t errlen)
{
    struct lk_rank *r = s->owner;
    const struct lookup_client_config *k = &r->c->cfg;
    struct proto_hello h = {
        .magic = PROTO_MAGIC, .version = PROTO_VERSION, .role = PROTO_ROLE_LOOKUP,
        .pid = (uint32_t)getpid(), .dp_rank = (uint32_t)k->dp_index, .tp_rank = r->rank,
    };
    for (size_t i = 0; i < UMBP_LOOKUP_NS_HEX_LEN; i++) {
        char ch = k->name_space[i];
        h.name_space[i] = (char)(ch >= 'A' && ch <= 'F' ? ch - 'A' + 'a' : ch);
    }
    r->hello_seq = s->next_seq++;
    int rc = proto_begin(&s->out, PROTO_HELLO, r->hello_seq, 1, 0);
    if (rc == 0)
        rc = proto_put_hello(&s->out, &h);
    int erc = proto_end(&s->out);
    if ((rc = rc ? rc : erc) < 0) {
        snprintf(err, errlen, "cannot build HELLO");
        r->fail_rc = rc;
    }
    return rc;
}

static int refused(struct lk_rank *r, const struct proto_frame *f, char *why, size_t whylen)
{
    struct proto_error pe = {0};
    if (proto_get_error(f, &pe) < 0)
        snprintf(pe.message, sizeof(pe.message), "(unreadable)");
    snprintf(why, whylen, "the service refused: %s", pe.message);
    r->fail_rc = f->type == PROTO_HELLO_ERR && pe.status < 0 ? pe.status : -EPROTO;
    return r->fail_rc;
}

static int rank_welcome(struct net_session *s, const struct proto_frame *f, int fd, char *why,
                        size_t whylen)
{
    struct lk_rank *r = s->owner;
    if (fd >= 0)
        close(fd); /* the lookup role is given none */
    if (f->type == PROTO_HELLO_ERR)
        return refused(r, f, why, whylen);
    struct proto_welcome w;
    char err[PROTO_ERRMSG_MAX] = "";
    if (proto_get_welcome(f, &w, err, sizeof(err)) < 0 || w.version != PROTO_VERSION) {
        snprintf(why, whylen, "HELLO_OK: %s", err[0] ? err : "another protocol version");
        return r->fail_rc = -EPROTO;
    }
    return 0;
}

/* Every frame, before the session matches it to a call: the reply due, or
 * the connection is dropped with why (the wording this client has always
 * logged). */
static int rank_frame(struct net_session *s, const struct proto_frame *f, char *why,
                      size_t whylen)
{
    struct lk_rank *r = s->owner;
    if (f->type == PROTO_ERROR)
        return refused(r, f, why, whylen);
    uint16_t type = PROTO_LOOKUP_R;
    uint64_t seq = r->hello_seq;
    if (s->state == NET_HELLO) {
        type = PROTO_HELLO_OK; /* a HELLO_OK or HELLO_ERR never comes here */
    } else if (!s->head) {
        snprintf(why, whylen, "%s (seq %llu) with nothing asked", proto_type_name(f->type),
                 (unsigned long long)f->seq);
        return r->fail_rc = -EPROTO;
    } else {
        seq = s->head->first_seq + s->head->answered;
    }
    if (f->type != type || f->seq != seq || s->state == NET_HELLO) {
        snprintf(why, whylen, "%s seq %llu, expected %s seq %llu", proto_type_name(f->type),
                 (unsigned long long)f->seq, proto_type_name(type), (unsigned long long)seq);
        return r->fail_rc = -EPROTO;
    }
    return 0;
}

static void rank_up(struct net_session *s, uint64_t down_ms, bool by_dir)
{
    (void)s, (void)down_ms, (void)by_dir; /* nothing to say: its rows are asked again */
}

static void rank_down(struct net_session *s, const char *why, bool was_connected, bool news)
{
    struct lk_rank *r = s->owner;
    static const char malformed[] = "malformed frame from the service: ";
    char w[512];
    int rc = r->fail_rc ? r->fail_rc : r->dial_errno ? -r->dial_errno : -ECONNRESET;
    (void)news; /* this client's rule: below */
    r->stuck = false;
    r->last_rc = rc;
    if (!was_connected)
        r->lost_gen = r->c->gen; /* a dial (or its handshake) failed in this query */
    if (was_connected && !s->head && !strcmp(why, "the service closed the connection")) {
        r->left_idle = true; /* answered everything, then left: dial again next time */
    } else {
        if (!strncmp(why, malformed, sizeof(malformed) - 1)) {
            snprintf(w, sizeof(w), "malformed frame: %s", why + sizeof(malformed) - 1);
            r->last_rc = -EPROTO;
            why = w;
        }
        /* a lost connection or a strange answer is news; no worker there
         * (yet, or any more) is only the outage going on */
        bool loud = was_connected || !r->dial_errno ||
                    (r->dial_errno != ENOENT && r->dial_errno != ECONNREFUSED);
        uint64_t next = s->quick_left ? s->quick_ms : s->backoff_ms;
        umbp_log(loud ? UMBP_LOG_WARN : UMBP_LOG_DEBUG,
                 "lookup client: rank %u (%s): %s; its rows miss, redial in %u ms at the "
                 "earliest", (unsigned)r->rank, r->path, why, (unsigned)next);
        r->failed = true;
    }
    r->fail_rc = r->dial_errno = 0;
}

static const struct net_session_ops rank_ops = {
    .hello = rank_hello,
    .welcome = rank_welcome,
    .on_frame = rank_frame,
    .on_up = rank_up,
    .on_down = rank_down,
};

/* ---- what the poll driver asks ---------------------------------------------------------- */

static int rank_check_peer(void *ctx, int fd, char *why, size_t whylen)
{
    struct lk_rank *r = ctx;
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 ||
        (cr.uid != geteuid() && cr.uid != 0)) {
        snprintf(why, whylen, "the socket is served by uid %u, not by this user; "
                 "refusing its answers", (unsigned)cr.uid);
        return r->fail_rc = -EACCES;
    }
    return 0;
}

static void rank_failed(void *ctx, enum net_poll_step step, int e, char *why, size_t whylen)
{
    struct lk_rank *r = ctx;
    switch (step) {
    case NET_POLL_SOCKET:
        snprintf(why, whylen, "socket(AF_UNIX) failed");
        r->dial_errno = e;
        break;
    case NET_POLL_CONNECT:
        snprintf(why, whylen, "connect: %s (is its worker up and serving?)", strerror(e));
        r->dial_errno = e;
        break;
    case NET_POLL_SEND:
        snprintf(why, whylen, "send failed");
        r->fail_rc = -e;
        break;
    case NET_POLL_RECV:
        snprintf(why, whylen, "%s", strerror(e));
        r->fail_rc = -e;
        break;
    }
}

/* ---- a rank's call ------------------------------------------------------------------ */

/* Checks a LOOKUP_R (frame i of the call) and, for the live call, keeps
 * its answers. */
static int lookup_reply(struct net_call *nc, const struct proto_frame *f, char *why,
                        size_t whylen)
{
    struct lk_call *k = (struct lk_call *)nc;
    struct lk_rank *r = k->r;
    struct umbp_lookup_client *c = r->c;
    size_t pos = (size_t)nc->answered * PROTO_MAX_RECORDS, left = k->keys - pos;
    uint32_t want = (uint32_t)(left > PROTO_MAX_RECORDS ? PROTO_MAX_RECORDS : left);
    if (f->n != want) {
        snprintf(why, whylen, "LOOKUP_R.n: %u answers to %u keys", f->n, want);
        return r->fail_rc = -EPROTO;
    }
    bool mine = !nc->orphan; /* else a late reply: read and discard */
    for (uint32_t i = 0; i < f->n; i++) {
        uint8_t v;
        if (proto_get_u8(f, i, &v) < 0) {
            snprintf(why, whylen, "LOOKUP_R.present[%u]: not 0 or 1", i);
            return r->fail_rc = -EPROTO;
        }
        if (mine) {
            size_t p = pos + i, row = c->order[r->first + p / c->n];
            c->ans[row * c->n + p % c->n] = v;
        }
    }
    return 0;
}

static void lookup_done(struct net_call *nc, int status)
{
    struct lk_call *k = (struct lk_call *)nc;
    struct lk_rank *r = k->r;
    struct umbp_lookup_client *c = r->c;
    r->call = NULL;
    c->waiting--;
    if (status == -ECONNRESET)
        status = r->last_rc ? r->last_rc : -ECONNRESET; /* what the connection met */
    r->rc = status;
    if (status == UMBP_E_TIMEOUT) {
        r->stuck = true;
        r->stuck_ns = now_ns();
        umbp_log(UMBP_LOG_WARN, "lookup client: rank %u (%s) did not answer within "
                 "lookup_timeout_ms (%lld); its rows miss until it answers",
                 (unsigned)r->rank, r->path, (long long)c->cfg.lookup_timeout_ms);
    }
}

static void lookup_free(struct net_call *nc)
{
    struct lk_call *k = (struct lk_call *)nc;
    if (!k->r->spare)
        k->r->spare = k; /* a query allocates nothing in the steady state */
    else
        free(k);
}

static const struct net_call_ops lookup_call_ops = {
    .on_reply = lookup_reply,
    .on_late_reply = lookup_reply,
    .on_done = lookup_done,
    .on_free = lookup_free,
};

/* ---- a query, embedded ----------------------------------------------------------- */

static int master_query(struct umbp_lookup_client *c, const umbp_key_t *keys, size_t total);

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
    if (want <= *cap)
        return 0;
    void *q = realloc(*p, want * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = want;
    return 0;
}

/* Groups rows by rank: rank k's rows are order[ranks[k].first ..]. */
static void group_rows(struct umbp_lookup_client *c, size_t rows, const uint32_t *row_rank)
{
    for (size_t k = 0; k < c->nranks; k++)
        c->ranks[k].nrows = 0;
    for (size_t i = 0; i < rows; i++)
        c->ranks[row_rank ? row_rank[i] : i].nrows++;
    size_t at = 0;
    for (size_t k = 0; k < c->nranks; k++) {
        c->ranks[k].first = at;
        at += c->ranks[k].nrows;
        c->ranks[k].nrows = 0;
    }
    for (size_t i = 0; i < rows; i++) {
        struct lk_rank *r = &c->ranks[row_rank ? row_rank[i] : i];
        c->order[r->first + r->nrows++] = i;
    }
}

/* The rank's rows of this query as one call of LOOKUP frames of at most
 * 65,536 keys, due by the query's deadline. */
static void rank_push(struct umbp_lookup_client *c, struct lk_rank *r, const umbp_key_t *keys,
                      uint64_t now, uint64_t deadline)
{
    struct net_session *s = &r->s;
    size_t total = r->nrows * c->n, pos = 0, mark = s->out.len;
    uint64_t seq0 = s->next_seq;
    uint32_t frames = 0;
    int rc = 0;
    struct lk_call *k = r->spare ? r->spare : malloc(sizeof(*k));
    r->spare = NULL;
    while (k && rc == 0 && pos < total) {
        uint32_t cnt = (uint32_t)(total - pos > PROTO_MAX_RECORDS ? PROTO_MAX_RECORDS
                                                                  : total - pos);
        rc = proto_begin(&s->out, PROTO_LOOKUP, s->next_seq++, cnt, 0);
        for (uint32_t i = 0; rc == 0 && i < cnt; i++) {
            size_t p = pos + i, row = c->order[r->first + p / c->n];
            rc = proto_put_key(&s->out, &keys[row * c->n + p % c->n]);
        }
        int erc = proto_end(&s->out);
        rc = rc ? rc : erc;
        pos += cnt;
        frames++;
    }
    if (!k || rc < 0) {
        free(k);
        s->out.len = mark;
        r->fail_rc = k ? rc : -ENOMEM;
        net_session_lost(s, now, "cannot build the LOOKUP frames");
        r->rc = r->last_rc;
        return;
    }
    k->r = r;
    k->keys = total;
    r->call = k;
    c->waiting++; /* before the push: a refused one is done at once */
    net_session_push(s, &k->nc, &lookup_call_ops, frames, seq0, now, deadline);
}

/* Asks rank r for its rows if it may be asked; else r->rc says why not. */
static void rank_ask(struct umbp_lookup_client *c, struct lk_rank *r, const umbp_key_t *keys,
                     uint64_t now, uint64_t deadline)
{
    struct net_session *s = &r->s;
    if (r->stuck && net_session_health(s, now) == 0) {
        r->stuck = false;
        umbp_log(UMBP_LOG_INFO, "lookup client: rank %u (%s) answered its late query; asked "
                 "again", (unsigned)r->rank, r->path);
    }
    if (r->stuck && now - r->stuck_ns > stuck_limit_ms(c) * 1000000ull) {
        /* a rank that neither answers nor closes is dropped and dialled
         * again later, so one wedged process does not miss forever */
        r->fail_rc = UMBP_E_TIMEOUT;
        net_session_lost(s, now, "no answer to a query for 10 x lookup_timeout_ms (at least "
                         "5 s); reconnecting");
        r->rc = UMBP_E_NOT_ATTEMPTED;
        return;
    }
    if (s->state == NET_DISCONNECTED && r->lost_gen == c->gen) {
        r->rc = r->last_rc; /* its dial failed in this query */
        return;
    }
    if (net_session_health(s, now) < 0) {
        /* single flight (its last query is still due), backing off, or a
         * connect still under way */
        r->rc = UMBP_E_NOT_ATTEMPTED;
        return;
    }
    rank_push(c, r, keys, now, deadline);
}

static bool all_answered(void *arg) { return ((struct umbp_lookup_client *)arg)->waiting == 0; }

static int embedded_query(struct umbp_lookup_client *c, const umbp_key_t *keys, size_t rows,
                          const uint32_t *row_rank)
{
    uint64_t now = now_ns(), deadline = now + (uint64_t)c->cfg.lookup_timeout_ms * 1000000ull;
    size_t nrun = 0, nbusy = 0;
    c->gen++;
    c->waiting = 0;
    dir_events(c, now);
    group_rows(c, rows, row_rank);
    for (size_t k = 0; k < c->nranks; k++) {
        struct lk_rank *r = &c->ranks[k];
        r->rc = 0;
        if (!r->nrows)
            continue;
        if (r->left_idle && r->s.state == NET_DISCONNECTED)
            net_session_retry_now(&r->s, now);
        r->left_idle = false;
        net_session_tick(&r->s, now); /* an attempt whose backoff is over starts */
        c->run[nrun++] = &r->d;
        /* ranks to dial or with replies due first (idle ones: nothing to do) */
        if (r->s.state == NET_CONNECTING || net_session_oldest(&r->s))
            nbusy++;
    }
    /* dial, and read what stuck ranks sent since, without waiting */
    if (nbusy)
        net_poll_run(c->run, nrun, c->pfd, now, NULL, NULL);
    for (size_t k = 0; k < c->nranks; k++)
        if (c->ranks[k].nrows)
            rank_ask(c, &c->ranks[k], keys, now, deadline);
    if (net_poll_run(c->run, nrun, c->pfd, deadline, all_answered, c) < 0)
        for (size_t i = 0; i < nrun && c->waiting; i++)
            net_session_tick(c->run[i]->s, deadline); /* cannot wait: what is due timed out */
    for (size_t k = 0; k < c->nranks && c->ino_fd == -1; k++)
        if (c->ranks[k].failed)
            dir_watch(c); /* a rank failed: watch for its return */
    int rc = 0;
    for (size_t k = 0; k < c->nranks; k++) {
        struct lk_rank *r = &c->ranks[k];
        if (!r->nrows || r->rc == 0)
            continue;
        for (size_t i = 0; i < r->nrows; i++)
            memset(c->ans + c->order[r->first + i] * c->n, 0, c->n);
        if (rc == 0)
            rc = r->rc;
    }
    return rc;
}

/* ---- the API ----------------------------------------------------------------------- */

static int bad_query(const char *msg)
{
    umbp_set_error("umbp_lookup_client_query: %s", msg);
    return -EINVAL;
}

int umbp_lookup_client_query(umbp_lookup_client_t *c, const umbp_key_t *keys, size_t n,
                             size_t rows, const uint32_t *row_rank, uint8_t *present,
                             size_t *prefix)
{
    if (prefix)
        *prefix = 0;
    if (!c || !prefix)
        return bad_query("the client and prefix must not be NULL");
    if (rows == 0)
        return bad_query("rows must be at least 1");
    if (n > MAX_KEYS || rows > MAX_KEYS || n * rows > MAX_KEYS)
        return bad_query("rows * n must be at most 16777216 keys");
    if (present)
        memset(present, 0, n * rows);
    if (n && !keys)
        return bad_query("keys must not be NULL");
    if (!row_rank && rows > (size_t)c->cfg.num_ranks)
        return bad_query("without row_rank, row r is rank r: rows must not exceed num_ranks");
    for (size_t i = 0; row_rank && i < rows; i++)
        if (row_rank[i] >= (uint64_t)c->cfg.num_ranks)
            return bad_query("row_rank[] must be below num_ranks");
    if (n == 0)
        return 0;
    if (grow((void **)&c->ans, &c->ans_cap, n * rows, 1) < 0 ||
        grow((void **)&c->order, &c->order_cap, rows, sizeof(size_t)) < 0) {
        umbp_set_error("umbp_lookup_client_query: out of memory for %zu keys", n * rows);
        return -ENOMEM;
    }
    memset(c->ans, 0, n * rows);
    c->n = n;
    int rc;
    if (c->standalone) {
        size_t ignored;
        rc = umbp_lookup(c->rt, keys, n * rows, c->ans, &ignored, 0);
        if (rc < 0)
            memset(c->ans, 0, n * rows);
    } else if (c->master) {
        rc = master_query(c, keys, n * rows);
    } else {
        rc = embedded_query(c, keys, rows, row_rank);
    }
    size_t best = n;
    for (size_t i = 0; i < rows && best; i++) {
        size_t p = 0;
        while (p < best && c->ans[i * n + p])
            p++;
        best = p;
    }
    *prefix = best;
    if (present)
        memcpy(present, c->ans, n * rows);
    return rc;
}

/* Distributed: LOCATE of every key (rows are keys of ranks: one index
 * answers them all), in frames of PROTO_MAX_RECORDS; present when some
 * live node holds it.  Failures are misses. */
static int master_query(struct umbp_lookup_client *c, const umbp_key_t *keys, size_t total)
{
    size_t chunk = total < PROTO_MAX_RECORDS ? total : PROTO_MAX_RECORDS;
    if (grow((void **)&c->locs, &c->locs_cap, chunk, sizeof(*c->locs)) < 0) {
        umbp_set_error("umbp_lookup_client_query: out of memory for %zu keys", total);
        return -ENOMEM;
    }
    for (size_t at = 0; at < total; at += chunk) {
        size_t m = total - at < chunk ? total - at : chunk;
        struct proto_location *locs = c->locs;
        int rc = mclient_locate(c->master, keys + at, m, locs);
        if (rc < 0) {
            memset(c->ans, 0, total);
            umbp_set_error("umbp_lookup_client_query: umbp-master at %s: %s%s%s",
                           c->cfg.master_address, umbp_strerror(rc),
                           mclient_last_error(c->master)[0] ? ": " : "",
                           mclient_last_error(c->master));
            return rc;
        }
        for (size_t i = 0; i < m; i++)
            c->ans[at + i] = locs[i].nrep > 0;
    }
    return 0;
}

static int master_open(struct umbp_lookup_client *c, char *err, size_t errlen)
{
    int rc;
    if (c->cfg.secret_file[0] &&
        (rc = net_auth_key_load(c->cfg.secret_file, "secret_file", &c->key, err, errlen)) < 0)
        return rc;
    char id[64];
    snprintf(id, sizeof(id), "%s", c->cfg.engine_id[0] ? c->cfg.engine_id : "");
    if (!id[0])
        snprintf(id, sizeof(id), "scheduler pid %d", (int)getpid());
    struct mclient_config mc = {
        .address = c->cfg.master_address, .auth = c->cfg.secret_file[0] ? &c->key : NULL,
        .role = PROTO_ROLE_LOOKUP, .engine_id = id,
        .timeout_ms = (uint64_t)c->cfg.lookup_timeout_ms,
        .hello_timeout_ms = (uint64_t)c->cfg.lookup_timeout_ms,
    };
    if ((rc = mclient_create(&mc, &c->master)) < 0) {
        snprintf(err, errlen, "lookup client (distributed): out of memory");
        return rc;
    }
    return 0; /* connects at the first query (a master not up yet: misses) */
}

/* Standalone: a runtime of role lookup with the client's options. */
static int standalone_open(struct umbp_lookup_client *c, char *err, size_t errlen)
{
    const struct lookup_client_config *k = &c->cfg;
    json_object *o = json_object_new_object();
    if (!o) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    json_object_object_add(o, "mode", json_object_new_string("standalone"));
    json_object_object_add(o, "role", json_object_new_string("lookup"));
    json_object_object_add(o, "lookup_timeout_ms", json_object_new_int64(k->lookup_timeout_ms));
    json_object_object_add(o, "dp_rank", json_object_new_int64(k->dp_index));
    json_object_object_add(o, "startup_timeout_ms", json_object_new_int64(k->startup_timeout_ms));
    json_object_object_add(o, "reconnect_max_ms", json_object_new_int64(k->reconnect_max_ms));
    json_object_object_add(o, "copy_threads", json_object_new_int64(1));
    json_object_object_add(o, "max_inflight_ops", json_object_new_int64(4));
    if (k->socket_dir[0])
        json_object_object_add(o, "socket_dir", json_object_new_string(k->socket_dir));
    if (k->lookup_instance[0])
        json_object_object_add(o, "lookup_instance", json_object_new_string(k->lookup_instance));
    if (k->engine_id[0])
        json_object_object_add(o, "engine_id", json_object_new_string(k->engine_id));
    if (k->name_space[0])
        json_object_object_add(o, "namespace", json_object_new_string(k->name_space));
    int rc = umbp_runtime_create(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN),
                                 &c->rt);
    json_object_put(o);
    if (rc < 0)
        snprintf(err, errlen, "lookup client (standalone): %s", umbp_last_error());
    return rc;
}

static int embedded_open(struct umbp_lookup_client *c, char *err, size_t errlen)
{
    const struct lookup_client_config *k = &c->cfg;
    char dir[LK_PATH_MAX];
    bool is_default = !k->lookup_dir[0];
    if (is_default)
        lookup_default_dir(dir, sizeof(dir));
    else
        snprintf(dir, sizeof(dir), "%s", k->lookup_dir);
    snprintf(c->dir, sizeof(c->dir), "%s", dir);
    c->ranks = calloc((size_t)k->num_ranks, sizeof(*c->ranks));
    c->pfd = calloc((size_t)k->num_ranks, sizeof(*c->pfd));
    c->run = calloc((size_t)k->num_ranks, sizeof(*c->run));
    if (!c->ranks || !c->pfd || !c->run) {
        snprintf(err, errlen, "out of memory for %lld ranks", (long long)k->num_ranks);
        return -ENOMEM;
    }
    /* a stuck rank is dropped by this client first (rank_ask); the
     * session's own handshake bound is only a backstop */
    uint64_t now = now_ns(), hello_ms = 2 * stuck_limit_ms(c);
    struct net_session_config sc = {
        .peer = "the service",
        .backoff_max_ms = BACKOFF_MAX_MS,
        .hello_timeout_ms = hello_ms,
        .hello_timeout_name = "20 x lookup_timeout_ms (at least 10 s)",
        .stall_ms = 0, /* single flight: an orphan outstanding */
        .queue_in_hello = true,
    };
    for (size_t i = 0; i < (size_t)k->num_ranks; i++, c->nranks++) {
        struct lk_rank *r = &c->ranks[i];
        r->c = c;
        r->rank = (uint32_t)i;
        net_session_init(&r->s, &sc, &rank_ops, r);
        int rc = lookup_socket_path(dir, k->name_space, k->lookup_instance,
                                    (uint32_t)k->dp_index, (uint32_t)i, r->path,
                                    sizeof(r->path), err, errlen);
        if (rc < 0) {
            net_session_destroy(&r->s);
            return rc;
        }
        struct net_poll_config pc = {.path = r->path, .check_peer = rank_check_peer,
                                     .failed = rank_failed, .ctx = r};
        net_poll_init(&r->d, &r->s, &pc);
        net_session_retry_now(&r->s, now); /* the first query that asks it dials */
    }
    return lookup_dir_prepare(dir, is_default, "lookup_dir", err, errlen);
}

void umbp_lookup_client_destroy(umbp_lookup_client_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->ranks && i < c->nranks; i++) {
        net_session_destroy(&c->ranks[i].s); /* frees the calls still queued */
        net_poll_close(&c->ranks[i].d);
        free(c->ranks[i].spare);
    }
    if (c->ino_fd >= 0)
        close(c->ino_fd);
    free(c->ranks);
    free(c->pfd);
    free(c->run);
    free(c->ans);
    free(c->order);
    umbp_runtime_destroy(c->rt);
    mclient_destroy(c->master);
    free(c->locs);
    free(c);
}

int umbp_lookup_client_create(const char *json_options, umbp_lookup_client_t **out)
{
    char err[512] = "";
    if (!out) {
        umbp_set_error("umbp_lookup_client_create: out must not be NULL");
        return -EINVAL;
    }
    struct umbp_lookup_client *c = calloc(1, sizeof(*c));
    if (!c) {
        umbp_set_error("umbp_lookup_client_create: out of memory");
        return -ENOMEM;
    }
    c->ino_fd = -1;
    int rc = lookup_client_config_parse(json_options, &c->cfg, err, sizeof(err));
    if (rc == 0) {
        c->standalone = c->cfg.ask_server;
        rc = c->cfg.ask_master ? master_open(c, err, sizeof(err))
             : c->standalone   ? standalone_open(c, err, sizeof(err))
                               : embedded_open(c, err, sizeof(err));
    }
    if (rc < 0) {
        umbp_set_error("%s", err);
        umbp_lookup_client_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}
