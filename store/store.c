/*
 * store.c - the object life cycle over pool, allocator, index and leases.
 *
 * See store.h for the states and invariants.  Every function runs on the
 * owner's thread and completes inline; nothing here blocks after create.
 *
 * Writer deadlines.  A reservation made with a deadline (a server's client:
 * another process writes the region) sits in a binary min-heap by
 * until_ns.  Its region is freed only by the writer itself (publish, abort)
 * or once until_ns has passed: an orphaned reservation (its session ended)
 * becomes HELD, out of the index so the key can be stored again, and keeps
 * its region and its journal record until then; a PENDING one whose
 * session is still there but never finished is reclaimed then too.  A
 * restarted server rebuilds the heap from the journal's hold times.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "index.h"
#include "journal.h"
#include "lease.h"
#include "records.h"
#include "store.h"

struct dram_store {
    struct dram_store_params p;
    struct dram_pool *pool;
    struct dram_alloc *alloc;
    struct dram_index *index;
    struct dram_leases *leases;
    struct dram_records *objs; /* every struct dram_obj (records.h) */
    uint64_t next_oid;
    uint64_t num_objects, num_pending, num_leased;
    uint64_t evictions, evicted_bytes, leases_expired;
    uint64_t pool_id;
    struct dram_journal *journal;      /* persistent pools only */
    struct dram_store_adoption adoption;
    struct ns_state {
        uint64_t quota, used, objects, evictions;
        uint64_t ahead;  /* bytes reserved ahead of their keys, not published */
        struct dram_obj *lru_head, *lru_tail; /* PUBLISHED objects of it */
        uint32_t jns;    /* its number in the journal (journal.h), 0: default */
        bool jns_known;  /* jns was looked up (once: at its first reservation) */
    } ns[DRAM_STORE_MAX_NS];
    /* PENDING and HELD objects with a writer deadline, by until_ns */
    struct dram_obj **heap;
    size_t nheap, heap_cap;
    uint64_t num_held, reservations_expired;
    uint64_t frozen_until_ns;          /* adoption: a writer without a record
                                          may write anywhere free until then */
    uint64_t adopt_grace_ns;
    /* reservations with a writer deadline that found no journal record:
     * while any lives, the journal's header keeps the latest deadline (an
     * adopter hands nothing out before it); when none does, it goes back
     * to unrecorded_floor_s (an adopted one still in the future) or 0 */
    uint64_t num_unrecorded;
    uint32_t unrecorded_floor_s;
    uint64_t journal_full_warn_ns;     /* when the last "journal full" went out */
};

static void emit(struct dram_store *s, umbp_event_type_t type, const struct dram_obj *obj)
{
    if (s->p.emit_event)
        s->p.emit_event(s->p.ctx, type, &obj->key, obj->size);
}

static void space_freed(struct dram_store *s)
{
    if (s->p.space_freed)
        s->p.space_freed(s->p.ctx);
}

static int store_open_journal(struct dram_store *s, const struct dram_store_params *p,
                              uint64_t usable, char *err, size_t errlen);

static uint64_t obj_free(struct dram_store *s, struct dram_obj *obj);

/* ---- the writer-deadline heap -------------------------------------------- */

static void heap_set(struct dram_store *s, size_t i, struct dram_obj *o)
{
    s->heap[i] = o;
    o->heap_pos = (uint32_t)i;
}

static void heap_up(struct dram_store *s, size_t i)
{
    struct dram_obj *o = s->heap[i];
    while (i > 0 && s->heap[(i - 1) / 2]->until_ns > o->until_ns) {
        heap_set(s, i, s->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_set(s, i, o);
}

static void heap_down(struct dram_store *s, size_t i)
{
    struct dram_obj *o = s->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->nheap)
            break;
        if (c + 1 < s->nheap && s->heap[c + 1]->until_ns < s->heap[c]->until_ns)
            c++;
        if (s->heap[c]->until_ns >= o->until_ns)
            break;
        heap_set(s, i, s->heap[c]);
        i = c;
    }
    heap_set(s, i, o);
}

