/*
 * lookup.h - prefix lookups for an engine's scheduler, which owns no pool.
 *
 * A vLLM scheduler asks, before it schedules a request, how long a prefix of
 * the request's blocks the cache holds on EVERY rank of the engine (a block
 * restored on some ranks only is a miss).  Keys name one block of one rank,
 * so the question is one row of keys per rank.
 *
 *  - Embedded mode: each worker's runtime serves lookups of its own pool on a
 *    Unix stream socket (umbp_lookup_serve), on the runtime's loop thread.
 *    The scheduler's client (umbp_lookup_client_*) asks every rank at once,
 *    one round trip per rank per query, over the lookup role of the
 *    standalone wire protocol (docs/protocol.md).
 *  - Standalone mode: the client holds one lookup session with umbp-server
 *    and asks it for every row in one round trip.
 *
 * Failures are misses: a rank that is dead, stalled or answers badly makes
 * its rows absent, and the query says why with its return code, never by
 * blocking past lookup_timeout_ms.  While a query to a rank is unanswered
 * past its deadline, later queries do not ask that rank again until the
 * late answer has arrived (single flight).
 *
 * Threads: umbp_lookup_socket_path is stateless.  umbp_lookup_serve may be
 * called from any thread, at most once per runtime, and must not race with
 * umbp_runtime_destroy (which stops the service and removes its socket).  A
 * lookup client may be used from any thread but by one thread at a time
 * (queries on one client are not synchronised; give each thread its own
 * client, or serialise).
 */
#ifndef UMBP_LOOKUP_H
#define UMBP_LOOKUP_H

#include <stddef.h>
#include <stdint.h>

#include "umbp/umbp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UMBP_LOOKUP_NS_HEX_LEN 32   /* the namespace: 32 hex digits */
#define UMBP_LOOKUP_INSTANCE_MAX 31 /* lookup_instance: [A-Za-z0-9._-], at most 31 */

/*
 * Fills buf with the lookup socket path of one rank:
 *   {dir}/umbp-lk-{24 hex}.sock
 * where the 24 hex digits are the first 12 bytes (big-endian canonical form)
 * of XXH3-128 over the bytes  ns_hex '\0' instance '\0' dp_index '\0' rank
 * (ns_hex in lower case, dp_index and rank in decimal, no trailing NUL).
 *
 * dir NULL or "": the default lookup directory, $XDG_RUNTIME_DIR/umbp when
 * XDG_RUNTIME_DIR is set to an absolute path, else /tmp/umbp-<euid>; any
 * other dir must be absolute.  ns_hex: 32 hex digits (either case; the same
 * namespace in upper and lower case gives the same path).  instance NULL or
 * "": none.  Nothing is created.
 *
 * 0; -EINVAL (a bad ns_hex, instance or dir; buf NULL); -ENAMETOOLONG when
 * the path does not fit a Unix socket address (107 bytes); -ERANGE when it
 * does not fit buf.  umbp_last_error() names the problem.
 */
UMBP_API int umbp_lookup_socket_path(const char *dir, const char *ns_hex, const char *instance,
                                     uint32_t dp_index, uint32_t rank, char *buf, size_t len);

/*
 * Serves lookups of rt's pool at umbp_lookup_socket_path(dir, ns_hex,
 * instance, dp_index, rank), on rt's loop thread, until umbp_runtime_destroy
 * (which closes every connection and removes the socket, without waiting for
 * clients).  The directory is created 0700 when missing.  Connections are
 * accepted from this user (or root) only (SO_PEERCRED), 64 at most.  A
 * lookup never changes the LRU order unless the request asks to touch.
 *
 * 0, or a negative code with umbp_last_error() naming the problem:
 *  -EADDRINUSE  another engine serves this path now (live socket, never
 *               taken over); give this one a distinct lookup_instance;
 *  -EEXIST      a file that is not a socket is at the path (left alone);
 *  -EBUSY       this runtime already serves lookups;
 *  -ENOTSUP     rt is not an embedded runtime (its tier is remote: in
 *               standalone mode the scheduler asks umbp-server);
 *  -EINVAL, -ENAMETOOLONG as for umbp_lookup_socket_path; another -errno
 *  when the directory or socket cannot be made; UMBP_E_NOT_ATTEMPTED when
 *  rt is shutting down.
 * A stale socket (nobody listens) is replaced.
 */
UMBP_API int umbp_lookup_serve(umbp_runtime_t *rt, const char *dir, const char *ns_hex,
                               const char *instance, uint32_t dp_index, uint32_t rank);

/* ---- the scheduler's client -------------------------------------------- */

typedef struct umbp_lookup_client umbp_lookup_client_t;

/*
 * Creates a client from a JSON object of options (docs/configuration.md,
 * "lookup client"): mode ("embedded" or "standalone"), lookup_timeout_ms;
 * embedded: namespace (required), lookup_dir, lookup_instance, dp_index,
 * num_ranks; standalone: socket_dir, lookup_instance, dp_index,
 * startup_timeout_ms, reconnect_max_ms, engine_id, namespace.  UMBP_<NAME>
 * environment variables override the JSON, as for runtimes.  Unknown
 * options are refused.
 *
 * Embedded: nothing is dialled yet (ranks may start later); the directory
 * is created 0700 when missing.  Standalone: the server must answer within
 * startup_timeout_ms.  0 and *out, or a negative code with umbp_last_error()
 * naming the option and its accepted range.
 */
UMBP_API int umbp_lookup_client_create(const char *json_options, umbp_lookup_client_t **out);

/* Closes every connection and frees the client.  Never blocks.  NULL: no-op. */
UMBP_API void umbp_lookup_client_destroy(umbp_lookup_client_t *c);

/*
 * keys: rows x n keys, row-major (row r = keys[r*n .. r*n+n-1]); row_rank[r]
 * is the rank whose service holds row r (NULL: row r is rank r; every
 * row_rank[r] < num_ranks, several rows may name one rank).  *prefix = the
 * longest i such that keys 0..i-1 are present in EVERY row.  present
 * (rows*n bytes, may be NULL) gets 1/0 per key.  Never touches the LRU.
 *
 * One round trip per rank per call, all ranks asked in parallel
 * (non-blocking sockets + poll); bounded by lookup_timeout_ms in total.
 * Failures are misses: the rows of a rank that is dead, slow or answers
 * badly are absent, and the call returns a negative code with *prefix and
 * present still valid (the other ranks' answers kept):
 *   UMBP_E_TIMEOUT        a rank did not answer within lookup_timeout_ms;
 *   UMBP_E_NOT_ATTEMPTED  a rank was not asked: its previous query is still
 *                         unanswered (single flight), or it failed recently
 *                         and its redial backoff (10 ms doubling to 1 s) has
 *                         not passed;
 *   -ECONNREFUSED, -ENOENT, -ECONNRESET, -EPROTO, -EACCES ...  the rank's
 *                         connection failed (refused, no socket, closed,
 *                         malformed reply, a service of another user);
 * with several failing ranks, the code of the lowest-numbered one.
 * -EINVAL (bad arguments: *prefix 0, present zeroed, nothing asked).
 * n == 0: *prefix 0, returns 0.
 */
UMBP_API int umbp_lookup_client_query(umbp_lookup_client_t *c, const umbp_key_t *keys, size_t n,
                                      size_t rows, const uint32_t *row_rank, uint8_t *present,
                                      size_t *prefix);

#ifdef __cplusplus
}
#endif
#endif /* UMBP_LOOKUP_H */
