/*
 * master_metrics.c - umbp-master's Prometheus endpoint: GET /metrics on
 * metrics_address:metrics_port (0 = off), text format 0.0.4.  The series
 * are listed in docs/operations.md, "umbp-master".
 *
 * Threads.  The loop thread owns the directory and the counters; it
 * renders a snapshot at every sweep tick (heartbeat_suspect_ms / 4, within
 * 25 ms .. 1 s) into `back` and swaps it with `front` under `mu`.
 * libmicrohttpd's one thread copies `front` under `mu` and serves it, so a
 * scrape sees the state of at most one tick ago and never reads the
 * directory.  (umbp-server renders on demand instead: its state changes
 * with every request, the master's mostly with the heartbeats a tick
 * summarises.)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ha.h"
#include "master_int.h"
#include "util.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* LOCATE handling time, upper bounds in ns and as Prometheus prints them. */
static const struct {
    uint64_t ns;
    const char *le;
} buckets[] = {
    {1000, "1e-06"},   {5000, "5e-06"},     {10000, "1e-05"},   {50000, "5e-05"},
    {100000, "0.0001"}, {500000, "0.0005"}, {1000000, "0.001"}, {10000000, "0.01"},
};
#define NBUCKETS (sizeof(buckets) / sizeof(buckets[0]))

struct text {
    char *p;
    size_t len, cap;
};

struct master_metrics {
    struct MHD_Daemon *http;
    pthread_mutex_t mu;
    struct text front;            /* under mu */
    struct text back;             /* loop thread */
    uint64_t count[NBUCKETS + 1], sum_ns, n; /* loop thread */
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (t->p && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap * 2 : 8192;
        while (cap < t->len + (size_t)n + 1)
            cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p)
            return;
        t->p = p;
        t->cap = cap;
    }
}

static void metric(struct text *t, const char *name, const char *type, const char *help,
                   uint64_t v)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
        (unsigned long long)v);
}

void master_metrics_observe(struct umbp_master *m, uint64_t ns)
{
    struct master_metrics *mm = m->metrics;
    if (!mm)
        return;
    size_t b = 0;
    while (b < NBUCKETS && ns > buckets[b].ns)
        b++;
    mm->count[b]++;
    mm->sum_ns += ns;
    mm->n++;
}

