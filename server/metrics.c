/*
 * metrics.c - umbp-server's Prometheus endpoint: GET /metrics on
 * metrics_address:metrics_port (metrics_port 0, the default, = off), text
 * format 0.0.4.  The series are listed in docs/operations.md, Standalone mode, Metrics.
 *
 * Threads.  The loop thread owns the store, the sessions and the counters
 * (srv.h), so libmicrohttpd's one thread (MHD_USE_INTERNAL_POLLING_THREAD)
 * never reads them.  Snapshots on demand, double buffered:
 *
 *   HTTP thread                          loop thread (render_cb)
 *   lock; want = ++asked;
 *   ev_async_send(render_w);  ------->   lock; gen = asked; unlock
 *   cond wait until rendered >= want     render everything into `back`
 *     or SNAPSHOT_WAIT_MS pass           lock; swap back/front;
 *   copy front; unlock                     rendered = gen; broadcast; unlock
 *
 * A scrape thus sees the state of a moment after it arrived; when the loop
 * is busier than SNAPSHOT_WAIT_MS (or not running: before umbp_server_run,
 * after stop) it gets the previous snapshot, or 503 before the first.
 * Nothing is rendered unless someone scrapes, and a render is one pass of
 * plain reads on the loop thread (its cost grows with the sessions).
 * ev_async coalesces: scrapes waiting together share one render.  (The
 * other design, a render on every housekeeping tick, would cost the loop a
 * render each 5 ms .. 1 s with no scraper at all and serve data a tick old.)
 *
 * Ownership: `back`, the histograms and the render state belong to the
 * loop thread; `front`, asked, rendered and has_snapshot are under `mu`;
 * the HTTP thread touches only those, `loop` and render_w (ev_async_send is
 * thread-safe).  The listening socket is bound here (so a taken port is
 * reported exactly) and handed to libmicrohttpd, which closes it when it
 * stops, and also when it fails to start (0.9.75, checked by forcing its
 * thread creation to fail).  stop joins the HTTP thread before anything is
 * freed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"
#include "srv.h"
#include "util.h"

#define SNAPSHOT_WAIT_MS 100
#define HTTP_MAX_CONNECTIONS 32
#define HTTP_TIMEOUT_S 10
#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Request types with a latency histogram. */
static const uint16_t timed_types[] = {PROTO_LOOKUP, PROTO_RESERVE, PROTO_PUBLISH,
                                       PROTO_ACQUIRE, PROTO_RELEASE};
#define NTIMED (sizeof(timed_types) / sizeof(timed_types[0]))

/* Upper bounds (inclusive, as Prometheus' le) in ns, and as a Go client
 * would print them in seconds. */
static const struct {
    uint64_t ns;
    const char *le;
} buckets[] = {
    {1000, "1e-06"},      {2000, "2e-06"},       {5000, "5e-06"},      {10000, "1e-05"},
    {20000, "2e-05"},     {50000, "5e-05"},      {100000, "0.0001"},   {200000, "0.0002"},
    {500000, "0.0005"},   {1000000, "0.001"},    {2000000, "0.002"},   {5000000, "0.005"},
    {10000000, "0.01"},   {20000000, "0.02"},    {50000000, "0.05"},   {100000000, "0.1"},
};
#define NBUCKETS (sizeof(buckets) / sizeof(buckets[0]))

struct hist {
    uint64_t count[NBUCKETS + 1]; /* per bucket, not cumulative; last = +Inf */
    uint64_t sum_ns, n;
};

/* A growing text buffer; `failed` once an allocation failed. */
struct mbuf {
    char *p;
    size_t len, cap;
    bool failed;
};

struct srv_metrics {
    struct umbp_server *srv;
    struct ev_loop *loop;
    ev_async render_w;
    /* loop thread */
    struct hist hist[NTIMED];
    struct mbuf back;
    bool logged_oom;
    /* HTTP thread (started and stopped by the loop thread) */
    struct MHD_Daemon *mhd;
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    struct mbuf front;
    uint64_t asked, rendered;
    bool has_snapshot;
};

/* ---- text ------------------------------------------------------------------------- */

