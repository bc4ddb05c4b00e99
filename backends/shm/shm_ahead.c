/*
 * shm_ahead.c - reservations made ahead of their keys ("spares"), so that a
 * store's first reservation costs no round trip to the server.
 *
 * A standalone store cannot copy a byte before the server has granted it a
 * region: the RESERVE round trip (a wake-up of the server and of this
 * loop, 100-400 us on a busy host) sits in front of the first GPU transfer
 * of every store.  Once the runtime says which object size its KV stores
 * use (reserve_ahead, before each KV store), this tier keeps `want` regions
 * of that size (its share of reserve_ahead_bytes) reserved under placeholder
 * keys (a random prefix of this tier and a counter), asked for with
 * RESERVE.arg = reserve_ahead_hold_ms.
 * A reserve of n objects of that size, n <= the spares held, completes
 * inline from them; the runtime copies into the regions and publishes them
 * with PUBLISH_AS (placeholder -> key).  A key that another put stored
 * meanwhile comes back UMBP_TIER_EXISTS and the region is dropped.
 *
 * The hold.  The server keeps a spare's region for the hold plus the
 * writer deadline this tier declared at HELLO, counted from when it
 * received the RESERVE; the runtime writes into a region for at most that
 * deadline after the op started (shm.h).  A spare is therefore handed out
 * only while now < sent + hold (less a tenth): the op that takes it started
 * earlier, so its writes end before the server may reuse the region.  Spares
 * that would pass that point before the check after next are replaced a
 * check early: their replacements are asked for while they are still
 * usable, and they are aborted once the replacements are granted, so a
 * store never finds the spares gone for a round trip; any that would pass
 * it before the next check (replacements not granted yet) are aborted then.
 *
 * Refills go out when the session has nothing outstanding, so they never
 * queue in front of a store's own reservations at the server; a refill that
 * the server answers with less (a full pool) is retried at the next check.
 * Spares die with the session (a reconnect starts with none: the new
 * session's epoch differs) and are aborted when the runtime stops; a runtime
 * that begins to shut down starts no refill and waits (its drain, up to
 * timeout_ms) for the answer to one under way, so that the spares it grants
 * are aborted too: a session closed with the RESERVE unanswered would leave
 * the server to grant it to nobody and hold the regions to their deadline.
 *
 * The budget: reserve_ahead_bytes, at most 1/32 of the pool, and at most
 * 1/16 of the pool divided among the sessions the server last counted: the
 * workers of a host sharing a small pool keep about 1/16 of it in spares
 * together, not 1/32 each (re-divided at every check, the excess given back).
 *
 * Several sizes.  A runtime with KV caches of different object sizes (a
 * hybrid model: attention groups and Mamba state, one registration each)
 * hints each; the first SHM_AHEAD_SIZES sizes share the budget evenly (a
 * new size shrinks the others' shares, their excess given back at once),
 * later ones reserve as before.  One refill is outstanding at a time; sizes
 * take turns, the next following as soon as one is answered, and a size
 * whose refill came back short (a full pool, a namespace's quota) waits for
 * a check, so that it neither starves the others nor asks every few ms.
 *
 * Loop thread only.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "shm.h"

#define SHM_AHEAD_MAX 4096      /* spares at most, whatever the budget */
#define SHM_AHEAD_POOL_SHARE 32 /* and at most 1/32 of the pool */
#define SHM_AHEAD_HOST_SHARE 16 /* and 1/16 of it divided among the server's sessions */
#define SHM_AHEAD_RETRY_S 0.002 /* a refill waits for an idle session */
#define SHM_AHEAD_KICK_S 0.005  /* and comes this long after spares were taken */

static double hold_s(const struct shm_tier *st)
{
    return (double)st->cfg.reserve_ahead_hold_ms / 1000.0;
}

/* Checks run four times per hold: a spare is replaced once it would pass its
 * usable time before the check after next, and retired once it would pass it
 * before the next. */
static double period_s(const struct shm_tier *st) { return hold_s(st) / 4; }

static uint64_t s_to_ns(double s) { return (uint64_t)(s * 1e9); }

void shm_ahead_key(const struct shm_tier *st, uint64_t id, umbp_key_t *out)
{
    memcpy(out->bytes, st->ahead.prefix, sizeof(st->ahead.prefix));
    for (size_t i = 0; i < 8; i++)
        out->bytes[sizeof(st->ahead.prefix) + i] = (uint8_t)(id >> (8 * i));
}

