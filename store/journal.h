/*
 * journal.h - the persistent half of a named pool: a table of object
 * records in /dev/shm/<dram_shm_name>.meta, so that a server that restarts
 * (crash, upgrade, SIGKILL) adopts the pool and rebuilds its index.
 *
 * One 64-byte slot per object.  A slot's `state` is its commit point: the
 * owner writes key, offset, size and oid first, then stores the state with
 * release order, so a crash between the two leaves the old state, never a
 * half-written record that claims to be an object.  States:
 *   FREE       nothing;
 *   PENDING    reserved, being written by a client: its region may still be
 *              written by a client of the dead server, so an adopter keeps
 *              it out of use until the record's hold time (the writer's
 *              declared deadline: by then it has provably stopped), or for
 *              a grace period when the record has none, then frees it;
 *   PUBLISHED  every byte written and published: adopted as an object.
 * The store sets PENDING at reserve, PUBLISHED at publish (after the client
 * copied every byte) and FREE when the object is freed.  The header carries
 * the pool's size and id, so a pool of another size or a table of another
 * layout is never adopted.
 *
 * Namespaces.  A record's oid field carries, in its top 16 bits, the
 * journal's number of the object's namespace (0: the default; tables of
 * version 1 have 0 there), and the oid itself in the low 48 bits.  The
 * journal's numbers are the pool's, not a server's: /dev/shm/<name>.ns
 * names them (a 64-byte header with the pool's id, then entry i, 64 bytes,
 * at 64 * i: a NUL-terminated name, all zero when unused), and a number
 * once named keeps its name for the pool's life, so records are never
 * rewritten.  A name is written before any record carries its number.
 * What cannot be read there (a missing or foreign file, a bad entry)
 * leaves the number unnamed: its objects count in the default namespace.
 *
 * Hold times are CLOCK_MONOTONIC seconds, rounded up: the clock every
 * process of one boot shares, and /dev/shm does not outlive a boot.  A
 * reservation that found no free slot has no record, so the header keeps
 * the latest hold time of any such one: until then an adopter may not know
 * every region a writer may still write, and hands none out.
 *
 * Single-threaded: the store's owner (the server's loop thread).
 */
#ifndef UMBP_DRAM_JOURNAL_H
#define UMBP_DRAM_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/umbp.h"

enum dram_journal_state { DRAM_JSLOT_FREE = 0, DRAM_JSLOT_PENDING = 1, DRAM_JSLOT_PUBLISHED = 2 };

#define DRAM_JOURNAL_NONE UINT32_MAX /* an object without a slot */
#define DRAM_JOURNAL_OID_MAX ((1ull << 48) - 1) /* oids recorded: the low 48 bits */
#define DRAM_JOURNAL_MAX_NS 1024u     /* namespace numbers 1 .. 1023 over a pool's life */
#define DRAM_JOURNAL_NS_BYTES 64u     /* a name entry of <name>.ns, its NUL included */

struct dram_journal;

/* One record found when adopting. */
struct dram_journal_rec {
    uint32_t slot;
    enum dram_journal_state state;
    uint32_t hold_s;              /* PENDING: writer done by then; 0 unknown */
    uint32_t ns;                  /* the journal's namespace number, 0: default */
    umbp_key_t key;
    uint64_t off, size, oid;
};

/* Opens (adopting when it exists with the same pool_size and nslots and
 * describes this pool file) or creates /dev/shm/<name>.meta.  The caller
 * holds the pool's owner lock.  pool_new: the pool file was created just
 * now; pool_ino: its inode.  A table whose records describe another file
 * (pool_new, or another inode) is emptied and takes a new pool id, so that
 * clients still mapping the old file remap; a table its creator left
 * unsized or without a header (killed while creating it) is made anew.
 * *adopted: the records are this pool's; *pool_id is the id recorded
 * (adopted) or a new random one.  Negative with err naming the file and
 * the fix. */
int dram_journal_open(const char *name, uint64_t pool_size, uint32_t nslots, bool persistent,
                      bool pool_new, uint64_t pool_ino, struct dram_journal **out, bool *adopted,
                      uint64_t *pool_id, char *err, size_t errlen);
void dram_journal_close(struct dram_journal *j);

/* Adopting: every PENDING and PUBLISHED record, in slot order; the caller
 * frees *recs.  Also resets the free list to the FREE slots. */
int dram_journal_scan(struct dram_journal *j, struct dram_journal_rec **recs, size_t *n);

/* A free slot for a new reservation, or DRAM_JOURNAL_NONE when all are in
 * use (the object is then not kept across restarts). */
uint32_t dram_journal_claim(struct dram_journal *j);
/* oid <= DRAM_JOURNAL_OID_MAX; ns: a number dram_journal_ns_add gave, or 0. */
void dram_journal_set_pending(struct dram_journal *j, uint32_t slot, const umbp_key_t *key,
                              uint64_t off, uint64_t size, uint64_t oid, uint32_t hold_s,
                              uint32_t ns);
/* A PENDING record's hold time (an adopter's grace for a record with none). */
void dram_journal_set_hold(struct dram_journal *j, uint32_t slot, uint32_t hold_s);
/* A reservation without a record whose writer stops by hold_s; and the
 * latest such hold time (0: none). */
void dram_journal_note_unrecorded(struct dram_journal *j, uint32_t hold_s);
uint32_t dram_journal_unrecorded_hold(const struct dram_journal *j);
/* Every reservation without a record has ended: the header's hold goes back
 * to floor_s (0: none). */
void dram_journal_clear_unrecorded(struct dram_journal *j, uint32_t floor_s);
/* ns of CLOCK_MONOTONIC as a hold time: seconds, rounded up, at least 1. */
uint32_t dram_journal_hold_s(uint64_t mono_ns);
void dram_journal_set_published(struct dram_journal *j, uint32_t slot);
/* Marks the slot FREE and returns it to the free list. */
void dram_journal_drop(struct dram_journal *j, uint32_t slot);
uint32_t dram_journal_slots(const struct dram_journal *j);

/* The name of the journal's namespace ns (read from <name>.ns when the
 * table was adopted, or added since), or NULL when it has none. */
const char *dram_journal_ns_name(const struct dram_journal *j, uint32_t ns);
/* The journal's number of a namespace name (not ""): the one it has, or a
 * new one written to <name>.ns.  0 and *ns; -ENOSPC when every number is
 * taken, or -errno when the file cannot be written (logged once; the
 * caller records such a namespace's objects as the default one's). */
int dram_journal_ns_add(struct dram_journal *j, const char *name, uint32_t *ns);
/* "/dev/shm/<name>.ns", for messages. */
const char *dram_journal_ns_path(const struct dram_journal *j);

/* Decodes the bytes of a <name>.ns file written for the pool pool_id:
 * names[i] (DRAM_JOURNAL_NS_BYTES each, i < max) gets entry i, "" where
 * there is none or it cannot be read.  Returns the entries that could not
 * be read (not NUL-terminated, control characters, a torn last one), or
 * -1 when the header is not one of this pool's table (nothing is named).
 * Never reads past len. */
int dram_journal_ns_parse(const uint8_t *buf, size_t len, uint64_t pool_id,
                          char (*names)[DRAM_JOURNAL_NS_BYTES], uint32_t max);

#endif
