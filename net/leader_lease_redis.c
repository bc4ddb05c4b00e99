/*
 * leader_lease_redis.c - the leader lease in Redis (or Valkey), over
 * redis_conn.c: one blocking connection, plain or TLS (rediss://), with a
 * timeout on the connect, on the TLS handshake and on every command.  Each
 * call is one EVAL of a small Lua script, so it is atomic in Redis; the
 * scripts answer {taken, value} and the value is parsed by leader_lease.c (a
 * store is outside the process: its bytes are checked like a wire's).
 *
 * Keys: umbp:<cluster>:leader (the value, with the lease as its expiry)
 * and umbp:<cluster>:epoch (the last epoch handed out).  leader_lease.h says
 * what each call promises.
 *
 * A failed command (connection refused, reset, timeout) frees the
 * connection; the next call dials again.  A stopped Redis costs each call
 * at most the timeout, twice (connect, then the command; with TLS the
 * kernel still accepts, and the handshake is what waits).
 *
 * rediss: the TLS context (the CA, a client certificate, the name to
 * verify) is made once at open and serves every connection, to the
 * sentinels too (rediss+sentinel); the name verified is tls_server_name,
 * else the host dialled: the URL's, or the one a sentinel named.
 *
 * redis+sentinel: a connection begins by asking the sentinels in turn
 * (from the one that answered last) for the service's primary, then checks
 * with ROLE that it is one; an error reply also frees the connection (a
 * primary demoted under us answers READONLY), so the next call asks again.
 * A dial then costs up to the timeout per sentinel tried, plus the
 * primary's.  Acquire, renew and release each dial so (eval()); only
 * leader() reads on a kept connection.
 *
 * Threads: one caller at a time per lease (leader_lease.h).
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "leader_lease_int.h"
#include "redis_conn.h"

struct lease_redis {
    struct lease base; /* first: container_of */
    struct redis_conn *c;
    struct redis_tls *tls; /* rediss: made at open; NULL: plain */
    unsigned sentinel; /* redis+sentinel: the one asked first */
    char k_leader[LEASE_CLUSTER_MAX + 16], k_epoch[LEASE_CLUSTER_MAX + 16];
};

static struct lease_redis *to_redis(struct lease *l) { return (struct lease_redis *)l; }

/* If nobody leads: epoch = max(counter, min_epoch) + 1, set both keys.  If
 * the key is already ours (an earlier acquire that timed out on our side
 * ran late in Redis: owners are unique per process), it is taken. */
static const char acquire_lua[] =
    "local cur = redis.call('GET', KEYS[1])\n"
    "if cur then\n"
    "  local me = ' ' .. ARGV[1] .. ' ' .. ARGV[2]\n"
    "  if #cur > #me and string.sub(cur, -#me) == me then\n"
    "    redis.call('PEXPIRE', KEYS[1], ARGV[3]) return {1, cur}\n"
    "  end\n"
    "  return {0, cur}\n"
    "end\n"
    "local e = tonumber(redis.call('GET', KEYS[2]) or '0') or 0\n"
    "local m = tonumber(ARGV[4])\n"
    "if m > e then e = m end\n"
    "e = e + 1\n"
    "local v = string.format('%d %s %s', e, ARGV[1], ARGV[2])\n"
    "redis.call('SET', KEYS[2], string.format('%d', e))\n"
    "redis.call('SET', KEYS[1], v, 'PX', ARGV[3])\n"
    "return {1, v}\n";

/* Mine: extend.  Nobody's: re-take with my epoch unless the counter has
 * passed it (someone took over since).  Another's with a lower epoch (the
 * store lost the lease and a master that never saw mine took it): the
 * higher epoch wins, take it back.  Another's with a higher one: lost. */
static const char renew_lua[] =
    "local cur = redis.call('GET', KEYS[1])\n"
    "if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return {1, cur} end\n"
    "local mine = tonumber(ARGV[3])\n"
    "local e = tonumber(redis.call('GET', KEYS[2]) or '0') or 0\n"
    "if cur then\n"
    "  local ce = tonumber(string.match(cur, '^(%d+) '))\n"
    "  if ce == nil or ce >= mine or e > mine then return {0, cur} end\n"
    "elseif e > mine then return {0, ''} end\n"
    "if e < mine then redis.call('SET', KEYS[2], ARGV[3]) end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "return {1, ARGV[1]}\n";