static bool mbuf_reserve(struct mbuf *b, size_t more)
{
    if (b->failed)
        return false;
    if (b->len + more < b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 16384;
    while (cap <= b->len + more)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static void put(struct mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct mbuf *b, const char *fmt, ...)
{
    va_list ap;
    if (!mbuf_reserve(b, 256))
        return;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n >= b->cap - b->len) { /* did not fit: grow and print again */
        if (!mbuf_reserve(b, (size_t)n + 1))
            return;
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

/* Length of the well-formed UTF-8 sequence at s (1..4), or 0. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
             : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    /* overlong forms, surrogates, beyond U+10FFFF */
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0) ||
        (c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] >= 0x90))
        return 0;
    return n;
}

/* A label value as the text format requires: \\, \" and \n escaped, valid
 * UTF-8 (a client's bytes that are not become U+FFFD). */
static void put_label_value(struct mbuf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    if (!mbuf_reserve(b, 3 * strlen(s) + 1))
        return;
    while (*p) {
        size_t n = utf8_len(p);
        if (n == 0) {
            memcpy(b->p + b->len, "\xEF\xBF\xBD", 3);
            b->len += 3;
            p++;
        } else if (*p == '\\' || *p == '"' || *p == '\n') {
            b->p[b->len++] = '\\';
            b->p[b->len++] = *p == '\n' ? 'n' : (char)*p;
            p++;
        } else {
            memcpy(b->p + b->len, p, n);
            b->len += n;
            p += n;
        }
    }
    b->p[b->len] = '\0';
}

static void put_head(struct mbuf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* ---- rendering (loop thread) ---------------------------------------------------------- */

struct scalar {
    const char *name, *type, *help;
    uint64_t value;
};

static void put_scalars(struct mbuf *b, const struct scalar *all, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        put_head(b, all[i].name, all[i].type, all[i].help);
        put(b, "%s %llu\n", all[i].name, (unsigned long long)all[i].value);
    }
}

static void render_scalars(struct mbuf *b, const struct umbp_server *s)
{
    struct umbp_tier_usage u;
    uint64_t held, expired;
    dram_store_usage(s->store, &u);
    dram_store_writer_counts(s->store, &held, &expired);
    const struct srv_counters *c = &s->c;
    const struct scalar all[] = {
        {"umbp_capacity_bytes", "gauge", "Bytes the pool may hold.", u.capacity_bytes},
        {"umbp_used_bytes", "gauge", "Bytes of the pool in use (objects, pending ones "
         "included).", u.used_bytes},
        {"umbp_objects", "gauge", "Objects in the pool.", u.num_objects},
        {"umbp_pending", "gauge", "Objects being written: reserved, not yet published.",
         u.num_pending},
        {"umbp_leased", "gauge", "Objects being read: under at least one lease.",
         u.num_leased},
        {"umbp_evictions_total", "counter", "Objects evicted.", u.evictions},
        {"umbp_evicted_bytes_total", "counter", "Bytes evicted.", u.evicted_bytes},
        {"umbp_leases_expired_total", "counter", "Leases that expired before their release.",
         u.leases_expired},
        {"umbp_lookups_total", "counter", "LOOKUP requests.", c->lookups},
        {"umbp_lookup_keys_total", "counter", "Keys asked by LOOKUP requests.",
         c->lookup_keys},
        {"umbp_lookup_hits_total", "counter", "Keys LOOKUP found.", c->lookup_hits},
        {"umbp_reserves_total", "counter", "Keys asked by RESERVE requests.", c->reserves},
        {"umbp_publishes_total", "counter", "Objects published.", c->publishes},
        {"umbp_acquires_total", "counter", "Keys asked by ACQUIRE requests.", c->acquires},
        {"umbp_acquire_hits_total", "counter", "Keys ACQUIRE found (leases granted).",
         c->acquire_hits},
        {"umbp_protocol_errors_total", "counter", "Sessions ended for a malformed frame.",
         c->protocol_errors},
        {"umbp_refused_connections_total", "counter", "Connections refused (not allowed, or "
         "max_sessions reached).", c->refused_connections},
        {"umbp_sessions", "gauge", "Connected clients.", (uint64_t)s->svc.nconns},
        {"umbp_input_budget_used_bytes", "gauge", "Bytes of input_budget_bytes that "
         "sessions' unfinished frames hold.", (uint64_t)s->svc.in_over},
        {"umbp_input_budget_waits_total", "counter", "Frames that waited for "
         "input_budget_bytes (their sessions not read meanwhile).", s->svc.starved_total},
        {"umbp_held_regions", "gauge", "Regions of unfinished puts whose session ended, kept "
         "out of use until their writers' declared deadlines.", held},
        {"umbp_reservations_expired_total", "counter", "Reservations reclaimed at their "
         "writer's deadline, never published nor aborted.", expired},
    };
    put_scalars(b, all, sizeof(all) / sizeof(all[0]));
}