static uint64_t key_id(const struct shm_tier *st, const umbp_key_t *k)
{
    uint64_t id = 0;
    for (size_t i = 0; i < 8; i++)
        id |= (uint64_t)k->bytes[sizeof(st->ahead.prefix) + i] << (8 * i);
    return id;
}

static void arm(struct shm_tier *st, double after_s)
{
    if (st->ahead.draining)
        return;
    ev_timer_stop(st->base.env.loop, &st->ahead.timer);
    ev_timer_set(&st->ahead.timer, after_s, 0);
    ev_timer_start(st->base.env.loop, &st->ahead.timer);
}

static bool connected(const struct shm_tier *st)
{
    return st->sess.state == NET_CONNECTED;
}

/* Aborts spares [from, from + k) of z at the server and removes them. */
static void give_back(struct shm_tier *st, struct shm_ahead_size *z, size_t from, size_t k)
{
    if (!k)
        return;
    umbp_key_t *keys = malloc(k * sizeof(*keys));
    uint64_t *tokens = malloc(k * sizeof(*tokens));
    if (keys && tokens && connected(st) && z->epoch == st->epoch) {
        for (size_t i = 0; i < k; i++) {
            shm_ahead_key(st, z->v[from + i].id, &keys[i]);
            tokens[i] = z->v[from + i].token;
        }
        shm_send_abort(st, keys, tokens, k);
    }
    free(keys);
    free(tokens);
    memmove(&z->v[from], &z->v[from + k], (z->n - from - k) * sizeof(z->v[0]));
    z->n -= k;
}

/* How many of z's oldest spares pass their usable time within `checks`
 * checks from now (filled in order: the oldest first). */
static size_t too_old(const struct shm_tier *st, const struct shm_ahead_size *z, uint64_t now,
                      int checks)
{
    uint64_t horizon = now + s_to_ns(checks * period_s(st)) + s_to_ns(SHM_AHEAD_RETRY_S);
    size_t k = 0;
    while (k < z->n && z->v[k].usable_until_ns <= horizon)
        k++;
    return k;
}

/* Spares of z to ask for now: the missing ones and replacements for those
 * the next check would retire. */
static size_t to_fill(const struct shm_tier *st, const struct shm_ahead_size *z, uint64_t now)
{
    size_t k = (z->n < z->want ? z->want - z->n : 0) + too_old(st, z, now, 2);
    return z->n + k <= z->cap ? k : z->cap - z->n;
}

/* The next size that needs a refill now, and how many; NULL when none
 * does or one is outstanding.  Sizes take turns, and one whose last refill
 * came back short (a full pool, a quota) rests until the next check, so
 * that it neither starves the others nor asks again every few ms. */
static struct shm_ahead_size *next_fill(struct shm_tier *st, uint64_t now, size_t *k)
{
    struct shm_ahead *a = &st->ahead;
    if (a->filling || !connected(st))
        return NULL;
    for (unsigned j = 0; j < a->nsizes; j++) {
        unsigned i = (a->turn + j) % a->nsizes;
        if (now >= a->s[i].rest_until_ns && (*k = to_fill(st, &a->s[i], now)) > 0)
            return &a->s[i];
    }
    return NULL;
}

/* The bytes this worker may keep in spares: reserve_ahead_bytes, at most
 * 1/32 of the pool, and at most 1/16 of the pool divided among the
 * sessions the server last counted (STATS), so that the workers of a host
 * together keep about 1/16 of a small shared pool at most, not 1/32 each. */
static uint64_t budget(const struct shm_tier *st)
{
    const struct shm_map *m = shm_current_map(st);
    uint64_t b = st->cfg.reserve_ahead_bytes;
    if (!m)
        return b;
    uint64_t sessions = st->stats.sessions ? st->stats.sessions : 1;
    if (m->size / SHM_AHEAD_POOL_SHARE < b)
        b = m->size / SHM_AHEAD_POOL_SHARE;
    if (m->size / SHM_AHEAD_HOST_SHARE / sessions < b)
        b = m->size / SHM_AHEAD_HOST_SHARE / sessions;
    return b;
}

/* Spares of size bytes when sizes sizes share budget. */
static size_t share(uint64_t budget, unsigned sizes, uint64_t size)
{
    uint64_t want = budget / sizes / size;
    return (size_t)(want < SHM_AHEAD_MAX / sizes ? want : SHM_AHEAD_MAX / sizes);
}

/* Each size's share of the budget now (never more spares than v has room
 * for, half of it: the share when the size came); the excess given back,
 * the oldest first. */