static const char release_lua[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end\n"
    "return 1\n";

static void drop(struct lease_redis *r)
{
    redis_conn_close(r->c);
    r->c = NULL;
}

/* cmd got no reply (rc, why from redis_conn_command: a timeout, a broken
 * connection, bytes that are not Redis's, a TLS alert): the connection is
 * dropped (the next call dials again). */
static int lost(struct lease_redis *r, const char *cmd, int rc, const char *why, char *err,
                size_t errlen)
{
    snprintf(err, errlen, "%s: %s", cmd, why);
    drop(r);
    return rc;
}

/* Runs argv on c: 0 with *rep, or < 0 with why (redis_conn.h). */
static int run(struct redis_conn *c, int argc, const char **argv, redisReply **rep, char *why,
               size_t whylen)
{
    return redis_conn_command(c, argc, argv, NULL, rep, why, whylen);
}

/* AUTH [user] password, from the URL's password_file read now (a rotated
 * file is picked up at the next connection); nothing without one. */
static int authenticate(struct lease_redis *r, char *err, size_t errlen)
{
    const struct lease_url *u = &r->base.u;
    if (!u->password_file[0])
        return 0;
    char pw[LEASE_PASSWORD_MAX + 1], why[384];
    int rc = lease_password_read(u->password_file, pw, sizeof(pw), err, errlen);
    if (rc < 0) {
        drop(r);
        return rc;
    }
    const char *argv[3] = {"AUTH", u->user[0] ? u->user : pw, pw};
    redisReply *rep = NULL;
    rc = run(r->c, u->user[0] ? 3 : 2, argv, &rep, why, sizeof(why));
    explicit_bzero(pw, sizeof(pw));
    if (rc < 0)
        return lost(r, "AUTH", rc, why, err, errlen);
    if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "AUTH%s%s with the password in %s: the store refused it: %.*s",
                 u->user[0] ? " as " : "", u->user, u->password_file, (int)rep->len, rep->str);
        rc = -EACCES;
    } else {
        rc = 0;
    }
    freeReplyObject(rep);
    if (rc < 0)
        drop(r);
    return rc;
}

/* A store error: NOAUTH (it wants a password the URL does not give) is
 * -EACCES, said plainly; any other -EIO. */
static int store_error(const char *cmd, const redisReply *rep, char *err, size_t errlen)
{
    if (rep->len >= 6 && !strncmp(rep->str, "NOAUTH", 6)) {
        snprintf(err, errlen, "%s: the store requires a password (%.*s): name a file holding it "
                 "with ?password_file=PATH", cmd, (int)rep->len, rep->str);
        return -EACCES;
    }
    snprintf(err, errlen, "%s: the store answered: %.*s", cmd, (int)rep->len, rep->str);
    return -EIO;
}

/* A connection to host:port (TLS where the URL says rediss) with the
 * lease's timeout on the connect, the handshake and every command; NULL
 * with *rc and err set ("connect h:p: ...", "TLS handshake with h:p: ..."). */
static struct redis_conn *dial(const struct lease_redis *r, const char *host, uint16_t port,
                               int *rc, char *err, size_t errlen)
{
    struct redis_conn *c = NULL;
    *rc = redis_conn_dial(host, port, r->tls, r->base.timeout_ms, &c, err, errlen);
    return *rc < 0 ? NULL : c;
}

/* AUTH with the sentinels' password (sentinel_password_file). */
static int sentinel_auth(struct redis_conn *c, const struct lease_url *u, unsigned i, char *err,
                         size_t errlen)
{
    char pw[LEASE_PASSWORD_MAX + 1], why[384];
    int rc = lease_password_read(u->sentinel_password_file, pw, sizeof(pw), err, errlen);
    if (rc < 0)
        return rc;
    const char *argv[2] = {"AUTH", pw};
    redisReply *rep = NULL;
    rc = run(c, 2, argv, &rep, why, sizeof(why));
    explicit_bzero(pw, sizeof(pw));
    if (rc < 0) {
        snprintf(err, errlen, "sentinel %u (%s:%u): AUTH: %s", i + 1, u->sentinel_host[i],
                 u->sentinel_port[i], why);
    } else if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "sentinel %u (%s:%u): AUTH with the password in %s: refused: "
                 "%.*s", i + 1, u->sentinel_host[i], u->sentinel_port[i],
                 u->sentinel_password_file, (int)rep->len, rep->str);
        rc = -EACCES;
    }
    if (rep)
        freeReplyObject(rep);
    return rc;
}