static const char *const role_names[] = {
    [PROTO_ROLE_WORKER] = "worker", [PROTO_ROLE_LOOKUP] = "lookup",
    [PROTO_ROLE_ADMIN] = "admin",
};

static void put_session_labels(struct mbuf *b, const struct srv_session *ss)
{
    uint32_t role = ss->hello.role;
    put(b, "{session=\"%llu\",pid=\"%d\",role=\"%s\",engine_id=\"",
        (unsigned long long)ss->conn.id, (int)ss->conn.pid,
        role < sizeof(role_names) / sizeof(role_names[0]) ? role_names[role] : "?");
    put_label_value(b, ss->hello.engine_id);
    put(b, "\",namespace=\"");
    put_label_value(b, ss->hello.name_space);
    put(b, "\"}");
}

/* One series per session that has said HELLO (before it, it has no role). */
static void render_sessions(struct mbuf *b, const struct umbp_server *s)
{
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"umbp_session_leases", "gauge", "Leases the session holds."},
        {"umbp_session_reservations", "gauge", "Reservations the session holds (not yet "
         "published or aborted)."},
        {"umbp_session_requests_total", "counter", "Request frames the session sent."},
    };
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        put_head(b, fam[f].name, fam[f].type, fam[f].help);
        for (SESSIONS_EACH(s, ss)) {
            if (!session_greeted(ss))
                continue;
            uint64_t v = f == 0 ? ss->leases.n : f == 1 ? ss->reservations.n : ss->requests;
            put(b, "%s", fam[f].name);
            put_session_labels(b, ss);
            put(b, " %llu\n", (unsigned long long)v);
        }
    }
}

/* Namespaces with a quota or objects, labelled by the store's numeric id. */
static void render_namespaces(struct mbuf *b, const struct umbp_server *s)
{
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"umbp_namespace_used_bytes", "gauge", "Bytes the namespace's objects use."},
        {"umbp_namespace_quota_bytes", "gauge", "The namespace's quota (only namespaces "
         "that have one)."},
        {"umbp_namespace_objects", "gauge", "Objects of the namespace."},
        {"umbp_namespace_evictions_total", "counter", "Objects of the namespace evicted."},
    };
    struct dram_store_ns_usage u[DRAM_STORE_MAX_NS];
    for (unsigned ns = 0; ns < DRAM_STORE_MAX_NS; ns++)
        dram_store_ns_usage(s->store, ns, &u[ns]);
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        put_head(b, fam[f].name, fam[f].type, fam[f].help);
        for (unsigned ns = 0; ns < DRAM_STORE_MAX_NS; ns++) {
            if (!u[ns].quota && !u[ns].objects)
                continue;
            if (f == 1 && !u[ns].quota)
                continue;
            uint64_t v = f == 0 ? u[ns].used_bytes : f == 1 ? u[ns].quota
                       : f == 2 ? u[ns].objects : u[ns].evictions;
            put(b, "%s{namespace_id=\"%u\",namespace=\"", fam[f].name, ns);
            put_label_value(b, ns < s->nns ? s->ns_names[ns] : "");
            put(b, "\"} %llu\n", (unsigned long long)v);
        }
    }
}

