/*
 * directory.h - umbp-master's soft state, sans I/O: which nodes exist and
 * which of them hold each key.  The master (master.c) feeds it decoded
 * frames and the time; tests and the fuzz target drive it directly.
 *
 * What it knows.  Per node: its id (host + pid + start time: a restarted
 * engine is a new node), its worker address (opaque bytes), capacity and
 * use, its last heartbeat, the last event seq applied, its state (alive,
 * suspect) and the number of keys it holds here.  Per key (32 bytes): the
 * object's size and up to max_replicas nodes holding it.  Nodes own
 * allocation, eviction and leases; the directory never decides bytes, so
 * whatever it gets wrong (a stale entry, a lost event, a restart) costs a
 * miss or a failed fetch that the reader retries elsewhere, never wrong
 * bytes: the owner checks the key when it serves.
 *
 * Events.  A HEARTBEAT applies its events in seq order from the node's
 * last applied seq + 1; seqs at or below it are repeats (ignored); a gap,
 * a STATUS seq past the last event, or a seq that went back asks for a
 * RESYNC, and events are ignored until it comes (FIRST drops what the
 * directory has of the node, LAST ends it).  An unknown node is told to
 * REGISTER.
 *
 * Failure.  dir_sweep: a node without a heartbeat for suspect_ms is
 * suspect (lookups skip it); for dead_ms it is dead: its keys leave the
 * index and the node is forgotten (its connection, if any, is told to
 * REGISTER again at its next heartbeat).
 *
 * Bounds: max_nodes (REGISTER refused past it), max_keys (a STORED event
 * for a new key past it is dropped and counted: a miss later),
 * max_replicas (more owners of a key are not recorded).
 *
 * Threads: one at a time (the master's loop thread).
 */
#ifndef UMBP_MASTER_DIRECTORY_H
#define UMBP_MASTER_DIRECTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

enum dir_state { DIR_ALIVE = PROTO_NODE_ALIVE, DIR_SUSPECT = PROTO_NODE_SUSPECT };

struct dir_node {
    uint32_t ref;               /* the wire's number: > 0, never reused */
    uint16_t slot;              /* index in the directory's node table */
    enum dir_state state;
    struct proto_register reg;  /* as registered; used_bytes kept current */
    uint64_t seq;               /* last event applied */
    uint64_t last_hb_ns;        /* last REGISTER, HEARTBEAT or RESYNC */
    uint64_t keys;              /* replicas held in the index */
    bool need_resync;           /* asked for one; events ignored until it ends */
    bool resyncing;             /* between RESYNC FIRST and LAST */
    void *owner;                /* the master's: the connection bound to it */
};

struct dir_stats {
    uint64_t registers, heartbeats, events, gaps, resyncs, resync_keys;
    uint64_t dropped_full;      /* STORED of a new key past max_keys */
    uint64_t dropped_replicas;  /* STORED of a key that has max_replicas owners */
    uint64_t size_mismatch;     /* STORED with another size than the key's */
    uint64_t locates, locate_keys, locate_hits;
    uint64_t suspected, dead, keys_dropped;
    uint64_t reported;          /* nodes made suspect by another's SUSPECT */
};

struct dir_config {
    uint32_t max_nodes;         /* 1 .. PROTO_MAX_NODES_FRAME */
    uint32_t max_replicas;      /* 1 .. PROTO_MAX_REPLICAS */
    uint64_t max_keys;
    /* A node is forgotten (dead): clear what points at it (called before
     * its keys leave the index, so n->keys still counts them). */
    void (*on_gone)(void *ctx, struct dir_node *n);
    /* A node became suspect.  Optional. */
    void (*on_suspect)(void *ctx, struct dir_node *n);
    void *ctx;
};

struct directory;

int dir_create(const struct dir_config *cfg, struct directory **out);
void dir_destroy(struct directory *d);

/* REGISTER: the node of r's id (created if new; -ENOSPC at max_nodes) and
 * the acknowledgement to send. */
int dir_register(struct directory *d, const struct proto_register *r, uint64_t now,
                 struct dir_node **out, struct proto_ack *ack);
/* HEARTBEAT and RESYNC frames of node n (NULL: not registered on this
 * connection: ack REGISTER).  -EPROTO with err naming the field for a
 * malformed record or a frame out of turn (a HEARTBEAT inside a RESYNC, a
 * RESYNC without FIRST); nothing is applied then. */
int dir_heartbeat(struct directory *d, struct dir_node *n, const struct proto_frame *f,
                  uint64_t now, struct proto_ack *ack, char *err, size_t errlen);
int dir_resync(struct directory *d, struct dir_node *n, const struct proto_frame *f,
               uint64_t now, struct proto_ack *ack, char *err, size_t errlen);
/* The live owners of key (suspect nodes skipped). */
void dir_locate(struct directory *d, const umbp_key_t *key, struct proto_location *out);
/* A node reported failing by another (SUSPECT): suspect now if alive, so
 * lookups skip it at once; its next heartbeat makes it alive again.  1 if
 * it changed, 0 if unknown or suspect already. */
int dir_report(struct directory *d, uint32_t ref);
/* States by the time: suspect after suspect_ns, forgotten after dead_ns.
 * Returns how many nodes changed state. */
unsigned dir_sweep(struct directory *d, uint64_t now, uint64_t suspect_ns, uint64_t dead_ns);

/* Bumped whenever the node list a client caches changes (a node added,
 * gone, suspected, alive again, re-registered). */
uint32_t dir_epoch(const struct directory *d);
/* The nodes, in slot order: fills up to max records, returns the count. */
size_t dir_nodes(const struct directory *d, uint64_t now, struct proto_node_info *out,
                 size_t max);
size_t dir_node_count(const struct directory *d);
uint64_t dir_key_count(const struct directory *d);
const struct dir_stats *dir_stats(const struct directory *d);
/* The node in slot i (NULL: free), i < max_nodes. */
struct dir_node *dir_node_at(const struct directory *d, uint32_t i);

#endif /* UMBP_MASTER_DIRECTORY_H */