/* Sentinel i's answer for the service's primary: 0 with host/port, or < 0
 * with err naming the sentinel. */
static int ask_sentinel(struct lease_redis *r, unsigned i, char *host, size_t hostlen,
                        uint16_t *port, char *err, size_t errlen)
{
    const struct lease_url *u = &r->base.u;
    int rc = 0;
    char e2[384];
    struct redis_conn *c = dial(r, u->sentinel_host[i], u->sentinel_port[i], &rc, e2,
                                sizeof(e2));
    if (!c) {
        snprintf(err, errlen, "sentinel %u: %s", i + 1, e2);
        return rc;
    }
    if (u->sentinel_password_file[0] && (rc = sentinel_auth(c, u, i, err, errlen)) < 0) {
        redis_conn_close(c);
        return rc;
    }
    const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", u->service};
    redisReply *rep = NULL;
    rc = run(c, 3, argv, &rep, e2, sizeof(e2));
    if (rc < 0) {
        snprintf(err, errlen, "sentinel %u (%s:%u): %s", i + 1, u->sentinel_host[i],
                 u->sentinel_port[i], e2);
    } else if (rep->type == REDIS_REPLY_NIL) {
        snprintf(err, errlen, "sentinel %u (%s:%u) watches no primary named \"%s\"", i + 1,
                 u->sentinel_host[i], u->sentinel_port[i], u->service);
        rc = -ENOENT;
    } else if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "sentinel %u (%s:%u) answered: %.*s", i + 1, u->sentinel_host[i],
                 u->sentinel_port[i], (int)rep->len, rep->str);
        rc = -EIO;
    } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
               rep->element[0]->type != REDIS_REPLY_STRING ||
               rep->element[1]->type != REDIS_REPLY_STRING) {
        snprintf(err, errlen, "sentinel %u (%s:%u): a reply that is not [host, port]", i + 1,
                 u->sentinel_host[i], u->sentinel_port[i]);
        rc = -EPROTO;
    } else {
        char why[128];
        rc = lease_primary_parse(rep->element[0]->str, rep->element[0]->len,
                                 rep->element[1]->str, rep->element[1]->len, host, hostlen, port,
                                 why, sizeof(why));
        if (rc < 0)
            snprintf(err, errlen, "sentinel %u (%s:%u): %s", i + 1, u->sentinel_host[i],
                     u->sentinel_port[i], why);
    }
    if (rep)
        freeReplyObject(rep);
    redis_conn_close(c);
    return rc;
}

/* The connection is to a primary (ROLE's first element): 0, else -EAGAIN
 * (a sentinel's stale answer: a replica, or a demoted primary). */
static int check_primary(struct lease_redis *r, const char *host, uint16_t port, char *err,
                         size_t errlen)
{
    const char *argv[1] = {"ROLE"};
    redisReply *rep = NULL;
    char why[384];
    int rc = run(r->c, 1, argv, &rep, why, sizeof(why));
    if (rc < 0) {
        snprintf(err, errlen, "ROLE at %s:%u: %s", host, port, why);
    } else if (rep->type == REDIS_REPLY_ERROR) {
        rc = store_error("ROLE", rep, err, errlen);
    } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 ||
               rep->element[0]->type != REDIS_REPLY_STRING ||
               strcmp(rep->element[0]->str, "master") != 0) {
        snprintf(err, errlen, "%s:%u, named by the sentinels, is not a primary (yet)", host, port);
        rc = -EAGAIN;
    }
    if (rep)
        freeReplyObject(rep);
    return rc;
}