/* A node's server (node.h): the hosted rdma tier's counters. */
static void render_node(struct mbuf *b, const struct umbp_server *s)
{
    struct srv_node_stats n;
    if (!srv_node_stats(s->node, &n))
        return;
    const struct scalar all[] = {
        {"umbp_node_registered", "gauge", "1 while the master has this server registered as "
         "a node.", n.registered},
        {"umbp_node_ref", "gauge", "This node's number at the master (0: not registered).",
         n.node_ref},
        {"umbp_node_keys", "gauge", "Keys the master is told this node holds.", n.live_keys},
        {"umbp_node_remote_hits_total", "counter", "Keys fetched from other nodes for this "
         "host's engines.", n.remote_hits},
        {"umbp_node_remote_misses_total", "counter", "Keys no live node held (or none could "
         "be asked), by the last owner asked.", n.remote_misses},
        {"umbp_node_remote_failed_total", "counter", "Keys whose fetch failed (the owner "
         "reset or timed out).", n.remote_failed},
        {"umbp_node_remote_retries_total", "counter", "Keys asked again at another owner "
         "after a fetch failed at once (the owner reset, or no longer had the key).",
         n.remote_retries},
        {"umbp_node_remote_bytes_total", "counter", "Bytes fetched from other nodes.",
         n.remote_bytes},
        {"umbp_node_replicas_total", "counter", "Fetched objects kept in the pool as "
         "replicas.", n.replicas},
        {"umbp_node_fetched_eager_total", "counter", "Objects fetched whose bytes came in "
         "UCX's eager protocol (with the reply).", n.data_eager},
        {"umbp_node_fetched_rendezvous_total", "counter", "Objects fetched whose bytes came "
         "by UCX's rendezvous protocol (a handshake, then the bytes).", n.data_rndv},
        {"umbp_node_served_keys_total", "counter", "Objects this node sent to other nodes.",
         n.served_keys},
        {"umbp_node_served_bytes_total", "counter", "Bytes this node sent to other nodes.",
         n.served_bytes},
        {"umbp_node_locates_total", "counter", "LOCATE calls to the master.", n.locates},
        {"umbp_node_heartbeats_total", "counter", "Heartbeats the master acknowledged.",
         n.heartbeats},
        {"umbp_node_resyncs_total", "counter", "Full key-set resyncs sent to the master.",
         n.resyncs},
        {"umbp_node_registers_total", "counter", "Registrations with a master.", n.registers},
        {"umbp_node_reports_total", "counter", "Failing nodes reported to the master.",
         n.reports},
    };
    put_scalars(b, all, sizeof(all) / sizeof(all[0]));
    put_head(b, "umbp_node_info", "gauge", "The UCX transports the node uses (UCX_TLS as "
             "UCX read it).");
    put(b, "umbp_node_info{transports=\"");
    put_label_value(b, n.transports);
    put(b, "\"} 1\n");
}

static void render_histograms(struct mbuf *b, const struct srv_metrics *m)
{
    const char *name = "umbp_request_duration_seconds";
    put_head(b, name, "histogram", "Time the server took to handle a request frame, by "
             "type (all its keys, inline eviction included).");
    for (size_t t = 0; t < NTIMED; t++) {
        const struct hist *h = &m->hist[t];
        const char *type = proto_type_name(timed_types[t]);
        uint64_t cum = 0;
        for (size_t i = 0; i < NBUCKETS; i++) {
            cum += h->count[i];
            put(b, "%s_bucket{type=\"%s\",le=\"%s\"} %llu\n", name, type, buckets[i].le,
                (unsigned long long)cum);
        }
        put(b, "%s_bucket{type=\"%s\",le=\"+Inf\"} %llu\n", name, type,
            (unsigned long long)h->n);
        put(b, "%s_sum{type=\"%s\"} %llu.%09llu\n", name, type,
            (unsigned long long)(h->sum_ns / 1000000000u),
            (unsigned long long)(h->sum_ns % 1000000000u));
        put(b, "%s_count{type=\"%s\"} %llu\n", name, type, (unsigned long long)h->n);
    }
}

