/*
 * lookup_client.c - the scheduler's lookup client: how long a prefix of a
 * request's blocks is present on every rank, with no pool of its own.
 *
 * Embedded mode: one connection per rank to its worker's lookup service
 * (lookup_serve.c), dialled lazily and kept.  A query groups its rows by
 * rank, appends to each rank's output one LOOKUP frame per 65,536 keys
 * (behind a HELLO on a fresh connection: the handshake costs no extra round
 * trip), writes what the sockets take, and polls every rank's socket until
 * all have answered or lookup_timeout_ms has passed.  Answers land in the
 * client's scratch, never in the caller's memory, so a reply that arrives
 * after the query returned can only be read and discarded.
 *
 * Per rank: replies are expected in order (the expect FIFO: seq, type, key
 * count and the query that asked).  A rank whose replies are still due at a
 * query's deadline is stuck: later queries do not ask it (its rows miss,
 * UMBP_E_NOT_ATTEMPTED) but first read whatever it sent since, without
 * waiting; once every late reply has been read and discarded it is asked
 * again (single flight).  One still stuck after 10 x lookup_timeout_ms (at
 * least 5 s) is dropped and redialled, so a wedged process that never closes
 * does not miss forever.  A connection that fails (refused, closed, a
 * malformed or unexpected frame) is closed; the rank is redialled on a later
 * query after a backoff of 10 ms doubling to 1 s, reset by a HELLO_OK.  Once
 * a rank has failed, the lookup directory is watched (inotify, read without
 * waiting at each query): a rank's socket created, moved in or chmod-ed
 * (a restarted worker) ends its backoff, so the next query dials it at
 * once; without inotify the backoff alone.
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
#include <sys/un.h>
#include <unistd.h>

#include "inbuf.h"
#include "lookup_int.h"
#include "proto.h"
#include "util.h"

#define MAX_KEYS (1u << 24)        /* rows * n per query, as umbp_lookup */
#define IN_CHUNK (64u << 10)
#define READS_PER_WAKEUP 16
#define BACKOFF_MIN_MS 10
#define BACKOFF_MAX_MS 1000

/* A reply a rank still owes, in the order asked. */
struct lk_expect {
    uint64_t seq;
    uint16_t type;                 /* PROTO_HELLO_OK or PROTO_LOOKUP_R */
    uint32_t n;                    /* LOOKUP_R: its keys */
    uint64_t gen;                  /* the query that asked (older: discard) */
    size_t pos;                    /* LOOKUP_R: first key among the rank's keys */
};

struct lk_rank {
    uint32_t rank;
    char path[LK_PATH_MAX];
    int fd;                        /* -1: no connection */
    bool greeted;                  /* HELLO_OK read */
    bool stuck;                    /* replies due past a query's deadline */
    uint64_t stuck_ns;             /* since when */
    uint64_t next_seq;
    struct lk_expect *exp;         /* FIFO [exp_head, exp_head + exp_n) */
    size_t exp_head, exp_n, exp_cap;
    struct proto_buf out;          /* [out_off, out.len) not yet written */
    size_t out_off;
    uint8_t *in;                   /* [in_off, in_len) read, not yet parsed */
    size_t in_off, in_len, in_cap;
    uint64_t retry_ns;             /* no dial before this */
    uint32_t backoff_ms;
    /* the query in progress */
    size_t first, nrows;           /* its rows: order[first .. first + nrows) */
    bool asked;
    int rc;
};

struct umbp_lookup_client {
    struct lookup_client_config cfg;
    bool standalone;
    umbp_runtime_t *rt;            /* standalone: role lookup */
    struct lk_rank *ranks;         /* embedded: num_ranks */
    size_t nranks;
    uint64_t gen;                  /* queries so far */
    size_t n;                      /* keys per row of the query in progress */
    uint8_t *ans;                  /* rows * n answers of the query */
    size_t ans_cap;
    size_t *order;                 /* rows grouped by rank */
    size_t order_cap;
    struct pollfd *pfd;
    struct lk_rank **pfd_rank;
    char dir[LK_PATH_MAX];         /* embedded: where the ranks' sockets are */
    int ino_fd;                    /* watching dir since a rank failed; -1: not yet,
                                      -2: no inotify */
};

static uint64_t now_ns(void) { return umbp_now_ns(); }

/* ---- a rank's connection ------------------------------------------------------ */

