/*
 * leader_lease.h - the leader lease of umbp-master's high availability, in an
 * external store, behind four calls (acquire, renew, release, leader) so
 * that another store (etcd) can be added beside Redis without touching the
 * master or its clients.  Correctness never rests on it: the master is a
 * soft-state directory, and nodes own every byte.  What the lease gives is
 * at most one master that clients follow: the holder's epoch grows at every
 * takeover, and a client refuses a master whose epoch is below one it has
 * seen (a deposed master that wakes up cannot take traffic back).
 *
 * A store is named by a URL.  Redis (and Valkey: the same protocol):
 *   redis://host:port/<cluster>    ([v6addr]:port; port 6379 if omitted)
 *   redis+sentinel://h1:p1,h2:p2,.../<service>/<cluster>   (port 26379 if
 *                                  omitted; 1 .. 8 sentinels): each connection
 *                                  asks the sentinels in turn for <service>'s
 *                                  primary, connects there and checks that it
 *                                  is a primary (ROLE); acquire, renew and
 *                                  release each make a new connection
 *   rediss://..., rediss+sentinel://...  the same over TLS (to the
 *                                  sentinels too, and to the primary they
 *                                  name): OpenSSL (redis_conn.h), the
 *                                  server's certificate verified
 *   ...?password_file=PATH[&user=NAME]   (the data nodes' password)
 *   ...&sentinel_password_file=PATH      (the sentinels' own, if they have one)
 *   ...&tls_ca_file=PATH                 (rediss: the CA that signed the
 *                                  servers' certificates; absent: the
 *                                  system's trust store)
 *   ...&tls_cert_file=PATH&tls_key_file=PATH   (rediss: a client
 *                                  certificate, for servers that require
 *                                  one: both or neither; the key file as a
 *                                  password file, 0600)
 *   ...&tls_server_name=NAME             (rediss: the name verified in the
 *                                  server's certificate and sent as SNI;
 *                                  default: the host dialled, the URL's or
 *                                  the one a sentinel named; an IP address
 *                                  is verified as an IP)
 * With password_file, each connection authenticates (AUTH [user] password)
 * with the password the file holds (its first line; 1 .. 512 bytes; a file
 * that group or others may read is refused, as the secret_file is): the
 * URL, which is logged, never carries the password itself.  The TLS files
 * are read once, at open (a missing or unreadable one, or a key others may
 * read, is refused there, named); tls_* on a redis:// URL is refused.
 * Keys, all under one cluster name (letters, digits, '.', '_', '-'):
 *   umbp:<cluster>:leader  "<epoch> <address> <owner>", with an expiry (the
 *                          lease); absent: nobody leads
 *   umbp:<cluster>:epoch   the last epoch handed out (never expires)
 * Each call is one Lua script, so it is atomic in the store.
 *
 * Epochs survive the store losing its data (a Redis failover that lost
 * the last writes, a restart without persistence): acquire takes
 * max(the store's counter, min_epoch) + 1, where min_epoch is the highest
 * epoch the caller has seen; a holder whose key vanished re-takes it with
 * its own epoch (renew), raising the counter to it; and a holder that finds
 * a lower epoch in its place takes the key back (the highest epoch wins).
 *
 * Errors: a negative code with err naming the store and what failed
 * ("redis://10.0.0.5:6379/prod: connect 10.0.0.5:6379: Connection
 * refused").  Every call is bounded by the timeout given at open (connect,
 * the TLS handshake, and each command); a call after an error reconnects
 * first.  -ETIMEDOUT: no answer within it; -ECONNREFUSED: the dial failed;
 * -ECONNRESET: the connection broke; -EACCES: a password refused or
 * wanted, or (TLS) our client certificate refused or wanted;
 * -EKEYREJECTED: (TLS) the server's certificate failed verification (not
 * signed by the CA, not for the name), the message naming why, the name
 * and the CA file; -EPROTO: a reply that is not what the script returns,
 * or bytes that are not Redis's protocol (a TLS port spoken to in plain
 * text) or not TLS (a plain port spoken to with rediss://), named.
 *
 * Threads: one caller at a time per struct lease; calls block (bounded).
 * umbp-master calls them from its lease thread, clients from a watcher
 * thread (leader_watch.h): never from a loop thread.
 */
#ifndef UMBP_NET_LEADER_LEASE_H
#define UMBP_NET_LEADER_LEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tcp.h"

#define LEASE_CLUSTER_MAX 64
#define LEASE_OWNER_MAX 96
#define LEASE_URL_MAX 640

/* Who holds (or held) the lease. */
struct lease_holder {
    uint64_t epoch;                       /* >= 1 */
    char address[NET_TCP_NAME_MAX];       /* where clients dial it: host:port */
    char owner[LEASE_OWNER_MAX];          /* unique per master process */
};

#define LEASE_USER_MAX 64
#define LEASE_PATH_MAX 256
#define LEASE_PASSWORD_MAX 512
#define LEASE_SENTINELS_MAX 8

