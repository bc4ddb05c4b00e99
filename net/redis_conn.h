/*
 * redis_conn.h - one blocking connection to a Redis (or a Sentinel), plain
 * TCP or TLS through the same code path, every step bounded by a timeout:
 *   dial      getaddrinfo, then a non-blocking connect to each address in
 *             turn until one answers (one deadline for them all); with TLS,
 *             the handshake after it (a deadline of its own), verifying
 *             the server's certificate against the CA and its name
 *   command   one command out, one reply in (one deadline for both)
 * hiredis 0.14 does what it does well: redisFormatCommandArgv writes the
 * command, its redisReader parses the reply (no decoder of our own: the
 * bytes from Redis reach hiredis's parser only).  OpenSSL does TLS (where
 * the build found it: UMBP_HAVE_OPENSSL); Debian's hiredis 0.14 has none.
 *
 * Errors: a negative code, and err saying what failed, without the
 * command's name (the caller adds it) and naming host:port for a dial:
 *   -ETIMEDOUT     nothing within the timeout ("no reply within the
 *                  timeout"; a dial: "connect h:p: no answer within ...",
 *                  "TLS handshake with h:p: no answer within ...")
 *   -ECONNREFUSED  the dial failed (refused, no route, unknown name)
 *   -ECONNRESET    the connection broke or the server closed it
 *   -EPROTO        the bytes are not Redis's protocol (a TLS port spoken to
 *                  in plain text), or not TLS (a plain port spoken to with
 *                  TLS), or a reply past REDIS_CONN_REPLY_MAX, or an
 *                  array in it of more than REDIS_CONN_ARRAY_MAX elements
 *   -EKEYREJECTED  the server's certificate failed verification (not
 *                  signed by the CA, not for the name, expired): the
 *                  message names OpenSSL's reason, the name and the CA
 *   -EACCES        the server refused our client certificate, or wanted
 *                  one we did not give (mutual TLS)
 *   -ENOMEM
 * After any error but -ENOMEM the connection is unusable: close it.
 *
 * Threads: a struct redis_conn has one caller at a time; a struct redis_tls
 * is read-only once made and may serve any number of connections and
 * threads.  SIGPIPE is never raised (send with MSG_NOSIGNAL, also under
 * TLS: a BIO of our own).
 */
#ifndef UMBP_NET_REDIS_CONN_H
#define UMBP_NET_REDIS_CONN_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REDIS_CONN_REPLY_MAX (1u << 20) /* bytes of one reply: ours are tiny */
/* Elements of one array in a reply (ours have a handful): hiredis allocates
 * an array's element pointers when its header arrives, before the elements,
 * so "*444444442\r\n" alone would take 3.5 GB.  A larger count is -EPROTO. */
#define REDIS_CONN_ARRAY_MAX 4096

/* A reader's array bound: redis_reader_bound(r, b) makes r refuse (its
 * GetReply fails, b->too_many says the count) an array of more than
 * REDIS_CONN_ARRAY_MAX elements before allocating for it.  b outlives r's
 * use and holds r's privdata.  Every reader of replies from outside uses
 * it (the connections here; the fuzz target's store too). */
struct redis_reader_bound {
    redisReplyObjectFunctions fns;         /* hiredis's, createArray bounded */
    const redisReplyObjectFunctions *hfns; /* hiredis's own */
    long long too_many;                    /* the count refused, or 0 */
};
void redis_reader_bound(redisReader *r, struct redis_reader_bound *b);

/* TLS settings, made once (redis_tls_new) from the URL's parameters. */
struct redis_tls;
struct redis_conn;

/* Whether this build can make TLS connections (OpenSSL found). */
bool redis_tls_built(void);

/* The client's TLS context: the CA to verify servers against (ca_file;
 * NULL or "": the system's default trust store), a client certificate and
 * its key (both NULL/"" or both set), the name to verify (server_name;
 * NULL or "": the host dialled).  The files are read now.  0, or -ENOENT /
 * -EACCES (a file missing or unreadable), -EINVAL (not PEM, the key does
 * not match the certificate, an encrypted key), -ENOTSUP (no OpenSSL in
 * this build), -ENOMEM, with err naming the parameter and the file. */
int redis_tls_new(const char *ca_file, const char *cert_file, const char *key_file,
                  const char *server_name, struct redis_tls **out, char *err, size_t errlen);
void redis_tls_free(struct redis_tls *t);

/* A connection to host:port within timeout_ms (connect; then the TLS
 * handshake, if tls, within timeout_ms more), each command bounded by
 * timeout_ms too.  0 with *out, or < 0 (above) with err. */
int redis_conn_dial(const char *host, uint16_t port, const struct redis_tls *tls,
                    uint64_t timeout_ms, struct redis_conn **out, char *err, size_t errlen);

/* Sends argv (binary-safe if argvlen, else strlen), reads one reply: 0 with
 * *reply (freeReplyObject it; an error reply is a reply), or < 0 (above)
 * with err. */
int redis_conn_command(struct redis_conn *c, int argc, const char **argv, const size_t *argvlen,
                       redisReply **reply, char *err, size_t errlen);

/* "host:port" as dialled, for messages. */
const char *redis_conn_peer(const struct redis_conn *c);
bool redis_conn_is_tls(const struct redis_conn *c);

void redis_conn_close(struct redis_conn *c);

#endif /* UMBP_NET_REDIS_CONN_H */
