/*
 * msg.h - every message the actors exchange, declared once.
 *
 * UMBP_MESSAGES(X) lists (name, receiving actor).  From it come the enum, the
 * names used in logs, and the receiving actor used by mailbox_post() to pick a
 * mailbox.  Every message starts with struct msg_hdr.  Operation messages are
 * the op itself (struct umbp_op embeds the header), so posting never
 * allocates; the evictor's kick is a single static message guarded by a flag.
 */
#ifndef UMBP_MSG_H
#define UMBP_MSG_H

#include <stdatomic.h>
#include <stdint.h>

#define UMBP_MESSAGES(X)                                                   \
    X(PUT_SUBMIT, STORE)   /* caller -> store: new put batch */            \
    X(PUT_COPIED, STORE)   /* copy worker -> store: bytes are in place */  \
    X(FLUSH, STORE)        /* caller -> store: wait for earlier puts */    \
    X(GET_SUBMIT, LOAD)    /* caller -> load: new get batch */             \
    X(GET_COPIED, LOAD)    /* copy worker -> load: bytes restored */       \
    X(LOOKUP, LOOKUP)      /* caller -> lookup: exists + prefix */         \
    X(STATS, LOOKUP)       /* caller -> lookup: counters snapshot */       \
    X(CLEAR, LOOKUP)       /* caller -> lookup: remove everything */       \
    X(LOOKUP_SERVE, LOOKUP) /* caller -> lookup: start the lookup service */ \
    X(EVICT_KICK, EVICTOR) /* store/lookup -> evictor: check watermarks */

enum actor_id {
    ACTOR_LOOKUP,
    ACTOR_STORE,
    ACTOR_LOAD,
    ACTOR_EVICTOR,
    ACTOR_COUNT
};

enum msg_type {
#define X(name, actor) MSG_##name,
    UMBP_MESSAGES(X)
#undef X
        MSG_COUNT
};

struct msg_hdr {
    uint16_t type;           /* enum msg_type */
    _Atomic uint32_t posted; /* release on post, acquire on receipt: the
                                C11 edge that hands the message's contents
                                over (ck's own fences do the same on x86,
                                but only this is visible to ThreadSanitizer) */
};

const char *msg_name(enum msg_type t);
enum actor_id msg_actor(enum msg_type t);
const char *actor_name(enum actor_id a);

#endif
