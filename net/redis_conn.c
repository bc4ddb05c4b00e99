/*
 * redis_conn.c - one bounded, blocking connection to Redis, plain or TLS
 * (redis_conn.h).  The socket is non-blocking and every wait is a poll()
 * against a deadline; hiredis formats commands (redisFormatCommandArgv)
 * and parses replies (redisReader); OpenSSL, where built, does TLS over a
 * BIO of ours that sends with MSG_NOSIGNAL.
 *
 * Threads: one caller per connection; a struct redis_tls is read-only
 * after redis_tls_new (an SSL_CTX may be shared by threads).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef UMBP_HAVE_OPENSSL
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

#include "redis_conn.h"

#define NAME_MAX_ 256
#define PATH_MAX_ 256

struct redis_tls {
#ifdef UMBP_HAVE_OPENSSL
    SSL_CTX *ctx;
#endif
    char ca_file[PATH_MAX_];       /* "": the system's trust store */
    char cert_file[PATH_MAX_];     /* "": no client certificate */
    char server_name[NAME_MAX_];   /* "": the host dialled */
};

struct redis_conn {
    int fd;
    uint64_t timeout_ms;
    redisReader *reader;
    struct redis_reader_bound bound;
    const struct redis_tls *tls;   /* NULL: plain */
#ifdef UMBP_HAVE_OPENSSL
    SSL *ssl;
#endif
    bool broken;                   /* an error: no more commands */
    bool replied;                  /* a reply came (for the hints below) */
    int first;                     /* the first byte read, -1: none yet */
    char peer[NAME_MAX_ + 8];      /* host:port dialled */
    char name[NAME_MAX_];          /* TLS: the name verified */
};

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Waits until fd is ready for events or the deadline passes: 0 (ready, or
 * an error the next call on fd reports), -ETIMEDOUT, or -errno. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        uint64_t left = deadline - now;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -errno;
    }
}

bool redis_tls_built(void)
{
#ifdef UMBP_HAVE_OPENSSL
    return true;
#else
    return false;
#endif
}

/* ---- TLS ------------------------------------------------------------------------------ */

#ifdef UMBP_HAVE_OPENSSL
/* A socket BIO that never raises SIGPIPE (OpenSSL's writes with write()). */
static int bio_write(BIO *b, const char *buf, int len)
{
    int fd = (int)(intptr_t)BIO_get_data(b);
    BIO_clear_retry_flags(b);
    ssize_t n = send(fd, buf, (size_t)len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)n;
}

static int bio_read(BIO *b, char *buf, int len)
{
    int fd = (int)(intptr_t)BIO_get_data(b);
    BIO_clear_retry_flags(b);
    ssize_t n = recv(fd, buf, (size_t)len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_read(b);
    return (int)n;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b, (void)num, (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static BIO_METHOD *g_bio;

static void bio_method_make(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                                 "umbp redis socket");
    if (m && BIO_meth_set_write(m, bio_write) && BIO_meth_set_read(m, bio_read) &&
        BIO_meth_set_ctrl(m, bio_ctrl))
        g_bio = m;
    else if (m)
        BIO_meth_free(m);
}

static BIO *bio_for(int fd)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, bio_method_make);
    BIO *b = g_bio ? BIO_new(g_bio) : NULL;
    if (b) {
        BIO_set_data(b, (void *)(intptr_t)fd);
        BIO_set_init(b, 1);
    }
    return b;
}

/* OpenSSL's reason for the last error on this thread, or `dflt`. */
static const char *ssl_reason(unsigned long e, const char *dflt)
{
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : dflt;
}

/* No passphrase: an encrypted key fails to load (never a prompt). */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return 0;
}

/* path can be opened and is a regular file; a key (secret) must not be
 * open to group or others.  0, or -errno with err naming the parameter. */
static int check_file(const char *param, const char *path, bool secret, char *err,
                      size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s %s: %s", param, path, strerror(e));
        return -e;
    }
    struct stat st;
    const char *bad = fstat(fd, &st) < 0             ? "cannot stat it"
                      : !S_ISREG(st.st_mode)         ? "not a regular file"
                      : secret && (st.st_mode & 077) ? "group or others may use it (chmod 600)"
                                                     : NULL;
    close(fd);
    if (bad) {
        snprintf(err, errlen, "%s %s: %s", param, path, bad);
        return bad[0] == 'n' ? -EINVAL : -EACCES;
    }
    return 0;
}
#endif