static void reshare(struct shm_tier *st, unsigned sizes)
{
    struct shm_ahead *a = &st->ahead;
    uint64_t b = budget(st);
    for (unsigned i = 0; i < sizes; i++) {
        struct shm_ahead_size *z = &a->s[i];
        size_t want = share(b, sizes, z->size);
        z->want = want < z->cap / 2 ? want : z->cap / 2;
        if (z->n > z->want)
            give_back(st, z, 0, z->n - z->want);
    }
}

/* ---- refills ------------------------------------------------------------------------ */

struct fill {
    struct shm_tier *st;
    struct shm_ahead_size *z;
    uint64_t epoch, usable_until_ns;
    size_t k;
    struct umbp_tier_req **ptrs;
    struct umbp_tier_req reqs[];
};

static void fill_done(void *arg, int rc)
{
    struct fill *f = arg;
    struct shm_tier *st = f->st;
    struct shm_ahead *a = &st->ahead;
    struct shm_ahead_size *z = f->z;
    a->filling = false;
    size_t got = 0;
    /* room: k <= cap - n when sent, and n only fell since (one fill at a time) */
    for (size_t i = 0; rc == 0 && i < f->k; i++) {
        const struct umbp_tier_req *r = &f->reqs[i];
        if (r->status != 0)
            continue;
        z->v[z->n++] = (struct shm_spare){
            .id = key_id(st, &r->key),
            .addr = r->region.addr,
            .token = r->region.token,
            .usable_until_ns = f->usable_until_ns,
        };
        got++;
    }
    if (got)
        z->epoch = f->epoch; /* the session is the one that answered: current */
    a->filled += got;
    uint64_t now = umbp_now_ns();
    if (rc == 0 && got < f->k) /* less granted: asked again at a check */
        z->rest_until_ns = now + s_to_ns(period_s(st) / 2);
    if (z->n > z->want) /* the replaced ones: the oldest */
        give_back(st, z, 0, z->n - z->want);
    free(f);
    size_t k;
    if (rc == 0 && next_fill(st, now, &k)) /* the next size's turn now */
        arm(st, SHM_AHEAD_RETRY_S);
}

/* Asks for k spares of z. */
static void fill(struct shm_tier *st, struct shm_ahead_size *z, size_t k)
{
    struct shm_ahead *a = &st->ahead;
    struct fill *f = malloc(sizeof(*f) + k * (sizeof(f->reqs[0]) + sizeof(f->ptrs[0])));
    if (!f)
        return;
    f->st = st;
    f->z = z;
    f->epoch = st->epoch;
    f->k = k;
    f->ptrs = (struct umbp_tier_req **)&f->reqs[k];
    uint64_t now = umbp_now_ns(), hold = s_to_ns(hold_s(st));
    f->usable_until_ns = now + hold - hold / 10;
    for (size_t i = 0; i < k; i++) {
        f->reqs[i] = (struct umbp_tier_req){.size = z->size};
        shm_ahead_key(st, a->next_id++, &f->reqs[i].key);
        f->ptrs[i] = &f->reqs[i];
    }
    struct shm_call *c = shm_call_new(st, SHM_RESERVE, f->ptrs, k, fill_done, f);
    if (!c) {
        free(f);
        return;
    }
    a->filling = true;
    a->turn = (unsigned)(z - a->s + 1) % a->nsizes;
    shm_call_send(st, c, (uint32_t)st->cfg.reserve_ahead_hold_ms, false);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct shm_tier *st = w->data;
    struct shm_ahead *a = &st->ahead;
    (void)loop;
    (void)revents;
    if (!a->nsizes || !connected(st))
        return; /* conn_up kicks again */
    uint64_t now = umbp_now_ns();
    reshare(st, a->nsizes); /* the server's sessions may have changed */
    for (unsigned i = 0; i < a->nsizes; i++) /* not replaced in time */
        give_back(st, &a->s[i], 0, too_old(st, &a->s[i], now, 1));
    size_t k;
    struct shm_ahead_size *z = next_fill(st, now, &k);
    if (z) {
        if (net_session_oldest(&st->sess)) {
            arm(st, SHM_AHEAD_RETRY_S);
            return;
        }
        fill(st, z, k);
    }
    arm(st, period_s(st));
}

/* ---- what the tier calls ------------------------------------------------------------ */

