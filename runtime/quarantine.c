/*
 * quarantine.c - keys whose load failed recently, counted as misses until a
 * deadline (load_failure_quarantine_ms).  A later store of the key does not
 * lift it.  Loop thread only: written by the load actor, read by the lookup
 * and load actors.  Open addressing with linear probing; expired entries are
 * dropped when the table is rebuilt on growth.
 */
#include <stdlib.h>
#include <string.h>

#include "rt.h"

struct qentry {
    umbp_key_t key;
    uint64_t until_ns; /* 0: empty slot */
};

struct quarantine {
    struct qentry *v;
    size_t cap, used;
};

struct quarantine *quarantine_new(void) { return calloc(1, sizeof(struct quarantine)); }

void quarantine_free(struct quarantine *q)
{
    if (q)
        free(q->v);
    free(q);
}

static struct qentry *slot(struct qentry *v, size_t cap, const umbp_key_t *k)
{
    size_t i = umbp_key_hash(k) & (cap - 1);
    while (v[i].until_ns && memcmp(&v[i].key, k, sizeof(*k)) != 0)
        i = (i + 1) & (cap - 1);
    return &v[i];
}

static void rebuild(struct quarantine *q, size_t cap, uint64_t now)
{
    struct qentry *nv = calloc(cap, sizeof(*nv));
    if (!nv)
        return; /* keep the old table; quarantine is best effort */
    size_t used = 0;
    for (size_t i = 0; i < q->cap; i++)
        if (q->v[i].until_ns > now) {
            *slot(nv, cap, &q->v[i].key) = q->v[i];
            used++;
        }
    free(q->v);
    q->v = nv;
    q->cap = cap;
    q->used = used;
}

void quarantine_add(struct quarantine *q, const umbp_key_t *k, uint64_t until_ns)
{
    uint64_t now = umbp_now_ns();
    if (!q->cap || (q->used + 1) * 2 > q->cap) {
        rebuild(q, q->cap ? q->cap : 64, now); /* drop expired first */
        if ((q->used + 1) * 2 > q->cap)
            rebuild(q, q->cap * 2, now);
        if (!q->cap)
            return;
    }
    struct qentry *e = slot(q->v, q->cap, k);
    if (!e->until_ns)
        q->used++;
    e->key = *k;
    e->until_ns = until_ns;
}

bool quarantine_has(struct quarantine *q, const umbp_key_t *k, uint64_t now_ns)
{
    if (!q || !q->cap)
        return false;
    struct qentry *e = slot(q->v, q->cap, k);
    return e->until_ns > now_ns;
}
