/*
 * ucx.c - remote fetch over UCX: the node (context, worker, libev
 * watchers, the mapped pool), peers (endpoints), the requester's batches
 * and the owner's replies.  ucx.h says the contract and the bound.
 *
 * Invariants.
 * - A batch is on n->batches from ucx_fetch until it is handed to done.
 *   It finishes (moves to n->finished, delivered from the loop's idle
 *   watcher, outside any UCX callback) only when every key has a status,
 *   its FETCH send has completed, no receive into one of its buffers is
 *   outstanding and, if it ended early, its peer's force close has
 *   completed.  So done never runs while UCX may still write a buffer.
 * - An ended batch (timed out, peer failed) accepts no DATA: on_data
 *   looks batches up by req_id among those not ended; req_ids come from a
 *   64-bit counter and are never reused.  A live one accepts DATA only on
 *   the endpoint its FETCH went out on (b->ep; owners send DATA with the
 *   reply flag, so UCX names the endpoint it came on).
 * - A peer's ep is NULL while not connected; the next fetch connects.
 *   While its force close is in flight the peer is `closing`
 *   and its ended batches wait for the close.
 * - The owner holds a lease per DATA send in flight (struct ucx_send) and
 *   releases it in the send's completion, whatever its status.
 *
 * Threads: the loop's thread only.
 */
#include "ucx.h"

#include <errno.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "ucx_tls.h"
#include "ucx_wire.h"
#include "util.h"

#define UCX_PROGRESS_BATCH 64
#define UCX_TRANSPORT_MAX 128

struct ucx_batch;

struct ucx_peer {
    struct ucx_node *node;
    struct ucx_peer *next; /* n->peers */
    void *addr;
    size_t addrlen;
    ucp_ep_h ep;
    bool closing; /* force close in flight */
    bool failed;  /* UCX reported it failed: closed from the idle watcher */
    ucp_ep_h failed_ep; /* the endpoint that failed (a newer one is left open) */
    bool transport_known;
    char transport[UCX_TRANSPORT_MAX];
};

/* one outstanding receive into a caller's buffer (rendezvous) */
struct ucx_rx {
    struct ucx_batch *b;
    uint32_t index;
    void *req;
};

struct ucx_batch {
    struct ucx_batch *next, *prev;
    struct ucx_node *node;
    struct ucx_peer *peer;
    uint64_t req_id;
    struct ucx_fetch_item *items;
    uint32_t n, left, rx_pending;
    bool send_pending, ended, finished;
    struct ucx_rx *rx;
    uint8_t *wire; /* FETCH header + records, until the send completes */
    uint8_t nonce[UCX_WIRE_NONCE]; /* the FETCH's: its DATA's macs cover it */
    ucp_ep_h ep; /* the FETCH went out on it: its DATA must come back on it */
    ev_timer timer;
    ucx_fetch_done_fn done;
    void *arg;
};

/* the owner's DATA send: the header and the lease it holds */
struct ucx_send {
    struct ucx_send *next, *prev; /* n->sends, while UCX holds it */
    struct ucx_node *node;
    ucp_ep_h ep;
    double deadline; /* ev_now + serve_timeout */
    uint64_t lease;
    bool leased, linked;
    uint8_t hdr[UCX_DATA_HDR_LEN];
};

struct ucx_node {
    struct ev_loop *loop;
    char name[64];
    struct ucx_serve_ops serve;
    bool serving;
    bool failed_peers; /* a peer UCX reported failed awaits its close (close_failed) */
    uint64_t spin_ns;  /* ucx_node_config.spin_us */
    void (*on_peer_failed)(void *arg, struct ucx_peer *p);
    void *arg;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addrlen;
    ucp_mem_h memh;
    uint8_t *mem_lo, *mem_hi;
    char tls[64];
    int efd;
    ev_io io;
    ev_prepare prepare;
    ev_idle idle;
    struct ucx_batch batches;  /* sentinel of the live list */
    struct ucx_batch *finished; /* singly linked, to deliver */
    struct ucx_peer *peers;
    uint64_t next_req;
    uint32_t sends_in_flight;
    struct ucx_send sends; /* sentinel: DATA sends UCX has not ended */
    double serve_timeout;
    ev_timer sweep;
    struct ucx_node_stats st;
    bool have_key;              /* the cluster's secret: macs made and checked */
    uint8_t key[UCX_WIRE_KEY];
    uint64_t mac_logged_ns, refused_logged_ns; /* their warnings: once a minute */
    uint64_t bad_logged_ns;     /* malformed or misplaced messages: once a minute */
};

_Static_assert(UCX_WIRE_KEY == NET_AUTH_BYTES, "the macs' key is auth.h's");

/* A warning of a kind that a peer can repeat at will: at most once a minute. */
static bool once_a_minute(uint64_t *last_ns)
{
    uint64_t now = umbp_now_ns();
    if (*last_ns && now - *last_ns < 60000000000ull)
        return false;
    *last_ns = now;
    return true;
}

static const char *st_name(ucs_status_t s)
{
    return ucs_status_string(s);
}

/* ---- the loop: event fd, progress, arm ------------------------------------ */

static void deliver(struct ucx_node *n)
{
    while (n->finished) {
        struct ucx_batch *b = n->finished;
        n->finished = b->next;
        ucx_fetch_done_fn done = b->done;
        void *arg = b->arg;
        struct ucx_fetch_item *items = b->items;
        uint32_t cnt = b->n;
        free(b->rx);
        free(b->wire);
        free(b);
        done(arg, items, cnt);
    }
}

