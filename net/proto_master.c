/*
 * proto_master.c - the records of umbp-master's frames and of the TCP
 * handshake (proto.h: REGISTER .. NODES_R, AUTH), beside proto.c's.  The
 * frame table, the parser and the builder are proto.c's; this file reaches
 * records only through proto_record_at / proto_record_slot (proto_rec.h),
 * so a record of the wrong kind or past n is refused there.
 *
 * Every accessor names the bad field in err; every put refuses what the
 * accessor would refuse, so a frame built here parses and decoding then
 * re-encoding gives back the same bytes (fuzz_proto_master checks both).
 *
 * Threads: no state; any thread.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "proto.h"
#include "proto_rec.h"
#include "seterr.h"

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* ---- AUTH ---------------------------------------------------------------------------- */

int proto_get_auth(const struct proto_frame *f, struct proto_auth *out, char *err,
                   size_t errlen)
{
    const uint8_t *p;
    if (proto_record_err(f, 0, REC_AUTH, &p, "AUTH", err, errlen))
        return -EINVAL;
    memcpy(out->nonce, p, 32);
    memcpy(out->mac, p + 32, 32);
    return 0;
}

int proto_put_auth(struct proto_buf *b, const struct proto_auth *a)
{
    uint8_t *p;
    int rc = proto_record_slot(b, REC_AUTH, &p);
    if (rc)
        return rc;
    memcpy(p, a->nonce, 32);
    memcpy(p + 32, a->mac, 32);
    return 0;
}

/* ---- REGISTER ------------------------------------------------------------------------ */

/* What both sides refuse; the host's padding is the decoder's alone (the
 * encoder writes zeros after the NUL whatever the caller's array holds). */
static int check_register_values(const struct proto_register *r, char *err, size_t errlen)
{
    if (strnlen(r->host, PROTO_NAME_MAX) == PROTO_NAME_MAX) {
        net_seterr(err, errlen, "REGISTER.host: not NUL-terminated within the field (%d bytes)",
                   PROTO_NAME_MAX);
        return -EINVAL;
    }
    if (!r->host[0]) {
        net_seterr(err, errlen, "REGISTER.host: empty; a node names its host");
        return -EINVAL;
    }
    if (!r->pid) {
        net_seterr(err, errlen, "REGISTER.pid: 0; a node is a process");
        return -EINVAL;
    }
    if (!r->start_ns) {
        net_seterr(err, errlen, "REGISTER.start_ns: 0; a node gives its start time");
        return -EINVAL;
    }
    if (!r->capacity_bytes) {
        net_seterr(err, errlen, "REGISTER.capacity_bytes: 0");
        return -EINVAL;
    }
    if (r->addr_len > PROTO_NODE_ADDR_MAX) {
        net_seterr(err, errlen, "REGISTER.addr_len: %u bytes exceed %d", r->addr_len,
                   PROTO_NODE_ADDR_MAX);
        return -EINVAL;
    }
    return 0;
}

int proto_get_register(const struct proto_frame *f, struct proto_register *out, char *err,
                       size_t errlen)
{
    struct proto_register r;
    const uint8_t *p;
    if (proto_record_err(f, 0, REC_REGISTER, &p, "REGISTER", err, errlen))
        return -EINVAL;
    struct rd d = {p};
    rd_bytes(&d, r.host, PROTO_NAME_MAX);
    r.pid = rd_u32(&d);
    r.addr_len = rd_u32(&d);
    r.start_ns = rd_u64(&d);
    r.capacity_bytes = rd_u64(&d);
    r.used_bytes = rd_u64(&d);
    r.seq = rd_u64(&d);
    rd_bytes(&d, r.addr, PROTO_NODE_ADDR_MAX);
    if (check_register_values(&r, err, errlen))
        return -EINVAL;
    const char *why = proto_string_problem(r.host, PROTO_NAME_MAX);
    if (why) {
        net_seterr(err, errlen, "REGISTER.host: %s", why);
        return -EINVAL;
    }
    if (!all_zero(r.addr + r.addr_len, PROTO_NODE_ADDR_MAX - r.addr_len)) {
        net_seterr(err, errlen, "REGISTER.addr: nonzero bytes after addr_len (%u)", r.addr_len);
        return -EINVAL;
    }
    *out = r;
    return 0;
}