void master_metrics_render(struct umbp_master *m)
{
    struct master_metrics *mm = m->metrics;
    if (!mm)
        return;
    const struct dir_stats *st = dir_stats(m->dir);
    struct text *t = &mm->back;
    size_t alive = 0, suspect = 0;
    t->len = 0;
    for (uint32_t i = 0; i < (uint32_t)m->o.max_nodes; i++) {
        const struct dir_node *n = dir_node_at(m->dir, i);
        if (n && n->state == DIR_ALIVE)
            alive++;
        else if (n)
            suspect++;
    }
    put(t, "# HELP umbp_master_nodes Registered nodes by state.\n"
           "# TYPE umbp_master_nodes gauge\n"
           "umbp_master_nodes{state=\"alive\"} %zu\numbp_master_nodes{state=\"suspect\"} %zu\n",
        alive, suspect);
    metric(t, "umbp_master_keys", "gauge", "Keys in the index.", dir_key_count(m->dir));
    metric(t, "umbp_master_connections", "gauge", "Connected nodes and clients.",
           m->svc.nconns);
    metric(t, "umbp_master_registers_total", "counter", "REGISTER frames.", st->registers);
    metric(t, "umbp_master_heartbeats_total", "counter", "HEARTBEAT frames.", st->heartbeats);
    metric(t, "umbp_master_events_total", "counter", "Stored and removed events applied.",
           st->events);
    metric(t, "umbp_master_event_gaps_total", "counter", "Gaps in a node's events (a resync "
           "asked).", st->gaps);
    metric(t, "umbp_master_resyncs_total", "counter", "Resyncs completed.", st->resyncs);
    metric(t, "umbp_master_resync_keys_total", "counter", "Keys received in resyncs.",
           st->resync_keys);
    metric(t, "umbp_master_dropped_full_total", "counter", "Stored events dropped at max_keys.",
           st->dropped_full);
    metric(t, "umbp_master_dropped_replicas_total", "counter", "Stored events of keys that "
           "have max_replicas owners.", st->dropped_replicas);
    metric(t, "umbp_master_locate_keys_total", "counter", "Keys asked by LOCATE.",
           st->locate_keys);
    metric(t, "umbp_master_locate_hits_total", "counter", "Keys LOCATE found a live owner of.",
           st->locate_hits);
    metric(t, "umbp_master_nodes_suspected_total", "counter", "Nodes that became suspect.",
           st->suspected);
    metric(t, "umbp_master_nodes_reported_total", "counter",
           "Nodes made suspect by another node's SUSPECT report.", st->reported);
    metric(t, "umbp_master_nodes_dead_total", "counter", "Nodes declared dead.", st->dead);
    metric(t, "umbp_master_keys_dropped_total", "counter", "Keys dropped with dead nodes or "
           "resyncs.", st->keys_dropped);
    metric(t, "umbp_master_refused_total", "counter", "Connections refused at accept.",
           m->cnt.refused);
    metric(t, "umbp_master_auth_failed_total", "counter", "Peers that failed the "
           "shared-secret handshake.", m->cnt.auth_failed);
    metric(t, "umbp_master_protocol_errors_total", "counter", "Malformed frames.",
           m->cnt.malformed);
    struct ha_view v = {.leader = true};
    if (m->ha)
        ha_view(m->ha, &v);
    metric(t, "umbp_master_leader", "gauge", "1 while this master serves (it holds the lease, "
           "or runs without lease_url); 0 while it stands by.", m->leading);
    metric(t, "umbp_master_epoch", "gauge", "The leader epoch this master serves under (0: "
           "standby, or no lease_url).", m->epoch);
    metric(t, "umbp_master_takeovers_total", "counter", "Times this master took the lease.",
           v.takeovers);
    metric(t, "umbp_master_lease_errors_total", "counter", "Calls to the lease store that "
           "failed (unreachable, timed out, refused).", v.errors);
    metric(t, "umbp_master_standby_refused_total", "counter", "HELLOs refused while standing "
           "by.", m->standby_refused);
    put(t, "# HELP umbp_master_lease_renew_seconds Time of one lease renewal in the store.\n"
           "# TYPE umbp_master_lease_renew_seconds summary\n"
           "umbp_master_lease_renew_seconds_sum %.9f\numbp_master_lease_renew_seconds_count "
           "%llu\n# HELP umbp_master_lease_renew_max_seconds The slowest renewal.\n"
           "# TYPE umbp_master_lease_renew_max_seconds gauge\n"
           "umbp_master_lease_renew_max_seconds %.9f\n",
        (double)v.renew_ns_sum / 1e9, (unsigned long long)v.renews, (double)v.renew_ns_max / 1e9);
    put(t, "# HELP umbp_master_locate_seconds Time to handle one LOCATE frame.\n"
           "# TYPE umbp_master_locate_seconds histogram\n");
    uint64_t cum = 0;
    for (size_t b = 0; b <= NBUCKETS; b++) {
        cum += mm->count[b];
        put(t, "umbp_master_locate_seconds_bucket{le=\"%s\"} %llu\n",
            b < NBUCKETS ? buckets[b].le : "+Inf", (unsigned long long)cum);
    }
    put(t, "umbp_master_locate_seconds_sum %.9f\numbp_master_locate_seconds_count %llu\n",
        (double)mm->sum_ns / 1e9, (unsigned long long)mm->n);
    pthread_mutex_lock(&mm->mu);
    struct text tmp = mm->front;
    mm->front = mm->back;
    mm->back = tmp;
    pthread_mutex_unlock(&mm->mu);
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *body,
                               size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", CONTENT_TYPE);
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    struct master_metrics *mm = cls;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;
    if (strcmp(method, "GET") != 0)
        return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "GET only\n", 9);
    if (strcmp(url, "/metrics") != 0)
        return respond(conn, MHD_HTTP_NOT_FOUND, "try /metrics\n", 13);
    pthread_mutex_lock(&mm->mu);
    enum MHD_Result rc = mm->front.len
                             ? respond(conn, MHD_HTTP_OK, mm->front.p, mm->front.len)
                             : respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no snapshot yet\n",
                                       16);
    pthread_mutex_unlock(&mm->mu);
    return rc;
}

int master_metrics_start(struct umbp_master *m, char *err, size_t errlen)
{
    if (!m->o.metrics_port)
        return 0;
    char addr[96];
    snprintf(addr, sizeof(addr), strchr(m->o.metrics_address, ':') ? "[%s]:%lld" : "%s:%lld",
             m->o.metrics_address, (long long)m->o.metrics_port);
    int fd;
    int rc = net_tcp_listen(addr, "metrics_port", 64, &fd, NULL, err, errlen);
    if (rc < 0)
        return rc;
    struct master_metrics *mm = calloc(1, sizeof(*mm));
    if (!mm) {
        close(fd);
        snprintf(err, errlen, "no memory for /metrics");
        return -ENOMEM;
    }
    pthread_mutex_init(&mm->mu, NULL);
    m->metrics = mm;
    master_metrics_render(m); /* a first snapshot: never 503 once started */
    mm->http = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request, mm,
                                MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
                                (unsigned)32, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                                MHD_OPTION_END);
    if (!mm->http) {
        snprintf(err, errlen, "metrics_port %lld: the HTTP server did not start",
                 (long long)m->o.metrics_port);
        master_metrics_stop(m);
        return -EIO;
    }
    return 0;
}

void master_metrics_stop(struct umbp_master *m)
{
    struct master_metrics *mm = m->metrics;
    if (!mm)
        return;
    if (mm->http)
        MHD_stop_daemon(mm->http); /* joins its thread; closes the socket */
    pthread_mutex_destroy(&mm->mu);
    free(mm->front.p);
    free(mm->back.p);
    free(mm);
    m->metrics = NULL;
}
