/*
 * lookup_host.c - the runtime's side of a worker's lookup service: the
 * public umbp_lookup_serve, the table of what the service may ask of this
 * rank's pool (struct lookup_host: the tier's lookup with the lookup
 * actor's health check, quarantine and accounting; its usage; the
 * counters), and the service's life on the loop thread.
 *
 * The service (lookup/lookup_serve.c) knows nothing of the runtime: calls
 * go runtime -> lookup only.  rt->lookup_service holds this file's handle,
 * published before the setup (one service per runtime); MSG_LOOKUP_SERVE
 * hands it to the loop thread, which starts accepting
 * (lookup_service_start, from the lookup actor), closes everything when
 * shutdown begins (lookup_service_stop) and frees what is left after the
 * loop (lookup_service_free).
 *
 * Threads: umbp_lookup_serve on the caller's; the ops and hooks on the
 * loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lookup_int.h"
#include "lookup_serve.h"
#include "rt.h"
#include "tier_call.h"

struct lookup_service {
    struct msg_hdr hdr;          /* MSG_LOOKUP_SERVE */
    struct lk_service *svc;
};

/* ---- what the service may ask (loop thread) ------------------------------------- */

struct host_call {
    bool done;
    int rc;
};

static void host_answered(void *arg, int rc)
{
    struct host_call *call = arg;
    call->done = true;
    call->rc = rc;
}

static int host_lookup(void *ctx, struct umbp_tier_req *reqs, struct umbp_tier_req **ptrs,
                       size_t n, uint8_t *present, bool touch)
{
    struct umbp_runtime *rt = ctx;
    struct host_call call = {false, 0};
    int h = tier_health(rt->tier);
    if (h < 0 || n == 0)
        host_answered(&call, h);
    else
        tier_lookup(rt->tier, ptrs, n, present, touch, host_answered, &call);
    if (!call.done)
        return -ENOTSUP;
    if (call.rc < 0)
        memset(present, 0, n);
    lookup_account(rt, reqs, present, n);
    return 0;
}

static void host_usage(void *ctx, struct umbp_tier_usage *u)
{
    struct umbp_runtime *rt = ctx;
    tier_usage(rt->tier, u);
}

#define LOAD(f) atomic_load_explicit(&rt->cnt.f, memory_order_relaxed)

static void host_counters(void *ctx, struct lookup_host_counters *c)
{
    struct umbp_runtime *rt = ctx;
    *c = (struct lookup_host_counters){
        .lookups = LOAD(lookups), .lookup_keys = LOAD(lookup_keys),
        .lookup_hits = LOAD(lookup_hits),
    };
}

static const struct lookup_host_ops host_ops = {
    .lookup = host_lookup,
    .usage = host_usage,
    .counters = host_counters,
};

/* ---- the service's life (loop thread) --------------------------------------------- */

void lookup_service_start(struct umbp_runtime *rt, struct msg_hdr *m)
{
    (void)rt;
    lookup_serve_start(((struct lookup_service *)m)->svc);
}

void lookup_service_stop(struct umbp_runtime *rt)
{
    struct lookup_service *h = atomic_load_explicit(&rt->lookup_service, memory_order_acquire);
    if (h)
        lookup_serve_stop(h->svc);
}

static void handle_free(struct lookup_service *h)
{
    lookup_serve_free(h->svc);
    free(h);
}

void lookup_service_free(struct umbp_runtime *rt)
{
    struct lookup_service *h = atomic_exchange(&rt->lookup_service, NULL);
    if (h)
        handle_free(h); /* the loop has ended: no connection is left */
}

/* ---- umbp_lookup_serve (caller's thread) --------------------------------------------- */

static int refuse_remote(struct umbp_runtime *rt, char *err, size_t errlen)
{
    if (!(tier_caps(rt->tier) & UMBP_TIER_CAP_REMOTE))
        return 0;
    snprintf(err, errlen, "umbp_lookup_serve: the runtime's tier %s is remote (mode %s); "
             "a lookup service serves an embedded rank's own pool, and in standalone "
             "mode the scheduler asks umbp-server (lookup client mode \"standalone\")",
             rt->tier_name, rt->core->mode);
    return -ENOTSUP;
}

int umbp_lookup_serve(umbp_runtime_t *rt, const char *dir, const char *ns_hex,
                      const char *instance, uint32_t dp_index, uint32_t rank)
{
    char err[512] = "";
    if (!rt) {
        umbp_set_error("umbp_lookup_serve: rt must not be NULL");
        return -EINVAL;
    }
    if (atomic_load(&rt->closing)) {
        umbp_set_error("umbp_lookup_serve: the runtime is shutting down");
        return UMBP_E_NOT_ATTEMPTED;
    }
    struct lookup_host host = {
        .ops = &host_ops, .ctx = rt, .loop = rt->loop, .tier_name = rt->tier_name,
        .lease_ttl_ms = (uint32_t)rt->core->lease_ttl_ms,
    };
    struct lookup_service *h = calloc(1, sizeof(*h));
    if (h && !(h->svc = lookup_serve_new(&host, dp_index, rank))) {
        free(h);
        h = NULL;
    }
    if (!h) {
        umbp_set_error("umbp_lookup_serve: out of memory");
        return -ENOMEM;
    }
    h->hdr.type = MSG_LOOKUP_SERVE;
    struct lookup_service *none = NULL;
    if (!atomic_compare_exchange_strong(&rt->lookup_service, &none, h)) {
        umbp_set_error("umbp_lookup_serve: this runtime already serves lookups (one service "
                       "per runtime)");
        handle_free(h);
        return -EBUSY;
    }
    int rc = refuse_remote(rt, err, sizeof(err));
    if (rc == 0)
        rc = lookup_serve_setup(h->svc, dir, ns_hex, instance, err, sizeof(err));
    if (rc == 0 && (rc = rt_post(rt, &h->hdr)) < 0)
        snprintf(err, sizeof(err), "umbp_lookup_serve: the lookup actor's mailbox is full");
    if (rc < 0) {
        atomic_store(&rt->lookup_service, NULL);
        handle_free(h);
        umbp_set_error("%s", err);
        return rc;
    }
    umbp_log(UMBP_LOG_INFO, "lookup service: dp %u rank %u at %s", (unsigned)dp_index,
             (unsigned)rank, lookup_serve_path(h->svc));
    return 0;
}