static void render_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    struct srv_metrics *m = umbp_container_of(w, struct srv_metrics, render_w);
    (void)loop;
    (void)revents;
    pthread_mutex_lock(&m->mu);
    uint64_t gen = m->asked; /* every scrape that asked so far gets this render */
    pthread_mutex_unlock(&m->mu);

    m->back.len = 0;
    m->back.failed = false;
    render_scalars(&m->back, m->srv);
    render_sessions(&m->back, m->srv);
    render_namespaces(&m->back, m->srv);
    render_node(&m->back, m->srv);
    render_histograms(&m->back, m);
    bool ok = !m->back.failed;

    pthread_mutex_lock(&m->mu);
    if (ok) {
        struct mbuf t = m->front;
        m->front = m->back;
        m->back = t;
        m->has_snapshot = true;
    }
    m->rendered = gen; /* on failure the waiters get the previous snapshot now */
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->mu);
    if (!ok && !m->logged_oom) {
        umbp_log(UMBP_LOG_WARN, "metrics: no memory to render a snapshot; scrapes get the "
                 "previous one");
        m->logged_oom = true;
    }
}

void srv_metrics_observe(struct umbp_server *s, uint16_t type, uint64_t ns)
{
    struct srv_metrics *m = s->metrics;
    if (!m)
        return;
    for (size_t t = 0; t < NTIMED; t++)
        if (timed_types[t] == type) {
            struct hist *h = &m->hist[t];
            size_t i = 0;
            while (i < NBUCKETS && ns > buckets[i].ns)
                i++;
            h->count[i]++;
            h->sum_ns += ns;
            h->n++;
            return;
        }
}

/* ---- serving (HTTP thread) ------------------------------------------------------------ */

/* A copy of the freshest snapshot SNAPSHOT_WAIT_MS allow (see the top), or
 * NULL: none yet, or no memory (*why says which). */
static char *snapshot_copy(struct srv_metrics *m, size_t *len, const char **why)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += SNAPSHOT_WAIT_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;

    pthread_mutex_lock(&m->mu);
    uint64_t want = ++m->asked;
    ev_async_send(m->loop, &m->render_w);
    while (m->rendered < want)
        if (pthread_cond_timedwait(&m->cond, &m->mu, &until) == ETIMEDOUT)
            break;
    char *copy = NULL;
    *why = "umbp-server has not rendered its metrics yet (its loop is not running)\n";
    if (m->has_snapshot) {
        *why = "umbp-server has no memory for a copy of its metrics\n";
        if ((copy = malloc(m->front.len + 1)))
            memcpy(copy, m->front.p, m->front.len);
        *len = m->front.len;
    }
    pthread_mutex_unlock(&m->mu);
    return copy;
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status,
                               struct MHD_Response *r, const char *type, const char *allow)
{
    if (!r)
        return MHD_NO; /* no memory: libmicrohttpd closes the connection */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status,
                                    const char *text, const char *allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text,
                                                             MHD_RESPMEM_PERSISTENT);
    return respond(conn, status, r, "text/plain; charset=utf-8", allow);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    struct srv_metrics *m = cls;
    if (strcmp(url, "/metrics") != 0)
        return respond_text(conn, MHD_HTTP_NOT_FOUND, "umbp-server serves GET /metrics "
                            "only\n", NULL);
    /* HEAD is GET without the body (libmicrohttpd drops it) */
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "umbp-server serves GET "
                            "/metrics only\n", "GET, HEAD");
    size_t len = 0;
    const char *why;
    char *text = snapshot_copy(m, &len, &why);
    if (!text)
        return respond_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, why, NULL);
    struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(len, text,
                                                                                free);
    if (!r)
        free(text);
    return respond(conn, MHD_HTTP_OK, r, CONTENT_TYPE, NULL);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    umbp_log(UMBP_LOG_WARN, "metrics: libmicrohttpd: %s", msg);
}

/* ---- start, stop ----------------------------------------------------------------------- */

struct endpoint {
    struct sockaddr_storage sa;
    socklen_t len;
    char text[80]; /* "127.0.0.1:9100", "[::1]:9100" */
};