int proto_put_register(struct proto_buf *b, const struct proto_register *r)
{
    uint8_t *p;
    if (check_register_values(r, NULL, 0))
        return proto_put_fail(b, -EINVAL);
    int rc = proto_record_slot(b, REC_REGISTER, &p);
    if (rc)
        return rc;
    struct wr w = {p};
    wr_string(&w, r->host, PROTO_NAME_MAX);
    wr_u32(&w, r->pid);
    wr_u32(&w, r->addr_len);
    wr_u64(&w, r->start_ns);
    wr_u64(&w, r->capacity_bytes);
    wr_u64(&w, r->used_bytes);
    wr_u64(&w, r->seq);
    memcpy(w.p, r->addr, r->addr_len);
    memset(w.p + r->addr_len, 0, PROTO_NODE_ADDR_MAX - r->addr_len);
    return 0;
}

/* ---- HEARTBEAT and RESYNC records -------------------------------------------------- */

static int check_node_event(const char *t, const struct proto_node_event *e, char *err,
                            size_t errlen)
{
    if (e->kind > PROTO_NODE_REMOVED) {
        net_seterr(err, errlen, "%s.kind: unknown kind %u", t, e->kind);
        return -EINVAL;
    }
    if (e->pad) {
        net_seterr(err, errlen, "%s.pad: must be 0, got %u", t, e->pad);
        return -EINVAL;
    }
    if (e->kind == PROTO_NODE_STATUS && !all_zero(e->key.bytes, UMBP_KEY_SIZE)) {
        net_seterr(err, errlen, "%s.key: a STATUS record's key is zero", t);
        return -EINVAL;
    }
    if (e->kind == PROTO_NODE_STORED && !e->size) {
        net_seterr(err, errlen, "%s.size: 0 for a STORED object", t);
        return -EINVAL;
    }
    if (e->kind == PROTO_NODE_REMOVED && e->size) {
        net_seterr(err, errlen, "%s.size: %llu for a REMOVED key; must be 0", t,
                   (unsigned long long)e->size);
        return -EINVAL;
    }
    return 0;
}

/* The record's place in its frame. */
static int check_place(const struct proto_frame *f, uint32_t i,
                       const struct proto_node_event *e, char *err, size_t errlen)
{
    const char *t = proto_type_name(f->type);
    if (i == 0 && e->kind != PROTO_NODE_STATUS) {
        net_seterr(err, errlen, "%s.kind: record 0 is STATUS, got kind %u", t, e->kind);
        return -EINVAL;
    }
    if (i > 0 && e->kind == PROTO_NODE_STATUS) {
        net_seterr(err, errlen, "%s.kind: record %u is STATUS; only record 0 is", t, i);
        return -EINVAL;
    }
    if (i > 0 && f->type == PROTO_RESYNC && (e->kind != PROTO_NODE_STORED || e->seq)) {
        net_seterr(err, errlen, "RESYNC.kind: record %u must be STORED with seq 0 (kind %u, "
                   "seq %llu)", i, e->kind, (unsigned long long)e->seq);
        return -EINVAL;
    }
    if (i > 0 && f->type == PROTO_HEARTBEAT && !e->seq) {
        net_seterr(err, errlen, "HEARTBEAT.seq: record %u is an event with seq 0", i);
        return -EINVAL;
    }
    return 0;
}

int proto_get_node_event(const struct proto_frame *f, uint32_t i, struct proto_node_event *out,
                         char *err, size_t errlen)
{
    struct proto_node_event e;
    const uint8_t *p;
    if (proto_record_err(f, i, REC_NODE_EVENT, &p, f ? proto_type_name(f->type) : "HEARTBEAT",
                         err, errlen))
        return -EINVAL;
    struct rd d = {p};
    e.seq = rd_u64(&d);
    e.kind = rd_u32(&d);
    e.pad = rd_u32(&d);
    rd_bytes(&d, e.key.bytes, UMBP_KEY_SIZE);
    e.size = rd_u64(&d);
    if (check_node_event(proto_type_name(f->type), &e, err, errlen) || check_place(f, i, &e, err, errlen))
        return -EINVAL;
    *out = e;
    return 0;
}