int redis_tls_new(const char *ca_file, const char *cert_file, const char *key_file,
                  const char *server_name, struct redis_tls **out, char *err, size_t errlen)
{
    ca_file = ca_file ? ca_file : "";
    cert_file = cert_file ? cert_file : "";
    key_file = key_file ? key_file : "";
    server_name = server_name ? server_name : "";
#ifndef UMBP_HAVE_OPENSSL
    (void)out;
    snprintf(err, errlen, "TLS (rediss://) is not in this build: it found no OpenSSL; install "
             "libssl-dev (scripts/setup.sh) and rebuild");
    return -ENOTSUP;
#else
    if (!cert_file[0] != !key_file[0]) {
        snprintf(err, errlen, "tls_cert_file and tls_key_file go together: give both or neither");
        return -EINVAL;
    }
    if (strlen(ca_file) >= PATH_MAX_ || strlen(cert_file) >= PATH_MAX_ ||
        strlen(key_file) >= PATH_MAX_ || strlen(server_name) >= NAME_MAX_) {
        snprintf(err, errlen, "a TLS file name or tls_server_name is too long");
        return -ENAMETOOLONG;
    }
    int rc;
    if ((ca_file[0] && (rc = check_file("tls_ca_file", ca_file, false, err, errlen)) < 0) ||
        (cert_file[0] && (rc = check_file("tls_cert_file", cert_file, false, err, errlen)) < 0) ||
        (key_file[0] && (rc = check_file("tls_key_file", key_file, true, err, errlen)) < 0))
        return rc;
    struct redis_tls *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    snprintf(t->ca_file, sizeof(t->ca_file), "%s", ca_file);
    snprintf(t->cert_file, sizeof(t->cert_file), "%s", cert_file);
    snprintf(t->server_name, sizeof(t->server_name), "%s", server_name);
    ERR_clear_error();
    rc = -EINVAL;
    SSL_CTX *ctx = t->ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, errlen, "TLS: cannot make a context: %s",
                 ssl_reason(ERR_get_error(), "out of memory"));
        rc = -ENOMEM;
        goto fail;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    if (ca_file[0] ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1
                   : SSL_CTX_set_default_verify_paths(ctx) != 1) {
        if (ca_file[0])
            snprintf(err, errlen, "tls_ca_file %s: no CA certificate in it (PEM) (%s)", ca_file,
                     ssl_reason(ERR_get_error(), "?"));
        else
            snprintf(err, errlen, "TLS: the system's trust store cannot be read (%s): name a "
                     "CA with tls_ca_file", ssl_reason(ERR_get_error(), "?"));
        goto fail;
    }
    if (cert_file[0]) {
        if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
            snprintf(err, errlen, "tls_cert_file %s: no certificate in it (PEM) (%s)", cert_file,
                     ssl_reason(ERR_get_error(), "?"));
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1) {
            unsigned long e, mismatch = 0, first = ERR_peek_error();
            while ((e = ERR_get_error()) != 0)
                if (ERR_GET_LIB(e) == ERR_LIB_X509 &&
                    ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH)
                    mismatch = e;
            if (mismatch)
                snprintf(err, errlen, "tls_key_file %s is not the key of tls_cert_file %s (%s)",
                         key_file, cert_file, ssl_reason(mismatch, "?"));
            else
                snprintf(err, errlen, "tls_key_file %s: no private key can be read from it "
                         "(PEM, not encrypted) (%s)", key_file, ssl_reason(first, "?"));
            goto fail;
        }
        if (SSL_CTX_check_private_key(ctx) != 1) {
            snprintf(err, errlen, "tls_key_file %s is not the key of tls_cert_file %s (%s)",
                     key_file, cert_file, ssl_reason(ERR_get_error(), "?"));
            goto fail;
        }
    }
    ERR_clear_error();
    *out = t;
    return 0;
fail:
    ERR_clear_error();
    redis_tls_free(t);
    return rc;
