/*
 * directory.c - umbp-master's soft state (directory.h): the node table and
 * the key index.
 *
 * The key index is open addressing with linear probing over a power-of-two
 * table, deleted by backward shift (no tombstones), grown at 3/4 full up
 * to what max_keys needs.  An entry names its owners by node slot (u16);
 * a slot is freed only after every entry naming it was cleared (dropping a
 * node scans the table), so a slot in an entry always means the node that
 * stored it.
 *
 * Threads: one at a time (the master's loop thread).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "directory.h"
#include "umbp/tier.h" /* umbp_key_hash */

#define MIN_CAP (1u << 12)

struct dir_entry {
    umbp_key_t key;
    uint64_t size;
    uint16_t slot[PROTO_MAX_REPLICAS];
    uint8_t nrep;               /* 0: empty */
};

struct directory {
    struct dir_config cfg;
    struct dir_node **nodes;    /* max_nodes slots */
    size_t nnodes;
    uint32_t next_ref, epoch;
    struct dir_entry *tab;
    uint64_t cap, count, cap_max;
    struct dir_stats st;
};

int dir_create(const struct dir_config *cfg, struct directory **out)
{
    struct directory *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    d->cfg = *cfg;
    d->nodes = calloc(cfg->max_nodes, sizeof(*d->nodes));
    d->cap = MIN_CAP;
    d->tab = calloc(d->cap, sizeof(*d->tab));
    if (!d->nodes || !d->tab) {
        dir_destroy(d);
        return -ENOMEM;
    }
    d->cap_max = MIN_CAP;
    while (d->cap_max / 4 * 3 < cfg->max_keys && d->cap_max < (1ull << 40))
        d->cap_max *= 2;
    d->epoch = 1;
    *out = d;
    return 0;
}

void dir_destroy(struct directory *d)
{
    if (!d)
        return;
    for (uint32_t i = 0; d->nodes && i < d->cfg.max_nodes; i++)
        free(d->nodes[i]);
    free(d->nodes);
    free(d->tab);
    free(d);
}

/* ---- the key index --------------------------------------------------------------- */

static uint64_t home(const struct directory *d, const umbp_key_t *k)
{
    return umbp_key_hash(k) & (d->cap - 1);
}

static struct dir_entry *find(const struct directory *d, const umbp_key_t *k)
{
    for (uint64_t i = home(d, k);; i = (i + 1) & (d->cap - 1)) {
        struct dir_entry *e = &d->tab[i];
        if (!e->nrep)
            return NULL;
        if (!memcmp(e->key.bytes, k->bytes, UMBP_KEY_SIZE))
            return e;
    }
}

static struct dir_entry *slot_for(struct directory *d, const umbp_key_t *k)
{
    uint64_t i = home(d, k);
    while (d->tab[i].nrep)
        i = (i + 1) & (d->cap - 1);
    return &d->tab[i];
}

static int grow(struct directory *d)
{
    uint64_t ncap = d->cap * 2;
    struct dir_entry *old = d->tab, *nt = calloc(ncap, sizeof(*nt));
    if (!nt)
        return -ENOMEM;
    uint64_t ocap = d->cap;
    d->tab = nt;
    d->cap = ncap;
    for (uint64_t i = 0; i < ocap; i++)
        if (old[i].nrep)
            *slot_for(d, &old[i].key) = old[i];
    free(old);
    return 0;
}

/* Deletes the entry at i by backward shift: every later entry of the
 * cluster that may live at i moves there. */
static void erase_at(struct directory *d, uint64_t i)
{
    uint64_t mask = d->cap - 1;
    for (uint64_t j = (i + 1) & mask;; j = (j + 1) & mask) {
        struct dir_entry *e = &d->tab[j];
        if (!e->nrep)
            break;
        uint64_t h = home(d, &e->key);
        /* e may move to i when its home is not in the cyclic range (i, j] */
        bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            d->tab[i] = *e;
            i = j;
        }
    }
    memset(&d->tab[i], 0, sizeof(d->tab[i]));
    d->count--;
}

/* Removes slot s from e (at index i); erases e when no owner is left.
 * true if s was an owner. */
static bool drop_owner(struct directory *d, struct dir_entry *e, uint16_t s)
{
    for (uint8_t r = 0; r < e->nrep; r++)
        if (e->slot[r] == s) {
            e->slot[r] = e->slot[--e->nrep];
            if (!e->nrep) {
                e->nrep = 1; /* erase_at reads it as occupied until it moves */
                erase_at(d, (uint64_t)(e - d->tab));
            }
            return true;
        }
    return false;
}

static void stored(struct directory *d, struct dir_node *n, const umbp_key_t *k, uint64_t size)
{
    struct dir_entry *e = find(d, k);
    if (e) {
        for (uint8_t r = 0; r < e->nrep; r++)
            if (e->slot[r] == n->slot)
                return;
        if (e->size != size) {
            d->st.size_mismatch++;
            return;
        }
        if (e->nrep >= d->cfg.max_replicas) {
            d->st.dropped_replicas++;
            return;
        }
        e->slot[e->nrep++] = n->slot;
        n->keys++;
        return;
    }
    if (d->count >= d->cfg.max_keys) {
        d->st.dropped_full++;
        return;
    }
    if ((d->count + 1) * 4 > d->cap * 3 && (d->cap >= d->cap_max || grow(d) < 0)) {
        d->st.dropped_full++;
        return;
    }
    e = slot_for(d, k);
    e->key = *k;
    e->size = size;
    e->slot[0] = n->slot;
    e->nrep = 1;
    d->count++;
    n->keys++;
}