int proto_put_node_event(struct proto_buf *b, const struct proto_node_event *e)
{
    uint8_t *p;
    struct proto_node_event c = *e;
    c.pad = 0;
    if (check_node_event("", &c, NULL, 0))
        return proto_put_fail(b, -EINVAL);
    int rc = proto_record_slot(b, REC_NODE_EVENT, &p);
    if (rc)
        return rc;
    struct wr w = {p};
    wr_u64(&w, c.seq);
    wr_u32(&w, c.kind);
    wr_u32(&w, 0);
    memcpy(w.p, c.key.bytes, UMBP_KEY_SIZE);
    w.p += UMBP_KEY_SIZE;
    wr_u64(&w, c.size);
    return 0;
}

/* ---- acknowledgements -------------------------------------------------------------- */

int proto_get_ack(const struct proto_frame *f, struct proto_ack *out, char *err, size_t errlen)
{
    const uint8_t *p;
    if (proto_record_err(f, 0, REC_ACK, &p, "ACK", err, errlen))
        return -EINVAL;
    struct rd d = {p};
    struct proto_ack a;
    a.seq = rd_u64(&d);
    a.action = rd_u32(&d);
    a.node_ref = rd_u32(&d);
    if (a.action > PROTO_ACK_REGISTER) {
        net_seterr(err, errlen, "%s.action: unknown action %u", proto_type_name(f->type),
                   a.action);
        return -EINVAL;
    }
    if ((a.action == PROTO_ACK_REGISTER) != (a.node_ref == 0)) {
        net_seterr(err, errlen, "%s.node_ref: %u with action %u (0 exactly with REGISTER)",
                   proto_type_name(f->type), a.node_ref, a.action);
        return -EINVAL;
    }
    *out = a;
    return 0;
}

int proto_put_ack(struct proto_buf *b, const struct proto_ack *a)
{
    uint8_t *p;
    if (a->action > PROTO_ACK_REGISTER || (a->action == PROTO_ACK_REGISTER) != (a->node_ref == 0))
        return proto_put_fail(b, -EINVAL);
    int rc = proto_record_slot(b, REC_ACK, &p);
    if (rc)
        return rc;
    struct wr w = {p};
    wr_u64(&w, a->seq);
    wr_u32(&w, a->action);
    wr_u32(&w, a->node_ref);
    return 0;
}

/* ---- LOCATE_R ------------------------------------------------------------------------ */

static int check_location(const struct proto_location *l, char *err, size_t errlen)
{
    if (l->nrep > PROTO_MAX_REPLICAS) {
        net_seterr(err, errlen, "LOCATE_R.nrep: %u exceeds %d", l->nrep, PROTO_MAX_REPLICAS);
        return -EINVAL;
    }
    if (!l->nrep && l->size) {
        net_seterr(err, errlen, "LOCATE_R.size: %llu for a miss; must be 0",
                   (unsigned long long)l->size);
        return -EINVAL;
    }
    if (l->nrep && !l->size) {
        net_seterr(err, errlen, "LOCATE_R.size: 0 for a key with owners");
        return -EINVAL;
    }
    for (uint32_t r = 0; r < PROTO_MAX_REPLICAS; r++)
        if ((r < l->nrep) != (l->refs[r] != 0)) {
            net_seterr(err, errlen, "LOCATE_R.refs: ref %u is %u with nrep %u (nonzero "
                       "exactly below nrep)", r, l->refs[r], l->nrep);
            return -EINVAL;
        }
    return 0;
}

int proto_get_location(const struct proto_frame *f, uint32_t i, struct proto_location *out,
                       char *err, size_t errlen)
{
    const uint8_t *p;
    struct proto_location l;
    if (proto_record_err(f, i, REC_LOCATION, &p, "LOCATE_R", err, errlen))
        return -EINVAL;
    struct rd d = {p};
    l.nrep = rd_u32(&d);
    l.pad = rd_u32(&d);
    l.size = rd_u64(&d);
    for (int r = 0; r < PROTO_MAX_REPLICAS; r++)
        l.refs[r] = rd_u32(&d);
    if (l.pad) {
        net_seterr(err, errlen, "LOCATE_R.pad: must be 0, got %u", l.pad);
        return -EINVAL;
    }
    if (check_location(&l, err, errlen))
        return -EINVAL;
    *out = l;
    return 0;
}

