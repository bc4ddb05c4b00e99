/*
 * lease.h - the dram tier's read leases.
 *
 * A lease is a slot in a growable table; its token is (generation << 32 |
 * slot), so a token of a slot that was freed and reused is recognised as
 * stale.  An ACTIVE lease pins its object (the tier counts it in
 * obj->readers).  When its deadline passes it becomes EXPIRED: it no longer
 * pins anything, but remembers the object's key and oid for max(TTL, 60 s)
 * so a late release can still say whether the bytes it read were valid
 * (after that the release reports the lease unknown, i.e. stale).
 * Single-threaded: the tier's loop thread owns it.
 */
#ifndef UMBP_DRAM_LEASE_H
#define UMBP_DRAM_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "index.h"

enum dram_lease_state {
    DRAM_LEASE_NONE,    /* unknown, released or forgotten token */
    DRAM_LEASE_ACTIVE,
    DRAM_LEASE_EXPIRED,
};

/* What a lease was on, as returned by dram_lease_end. */
struct dram_lease_info {
    enum dram_lease_state state;
    struct dram_obj *obj; /* ACTIVE only: the pinned object */
    umbp_key_t key;       /* ACTIVE and EXPIRED */
    uint64_t oid;
};

struct dram_leases;

/* A table with room for `expect` leases at once before it grows (0: it
 * grows from 64 at the first lease); its slots are written, so their pages
 * are in. */
int dram_leases_create(struct dram_leases **out, uint32_t expect);
void dram_leases_destroy(struct dram_leases *l);

/* Opens an ACTIVE lease on obj ending at deadline_ns; its expired record
 * is kept until deadline_ns + max(ttl_ns, 60 s).  0 and *token, -ENOMEM. */
int dram_lease_open(struct dram_leases *l, struct dram_obj *obj,
                    uint64_t deadline_ns, uint64_t ttl_ns, uint64_t *token);
/* Ends the lease of token and frees its slot; says what it was. */
struct dram_lease_info dram_lease_end(struct dram_leases *l, uint64_t token);
/* Expires the earliest ACTIVE lease whose deadline is <= now_ns and returns
 * its object (the caller drops the reader), or NULL when none is due. */
struct dram_obj *dram_lease_expire_next(struct dram_leases *l, uint64_t now_ns);
/* Frees expired records kept past their retention time. */
void dram_lease_forget(struct dram_leases *l, uint64_t now_ns);

size_t dram_leases_active(const struct dram_leases *l);
size_t dram_leases_expired(const struct dram_leases *l);
/* Slots of the table, used or not (it doubles when all are used). */
size_t dram_leases_capacity(const struct dram_leases *l);

#endif /* UMBP_DRAM_LEASE_H */
