/*
 * scrape.h - /metrics as Prometheus reads it, for tests (header only): one
 * HTTP/1.0 request over a plain TCP socket to an IPv4 or IPv6 literal,
 * read to the end (the server closes the connection after its answer),
 * every step bounded; and the value of one sample in the text format.
 * Used by test_metrics (umbp-server), test_master and test_failover
 * (umbp-master).
 *
 * Nothing here asserts: a test that scrapes a process it stopped or killed
 * gets an error and decides; the callers that need an answer assert on it.
 */
#ifndef UMBP_TEST_SCRAPE_H
#define UMBP_TEST_SCRAPE_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

struct tu_http_reply {
    int status;
    char content_type[128];
    char *body; /* NUL-terminated, the headers left out; free() it */
};

/* A step of tu_http failed (errno says why): the error, all freed. */
static inline int tu_http_failed(int fd, char *buf, const char *step, const char *address,
                                 unsigned port, char *err, size_t errlen)
{
    int e = errno;
    snprintf(err, errlen, "%s %s port %u: %s", step, address, port, strerror(e));
    free(buf);
    close(fd);
    return -e;
}

/* Sends `request` to address:port and reads the whole answer, each step
 * (connect, send, every read) bounded by timeout_ms: 0 and *out, or
 * -errno (-EPROTO: not an HTTP answer) with why in err (may be NULL). */
static inline int tu_http(const char *address, unsigned port, const char *request,
                          int timeout_ms, struct tu_http_reply *out, char *err, size_t errlen)
{
    struct sockaddr_storage ss = {0};
    socklen_t len;
    int family = strchr(address, ':') ? AF_INET6 : AF_INET, ok;
    memset(out, 0, sizeof(*out));
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        ok = inet_pton(AF_INET6, address, &a->sin6_addr);
        len = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        ok = inet_pton(AF_INET, address, &a->sin_addr);
        len = sizeof(*a);
    }
    if (ok != 1) {
        snprintf(err, errlen, "%s is not an IP address", address);
        return -EINVAL;
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return tu_http_failed(fd, NULL, "socket for", address, port, err, errlen);
    /* SO_SNDTIMEO bounds the connect too */
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&ss, len) != 0)
        return tu_http_failed(fd, NULL, "connect to", address, port, err, errlen);
    size_t n = strlen(request);
    if (send(fd, request, n, MSG_NOSIGNAL) != (ssize_t)n)
        return tu_http_failed(fd, NULL, "send to", address, port, err, errlen);
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (got == cap)
            buf = realloc(buf, (cap *= 2) + 1);
        ssize_t r = recv(fd, buf + got, cap - got, 0);
        if (r < 0)
            return tu_http_failed(fd, buf, "read from", address, port, err, errlen);
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = 0;
    char *end = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*d %d", &out->status) != 1 || !end) {
        snprintf(err, errlen, "%s port %u: not an HTTP answer%s: %.200s", address, port,
                 end ? "" : " (no end of the headers)", buf);
        free(buf);
        return -EPROTO;
    }
    *end = 0;
    for (char *line = strstr(buf, "\r\n"); line; line = strstr(line + 2, "\r\n"))
        if (strncasecmp(line + 2, "Content-Type:", 13) == 0) {
            const char *v = line + 2 + 13;
            v += strspn(v, " ");
            snprintf(out->content_type, sizeof(out->content_type), "%.*s",
                     (int)strcspn(v, "\r"), v);
        }
    out->body = strdup(end + 4);
    free(buf);
    return 0;
}

/* GET /metrics of address:port: the body of a 200 answer (free() it), or
 * NULL with why in err (no answer within the bound, as from a stopped or
 * dead process, or another status). */
static inline char *tu_scrape(const char *address, unsigned port, int timeout_ms, char *err,
                              size_t errlen)
{
    struct tu_http_reply h;
    if (tu_http(address, port, "GET /metrics HTTP/1.0\r\n\r\n", timeout_ms, &h, err,
                errlen) < 0)
        return NULL;
    if (h.status != 200) {
        snprintf(err, errlen, "GET /metrics: status %d: %.200s", h.status, h.body);
        free(h.body);
        return NULL;
    }
    return h.body;
}

/* The value of the sample `series` (a name, with its labels if any) in a
 * scrape's body; -1 when it has none. */
static inline double tu_sample(const char *body, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

#endif /* UMBP_TEST_SCRAPE_H */