static void rank_close(struct lk_rank *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    r->greeted = r->stuck = false;
    r->exp_head = r->exp_n = 0;
    r->out.len = 0; /* nothing is open: frames are appended whole */
    r->out_off = 0;
    r->in_off = r->in_len = 0;
}

/* The lookup directory's watch, from the first failure on. */
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

/* A rank's socket (re)appeared: its backoff ends (all ranks' on an
 * overflowed queue).  Never waits. */
static void dir_events(struct umbp_lookup_client *c)
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
                if (r->fd < 0 && ((e->mask & IN_Q_OVERFLOW) ||
                                  (e->len && name && strcmp(e->name, name + 1) == 0)))
                    r->retry_ns = r->backoff_ms = 0; /* a failure now retries in 10 ms */
            }
        }
    }
}

/* The connection failed: close it, and dial again only after the backoff. */
static void rank_fail(struct lk_rank *r, int rc, const char *why)
{
    /* a lost connection or a strange answer is news; no worker there (yet,
     * or any more) is only the outage going on */
    bool news = r->fd >= 0 || (rc != -ENOENT && rc != -ECONNREFUSED);
    uint32_t b = r->backoff_ms ? r->backoff_ms * 2 : BACKOFF_MIN_MS;
    r->backoff_ms = b > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : b;
    r->retry_ns = now_ns() + (uint64_t)r->backoff_ms * 1000000ull;
    umbp_log(news ? UMBP_LOG_WARN : UMBP_LOG_DEBUG,
             "lookup client: rank %u (%s): %s; its rows miss, redial in %u ms at the earliest",
             (unsigned)r->rank, r->path, why ? why : umbp_strerror(rc), r->backoff_ms);
    rank_close(r);
}

static int expect(struct lk_rank *r, uint64_t seq, uint16_t type, uint32_t n, uint64_t gen,
                  size_t pos)
{
    if (r->exp_n == 0)
        r->exp_head = 0;
    if (r->exp_head + r->exp_n == r->exp_cap) {
        size_t cap = r->exp_cap ? r->exp_cap * 2 : 8;
        struct lk_expect *p = realloc(r->exp, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        r->exp = p;
        r->exp_cap = cap;
    }
    r->exp[r->exp_head + r->exp_n++] = (struct lk_expect){seq, type, n, gen, pos};
    return 0;
}

static int rank_hello(struct umbp_lookup_client *c, struct lk_rank *r)
{
    struct proto_hello h = {
        .magic = PROTO_MAGIC, .version = PROTO_VERSION, .role = PROTO_ROLE_LOOKUP,
        .pid = (uint32_t)getpid(), .dp_rank = (uint32_t)c->cfg.dp_index, .tp_rank = r->rank,
    };
    for (size_t i = 0; i < UMBP_LOOKUP_NS_HEX_LEN; i++) {
        char ch = c->cfg.name_space[i];
        h.name_space[i] = (char)(ch >= 'A' && ch <= 'F' ? ch - 'A' + 'a' : ch);
    }
    uint64_t seq = r->next_seq++;
    int rc = proto_begin(&r->out, PROTO_HELLO, seq, 1, 0);
    if (rc == 0)
        rc = proto_put_hello(&r->out, &h);
    int erc = proto_end(&r->out);
    rc = rc ? rc : erc;
    return rc < 0 ? rc : expect(r, seq, PROTO_HELLO_OK, 1, 0, 0);
}

/* A non-blocking connect (a Unix connect completes or fails at once), the
 * peer's user checked, HELLO queued. */
static int rank_dial(struct umbp_lookup_client *c, struct lk_rank *r)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    char why[256];
    memcpy(a.sun_path, r->path, strlen(r->path) + 1);
    r->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r->fd < 0) {
        int e = errno;
        rank_fail(r, -e, "socket(AF_UNIX) failed");
        return -e;
    }
    if (connect(r->fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int e = errno;
        close(r->fd);
        r->fd = -1;
        snprintf(why, sizeof(why), "connect: %s (is its worker up and serving?)", strerror(e));
        rank_fail(r, -e, why);
        return -e;
    }
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(r->fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 ||
        (cr.uid != geteuid() && cr.uid != 0)) {
        snprintf(why, sizeof(why), "the socket is served by uid %u, not by this user; "
                 "refusing its answers", (unsigned)cr.uid);
        rank_fail(r, -EACCES, why);
        return -EACCES;
    }
    int rc = rank_hello(c, r);
    if (rc < 0)
        rank_fail(r, rc, "cannot build HELLO");
    return rc;
}