#endif
}

void redis_tls_free(struct redis_tls *t)
{
    if (!t)
        return;
#ifdef UMBP_HAVE_OPENSSL
    SSL_CTX_free(t->ctx);
#endif
    free(t);
}

#ifdef UMBP_HAVE_OPENSSL
/* Alerts by which a server refuses our client certificate (or its
 * absence). */
static bool client_cert_refused(int reason)
{
    switch (reason) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
        return true;
    default:
        return false;
    }
}

/* A failed TLS call (SSL_get_error said sslerr, errno was e): the code,
 * with err "<what>: <why>". */
static int tls_failure(struct redis_conn *c, const char *what, int sslerr, int e,
                       bool handshake, char *err, size_t errlen)
{
    const struct redis_tls *t = c->tls;
    unsigned long ec = ERR_peek_last_error();
    int reason = ERR_GET_LIB(ec) == ERR_LIB_SSL ? ERR_GET_REASON(ec) : 0;
    int rc;
    if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        long v = SSL_get_verify_result(c->ssl);
        if (v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH)
            snprintf(err, errlen, "%s: certificate verify failed (%s): the server's certificate "
                     "is not for \"%s\"%s", what, X509_verify_cert_error_string(v), c->name,
                     t->server_name[0] ? " (tls_server_name)"
                                       : " (the host dialled; tls_server_name=NAME names the "
                                         "one its certificate has)");
        else
            snprintf(err, errlen, "%s: certificate verify failed (%s) against %s%s", what,
                     X509_verify_cert_error_string(v),
                     t->ca_file[0] ? "tls_ca_file " : "the system's trust store (no tls_ca_file)",
                     t->ca_file);
        rc = -EKEYREJECTED;
    } else if (reason && client_cert_refused(reason)) {
        if (t->cert_file[0])
            snprintf(err, errlen, "%s: the server refused our client certificate (%s): it does "
                     "not accept tls_cert_file %s", what, ssl_reason(ec, "?"), t->cert_file);
        else
            snprintf(err, errlen, "%s: the server refused the connection (%s): it wants a "
                     "client certificate: give tls_cert_file and tls_key_file", what,
                     ssl_reason(ec, "?"));
        rc = -EACCES;
    } else if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
               reason == SSL_R_HTTP_REQUEST) {
        snprintf(err, errlen, "%s: %s: the server does not speak TLS there (a plain port? "
                 "rediss:// needs Redis's tls-port)", what, ssl_reason(ec, "?"));
        rc = -EPROTO;
    } else if (sslerr == SSL_ERROR_ZERO_RETURN ||
               reason == SSL_R_UNEXPECTED_EOF_WHILE_READING ||
               (sslerr == SSL_ERROR_SYSCALL && !ec)) {
        const char *hint = handshake ? " (is that port Redis's tls-port? rediss:// needs it)"
                                     : "";
        if (sslerr == SSL_ERROR_SYSCALL && e && e != EPIPE)
            snprintf(err, errlen, "%s: %s%s", what, strerror(e), hint);
        else
            snprintf(err, errlen, "%s: the server closed the connection%s", what, hint);
        rc = -ECONNRESET;
    } else {
        snprintf(err, errlen, "%s: %s", what, ssl_reason(ec, "TLS error"));
        rc = -EPROTO;
    }
    ERR_clear_error();
    return rc;
}