static void endpoint_of(const struct srv_options *o, struct endpoint *e)
{
    struct sockaddr_in *v4 = (struct sockaddr_in *)&e->sa;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&e->sa;
    uint16_t port = (uint16_t)o->metrics_port;
    memset(e, 0, sizeof(*e));
    /* server_config.c accepted the address as one or the other */
    if (inet_pton(AF_INET, o->metrics_address, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        e->len = sizeof(*v4);
        snprintf(e->text, sizeof(e->text), "%s:%u", o->metrics_address, port);
    } else {
        inet_pton(AF_INET6, o->metrics_address, &v6->sin6_addr);
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        e->len = sizeof(*v6);
        snprintf(e->text, sizeof(e->text), "[%s]:%u", o->metrics_address, port);
    }
}

static int listen_on(const struct srv_options *o, const struct endpoint *e, int *out,
                     char *err, size_t errlen)
{
    int one = 1, fd = socket(e->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, (const struct sockaddr *)&e->sa, e->len) < 0 || listen(fd, 64) < 0) {
        int rc = -errno;
        snprintf(err, errlen, "metrics_port=%lld: cannot listen on %s (%s); %s",
                 (long long)o->metrics_port, e->text, strerror(-rc),
                 rc == -EADDRINUSE ? "another process holds the port: choose another "
                 "metrics_port, or set 0 to turn /metrics off"
                 : "check metrics_address (an address of this host) and metrics_port");
        if (fd >= 0)
            close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

/* libmicrohttpd's thread is created with every signal blocked, so SIGTERM
 * and SIGINT reach the loop thread's process handler, never it. */
static struct MHD_Daemon *http_start(struct srv_metrics *m, int fd)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    /* AUTO: epoll, so descriptors above FD_SETSIZE (many sessions) work */
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG, 0, NULL, NULL,
        on_request, m, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_TIMEOUT_S, MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return d;
}

static int sync_init(struct srv_metrics *m)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return -ENOMEM;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (rc == 0 && (rc = pthread_cond_init(&m->cond, &a)) == 0 &&
        (rc = pthread_mutex_init(&m->mu, NULL)) != 0)
        pthread_cond_destroy(&m->cond);
    pthread_condattr_destroy(&a);
    return -rc;
}

int srv_metrics_start(struct umbp_server *s, char *err, size_t errlen)
{
    const struct srv_options *o = &s->cfg->opt;
    struct endpoint e;
    int fd = -1, rc;
    if (o->metrics_port == 0)
        return 0;
    endpoint_of(o, &e);
    struct srv_metrics *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "out of memory for the metrics endpoint");
        return -ENOMEM;
    }
    m->srv = s;
    m->loop = s->loop;
    if ((rc = sync_init(m)) < 0) {
        snprintf(err, errlen, "metrics_port=%lld: cannot create a mutex (%s)",
                 (long long)o->metrics_port, strerror(-rc));
        goto fail_free;
    }
    if ((rc = listen_on(o, &e, &fd, err, errlen)) < 0)
        goto fail_sync;
    ev_async_init(&m->render_w, render_cb);
    ev_async_start(s->loop, &m->render_w);
    if (!(m->mhd = http_start(m, fd))) { /* it closed fd */
        snprintf(err, errlen, "metrics_port=%lld: libmicrohttpd could not serve %s (see its "
                 "message above); set metrics_port 0 to run without /metrics",
                 (long long)o->metrics_port, e.text);
        rc = -EIO;
        goto fail_async;
    }
    s->metrics = m;
    umbp_log(UMBP_LOG_INFO, "metrics: serving http://%s/metrics", e.text);
    return 0;
fail_async:
    ev_async_stop(s->loop, &m->render_w);
fail_sync:
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cond);
fail_free:
    free(m);
    return rc;
}

void srv_metrics_stop(struct umbp_server *s)
{
    struct srv_metrics *m = s->metrics;
    if (!m)
        return;
    MHD_stop_daemon(m->mhd); /* joins the HTTP thread, closes the port */
    ev_async_stop(s->loop, &m->render_w);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cond);
    free(m->front.p);
    free(m->back.p);
    free(m);
    s->metrics = NULL;
}