/* The rank's rows of this query as LOOKUP frames of at most 65,536 keys. */
static int rank_queue(struct umbp_lookup_client *c, struct lk_rank *r, const umbp_key_t *keys)
{
    size_t total = r->nrows * c->n, pos = 0;
    while (pos < total) {
        uint32_t cnt = (uint32_t)(total - pos > PROTO_MAX_RECORDS ? PROTO_MAX_RECORDS
                                                                  : total - pos);
        uint64_t seq = r->next_seq++;
        int rc = proto_begin(&r->out, PROTO_LOOKUP, seq, cnt, 0);
        for (uint32_t i = 0; rc == 0 && i < cnt; i++) {
            size_t p = pos + i, row = c->order[r->first + p / c->n];
            rc = proto_put_key(&r->out, &keys[row * c->n + p % c->n]);
        }
        int erc = proto_end(&r->out);
        if ((rc = rc ? rc : erc) < 0 || (rc = expect(r, seq, PROTO_LOOKUP_R, cnt, c->gen, pos)) < 0)
            return rc;
        pos += cnt;
    }
    return 0;
}

/* Writes what the socket takes.  < 0: the connection failed. */
static int rank_flush(struct lk_rank *r)
{
    int rc = proto_out_send(r->fd, &r->out, &r->out_off);
    if (rc < 0 || r->out_off < r->out.len)
        return rc;
    proto_buf_consume(&r->out, r->out.len);
    r->out_off = 0;
    return 0;
}

static bool rank_writing(const struct lk_rank *r) { return r->out_off < r->out.len; }

/* One whole frame from the rank.  < 0: malformed or unexpected (why says
 * which), the connection is to be closed. */
static int rank_frame(struct umbp_lookup_client *c, struct lk_rank *r,
                      const struct proto_frame *f, char *why, size_t whylen)
{
    struct proto_error pe = {0};
    if (f->type == PROTO_ERROR || (f->type == PROTO_HELLO_ERR && r->exp_n &&
                                   r->exp[r->exp_head].type == PROTO_HELLO_OK)) {
        if (proto_get_error(f, &pe) < 0)
            snprintf(pe.message, sizeof(pe.message), "(unreadable)");
        snprintf(why, whylen, "the service refused: %s", pe.message);
        return f->type == PROTO_HELLO_ERR && pe.status < 0 ? pe.status : -EPROTO;
    }
    if (r->exp_n == 0) {
        snprintf(why, whylen, "%s (seq %llu) with nothing asked", proto_type_name(f->type),
                 (unsigned long long)f->seq);
        return -EPROTO;
    }
    struct lk_expect *e = &r->exp[r->exp_head];
    if (f->type != e->type || f->seq != e->seq) {
        snprintf(why, whylen, "%s seq %llu, expected %s seq %llu", proto_type_name(f->type),
                 (unsigned long long)f->seq, proto_type_name(e->type),
                 (unsigned long long)e->seq);
        return -EPROTO;
    }
    if (e->type == PROTO_HELLO_OK) {
        struct proto_welcome w;
        char err[PROTO_ERRMSG_MAX] = "";
        if (proto_get_welcome(f, &w, err, sizeof(err)) < 0 || w.version != PROTO_VERSION) {
            snprintf(why, whylen, "HELLO_OK: %s", err[0] ? err : "another protocol version");
            return -EPROTO;
        }
        r->greeted = true;
        r->backoff_ms = 0;
    } else {
        if (f->n != e->n) {
            snprintf(why, whylen, "LOOKUP_R.n: %u answers to %u keys", f->n, e->n);
            return -EPROTO;
        }
        bool mine = e->gen == c->gen; /* else a late reply: read and discard */
        for (uint32_t i = 0; i < f->n; i++) {
            uint8_t v;
            if (proto_get_u8(f, i, &v) < 0) {
                snprintf(why, whylen, "LOOKUP_R.present[%u]: not 0 or 1", i);
                return -EPROTO;
            }
            if (mine) {
                size_t p = e->pos + i, row = c->order[r->first + p / c->n];
                c->ans[row * c->n + p % c->n] = v;
            }
        }
    }
    r->exp_head++;
    r->exp_n--;
    return 0;
}

static int in_room(struct lk_rank *r)
{
    return proto_in_reserve(&r->in, &r->in_off, &r->in_len, &r->in_cap, IN_CHUNK);
}

/* Reads what has arrived (without waiting) and handles its frames.  0 (the
 * connection may have been closed cleanly: nothing was due), or < 0 with
 * why set: the connection is to be failed. */