static int tls_handshake(struct redis_conn *c, const char *host, char *err, size_t errlen)
{
    const struct redis_tls *t = c->tls;
    char what[NAME_MAX_ + 40];
    snprintf(what, sizeof(what), "TLS handshake with %s", c->peer);
    ERR_clear_error();
    BIO *b = NULL;
    if (!(c->ssl = SSL_new(t->ctx)) || !(b = bio_for(c->fd))) {
        snprintf(err, errlen, "%s: out of memory", what);
        ERR_clear_error();
        return -ENOMEM;
    }
    SSL_set_bio(c->ssl, b, b);
    snprintf(c->name, sizeof(c->name), "%s", t->server_name[0] ? t->server_name : host);
    unsigned char ip[16];
    bool is_ip = inet_pton(AF_INET, c->name, ip) == 1 || inet_pton(AF_INET6, c->name, ip) == 1;
    bool ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), c->name) == 1
                    : SSL_set_tlsext_host_name(c->ssl, c->name) == 1 &&
                          SSL_set1_host(c->ssl, c->name) == 1;
    if (!ok) {
        snprintf(err, errlen, "%s: cannot verify the name \"%s\" (%s)", what, c->name,
                 ssl_reason(ERR_get_error(), "?"));
        ERR_clear_error();
        return -EINVAL;
    }
    SSL_set_hostflags(c->ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    uint64_t deadline = now_ms() + c->timeout_ms;
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_connect(c->ssl);
        if (r == 1)
            return 0;
        int e = errno, s = SSL_get_error(c->ssl, r);
        if (s != SSL_ERROR_WANT_READ && s != SSL_ERROR_WANT_WRITE)
            return tls_failure(c, what, s, e, true, err, errlen);
        int w = wait_fd(c->fd, s == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
        if (w == -ETIMEDOUT) {
            snprintf(err, errlen, "%s: no answer within the timeout (%" PRIu64 " ms; is that "
                     "port Redis's tls-port?)", what, c->timeout_ms);
            return -ETIMEDOUT;
        }
        if (w < 0) {
            snprintf(err, errlen, "%s: poll: %s", what, strerror(-w));
            return -ECONNRESET;
        }
    }
}
#endif

/* ---- the connection --------------------------------------------------------------------- */

static int tcp_connect(struct redis_conn *c, const char *host, uint16_t port, char *err,
                       size_t errlen)
{
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV},
                    *ai = NULL;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g) {
        snprintf(err, errlen, "connect %s: %s", c->peer,
                 g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return -ECONNREFUSED;
    }
    uint64_t deadline = now_ms() + c->timeout_ms;
    int last = EADDRNOTAVAIL;
    bool timed_out = false;
    for (struct addrinfo *a = ai; a && !timed_out; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        int e = 0;
        if (connect(fd, a->ai_addr, a->ai_addrlen) < 0) {
            e = errno;
            if (e == EINPROGRESS) {
                int w = wait_fd(fd, POLLOUT, deadline);
                socklen_t l = sizeof(e);
                if (w == -ETIMEDOUT)
                    timed_out = true;
                else if (w < 0)
                    e = -w;
                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l) < 0)
                    e = errno;
            }
        }
        if (!e && !timed_out) {
            c->fd = fd;
            freeaddrinfo(ai);
            return 0;
        }
        last = e;
        close(fd);
    }
    freeaddrinfo(ai);
    if (timed_out) {
        snprintf(err, errlen, "connect %s: no answer within the timeout (%" PRIu64 " ms)",
                 c->peer, c->timeout_ms);
        return -ETIMEDOUT;
    }
    snprintf(err, errlen, "connect %s: %s", c->peer, strerror(last));
    return -ECONNREFUSED;
}

/* hiredis 1.x counts an array's elements in a size_t, 0.14 in an int */
#if HIREDIS_MAJOR >= 1
typedef size_t redis_count_t;
#else
typedef int redis_count_t;
#endif

/* hiredis's createArray, refusing (NULL: the reader fails) a count past
 * REDIS_CONN_ARRAY_MAX before it allocates that many element pointers. */
static void *bounded_array(const redisReadTask *task, redis_count_t n)
{
    struct redis_reader_bound *b = task->privdata;
    if ((long long)n < 0 || (long long)n > REDIS_CONN_ARRAY_MAX) {
        b->too_many = (long long)n;
        return NULL;
    }
    return b->hfns->createArray(task, n);
}

void redis_reader_bound(redisReader *r, struct redis_reader_bound *b)
{
    b->hfns = r->fn;
    b->fns = *r->fn;
    b->fns.createArray = bounded_array;
    b->too_many = 0;
    r->fn = &b->fns;
    r->privdata = b;
}