static int connect_store(struct lease_redis *r, char *err, size_t errlen)
{
    if (r->c)
        return 0;
    const struct lease_url *u = &r->base.u;
    int rc = 0;
    if (!u->nsentinels) {
        if (!(r->c = dial(r, u->host, u->port, &rc, err, errlen)))
            return rc;
        return authenticate(r, err, errlen);
    }
    /* the sentinels in turn, from the one that answered last */
    unsigned first = r->sentinel;
    for (unsigned k = 0; k < u->nsentinels; k++) {
        unsigned i = (first + k) % u->nsentinels;
        char host[NET_TCP_HOST_MAX];
        uint16_t port = 0;
        if ((rc = ask_sentinel(r, i, host, sizeof(host), &port, err, errlen)) < 0)
            continue;
        r->sentinel = i;
        if (!(r->c = dial(r, host, port, &rc, err, errlen)))
            continue; /* a stale answer (a dead primary): the next sentinel may know better */
        if ((rc = authenticate(r, err, errlen)) < 0)
            return rc;
        if ((rc = check_primary(r, host, port, err, errlen)) < 0) {
            drop(r);
            continue;
        }
        return 0;
    }
    return rc < 0 ? rc : -ECONNREFUSED; /* err: the last sentinel's */
}

/* Runs argv; a reply of the wanted type, or NULL with err and *rc set (the
 * connection dropped when it broke). */
static redisReply *command(struct lease_redis *r, int argc, const char **argv, int want,
                           int *rc, char *err, size_t errlen)
{
    if ((*rc = connect_store(r, err, errlen)) < 0)
        return NULL;
    redisReply *rep = NULL;
    char why[384];
    if ((*rc = run(r->c, argc, argv, &rep, why, sizeof(why))) < 0) {
        *rc = lost(r, argv[0], *rc, why, err, errlen);
        return NULL;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        *rc = store_error(argv[0], rep, err, errlen);
        freeReplyObject(rep);
        if (r->base.u.nsentinels)
            drop(r); /* READONLY, a demoted primary: ask the sentinels again */
        return NULL;
    }
    if (rep->type != want) {
        snprintf(err, errlen, "%s: a reply of type %d where %d was expected", argv[0],
                 rep->type, want);
        freeReplyObject(rep);
        *rc = -EPROTO;
        return NULL;
    }
    *rc = 0;
    return rep;
}

/* {taken, value}: 1 / 0 with *out parsed (epoch 0 for an empty value), or
 * < 0. */
static int taken_value(redisReply *rep, struct lease_holder *out, char *err, size_t errlen)
{
    int rc = -EPROTO;
    if (rep->elements != 2 || rep->element[0]->type != REDIS_REPLY_INTEGER ||
        rep->element[1]->type != REDIS_REPLY_STRING ||
        (rep->element[0]->integer != 0 && rep->element[0]->integer != 1)) {
        snprintf(err, errlen, "EVAL: the script's reply is not {0|1, value}");
    } else if (rep->element[1]->len == 0 && rep->element[0]->integer == 0) {
        memset(out, 0, sizeof(*out));
        rc = 0;
    } else if (lease_value_parse(rep->element[1]->str, rep->element[1]->len, out, err,
                                 errlen) == 0) {
        rc = (int)rep->element[0]->integer;
    }
    freeReplyObject(rep);
    return rc;
}

static int eval(struct lease_redis *r, const char *script, const char *a1, const char *a2,
                const char *a3, const char *a4, struct lease_holder *out, char *err,
                size_t errlen)
{
    const char *argv[9] = {"EVAL", script, "2", r->k_leader, r->k_epoch, a1, a2, a3, a4};
    int argc = 5 + (a1 != NULL) + (a2 != NULL) + (a3 != NULL) + (a4 != NULL);
    int rc;
    /* redis+sentinel: a write asks the sentinels again.  A connection kept
     * from an earlier call may be to a primary they have replaced since,
     * which still answers as one: stopped together with this process (one
     * paused machine), it is demoted only seconds after it is back, and a
     * write there could make a second holder. */
    if (r->base.u.nsentinels)
        drop(r);
    redisReply *rep = command(r, argc, argv, out ? REDIS_REPLY_ARRAY : REDIS_REPLY_INTEGER, &rc,
                              err, errlen);
    if (!rep)
        return rc;
    if (!out) {
        freeReplyObject(rep);
        return 0;
    }
    return taken_value(rep, out, err, errlen);
}