static int rank_read(struct umbp_lookup_client *c, struct lk_rank *r, char *why, size_t whylen)
{
    for (int i = 0; i < READS_PER_WAKEUP; i++) {
        if (in_room(r) < 0) {
            snprintf(why, whylen, "out of memory for its replies");
            return -ENOMEM;
        }
        ssize_t n = recv(r->fd, r->in + r->in_len, r->in_cap - r->in_len, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n <= 0) {
            int e = n == 0 ? ECONNRESET : errno;
            if (n == 0 && r->exp_n == 0) {
                rank_close(r); /* answered everything, then left: dial again next time */
                return 0;
            }
            snprintf(why, whylen, "%s", n == 0 ? "the service closed the connection"
                                               : strerror(e));
            return -e;
        }
        r->in_len += (size_t)n;
        for (;;) {
            struct proto_frame f;
            char err[PROTO_ERRMSG_MAX] = "";
            long used = proto_frame_parse(r->in + r->in_off, r->in_len - r->in_off, true, &f,
                                          err, sizeof(err));
            if (used == 0)
                break;
            if (used < 0) {
                snprintf(why, whylen, "malformed frame: %s", err);
                return -EPROTO;
            }
            int rc = rank_frame(c, r, &f, why, whylen);
            if (rc < 0)
                return rc;
            r->in_off += (size_t)used;
        }
    }
    return 0;
}

/* How long a stuck rank keeps its connection. */
static uint64_t stuck_limit_ns(const struct umbp_lookup_client *c)
{
    uint64_t ms = 10ull * (uint64_t)c->cfg.lookup_timeout_ms;
    return (ms < 5000 ? 5000 : ms) * 1000000ull;
}

/* A stuck rank: what it wrote since, without waiting. */
static void rank_drain(struct umbp_lookup_client *c, struct lk_rank *r)
{
    char why[PROTO_ERRMSG_MAX + 64] = "";
    int rc = rank_flush(r);
    if (rc == 0)
        rc = rank_read(c, r, why, sizeof(why));
    if (rc < 0) {
        rank_fail(r, rc, why[0] ? why : NULL);
        return;
    }
    if (r->fd >= 0 && r->exp_n == 0) {
        r->stuck = false;
        umbp_log(UMBP_LOG_INFO, "lookup client: rank %u (%s) answered its late query; asked "
                 "again", (unsigned)r->rank, r->path);
    } else if (r->fd < 0) {
        r->stuck = false;
    }
}

/* ---- a query, embedded ----------------------------------------------------------- */

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

/* Asks rank r (if it may be asked) for its rows: dial, queue, write. */
static void rank_ask(struct umbp_lookup_client *c, struct lk_rank *r, const umbp_key_t *keys,
                     uint64_t now)
{
    int rc;
    r->asked = false;
    r->rc = 0;
    if (r->stuck)
        rank_drain(c, r);
    if (r->stuck && now - r->stuck_ns > stuck_limit_ns(c)) {
        /* a rank that neither answers nor closes is dropped and dialled
         * again later, so one wedged process does not miss forever */
        rank_fail(r, UMBP_E_TIMEOUT, "no answer to a query for 10 x lookup_timeout_ms (at "
                  "least 5 s); reconnecting");
        r->stuck = false;
        r->rc = UMBP_E_NOT_ATTEMPTED;
        return;
    }
    if (r->stuck) {
        r->rc = UMBP_E_NOT_ATTEMPTED; /* single flight: its last query is still due */
        return;
    }
    if (r->fd < 0) {
        if (now < r->retry_ns) {
            r->rc = UMBP_E_NOT_ATTEMPTED; /* failed recently: backing off */
            return;
        }
        if ((rc = rank_dial(c, r)) < 0) {
            r->rc = rc;
            return;
        }
    }
    if ((rc = rank_queue(c, r, keys)) < 0) {
        rank_fail(r, rc, "cannot build the LOOKUP frames");
        r->rc = rc;
        return;
    }
    r->asked = true;
    if ((rc = rank_flush(r)) < 0) {
        rank_fail(r, rc, "send failed");
        r->rc = rc;
    }
}

static bool rank_waiting(const struct lk_rank *r)
{
    return r->asked && r->rc == 0 && r->fd >= 0 && r->exp_n > 0;
}

