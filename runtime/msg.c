/*
 * msg.c - names and receiving actors of the messages of msg.h, generated
 * from its X-macro.  Constant tables; any thread.
 */
#include "rt.h"

static const char *const msg_names[] = {
#define X(name, actor) #name,
    UMBP_MESSAGES(X)
#undef X
};
static const enum actor_id msg_actors[] = {
#define X(name, actor) ACTOR_##actor,
    UMBP_MESSAGES(X)
#undef X
};
_Static_assert(sizeof(msg_names) / sizeof(msg_names[0]) == MSG_COUNT, "message table");

const char *msg_name(enum msg_type t) { return t < MSG_COUNT ? msg_names[t] : "?"; }
enum actor_id msg_actor(enum msg_type t) { return msg_actors[t]; }

const char *actor_name(enum actor_id a)
{
    static const char *const names[] = {"lookup", "store", "load", "evictor"};
    return a < ACTOR_COUNT ? names[a] : "?";
}
