/*
 * lease.c - slot table of read leases, with deadline-ordered lists.
 *
 * Slots live in one array that doubles when full; they are linked by index
 * (so growing never invalidates a link) into one of three lists: free
 * (singly linked), active (sorted by deadline) and expired (sorted by the
 * time the record is forgotten).  Inserting walks back from the tail, which
 * is O(1) when every lease has the same TTL, as the runtime's leases do, and
 * stays correct, if slower, when TTLs vary.  An expired record is kept for
 * max(TTL, 60 s) after its deadline.  Expiring and forgetting pop
 * from the heads.  A slot's generation changes every time it is freed, so a
 * token outlives its slot harmlessly: it simply no longer matches.
 * Single-threaded: the tier's loop thread owns it.
 */
#include <errno.h>
#include <stdlib.h>

#include "lease.h"

#define NIL UINT32_MAX
#define LEASES_MIN_SLOTS 64u
/* How long an expired record is kept at least, so a reader that is late, or
 * a lease actor that ticks less often than the TTL, still gets an exact
 * answer.  Only leases that expired cost this memory (about 80 bytes each). */
#define LEASE_RETAIN_MIN_NS (60ull * 1000000000ull)

struct lease {
    uint64_t when_ns; /* ACTIVE: deadline; EXPIRED: when to forget it */
    uint64_t ttl_ns;
    struct dram_obj *obj; /* ACTIVE only */
    umbp_key_t key;
    uint64_t oid;
    uint32_t gen;
    uint32_t prev, next;
    enum dram_lease_state state;
};

struct lease_list {
    uint32_t head, tail;
    size_t n;
};

struct dram_leases {
    struct lease *slots;
    uint32_t cap, free_head;
    struct lease_list active, expired;
};

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static int leases_grow(struct dram_leases *l);

int dram_leases_create(struct dram_leases **out, uint32_t expect)
{
    struct dram_leases *l = calloc(1, sizeof(*l));

    if (!l)
        return -ENOMEM;
    l->free_head = NIL;
    l->active = (struct lease_list){ NIL, NIL, 0 };
    l->expired = (struct lease_list){ NIL, NIL, 0 };
    /* A process's first restore of a 10,000-token prefix otherwise grew
     * the table from 64 to 1,024 slots on the loop thread while the copy
     * waited (70-90 us on an H200 host's VM, docs/benchmarks.md). */
    while (l->cap < expect)
        if (leases_grow(l) < 0) {
            dram_leases_destroy(l);
            return -ENOMEM;
        }
    *out = l;
    return 0;
}

void dram_leases_destroy(struct dram_leases *l)
{
    if (!l)
        return;
    free(l->slots);
    free(l);
}

static void slot_free(struct dram_leases *l, uint32_t i)
{
    struct lease *s = &l->slots[i];

    s->state = DRAM_LEASE_NONE;
    s->obj = NULL;
    if (++s->gen == 0)
        s->gen = 1;     /* generation 0 is never handed out */
    s->next = l->free_head;
    l->free_head = i;
}

static int leases_grow(struct dram_leases *l)
{
    uint32_t cap = l->cap ? l->cap * 2 : LEASES_MIN_SLOTS;
    struct lease *slots;

    if (cap <= l->cap || cap == NIL)
        return -ENOMEM;
    slots = realloc(l->slots, (size_t)cap * sizeof(*slots));
    if (!slots)
        return -ENOMEM;
    l->slots = slots;
    for (uint32_t i = cap; i-- > l->cap;) {
        slots[i].gen = 0;   /* slot_free makes it 1 */
        slot_free(l, i);
    }
    l->cap = cap;
    return 0;
}

static void list_unlink(struct dram_leases *l, struct lease_list *list,
                        uint32_t i)
{
    struct lease *s = &l->slots[i];

    if (s->prev != NIL)
        l->slots[s->prev].next = s->next;
    else
        list->head = s->next;
    if (s->next != NIL)
        l->slots[s->next].prev = s->prev;
    else
        list->tail = s->prev;
    list->n--;
}

/* Keeps the list sorted by when_ns; equal times stay in insertion order. */
static void list_insert_sorted(struct dram_leases *l, struct lease_list *list,
                               uint32_t i)
{
    struct lease *s = &l->slots[i];
    uint32_t after = list->tail;

    while (after != NIL && l->slots[after].when_ns > s->when_ns)
        after = l->slots[after].prev;
    s->prev = after;
    s->next = after == NIL ? list->head : l->slots[after].next;
    if (s->next != NIL)
        l->slots[s->next].prev = i;
    else
        list->tail = i;
    if (after != NIL)
        l->slots[after].next = i;
    else
        list->head = i;
    list->n++;
}

int dram_lease_open(struct dram_leases *l, struct dram_obj *obj,
                    uint64_t deadline_ns, uint64_t ttl_ns, uint64_t *token)
{
    struct lease *s;
    uint32_t i;

    if (l->free_head == NIL && leases_grow(l) < 0)
        return -ENOMEM;
    i = l->free_head;
    s = &l->slots[i];
    l->free_head = s->next;
    s->state = DRAM_LEASE_ACTIVE;
    s->when_ns = deadline_ns;
    s->ttl_ns = ttl_ns;
    s->obj = obj;
    s->key = obj->key;
    s->oid = obj->oid;
    list_insert_sorted(l, &l->active, i);
    *token = (uint64_t)s->gen << 32 | i;
    return 0;
}

struct dram_lease_info dram_lease_end(struct dram_leases *l, uint64_t token)
{
    struct dram_lease_info info = { .state = DRAM_LEASE_NONE };
    uint32_t i = (uint32_t)token, gen = (uint32_t)(token >> 32);
    struct lease *s;

    if (i >= l->cap || l->slots[i].gen != gen ||
        l->slots[i].state == DRAM_LEASE_NONE)
        return info;
    s = &l->slots[i];
    info.state = s->state;
    info.obj = s->obj;
    info.key = s->key;
    info.oid = s->oid;
    list_unlink(l, s->state == DRAM_LEASE_ACTIVE ? &l->active : &l->expired, i);
    slot_free(l, i);
    return info;
}

struct dram_obj *dram_lease_expire_next(struct dram_leases *l, uint64_t now_ns)
{
    uint32_t i = l->active.head;
    struct dram_obj *obj;
    struct lease *s;

    if (i == NIL || l->slots[i].when_ns > now_ns)
        return NULL;
    s = &l->slots[i];
    list_unlink(l, &l->active, i);
    obj = s->obj;
    s->obj = NULL;
    s->state = DRAM_LEASE_EXPIRED;
    s->when_ns = add_sat(s->when_ns, s->ttl_ns > LEASE_RETAIN_MIN_NS
                                         ? s->ttl_ns : LEASE_RETAIN_MIN_NS);
    list_insert_sorted(l, &l->expired, i);
    return obj;
}

void dram_lease_forget(struct dram_leases *l, uint64_t now_ns)
{
    uint32_t i;

    while ((i = l->expired.head) != NIL && l->slots[i].when_ns <= now_ns) {
        list_unlink(l, &l->expired, i);
        slot_free(l, i);
    }
}

size_t dram_leases_active(const struct dram_leases *l)
{
    return l->active.n;
}

size_t dram_leases_expired(const struct dram_leases *l)
{
    return l->expired.n;
}

size_t dram_leases_capacity(const struct dram_leases *l) { return l->cap; }