static int r_acquire(struct lease *l, const char *address, const char *owner, uint64_t ttl_ms,
                     uint64_t min_epoch, struct lease_holder *out, char *err, size_t errlen)
{
    struct lease_holder probe = {.epoch = 1};
    snprintf(probe.address, sizeof(probe.address), "%s", address);
    snprintf(probe.owner, sizeof(probe.owner), "%s", owner);
    char v[256], ttl[24], me[24];
    if (strlen(address) >= sizeof(probe.address) || strlen(owner) >= sizeof(probe.owner) ||
        lease_value_format(&probe, v, sizeof(v)) < 0 ||
        lease_value_parse(v, strlen(v), &probe, err, errlen) < 0) {
        snprintf(err, errlen, "acquire: address \"%s\" or owner \"%s\" cannot be published",
                 address, owner);
        return -EINVAL;
    }
    snprintf(ttl, sizeof(ttl), "%" PRIu64, ttl_ms);
    snprintf(me, sizeof(me), "%" PRIu64, min_epoch);
    return eval(to_redis(l), acquire_lua, address, owner, ttl, me, out, err, errlen);
}

static int r_renew(struct lease *l, const struct lease_holder *mine, uint64_t ttl_ms,
                   struct lease_holder *out, char *err, size_t errlen)
{
    char v[256], ttl[24], e[24];
    if (lease_value_format(mine, v, sizeof(v)) < 0) {
        snprintf(err, errlen, "renew: the value is too long");
        return -EINVAL;
    }
    snprintf(ttl, sizeof(ttl), "%" PRIu64, ttl_ms);
    snprintf(e, sizeof(e), "%" PRIu64, mine->epoch);
    return eval(to_redis(l), renew_lua, v, ttl, e, NULL, out, err, errlen);
}

static int r_release(struct lease *l, const struct lease_holder *mine, char *err, size_t errlen)
{
    char v[256];
    if (lease_value_format(mine, v, sizeof(v)) < 0) {
        snprintf(err, errlen, "release: the value is too long");
        return -EINVAL;
    }
    return eval(to_redis(l), release_lua, v, NULL, NULL, NULL, NULL, err, errlen);
}

static int r_leader(struct lease *l, struct lease_holder *out, char *err, size_t errlen)
{
    struct lease_redis *r = to_redis(l);
    const char *argv[2] = {"GET", r->k_leader};
    int rc;
    if ((rc = connect_store(r, err, errlen)) < 0)
        return rc;
    redisReply *rep = NULL;
    char why[384];
    if ((rc = run(r->c, 2, argv, &rep, why, sizeof(why))) < 0)
        return lost(r, "GET", rc, why, err, errlen);
    if (rep->type == REDIS_REPLY_NIL) {
        rc = 0;
    } else if (rep->type == REDIS_REPLY_STRING) {
        rc = lease_value_parse(rep->str, rep->len, out, err, errlen) < 0 ? -EPROTO : 1;
    } else if (rep->type == REDIS_REPLY_ERROR) {
        rc = store_error("GET", rep, err, errlen);
        if (r->base.u.nsentinels)
            drop(r);
    } else {
        snprintf(err, errlen, "GET: a reply of type %d where a string was expected", rep->type);
        rc = -EPROTO;
    }
    freeReplyObject(rep);
    return rc;
}

static void r_close(struct lease *l)
{
    struct lease_redis *r = to_redis(l);
    drop(r);
    redis_tls_free(r->tls);
    free(r);
}

static const struct lease_ops redis_ops = {
    .close = r_close, .acquire = r_acquire, .renew = r_renew, .release = r_release,
    .leader = r_leader,
};

int lease_redis_open(const struct lease_url *u, struct lease **out, char *err, size_t errlen)
{
    struct lease_redis *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    if (u->tls) {
        int rc = redis_tls_new(u->tls_ca_file, u->tls_cert_file, u->tls_key_file,
                               u->tls_server_name, &r->tls, err, errlen);
        if (rc < 0) {
            free(r);
            return rc;
        }
    }
    r->base.ops = &redis_ops;
    snprintf(r->k_leader, sizeof(r->k_leader), "umbp:%s:leader", u->cluster);
    snprintf(r->k_epoch, sizeof(r->k_epoch), "umbp:%s:epoch", u->cluster);
    *out = &r->base;
    return 0;
}