int proto_put_location(struct proto_buf *b, const struct proto_location *l)
{
    uint8_t *p;
    if (check_location(l, NULL, 0))
        return proto_put_fail(b, -EINVAL);
    int rc = proto_record_slot(b, REC_LOCATION, &p);
    if (rc)
        return rc;
    struct wr w = {p};
    wr_u32(&w, l->nrep);
    wr_u32(&w, 0);
    wr_u64(&w, l->size);
    for (int r = 0; r < PROTO_MAX_REPLICAS; r++)
        wr_u32(&w, l->refs[r]);
    return 0;
}

/* ---- NODES_R ------------------------------------------------------------------------- */

static int check_node_info(const struct proto_node_info *n, char *err, size_t errlen)
{
    if (!n->ref) {
        net_seterr(err, errlen, "NODES_R.ref: 0");
        return -EINVAL;
    }
    if (n->state > PROTO_NODE_SUSPECT) {
        net_seterr(err, errlen, "NODES_R.state: unknown state %u", n->state);
        return -EINVAL;
    }
    if (strnlen(n->host, PROTO_NAME_MAX) == PROTO_NAME_MAX) {
        net_seterr(err, errlen, "NODES_R.host: not NUL-terminated within the field");
        return -EINVAL;
    }
    if (n->addr_len > PROTO_NODE_ADDR_MAX) {
        net_seterr(err, errlen, "NODES_R.addr_len: %u bytes exceed %d", n->addr_len,
                   PROTO_NODE_ADDR_MAX);
        return -EINVAL;
    }
    return 0;
}

int proto_get_node_info(const struct proto_frame *f, uint32_t i, struct proto_node_info *out,
                        char *err, size_t errlen)
{
    const uint8_t *p;
    struct proto_node_info n;
    if (proto_record_err(f, i, REC_NODE_INFO, &p, "NODES_R", err, errlen))
        return -EINVAL;
    struct rd d = {p};
    n.ref = rd_u32(&d);
    n.state = rd_u32(&d);
    rd_bytes(&d, n.host, PROTO_NAME_MAX);
    n.pid = rd_u32(&d);
    n.addr_len = rd_u32(&d);
    n.start_ns = rd_u64(&d);
    n.capacity_bytes = rd_u64(&d);
    n.used_bytes = rd_u64(&d);
    n.seq = rd_u64(&d);
    n.keys = rd_u64(&d);
    n.heartbeat_age_ms = rd_u64(&d);
    rd_bytes(&d, n.addr, PROTO_NODE_ADDR_MAX);
    if (check_node_info(&n, err, errlen))
        return -EINVAL;
    const char *why = proto_string_problem(n.host, PROTO_NAME_MAX);
    if (why) {
        net_seterr(err, errlen, "NODES_R.host: %s", why);
        return -EINVAL;
    }
    if (!all_zero(n.addr + n.addr_len, PROTO_NODE_ADDR_MAX - n.addr_len)) {
        net_seterr(err, errlen, "NODES_R.addr: nonzero bytes after addr_len (%u)", n.addr_len);
        return -EINVAL;
    }
    *out = n;
    return 0;
}

int proto_put_node_info(struct proto_buf *b, const struct proto_node_info *n)
{
    uint8_t *p;
    if (check_node_info(n, NULL, 0))
        return proto_put_fail(b, -EINVAL);
    int rc = proto_record_slot(b, REC_NODE_INFO, &p);
    if (rc)
        return rc;
    struct wr w = {p};
    wr_u32(&w, n->ref);
    wr_u32(&w, n->state);
    wr_string(&w, n->host, PROTO_NAME_MAX);
    wr_u32(&w, n->pid);
    wr_u32(&w, n->addr_len);
    wr_u64(&w, n->start_ns);
    wr_u64(&w, n->capacity_bytes);
    wr_u64(&w, n->used_bytes);
    wr_u64(&w, n->seq);
    wr_u64(&w, n->keys);
    wr_u64(&w, n->heartbeat_age_ms);
    memcpy(w.p, n->addr, n->addr_len);
    memset(w.p + n->addr_len, 0, PROTO_NODE_ADDR_MAX - n->addr_len);
    return 0;
}