static int heap_push(struct dram_store *s, struct dram_obj *o)
{
    if (s->nheap == s->heap_cap) {
        size_t cap = s->heap_cap ? 2 * s->heap_cap : 64;
        struct dram_obj **h = realloc(s->heap, cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        s->heap = h;
        s->heap_cap = cap;
    }
    heap_set(s, s->nheap++, o);
    heap_up(s, s->nheap - 1);
    return 0;
}

/* Takes o out of the heap if it is in it. */
static void heap_remove(struct dram_store *s, struct dram_obj *o)
{
    if (!o->until_ns)
        return;
    size_t i = o->heap_pos;
    o->until_ns = 0;
    struct dram_obj *last = s->heap[--s->nheap];
    if (i == s->nheap)
        return;
    heap_set(s, i, last);
    heap_up(s, i);
    heap_down(s, last->heap_pos);
}

/* ---- LRU: the global list (index.c) and the object's namespace list ----- */

static void ns_unlink(struct ns_state *n, struct dram_obj *obj)
{
    if (obj->ns_prev)
        obj->ns_prev->ns_next = obj->ns_next;
    else
        n->lru_head = obj->ns_next;
    if (obj->ns_next)
        obj->ns_next->ns_prev = obj->ns_prev;
    else
        n->lru_tail = obj->ns_prev;
    obj->ns_prev = obj->ns_next = NULL;
}

static void ns_push_head(struct ns_state *n, struct dram_obj *obj)
{
    obj->ns_prev = NULL;
    obj->ns_next = n->lru_head;
    if (n->lru_head)
        n->lru_head->ns_prev = obj;
    else
        n->lru_tail = obj;
    n->lru_head = obj;
}

static void lru_push(struct dram_store *s, struct dram_obj *obj)
{
    dram_lru_push_head(s->index, obj);
    ns_push_head(&s->ns[obj->ns], obj);
}

static void lru_unlink(struct dram_store *s, struct dram_obj *obj)
{
    dram_lru_unlink(s->index, obj);
    ns_unlink(&s->ns[obj->ns], obj);
}

static void lru_touch(struct dram_store *s, struct dram_obj *obj)
{
    dram_lru_touch(s->index, obj);
    ns_unlink(&s->ns[obj->ns], obj);
    ns_push_head(&s->ns[obj->ns], obj);
}

/* ---- lifetime ----------------------------------------------------------- */

/* The index and the lease table start at the size a full pool of KV block
 * objects needs (one object per 64 KiB of capacity, the size below which
 * no model's block object falls; at least 64) and room for as many leases
 * at once, up to 4,096 (six 10,000-token restores in flight), so neither
 * grows while a pool fills: growing the index rehashed up to 5,700 entries
 * on the loop thread in the middle of a store (about 0.5 ms on an H200
 * host's VM).  A small pool (tests, fuzzers) makes little up front. */
#define STORE_PRESIZE_OBJECT_BYTES (64u << 10)
#define STORE_PRESIZE_LEASES 4096u

static size_t store_expected_objects(uint64_t usable)
{
    uint64_t n = usable / STORE_PRESIZE_OBJECT_BYTES;
    return n < 64 ? 64 : (size_t)n;
}

/* The object and allocator records made (and touched) at creation: as many
 * as the expected objects, up to 2^18 (208 bytes an object: about 52 MiB, a
 * 16 GiB pool's worth), past which they are made 256 at a time (records.h). */
#define STORE_PREFILL_MAX (1u << 18)

static size_t store_prefill(size_t expect)
{
    return expect < STORE_PREFILL_MAX ? expect : STORE_PREFILL_MAX;
}

int dram_store_create(const struct dram_store_params *p, struct dram_store **out, char *err,
                      size_t errlen)
{
    struct dram_store *s = calloc(1, sizeof(*s));
    if (!s)
        goto nomem;
    s->p = *p;
    s->p.pool.shm_name = NULL; /* only valid during create */
    s->next_oid = 1;
    s->adopt_grace_ns = p->adopt_grace_ms * 1000000ull;
    int rc = dram_pool_create(&p->pool, &s->pool, err, errlen);
    if (rc < 0) {
        dram_store_destroy(s);
        return rc;
    }
    /* The pool is mapped in whole pages; objects get capacity bytes of it
     * (in allocation units), so capacity stays an upper bound. */
    uint64_t usable = p->capacity & ~(uint64_t)(DRAM_ALLOC_ALIGN - 1);
    if (usable > s->pool->size)
        usable = s->pool->size;
    size_t expect = store_expected_objects(usable);
    if (dram_index_create(&s->index, expect) < 0 ||
        dram_leases_create(&s->leases, expect < STORE_PRESIZE_LEASES
                                            ? (uint32_t)expect : STORE_PRESIZE_LEASES) < 0 ||
        dram_records_create(sizeof(struct dram_obj), &s->objs) < 0 ||
        dram_records_prefill(s->objs, store_prefill(expect)) < 0)
        goto nomem;
    if (s->pool->persistent) {
        if ((rc = store_open_journal(s, p, usable, err, errlen)) < 0) {
            dram_store_destroy(s);
            return rc;
        }
    } else {
        while (getrandom(&s->pool_id, sizeof(s->pool_id), 0) != (ssize_t)sizeof(s->pool_id))
            ;
        if (dram_alloc_create(usable, &s->alloc) < 0)
            goto nomem;
    }
    /* a block per object and the free one after them; the free gaps of a
     * fragmented pool take block records as they come (256 at a time) */
    if (dram_alloc_prefill(s->alloc, store_prefill(expect) + 1) < 0)
        goto nomem;
    *out = s;
    return 0;
nomem:
    snprintf(err, errlen, "out of memory for the store's metadata");
    dram_store_destroy(s);
    return -ENOMEM;
}

void dram_store_destroy(struct dram_store *s)
{
    if (!s)
        return;
    dram_journal_close(s->journal);
    /* every object, HELD ones too (their journal records stay PENDING for
     * the next owner), goes with the records */
    free(s->heap);
    dram_leases_destroy(s->leases);
    dram_index_destroy_table(s->index);
    dram_records_destroy(s->objs);
    dram_alloc_destroy(s->alloc);
    dram_pool_destroy(s->pool);
    free(s);
}

const struct dram_pool *dram_store_pool(const struct dram_store *s) { return s->pool; }
uint64_t dram_store_pool_id(const struct dram_store *s) { return s->pool_id; }

void dram_store_adoption(const struct dram_store *s, struct dram_store_adoption *out)
{
    *out = s->adoption;
}

/* ---- adopting a persistent pool ----------------------------------------- */

static int cmp_rec_off(const void *a, const void *b)
{
    const struct dram_journal_rec *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int cmp_obj_oid(const void *a, const void *b)
{
    const struct dram_obj *x = *(struct dram_obj *const *)a, *y = *(struct dram_obj *const *)b;
    return x->oid < y->oid ? -1 : x->oid > y->oid;
}

/* Keeps the records that can be trusted: sorted by offset, inside the pool,
 * aligned, not overlapping an earlier one; the others are dropped. */
static size_t valid_records(struct dram_store *s, struct dram_journal_rec *r, size_t n,
                            uint64_t usable)
{
    qsort(r, n, sizeof(*r), cmp_rec_off);
    size_t k = 0;
    uint64_t end = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = r[i].size ? dram_alloc_round(r[i].size) : 0;
        if (!len || r[i].off % DRAM_ALLOC_ALIGN || r[i].off < end || r[i].off > usable ||
            len > usable - r[i].off) {
            dram_journal_drop(s->journal, r[i].slot);
            s->adoption.dropped++;
            continue;
        }
        end = r[i].off + len;
        r[k++] = r[i];
    }
    return k;
}

/* The owner's namespace of a record's journal namespace: its name's (the
 * default when the journal cannot name it, or the owner has no room);
 * jmap caches the answer per journal number (UINT16_MAX: not yet). */
static unsigned adopt_ns(struct dram_store *s, const struct dram_journal_rec *r,
                         uint16_t *jmap)
{
    if (r->ns == 0)
        return 0;
    if (r->ns < DRAM_JOURNAL_MAX_NS && jmap[r->ns] != UINT16_MAX)
        return jmap[r->ns];
    const char *name = dram_journal_ns_name(s->journal, r->ns);
    unsigned ns = name && s->p.ns_of_name ? s->p.ns_of_name(s->p.ctx, name) : 0;
    if (ns >= DRAM_STORE_MAX_NS)
        ns = 0;
    if (ns && !s->ns[ns].jns_known) { /* its objects keep the number */
        s->ns[ns].jns = r->ns;
        s->ns[ns].jns_known = true;
    }
    if (r->ns < DRAM_JOURNAL_MAX_NS && name)
        jmap[r->ns] = (uint16_t)ns;
    return ns;
}

static void adopt_charge(struct dram_store *s, const struct dram_journal_rec *r,
                         struct dram_obj *obj, uint16_t *jmap)
{
    obj->ns = (uint16_t)adopt_ns(s, r, jmap);
    if (r->ns && !dram_journal_ns_name(s->journal, r->ns))
        s->adoption.unnamed++;
    s->ns[obj->ns].used += dram_alloc_round(r->size);
}

/* A PENDING record: its writer (a client of the dead server) may still
 * write the region until the record's hold time, or for adopt_grace_ms
 * when it has none (a table of an older release); the region is HELD. */
static int adopt_pending(struct dram_store *s, const struct dram_journal_rec *r,
                         uint64_t now_ns, uint16_t *jmap)
{
    struct dram_obj *obj = dram_records_get(s->objs);
    if (!obj)
        return -ENOMEM;
    uint64_t until = r->hold_s ? (uint64_t)r->hold_s * 1000000000ull : now_ns + s->adopt_grace_ns;
    if (!r->hold_s)
        dram_journal_set_hold(s->journal, r->slot, dram_journal_hold_s(until));
    if (until <= now_ns)
        until = now_ns + 1; /* the next expiry frees it */
    *obj = (struct dram_obj){.key = r->key, .oid = r->oid, .off = r->off, .size = r->size,
                             .state = DRAM_OBJ_HELD, .slot = r->slot, .until_ns = until};
    if (heap_push(s, obj) < 0) {
        dram_records_put(s->objs, obj);
        return -ENOMEM;
    }
    adopt_charge(s, r, obj, jmap);
    s->num_held++;
    s->adoption.held_pending++;
    return 0;
}

static int adopt_one(struct dram_store *s, const struct dram_journal_rec *r,
                     struct dram_obj **objs, size_t *nobjs, uint64_t now_ns, uint16_t *jmap)
{
    if (r->state == DRAM_JSLOT_PENDING)
        return adopt_pending(s, r, now_ns, jmap);
    if (dram_index_find(s->index, &r->key)) { /* a key twice: keep the first */
        dram_alloc_put(s->alloc, r->off);
        dram_journal_drop(s->journal, r->slot);
        s->adoption.dropped++;
        return 0;
    }
    struct dram_obj *obj = dram_records_get(s->objs);
    if (!obj)
        return -ENOMEM;
    *obj = (struct dram_obj){.key = r->key, .oid = r->oid, .off = r->off, .size = r->size,
                             .state = DRAM_OBJ_PUBLISHED, .slot = r->slot};
    if (dram_index_insert(s->index, obj) < 0) {
        dram_records_put(s->objs, obj);
        return -ENOMEM;
    }
    if (r->oid >= s->next_oid)
        s->next_oid = r->oid + 1;
    objs[(*nobjs)++] = obj;
    adopt_charge(s, r, obj, jmap);
    s->ns[obj->ns].objects++;
    s->num_objects++;
    s->adoption.objects++;
    s->adoption.bytes += r->size;
    return 0;
}

/* Rebuilds allocator, index, LRU order (oldest oid least recent) and each
 * namespace's use from the journal's records. */
static int adopt_records(struct dram_store *s, struct dram_journal_rec *r, size_t n,
                         uint64_t usable)
{
    n = valid_records(s, r, n, usable);
    struct dram_alloc_range *used = calloc(n ? n : 1, sizeof(*used));
    struct dram_obj **objs = calloc(n ? n : 1, sizeof(*objs));
    uint16_t *jmap = malloc(DRAM_JOURNAL_MAX_NS * sizeof(*jmap));
    uint64_t now = umbp_now_ns();
    int rc = -ENOMEM;
    if (!used || !objs || !jmap)
        goto out;
    memset(jmap, 0xff, DRAM_JOURNAL_MAX_NS * sizeof(*jmap));
    for (size_t i = 0; i < n; i++)
        used[i] = (struct dram_alloc_range){r[i].off, r[i].size};
    if ((rc = dram_alloc_create_used(usable, used, n, &s->alloc)) < 0)
        goto out;
    size_t nobjs = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = adopt_one(s, &r[i], objs, &nobjs, now, jmap);
    qsort(objs, nobjs, sizeof(*objs), cmp_obj_oid);
    for (size_t i = 0; i < nobjs; i++)
        lru_push(s, objs[i]);
    /* a reservation the dead owner granted without a record may be written
     * anywhere that looks free: nothing is handed out until its writer is
     * done */
    uint64_t unrecorded = (uint64_t)dram_journal_unrecorded_hold(s->journal) * 1000000000ull;
    if (unrecorded > now) {
        s->frozen_until_ns = unrecorded;
        s->unrecorded_floor_s = dram_journal_unrecorded_hold(s->journal);
    }
out:
    free(jmap);
    free(used);
    free(objs);
    return rc;
}

static int store_open_journal(struct dram_store *s, const struct dram_store_params *p,
                              uint64_t usable, char *err, size_t errlen)
{
    uint32_t slots = p->journal_slots;
    if (!slots) {
        uint64_t want = usable / (64u << 10);
        slots = want < 4096 ? 4096 : want > (1u << 26) ? (1u << 26) : (uint32_t)want;
    }
    const char *name = s->pool->shm_path + 1; /* "/name" */
    bool adopted;
    struct stat st;
    if (fstat(s->pool->fd, &st) < 0) {
        snprintf(err, errlen, "dram_shm_name: cannot stat /dev/shm%s (%s)", s->pool->shm_path,
                 strerror(errno));
        return -errno;
    }
    /* a new (zeroed) pool under an old journal is another pool: the journal
     * drops its records and takes a new id */
    int rc = dram_journal_open(name, s->pool->size, slots, true, !s->pool->adopted,
                               (uint64_t)st.st_ino, &s->journal, &adopted, &s->pool_id, err,
                               errlen);
    if (rc < 0)
        return rc;
    struct dram_journal_rec *r = NULL;
    size_t n = 0;
    if ((rc = dram_journal_scan(s->journal, &r, &n)) < 0)
        goto nomem;
    s->adoption.adopted = adopted;
    rc = adopt_records(s, r, n, usable);
    free(r);
    if (rc < 0)
        goto nomem;
    if (s->adoption.adopted)
        umbp_log(UMBP_LOG_INFO, "adopted pool /dev/shm%s: %llu objects (%llu bytes), %llu "
                 "pending regions held, %llu records dropped", s->pool->shm_path,
                 (unsigned long long)s->adoption.objects,
                 (unsigned long long)s->adoption.bytes,
                 (unsigned long long)s->adoption.held_pending,
                 (unsigned long long)s->adoption.dropped);
    if (s->adoption.unnamed)
        umbp_log(UMBP_LOG_WARN, "adopted pool /dev/shm%s: %llu objects of namespaces that %s "
                 "does not name count in the default namespace", s->pool->shm_path,
                 (unsigned long long)s->adoption.unnamed, dram_journal_ns_path(s->journal));
    return 0;
nomem:
    snprintf(err, errlen, "out of memory adopting the pool's objects");
    return -ENOMEM;
}

/* Frees a HELD object (its writer is done): out of no index, its region
 * and its journal record go. */
static uint64_t held_free(struct dram_store *s, struct dram_obj *obj)
{
    s->num_held--;
    return obj_free(s, obj);
}

void dram_store_adopt_finish(struct dram_store *s)
{
    uint64_t freed = 0;
    size_t n = 0;
    struct dram_obj **held = malloc((s->nheap ? s->nheap : 1) * sizeof(*held));
    if (!held)
        return;
    for (size_t i = 0; i < s->nheap; i++)
        if (s->heap[i]->state == DRAM_OBJ_HELD)
            held[n++] = s->heap[i];
    for (size_t i = 0; i < n; i++) {
        heap_remove(s, held[i]);
        freed += held_free(s, held[i]);
    }
    free(held);
    s->frozen_until_ns = 0;
    if (freed)
        space_freed(s);
}

/* ---- objects ------------------------------------------------------------ */

/* obj, reserved ahead of its key, is published or freed */
static void ahead_end(struct dram_store *s, struct dram_obj *obj)
{
    if (obj->ahead)
        s->ns[obj->ns].ahead -= dram_alloc_round(obj->size);
    obj->ahead = false;
}

/* obj, a reservation without a journal record, is published or freed: its
 * writer is done */
static void unrecorded_end(struct dram_store *s, struct dram_obj *obj)
{
    if (!obj->unrecorded)
        return;
    obj->unrecorded = false;
    if (--s->num_unrecorded == 0) {
        uint32_t floor = s->unrecorded_floor_s;
        if (floor && dram_journal_hold_s(umbp_now_ns()) >= floor)
            floor = s->unrecorded_floor_s = 0;
        dram_journal_clear_unrecorded(s->journal, floor);
    }
}

/* Returns the pool bytes freed. */
static uint64_t obj_free(struct dram_store *s, struct dram_obj *obj)
{
    uint64_t bytes = dram_alloc_round(obj->size);
    ahead_end(s, obj);
    unrecorded_end(s, obj);
    s->ns[obj->ns].used -= bytes;
    if (obj->slot != DRAM_JOURNAL_NONE)
        dram_journal_drop(s->journal, obj->slot);
    dram_alloc_put(s->alloc, obj->off);
    if (obj->state != DRAM_OBJ_HELD)
        dram_index_remove(s->index, obj);
    dram_records_put(s->objs, obj);
    return bytes;
}

/* Takes a PUBLISHED object out of sight: freed now, or DOOMED while read. */
static uint64_t obj_remove(struct dram_store *s, struct dram_obj *obj)
{
    lru_unlink(s, obj);
    s->num_objects--;
    s->ns[obj->ns].objects--;
    emit(s, UMBP_EVENT_REMOVED, obj);
    if (obj->readers) {
        obj->state = DRAM_OBJ_DOOMED;
        /* out of the journal now: a restart before its last reader ends must
         * not bring back an object removed (a reset, a newer copy) */
        if (obj->slot != DRAM_JOURNAL_NONE)
            dram_journal_drop(s->journal, obj->slot);
        obj->slot = DRAM_JOURNAL_NONE;
        return 0;
    }
    return obj_free(s, obj);
}

/* Ends one reader; returns the bytes freed if it was a DOOMED object's last. */
static uint64_t obj_drop_reader(struct dram_store *s, struct dram_obj *obj)
{
    if (--obj->readers > 0)
        return 0;
    s->num_leased--;
    return obj->state == DRAM_OBJ_DOOMED ? obj_free(s, obj) : 0;
}

bool dram_store_lookup(struct dram_store *s, const umbp_key_t *key, bool touch)
{
    struct dram_obj *obj = dram_index_find(s->index, key);
    bool hit = obj && obj->state == DRAM_OBJ_PUBLISHED;
    if (hit && touch)
        lru_touch(s, obj);
    return hit;
}

/* Evicts namespace n's least recently used objects (neither leased nor
 * pending) while its used bytes exceed `limit`; returns bytes freed. */
static uint64_t ns_evict(struct dram_store *s, unsigned n, uint64_t limit)
{
    struct ns_state *ns = &s->ns[n];
    struct dram_obj *obj = ns->lru_tail, *prev;
    uint64_t freed = 0, count = 0;
    for (; obj && ns->used > limit; obj = prev) {
        prev = obj->ns_prev;
        if (obj->readers)
            continue;
        freed += obj_remove(s, obj);
        count++;
    }
    ns->evictions += count;
    s->evictions += count;
    s->evicted_bytes += freed;
    if (freed)
        space_freed(s);
    return freed;
}

/* The journal's number of namespace ns: looked up (and written to the
 * journal's table) at its first reservation; 0 when it has no name or the
 * table cannot take it (journal.c warns). */
static uint32_t journal_ns(struct dram_store *s, unsigned ns)
{
    struct ns_state *n = &s->ns[ns];
    if (ns && !n->jns_known) {
        n->jns_known = true;
        const char *name = s->p.ns_name ? s->p.ns_name(s->p.ctx, ns) : NULL;
        if (!name || dram_journal_ns_add(s->journal, name, &n->jns) < 0)
            n->jns = 0;
    }
    return n->jns;
}

/* obj found no free journal record: it is not kept across a restart, and
 * while its writer may write, an adopter must hand out nothing. */
static void journal_full(struct dram_store *s, struct dram_obj *obj, uint32_t hold_s)
{
    uint64_t now = umbp_now_ns();
    if (!s->journal_full_warn_ns || now - s->journal_full_warn_ns > 60000000000ull) {
        s->journal_full_warn_ns = now;
        umbp_log(UMBP_LOG_WARN, "pool /dev/shm%s: all %u journal records are in use; objects "
                 "stored now are not kept across a restart of the server (the journal holds "
                 "one record per 64 KiB of pool; smaller objects on average fill it first)",
                 s->pool->shm_path, dram_journal_slots(s->journal));
    }
    if (!hold_s)
        return;
    dram_journal_note_unrecorded(s->journal, hold_s);
    obj->unrecorded = true;
    s->num_unrecorded++;
}


int dram_store_reserve_until(struct dram_store *s, const umbp_key_t *key, uint64_t size,
                             unsigned ns, uint64_t until_ns, bool ahead,
                             struct dram_store_region *r)
{
    if (size == 0 || ns >= DRAM_STORE_MAX_NS)
        return -EINVAL;
    if (dram_index_find(s->index, key))
        return UMBP_TIER_EXISTS;
    if (s->frozen_until_ns) {
        if (umbp_now_ns() < s->frozen_until_ns)
            return -ENOSPC;
        s->frozen_until_ns = 0;
    }
    if (size > dram_alloc_capacity(s->alloc))
        return -EFBIG;
    uint64_t len = dram_alloc_round(size);
    struct ns_state *n = &s->ns[ns];
    if (n->quota) {
        if (len > n->quota)
            return -EDQUOT;
        /* spares never take more than their share of a quota, so that they
         * cannot make the namespace evict more than its stores would */
        if (ahead && n->ahead + len > n->quota / DRAM_STORE_AHEAD_QUOTA_SHARE)
            return -EDQUOT;
        if (n->used + len > n->quota)
            ns_evict(s, ns, n->quota - len);
        if (n->used + len > n->quota)
            return -EDQUOT; /* the rest is leased or pending */
    }
    struct dram_obj *obj = dram_records_get(s->objs);
    if (!obj)
        return -ENOMEM;
    int rc = dram_alloc_get(s->alloc, size, &obj->off);
    if (rc < 0) {
        dram_records_put(s->objs, obj);
        return rc;
    }
    obj->key = *key;
    obj->size = size;
    obj->oid = s->next_oid++;
    obj->state = DRAM_OBJ_PENDING;
    obj->slot = DRAM_JOURNAL_NONE;
    obj->ns = (uint16_t)ns;
    obj->ahead = ahead;
    obj->unrecorded = false;
    obj->until_ns = until_ns;
    if (dram_index_insert(s->index, obj) < 0) {
        dram_alloc_put(s->alloc, obj->off);
        dram_records_put(s->objs, obj);
        return -ENOMEM;
    }
    if (until_ns && heap_push(s, obj) < 0) {
        dram_index_remove(s->index, obj);
        dram_alloc_put(s->alloc, obj->off);
        dram_records_put(s->objs, obj);
        return -ENOMEM;
    }
    n->used += len;
    if (ahead)
        n->ahead += len;
    uint32_t hold_s = until_ns ? dram_journal_hold_s(until_ns) : 0;
    /* (an oid past what a record holds, after 2^48 reservations, is not
     * recorded) */
    if (s->journal && obj->oid <= DRAM_JOURNAL_OID_MAX &&
        (obj->slot = dram_journal_claim(s->journal)) != DRAM_JOURNAL_NONE)
        dram_journal_set_pending(s->journal, obj->slot, key, obj->off, size, obj->oid, hold_s,
                                 journal_ns(s, ns));
    else if (s->journal)
        journal_full(s, obj, hold_s);
    s->num_pending++;
    *r = (struct dram_store_region){.offset = obj->off, .size = size, .token = obj->oid};
    return 0;
}

int dram_store_reserve_ns(struct dram_store *s, const umbp_key_t *key, uint64_t size,
                          unsigned ns, struct dram_store_region *r)
{
    return dram_store_reserve_until(s, key, size, ns, 0, false, r);
}

int dram_store_reserve(struct dram_store *s, const umbp_key_t *key, uint64_t size,
                       struct dram_store_region *r)
{
    return dram_store_reserve_ns(s, key, size, 0, r);
}

int dram_store_set_quota(struct dram_store *s, unsigned ns, uint64_t bytes)
{
    if (ns >= DRAM_STORE_MAX_NS)
        return -EINVAL;
    s->ns[ns].quota = bytes;
    return 0;
}

void dram_store_ns_usage(const struct dram_store *s, unsigned ns, struct dram_store_ns_usage *out)
{
    if (ns >= DRAM_STORE_MAX_NS) {
        *out = (struct dram_store_ns_usage){0};
        return;
    }
    const struct ns_state *n = &s->ns[ns];
    *out = (struct dram_store_ns_usage){n->quota, n->used, n->objects, n->evictions};
}

/* The PENDING object a reservation token names, or NULL. */
static struct dram_obj *find_pending(struct dram_store *s, const umbp_key_t *key,
                                     uint64_t token)
{
    struct dram_obj *obj = dram_index_find(s->index, key);
    if (!obj || obj->state != DRAM_OBJ_PENDING || obj->oid != token)
        return NULL;
    return obj;
}

int dram_store_publish(struct dram_store *s, const umbp_key_t *key, uint64_t token)
{
    struct dram_obj *obj = find_pending(s, key, token);
    if (!obj)
        return -ENOENT;
    heap_remove(s, obj);
    ahead_end(s, obj);
    obj->state = DRAM_OBJ_PUBLISHED;
    if (obj->slot != DRAM_JOURNAL_NONE)
        dram_journal_set_published(s->journal, obj->slot);
    unrecorded_end(s, obj);
    s->num_pending--;
    s->num_objects++;
    s->ns[obj->ns].objects++;
    lru_push(s, obj);
    emit(s, UMBP_EVENT_STORED, obj);
    return 0;
}

/* A reservation made ahead of its key (a placeholder `from`) becomes the
 * object of `key`: out of the table under one key, in under the other, its
 * journal record rewritten while still PENDING (a crash in between leaves a
 * PENDING record, which an adopter only frees), then published. */
int dram_store_publish_as(struct dram_store *s, const umbp_key_t *from, uint64_t token,
                          const umbp_key_t *key)
{
    if (!memcmp(from, key, sizeof(*key)))
        return dram_store_publish(s, key, token);
    struct dram_obj *obj = find_pending(s, from, token);
    if (!obj)
        return -ENOENT;
    if (dram_index_find(s->index, key)) {
        dram_store_abort(s, from, token);
        return UMBP_TIER_EXISTS;
    }
    /* the insert cannot grow the table (it held obj a moment ago), so it
     * cannot fail */
    dram_index_remove(s->index, obj);
    obj->key = *key;
    (void)dram_index_insert(s->index, obj);
    if (obj->slot != DRAM_JOURNAL_NONE)
        dram_journal_set_pending(s->journal, obj->slot, key, obj->off, obj->size, obj->oid,
                                 obj->until_ns ? dram_journal_hold_s(obj->until_ns) : 0,
                                 journal_ns(s, obj->ns));
    return dram_store_publish(s, key, token);
}

uint64_t dram_store_abort(struct dram_store *s, const umbp_key_t *key, uint64_t token)
{
    struct dram_obj *obj = find_pending(s, key, token);
    if (!obj)
        return 0;
    heap_remove(s, obj);
    s->num_pending--;
    uint64_t freed = obj_free(s, obj);
    space_freed(s);
    return freed;
}

uint64_t dram_store_orphan(struct dram_store *s, const umbp_key_t *key, uint64_t token,
                           uint64_t now_ns)
{
    struct dram_obj *obj = find_pending(s, key, token);
    if (!obj)
        return 0;
    if (!obj->until_ns || obj->until_ns <= now_ns)
        return dram_store_abort(s, key, token); /* its writer is done */
    dram_index_remove(s->index, obj);
    obj->state = DRAM_OBJ_HELD;
    s->num_pending--;
    s->num_held++;
    return 0;
}

uint64_t dram_store_expire_writers(struct dram_store *s, uint64_t now_ns)
{
    uint64_t n = 0, freed = 0;
    while (s->nheap && s->heap[0]->until_ns <= now_ns) {
        struct dram_obj *obj = s->heap[0];
        heap_remove(s, obj);
        if (obj->state == DRAM_OBJ_HELD) {
            freed += held_free(s, obj);
        } else { /* PENDING past its deadline: the writer gave up */
            s->num_pending--;
            s->reservations_expired++;
            freed += obj_free(s, obj);
        }
        n++;
    }
    if (freed)
        space_freed(s);
    return n;
}

uint64_t dram_store_next_writer_deadline(const struct dram_store *s)
{
    return s->nheap ? s->heap[0]->until_ns : 0;
}

void dram_store_writer_counts(const struct dram_store *s, uint64_t *held,
                              uint64_t *reservations_expired)
{
    *held = s->num_held;
    *reservations_expired = s->reservations_expired;
}

/* ---- leases ------------------------------------------------------------- */

static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

int dram_store_acquire(struct dram_store *s, const umbp_key_t *key, uint64_t now_ns,
                       uint64_t ttl_ns, struct dram_store_region *r)
{
    struct dram_obj *obj = dram_index_find(s->index, key);
    if (!obj || obj->state != DRAM_OBJ_PUBLISHED)
        return -ENOENT;
    uint64_t token;
    int rc = dram_lease_open(s->leases, obj, add_sat(now_ns, ttl_ns), ttl_ns, &token);
    if (rc < 0)
        return rc;
    if (obj->readers++ == 0)
        s->num_leased++;
    lru_touch(s, obj);
    *r = (struct dram_store_region){.offset = obj->off, .size = obj->size, .token = token};
    return 0;
}

int dram_store_release(struct dram_store *s, uint64_t token, uint64_t *freed)
{
    struct dram_lease_info l = dram_lease_end(s->leases, token);
    switch (l.state) {
    case DRAM_LEASE_ACTIVE:
        *freed += obj_drop_reader(s, l.obj);
        return 0;
    case DRAM_LEASE_EXPIRED:
        /* The lease no longer pinned it: valid only if never freed. */
        return dram_index_find_oid(s->index, &l.key, l.oid) ? 0 : UMBP_E_STALE;
    default:
        return UMBP_E_STALE;
    }
}

uint64_t dram_store_expire_leases(struct dram_store *s, uint64_t now_ns)
{
    struct dram_obj *obj;
    uint64_t freed = 0, n = 0;
    while ((obj = dram_lease_expire_next(s->leases, now_ns))) {
        n++;
        freed += obj_drop_reader(s, obj);
    }
    s->leases_expired += n;
    dram_lease_forget(s->leases, now_ns);
    if (freed)
        space_freed(s);
    return n;
}

/* ---- eviction, clear, usage --------------------------------------------- */

static bool want_more(const struct dram_store *s, uint64_t target, uint64_t run)
{
    return dram_alloc_used(s->alloc) > target || (run && dram_alloc_largest_free(s->alloc) < run);
}

uint64_t dram_store_evict(struct dram_store *s, uint64_t target_bytes, uint64_t want_free_run,
                          size_t max_objects, bool *more)
{
    uint64_t freed = 0;
    /* tenants over their quota pay first */
    for (unsigned n = 0; n < DRAM_STORE_MAX_NS && want_more(s, target_bytes, want_free_run); n++)
        if (s->ns[n].quota && s->ns[n].used > s->ns[n].quota)
            freed += ns_evict(s, n, s->ns[n].quota);
    struct dram_obj *obj = dram_lru_tail(s->index), *prev;
    size_t count = 0;
    bool hit_max = false;
    for (; obj && want_more(s, target_bytes, want_free_run); obj = prev) {
        prev = obj->lru_prev;
        if (obj->readers)
            continue; /* leased: never evicted */
        if (count == max_objects) {
            hit_max = true;
            break;
        }
        freed += obj_remove(s, obj);
        count++;
    }
    s->evictions += count;
    s->evicted_bytes += freed;
    if (more)
        *more = hit_max;
    if (freed)
        space_freed(s);
    return freed;
}

void dram_store_clear(struct dram_store *s)
{
    struct dram_obj *obj = dram_lru_tail(s->index), *prev;
    uint64_t freed = 0;
    for (; obj; obj = prev) {
        prev = obj->lru_prev;
        freed += obj_remove(s, obj);
    }
    if (freed)
        space_freed(s);
}

void dram_store_usage(const struct dram_store *s, struct umbp_tier_usage *out)
{
    uint64_t cap = dram_alloc_capacity(s->alloc);
    *out = (struct umbp_tier_usage){
        .capacity_bytes = cap,
        .used_bytes = dram_alloc_used(s->alloc),
        .high_watermark_bytes = (uint64_t)((double)cap * s->p.high_watermark),
        .low_watermark_bytes = (uint64_t)((double)cap * s->p.low_watermark),
        .num_objects = s->num_objects,
        .num_pending = s->num_pending,
        .num_leased = s->num_leased,
        .evictions = s->evictions,
        .evicted_bytes = s->evicted_bytes,
        .leases_expired = s->leases_expired,
    };
}

uint64_t dram_store_largest_free(const struct dram_store *s)
{
    return dram_alloc_largest_free(s->alloc);
}

void dram_store_tables(const struct dram_store *s, struct dram_store_tables *out)
{
    *out = (struct dram_store_tables){
        .index_slots = dram_index_slots(s->index),
        .lease_slots = dram_leases_capacity(s->leases),
        .object_records = dram_records_made(s->objs),
        .block_records = dram_alloc_records(s->alloc),
    };
}

void dram_store_for_each_published(const struct dram_store *s,
                                   void (*fn)(void *ctx, const umbp_key_t *key, uint64_t size),
                                   void *ctx)
{
    for (const struct dram_obj *o = dram_lru_head(s->index); o; o = o->lru_next)
        fn(ctx, &o->key, o->size);
}