void shm_ahead_init(struct shm_tier *st)
{
    struct shm_ahead *a = &st->ahead;
    ev_init(&a->timer, on_timer);
    a->timer.data = st;
    a->next_id = 1;
    if (getrandom(a->prefix, sizeof(a->prefix), GRND_NONBLOCK) != (ssize_t)sizeof(a->prefix))
        for (size_t i = 0; i < sizeof(a->prefix); i++) /* placeholders need only differ */
            a->prefix[i] = (uint8_t)(umbp_now_ns() >> (i % 8 * 8)) ^ (uint8_t)(uintptr_t)st;
}

void shm_ahead_kick(struct shm_tier *st)
{
    if (st->ahead.nsizes && connected(st))
        arm(st, SHM_AHEAD_KICK_S);
}

void shm_ahead_hint(struct umbp_tier *t, uint64_t size)
{
    struct shm_tier *st = to_shm_tier(t);
    struct shm_ahead *a = &st->ahead;
    for (unsigned i = 0; i < a->nsizes; i++)
        if (a->s[i].size == size)
            return; /* the common case: a size known */
    if (!size || !st->worker || !st->cfg.reserve_ahead_bytes || a->nsizes == SHM_AHEAD_SIZES)
        return; /* lookup sessions map no pool; the first sizes only */
    unsigned sizes = a->nsizes + 1;
    /* v's room: twice the share with the server to this session alone */
    const struct shm_map *m = shm_current_map(st);
    uint64_t alone = st->cfg.reserve_ahead_bytes;
    if (m && m->size / SHM_AHEAD_POOL_SHARE < alone)
        alone = m->size / SHM_AHEAD_POOL_SHARE;
    size_t most = share(alone, sizes, size);
    struct shm_ahead_size *z = &a->s[a->nsizes];
    if (!most || !(z->v = calloc(2 * most, sizeof(z->v[0]))))
        return; /* over its share: reserved as before, the others keep theirs */
    *z = (struct shm_ahead_size){.size = size, .cap = 2 * most, .v = z->v};
    reshare(st, sizes); /* its share, and the others' shrink */
    a->nsizes = sizes;
    shm_ahead_kick(st);
}

bool shm_ahead_take(struct shm_tier *st, struct umbp_tier_req *const *reqs, size_t n)
{
    struct shm_ahead *a = &st->ahead;
    if (!n || !connected(st))
        return false;
    struct shm_ahead_size *z = NULL;
    for (unsigned i = 0; i < a->nsizes && !z; i++)
        if (a->s[i].size == reqs[0]->size)
            z = &a->s[i];
    if (!z || n > z->n || z->epoch != st->epoch)
        return false;
    for (size_t i = 1; i < n; i++)
        if (reqs[i]->size != z->size)
            return false;
    uint64_t now = umbp_now_ns();
    if (z->v[z->n - n].usable_until_ns <= now) /* the oldest of the n taken */
        return false;
    /* the newest n, in the order granted: consecutive keys get regions in
     * the order the server allocated them (mostly ascending and adjacent),
     * so the copy engine can merge their transfers as it does for an
     * ordinary reservation; handed out in reverse they cost twice the
     * launch time (H200 host, docs/benchmarks.md) */
    z->n -= n;
    for (size_t i = 0; i < n; i++) {
        const struct shm_spare *s = &z->v[z->n + i];
        reqs[i]->status = 0;
        reqs[i]->region = (struct umbp_region){
            .addr = s->addr,
            .size = z->size,
            .token = s->token,
            .aux = {st->epoch, s->id},
        };
    }
    a->taken += n;
    shm_ahead_kick(st);
    return true;
}

uint64_t shm_ahead_held(const struct shm_tier *st)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < st->ahead.nsizes; i++)
        n += st->ahead.s[i].n;
    return n;
}

bool shm_ahead_drain(struct shm_tier *st)
{
    struct shm_ahead *a = &st->ahead;
    a->draining = true;
    ev_timer_stop(st->base.env.loop, &a->timer);
    return a->filling && connected(st);
}

void shm_ahead_drop(struct shm_tier *st, bool abort_them)
{
    struct shm_ahead *a = &st->ahead;
    for (unsigned i = 0; i < a->nsizes; i++) {
        if (abort_them)
            give_back(st, &a->s[i], 0, a->s[i].n);
        a->s[i].n = 0;
    }
    ev_timer_stop(st->base.env.loop, &a->timer);
}

void shm_ahead_destroy(struct shm_tier *st)
{
    for (unsigned i = 0; i < st->ahead.nsizes; i++) {
        free(st->ahead.s[i].v);
        st->ahead.s[i].v = NULL;
    }
    st->ahead.nsizes = 0;
}