static void removed(struct directory *d, struct dir_node *n, const umbp_key_t *k)
{
    struct dir_entry *e = find(d, k);
    if (e && drop_owner(d, e, n->slot))
        n->keys--;
}

/* Every key of n leaves the index. */
static void drop_keys(struct directory *d, struct dir_node *n)
{
    if (!n->keys)
        return;
    for (uint64_t i = 0; i < d->cap && n->keys;) {
        struct dir_entry *e = &d->tab[i];
        uint8_t before = e->nrep;
        if (before && drop_owner(d, e, n->slot)) {
            n->keys--;
            d->st.keys_dropped++;
            if (before == 1)
                continue; /* erased: a later entry may have moved to i */
        }
        i++;
    }
    n->keys = 0;
}

/* ---- nodes ------------------------------------------------------------------------- */

static struct dir_node *find_node(const struct directory *d, const struct proto_register *r)
{
    for (uint32_t i = 0; i < d->cfg.max_nodes; i++) {
        struct dir_node *n = d->nodes[i];
        if (n && n->reg.pid == r->pid && n->reg.start_ns == r->start_ns &&
            !strcmp(n->reg.host, r->host))
            return n;
    }
    return NULL;
}

static void forget(struct directory *d, struct dir_node *n)
{
    if (d->cfg.on_gone)
        d->cfg.on_gone(d->cfg.ctx, n);
    drop_keys(d, n);
    d->nodes[n->slot] = NULL;
    d->nnodes--;
    d->epoch++;
    free(n);
}

static void ack_of(const struct dir_node *n, struct proto_ack *ack)
{
    *ack = (struct proto_ack){.seq = n->seq, .node_ref = n->ref,
                              .action = n->need_resync ? PROTO_ACK_RESYNC : PROTO_ACK_OK};
}

static void alive(struct directory *d, struct dir_node *n, uint64_t now)
{
    n->last_hb_ns = now;
    if (n->state != DIR_ALIVE) {
        n->state = DIR_ALIVE;
        d->epoch++;
    }
}

int dir_register(struct directory *d, const struct proto_register *r, uint64_t now,
                 struct dir_node **out, struct proto_ack *ack)
{
    struct dir_node *n = find_node(d, r);
    d->st.registers++;
    if (!n) {
        if (d->nnodes >= d->cfg.max_nodes)
            return -ENOSPC;
        uint32_t s = 0;
        while (d->nodes[s])
            s++;
        if (!(n = calloc(1, sizeof(*n))))
            return -ENOMEM;
        n->ref = ++d->next_ref;
        n->slot = (uint16_t)s;
        n->state = DIR_ALIVE;
        /* events we never saw: only a resync tells what it holds */
        n->need_resync = r->seq != 0;
        d->nodes[s] = n;
        d->nnodes++;
    } else if (r->seq != n->seq) {
        n->need_resync = true;
    }
    n->resyncing = false; /* a resync under way is started again */
    n->reg = *r;
    d->epoch++; /* a new node, or a known one's address or capacity may have changed */
    alive(d, n, now);
    ack_of(n, ack);
    *out = n;
    return 0;
}

int dir_heartbeat(struct directory *d, struct dir_node *n, const struct proto_frame *f,
                  uint64_t now, struct proto_ack *ack, char *err, size_t errlen)
{
    struct proto_node_event st, e;
    for (uint32_t i = 0; i < f->n; i++) /* all valid before any is applied */
        if (proto_get_node_event(f, i, i ? &e : &st, err, errlen) < 0)
            return -EPROTO;
    if (!n) {
        *ack = (struct proto_ack){.action = PROTO_ACK_REGISTER};
        return 0;
    }
    if (n->resyncing) {
        snprintf(err, errlen, "HEARTBEAT: between RESYNC FIRST and LAST; a node ends its "
                 "resync before heartbeating");
        return -EPROTO;
    }
    d->st.heartbeats++;
    alive(d, n, now);
    n->reg.used_bytes = st.size;
    for (uint32_t i = 1; i < f->n && !n->need_resync; i++) {
        proto_get_node_event(f, i, &e, NULL, 0);
        if (e.seq <= n->seq)
            continue; /* a repeat (resent after a lost acknowledgement) */
        if (e.seq != n->seq + 1) {
            n->need_resync = true;
            d->st.gaps++;
            break;
        }
        if (e.kind == PROTO_NODE_STORED)
            stored(d, n, &e.key, e.size);
        else
            removed(d, n, &e.key);
        n->seq = e.seq;
        d->st.events++;
    }
    if (!n->need_resync && st.seq != n->seq) {
        n->need_resync = true; /* events we never got, or a node that went back */
        d->st.gaps++;
    }
    ack_of(n, ack);
    return 0;
}