/* Progress until the worker can be armed, at most UCX_PROGRESS_BATCH calls.
 * The idle watcher keeps the loop from sleeping while the worker cannot be
 * armed or batches wait to be handed to their done: those are delivered
 * from the idle callback, an iteration of their own (so a caller running
 * the loop once per step sees them), outside any UCX callback.  Once a
 * batch has finished (or a peer failed) the loop will not sleep before
 * the idle callback, so progress stops there and the worker is not armed:
 * arming costs a read of each of UCX's event fds, wasted when the next
 * iteration does not wait (the next prepare progresses and arms before
 * any sleep). */
static void drive(struct ucx_node *n)
{
    int calls = 0;
    bool armed = false;
    for (;;) {
        while (calls < UCX_PROGRESS_BATCH && !n->finished && !n->failed_peers &&
               ucp_worker_progress(n->worker))
            calls++;
        if (calls >= UCX_PROGRESS_BATCH || n->finished || n->failed_peers)
            break; /* busy, or the idle callback has work: come back after it */
        if (n->spin_ns && !n->finished &&
            (n->batches.next != &n->batches || n->sends.next != &n->sends)) {
            /* work in flight: its next event is likely soon */
            uint64_t end = umbp_now_ns() + n->spin_ns;
            while (!n->finished && calls < UCX_PROGRESS_BATCH && umbp_now_ns() < end)
                if (ucp_worker_progress(n->worker))
                    calls++;
            if (n->finished || calls >= UCX_PROGRESS_BATCH)
                break;
        }
        ucs_status_t s = ucp_worker_arm(n->worker);
        if (s == UCS_OK) {
            armed = true;
            break;
        }
        if (s != UCS_ERR_BUSY) {
            umbp_log(UMBP_LOG_ERROR, "%s: ucp_worker_arm: %s", n->name, st_name(s));
            break;
        }
        calls++;
    }
    if (armed && !n->finished && !n->failed_peers)
        ev_idle_stop(n->loop, &n->idle);
    else
        ev_idle_start(n->loop, &n->idle);
}

static void on_prepare(struct ev_loop *loop, ev_prepare *w, int revents)
{
    drive(w->data);
}

static void on_efd(struct ev_loop *loop, ev_io *w, int revents)
{
    /* the prepare watcher progresses before the loop sleeps again */
}

static void peer_fail(struct ucx_peer *p, struct ucx_batch *mine, int mine_status);

/* Endpoints UCX reported failed are closed here, outside UCX's callback:
 * force-closing one from inside its error callback, while UCX still tears
 * down a half-connected endpoint (a peer that died during wireup), made UCX
 * 1.13 use the freed endpoint (an assertion in wireup_ep.c). */
static void close_failed(struct ucx_node *n)
{
    if (!n->failed_peers)
        return;
    n->failed_peers = false;
    for (struct ucx_peer *p = n->peers; p; p = p->next)
        if (p->failed) {
            p->failed = false;
            if (!p->ep || p->ep == p->failed_ep)
                peer_fail(p, NULL, -ECONNRESET);
            p->failed_ep = NULL;
            if (n->on_peer_failed)
                n->on_peer_failed(n->arg, p);
        }
}

static void on_idle(struct ev_loop *loop, ev_idle *w, int revents)
{
    close_failed(w->data);
    deliver(w->data);
}

/* ---- batches -------------------------------------------------------------- */

static struct ucx_batch *batch_find(struct ucx_node *n, uint64_t req_id)
{
    for (struct ucx_batch *b = n->batches.next; b != &n->batches; b = b->next)
        if (b->req_id == req_id && !b->ended)
            return b;
    return NULL;
}

static void batch_try_finish(struct ucx_batch *b)
{
    struct ucx_node *n = b->node;
    /* finished once: a cancel's callback may have finished it already */
    if (b->finished || b->left || b->rx_pending || b->send_pending)
        return;
    if (b->ended && b->peer && b->peer->closing)
        return;
    b->finished = true;
    ev_timer_stop(n->loop, &b->timer);
    b->prev->next = b->next;
    b->next->prev = b->prev;
    b->next = n->finished;
    n->finished = b;
}

static void item_set(struct ucx_batch *b, uint32_t i, int status)
{
    if (b->items[i].status != UMBP_E_INPROGRESS)
        return;
    b->items[i].status = status;
    b->left--;
}

/* every key still open gets status; no more DATA is taken */
static void batch_end(struct ucx_batch *b, int status)
{
    b->ended = true;
    ev_timer_stop(b->node->loop, &b->timer);
    for (uint32_t i = 0; i < b->n; i++)
        item_set(b, i, status);
}

static void cancel_rx(struct ucx_batch *b)
{
    for (uint32_t i = 0; i < b->n; i++)
        if (b->rx[i].req)
            ucp_request_cancel(b->node->worker, b->rx[i].req);
}

/* ---- peers ---------------------------------------------------------------- */

static void peer_closed(struct ucx_peer *p)
{
    struct ucx_node *n = p->node;
    struct ucx_batch *b = n->batches.next;
    while (b != &n->batches) {
        struct ucx_batch *next = b->next;
        if (b->peer == p && b->ended) {
            cancel_rx(b); /* receives under way into its buffers end now */
            batch_try_finish(b);
        }
        b = next;
    }
}