/* A parsed store URL. */
struct lease_url {
    char scheme[16];                      /* "redis", "redis+sentinel", "rediss",
                                             "rediss+sentinel" */
    bool tls;                             /* rediss: TLS to every server */
    char host[NET_TCP_HOST_MAX];          /* redis: the store; sentinel: the first sentinel */
    uint16_t port;
    /* redis+sentinel: the sentinels in the URL's order, and the name of the
     * primary they watch (host/port above are sentinel 0) */
    unsigned nsentinels;
    char sentinel_host[LEASE_SENTINELS_MAX][NET_TCP_HOST_MAX];
    uint16_t sentinel_port[LEASE_SENTINELS_MAX];
    char service[LEASE_CLUSTER_MAX];
    char cluster[LEASE_CLUSTER_MAX];
    char user[LEASE_USER_MAX];            /* "": the default user */
    char password_file[LEASE_PATH_MAX];   /* "": no AUTH */
    char sentinel_password_file[LEASE_PATH_MAX]; /* the sentinels' ("": none) */
    char tls_ca_file[LEASE_PATH_MAX];     /* "": the system's trust store */
    char tls_cert_file[LEASE_PATH_MAX];   /* "": no client certificate */
    char tls_key_file[LEASE_PATH_MAX];    /* set with tls_cert_file */
    char tls_server_name[NET_TCP_HOST_MAX]; /* "": the host dialled */
};
/* The password in the file at path into buf (NUL-terminated): its length,
 * or a negative code with err naming the file and what is wrong (missing,
 * readable by group or others, empty, too long). */
int lease_password_read(const char *path, char *buf, size_t cap, char *err, size_t errlen);

/* Whether s names a store ("redis://..."), rather than a host:port. */
int lease_is_url(const char *s);
/* 0, or -EINVAL with err naming the bad part and `what` (the option). */
int lease_url_parse(const char *s, const char *what, struct lease_url *out, char *err,
                    size_t errlen);

/* The store's value of the leader key, "<epoch> <address> <owner>":
 * 0, or -EPROTO with err naming the bad field (a decoder of bytes from
 * outside the process: fuzzed by fuzz_lease_value).  The address must
 * parse as host:port (tcp.h), the owner be printable without spaces. */
int lease_value_parse(const char *v, size_t len, struct lease_holder *out, char *err,
                      size_t errlen);
/* A sentinel's answer for a primary, [host, port] as two byte strings
 * (bytes from another process: fuzzed by fuzz_lease_value): 0 with host
 * (NUL-terminated, printable, no spaces, < hostcap bytes) and port
 * (1 .. 65535, decimal digits only), or -EPROTO with err naming the field. */
int lease_primary_parse(const char *host, size_t hostlen, const char *port, size_t portlen,
                        char *hostout, size_t hostcap, uint16_t *portout, char *err,
                        size_t errlen);
/* The value of h, NUL-terminated: 0, or -ENAMETOOLONG. */
int lease_value_format(const struct lease_holder *h, char *buf, size_t len);

struct lease;

/* Opens (does not connect: the first call does; rediss: reads the TLS
 * files and makes the TLS context once, here).  -EINVAL for a bad URL (or
 * a TLS file that is not PEM, a key that is not the certificate's),
 * -ENOENT / -EACCES for a password or TLS file missing or open to others,
 * -ENOTSUP for a scheme this build lacks (named, with the package). */
int lease_open(const char *url, uint64_t timeout_ms, struct lease **out, char *err,
               size_t errlen);
void lease_close(struct lease *l);
const char *lease_url_of(const struct lease *l);

/* If nobody holds the lease, take it for ttl_ms as (epoch, address, owner)
 * with epoch = max(counter, min_epoch) + 1 (at most 2^53: Lua counts in
 * doubles).  A lease already held by this address and owner is ours (an
 * earlier call that timed out here may have run late in the store).  1:
 * taken, *out is ours; 0: held by another, *out is theirs; < 0: error
 * (nothing known: the call may still run in the store later). */
int lease_acquire(struct lease *l, const char *address, const char *owner, uint64_t ttl_ms,
                  uint64_t min_epoch, struct lease_holder *out, char *err, size_t errlen);
/* Keeps mine for ttl_ms more: if the key holds my value, extend it; if it
 * is absent (expired while the store or I was away, or the store lost it),
 * re-take it with my epoch, unless the counter has passed my epoch (someone
 * took over and vanished); if another holds it with a lower epoch (the
 * store lost the lease and a master that never saw mine took it), take it
 * back: the highest epoch wins, so two leaders converge to one.  1: held;
 * 0: lost, *out the holder if any (epoch 0: none); < 0: error (the caller
 * keeps serving until a higher epoch shows up: an unreachable store
 * deposes nobody). */
int lease_renew(struct lease *l, const struct lease_holder *mine, uint64_t ttl_ms,
                struct lease_holder *out, char *err, size_t errlen);
/* Gives mine up at once (a clean stop): deletes the key only if it holds my
 * value.  0 (released or not mine any more), or < 0. */
int lease_release(struct lease *l, const struct lease_holder *mine, char *err, size_t errlen);
/* The current holder: 1 and *out; 0: nobody holds it; < 0: error. */
int lease_leader(struct lease *l, struct lease_holder *out, char *err, size_t errlen);

#endif /* UMBP_NET_LEADER_LEASE_H */