int dir_resync(struct directory *d, struct dir_node *n, const struct proto_frame *f,
               uint64_t now, struct proto_ack *ack, char *err, size_t errlen)
{
    struct proto_node_event st, e;
    for (uint32_t i = 0; i < f->n; i++)
        if (proto_get_node_event(f, i, i ? &e : &st, err, errlen) < 0)
            return -EPROTO;
    if (!n) {
        *ack = (struct proto_ack){.action = PROTO_ACK_REGISTER};
        return 0;
    }
    if (!(f->arg & PROTO_RESYNC_FIRST) && !n->resyncing) {
        snprintf(err, errlen, "RESYNC.arg: a resync starts with PROTO_RESYNC_FIRST");
        return -EPROTO;
    }
    alive(d, n, now);
    n->reg.used_bytes = st.size;
    if (f->arg & PROTO_RESYNC_FIRST) {
        drop_keys(d, n);
        n->resyncing = true;
        n->seq = st.seq;
    }
    for (uint32_t i = 1; i < f->n; i++) {
        proto_get_node_event(f, i, &e, NULL, 0);
        stored(d, n, &e.key, e.size);
    }
    d->st.resync_keys += f->n - 1;
    if (f->arg & PROTO_RESYNC_LAST) {
        n->resyncing = false;
        n->need_resync = false;
        d->st.resyncs++;
    }
    ack_of(n, ack);
    if (n->resyncing)
        ack->action = PROTO_ACK_OK; /* go on */
    return 0;
}

void dir_locate(struct directory *d, const umbp_key_t *key, struct proto_location *out)
{
    memset(out, 0, sizeof(*out));
    d->st.locate_keys++;
    struct dir_entry *e = find(d, key);
    if (!e)
        return;
    for (uint8_t r = 0; r < e->nrep; r++) {
        struct dir_node *n = d->nodes[e->slot[r]];
        if (n->state == DIR_ALIVE && !n->resyncing)
            out->refs[out->nrep++] = n->ref;
    }
    if (out->nrep) {
        out->size = e->size;
        d->st.locate_hits++;
    }
}

int dir_report(struct directory *d, uint32_t ref)
{
    for (uint32_t i = 0; i < d->cfg.max_nodes; i++) {
        struct dir_node *n = d->nodes[i];
        if (!n || n->ref != ref)
            continue;
        if (n->state != DIR_ALIVE)
            return 0;
        n->state = DIR_SUSPECT;
        d->st.suspected++;
        d->st.reported++;
        d->epoch++;
        if (d->cfg.on_suspect)
            d->cfg.on_suspect(d->cfg.ctx, n);
        return 1;
    }
    return 0;
}

unsigned dir_sweep(struct directory *d, uint64_t now, uint64_t suspect_ns, uint64_t dead_ns)
{
    unsigned changed = 0;
    for (uint32_t i = 0; i < d->cfg.max_nodes; i++) {
        struct dir_node *n = d->nodes[i];
        if (!n)
            continue;
        uint64_t age = now > n->last_hb_ns ? now - n->last_hb_ns : 0;
        if (age >= dead_ns) {
            d->st.dead++;
            forget(d, n);
            changed++;
        } else if (age >= suspect_ns && n->state == DIR_ALIVE) {
            n->state = DIR_SUSPECT;
            d->st.suspected++;
            d->epoch++;
            if (d->cfg.on_suspect)
                d->cfg.on_suspect(d->cfg.ctx, n);
            changed++;
        }
    }
    return changed;
}

uint32_t dir_epoch(const struct directory *d) { return d->epoch; }
size_t dir_node_count(const struct directory *d) { return d->nnodes; }
uint64_t dir_key_count(const struct directory *d) { return d->count; }
const struct dir_stats *dir_stats(const struct directory *d) { return &d->st; }

struct dir_node *dir_node_at(const struct directory *d, uint32_t i)
{
    return i < d->cfg.max_nodes ? d->nodes[i] : NULL;
}

size_t dir_nodes(const struct directory *d, uint64_t now, struct proto_node_info *out,
                 size_t max)
{
    size_t k = 0;
    for (uint32_t i = 0; i < d->cfg.max_nodes && k < max; i++) {
        const struct dir_node *n = d->nodes[i];
        if (!n)
            continue;
        struct proto_node_info *o = &out[k++];
        memset(o, 0, sizeof(*o));
        o->ref = n->ref;
        o->state = n->state;
        memcpy(o->host, n->reg.host, sizeof(o->host));
        o->pid = n->reg.pid;
        o->addr_len = n->reg.addr_len;
        memcpy(o->addr, n->reg.addr, n->reg.addr_len);
        o->start_ns = n->reg.start_ns;
        o->capacity_bytes = n->reg.capacity_bytes;
        o->used_bytes = n->reg.used_bytes;
        o->seq = n->seq;
        o->keys = n->keys;
        o->heartbeat_age_ms = now > n->last_hb_ns ? (now - n->last_hb_ns) / 1000000 : 0;
    }
    return k;
}