static void on_close_done(void *req, ucs_status_t status, void *arg)
{
    struct ucx_peer *p = arg;
    ucp_request_free(req);
    p->closing = false;
    peer_closed(p);
}

/* Ends every batch of p (the one that timed out with `mine_status`, the
 * others with -ECONNRESET) and force-closes its endpoint. */
static void peer_fail(struct ucx_peer *p, struct ucx_batch *mine, int mine_status)
{
    struct ucx_node *n = p->node;
    for (struct ucx_batch *b = n->batches.next; b != &n->batches; b = b->next)
        if (b->peer == p && !b->ended)
            batch_end(b, b == mine ? mine_status : -ECONNRESET);
    if (p->ep) {
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                            UCP_OP_ATTR_FIELD_USER_DATA,
            .flags = UCP_EP_CLOSE_FLAG_FORCE,
            .cb.send = on_close_done,
            .user_data = p,
        };
        /* closing before the call: UCX cancels (calls back) inside it, and
         * no batch may finish before the close has */
        p->closing = true;
        ucp_ep_h ep = p->ep;
        p->ep = NULL;
        p->transport_known = false;
        n->st.force_closes++;
        void *req = ucp_ep_close_nbx(ep, &prm);
        if (!UCS_PTR_IS_PTR(req)) {
            if (UCS_PTR_IS_ERR(req))
                umbp_log(UMBP_LOG_WARN, "%s: force close of a peer's endpoint: %s", n->name,
                         st_name(UCS_PTR_STATUS(req)));
            p->closing = false;
        }
    }
    if (!p->closing)
        peer_closed(p);
}

/* From inside a UCX callback: p's endpoint is closed (and its batches
 * failed) by the idle watcher, after the callback (close_failed). */
static void peer_fail_later(struct ucx_peer *p)
{
    p->node->st.peer_errors++;
    p->failed = true;
    p->failed_ep = p->ep;
    p->node->failed_peers = true;
    ev_idle_start(p->node->loop, &p->node->idle);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    struct ucx_peer *p = arg;
    if (p->ep != ep)
        return; /* an endpoint already being closed */
    umbp_log(UMBP_LOG_WARN, "%s: peer endpoint failed (%s); its fetches fail", p->node->name,
             st_name(status));
    peer_fail_later(p);
}

static int peer_connect(struct ucx_peer *p)
{
    if (p->ep)
        return 0;
    if (p->closing)
        return -ECONNREFUSED; /* the last close has not completed yet */
    ucp_ep_params_t prm = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = p->addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = { .cb = on_ep_error, .arg = p },
    };
    ucs_status_t s = ucp_ep_create(p->node->worker, &prm, &p->ep);
    if (s != UCS_OK) {
        p->ep = NULL;
        umbp_set_error("%s: ucp_ep_create to a peer: %s (is its worker address current?)",
                       p->node->name, st_name(s));
        return -ECONNREFUSED;
    }
    return 0;
}

int ucx_peer_create(struct ucx_node *n, const void *addr, size_t len, struct ucx_peer **out)
{
    if (!addr || !len)
        return -EINVAL;
    struct ucx_peer *p = calloc(1, sizeof(*p));
    if (!p || !(p->addr = malloc(len))) {
        free(p);
        return -ENOMEM;
    }
    memcpy(p->addr, addr, len);
    p->addrlen = len;
    p->node = n;
    int rc = peer_connect(p);
    if (rc) {
        free(p->addr);
        free(p);
        return rc;
    }
    p->next = n->peers;
    n->peers = p;
    *out = p;
    return 0;
}

/* Progress (never from a UCX callback) until pred(p) or `rounds` runs out:
 * teardown only. */
static void progress_until(struct ucx_node *n, bool (*pred)(void *), void *arg)
{
    for (int i = 0; i < 100000 && !pred(arg); i++) {
        if (!ucp_worker_progress(n->worker) && i > 1000)
            usleep(100);
    }
}

static bool peer_quiet(void *arg)
{
    struct ucx_peer *p = arg;
    if (p->closing)
        return false;
    for (struct ucx_batch *b = p->node->batches.next; b != &p->node->batches; b = b->next)
        if (b->peer == p)
            return false;
    return true;
}

void ucx_peer_destroy(struct ucx_peer *p)
{
    if (!p)
        return;
    struct ucx_node *n = p->node;
    peer_fail(p, NULL, -ECONNRESET);
    progress_until(n, peer_quiet, p);
    /* a batch that did not finish in the bound is detached: it can no
     * longer name the peer */
    for (struct ucx_batch *b = n->batches.next; b != &n->batches; b = b->next)
        if (b->peer == p)
            b->peer = NULL;
    for (struct ucx_peer **pp = &n->peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p->addr);
    free(p);
    deliver(n);
}