/* Polls the asked ranks until each has answered or the deadline passed. */
static void wait_answers(struct umbp_lookup_client *c, uint64_t deadline)
{
    for (;;) {
        size_t k = 0;
        for (size_t i = 0; i < c->nranks; i++) {
            struct lk_rank *r = &c->ranks[i];
            if (!rank_waiting(r))
                continue;
            c->pfd[k] = (struct pollfd){r->fd, (short)(POLLIN | (rank_writing(r) ? POLLOUT : 0)), 0};
            c->pfd_rank[k++] = r;
        }
        uint64_t now = now_ns();
        if (k == 0 || now >= deadline)
            return;
        int ms = (int)((deadline - now + 999999) / 1000000);
        int n = poll(c->pfd, (nfds_t)k, ms);
        if (n < 0 && errno != EINTR)
            return; /* cannot wait: what is due counts as timed out */
        for (size_t i = 0; n > 0 && i < k; i++) {
            struct lk_rank *r = c->pfd_rank[i];
            short ev = c->pfd[i].revents;
            char why[PROTO_ERRMSG_MAX + 64] = "";
            int rc = 0;
            if (ev & POLLOUT)
                rc = rank_flush(r);
            if (rc == 0 && (ev & (POLLIN | POLLHUP | POLLERR)))
                rc = rank_read(c, r, why, sizeof(why));
            if (rc < 0) {
                rank_fail(r, rc, why[0] ? why : NULL);
                r->rc = rc;
            }
        }
    }
}

static int embedded_query(struct umbp_lookup_client *c, const umbp_key_t *keys, size_t rows,
                          const uint32_t *row_rank)
{
    uint64_t now = now_ns(), deadline = now + (uint64_t)c->cfg.lookup_timeout_ms * 1000000ull;
    c->gen++;
    dir_events(c);
    group_rows(c, rows, row_rank);
    for (size_t k = 0; k < c->nranks; k++)
        if (c->ranks[k].nrows)
            rank_ask(c, &c->ranks[k], keys, now);
    wait_answers(c, deadline);
    for (size_t k = 0; k < c->nranks && c->ino_fd == -1; k++)
        if (c->ranks[k].fd < 0 && c->ranks[k].retry_ns)
            dir_watch(c); /* a rank failed: watch for its return */
    int rc = 0;
    for (size_t k = 0; k < c->nranks; k++) {
        struct lk_rank *r = &c->ranks[k];
        if (!r->nrows)
            continue;
        if (rank_waiting(r)) {
            r->stuck = true;
            r->stuck_ns = now_ns();
            r->rc = UMBP_E_TIMEOUT;
            umbp_log(UMBP_LOG_WARN, "lookup client: rank %u (%s) did not answer within "
                     "lookup_timeout_ms (%lld); its rows miss until it answers",
                     (unsigned)r->rank, r->path, (long long)c->cfg.lookup_timeout_ms);
        }
        if (r->rc == 0)
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
    c->nranks = (size_t)k->num_ranks;
    c->ranks = calloc(c->nranks, sizeof(*c->ranks));
    c->pfd = calloc(c->nranks, sizeof(*c->pfd));
    c->pfd_rank = calloc(c->nranks, sizeof(*c->pfd_rank));
    if (!c->ranks || !c->pfd || !c->pfd_rank) {
        snprintf(err, errlen, "out of memory for %zu ranks", c->nranks);
        return -ENOMEM;
    }
    for (size_t i = 0; i < c->nranks; i++) {
        struct lk_rank *r = &c->ranks[i];
        r->rank = (uint32_t)i;
        r->fd = -1;
        r->next_seq = 1;
        int rc = lookup_socket_path(dir, k->name_space, k->lookup_instance,
                                    (uint32_t)k->dp_index, (uint32_t)i, r->path,
                                    sizeof(r->path), err, errlen);
        if (rc < 0)
            return rc;
    }
    return lookup_dir_prepare(dir, is_default, "lookup_dir", err, errlen);
}

void umbp_lookup_client_destroy(umbp_lookup_client_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->ranks && i < c->nranks; i++) {
        struct lk_rank *r = &c->ranks[i];
        if (r->fd >= 0)
            close(r->fd);
        proto_buf_free(&r->out);
        free(r->in);
        free(r->exp);
    }
    if (c->ino_fd >= 0)
        close(c->ino_fd);
    free(c->ranks);
    free(c->pfd);
    free(c->pfd_rank);
    free(c->ans);
    free(c->order);
    umbp_runtime_destroy(c->rt);
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
        rc = c->standalone ? standalone_open(c, err, sizeof(err))
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