int redis_conn_dial(const char *host, uint16_t port, const struct redis_tls *tls,
                    uint64_t timeout_ms, struct redis_conn **out, char *err, size_t errlen)
{
    struct redis_conn *c = calloc(1, sizeof(*c));
    if (!c || !(c->reader = redisReaderCreate())) {
        free(c);
        snprintf(err, errlen, "connect: out of memory");
        return -ENOMEM;
    }
    redis_reader_bound(c->reader, &c->bound);
    c->fd = -1;
    c->first = -1;
    c->tls = tls;
    c->timeout_ms = timeout_ms ? timeout_ms : 1000;
    snprintf(c->peer, sizeof(c->peer), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
    int rc = tcp_connect(c, host, port, err, errlen);
#ifdef UMBP_HAVE_OPENSSL
    if (rc == 0 && tls)
        rc = tls_handshake(c, host, err, errlen);
#else
    if (rc == 0 && tls) {
        snprintf(err, errlen, "TLS (rediss://) is not in this build");
        rc = -ENOTSUP;
    }
#endif
    if (rc < 0) {
        c->broken = true;
        redis_conn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* A plain connection that failed before its first reply: Redis's TLS port
 * closes or resets one that speaks plain text. */
static const char *plain_hint(const struct redis_conn *c)
{
    return !c->tls && !c->replied ? " (before any reply: is that Redis's tls-port? rediss:// "
                                    "speaks TLS)"
                                  : "";
}

#ifdef UMBP_HAVE_OPENSSL
/* A write that failed on a TLS connection.  A server that refuses our
 * client certificate (TLS 1.3: after our handshake ended) sends an alert
 * and closes; if it closes with our bytes unread, its kernel resets the
 * connection, and our write fails with ECONNRESET or EPIPE before we read
 * the alert, which is still in our socket (data before a reset is kept):
 * read it, to say why. */
static int tls_write_failure(struct redis_conn *c, int s, int e, char *err, size_t errlen)
{
    if (s == SSL_ERROR_SYSCALL && !c->replied) {
        char tmp[256];
        ERR_clear_error();
        int n = SSL_read(c->ssl, tmp, sizeof(tmp));
        unsigned long ec = ERR_peek_last_error();
        if (n <= 0 && SSL_get_error(c->ssl, n) == SSL_ERROR_SSL &&
            ERR_GET_LIB(ec) == ERR_LIB_SSL && client_cert_refused(ERR_GET_REASON(ec)))
            return tls_failure(c, "TLS", SSL_ERROR_SSL, 0, false, err, errlen);
        ERR_clear_error();
    }
    return tls_failure(c, "TLS", s, e, false, err, errlen);
}
#endif

/* Waits until the socket is ready for `want` (POLLIN, POLLOUT) by the
 * deadline: 0, -ETIMEDOUT or -ECONNRESET with err set. */
static int wait_io(const struct redis_conn *c, int want, uint64_t deadline, char *err,
                   size_t errlen)
{
    int w = wait_fd(c->fd, (short)want, deadline);
    if (w == -ETIMEDOUT) {
        snprintf(err, errlen, "no reply within the timeout");
        return -ETIMEDOUT;
    }
    if (w < 0) {
        snprintf(err, errlen, "poll: %s", strerror(-w));
        return -ECONNRESET;
    }
    return 0;
}

/* Writes all of buf by the deadline. */
static int conn_write(struct redis_conn *c, const char *buf, size_t len, uint64_t deadline,
                      char *err, size_t errlen)
{
    size_t off = 0;
    while (off < len) {
        int want = POLLOUT;
#ifdef UMBP_HAVE_OPENSSL
        if (c->ssl) {
            ERR_clear_error();
            errno = 0;
            size_t chunk = len - off > INT_MAX ? INT_MAX : len - off;
            int n = SSL_write(c->ssl, buf + off, (int)chunk);
            if (n > 0) {
                off += (size_t)n;
                continue;
            }
            int e = errno, s = SSL_get_error(c->ssl, n);
            if (s != SSL_ERROR_WANT_READ && s != SSL_ERROR_WANT_WRITE)
                return tls_write_failure(c, s, e, err, errlen);
            want = s == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        } else
#endif
        {
            ssize_t n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL);
            if (n > 0) {
                off += (size_t)n;
                continue;
            }
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                snprintf(err, errlen, "%s%s", strerror(errno), plain_hint(c));
                return -ECONNRESET;
            }
        }
        int w = wait_io(c, want, deadline, err, errlen);
        if (w < 0)
            return w;
    }
    return 0;
}

/* Reads what is there (at least a byte) by the deadline: its length. */
static int conn_read(struct redis_conn *c, char *buf, size_t cap, uint64_t deadline, char *err,
                     size_t errlen)
{
    for (;;) {
        int want = POLLIN;
#ifdef UMBP_HAVE_OPENSSL
        if (c->ssl) {
            ERR_clear_error();
            errno = 0;
            int n = SSL_read(c->ssl, buf, cap > INT_MAX ? INT_MAX : (int)cap);
            if (n > 0)
                return n;
            int e = errno, s = SSL_get_error(c->ssl, n);
            if (s != SSL_ERROR_WANT_READ && s != SSL_ERROR_WANT_WRITE)
                return tls_failure(c, "TLS", s, e, false, err, errlen);
            want = s == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        } else
#endif
        {
            ssize_t n = recv(c->fd, buf, cap, 0);
            if (n > 0)
                return (int)n;
            if (n == 0) {
                snprintf(err, errlen, "the server closed the connection%s", plain_hint(c));
                return -ECONNRESET;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                snprintf(err, errlen, "%s%s", strerror(errno), plain_hint(c));
                return -ECONNRESET;
            }
        }
        int w = wait_io(c, want, deadline, err, errlen);
        if (w < 0)
            return w;
    }
}

int redis_conn_command(struct redis_conn *c, int argc, const char **argv, const size_t *argvlen,
                       redisReply **reply, char *err, size_t errlen)
{
    *reply = NULL;
    if (c->broken) {
        snprintf(err, errlen, "the connection failed before");
        return -ECONNRESET;
    }
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    if (len < 0) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    uint64_t deadline = now_ms() + c->timeout_ms;
    int rc = conn_write(c, cmd, (size_t)len, deadline, err, errlen);
    redisFreeCommand(cmd);
    size_t total = 0;
    char buf[4096];
    while (rc == 0) {
        void *rep = NULL;
        if (redisReaderGetReply(c->reader, &rep) != REDIS_OK) {
            if (c->bound.too_many) {
                snprintf(err, errlen, "a reply array of %lld elements (at most %d)",
                         c->bound.too_many, REDIS_CONN_ARRAY_MAX);
                rc = -EPROTO;
                break;
            }
            /* the first byte of a TLS record (an alert, a handshake) */
            bool tlsish = !c->tls && !c->replied && (c->first == 0x15 || c->first == 0x16);
            snprintf(err, errlen, "not Redis's protocol (%s)%s", c->reader->errstr,
                     tlsish ? ": a TLS record (is that Redis's tls-port? rediss:// speaks TLS)"
                            : "");
            rc = -EPROTO;
            break;
        }
        if (rep) {
            c->replied = true;
            *reply = rep;
            return 0;
        }
        int n = conn_read(c, buf, sizeof(buf), deadline, err, errlen);
        if (n < 0) {
            rc = n;
            break;
        }
        if (c->first < 0)
            c->first = (unsigned char)buf[0];
        if ((total += (size_t)n) > REDIS_CONN_REPLY_MAX) {
            snprintf(err, errlen, "a reply of more than %u bytes", REDIS_CONN_REPLY_MAX);
            rc = -EPROTO;
            break;
        }
        if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK) {
            snprintf(err, errlen, "out of memory");
            rc = -ENOMEM;
        }
    }
    c->broken = true;
    return rc;
}

const char *redis_conn_peer(const struct redis_conn *c) { return c->peer; }

bool redis_conn_is_tls(const struct redis_conn *c) { return c->tls != NULL; }

void redis_conn_close(struct redis_conn *c)
{
    if (!c)
        return;
#ifdef UMBP_HAVE_OPENSSL
    if (c->ssl) {
        if (!c->broken) /* close_notify, best effort: the socket never blocks */
            SSL_shutdown(c->ssl);
        SSL_free(c->ssl); /* frees the BIO */
        ERR_clear_error();
    }
#endif
    if (c->fd >= 0)
        close(c->fd);
    if (c->reader)
        redisReaderFree(c->reader);
    free(c);
}