/* "tcp/lo" from ucp_ep_print_info's lane lines ("lane[0]:  2:tcp/lo.0 md[1] ...") */
const char *ucx_peer_transport(struct ucx_peer *p)
{
    if (!p->ep)
        return "";
    if (p->transport_known)
        return p->transport;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return "";
    ucp_ep_print_info(p->ep, f);
    fclose(f);
    p->transport[0] = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        char *l = strstr(line, "lane[");
        if (!l)
            continue;
        char *c = strchr(l, ':');
        if (!c)
            continue;
        c++;
        while (*c == ' ')
            c++;
        char *tl = strchr(c, ':'); /* "2:tcp/lo.0": skip the resource index */
        if (!tl)
            continue;
        tl++;
        size_t k = strcspn(tl, " .");
        char name[48];
        snprintf(name, sizeof(name), "%.*s", (int)k, tl);
        if (strstr(p->transport, name))
            continue;
        size_t used = strlen(p->transport);
        snprintf(p->transport + used, sizeof(p->transport) - used, "%s%s", used ? "," : "", name);
    }
    free(buf);
    p->transport_known = p->transport[0] != 0;
    return p->transport;
}

/* ---- the requester ---------------------------------------------------------- */

static void on_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct ucx_batch *b = w->data;
    struct ucx_node *n = b->node;
    n->st.timeouts++;
    umbp_log(UMBP_LOG_WARN, "%s: fetch of %u keys timed out; force-closing the peer's endpoint",
             n->name, b->n);
    if (b->peer)
        peer_fail(b->peer, b, UMBP_E_TIMEOUT);
    else {
        batch_end(b, UMBP_E_TIMEOUT);
        cancel_rx(b);
        batch_try_finish(b);
    }
}

/* A FETCH whose send failed ends with its peer, closed after this
 * callback: UCX calls it while it purges a failing endpoint's pending
 * sends, and a force close from in there (a peer that died during wireup)
 * made UCX 1.13.1 destroy the endpoint under the purge and abort the
 * process (wireup_ep.c:494). */
static void on_fetch_sent(void *req, ucs_status_t status, void *arg)
{
    struct ucx_batch *b = arg;
    ucp_request_free(req);
    b->send_pending = false;
    if (status != UCS_OK && !b->ended) {
        if (b->peer)
            peer_fail_later(b->peer);
        else
            b->node->st.peer_errors++;
    }
    batch_try_finish(b);
}

static void rx_land(struct ucx_batch *b, uint32_t i, uint64_t size)
{
    b->items[i].size = size;
    b->node->st.fetch_keys++;
    b->node->st.fetch_bytes += size;
    item_set(b, i, 0);
}

static void on_rx_done(void *req, ucs_status_t status, size_t length, void *arg)
{
    struct ucx_rx *rx = arg;
    struct ucx_batch *b = rx->b;
    ucp_request_free(req);
    rx->req = NULL;
    b->rx_pending--;
    if (status == UCS_OK)
        rx_land(b, rx->index, b->items[rx->index].size);
    else
        item_set(b, rx->index, -ECONNRESET);
    batch_try_finish(b);
}

static ucs_status_t on_data(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param)
{
    struct ucx_node *n = arg;
    bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    struct ucx_data_hdr h;
    char err[160];
    if (ucx_wire_data_parse(header, header_length, length, &h, err, sizeof(err))) {
        n->st.bad_messages++;
        if (once_a_minute(&n->bad_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: malformed DATA from a peer: %s; dropped", n->name, err);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    struct ucx_batch *b = batch_find(n, h.req_id);
    if (!b) {
        /* a batch that ended (timed out, failed): never land it */
        n->st.late_dropped++;
        return rndv ? UCS_ERR_CANCELED : UCS_OK;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep != b->ep) {
        /* An answer comes back on the connection its FETCH went out on (the
         * owner sends it with UCP_AM_SEND_FLAG_REPLY): one that came on
         * another, even with a right mac (a tap that replayed the FETCH to
         * the owner over a connection of its own has the owner's headers),
         * is dropped; the key still waits for its owner's answer. */
        n->st.bad_messages++;
        if (once_a_minute(&n->bad_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: a DATA (index %u) that did not come back on the "
                     "connection its fetch went out on; dropped", n->name, h.index);
        return rndv ? UCS_ERR_CANCELED : UCS_OK;
    }
    if (h.index >= b->n || b->items[h.index].status != UMBP_E_INPROGRESS) {
        n->st.bad_messages++;
        if (once_a_minute(&n->bad_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: DATA.index %u does not name an open key of its fetch "
                     "(%u keys); dropped", n->name, h.index, b->n);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    if (b->rx[h.index].req) {
        /* a second DATA for a key whose bytes are being received: it would
         * write the same buffer and take the receive's place, so the batch
         * waited for a request it no longer knew */
        n->st.bad_messages++;
        if (once_a_minute(&n->bad_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: a second DATA for key %u of its fetch while the first "
                     "is received; dropped", n->name, h.index);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    if (n->have_key && h.status != -EACCES && !ucx_wire_data_mac_ok(n->key, &h, b->nonce)) {
        /* not from the owner asked (or not from a holder of the secret):
         * dropped, the key still waits for its owner's answer */
        n->st.bad_macs++;
        if (once_a_minute(&n->mac_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: a DATA whose mac is wrong for key %u of a fetch: "
                     "dropped (%llu so far; logged at most once a minute)", n->name, h.index,
                     (unsigned long long)n->st.bad_macs);
        return rndv ? UCS_ERR_CANCELED : UCS_OK;
    }
    struct ucx_fetch_item *it = &b->items[h.index];
    if (h.status == -EACCES) {
        n->st.refused++;
        if (once_a_minute(&n->refused_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: a node refused our fetch (-EACCES): its secret_file "
                     "differs from ours, or we have none (%llu keys so far; logged at most "
                     "once a minute)", n->name, (unsigned long long)n->st.refused);
    }
    if (h.status) {
        it->size = h.size;
        item_set(b, h.index, h.status);
        batch_try_finish(b);
        return UCS_OK;
    }
    if (h.size > it->cap) {
        n->st.bad_messages++;
        if (once_a_minute(&n->bad_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: DATA.size %llu over the %llu asked for; dropped",
                     n->name, (unsigned long long)h.size, (unsigned long long)it->cap);
        item_set(b, h.index, -EPROTO);
        batch_try_finish(b);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    it->size = h.size;
    if (!rndv) {
        n->st.data_eager++;
        memcpy(it->dst, data, h.size);
        rx_land(b, h.index, h.size);
        batch_try_finish(b);
        return UCS_OK;
    }
    n->st.data_rndv++;
    struct ucx_rx *rx = &b->rx[h.index];
    rx->b = b;
    rx->index = h.index;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = on_rx_done,
        .user_data = rx,
    };
    if (n->memh && (uint8_t *)it->dst >= n->mem_lo && (uint8_t *)it->dst + h.size <= n->mem_hi) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        prm.memh = n->memh;
    }
    void *req = ucp_am_recv_data_nbx(n->worker, data, it->dst, h.size, &prm);
    if (UCS_PTR_IS_ERR(req)) {
        item_set(b, h.index, -ECONNRESET);
        batch_try_finish(b);
    } else if (req == NULL) {
        rx_land(b, h.index, h.size);
        batch_try_finish(b);
    } else {
        rx->req = req;
        b->rx_pending++;
    }
    return UCS_INPROGRESS;
}

int ucx_fetch(struct ucx_peer *p, struct ucx_fetch_item *items, uint32_t n, uint32_t timeout_ms,
              ucx_fetch_done_fn done, void *arg)
{
    struct ucx_node *node = p->node;
    if (!items || !n || n > UCX_FETCH_MAX_KEYS || !timeout_ms || !done)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (!items[i].dst || !items[i].cap || items[i].cap > UCX_OBJ_MAX)
            return -EINVAL;
    int rc = peer_connect(p);
    if (rc)
        return rc;
    struct ucx_batch *b = calloc(1, sizeof(*b));
    size_t wlen = UCX_FETCH_HDR_LEN + (size_t)n * UCX_FETCH_REC_LEN;
    if (!b || !(b->rx = calloc(n, sizeof(*b->rx))) || !(b->wire = malloc(wlen))) {
        if (b)
            free(b->rx);
        free(b);
        return -ENOMEM;
    }
    b->node = node;
    b->peer = p;
    b->ep = p->ep;
    b->req_id = ++node->next_req;
    b->items = items;
    b->n = b->left = n;
    b->done = done;
    b->arg = arg;
    for (uint32_t i = 0; i < n; i++) {
        items[i].status = UMBP_E_INPROGRESS;
        items[i].size = 0;
        ucx_wire_fetch_rec_put(b->wire + UCX_FETCH_HDR_LEN + (size_t)i * UCX_FETCH_REC_LEN,
                               &items[i].key, items[i].cap);
    }
    uint8_t mac[UCX_WIRE_MAC] = {0};
    if (node->have_key) {
        randombytes_buf(b->nonce, sizeof(b->nonce));
        ucx_wire_fetch_mac(node->key, b->req_id, n, b->nonce, b->wire + UCX_FETCH_HDR_LEN, mac);
    }
    ucx_wire_fetch_hdr_put(b->wire, b->req_id, n, b->nonce, mac);
    ev_timer_init(&b->timer, on_timeout, timeout_ms / 1000.0, 0);
    b->timer.data = b;
    b->prev = node->batches.prev;
    b->next = &node->batches;
    b->prev->next = b;
    node->batches.prev = b;
    ev_timer_start(node->loop, &b->timer);
    node->st.fetches++;

    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
        .cb.send = on_fetch_sent,
        .user_data = b,
    };
    void *req = ucp_am_send_nbx(p->ep, UCX_AM_FETCH, b->wire, UCX_FETCH_HDR_LEN,
                                b->wire + UCX_FETCH_HDR_LEN, wlen - UCX_FETCH_HDR_LEN, &prm);
    if (UCS_PTR_IS_PTR(req))
        b->send_pending = true;
    else if (UCS_PTR_IS_ERR(req)) {
        /* the endpoint is failing: the batch ends through the usual path */
        node->st.peer_errors++;
        peer_fail(p, NULL, -ECONNRESET);
    }
    return 0;
}

/* ---- the owner ---------------------------------------------------------------- */

static void send_end(struct ucx_send *s)
{
    struct ucx_node *n = s->node;
    if (s->linked) {
        s->prev->next = s->next;
        s->next->prev = s->prev;
    }
    if (s->leased)
        n->serve.lease_release(n->serve.ctx, s->lease);
    n->sends_in_flight--;
    free(s);
}

static void on_data_sent(void *req, ucs_status_t status, void *arg)
{
    ucp_request_free(req);
    send_end(arg); /* UCX no longer reads the region: the lease may end */
}

/* DATA for key index of a FETCH (its nonce: the mac covers it); refused:
 * -EACCES, nothing leased (the FETCH's mac was wrong, so no mac here). */
static void reply(struct ucx_node *n, ucp_ep_h ep, uint64_t req_id, uint32_t index,
                  const umbp_key_t *key, uint64_t max, const uint8_t *nonce, bool refused)
{
    struct ucx_send *s = calloc(1, sizeof(*s));
    if (!s) {
        umbp_log(UMBP_LOG_WARN, "%s: no memory for a DATA reply; the requester times out",
                 n->name);
        return;
    }
    s->node = n;
    n->sends_in_flight++;
    struct ucx_data_hdr h = { .req_id = req_id, .index = index };
    const void *addr = NULL;
    uint64_t size = 0;
    int rc = refused ? -EACCES : n->serve.lease_take(n->serve.ctx, key, &addr, &size, &s->lease);
    if (rc == 0) {
        s->leased = true;
        if (size > max) {
            h.status = -EMSGSIZE;
            h.size = size;
        } else {
            h.size = size;
            n->st.served_keys++;
            n->st.served_bytes += size;
        }
    } else {
        h.status = rc == -ENOENT || rc == -EACCES ? rc : -EIO;
        if (rc == -ENOENT)
            n->st.served_misses++;
    }
    if (n->have_key && !refused)
        ucx_wire_data_mac(n->key, &h, nonce, h.mac);
    ucx_wire_data_hdr_put(s->hdr, &h);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_REPLY, /* the requester takes it on this connection only */
        .cb.send = on_data_sent,
        .user_data = s,
    };
    bool data = h.status == 0;
    if (data && n->memh && (const uint8_t *)addr >= n->mem_lo &&
        (const uint8_t *)addr + size <= n->mem_hi) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        prm.memh = n->memh;
    }
    void *req = ucp_am_send_nbx(ep, UCX_AM_DATA, s->hdr, UCX_DATA_HDR_LEN, data ? addr : NULL,
                                data ? size : 0, &prm);
    if (!UCS_PTR_IS_PTR(req)) {
        send_end(s); /* sent at once, or failed: either way UCX is done with it */
        return;
    }
    s->ep = ep;
    s->deadline = ev_now(n->loop) + n->serve_timeout;
    s->linked = true;
    s->prev = n->sends.prev;
    s->next = &n->sends;
    s->prev->next = s;
    n->sends.prev = s;
    if (!ev_is_active(&n->sweep))
        ev_timer_again(n->loop, &n->sweep);
}

static void on_reply_ep_closed(void *req, ucs_status_t status, void *arg)
{
    ucp_request_free(req);
}

/* The owner's bound: a requester that stopped or went away (its endpoint
 * force-closed: over tcp UCX then fails nothing on this side) would keep
 * our sends, and the leases they hold, forever.  Past serve_timeout the
 * reply endpoint is force-closed: UCX ends every send on it (cancelled),
 * each releasing its lease. */
static void on_sweep(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct ucx_node *n = w->data;
    double now = ev_now(loop);
    for (;;) {
        ucp_ep_h ep = NULL;
        for (struct ucx_send *s = n->sends.next; s != &n->sends; s = s->next)
            if (s->ep && s->deadline <= now) {
                ep = s->ep;
                break;
            }
        if (!ep)
            break;
        uint32_t cnt = 0;
        for (struct ucx_send *s = n->sends.next; s != &n->sends; s = s->next)
            if (s->ep == ep) {
                s->ep = NULL; /* closed once */
                cnt++;
            }
        n->st.serve_timeouts++;
        umbp_log(UMBP_LOG_WARN, "%s: %u replies to a requester pending past %.0f ms (it stopped "
                 "or went away); force-closing its endpoint, which ends them and their leases",
                 n->name, cnt, n->serve_timeout * 1000);
        /* UCX pairs the endpoints two nodes make to each other: the one a
         * FETCH came on may be ours to that node too, still used by our
         * fetches from it.  Closed through the peer then, which fails those
         * and forgets the endpoint (a later fetch connects anew); closed
         * here behind its back, the peer would use or close it again. */
        struct ucx_peer *p = n->peers;
        while (p && p->ep != ep)
            p = p->next;
        if (p) {
            peer_fail(p, NULL, -ECONNRESET);
            continue;
        }
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK,
            .flags = UCP_EP_CLOSE_FLAG_FORCE,
            .cb.send = on_reply_ep_closed,
        };
        void *req = ucp_ep_close_nbx(ep, &prm);
        if (UCS_PTR_IS_ERR(req))
            umbp_log(UMBP_LOG_WARN, "%s: force close of a requester's endpoint: %s", n->name,
                     st_name(UCS_PTR_STATUS(req)));
    }
    if (n->sends.next == &n->sends)
        ev_timer_stop(loop, w);
}

static ucs_status_t on_fetch(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    struct ucx_node *n = arg;
    char err[160];
    struct ucx_fetch_hdr h;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        n->st.bad_messages++;
        if (once_a_minute(&n->bad_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: FETCH.records: sent by rendezvous, not eager; dropped",
                     n->name);
        return UCS_ERR_INVALID_PARAM;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        n->st.bad_messages++;
        if (once_a_minute(&n->bad_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: FETCH without a reply endpoint; dropped", n->name);
        return UCS_OK;
    }
    if (ucx_wire_fetch_parse(header, header_length, data, length, &h, err, sizeof(err))) {
        n->st.bad_messages++;
        if (once_a_minute(&n->bad_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: malformed FETCH from a peer: %s; dropped", n->name, err);
        return UCS_OK;
    }
    bool refused = n->have_key && !ucx_wire_fetch_mac_ok(n->key, &h, data);
    if (refused) {
        n->st.bad_macs++;
        if (once_a_minute(&n->mac_logged_ns))
            umbp_log(UMBP_LOG_WARN, "%s: a FETCH of %u keys whose mac is wrong (a peer "
                     "without the cluster's secret_file, or another secret): refused, each "
                     "key answered -EACCES (%llu so far; logged at most once a minute)",
                     n->name, h.n, (unsigned long long)n->st.bad_macs);
    }
    for (uint32_t i = 0; i < h.n; i++) {
        struct ucx_fetch_rec r;
        ucx_wire_fetch_rec(data, i, &r);
        reply(n, param->reply_ep, h.req_id, i, &r.key, r.max_size, h.nonce, refused);
    }
    return UCS_OK;
}

/* ---- the node ------------------------------------------------------------------ */

static void tls_from_config(struct ucx_node *n, ucp_config_t *cfg)
{
    snprintf(n->tls, sizeof(n->tls), "all");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    ucp_config_print(cfg, f, NULL, UCS_CONFIG_PRINT_CONFIG);
    fclose(f);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
        if (!strncmp(line, "UCX_TLS=", 8)) {
            snprintf(n->tls, sizeof(n->tls), "%s", line + 8);
            break;
        }
    free(buf);
}

/* One default {UCX_<NAME>, the field, the value}, unless the environment
 * sets it. */
static void ucx_default(ucp_config_t *ucfg, const char *const d[3])
{
    if (getenv(d[0]))
        return;
    ucs_status_t s = ucp_config_modify(ucfg, d[1], d[2]);
    if (s != UCS_OK)
        umbp_log(UMBP_LOG_DEBUG, "UCX: cannot set %s=%s: %s", d[0], d[2], ucs_status_string(s));
}

/* umbp's defaults for UCX settings it measured, each only where the
 * environment does not set it (UCX_<NAME> wins).  UCX applies a transport's
 * setting to that transport; the data path has no branch on which transport
 * runs.  A setting is given only where its transport may come up (UCX warns
 * about settings no transport used).  The tcp transport's send segments:
 * 64 KiB instead of 8 KiB.  Receive segments stay UCX's 64 KiB: 256 KiB ones
 * gained a little between two namespaces on an H200 host (2 MiB 0.89-1.00x
 * of a raw TCP get against 0.83-0.84x) but, between two namespaces on a
 * 2-vCPU VM, halved 256 KiB and 2 MiB fetches in most runs (0.28-0.58x
 * against 1.00-1.37x); docs/benchmarks.md. */
static void ucx_defaults(ucp_config_t *ucfg, const char *tls)
{
    /* {the environment's name, the transport's field (ucp_config_modify
     * hands it to every transport whose table has that field: only tcp's
     * have these), value} */
    static const char *const defaults[][3] = {
        {"UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "64k"},
    };
    /* Where tcp is the only transport: a DATA reply up to 1 MiB goes eager.
     * UCX's rendezvous over tcp costs a handshake (the owner's RTS, the
     * requester's RTR) before the bytes, one more wake-up on each side per
     * object; eager costs the requester one copy out of UCX's assembly buffer.
     * RNDV_THRESH is UCX's, for every transport: hence tcp only. */
    static const char *const tcp_only[][3] = {
        {"UCX_RNDV_THRESH", "RNDV_THRESH", "1m"},
    };
    if (!ucx_tls_names_tcp(tls))
        return;
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
        ucx_default(ucfg, defaults[i]);
    if (ucx_tls_tcp_only(tls))
        for (size_t i = 0; i < sizeof(tcp_only) / sizeof(tcp_only[0]); i++)
            ucx_default(ucfg, tcp_only[i]);
}

int ucx_node_create(const struct ucx_node_config *cfg, struct ucx_node **out)
{
    if (!cfg || !cfg->loop)
        return -EINVAL;
    struct ucx_node *n = calloc(1, sizeof(*n));
    if (!n)
        return -ENOMEM;
    n->loop = cfg->loop;
    n->on_peer_failed = cfg->on_peer_failed;
    n->arg = cfg->arg;
    snprintf(n->name, sizeof(n->name), "%s", cfg->name ? cfg->name : "ucx");
    if (cfg->serve) {
        n->serve = *cfg->serve;
        n->serving = true;
    }
    n->batches.next = n->batches.prev = &n->batches;
    if (cfg->auth) {
        if (sodium_init() < 0) {
            free(n);
            umbp_set_error("ucx node: libsodium did not initialise");
            return -EIO;
        }
        n->have_key = true;
        memcpy(n->key, cfg->auth->k, sizeof(n->key));
    }
    /* request ids start at a random point (below 2^63: never wrapping), so
     * a process that is not the owner cannot guess a batch's id and answer
     * it first; with the cluster's secret, the macs make sure of it
     * (docs/distributed.md, Security) */
    if (getrandom(&n->next_req, sizeof(n->next_req), GRND_NONBLOCK) != sizeof(n->next_req))
        n->next_req = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)n;
    n->next_req &= ~(1ull << 63);
    n->sends.next = n->sends.prev = &n->sends;
    n->serve_timeout = (cfg->serve_timeout_ms ? cfg->serve_timeout_ms : UCX_SERVE_TIMEOUT_MS) / 1000.0;
    n->spin_ns = (uint64_t)cfg->spin_us * 1000u;
    n->efd = -1;
    const char *what = "ucp_config_read";
    ucp_config_t *ucfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &ucfg);
    if (s != UCS_OK)
        goto fail;
    tls_from_config(n, ucfg);
    ucx_defaults(ucfg, n->tls);
    ucp_params_t prm = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP,
        .name = n->name,
    };
    what = "ucp_init";
    s = ucp_init(&prm, ucfg, &n->ctx);
    ucp_config_release(ucfg);
    if (s != UCS_OK)
        goto fail;
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    what = "ucp_worker_create";
    s = ucp_worker_create(n->ctx, &wp, &n->worker);
    if (s != UCS_OK)
        goto fail;
    what = "ucp_worker_get_address";
    s = ucp_worker_get_address(n->worker, &n->addr, &n->addrlen);
    if (s != UCS_OK)
        goto fail;
    what = "ucp_worker_get_efd";
    s = ucp_worker_get_efd(n->worker, &n->efd);
    if (s != UCS_OK)
        goto fail;
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = UCX_AM_DATA,
        .cb = on_data,
        .arg = n,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
    };
    what = "ucp_worker_set_am_recv_handler(DATA)";
    s = ucp_worker_set_am_recv_handler(n->worker, &ap);
    if (s != UCS_OK)
        goto fail;
    if (n->serving) {
        ap.id = UCX_AM_FETCH;
        ap.cb = on_fetch;
        what = "ucp_worker_set_am_recv_handler(FETCH)";
        s = ucp_worker_set_am_recv_handler(n->worker, &ap);
        if (s != UCS_OK)
            goto fail;
    }
    ev_io_init(&n->io, on_efd, n->efd, EV_READ);
    ev_prepare_init(&n->prepare, on_prepare);
    ev_idle_init(&n->idle, on_idle);
    /* An idle watcher runs only while nothing of its priority or above is
     * pending; at the default priority the worker's event fd, readable until
     * the next arm, would keep it from ever delivering (drive does not arm
     * while a batch waits to be delivered). */
    ev_set_priority(&n->idle, EV_MAXPRI);
    ev_init(&n->sweep, on_sweep);
    n->sweep.repeat = n->serve_timeout / 4 < 0.1 ? n->serve_timeout / 4 : 0.1;
    n->io.data = n->prepare.data = n->idle.data = n->sweep.data = n;
    ev_io_start(n->loop, &n->io);
    ev_prepare_start(n->loop, &n->prepare);
    umbp_log(UMBP_LOG_INFO, "%s: UCX %s worker up (UCX_TLS=%s, address %zu bytes%s)", n->name,
             ucp_get_version_string(), n->tls, n->addrlen, n->serving ? ", serving" : "");
    *out = n;
    return 0;
fail:
    umbp_set_error("%s: %s: %s (UCX_TLS=%s; is libucx installed and a transport usable?)",
                   n->name, what, st_name(s), n->tls[0] ? n->tls : "?");
    if (n->addr)
        ucp_worker_release_address(n->worker, n->addr);
    if (n->worker)
        ucp_worker_destroy(n->worker);
    if (n->ctx)
        ucp_cleanup(n->ctx);
    sodium_memzero(n->key, sizeof(n->key));
    free(n);
    return -EIO;
}

static bool node_quiet(void *arg)
{
    struct ucx_node *n = arg;
    return n->batches.next == &n->batches && n->sends_in_flight == 0;
}

void ucx_node_destroy(struct ucx_node *n)
{
    if (!n)
        return;
    while (n->peers)
        ucx_peer_destroy(n->peers);
    progress_until(n, node_quiet, n);
    deliver(n);
    ev_io_stop(n->loop, &n->io);
    ev_prepare_stop(n->loop, &n->prepare);
    ev_idle_stop(n->loop, &n->idle);
    ev_timer_stop(n->loop, &n->sweep);
    if (n->memh)
        ucp_mem_unmap(n->ctx, n->memh);
    ucp_worker_release_address(n->worker, n->addr);
    ucp_worker_destroy(n->worker);
    ucp_cleanup(n->ctx);
    sodium_memzero(n->key, sizeof(n->key));
    free(n);
}

void ucx_node_address(const struct ucx_node *n, const void **addr, size_t *len)
{
    *addr = n->addr;
    *len = n->addrlen;
}

const char *ucx_node_transports(const struct ucx_node *n)
{
    return n->tls;
}

int ucx_mem_map(struct ucx_node *n, void *addr, size_t len)
{
    if (n->memh || !addr || !len)
        return -EINVAL;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = addr,
        .length = len,
    };
    ucs_status_t s = ucp_mem_map(n->ctx, &mp, &n->memh);
    if (s != UCS_OK) {
        n->memh = NULL;
        umbp_set_error("%s: ucp_mem_map of %zu bytes: %s", n->name, len, st_name(s));
        return -EIO;
    }
    n->mem_lo = addr;
    n->mem_hi = (uint8_t *)addr + len;
    return 0;
}

void ucx_node_stats(const struct ucx_node *n, struct ucx_node_stats *out)
{
    *out = n->st;
}

void *ucx_node_worker(struct ucx_node *n)
{
    return n->worker;
}

void *ucx_node_context(struct ucx_node *n)
{
    return n->ctx;
}

void *ucx_node_memh(struct ucx_node *n)
{
    return n->memh;
}

void *ucx_peer_ep(struct ucx_peer *p)
{
    return peer_connect(p) ? NULL : p->ep;
}
