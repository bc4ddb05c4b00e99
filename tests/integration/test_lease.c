/*
 * test_lease - the leader lease of umbp-master's high availability
 * (net/leader_lease.h) through its four calls, against a real redis-server
 * (tests/common/redis_fixture.h) that the tests also read and write
 * behind the lease's back (the leader and epoch keys), restart without
 * persistence (an empty Redis: lost data), kill and stop.
 *
 * Suites lease_url and lease_value need no Redis.  Suite lease skips,
 * saying why, without hiredis or redis-server.  Every wait is a bounded
 * loop on an outcome (the key expired, a call works again); durations of
 * failing calls are printed and bounded only generously (10x the timeout).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "leader_lease.h"
#include "redis_fixture.h"

#define ERRLEN 512

static bool has(const char *s, const char *part) { return strcasestr(s, part) != NULL; }

/* ---- URLs -------------------------------------------------------------------------- */

TestSuite(lease_url, .timeout = 30);

Test(lease_url, a_url_is_told_from_a_host_port)
{
    cr_assert(lease_is_url("redis://127.0.0.1:6379/prod"));
    cr_assert(lease_is_url("redis://10.0.0.5/c"));
    cr_assert_not(lease_is_url("127.0.0.1:7390"));
    cr_assert_not(lease_is_url("[::1]:7390"));
    cr_assert_not(lease_is_url("master.example.com:7390"));
    cr_assert_not(lease_is_url(""));
}

Test(lease_url, good_urls_parse)
{
    static const struct {
        const char *url, *host;
        uint16_t port;
        const char *cluster;
    } good[] = {
        {"redis://127.0.0.1:6379/prod", "127.0.0.1", 6379, "prod"},
        {"redis://10.0.0.5/c-1.x_y", "10.0.0.5", 6379, "c-1.x_y"},   /* default port */
        {"redis://[::1]:7000/c", "::1", 7000, "c"},                   /* IPv6 */
        {"redis://[fd00::5]/A9", "fd00::5", 6379, "A9"},
        {"redis://redis.example.com:6380/Cluster_2", "redis.example.com", 6380, "Cluster_2"},
        {"redis://h:1/"
         "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk", /* 63: the most */
         "h", 1, "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk"},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct lease_url u;
        char err[ERRLEN] = "";
        memset(&u, 0x5a, sizeof(u));
        int rc = lease_url_parse(good[i].url, "lease_url", &u, err, sizeof(err));
        cr_assert_eq(rc, 0, "%s: %d %s", good[i].url, rc, err);
        cr_assert_str_eq(u.scheme, "redis", "%s", good[i].url);
        cr_assert_str_eq(u.host, good[i].host, "%s", good[i].url);
        cr_assert_eq(u.port, good[i].port, "%s: port %u", good[i].url, u.port);
        cr_assert_str_eq(u.cluster, good[i].cluster, "%s", good[i].url);
    }
}

/* ?password_file=PATH[&user=NAME]: the URL names a file, never the password. */
Test(lease_url, query_parameters_parse_and_bad_ones_are_named)
{
    struct lease_url u;
    char err[ERRLEN] = "";
    cr_assert_eq(lease_url_parse("redis://10.0.0.5:6380/prod?password_file=/etc/umbp/redis.pw",
                                 "lease_url", &u, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(u.cluster, "prod");
    cr_assert_str_eq(u.password_file, "/etc/umbp/redis.pw");
    cr_assert_str_eq(u.user, "");
    cr_assert_eq(u.port, 6380);
    cr_assert_eq(lease_url_parse("redis+sentinel://s/m/c?sentinel_password_file=/sp", "lease_url",
                                 &u, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(u.sentinel_password_file, "/sp");
    cr_assert_str_eq(u.password_file, "");
    cr_assert_eq(lease_url_parse("redis://h/c?user=umbp&password_file=p", "lease_url", &u, err,
                                 sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(u.user, "umbp");
    cr_assert_str_eq(u.password_file, "p");
    cr_assert_str_eq(u.cluster, "c");
    static const struct {
        const char *url, *part;
    } bad[] = {
        {"redis://h/c?password=hunter2", "unknown parameter \"password\""},
        {"redis://h/c?password_file=", "password_file"},
        {"redis://h/c?password_file", "password_file"},
        {"redis://h/c?password_file=a&password_file=b", "twice"},
        {"redis://h/c?user=umbp", "user needs a password_file"},
        {"redis://h/c?password_file=a b", "printable"},
        {"redis://h/?password_file=a", "cluster"},
        {"redis://h/c?&", "unknown parameter"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = lease_url_parse(bad[i].url, "lease_url", &u, err, sizeof(err));
        cr_expect_eq(rc, -EINVAL, "'%s': %d (%s)", bad[i].url, rc, err);
        cr_expect(has(err, bad[i].part), "'%s': the error does not name '%s': '%s'", bad[i].url,
                  bad[i].part, err);
    }
}

/* redis+sentinel://h1[:p1],h2[:p2],.../<service>/<cluster>[?...] */
Test(lease_url, sentinel_urls)
{
    struct lease_url u;
    char err[ERRLEN] = "";
    cr_assert_eq(lease_url_parse("redis+sentinel://10.0.0.1,10.0.0.2:26380,[fd00::3]/mymaster/"
                                 "prod?password_file=/p", "lease_url", &u, err, sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(u.nsentinels, 3);
    cr_assert_str_eq(u.sentinel_host[0], "10.0.0.1");
    cr_assert_eq(u.sentinel_port[0], 26379, "the sentinels' default port");
    cr_assert_str_eq(u.sentinel_host[1], "10.0.0.2");
    cr_assert_eq(u.sentinel_port[1], 26380);
    cr_assert_str_eq(u.sentinel_host[2], "fd00::3");
    cr_assert_str_eq(u.service, "mymaster");
    cr_assert_str_eq(u.cluster, "prod");
    cr_assert_str_eq(u.password_file, "/p");
    cr_assert_eq(lease_url_parse("redis://10.0.0.1/prod", "lease_url", &u, err, sizeof(err)), 0);
    cr_assert_eq(u.nsentinels, 0, "a plain URL has no sentinels");
    static const struct {
        const char *url, *part;
    } bad[] = {
        {"redis+sentinel://h/prod", "service"},
        {"redis+sentinel://h//prod", "service"},
        {"redis+sentinel://h/m x/prod", "service"},
        {"redis+sentinel://h/m/", "cluster"},
        {"redis+sentinel://h,/m/c", "no host after the last ','"},
        {"redis+sentinel://h,,k/m/c", "no host"},
        {"redis+sentinel://h:0/m/c", "port"},
        {"redis+sentinel://a,b,c,d,e,f,g,h,i/m/c", "more than 8 sentinels"},
        {"redis+sentinel:///m/c", "host"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = lease_url_parse(bad[i].url, "lease_url", &u, err, sizeof(err));
        cr_expect_eq(rc, -EINVAL, "'%s': %d (%s)", bad[i].url, rc, err);
        cr_expect(has(err, bad[i].part), "'%s': the error does not name '%s': '%s'", bad[i].url,
                  bad[i].part, err);
    }
}

/* Each bad URL is -EINVAL, and err names the option and the bad part. */
Test(lease_url, bad_urls_are_refused_naming_the_bad_part)
{
    static const struct {
        const char *url, *part; /* `part`: what err must mention (case-insensitive) */
    } bad[] = {
        {"", "lease_url"},
        {"http://127.0.0.1:6379/c", "http"},
        {"etcd2://127.0.0.1:2379/c", "etcd2"},
        {"redis:/127.0.0.1:6379/c", "redis:/127.0.0.1:6379/c"},
        {"redis://127.0.0.1:6379", "cluster"},
        {"redis://127.0.0.1:6379/", "cluster"},
        {"redis://127.0.0.1:6379/a b", "cluster"},
        {"redis://127.0.0.1:6379/a/b", "cluster"},
        {"redis://127.0.0.1:6379/a:b", "cluster"},
        {"redis://127.0.0.1:6379/"
         "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl", /* 64 */
         "cluster"},
        {"redis://127.0.0.1:70000/c", "port"},
        {"redis://127.0.0.1:abc/c", "port"},
        {"redis://127.0.0.1:/c", "port"},
        {"redis://:6379/c", "host"},
        {"redis:///c", "host"},
        {"redis://[::1/c", "lease_url"},
        {"redis://::1:6379/c", "lease_url"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct lease_url u;
        char err[ERRLEN] = "";
        int rc = lease_url_parse(bad[i].url, "lease_url", &u, err, sizeof(err));
        cr_log_info("'%s' -> %d %s", bad[i].url, rc, err);
        cr_expect_eq(rc, -EINVAL, "'%s': %d (%s)", bad[i].url, rc, err);
        cr_expect(has(err, "lease_url"), "'%s': the error does not name the option: '%s'",
                  bad[i].url, err);
        cr_expect(has(err, bad[i].part), "'%s': the error does not name '%s': '%s'", bad[i].url,
                  bad[i].part, err);
    }
}

Test(lease_url, open_refuses_a_bad_url_and_does_not_connect)
{
    struct lease *l = NULL;
    char err[ERRLEN] = "";
    int rc = lease_open("redis://127.0.0.1:6379", 500, &l, err, sizeof(err));
    cr_assert_eq(rc, -EINVAL, "%d %s", rc, err);
    cr_assert(has(err, "cluster"), "%s", err);
    rc = lease_open("ftp://127.0.0.1:6379/c", 500, &l, err, sizeof(err));
    cr_assert(rc == -EINVAL || rc == -ENOTSUP, "%d %s", rc, err);
    cr_assert(has(err, "ftp"), "%s", err);
    /* nothing listens there: open does not connect, so it succeeds */
    uint16_t port = redis_free_port();
    char url[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/c", port);
    rc = lease_open(url, 500, &l, err, sizeof(err));
#if UMBP_HAVE_HIREDIS
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    cr_assert_str_eq(lease_url_of(l), url);
    lease_close(l);
#else
    cr_assert_eq(rc, -ENOTSUP, "without hiredis: %d %s", rc, err);
    cr_assert(has(err, "hiredis"), "the error names the package: %s", err);
#endif
}

/* rediss:// and rediss+sentinel:// (TLS) and their parameters. */
Test(lease_url, tls_urls_parse)
{
    struct lease_url u;
    char err[ERRLEN] = "";
    cr_assert(lease_is_url("rediss://10.0.0.5/c"));
    cr_assert_eq(lease_url_parse("rediss://127.0.0.1:6380/prod?tls_ca_file=/etc/umbp/ca.pem",
                                 "lease_url", &u, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(u.scheme, "rediss");
    cr_assert(u.tls);
    cr_assert_str_eq(u.host, "127.0.0.1");
    cr_assert_eq(u.port, 6380);
    cr_assert_str_eq(u.cluster, "prod");
    cr_assert_str_eq(u.tls_ca_file, "/etc/umbp/ca.pem");
    cr_assert_str_eq(u.tls_cert_file, "");
    cr_assert_str_eq(u.tls_server_name, "");
    /* no parameter: the system's trust store, the default port */
    cr_assert_eq(lease_url_parse("rediss://redis.example.com/c", "lease_url", &u, err,
                                 sizeof(err)), 0, "%s", err);
    cr_assert(u.tls);
    cr_assert_eq(u.port, 6379);
    cr_assert_str_eq(u.tls_ca_file, "");
    /* every parameter at once, with a password */
    cr_assert_eq(lease_url_parse("rediss://[fd00::5]:6380/prod?tls_ca_file=/ca.pem&"
                                 "tls_cert_file=/c.pem&tls_key_file=/c.key&tls_server_name="
                                 "redis.internal&password_file=/pw&user=umbp", "lease_url", &u,
                                 err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(u.host, "fd00::5");
    cr_assert_str_eq(u.tls_ca_file, "/ca.pem");
    cr_assert_str_eq(u.tls_cert_file, "/c.pem");
    cr_assert_str_eq(u.tls_key_file, "/c.key");
    cr_assert_str_eq(u.tls_server_name, "redis.internal");
    cr_assert_str_eq(u.password_file, "/pw");
    cr_assert_str_eq(u.user, "umbp");
    /* a server name may be an IP address, v4 or v6 (no brackets) */
    cr_assert_eq(lease_url_parse("rediss://h/c?tls_server_name=10.0.0.5", "lease_url", &u, err,
                                 sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(u.tls_server_name, "10.0.0.5");
    cr_assert_eq(lease_url_parse("rediss://h/c?tls_server_name=fd00::5", "lease_url", &u, err,
                                 sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(u.tls_server_name, "fd00::5");
    /* through sentinels, TLS to them and to the primary */
    cr_assert_eq(lease_url_parse("rediss+sentinel://10.0.0.1,10.0.0.2:26380/mymaster/prod?"
                                 "tls_ca_file=/ca&sentinel_password_file=/sp", "lease_url", &u,
                                 err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(u.scheme, "rediss+sentinel");
    cr_assert(u.tls);
    cr_assert_eq(u.nsentinels, 2);
    cr_assert_eq(u.sentinel_port[0], 26379);
    cr_assert_eq(u.sentinel_port[1], 26380);
    cr_assert_str_eq(u.service, "mymaster");
    cr_assert_str_eq(u.cluster, "prod");
    cr_assert_str_eq(u.tls_ca_file, "/ca");
    cr_assert_str_eq(u.sentinel_password_file, "/sp");
    /* plain URLs are not TLS */
    cr_assert_eq(lease_url_parse("redis://h/c", "lease_url", &u, err, sizeof(err)), 0);
    cr_assert_not(u.tls);
    cr_assert_eq(lease_url_parse("redis+sentinel://h/m/c", "lease_url", &u, err, sizeof(err)),
                 0);
    cr_assert_not(u.tls);
}

Test(lease_url, tls_parameters_bad_ones_are_named)
{
    char long_path[LEASE_PATH_MAX + 64], url[LEASE_PATH_MAX + 128];
    memset(long_path, 'a', sizeof(long_path) - 1);
    long_path[0] = '/';
    long_path[LEASE_PATH_MAX] = 0; /* 256 bytes: one too many */
    snprintf(url, sizeof(url), "rediss://h/c?tls_ca_file=%s", long_path);
    const struct {
        const char *url, *part, *part2;
    } bad[] = {
        {"redis://h/c?tls_ca_file=/ca", "use rediss://", "tls_ca_file"},
        {"redis+sentinel://s/m/c?tls_server_name=x", "use rediss://", "redis+sentinel"},
        {"redis://h/c?tls_cert_file=/c&tls_key_file=/k", "use rediss://", "tls_cert_file"},
        {"redis://h/c?password_file=/p&tls_key_file=/k", "use rediss://", "tls_key_file"},
        {"rediss://h/c?tls_cert_file=/c", "tls_cert_file and tls_key_file go together",
         "both or neither"},
        {"rediss://h/c?tls_key_file=/k", "go together", "both or neither"},
        {"rediss://h/c?tls_ca_file=", "tls_ca_file", "printable"},
        {"rediss://h/c?tls_ca_file", "tls_ca_file", "needs a value"},
        {"rediss://h/c?tls_ca_file=/a&tls_ca_file=/b", "tls_ca_file", "twice"},
        {"rediss://h/c?tls_server_name=a/b", "tls_server_name \"a/b\"", "host name"},
        {"rediss://h/c?tls_server_name=[::1]", "tls_server_name", "without brackets"},
        {"rediss://h/c?tls_server_name=a b", "tls_server_name", "printable"},
        {"rediss://h/c?tls_verify=no", "unknown parameter \"tls_verify\"",
         "tls_ca_file, tls_cert_file, tls_key_file, tls_server_name"},
        {url, "tls_ca_file", "1 .. 255"},
        {"rediss+sentinel://h/prod", "service", "rediss+sentinel://"},
        {"rediss://h", "cluster", "rediss://host:port/<cluster>"},
        {"redisss://h/c", "unknown store \"redisss\"", "rediss"},
        {"rediss+cluster://h/c", "unknown store", "rediss+sentinel"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct lease_url u;
        char err[ERRLEN] = "";
        int rc = lease_url_parse(bad[i].url, "lease_url", &u, err, sizeof(err));
        cr_log_info("'%.80s' -> %d %s", bad[i].url, rc, err);
        cr_expect_eq(rc, -EINVAL, "'%s': %d (%s)", bad[i].url, rc, err);
        cr_expect(has(err, bad[i].part) && has(err, bad[i].part2),
                  "'%s': the error does not name '%s' and '%s': '%s'", bad[i].url, bad[i].part,
                  bad[i].part2, err);
    }
}

/* rediss:// at open: built with OpenSSL, it opens without connecting (a
 * TLS file missing is refused: tested with real files in suite lease);
 * without, it is refused naming the package. */
Test(lease_url, rediss_open_needs_openssl_and_does_not_connect)
{
    uint16_t port = redis_free_port();
    char url[160], err[ERRLEN] = "";
    struct lease *l = NULL;
    snprintf(url, sizeof(url), "rediss://127.0.0.1:%u/c", port);
    int rc = lease_open(url, 500, &l, err, sizeof(err));
#if UMBP_HAVE_HIREDIS && UMBP_HAVE_OPENSSL
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    cr_assert_str_eq(lease_url_of(l), url);
    lease_close(l);
    snprintf(url, sizeof(url), "rediss://127.0.0.1:%u/c?tls_ca_file=/nonexistent/ca.pem", port);
    rc = lease_open(url, 500, &l, err, sizeof(err));
    cr_assert_eq(rc, -ENOENT, "%d %s", rc, err);
    cr_assert(has(err, "tls_ca_file /nonexistent/ca.pem") && has(err, url), "%s", err);
#elif UMBP_HAVE_HIREDIS
    cr_assert_eq(rc, -ENOTSUP, "without OpenSSL: %d %s", rc, err);
    cr_assert(has(err, "libssl-dev") && has(err, "scripts/setup.sh"), "%s", err);
#else
    cr_assert_eq(rc, -ENOTSUP, "without hiredis: %d %s", rc, err);
#endif
}

/* ---- the leader key's value ------------------------------------------------------------- */

#if UMBP_HAVE_HIREDIS
/* A store that answers the first command with an array header of 444,444,442
 * elements and nothing after, the connection left open until the client
 * closes it. */
struct huge_store {
    int lfd;
    uint16_t port;
    pthread_t th;
};

static void *huge_store_main(void *arg)
{
    struct huge_store *h = arg;
    int fd = accept(h->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    char buf[4096];
    if (read(fd, buf, sizeof(buf)) > 0) {
        static const char hdr[] = "*444444442\r\n";
        (void)!write(fd, hdr, sizeof(hdr) - 1);
        while (read(fd, buf, sizeof(buf)) > 0) /* until the client hangs up */
            ;
    }
    close(fd);
    return NULL;
}

/* hiredis allocates an array's element pointers when its header arrives:
 * 3.5 GB for this one, before any element (found by fuzz_redis_reply, out
 * of memory).  The connection refuses a count past REDIS_CONN_ARRAY_MAX at
 * once, naming it; before, the call waited for the elements to its
 * timeout. */
Test(lease_url, a_reply_array_too_long_is_refused_naming_its_count)
{
    struct huge_store h = { 0 };
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    h.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(h.lfd >= 0);
    cr_assert_eq(bind(h.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(h.lfd, 4), 0);
    cr_assert_eq(getsockname(h.lfd, (struct sockaddr *)&sa, &sl), 0);
    h.port = ntohs(sa.sin_port);
    cr_assert_eq(pthread_create(&h.th, NULL, huge_store_main, &h), 0);
    char url[128], err[ERRLEN] = "";
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/c", h.port);
    struct lease *l = NULL;
    int rc = lease_open(url, 5000, &l, err, sizeof(err));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    struct lease_holder out;
    rc = lease_leader(l, &out, err, sizeof(err));
    cr_log_info("leader: %d %s", rc, err);
    cr_assert_eq(rc, -EPROTO, "%d %s", rc, err);
    cr_assert(has(err, "a reply array of 444444442 elements (at most 4096)"), "%s", err);
    lease_close(l);
    pthread_join(h.th, NULL);
    close(h.lfd);
}
#endif

TestSuite(lease_value, .timeout = 30);

Test(lease_value, good_values_parse_and_round_trip)
{
    static const struct {
        const char *v;
        uint64_t epoch;
        const char *address, *owner;
    } good[] = {
        {"1 127.0.0.1:7390 umbp-master-1234", 1, "127.0.0.1:7390", "umbp-master-1234"},
        {"42 [::1]:7390 host-a.9999.123456", 42, "[::1]:7390", "host-a.9999.123456"},
        /* 2^53: the largest epoch (Redis's Lua counts in doubles) */
        {"9007199254740992 master.example.com:1 x", 9007199254740992ull, "master.example.com:1",
         "x"},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct lease_holder h;
        char err[ERRLEN] = "", buf[256];
        int rc = lease_value_parse(good[i].v, strlen(good[i].v), &h, err, sizeof(err));
        cr_assert_eq(rc, 0, "'%s': %d %s", good[i].v, rc, err);
        cr_assert_eq(h.epoch, good[i].epoch, "'%s'", good[i].v);
        cr_assert_str_eq(h.address, good[i].address);
        cr_assert_str_eq(h.owner, good[i].owner);
        cr_assert_eq(lease_value_format(&h, buf, sizeof(buf)), 0);
        cr_assert_str_eq(buf, good[i].v, "formatting gives back the value");
    }
    /* only len bytes are read: the value needs no NUL */
    const char *v = "7 127.0.0.1:7 abcdefXYZ";
    struct lease_holder h;
    char err[ERRLEN] = "";
    cr_assert_eq(lease_value_parse(v, strlen(v) - 3, &h, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(h.owner, "abcdef");
    /* a buffer too small to format into */
    h = (struct lease_holder){.epoch = 123456, .address = "127.0.0.1:7390", .owner = "m-1"};
    char small[20]; /* "123456 127.0.0.1:7390 m-1" is 25 bytes */
    cr_assert_eq(lease_value_format(&h, small, sizeof(small)), -ENAMETOOLONG);
    char fits[26];
    cr_assert_eq(lease_value_format(&h, fits, sizeof(fits)), 0);
    cr_assert_str_eq(fits, "123456 127.0.0.1:7390 m-1");
    cr_assert_eq(lease_value_format(&h, fits, 25), -ENAMETOOLONG, "no room for the NUL");
}

Test(lease_value, bad_values_are_refused_naming_the_field)
{
    char long_owner[160], long_addr[160];
    snprintf(long_owner, sizeof(long_owner), "1 127.0.0.1:1 %0*d", LEASE_OWNER_MAX, 0);
    snprintf(long_addr, sizeof(long_addr), "1 %0*d.example.com:1 o", NET_TCP_NAME_MAX, 0);
    static const char nul_owner[] = "1 127.0.0.1:1 o\0x"; /* a NUL inside the owner */
    const struct {
        const char *v;
        size_t len; /* 0: strlen */
        const char *field;
    } bad[] = {
        {"", 0, "epoch"},
        {"0 127.0.0.1:1 o", 0, "epoch"},
        {"x 127.0.0.1:1 o", 0, "epoch"},
        {"-1 127.0.0.1:1 o", 0, "epoch"},
        {"1x 127.0.0.1:1 o", 0, "epoch"},
        {"9007199254740993 127.0.0.1:1 o", 0, "epoch"},     /* 2^53 + 1 */
        {"18446744073709551616 127.0.0.1:1 o", 0, "epoch"}, /* 2^64 */
        {"99999999999999999999999 127.0.0.1:1 o", 0, "epoch"},
        {"1", 0, "address"},
        {"1 127.0.0.1 o", 0, "address"},
        {"1 127.0.0.1:99999 o", 0, "address"},
        {"1 :7390 o", 0, "address"},
        {long_addr, 0, "address"},
        {"1 127.0.0.1:1", 0, "owner"},
        {"1 127.0.0.1:1 ", 0, "owner"},
        {"1 127.0.0.1:1 a b", 0, "owner"},
        {"1 127.0.0.1:1 a\tb", 0, "owner"},
        {"1 127.0.0.1:1 a\x01", 0, "owner"},
        {"1 127.0.0.1:1 a\xc3\xa9", 0, "owner"},
        {nul_owner, sizeof(nul_owner) - 1, "owner"},
        {long_owner, 0, "owner"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct lease_holder h;
        char err[ERRLEN] = "";
        size_t len = bad[i].len ? bad[i].len : strlen(bad[i].v);
        int rc = lease_value_parse(bad[i].v, len, &h, err, sizeof(err));
        cr_log_info("value %zu ('%.40s') -> %d %s", i, bad[i].v, rc, err);
        cr_expect_eq(rc, -EPROTO, "value %zu '%.60s': %d (%s)", i, bad[i].v, rc, err);
        cr_expect(has(err, bad[i].field), "value %zu '%.60s': the error does not name the %s: "
                  "'%s'", i, bad[i].v, bad[i].field, err);
    }
}

/* ---- against Redis ------------------------------------------------------------------------ */

TestSuite(lease, .timeout = 180);

#define A_ADDR "127.0.0.1:7001"
#define A_OWNER "master-a.101"
#define B_ADDR "127.0.0.1:7002"
#define B_OWNER "master-b.202"
#define C_ADDR "127.0.0.1:7003"
#define C_OWNER "master-c.303"
#define TTL_LONG 60000
#define GONE_MS 10000 /* bound on an expiry to show (the ttls here are <= 300 ms) */

struct fx {
    struct redis r;
    const char *cluster;
    char url[160];
    char leader_key[128], epoch_key[128];
    uint64_t timeout_ms;
};

static void fx_start(struct fx *f, const char *cluster, uint64_t timeout_ms)
{
    redis_need();
    memset(f, 0, sizeof(*f));
    f->cluster = cluster;
    f->timeout_ms = timeout_ms;
    redis_start(&f->r);
    redis_url(&f->r, cluster, f->url, sizeof(f->url));
    snprintf(f->leader_key, sizeof(f->leader_key), "umbp:%s:leader", cluster);
    snprintf(f->epoch_key, sizeof(f->epoch_key), "umbp:%s:epoch", cluster);
}

static struct lease *fx_open(struct fx *f)
{
    struct lease *l = NULL;
    char err[ERRLEN] = "";
    int rc = lease_open(f->url, f->timeout_ms, &l, err, sizeof(err));
    cr_assert_eq(rc, 0, "lease_open %s: %d %s", f->url, rc, err);
    cr_assert_not_null(l);
    return l;
}

static void fx_stop(struct fx *f) { redis_stop(&f->r); }

static const char *get_leader(struct fx *f) { return redis_str(&f->r, "GET %s", f->leader_key); }
static const char *get_epoch(struct fx *f) { return redis_str(&f->r, "GET %s", f->epoch_key); }
static long long pttl(struct fx *f) { return atoll(redis_str(&f->r, "PTTL %s", f->leader_key)); }

static struct lease_holder holder(uint64_t epoch, const char *address, const char *owner)
{
    struct lease_holder h;
    memset(&h, 0, sizeof(h));
    h.epoch = epoch;
    snprintf(h.address, sizeof(h.address), "%s", address);
    snprintf(h.owner, sizeof(h.owner), "%s", owner);
    return h;
}

static void assert_holder(const struct lease_holder *h, uint64_t epoch, const char *address,
                          const char *owner, const char *what)
{
    cr_assert_eq(h->epoch, epoch, "%s: epoch %llu, expected %llu", what,
                 (unsigned long long)h->epoch, (unsigned long long)epoch);
    cr_assert_str_eq(h->address, address, "%s", what);
    cr_assert_str_eq(h->owner, owner, "%s", what);
}

/* The key's value for h, as the store holds it. */
static const char *value_of(const struct lease_holder *h)
{
    static char buf[256];
    cr_assert_eq(lease_value_format(h, buf, sizeof(buf)), 0);
    return buf;
}

/* Bounded wait until the leader key is gone (expired); returns the ms waited. */
static uint64_t wait_gone(struct fx *f)
{
    uint64_t t0 = redis_now_ms();
    while (strcmp(get_leader(f), "(nil)") != 0) {
        cr_assert_lt(redis_now_ms() - t0, GONE_MS, "the leader key never expired: '%s'",
                     f->r.reply);
        usleep(20000);
    }
    return redis_now_ms() - t0;
}

/* Calls that must succeed (rc >= 0), each asserted with its err. */
static int acquire(struct lease *l, const char *addr, const char *owner, uint64_t ttl,
                   uint64_t min_epoch, struct lease_holder *out)
{
    char err[ERRLEN] = "";
    memset(out, 0x5a, sizeof(*out));
    int rc = lease_acquire(l, addr, owner, ttl, min_epoch, out, err, sizeof(err));
    cr_assert_geq(rc, 0, "lease_acquire(%s): %d %s", owner, rc, err);
    return rc;
}

static int renew(struct lease *l, const struct lease_holder *mine, uint64_t ttl,
                 struct lease_holder *out)
{
    char err[ERRLEN] = "";
    memset(out, 0x5a, sizeof(*out));
    int rc = lease_renew(l, mine, ttl, out, err, sizeof(err));
    cr_assert_geq(rc, 0, "lease_renew(%s): %d %s", mine->owner, rc, err);
    return rc;
}

static int release(struct lease *l, const struct lease_holder *mine)
{
    char err[ERRLEN] = "";
    int rc = lease_release(l, mine, err, sizeof(err));
    cr_assert_geq(rc, 0, "lease_release(%s): %d %s", mine->owner, rc, err);
    return rc;
}

static int leader(struct lease *l, struct lease_holder *out)
{
    char err[ERRLEN] = "";
    memset(out, 0x5a, sizeof(*out));
    int rc = lease_leader(l, out, err, sizeof(err));
    cr_assert_geq(rc, 0, "lease_leader: %d %s", rc, err);
    return rc;
}

Test(lease, acquire_on_an_empty_store_gives_epoch_1)
{
    struct fx f;
    fx_start(&f, "acq", 2000);
    struct lease *a = fx_open(&f);
    struct lease_holder h;
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, 10000, 0, &h), 1);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "ours");
    /* what the store holds */
    cr_assert_str_eq(get_leader(&f), "1 " A_ADDR " " A_OWNER);
    cr_assert_str_eq(get_epoch(&f), "1");
    long long t = pttl(&f);
    cr_assert(t > 0 && t <= 10000, "the leader key expires within the ttl: PTTL %lld", t);
    cr_assert_eq(atoll(redis_str(&f.r, "PTTL %s", f.epoch_key)), -1, "the counter never "
                 "expires");
    /* nothing else was written, and nothing outside the cluster's names */
    cr_assert_str_eq(redis_str(&f.r, "DBSIZE"), "2");
    lease_close(a);
    fx_stop(&f);
}

Test(lease, a_second_owner_gets_0_and_sees_the_first_holder)
{
    struct fx f;
    fx_start(&f, "second", 2000);
    struct lease *a = fx_open(&f), *b = fx_open(&f);
    struct lease_holder ha, hb;
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &ha), 1);
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &hb), 0);
    assert_holder(&hb, 1, A_ADDR, A_OWNER, "B sees A");
    /* even with a higher min_epoch: held is held */
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 50, &hb), 0);
    assert_holder(&hb, 1, A_ADDR, A_OWNER, "B sees A");
    cr_assert_str_eq(get_leader(&f), value_of(&ha), "the key is A's");
    cr_assert_str_eq(get_epoch(&f), "1", "a refused acquire hands out no epoch");
    /* clusters are separate: another cluster name in the same Redis is free */
    struct fx g = f;
    g.cluster = "second2";
    redis_url(&g.r, g.cluster, g.url, sizeof(g.url));
    struct lease *c = fx_open(&g);
    struct lease_holder hc;
    cr_assert_eq(acquire(c, C_ADDR, C_OWNER, TTL_LONG, 0, &hc), 1);
    assert_holder(&hc, 1, C_ADDR, C_OWNER, "another cluster");
    cr_assert_str_eq(redis_str(&f.r, "GET umbp:second2:leader"), value_of(&hc));
    cr_assert_str_eq(get_leader(&f), value_of(&ha), "cluster 'second' untouched");
    lease_close(a);
    lease_close(b);
    lease_close(c);
    fx_stop(&f);
}

Test(lease, renew_keeps_it_for_the_holder_only)
{
    struct fx f;
    fx_start(&f, "renew", 2000);
    struct lease *a = fx_open(&f), *b = fx_open(&f);
    struct lease_holder ha, out;
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, 1000, 0, &ha), 1);
    cr_assert_leq(pttl(&f), 1000);
    cr_assert_eq(renew(a, &ha, TTL_LONG, &out), 1, "the holder renews");
    long long t = pttl(&f);
    cr_assert(t > 1000 && t <= TTL_LONG, "renew extended the key to the new ttl: PTTL %lld", t);
    cr_assert_str_eq(get_leader(&f), value_of(&ha), "renew keeps the value");
    cr_assert_str_eq(get_epoch(&f), "1", "renew hands out no epoch");
    for (int i = 0; i < 5; i++)
        cr_assert_eq(renew(a, &ha, TTL_LONG, &out), 1);

    /* non-holders with A's epoch (a higher one takes the key back: see
     * a_higher_epoch_takes_the_key_back): another owner, A's owner at
     * another address, another owner at A's address */
    const struct lease_holder not_mine[] = {
        holder(1, B_ADDR, B_OWNER),
        holder(1, B_ADDR, A_OWNER),
        holder(1, A_ADDR, B_OWNER),
    };
    for (size_t i = 0; i < sizeof(not_mine) / sizeof(not_mine[0]); i++) {
        cr_assert_eq(renew(b, &not_mine[i], 500, &out), 0, "'%s' renewed A's lease",
                     value_of(&not_mine[i]));
        assert_holder(&out, 1, A_ADDR, A_OWNER, "the holder is A");
        cr_assert_str_eq(get_leader(&f), value_of(&ha), "the key is still A's");
        t = pttl(&f);
        cr_assert_gt(t, 1000, "a non-holder's renew did not change the expiry: PTTL %lld", t);
    }
    cr_assert_str_eq(get_epoch(&f), "1");
    lease_close(a);
    lease_close(b);
    fx_stop(&f);
}

Test(lease, expiry_lets_another_owner_take_it_with_epoch_2)
{
    struct fx f;
    fx_start(&f, "expiry", 2000);
    struct lease *a = fx_open(&f), *b = fx_open(&f);
    struct lease_holder ha, hb, out;
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, 300, 0, &ha), 1);
    cr_assert_eq(ha.epoch, 1);
    uint64_t waited = wait_gone(&f);
    cr_log_info("the 300 ms lease expired %llu ms after the check began",
                (unsigned long long)waited);
    cr_assert_eq(leader(b, &out), 0, "nobody holds an expired lease");
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &hb), 1);
    assert_holder(&hb, 2, B_ADDR, B_OWNER, "B takes over with epoch 2");
    cr_assert_str_eq(get_epoch(&f), "2");
    /* the old holder learns it lost, and who holds it now */
    cr_assert_eq(renew(a, &ha, 300, &out), 0, "the deposed holder's renew");
    assert_holder(&out, 2, B_ADDR, B_OWNER, "the new holder");
    cr_assert_str_eq(get_leader(&f), value_of(&hb), "A's renew did not touch B's key");
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, 300, 0, &out), 0);
    assert_holder(&out, 2, B_ADDR, B_OWNER, "A's acquire sees B");
    lease_close(a);
    lease_close(b);
    fx_stop(&f);
}

/* renew on an absent key: the holder re-takes it with its own epoch, unless
 * the counter has passed its epoch (someone took over meanwhile and
 * vanished: then the lease is left free). */
Test(lease, a_holder_whose_key_expired_retakes_it_unless_the_counter_passed_it)
{
    struct fx f;
    fx_start(&f, "retake", 2000);
    struct lease *a = fx_open(&f), *b = fx_open(&f);
    struct lease_holder ha, hb, out;
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, 300, 0, &ha), 1);
    wait_gone(&f);
    cr_assert_eq(renew(a, &ha, 300, &out), 1, "the holder re-takes its expired key");
    cr_assert_str_eq(get_leader(&f), value_of(&ha), "with its own value (epoch 1)");
    cr_assert_str_eq(get_epoch(&f), "1", "and no new epoch");
    long long t = pttl(&f);
    cr_assert(t > 0 && t <= 300, "with the ttl asked: PTTL %lld", t);

    /* B takes over once A's key expires, then B vanishes too */
    wait_gone(&f);
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, 300, 0, &hb), 1);
    cr_assert_eq(hb.epoch, 2);
    wait_gone(&f);
    cr_assert_eq(renew(a, &ha, TTL_LONG, &out), 0, "A (epoch 1) must not re-take: epoch 2 "
                 "was handed out");
    cr_assert_eq(out.epoch, 0, "nobody holds it: epoch 0, got %llu",
                 (unsigned long long)out.epoch);
    cr_assert_str_eq(get_leader(&f), "(nil)", "the lease is left free");
    cr_assert_str_eq(get_epoch(&f), "2");
    /* B, whose epoch is the counter's, may re-take it */
    cr_assert_eq(renew(b, &hb, TTL_LONG, &out), 1);
    cr_assert_str_eq(get_leader(&f), value_of(&hb));
    lease_close(a);
    lease_close(b);
    fx_stop(&f);
}

Test(lease, release_deletes_only_mine)
{
    struct fx f;
    fx_start(&f, "release", 2000);
    struct lease *a = fx_open(&f), *b = fx_open(&f);
    struct lease_holder ha = holder(1, A_ADDR, A_OWNER), hb, out;
    cr_assert_eq(release(a, &ha), 0, "releasing on an empty store");
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &ha), 1);
    const struct lease_holder not_mine[] = {holder(1, B_ADDR, B_OWNER),
                                            holder(2, A_ADDR, A_OWNER)};
    for (size_t i = 0; i < 2; i++) {
        cr_assert_eq(release(b, &not_mine[i]), 0);
        cr_assert_str_eq(get_leader(&f), value_of(&ha), "'%s' released A's lease",
                         value_of(&not_mine[i]));
    }
    cr_assert_eq(release(a, &ha), 0);
    cr_assert_str_eq(get_leader(&f), "(nil)", "the holder's release deletes the key");
    cr_assert_str_eq(get_epoch(&f), "1", "and keeps the counter");
    cr_assert_eq(leader(b, &out), 0);
    cr_assert_eq(release(a, &ha), 0, "a second release: not mine any more");
    /* the next taker at once, with the next epoch */
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &hb), 1);
    cr_assert_eq(hb.epoch, 2);
    cr_assert_eq(release(a, &ha), 0);
    cr_assert_str_eq(get_leader(&f), value_of(&hb), "A's late release leaves B's key");
    lease_close(a);
    lease_close(b);
    fx_stop(&f);
}

Test(lease, leader_names_the_holder)
{
    struct fx f;
    fx_start(&f, "leader", 2000);
    struct lease *a = fx_open(&f), *b = fx_open(&f);
    struct lease_holder ha, out;
    cr_assert_eq(leader(b, &out), 0, "an empty store: nobody leads");
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &ha), 1);
    cr_assert_eq(leader(b, &out), 1);
    assert_holder(&out, 1, A_ADDR, A_OWNER, "leader()");
    cr_assert_eq(leader(a, &out), 1, "the holder asks too");
    assert_holder(&out, 1, A_ADDR, A_OWNER, "leader()");
    /* a value that is not a lease: an error naming it, not a holder */
    redis_do(&f.r, "SET %s %s", f.leader_key, "not a lease value");
    char err[ERRLEN] = "";
    int rc = lease_leader(b, &out, err, sizeof(err));
    cr_log_info("leader() of a bad value: %d %s", rc, err);
    cr_assert_lt(rc, 0, "a bad value in the key is not a leader");
    cr_expect_eq(rc, -EPROTO, "%d %s", rc, err);
    cr_assert(has(err, f.url), "the error names the store: '%s'", err);
    /* the lease still works after the error */
    redis_do(&f.r, "DEL %s", f.leader_key);
    cr_assert_eq(leader(b, &out), 0);
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &out), 1);
    cr_assert_eq(out.epoch, 2);
    lease_close(a);
    lease_close(b);
    fx_stop(&f);
}

Test(lease, the_epoch_is_the_greater_of_the_counter_and_min_epoch_plus_1)
{
    struct fx f;
    fx_start(&f, "min", 2000);
    struct lease *a = fx_open(&f);
    struct lease_holder h;
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 41, &h), 1);
    cr_assert_eq(h.epoch, 42);
    cr_assert_str_eq(get_epoch(&f), "42");
    redis_do(&f.r, "DEL %s", f.leader_key);
    redis_do(&f.r, "SET %s 100", f.epoch_key);
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 5, &h), 1);
    cr_assert_eq(h.epoch, 101, "the counter wins over a lower min_epoch");
    cr_assert_str_eq(get_epoch(&f), "101");
    redis_do(&f.r, "DEL %s", f.leader_key);
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 500, &h), 1);
    cr_assert_eq(h.epoch, 501);
    cr_assert_str_eq(get_leader(&f), "501 " A_ADDR " " A_OWNER);
    lease_close(a);
    fx_stop(&f);
}

/* A call after the store restarted may fail once (the connection was
 * reset); the next reconnects.  Retries for a bounded time until rc >= 0. */
#define UNTIL_OK(call)                                                                     \
    ({                                                                                     \
        int rc_;                                                                           \
        uint64_t t0_ = redis_now_ms();                                                     \
        while ((rc_ = (call)) < 0) {                                                       \
            cr_log_info("%s: %d %s (retrying)", #call, rc_, err);                          \
            cr_assert_lt(redis_now_ms() - t0_, 10000, "%s never worked again: %d %s",      \
                         #call, rc_, err);                                                 \
            usleep(50000);                                                                 \
        }                                                                                  \
        rc_;                                                                               \
    })

/* The store lost the lease and a newcomer that never saw A's epoch took
 * it with a lower one: A's renewal takes the key back (the highest epoch
 * wins) and raises the counter; the newcomer's next renewal loses to A.
 * Not when the counter has passed A's epoch (epochs above it were handed
 * out: A is not the highest). */
Test(lease, a_higher_epoch_takes_the_key_back)
{
    struct fx f;
    fx_start(&f, "back", 2000);
    struct lease *a = fx_open(&f), *b = fx_open(&f);
    struct lease_holder ha, hb, out;
    char err[ERRLEN] = "";
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 4, &ha), 1);
    cr_assert_eq(ha.epoch, 5);
    redis_restart_same_port(&f.r);
    int rc = UNTIL_OK(lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &hb, err, sizeof(err)));
    cr_assert_eq(rc, 1);
    cr_assert_eq(hb.epoch, 1, "the newcomer saw no epoch: it gets 1 in the empty store");
    rc = UNTIL_OK(lease_renew(a, &ha, TTL_LONG, &out, err, sizeof(err)));
    cr_assert_eq(rc, 1, "A (epoch 5) takes the key back from epoch 1");
    cr_assert_str_eq(get_leader(&f), value_of(&ha));
    cr_assert_str_eq(get_epoch(&f), "5", "the counter is raised to A's epoch");
    cr_assert_eq(renew(b, &hb, TTL_LONG, &out), 0, "the newcomer lost");
    assert_holder(&out, 5, A_ADDR, A_OWNER, "the newcomer sees A");
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &out), 0);
    assert_holder(&out, 5, A_ADDR, A_OWNER, "B's acquire sees A");

    /* the counter passed A's epoch: the key stays with the lower holder */
    redis_do(&f.r, "SET %s %s", f.leader_key, value_of(&hb));
    redis_do(&f.r, "SET %s 9", f.epoch_key);
    cr_assert_eq(renew(a, &ha, TTL_LONG, &out), 0, "epochs above A's were handed out");
    assert_holder(&out, 1, B_ADDR, B_OWNER, "the holder A found");
    cr_assert_str_eq(get_leader(&f), value_of(&hb), "A did not take it");
    cr_assert_str_eq(get_epoch(&f), "9", "nor touch the counter");
    /* equal epochs: the holder keeps it */
    redis_do(&f.r, "SET %s 5", f.epoch_key);
    struct lease_holder h5 = holder(5, B_ADDR, B_OWNER);
    redis_do(&f.r, "SET %s %s", f.leader_key, value_of(&h5));
    cr_assert_eq(renew(a, &ha, TTL_LONG, &out), 0, "an equal epoch is not taken back");
    assert_holder(&out, 5, B_ADDR, B_OWNER, "the holder A found");
    lease_close(a);
    lease_close(b);
    fx_stop(&f);
}

Test(lease, epochs_stay_monotonic_across_a_restart_that_loses_data)
{
    struct fx f;
    fx_start(&f, "restart", 1000);
    struct lease *a = fx_open(&f), *b = fx_open(&f), *c = fx_open(&f);
    struct lease_holder ha, hb, out;
    char err[ERRLEN] = "";
    /* a few takeovers: A holds with epoch 10 */
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &ha), 1);
    redis_do(&f.r, "DEL %s", f.leader_key);
    redis_do(&f.r, "SET %s 9", f.epoch_key);
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &ha), 1);
    cr_assert_eq(ha.epoch, 10);
    /* B, a standby, has seen epoch 10 */
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &out), 0);
    uint64_t b_seen = out.epoch;
    cr_assert_eq(b_seen, 10);

    /* Redis loses everything */
    redis_restart_same_port(&f.r);
    cr_assert_str_eq(get_leader(&f), "(nil)");
    cr_assert_str_eq(get_epoch(&f), "(nil)");
    int rc = UNTIL_OK(lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, b_seen, &hb, err,
                                    sizeof(err)));
    cr_assert_eq(rc, 1, "B takes the free lease");
    assert_holder(&hb, 11, B_ADDR, B_OWNER, "with an epoch above every one it saw");
    cr_assert_str_eq(get_epoch(&f), "11");
    rc = UNTIL_OK(lease_renew(a, &ha, TTL_LONG, &out, err, sizeof(err)));
    cr_assert_eq(rc, 0, "A (epoch 10) lost it");
    assert_holder(&out, 11, B_ADDR, B_OWNER, "A sees B");

    /* Redis loses everything again: the holder's renew re-takes its key with
     * its own epoch and raises the counter to it */
    redis_restart_same_port(&f.r);
    rc = UNTIL_OK(lease_renew(b, &hb, 300, &out, err, sizeof(err)));
    cr_assert_eq(rc, 1, "B re-takes its lost key");
    cr_assert_str_eq(get_leader(&f), value_of(&hb));
    cr_assert_str_eq(get_epoch(&f), "11", "the counter is raised to B's epoch");
    /* so that a newcomer who has seen nothing still gets a higher epoch */
    wait_gone(&f);
    rc = UNTIL_OK(lease_acquire(c, C_ADDR, C_OWNER, TTL_LONG, 0, &out, err, sizeof(err)));
    cr_assert_eq(rc, 1);
    assert_holder(&out, 12, C_ADDR, C_OWNER, "a newcomer after the re-take");
    rc = UNTIL_OK(lease_renew(b, &hb, TTL_LONG, &out, err, sizeof(err)));
    cr_assert_eq(rc, 0, "B lost it to C");
    cr_assert_eq(out.epoch, 12);
    lease_close(a);
    lease_close(b);
    lease_close(c);
    fx_stop(&f);
}

/* Many owners at once on a free lease, round after round: exactly one
 * takes it (the script is atomic), with the next epoch, and every other
 * sees that one. */
#define RACERS 8
#define ROUNDS 25

struct racer {
    struct fx *f;
    struct lease *l;
    int id;
    pthread_barrier_t *go;
    int rc[ROUNDS];
    struct lease_holder h[ROUNDS];
    char err[ERRLEN];
};

static void *race(void *arg)
{
    struct racer *r = arg;
    char addr[32], owner[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", 7100 + r->id);
    snprintf(owner, sizeof(owner), "racer-%d", r->id);
    for (int k = 0; k < ROUNDS; k++) {
        pthread_barrier_wait(&r->go[0]); /* the key was deleted */
        r->rc[k] = lease_acquire(r->l, addr, owner, TTL_LONG, 0, &r->h[k], r->err,
                                 sizeof(r->err));
        pthread_barrier_wait(&r->go[1]); /* everyone is done */
    }
    return NULL;
}

Test(lease, concurrent_acquires_elect_exactly_one)
{
    struct fx f;
    fx_start(&f, "race", 2000);
    pthread_barrier_t go[2];
    pthread_barrier_init(&go[0], NULL, RACERS + 1);
    pthread_barrier_init(&go[1], NULL, RACERS + 1);
    struct racer r[RACERS];
    pthread_t t[RACERS];
    for (int i = 0; i < RACERS; i++) {
        r[i] = (struct racer){.f = &f, .l = fx_open(&f), .id = i, .go = go};
        cr_assert_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
    }
    int wins[RACERS] = {0};
    for (int k = 0; k < ROUNDS; k++) {
        redis_do(&f.r, "DEL %s", f.leader_key);
        pthread_barrier_wait(&go[0]);
        pthread_barrier_wait(&go[1]);
        int winner = -1;
        for (int i = 0; i < RACERS; i++) {
            cr_assert_geq(r[i].rc[k], 0, "round %d, racer %d: %d %s", k, i, r[i].rc[k],
                          r[i].err);
            if (r[i].rc[k] == 1) {
                cr_assert_eq(winner, -1, "round %d: racers %d and %d both took the lease", k,
                             winner, i);
                winner = i;
            }
        }
        cr_assert_neq(winner, -1, "round %d: nobody took the free lease", k);
        wins[winner]++;
        const struct lease_holder *w = &r[winner].h[k];
        cr_assert_eq(w->epoch, (uint64_t)k + 1, "round %d: epoch %llu", k,
                     (unsigned long long)w->epoch);
        cr_assert_str_eq(get_leader(&f), value_of(w), "round %d: the key is the winner's", k);
        for (int i = 0; i < RACERS; i++)
            if (i != winner) {
                cr_assert_eq(r[i].h[k].epoch, w->epoch, "round %d: racer %d saw epoch %llu", k,
                             i, (unsigned long long)r[i].h[k].epoch);
                cr_assert_str_eq(r[i].h[k].owner, w->owner, "round %d: racer %d", k, i);
            }
    }
    for (int i = 0; i < RACERS; i++) {
        pthread_join(t[i], NULL);
        lease_close(r[i].l);
    }
    char line[256] = "";
    for (int i = 0; i < RACERS; i++)
        snprintf(line + strlen(line), sizeof(line) - strlen(line), " %d", wins[i]);
    cr_log_info("%d rounds of %d racers: wins per racer:%s", ROUNDS, RACERS, line);
    cr_assert_str_eq(get_epoch(&f), "25");
    pthread_barrier_destroy(&go[0]);
    pthread_barrier_destroy(&go[1]);
    fx_stop(&f);
}

/* Keys that are not what the lease wrote (another program, an operator):
 * an error naming the store, never a lease taken with an epoch that could
 * repeat one handed out. */
Test(lease, a_counter_or_key_of_the_wrong_kind_is_an_error)
{
    struct fx f;
    fx_start(&f, "corrupt", 2000);
    struct lease *a = fx_open(&f);
    struct lease_holder h;
    char err[ERRLEN] = "";
    redis_do(&f.r, "SET %s %s", f.epoch_key, "not-a-number");
    int rc = lease_acquire(a, A_ADDR, A_OWNER, TTL_LONG, 7, &h, err, sizeof(err));
    cr_log_info("acquire with a counter that is not a number: %d %s (epoch %llu)", rc, err,
                rc == 1 ? (unsigned long long)h.epoch : 0ull);
    if (rc == 1)
        cr_assert_gt(h.epoch, 7, "taken with epoch %llu", (unsigned long long)h.epoch);
    else
        cr_assert(rc < 0 && has(err, f.url), "%d '%s'", rc, err);
    redis_do(&f.r, "DEL %s %s", f.epoch_key, f.leader_key);
    redis_do(&f.r, "HSET %s a b", f.leader_key);  /* the leader key is a hash */
    err[0] = 0;
    rc = lease_acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err));
    cr_log_info("acquire with a hash as the leader key: %d %s", rc, err);
    cr_assert(rc < 0 && has(err, f.url), "acquire: %d '%s'", rc, err);
    err[0] = 0;
    rc = lease_leader(a, &h, err, sizeof(err));
    cr_log_info("leader with a hash as the leader key: %d %s", rc, err);
    cr_assert(rc < 0 && has(err, f.url), "leader: %d '%s'", rc, err);
    /* and it works once the keys are right again */
    redis_do(&f.r, "DEL %s", f.leader_key);
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &h), 1);
    lease_close(a);
    fx_stop(&f);
}

/* A command that timed out is not a command that did not run: the socket
 * held it, and Redis runs it when it wakes.  B's acquire times out while
 * Redis is stopped and A's lease runs out; on SIGCONT Redis runs it and B
 * holds the lease without knowing.  B's next acquire must not answer
 * "held by another" with B itself as the holder (a standby that believes
 * that refuses every client for a whole lease while the store names it):
 * it is B's (1, with the epoch the late command took), or free. */
Test(lease, a_timed_out_acquire_that_ran_late_is_still_its_callers)
{
    struct fx f;
    fx_start(&f, "late", 300);
    struct lease *a = fx_open(&f), *b = fx_open(&f);
    struct lease_holder ha, out;
    char err[ERRLEN] = "";
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, 600, 0, &ha), 1);
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &out), 0);
    redis_signal(&f.r, SIGSTOP);
    int rc = lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, ha.epoch, &out, err, sizeof(err));
    cr_log_info("B's acquire with Redis stopped: %d %s", rc, err);
    cr_assert_lt(rc, 0);
    usleep(800 * 1000); /* past A's 600 ms: expired by the time Redis looks */
    redis_signal(&f.r, SIGCONT);
    char v[256];
    snprintf(v, sizeof(v), "%s", get_leader(&f));
    cr_log_info("after SIGCONT the store holds '%s', counter %s", v, get_epoch(&f));
    rc = UNTIL_OK(lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, ha.epoch, &out, err, sizeof(err)));
    cr_log_info("B's next acquire: %d, holder '%s'", rc, value_of(&out));
    cr_assert(rc == 1 || strcmp(out.owner, B_OWNER) != 0, "B's acquire answered 0 (held by "
              "another) naming B itself: '%s'", value_of(&out));
    if (rc == 1)
        cr_assert_str_eq(get_leader(&f), value_of(&out), "B's lease is the key");
    lease_close(a);
    lease_close(b);
    fx_stop(&f);
}

/* One failing call: rc < 0 within 10x the timeout, err naming the URL. */
static void must_fail(struct fx *f, const char *what, int rc, const char *err, uint64_t t0)
{
    uint64_t took = redis_now_ms() - t0;
    cr_log_info("%s: %d in %llu ms: %s", what, rc, (unsigned long long)took, err);
    cr_assert_lt(rc, 0, "%s succeeded (%d) with the store down", what, rc);
    cr_assert_lt(took, 10 * f->timeout_ms, "%s took %llu ms (timeout %llu ms)", what,
                 (unsigned long long)took, (unsigned long long)f->timeout_ms);
    cr_assert(has(err, f->url), "%s: the error does not name the store %s: '%s'", what, f->url,
              err);
}

/* Every call on l (connected or not) once, each failing bounded. */
static void all_calls_fail(struct fx *f, struct lease *l, const char *who,
                           const struct lease_holder *mine, bool with_release)
{
    struct lease_holder out;
    char err[ERRLEN], what[64];
    uint64_t t0;
    int rc;
    err[0] = 0, t0 = redis_now_ms();
    rc = lease_acquire(l, B_ADDR, B_OWNER, 1000, 0, &out, err, sizeof(err));
    snprintf(what, sizeof(what), "%s: acquire", who);
    must_fail(f, what, rc, err, t0);
    err[0] = 0, t0 = redis_now_ms();
    rc = lease_renew(l, mine, 1000, &out, err, sizeof(err));
    snprintf(what, sizeof(what), "%s: renew", who);
    must_fail(f, what, rc, err, t0);
    err[0] = 0, t0 = redis_now_ms();
    rc = lease_leader(l, &out, err, sizeof(err));
    snprintf(what, sizeof(what), "%s: leader", who);
    must_fail(f, what, rc, err, t0);
    if (with_release) {
        err[0] = 0, t0 = redis_now_ms();
        rc = lease_release(l, mine, err, sizeof(err));
        snprintf(what, sizeof(what), "%s: release", who);
        must_fail(f, what, rc, err, t0);
    }
}

Test(lease, redis_killed_every_call_fails_bounded_naming_the_url)
{
    struct fx f;
    fx_start(&f, "killed", 500);
    struct lease *a = fx_open(&f), *fresh = fx_open(&f);
    struct lease_holder ha, out;
    char err[ERRLEN] = "";
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &ha), 1);
    redis_signal(&f.r, SIGKILL);
    for (int round = 0; round < 2; round++) { /* the second round reconnects first */
        all_calls_fail(&f, a, "connected", &ha, true);
        all_calls_fail(&f, fresh, "never connected", &ha, true);
    }
    /* back, empty: the calls work again; the holder re-takes its key */
    redis_start(&f.r);
    int rc = UNTIL_OK(lease_renew(a, &ha, TTL_LONG, &out, err, sizeof(err)));
    cr_assert_eq(rc, 1, "A re-takes its key in the empty store");
    cr_assert_str_eq(get_leader(&f), value_of(&ha));
    cr_assert_str_eq(get_epoch(&f), "1");
    rc = UNTIL_OK(lease_leader(fresh, &out, err, sizeof(err)));
    cr_assert_eq(rc, 1);
    assert_holder(&out, 1, A_ADDR, A_OWNER, "after the restart");
    lease_close(a);
    lease_close(fresh);

    /* a port nothing listens on: refused at connect, named */
    struct fx g = f;
    g.r.port = redis_free_port();
    redis_url(&g.r, "nobody", g.url, sizeof(g.url));
    struct lease *n = fx_open(&g);
    all_calls_fail(&g, n, "nothing listening", &ha, true);
    lease_close(n);
    fx_stop(&f);
}

Test(lease, redis_stopped_calls_are_bounded_then_work_after_sigcont)
{
    struct fx f;
    fx_start(&f, "stopped", 300);
    struct lease *a = fx_open(&f), *b = fx_open(&f), *fresh = fx_open(&f);
    struct lease_holder ha, out;
    char err[ERRLEN] = "";
    cr_assert_eq(acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &ha), 1);
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &out), 0);
    redis_signal(&f.r, SIGSTOP);
    /* The kernel still accepts connections for a stopped Redis: connects
     * succeed and each command must end by the timeout.  No release: a
     * command that timed out may still run when Redis wakes (it was in the
     * socket), and a late release would delete A's key. */
    for (int round = 0; round < 2; round++) {
        all_calls_fail(&f, a, "connected", &ha, false);
        all_calls_fail(&f, b, "standby", &ha, false);
        all_calls_fail(&f, fresh, "never connected", &ha, false);
    }
    redis_signal(&f.r, SIGCONT);
    /* the calls work again, and each answer is its own (no reply of a
     * command that timed out is taken for a later one's) */
    int rc = UNTIL_OK(lease_leader(b, &out, err, sizeof(err)));
    cr_assert_eq(rc, 1);
    assert_holder(&out, 1, A_ADDR, A_OWNER, "after SIGCONT");
    rc = UNTIL_OK(lease_renew(a, &ha, TTL_LONG, &out, err, sizeof(err)));
    cr_assert_eq(rc, 1, "A still holds it");
    rc = UNTIL_OK(lease_acquire(fresh, C_ADDR, C_OWNER, TTL_LONG, 0, &out, err, sizeof(err)));
    cr_assert_eq(rc, 0);
    assert_holder(&out, 1, A_ADDR, A_OWNER, "C sees A");
    cr_assert_eq(release(a, &ha), 0);
    cr_assert_str_eq(get_leader(&f), "(nil)");
    cr_assert_eq(leader(b, &out), 0);
    cr_assert_eq(leader(fresh, &out), 0);
    cr_assert_eq(acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &out), 1);
    assert_holder(&out, 2, B_ADDR, B_OWNER, "B takes the released lease");
    cr_assert_eq(renew(a, &ha, TTL_LONG, &out), 0);
    assert_holder(&out, 2, B_ADDR, B_OWNER, "A sees B");
    cr_assert_eq(leader(fresh, &out), 1);
    assert_holder(&out, 2, B_ADDR, B_OWNER, "C sees B");
    lease_close(a);
    lease_close(b);
    lease_close(fresh);
    fx_stop(&f);
}

/* A Redis that wants a password (requirepass, and an ACL user): the URL
 * names a file holding it (?password_file=, &user=), never the password;
 * without one, or with a wrong one, every call fails with -EACCES saying
 * so, and no message carries a password; a file others may read, or none
 * there, is refused at open. */
static void write_pw(const char *path, const char *pw, mode_t mode)
{
    FILE *fp = fopen(path, "w");
    cr_assert_not_null(fp, "%s: %s", path, strerror(errno));
    fprintf(fp, "%s\n", pw);
    fclose(fp);
    cr_assert_eq(chmod(path, mode), 0);
}

Test(lease, a_store_with_a_password_is_reached_through_a_password_file)
{
    redis_need();
    struct redis r;
    memset(&r, 0, sizeof(r));
    r.extra[0] = "--requirepass";
    r.extra[1] = "umbp-pw-4417";
    r.password = "umbp-pw-4417"; /* the fixture's own commands */
    /* alice may do what docs/distributed.md says the lease needs, no more */
    const char *acl[] = {"--user", "alice", "on", ">alice-pw-9051", "~umbp:*", "+get", "+set",
                         "+pexpire", "+del", "+eval"};
    for (int i = 0; i < 10; i++)
        r.extra[2 + i] = acl[i];
    redis_start(&r);
    char dir[] = "/tmp/umbp-test-pw.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char good[96], alice[96], wrong[96], open_[96], url[512], err[ERRLEN];
    snprintf(good, sizeof(good), "%s/good", dir);
    snprintf(alice, sizeof(alice), "%s/alice", dir);
    snprintf(wrong, sizeof(wrong), "%s/wrong", dir);
    snprintf(open_, sizeof(open_), "%s/open", dir);
    write_pw(good, "umbp-pw-4417", 0600);
    write_pw(alice, "alice-pw-9051", 0400);
    write_pw(wrong, "zq-nope-7731", 0600);
    write_pw(open_, "umbp-pw-4417", 0644);
    struct lease *l = NULL;
    struct lease_holder h;

    /* no password: refused by the store, said plainly */
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/pw", r.port);
    cr_assert_eq(lease_open(url, 2000, &l, err, sizeof(err)), 0, "%s", err);
    int rc = lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err));
    cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
    cr_assert(has(err, "requires a password") && has(err, "password_file") && has(err, url),
              "%s", err);
    lease_close(l);

    /* the right password from its file: the lease works */
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/pw?password_file=%s", r.port, good);
    cr_assert_eq(lease_open(url, 2000, &l, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)), 1, "%s",
                 err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "acquired with the password");
    cr_assert_eq(lease_renew(l, &h, TTL_LONG, &h, err, sizeof(err)), 1, "%s", err);
    /* the password rotated (Redis, then the file): once its connection
     * goes, the lease dials again with the file's new password */
    freeReplyObject(redis_cmd(&r, "CONFIG SET requirepass %s", "umbp-pw-rot-2"));
    r.password = "umbp-pw-rot-2";
    write_pw(good, "umbp-pw-rot-2", 0600);
    freeReplyObject(redis_cmd(&r, "CLIENT KILL TYPE normal")); /* not the fixture's own */
    int tries = 0;
    struct lease_holder held = h;
    while ((rc = lease_renew(l, &held, TTL_LONG, &h, err, sizeof(err))) != 1) {
        cr_assert_lt(rc, 0, "renew lost the lease: %d", rc);
        cr_assert_lt(++tries, 3, "no renewal with the rotated password: %d %s", rc, err);
    }
    assert_holder(&h, 1, A_ADDR, A_OWNER, "renewed with the rotated password");
    freeReplyObject(redis_cmd(&r, "CONFIG SET requirepass %s", "umbp-pw-4417"));
    r.password = "umbp-pw-4417";
    write_pw(good, "umbp-pw-4417", 0600);
    lease_close(l);

    /* an ACL user and its password: reads the holder */
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/pw?user=alice&password_file=%s", r.port,
             alice);
    cr_assert_eq(lease_open(url, 2000, &l, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(lease_leader(l, &h, err, sizeof(err)), 1, "%s", err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "read as alice");
    cr_assert_eq(lease_acquire(l, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)), 0, "%s",
                 err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "A still holds it");
    struct lease_holder mine = h;
    cr_assert_eq(lease_renew(l, &mine, TTL_LONG, &h, err, sizeof(err)), 1, "%s", err);
    cr_assert_eq(lease_release(l, &mine, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(lease_leader(l, &h, err, sizeof(err)), 0, "released: %s", err);
    cr_assert_eq(lease_acquire(l, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)), 1, "%s",
                 err);
    assert_holder(&h, 2, B_ADDR, B_OWNER, "taken as alice");
    lease_close(l);

    /* a wrong password, as the default user and as alice: -EACCES naming
     * the file, never the password */
    const char *users[] = {"", "user=alice&"};
    for (int i = 0; i < 2; i++) {
        snprintf(url, sizeof(url), "redis://127.0.0.1:%u/pw?%spassword_file=%s", r.port,
                 users[i], wrong);
        cr_assert_eq(lease_open(url, 2000, &l, err, sizeof(err)), 0, "%s", err);
        rc = lease_leader(l, &h, err, sizeof(err));
        cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
        cr_assert(has(err, "AUTH") && has(err, "refused") && has(err, wrong), "%s", err);
        cr_assert_null(strstr(err, "zq-nope-7731"), "the password is in the message: %s", err);
        rc = lease_acquire(l, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err));
        cr_assert_eq(rc, -EACCES, "every call: %d %s", rc, err);
        lease_close(l);
    }

    /* files refused at open: others may read it; none there */
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/pw?password_file=%s", r.port, open_);
    rc = lease_open(url, 2000, &l, err, sizeof(err));
    cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
    cr_assert(has(err, "chmod 600") && has(err, open_), "%s", err);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/pw?password_file=%s/none", r.port, dir);
    rc = lease_open(url, 2000, &l, err, sizeof(err));
    cr_assert_eq(rc, -ENOENT, "%d %s", rc, err);
    cr_assert(has(err, "/none"), "%s", err);

    unlink(good), unlink(alice), unlink(wrong), unlink(open_), rmdir(dir);
    redis_stop(&r);
}

/* Bounded wait until the replica rep holds value under key (the lease
 * written to its primary has replicated). */
static void await_replica(struct redis *rep, const char *key, const char *value)
{
    uint64_t t0 = redis_now_ms();
    while (strcmp(redis_str(rep, "GET %s", key), value) != 0) {
        cr_assert_lt(redis_now_ms() - t0, 10000, "the replica on port %u never got %s = '%s' "
                     "(has '%s')", rep->port, key, value, rep->reply);
        usleep(10000);
    }
}

/* redis+sentinel://: the lease asks the sentinels for the primary (a dead
 * sentinel listed first is skipped), and follows a failover: the primary
 * killed, the sentinel promotes the replica, and the holder's renewals go
 * to it; a service the sentinels do not watch is named. */
Test(lease, through_sentinels_it_follows_a_failover)
{
    redis_need();
    struct redis p, rep, sen;
    redis_start_with_sentinel(&p, &rep, &sen, "svc", NULL);

    uint16_t dead = redis_free_port(); /* a sentinel that is not there, listed first */
    char url[256], err[ERRLEN];
    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u,127.0.0.1:%u/svc/sc", dead,
             sen.port);
    struct lease *l = NULL;
    cr_assert_eq(lease_open(url, 1000, &l, err, sizeof(err)), 0, "%s", err);
    struct lease_holder h, mine;
    cr_assert_eq(lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &mine, err, sizeof(err)), 1,
                 "%s", err);
    assert_holder(&mine, 1, A_ADDR, A_OWNER, "through the sentinel");
    cr_assert_str_eq(redis_str(&p, "GET umbp:sc:leader"), "1 " A_ADDR " " A_OWNER,
                     "the lease is not in the primary");
    await_replica(&rep, "umbp:sc:leader", "1 " A_ADDR " " A_OWNER);

    /* the primary dies: renewals fail until the sentinel promotes the
     * replica, then go there */
    redis_signal(&p, SIGKILL);
    uint64_t t0 = redis_now_ms();
    int rc, fails = 0;
    char last[ERRLEN] = "";
    while ((rc = lease_renew(l, &mine, TTL_LONG, &h, err, sizeof(err))) != 1) {
        cr_assert_lt(redis_now_ms() - t0, 30000, "no renewal through the sentinel within "
                     "30 s of the primary's death: %d %s", rc, err);
        cr_assert_lt(rc, 0, "a renewal lost the lease: %d", rc);
        snprintf(last, sizeof(last), "%s", err);
        fails++;
        usleep(50000);
    }
    cr_log_info("the primary killed: %d renewals failed (last: %s), the first through the "
                "promoted replica after %llu ms", fails, last,
                (unsigned long long)(redis_now_ms() - t0));
    assert_holder(&h, 1, A_ADDR, A_OWNER, "renewed on the new primary");
    cr_assert_eq(lease_acquire(l, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)), 0, "%s",
                 err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "the new primary names the holder");
    cr_assert_eq(lease_release(l, &mine, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(redis_str(&rep, "GET umbp:sc:leader"), "(nil)",
                     "the release did not reach the promoted replica");
    lease_close(l);

    /* a service the sentinels do not watch */
    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u/nosvc/sc", sen.port);
    cr_assert_eq(lease_open(url, 1000, &l, err, sizeof(err)), 0, "%s", err);
    rc = lease_leader(l, &h, err, sizeof(err));
    cr_assert_eq(rc, -ENOENT, "%d %s", rc, err);
    cr_assert(has(err, "watches no primary named \"nosvc\"") && has(err, url), "%s", err);
    lease_close(l);
    redis_stop(&sen);
    redis_stop(&rep);
    redis_stop(&p);
}

/* Sentinels with a password of their own (requirepass in the sentinel):
 * without sentinel_password_file every call is refused, naming the
 * sentinel; with it the lease works; a wrong one is -EACCES naming the
 * file, never the password. */
Test(lease, sentinels_with_a_password_of_their_own)
{
    redis_need();
    struct redis p, rep, sen;
    redis_start_with_sentinel(&p, &rep, &sen, "svc", "sen-pw-6604");
    char good[64], bad[64], url[512], err[ERRLEN];
    snprintf(good, sizeof(good), "/tmp/umbp-test-senpw.%d", (int)getpid());
    snprintf(bad, sizeof(bad), "/tmp/umbp-test-senbad.%d", (int)getpid());
    write_pw(good, "sen-pw-6604", 0600);
    write_pw(bad, "not-it-8125", 0600);
    struct lease *l = NULL;
    struct lease_holder h;

    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u/svc/sp", sen.port);
    cr_assert_eq(lease_open(url, 1000, &l, err, sizeof(err)), 0, "%s", err);
    int rc = lease_leader(l, &h, err, sizeof(err));
    cr_assert(rc < 0, "a sentinel with a password answered without one: %d", rc);
    cr_assert(has(err, "sentinel 1") && has(err, "NOAUTH"), "%s", err);
    lease_close(l);

    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u/svc/sp?sentinel_password_file=%s",
             sen.port, bad);
    cr_assert_eq(lease_open(url, 1000, &l, err, sizeof(err)), 0, "%s", err);
    rc = lease_leader(l, &h, err, sizeof(err));
    cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
    cr_assert(has(err, "sentinel 1") && has(err, bad), "%s", err);
    cr_assert_null(strstr(err, "not-it-8125"), "the password is in the message: %s", err);
    lease_close(l);

    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u/svc/sp?sentinel_password_file=%s",
             sen.port, good);
    cr_assert_eq(lease_open(url, 1000, &l, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)), 1, "%s",
                 err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "through a sentinel with a password");
    lease_close(l);
    unlink(good);
    unlink(bad);
    redis_stop(&sen);
    redis_stop(&rep);
    redis_stop(&p);
}

/* ---- Sentinel: a stale answer, a stopped sentinel, a stopped primary ----------------- */

/* The bound on one call while a sentinel or the primary is stopped: the
 * stopped one costs a timeout (its kernel accepts the connection, the
 * command waits), anything after it at most another; with slack, 3 x the
 * timeout + 1 s. */
static uint64_t stall_bound(uint64_t timeout_ms) { return 3 * timeout_ms + 1000; }

/* Runs call (err is the caller's), logs its rc, duration and err, asserts
 * it ended within bound_ms and keeps the longest in worst; its rc. */
#define TIMED(worst, bound_ms, what, call)                                                 \
    ({                                                                                     \
        err[0] = 0;                                                                        \
        uint64_t t0_ = redis_now_ms();                                                     \
        int rc_ = (call);                                                                  \
        uint64_t took_ = redis_now_ms() - t0_;                                             \
        cr_log_info("%s: %d in %llu ms%s%s", (what), rc_, (unsigned long long)took_,       \
                    rc_ < 0 ? ": " : "", rc_ < 0 ? err : "");                              \
        cr_assert_leq(took_, (uint64_t)(bound_ms), "%s took %llu ms, past the bound of "   \
                      "%llu ms: %d %s", (what), (unsigned long long)took_,                 \
                      (unsigned long long)(bound_ms), rc_, err);                           \
        if (took_ > (worst))                                                               \
            (worst) = took_;                                                               \
        rc_;                                                                               \
    })

/* A Redis's role as ROLE names it ("master", "slave", "sentinel"), in
 * r->reply. */
static const char *role_of(struct redis *r)
{
    redisReply *x = redis_cmd(r, "ROLE");
    if (x->type == REDIS_REPLY_ARRAY && x->elements >= 1 &&
        x->element[0]->type == REDIS_REPLY_STRING)
        snprintf(r->reply, sizeof(r->reply), "%s", x->element[0]->str);
    else
        snprintf(r->reply, sizeof(r->reply), "(ROLE answered no role)");
    freeReplyObject(x);
    return r->reply;
}

/* A lease opened on url with timeout_ms. */
static struct lease *open_url(const char *url, uint64_t timeout_ms)
{
    struct lease *l = NULL;
    char err[ERRLEN] = "";
    int rc = lease_open(url, timeout_ms, &l, err, sizeof(err));
    cr_assert_eq(rc, 0, "lease_open %s: %d %s", url, rc, err);
    return l;
}

/* A sentinel whose answer is stale, listed first: it watches a port
 * nothing listens on, so it names a primary that refuses the connection.
 * The refused dial goes on to the second sentinel, which names the real
 * primary: acquire, renew, leader and release all work, on one lease and
 * each as a fresh lease's first call (whose dial asks the stale sentinel
 * first), and the lease is in the real primary.  The stale sentinel alone:
 * every call is refused, naming the address it gave. */
Test(lease, a_stale_sentinel_listed_first_sends_the_dial_on)
{
    redis_need();
    struct redis p, good, stale;
    memset(&p, 0, sizeof(p));
    redis_start(&p);
    redis_start_sentinel(&good, "svc", p.port, 1, NULL);
    uint16_t nobody = redis_free_port();
    redis_start_sentinel(&stale, "svc", nobody, 1, NULL);
    redisReply *x = redis_cmd(&stale, "SENTINEL get-master-addr-by-name svc");
    cr_assert(x->type == REDIS_REPLY_ARRAY && x->elements == 2 &&
              x->element[1]->type == REDIS_REPLY_STRING &&
              atoi(x->element[1]->str) == (int)nobody,
              "the stale sentinel does not name port %u", nobody);
    freeReplyObject(x);

    const uint64_t T = 1000, bound = stall_bound(T);
    char url[256], err[ERRLEN];
    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u,127.0.0.1:%u/svc/st", stale.port,
             good.port);
    uint64_t worst = 0;
    struct lease *l = open_url(url, T);
    struct lease_holder mine, h;
    int rc = TIMED(worst, bound, "acquire", lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &mine,
                                                      err, sizeof(err)));
    cr_assert_eq(rc, 1, "acquire with a stale sentinel listed first: %d %s", rc, err);
    assert_holder(&mine, 1, A_ADDR, A_OWNER, "acquired past the stale sentinel");
    cr_assert_str_eq(redis_str(&p, "GET umbp:st:leader"), "1 " A_ADDR " " A_OWNER,
                     "the lease is not in the real primary");
    rc = TIMED(worst, bound, "renew", lease_renew(l, &mine, TTL_LONG, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "renew: %d %s", rc, err);
    rc = TIMED(worst, bound, "leader", lease_leader(l, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "leader: %d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "leader()");

    /* each call as a fresh lease's first: its dial meets the stale answer */
    struct lease *f = open_url(url, T);
    rc = TIMED(worst, bound, "fresh leader", lease_leader(f, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "a fresh lease's leader: %d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "a fresh lease's leader()");
    lease_close(f);
    f = open_url(url, T);
    rc = TIMED(worst, bound, "fresh acquire", lease_acquire(f, B_ADDR, B_OWNER, TTL_LONG, 0, &h,
                                                        err, sizeof(err)));
    cr_assert_eq(rc, 0, "a second owner's acquire through a fresh lease: %d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "B sees A");
    lease_close(f);
    f = open_url(url, T);
    rc = TIMED(worst, bound, "fresh renew", lease_renew(f, &mine, TTL_LONG, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "the holder's renew through a fresh lease: %d %s", rc, err);
    lease_close(f);
    f = open_url(url, T);
    rc = TIMED(worst, bound, "fresh release", lease_release(f, &mine, err, sizeof(err)));
    cr_assert_eq(rc, 0, "the holder's release through a fresh lease: %d %s", rc, err);
    cr_assert_str_eq(redis_str(&p, "GET umbp:st:leader"), "(nil)",
                     "the release did not reach the real primary");
    lease_close(f);
    rc = TIMED(worst, bound, "release", lease_release(l, &mine, err, sizeof(err)));
    cr_assert_eq(rc, 0, "release: %d %s", rc, err);
    rc = TIMED(worst, bound, "acquire again", lease_acquire(l, B_ADDR, B_OWNER, TTL_LONG, 0, &h,
                                                        err, sizeof(err)));
    cr_assert_eq(rc, 1, "the released lease taken: %d %s", rc, err);
    assert_holder(&h, 2, B_ADDR, B_OWNER, "B takes the released lease");
    cr_assert_str_eq(redis_str(&p, "GET umbp:st:leader"), "2 " B_ADDR " " B_OWNER);
    lease_close(l);
    cr_log_info("a stale sentinel listed first: the slowest call took %llu ms (timeout %llu)",
                (unsigned long long)worst, (unsigned long long)T);

    /* the stale sentinel alone: refused, naming the address it gave */
    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u/svc/st", stale.port);
    l = open_url(url, T);
    char at[32];
    snprintf(at, sizeof(at), "127.0.0.1:%u", nobody);
    for (int i = 0; i < 2; i++) {
        rc = TIMED(worst, bound, "stale alone: leader", lease_leader(l, &h, err, sizeof(err)));
        cr_assert_eq(rc, -ECONNREFUSED, "%d %s", rc, err);
        cr_assert(has(err, at) && has(err, url), "the error names neither the stale primary "
                  "%s nor the URL: %s", at, err);
        rc = TIMED(worst, bound, "stale alone: acquire",
                   lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
        cr_assert_eq(rc, -ECONNREFUSED, "%d %s", rc, err);
    }
    lease_close(l);
    redis_stop(&stale);
    redis_stop(&good);
    redis_stop(&p);
}

/* A stopped sentinel (SIGSTOP) listed first, two sentinels watching the
 * primary with quorum 2 (the one awake cannot find the primary down
 * alone).  The kernel still accepts the stopped sentinel's connections, so
 * asking it waits out the timeout, and the dial goes on to the second:
 * every call ends within stall_bound and works.  A connected lease's
 * leader() asks no sentinel; its renew (a write asks again) starts at the
 * stopped one, which answered it last, then at the second.  A fresh
 * lease's every first call starts at the stopped one.  After SIGCONT
 * every call works, fast again. */
Test(lease, a_stopped_sentinel_listed_first_costs_a_bounded_wait)
{
    redis_need();
    struct redis p, s1, s2;
    memset(&p, 0, sizeof(p));
    redis_start(&p);
    redis_start_sentinel(&s1, "svc", p.port, 2, NULL);
    redis_start_sentinel(&s2, "svc", p.port, 2, NULL);
    const uint64_t T = 500, bound = stall_bound(T);
    char url[256], err[ERRLEN];
    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u,127.0.0.1:%u/svc/ss", s1.port,
             s2.port);
    uint64_t worst = 0;
    struct lease *a = open_url(url, T);
    struct lease_holder mine, h;
    int rc = TIMED(worst, bound, "acquire, both sentinels up",
                   lease_acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &mine, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    rc = TIMED(worst, bound, "leader, both sentinels up", lease_leader(a, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);

    redis_signal(&s1, SIGSTOP);
    rc = TIMED(worst, bound, "connected: leader", lease_leader(a, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "a connected lease's leader with a sentinel stopped: %d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "leader() on the kept connection");
    for (int i = 0; i < 3; i++) {
        rc = TIMED(worst, bound, "connected: renew",
                   lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err)));
        cr_assert_eq(rc, 1, "the holder's renew past the stopped sentinel: %d %s", rc, err);
    }
    for (int round = 0; round < 2; round++) {
        struct lease *f = open_url(url, T);
        rc = TIMED(worst, bound, "fresh leader", lease_leader(f, &h, err, sizeof(err)));
        cr_assert_eq(rc, 1, "a fresh lease's leader past the stopped sentinel: %d %s", rc, err);
        assert_holder(&h, 1, A_ADDR, A_OWNER, "leader() past the stopped sentinel");
        lease_close(f);
        f = open_url(url, T);
        rc = TIMED(worst, bound, "fresh acquire",
                   lease_acquire(f, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
        cr_assert_eq(rc, 0, "a second owner's acquire past the stopped sentinel: %d %s", rc,
                     err);
        assert_holder(&h, 1, A_ADDR, A_OWNER, "B sees A past the stopped sentinel");
        lease_close(f);
        f = open_url(url, T);
        rc = TIMED(worst, bound, "fresh renew",
                   lease_renew(f, &mine, TTL_LONG, &h, err, sizeof(err)));
        cr_assert_eq(rc, 1, "the holder's renew through a fresh lease past the stopped "
                     "sentinel: %d %s", rc, err);
        lease_close(f);
    }
    cr_log_info("sentinel 1 stopped: the slowest call took %llu ms (timeout %llu, bound %llu)",
                (unsigned long long)worst, (unsigned long long)T, (unsigned long long)bound);

    redis_signal(&s1, SIGCONT);
    uint64_t woke = 0;
    struct lease *f = open_url(url, T);
    rc = TIMED(woke, bound, "after SIGCONT: fresh leader", lease_leader(f, &h, err,
                                                                        sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "after SIGCONT");
    rc = TIMED(woke, bound, "after SIGCONT: fresh acquire",
               lease_acquire(f, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    lease_close(f);
    rc = TIMED(woke, bound, "after SIGCONT: renew",
               lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    rc = TIMED(woke, bound, "after SIGCONT: release", lease_release(a, &mine, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    cr_assert_str_eq(redis_str(&p, "GET umbp:ss:leader"), "(nil)", "the release did not reach "
                     "the primary");
    cr_log_info("after SIGCONT: the slowest call took %llu ms", (unsigned long long)woke);
    lease_close(a);
    redis_stop(&s2);
    redis_stop(&s1);
    redis_stop(&p);
}

/* Bounded wait until p reports `what` in INFO replication; the ms waited. */
static uint64_t wait_info(struct redis *p, const char *what, uint64_t bound_ms)
{
    uint64_t t0 = redis_now_ms();
    while (!strstr(redis_str(p, "INFO replication"), what)) {
        cr_assert_lt(redis_now_ms() - t0, bound_ms, "redis on port %u does not report '%s' "
                     "within %llu ms: %s", p->port, what, (unsigned long long)bound_ms,
                     p->reply);
        usleep(50000);
    }
    return redis_now_ms() - t0;
}

/* The primary stopped (SIGSTOP) behind a sentinel (quorum 1, down after
 * 300 ms, a replica to promote).  The holder renews in a loop: each call
 * while the primary is stopped ends within stall_bound with an error,
 * never "lost" (its key cannot expire: a 60 s lease), until the sentinel
 * promotes the replica; then renewals succeed there.  On SIGCONT the old
 * primary answers as a primary, with its stale copy, until the sentinel
 * demotes it to a replica of the new one (bounded; the holder renews on
 * the new primary meanwhile): a standby connected to it since before the
 * stop writes on the new primary all the same (a write asks the sentinels
 * again), and gets 0 naming the holder; a reader connected to it since
 * then reads the stale copy until the demotion closes its connection,
 * then the new primary.  One holder throughout: second owners' acquires
 * get 0 naming it; released, the standby takes it on the new primary. */
Test(lease, through_sentinels_a_stopped_primary_is_failed_over_then_demoted)
{
    redis_need();
    struct redis p, rep, sen;
    redis_start_with_sentinel(&p, &rep, &sen, "svc", NULL);
    const uint64_t T = 500, bound = stall_bound(T);
    char url[256], err[ERRLEN];
    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u/svc/ps", sen.port);
    struct lease *a = open_url(url, T), *reader = open_url(url, T), *b = open_url(url, T);
    struct lease_holder mine, h;
    uint64_t worst = 0;
    int rc = TIMED(worst, bound, "acquire",
                   lease_acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &mine, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    const char *value = "1 " A_ADDR " " A_OWNER;
    cr_assert_str_eq(redis_str(&p, "GET umbp:ps:leader"), value);
    /* the reader and the standby connect to the primary now and make no
     * call while it is stopped */
    rc = TIMED(worst, bound, "reader: leader", lease_leader(reader, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    rc = TIMED(worst, bound, "standby: acquire",
               lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "B sees A");
    await_replica(&rep, "umbp:ps:leader", value);

    /* stopped: every renewal bounded and failing until the promotion */
    redis_signal(&p, SIGSTOP);
    uint64_t t0 = redis_now_ms();
    int fails = 0;
    uint64_t stalled = 0;
    char last[ERRLEN] = "";
    while ((rc = TIMED(stalled, bound, "renew, the primary stopped",
                       lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err)))) != 1) {
        cr_assert_lt(rc, 0, "a renewal lost the lease (a 60 s lease, renewed %llu ms ago): "
                     "%d", (unsigned long long)(redis_now_ms() - t0), rc);
        cr_assert_lt(redis_now_ms() - t0, 30000, "no renewal through the sentinel within 30 s "
                     "of the primary's stop: %d %s", rc, err);
        snprintf(last, sizeof(last), "%s", err);
        fails++;
        usleep(50000);
    }
    uint64_t promoted_ms = redis_now_ms() - t0;
    assert_holder(&h, 1, A_ADDR, A_OWNER, "renewed on the promoted replica");
    cr_assert_str_eq(role_of(&rep), "master", "the lease renewed, yet the replica is a %s",
                     rep.reply);
    cr_log_info("the primary stopped: %d renewals failed (the slowest in %llu ms, bound %llu; "
                "last: %s), the first through the promoted replica %llu ms after the stop",
                fails, (unsigned long long)stalled, (unsigned long long)bound, last,
                (unsigned long long)promoted_ms);
    cr_assert_gt(fails, 0, "no renewal failed while the primary was stopped");
    struct lease *c = open_url(url, T);
    rc = TIMED(worst, bound, "a fresh second owner, the old primary stopped: acquire",
               lease_acquire(c, C_ADDR, C_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "C sees A on the new primary");

    /* awake, still a primary: the standby's write goes to the new one; the
     * reader reads the stale copy (which names the same holder) */
    redis_signal(&p, SIGCONT);
    uint64_t woke = redis_now_ms();
    rc = TIMED(worst, bound, "standby, the old primary just awake: acquire",
               lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "a standby connected to the old primary since before its stop: %d %s",
                 rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "B sees A");
    rc = TIMED(worst, bound, "reader, the old primary just awake: leader",
               lease_leader(reader, &h, err, sizeof(err)));
    char role[32];
    snprintf(role, sizeof(role), "%s", role_of(&p));
    cr_log_info("the old primary, just awake, is a %s and holds '%s'", role,
                redis_str(&p, "GET umbp:ps:leader"));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "the reader sees A");

    /* demoted (bounded), the holder renewing on the new primary meanwhile */
    int renewals = 0;
    while (strcmp(role_of(&p), "slave") != 0) {
        cr_assert_lt(redis_now_ms() - woke, 60000, "the sentinel did not demote the old "
                     "primary within 60 s of SIGCONT: ROLE says %s", p.reply);
        uint64_t quiet = 0;
        rc = TIMED(quiet, bound, "renew, waiting for the demotion",
                   lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err)));
        cr_assert_eq(rc, 1, "a renewal on the new primary failed while the old one woke: "
                     "%d %s", rc, err);
        worst = quiet > worst ? quiet : worst;
        renewals++;
        usleep(200000);
    }
    cr_log_info("the old primary demoted %llu ms after SIGCONT (%d renewals meanwhile); "
                "synced with the new primary %llu ms later",
                (unsigned long long)(redis_now_ms() - woke), renewals,
                (unsigned long long)wait_info(&p, "master_link_status:up", 30000));
    /* the demotion closed the reader's connection (Sentinel kills the
     * demoted primary's clients with it): a failed call at most, never
     * "nobody leads", then the new primary */
    int tries = 0;
    while ((rc = TIMED(worst, bound, "reader, the old primary demoted: leader",
                       lease_leader(reader, &h, err, sizeof(err)))) != 1) {
        cr_assert_lt(rc, 0, "the reader found no leader: %d", rc);
        cr_assert_lt(++tries, 3, "the reader never read the new primary: %d %s", rc, err);
    }
    assert_holder(&h, 1, A_ADDR, A_OWNER, "the reader sees A");

    /* one holder: the standby and a fresh owner see A */
    rc = TIMED(worst, bound, "standby: acquire",
               lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "B sees A");
    rc = TIMED(worst, bound, "a fresh second owner: acquire",
               lease_acquire(c, C_ADDR, C_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "C sees A");
    cr_assert_str_eq(redis_str(&rep, "GET umbp:ps:leader"), value, "the new primary");
    cr_assert_str_eq(redis_str(&rep, "GET umbp:ps:epoch"), "1", "an epoch was handed out");

    /* released: the standby takes it, on the new primary */
    rc = TIMED(worst, bound, "release", lease_release(a, &mine, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    cr_assert_str_eq(redis_str(&rep, "GET umbp:ps:leader"), "(nil)");
    rc = TIMED(worst, bound, "standby, the lease free: acquire",
               lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    assert_holder(&h, 2, B_ADDR, B_OWNER, "B takes the released lease");
    cr_assert_str_eq(redis_str(&rep, "GET umbp:ps:leader"), "2 " B_ADDR " " B_OWNER);
    rc = TIMED(worst, bound, "the old holder: renew",
               lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    assert_holder(&h, 2, B_ADDR, B_OWNER, "A sees B");
    cr_log_info("the slowest call outside the stop: %llu ms", (unsigned long long)worst);
    lease_close(a);
    lease_close(reader);
    lease_close(b);
    lease_close(c);
    redis_stop(&sen);
    redis_stop(&rep);
    redis_stop(&p);
}

/* A holder stalled together with the primary (one paused machine: its
 * lease makes no call while the primary is stopped), and a standby
 * stalled with them.  Meanwhile the sentinel promotes the replica, the
 * holder's key expires there and a standby awake takes the lease with
 * epoch 2.  Woken, the old primary still answers as a primary (Sentinel
 * demotes it only seconds later), its copy of the holder's key expired
 * too, and the stalled leases' connections to it are intact.  Their
 * writes must not go there: the stalled standby's acquire and the
 * holder's renewal find the new holder (0, naming it), not a second
 * holder (the standby with the same epoch 2, the holder with epoch 1). */
Test(lease, through_sentinels_a_holder_stalled_with_the_primary_finds_the_new_holder)
{
    redis_need();
    struct redis p, rep, sen;
    redis_start_with_sentinel(&p, &rep, &sen, "svc", NULL);
    const uint64_t T = 500, bound = stall_bound(T), ttl = 1500;
    char url[256], err[ERRLEN];
    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%u/svc/hs", sen.port);
    struct lease *a = open_url(url, T), *e = open_url(url, T), *d = open_url(url, T);
    struct lease_holder mine, h, hd;
    uint64_t worst = 0;
    int rc = TIMED(worst, bound, "A: acquire",
                   lease_acquire(a, A_ADDR, A_OWNER, ttl, 0, &mine, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    uint64_t held = redis_now_ms();
    rc = TIMED(worst, bound, "C, stalled later: acquire",
               lease_acquire(e, C_ADDR, C_OWNER, ttl, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    await_replica(&rep, "umbp:hs:leader", "1 " A_ADDR " " A_OWNER);

    /* the primary, A and C stop (A and C simply make no call); B, awake,
     * takes the lease once it has expired on the promoted replica */
    redis_signal(&p, SIGSTOP);
    uint64_t t0 = redis_now_ms();
    while ((rc = TIMED(worst, bound, "B: acquire, the primary stopped",
                       lease_acquire(d, B_ADDR, B_OWNER, ttl, 1, &hd, err, sizeof(err)))) != 1) {
        cr_assert_lt(redis_now_ms() - t0, 30000, "B never took the lease on the promoted "
                     "replica: %d %s", rc, err);
        usleep(100000);
    }
    assert_holder(&hd, 2, B_ADDR, B_OWNER, "B on the promoted replica");
    cr_log_info("B took the lease %llu ms after the primary's stop",
                (unsigned long long)(redis_now_ms() - t0));
    while (redis_now_ms() - held < ttl + 500) /* A's key expired in the old primary too */
        usleep(50000);

    redis_signal(&p, SIGCONT);
    rc = TIMED(worst, bound, "C, stalled with the primary: acquire",
               lease_acquire(e, C_ADDR, C_OWNER, ttl, 0, &h, err, sizeof(err)));
    cr_log_info("the old primary, just awake, is a %s", role_of(&p));
    cr_assert_eq(rc, 0, "the stalled standby took the lease (%s) while B holds it: %d",
                 rc == 1 ? value_of(&h) : err, rc);
    assert_holder(&h, 2, B_ADDR, B_OWNER, "C sees B");
    rc = TIMED(worst, bound, "A, stalled with the primary: renew",
               lease_renew(a, &mine, ttl, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "the stalled holder kept the lease (%s) while B holds it: %d",
                 rc == 1 ? value_of(&mine) : err, rc);
    assert_holder(&h, 2, B_ADDR, B_OWNER, "A sees B");
    cr_assert_str_eq(redis_str(&rep, "GET umbp:hs:leader"), "2 " B_ADDR " " B_OWNER,
                     "the new primary");
    cr_log_info("the slowest call: %llu ms (bound %llu)", (unsigned long long)worst,
                (unsigned long long)bound);
    lease_close(a);
    lease_close(d);
    lease_close(e);
    redis_stop(&sen);
    redis_stop(&rep);
    redis_stop(&p);
}

/* ---- TLS (rediss://) against real TLS Redis processes --------------------------------- */

/* The test's certificates (tests/common/redis_fixture.h), made at test
 * time; removed by tls_fini, which Criterion runs after a failed
 * assertion too. */
static struct redis_certs g_certs;

static void tls_fini(void) { redis_certs_remove(&g_certs); }

/* Skips without TLS (saying why), else makes the certificates. */
static void tls_init(void)
{
    redis_tls_need();
    redis_certs_make(&g_certs);
}

/* A Redis with a plain port and a TLS port (its certificate: certs->server
 * unless server/key name another), clients' certificates asked for if
 * auth_clients, with extra arguments (NULL-terminated, or NULL). */
static void tls_start(struct redis *r, const struct redis_certs *certs, bool auth_clients,
                      const char *const *extra)
{
    memset(r, 0, sizeof(*r));
    r->tls = certs;
    r->tls_auth_clients = auth_clients;
    for (int i = 0; extra && extra[i] && i < 23; i++)
        r->extra[i] = extra[i];
    redis_start(r);
}

/* "rediss://127.0.0.1:<tls port>/<cluster>?tls_ca_file=<ca>[&more]" */
static const char *tls_url(char *buf, size_t cap, const struct redis *r, const char *cluster,
                           const char *ca, const char *more)
{
    snprintf(buf, cap, "rediss://127.0.0.1:%u/%s?tls_ca_file=%s%s%s", r->tls_port, cluster, ca,
             more && *more ? "&" : "", more ? more : "");
    return buf;
}

/* A lease on url: acquire, renew, leader, a second owner, release, and a
 * new holder, each checked in Redis over its plain port (r); cluster is
 * the URL's; the epochs continue from epoch0. */
static void tls_round(struct redis *r, const char *url, const char *cluster, uint64_t epoch0)
{
    char err[ERRLEN], key[96], v[256];
    snprintf(key, sizeof(key), "umbp:%s:leader", cluster);
    struct lease *a = open_url(url, 1000), *b = open_url(url, 1000);
    struct lease_holder mine, h;
    int rc = lease_acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &mine, err, sizeof(err));
    cr_assert_eq(rc, 1, "acquire over TLS (%s): %d %s", url, rc, err);
    assert_holder(&mine, epoch0 + 1, A_ADDR, A_OWNER, "acquired over TLS");
    snprintf(v, sizeof(v), "%s", value_of(&mine));
    cr_assert_str_eq(redis_str(r, "GET %s", key), v, "the lease is not in Redis");
    long long ttl = atoll(redis_str(r, "PTTL %s", key));
    cr_assert(ttl > 0 && ttl <= TTL_LONG, "PTTL %lld", ttl);
    rc = lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err));
    cr_assert_eq(rc, 1, "renew over TLS: %d %s", rc, err);
    rc = lease_leader(b, &h, err, sizeof(err));
    cr_assert_eq(rc, 1, "leader over TLS: %d %s", rc, err);
    assert_holder(&h, epoch0 + 1, A_ADDR, A_OWNER, "leader() over TLS");
    rc = lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err));
    cr_assert_eq(rc, 0, "a second owner over TLS: %d %s", rc, err);
    assert_holder(&h, epoch0 + 1, A_ADDR, A_OWNER, "B sees A");
    rc = lease_release(a, &mine, err, sizeof(err));
    cr_assert_eq(rc, 0, "release over TLS: %d %s", rc, err);
    cr_assert_str_eq(redis_str(r, "GET %s", key), "(nil)", "the release did not reach Redis");
    rc = lease_leader(a, &h, err, sizeof(err));
    cr_assert_eq(rc, 0, "nobody leads after the release: %d %s", rc, err);
    rc = lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err));
    cr_assert_eq(rc, 1, "B takes the released lease: %d %s", rc, err);
    assert_holder(&h, epoch0 + 2, B_ADDR, B_OWNER, "B over TLS");
    cr_assert_str_eq(redis_str(r, "GET %s", key), value_of(&h));
    rc = lease_release(b, &h, err, sizeof(err));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    lease_close(a);
    lease_close(b);
}

/* rediss:// with tls_ca_file: every call works over the TLS port, and what
 * it writes is in Redis (read over the plain port).  The server's
 * certificate names IP:127.0.0.1 and DNS:localhost: the URL's IP is
 * verified as an IP, "localhost" as a name (and its ::1 address, where
 * Redis does not listen, is passed over for 127.0.0.1), and
 * tls_server_name=localhost verifies that name at 127.0.0.1. */
Test(lease, tls_acquire_renew_leader_release_over_rediss, .fini = tls_fini)
{
    tls_init();
    struct redis r;
    tls_start(&r, &g_certs, false, NULL);
    char url[512];
    tls_round(&r, tls_url(url, sizeof(url), &r, "tls1", g_certs.ca, NULL), "tls1", 0);
    snprintf(url, sizeof(url), "rediss://localhost:%u/tls2?tls_ca_file=%s", r.tls_port,
             g_certs.ca);
    tls_round(&r, url, "tls2", 0);
    tls_round(&r, tls_url(url, sizeof(url), &r, "tls3", g_certs.ca, "tls_server_name=localhost"),
              "tls3", 0);
    redis_stop(&r);
}

/* TLS and a password: AUTH goes over TLS from the password file. */
Test(lease, tls_with_a_password_file, .fini = tls_fini)
{
    tls_init();
    static const char *const extra[] = {"--requirepass", "tls-pw-3381", NULL};
    struct redis r;
    tls_start(&r, &g_certs, false, extra);
    r.password = "tls-pw-3381";
    char good[160], wrong[160], more[256], url[512], err[ERRLEN];
    snprintf(good, sizeof(good), "%s/pw", g_certs.dir);
    snprintf(wrong, sizeof(wrong), "%s/wrong", g_certs.dir);
    write_pw(good, "tls-pw-3381", 0600);
    write_pw(wrong, "not-it-5150", 0600);
    struct lease *l;
    struct lease_holder h;
    /* none: the store asks for one, over TLS */
    l = open_url(tls_url(url, sizeof(url), &r, "tpw", g_certs.ca, NULL), 1000);
    int rc = lease_leader(l, &h, err, sizeof(err));
    cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
    cr_assert(has(err, "requires a password") && has(err, url), "%s", err);
    lease_close(l);
    /* a wrong one: refused, naming the file, never the password */
    snprintf(more, sizeof(more), "password_file=%s", wrong);
    l = open_url(tls_url(url, sizeof(url), &r, "tpw", g_certs.ca, more), 1000);
    rc = lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err));
    cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
    cr_assert(has(err, "AUTH") && has(err, wrong), "%s", err);
    cr_assert_null(strstr(err, "not-it-5150"), "the password is in the message: %s", err);
    lease_close(l);
    /* the right one: the lease works */
    snprintf(more, sizeof(more), "password_file=%s", good);
    tls_round(&r, tls_url(url, sizeof(url), &r, "tpw", g_certs.ca, more), "tpw", 0);
    redis_stop(&r);
}

/* Verification is on: a CA that did not sign the server's certificate,
 * or none (the system's trust store, which does not hold the test's CA),
 * refuses every call with -EKEYREJECTED naming the failure and the CA
 * file, bounded, and nothing reaches Redis; the right CA then works on
 * the same Redis. */
Test(lease, tls_a_ca_that_did_not_sign_the_certificate_is_refused, .fini = tls_fini)
{
    tls_init();
    struct redis r;
    tls_start(&r, &g_certs, false, NULL);
    const uint64_t T = 500, bound = stall_bound(T);
    char url[512], err[ERRLEN], at[64];
    snprintf(at, sizeof(at), "TLS handshake with 127.0.0.1:%u", r.tls_port);
    uint64_t worst = 0;
    struct lease_holder h, mine = holder(1, A_ADDR, A_OWNER);
    for (int k = 0; k < 2; k++) {
        if (k == 0)
            tls_url(url, sizeof(url), &r, "tca", g_certs.other_ca, NULL);
        else
            snprintf(url, sizeof(url), "rediss://127.0.0.1:%u/tca", r.tls_port);
        struct lease *l = open_url(url, T);
        for (int round = 0; round < 2; round++) {
            int rc[4];
            rc[0] = TIMED(worst, bound, "wrong CA: acquire",
                          lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
            rc[1] = TIMED(worst, bound, "wrong CA: renew",
                          lease_renew(l, &mine, TTL_LONG, &h, err, sizeof(err)));
            rc[2] = TIMED(worst, bound, "wrong CA: leader", lease_leader(l, &h, err, sizeof(err)));
            rc[3] = TIMED(worst, bound, "wrong CA: release",
                          lease_release(l, &mine, err, sizeof(err)));
            for (int i = 0; i < 4; i++)
                cr_assert_eq(rc[i], -EKEYREJECTED, "call %d with %s: %d", i, url, rc[i]);
            cr_assert(has(err, at) && has(err, "certificate verify failed") && has(err, url),
                      "%s", err);
            if (k == 0)
                cr_assert(has(err, "tls_ca_file") && has(err, g_certs.other_ca), "%s", err);
            else
                cr_assert(has(err, "system's trust store"), "%s", err);
        }
        lease_close(l);
    }
    cr_assert_str_eq(redis_str(&r, "GET umbp:tca:leader"), "(nil)", "a refused call wrote");
    cr_assert_str_eq(redis_str(&r, "GET umbp:tca:epoch"), "(nil)", "a refused call wrote");
    cr_log_info("a CA that did not sign: the slowest call took %llu ms",
                (unsigned long long)worst);
    tls_round(&r, tls_url(url, sizeof(url), &r, "tca", g_certs.ca, NULL), "tca", 0);
    redis_stop(&r);
}

/* The name verified: tls_server_name that is not in the certificate (a
 * name, an IP) is refused naming it; a certificate with no IP in it
 * (DNS:localhost only) refuses rediss://127.0.0.1 (the IP is verified as
 * one), and serves tls_server_name=localhost and rediss://localhost. */
Test(lease, tls_a_name_the_certificate_does_not_have_is_refused, .fini = tls_fini)
{
    tls_init();
    struct redis r, d;
    tls_start(&r, &g_certs, false, NULL);
    struct redis_certs dns = g_certs; /* the server's certificate: DNS:localhost only */
    snprintf(dns.server, sizeof(dns.server), "%s", g_certs.server_dns);
    snprintf(dns.server_key, sizeof(dns.server_key), "%s", g_certs.server_dns_key);
    tls_start(&d, &dns, false, NULL);
    const uint64_t T = 500, bound = stall_bound(T);
    char url[512], err[ERRLEN];
    uint64_t worst = 0;
    struct lease_holder h;
    static const struct {
        const char *name, *why;
    } wrong[] = {
        {"redis.example.com", "hostname mismatch"},
        {"127.0.0.2", "IP address mismatch"},
        {"::1", "IP address mismatch"},
    };
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        char more[96];
        snprintf(more, sizeof(more), "tls_server_name=%s", wrong[i].name);
        struct lease *l = open_url(tls_url(url, sizeof(url), &r, "tsn", g_certs.ca, more), T);
        int rc = TIMED(worst, bound, "a wrong tls_server_name: leader",
                       lease_leader(l, &h, err, sizeof(err)));
        cr_assert_eq(rc, -EKEYREJECTED, "%s: %d %s", url, rc, err);
        char quoted[96];
        snprintf(quoted, sizeof(quoted), "\"%s\" (tls_server_name)", wrong[i].name);
        cr_assert(has(err, quoted) && has(err, wrong[i].why) && has(err, url), "%s", err);
        rc = TIMED(worst, bound, "a wrong tls_server_name: acquire",
                   lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
        cr_assert_eq(rc, -EKEYREJECTED, "%d %s", rc, err);
        lease_close(l);
    }
    /* the certificate without the IP: the URL's IP is verified as one */
    struct lease *l = open_url(tls_url(url, sizeof(url), &d, "tsn", g_certs.ca, NULL), T);
    int rc = TIMED(worst, bound, "a certificate without 127.0.0.1: acquire",
                   lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, -EKEYREJECTED, "%d %s", rc, err);
    cr_assert(has(err, "IP address mismatch") && has(err, "\"127.0.0.1\" (the host dialled"),
              "%s", err);
    lease_close(l);
    cr_assert_str_eq(redis_str(&d, "GET umbp:tsn:leader"), "(nil)", "a refused call wrote");
    cr_log_info("a name not in the certificate: the slowest call took %llu ms",
                (unsigned long long)worst);
    tls_round(&d, tls_url(url, sizeof(url), &d, "tsn", g_certs.ca, "tls_server_name=localhost"),
              "tsn", 0);
    snprintf(url, sizeof(url), "rediss://localhost:%u/tsn2?tls_ca_file=%s", d.tls_port,
             g_certs.ca);
    tls_round(&d, url, "tsn2", 0);
    redis_stop(&d);
    redis_stop(&r);
}

/* Mutual TLS (--tls-auth-clients yes): without a client certificate, or
 * with one its CA did not sign, every call is refused (-EACCES) saying
 * so; with one it did, served.  A key file others may read, a key that is
 * not the certificate's, a missing file: refused at open, named. */
Test(lease, tls_mutual_a_client_certificate_is_required_then_served, .fini = tls_fini)
{
    tls_init();
    struct redis r;
    tls_start(&r, &g_certs, true, NULL);
    const uint64_t T = 500, bound = stall_bound(T);
    char url[512], more[320], err[ERRLEN];
    uint64_t worst = 0;
    struct lease_holder h, mine = holder(1, A_ADDR, A_OWNER);
    /* none */
    struct lease *l = open_url(tls_url(url, sizeof(url), &r, "mtls", g_certs.ca, NULL), T);
    for (int round = 0; round < 2; round++) {
        int rc = TIMED(worst, bound, "no client certificate: acquire",
                       lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
        cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
        cr_assert(has(err, "client certificate") && has(err, "tls_cert_file") && has(err, url),
                  "%s", err);
        rc = TIMED(worst, bound, "no client certificate: renew",
                   lease_renew(l, &mine, TTL_LONG, &h, err, sizeof(err)));
        cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
        rc = TIMED(worst, bound, "no client certificate: leader",
                   lease_leader(l, &h, err, sizeof(err)));
        cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
    }
    lease_close(l);
    /* one by a CA the server does not trust */
    snprintf(more, sizeof(more), "tls_cert_file=%s&tls_key_file=%s", g_certs.other_client,
             g_certs.other_client_key);
    l = open_url(tls_url(url, sizeof(url), &r, "mtls", g_certs.ca, more), T);
    int rc = TIMED(worst, bound, "a client certificate by another CA: acquire",
                   lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, -EACCES, "%d %s", rc, err);
    cr_assert(has(err, "refused our client certificate") && has(err, g_certs.other_client),
              "%s", err);
    lease_close(l);
    cr_assert_str_eq(redis_str(&r, "GET umbp:mtls:leader"), "(nil)", "a refused call wrote");
    cr_log_info("mutual TLS refused: the slowest call took %llu ms", (unsigned long long)worst);
    /* the right one */
    snprintf(more, sizeof(more), "tls_cert_file=%s&tls_key_file=%s", g_certs.client,
             g_certs.client_key);
    tls_round(&r, tls_url(url, sizeof(url), &r, "mtls", g_certs.ca, more), "mtls", 0);

    /* refused at open, named */
    char open_key[160], junk[160];
    snprintf(open_key, sizeof(open_key), "%s/open.key", g_certs.dir);
    snprintf(junk, sizeof(junk), "%s/junk.pem", g_certs.dir);
    FILE *fp = fopen(junk, "w");
    cr_assert_not_null(fp);
    fputs("not a certificate\n", fp);
    fclose(fp);
    cr_assert_eq(chmod(junk, 0600), 0);
    fp = fopen(open_key, "w"); /* a copy of the client's key, mode 0644 */
    cr_assert_not_null(fp);
    fputs(tu_slurp(g_certs.client_key), fp);
    fclose(fp);
    cr_assert_eq(chmod(open_key, 0644), 0);
    const struct {
        const char *ca, *cert, *key;
        int rc;
        const char *part, *part2;
    } bad[] = {
        {g_certs.ca, g_certs.client, open_key, -EACCES, "chmod 600", open_key},
        {g_certs.ca, g_certs.client, g_certs.other_client_key, -EINVAL,
         "is not the key of tls_cert_file", g_certs.other_client_key},
        {g_certs.ca, g_certs.client, "/nonexistent/client.key", -ENOENT, "tls_key_file",
         "/nonexistent/client.key"},
        {g_certs.ca, "/nonexistent/client.pem", g_certs.client_key, -ENOENT, "tls_cert_file",
         "/nonexistent/client.pem"},
        {"/nonexistent/ca.pem", g_certs.client, g_certs.client_key, -ENOENT, "tls_ca_file",
         "/nonexistent/ca.pem"},
        {junk, g_certs.client, g_certs.client_key, -EINVAL, "no CA certificate", junk},
        {g_certs.ca, junk, g_certs.client_key, -EINVAL, "tls_cert_file", "no certificate"},
        {g_certs.ca, g_certs.client, junk, -EINVAL, "tls_key_file", "no private key"},
        {g_certs.dir, g_certs.client, g_certs.client_key, -EINVAL, "tls_ca_file",
         "not a regular file"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(url, sizeof(url), "rediss://127.0.0.1:%u/mtls?tls_ca_file=%s&tls_cert_file=%s&"
                 "tls_key_file=%s", r.tls_port, bad[i].ca, bad[i].cert, bad[i].key);
        l = NULL;
        rc = lease_open(url, T, &l, err, sizeof(err));
        cr_log_info("open %zu: %d %s", i, rc, err);
        cr_expect_eq(rc, bad[i].rc, "%zu: %d %s", i, rc, err);
        cr_expect(has(err, bad[i].part) && has(err, bad[i].part2) && has(err, url), "%zu: %s",
                  i, err);
        if (rc == 0)
            lease_close(l);
    }
    if (geteuid() != 0) { /* root reads any file */
        cr_assert_eq(chmod(junk, 0), 0);
        snprintf(url, sizeof(url), "rediss://127.0.0.1:%u/mtls?tls_ca_file=%s", r.tls_port, junk);
        rc = lease_open(url, T, &l, err, sizeof(err));
        cr_assert_eq(rc, -EACCES, "an unreadable CA file: %d %s", rc, err);
        cr_assert(has(err, junk), "%s", err);
    } else {
        cr_log_info("running as root: an unreadable file is not tested (root reads it)");
    }
    redis_stop(&r);
}

/* The ports mixed up: rediss:// to the plain port (Redis reads the
 * ClientHello as an inline command: it answers an error, which is not
 * TLS, or waits for a newline, and the handshake times out), and
 * redis:// to the TLS port (Redis's TLS layer refuses the plain text):
 * every call fails within 3 x the timeout + 1 s, naming the problem. */
Test(lease, tls_and_plain_ports_mixed_up_fail_bounded, .fini = tls_fini)
{
    tls_init();
    struct redis r;
    tls_start(&r, &g_certs, false, NULL);
    const uint64_t T = 500, bound = stall_bound(T);
    char url[512], err[ERRLEN];
    struct lease_holder h, mine = holder(1, A_ADDR, A_OWNER);
    uint64_t worst = 0;
    /* rediss:// to the plain port */
    snprintf(url, sizeof(url), "rediss://127.0.0.1:%u/mix?tls_ca_file=%s", r.port, g_certs.ca);
    for (int round = 0; round < 4; round++) {
        struct lease *l = open_url(url, T);
        int rc = TIMED(worst, bound, "rediss:// to the plain port: acquire",
                       lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
        cr_assert(rc == -EPROTO || rc == -ETIMEDOUT || rc == -ECONNRESET, "%d %s", rc, err);
        cr_assert(has(err, "TLS handshake with") && has(err, url), "%s", err);
        cr_assert(has(err, "does not speak TLS") || has(err, "tls-port"), "%s", err);
        rc = TIMED(worst, bound, "rediss:// to the plain port: leader",
                   lease_leader(l, &h, err, sizeof(err)));
        cr_assert(rc == -EPROTO || rc == -ETIMEDOUT || rc == -ECONNRESET, "%d %s", rc, err);
        lease_close(l);
    }
    uint64_t worst_tls = worst;
    worst = 0;
    /* redis:// to the TLS port */
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/mix", r.tls_port);
    for (int round = 0; round < 4; round++) {
        struct lease *l = open_url(url, T);
        int rc = TIMED(worst, bound, "redis:// to the TLS port: acquire",
                       lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
        cr_assert(rc == -EPROTO || rc == -ECONNRESET || rc == -ETIMEDOUT, "%d %s", rc, err);
        cr_assert(has(err, "TLS") && has(err, "rediss://") && has(err, url), "%s", err);
        rc = TIMED(worst, bound, "redis:// to the TLS port: renew",
                   lease_renew(l, &mine, TTL_LONG, &h, err, sizeof(err)));
        cr_assert(rc == -EPROTO || rc == -ECONNRESET || rc == -ETIMEDOUT, "%d %s", rc, err);
        rc = TIMED(worst, bound, "redis:// to the TLS port: leader",
                   lease_leader(l, &h, err, sizeof(err)));
        cr_assert(rc == -EPROTO || rc == -ECONNRESET || rc == -ETIMEDOUT, "%d %s", rc, err);
        lease_close(l);
    }
    cr_log_info("the ports mixed up (timeout %llu ms, bound %llu): rediss:// to the plain port "
                "took at most %llu ms, redis:// to the TLS port %llu ms", (unsigned long long)T,
                (unsigned long long)bound, (unsigned long long)worst_tls,
                (unsigned long long)worst);
    cr_assert_str_eq(redis_str(&r, "GET umbp:mix:leader"), "(nil)", "a failed call wrote");
    redis_stop(&r);
}

/* A TLS Redis stopped (SIGSTOP) mid-session: the kernel still accepts, so
 * a connected lease's command and a fresh lease's handshake each wait out
 * the timeout (bounded), and work after SIGCONT; killed, every call fails
 * bounded, and a restart (empty, same ports) is re-taken by the holder. */
Test(lease, tls_redis_stopped_calls_are_bounded_then_work_after_sigcont, .fini = tls_fini)
{
    tls_init();
    struct redis r;
    tls_start(&r, &g_certs, false, NULL);
    const uint64_t T = 300, bound = stall_bound(T);
    char url[512], err[ERRLEN];
    tls_url(url, sizeof(url), &r, "tstop", g_certs.ca, NULL);
    struct lease *a = open_url(url, T), *b = open_url(url, T);
    struct lease_holder mine, h;
    uint64_t worst = 0;
    int rc = lease_acquire(a, A_ADDR, A_OWNER, TTL_LONG, 0, &mine, err, sizeof(err));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    rc = lease_leader(b, &h, err, sizeof(err));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    redis_signal(&r, SIGSTOP);
    for (int round = 0; round < 2; round++) {
        struct lease *fresh = open_url(url, T);
        rc = TIMED(worst, bound, "stopped: the holder's renew",
                   lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err)));
        cr_assert_eq(rc, -ETIMEDOUT, "%d %s", rc, err);
        rc = TIMED(worst, bound, "stopped: a reader's leader", lease_leader(b, &h, err,
                                                                             sizeof(err)));
        cr_assert_eq(rc, -ETIMEDOUT, "%d %s", rc, err);
        cr_assert(has(err, url), "%s", err);
        rc = TIMED(worst, bound, "stopped: a fresh lease's acquire",
                   lease_acquire(fresh, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
        cr_assert_eq(rc, -ETIMEDOUT, "%d %s", rc, err);
        cr_assert(has(err, "TLS handshake") && has(err, "no answer within the timeout"), "%s",
                  err);
        lease_close(fresh);
    }
    cr_log_info("a TLS Redis stopped: the slowest call took %llu ms (timeout %llu, bound %llu)",
                (unsigned long long)worst, (unsigned long long)T, (unsigned long long)bound);
    redis_signal(&r, SIGCONT);
    rc = UNTIL_OK(lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "the holder renews after SIGCONT: %d %s", rc, err);
    rc = UNTIL_OK(lease_leader(b, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    assert_holder(&h, 1, A_ADDR, A_OWNER, "after SIGCONT");
    rc = lease_acquire(b, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err));
    cr_assert_eq(rc, 0, "%d %s", rc, err);

    /* killed: refused or reset, bounded; back empty on the same ports */
    redis_signal(&r, SIGKILL);
    worst = 0;
    rc = TIMED(worst, bound, "killed: the holder's renew",
               lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err)));
    cr_assert(rc == -ECONNRESET || rc == -ECONNREFUSED, "%d %s", rc, err);
    rc = TIMED(worst, bound, "killed: leader", lease_leader(b, &h, err, sizeof(err)));
    cr_assert(rc == -ECONNRESET || rc == -ECONNREFUSED, "%d %s", rc, err);
    rc = TIMED(worst, bound, "killed: leader again", lease_leader(b, &h, err, sizeof(err)));
    cr_assert_eq(rc, -ECONNREFUSED, "%d %s", rc, err);
    redis_start(&r);
    rc = UNTIL_OK(lease_renew(a, &mine, TTL_LONG, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "the holder re-takes its key in the empty store: %d %s", rc, err);
    cr_assert_str_eq(redis_str(&r, "GET umbp:tstop:leader"), value_of(&mine));
    lease_close(a);
    lease_close(b);
    redis_stop(&r);
}

/* rediss+sentinel://: a primary, its replica (replicating over TLS) and a
 * sentinel, all on TLS ports (the sentinel watches the primary's TLS port,
 * tls-replication yes); the lease asks the sentinel over TLS and writes to
 * the primary over TLS, and follows a failover (the primary killed, the
 * replica promoted).  A CA that did not sign: refused at the sentinel,
 * named; redis+sentinel:// to the sentinel's plain port: it names the
 * primary's TLS port, where plain text fails, named. */
Test(lease, tls_through_sentinels, .fini = tls_fini)
{
    tls_init();
    struct redis p, rep, sen;
    redis_start_with_sentinel_tls(&p, &rep, &sen, "svc", NULL, &g_certs);
    redisReply *x = redis_cmd(&sen, "SENTINEL get-master-addr-by-name svc");
    cr_assert(x->type == REDIS_REPLY_ARRAY && x->elements == 2 &&
              x->element[1]->type == REDIS_REPLY_STRING &&
              atoi(x->element[1]->str) == (int)p.tls_port,
              "the sentinel does not name the primary's TLS port %u", p.tls_port);
    freeReplyObject(x);
    const uint64_t T = 1000, bound = stall_bound(T);
    char url[512], err[ERRLEN];
    uint64_t worst = 0;
    snprintf(url, sizeof(url), "rediss+sentinel://127.0.0.1:%u/svc/tsen?tls_ca_file=%s",
             sen.tls_port, g_certs.ca);
    struct lease *l = open_url(url, T);
    struct lease_holder mine, h;
    int rc = TIMED(worst, bound, "through a TLS sentinel: acquire",
                   lease_acquire(l, A_ADDR, A_OWNER, TTL_LONG, 0, &mine, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    assert_holder(&mine, 1, A_ADDR, A_OWNER, "through a TLS sentinel");
    cr_assert_str_eq(redis_str(&p, "GET umbp:tsen:leader"), "1 " A_ADDR " " A_OWNER,
                     "the lease is not in the primary");
    rc = TIMED(worst, bound, "through a TLS sentinel: renew",
               lease_renew(l, &mine, TTL_LONG, &h, err, sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    rc = TIMED(worst, bound, "through a TLS sentinel: leader", lease_leader(l, &h, err,
                                                                            sizeof(err)));
    cr_assert_eq(rc, 1, "%d %s", rc, err);
    await_replica(&rep, "umbp:tsen:leader", "1 " A_ADDR " " A_OWNER);

    /* a CA that did not sign: refused at the sentinel */
    char bad[512];
    snprintf(bad, sizeof(bad), "rediss+sentinel://127.0.0.1:%u/svc/tsen?tls_ca_file=%s",
             sen.tls_port, g_certs.other_ca);
    struct lease *w = open_url(bad, T);
    rc = TIMED(worst, bound, "a wrong CA, through the sentinel: leader",
               lease_leader(w, &h, err, sizeof(err)));
    cr_assert_eq(rc, -EKEYREJECTED, "%d %s", rc, err);
    cr_assert(has(err, "sentinel 1") && has(err, "certificate verify failed") &&
              has(err, g_certs.other_ca), "%s", err);
    lease_close(w);
    /* plain text to the sentinel's plain port: it names the TLS primary */
    snprintf(bad, sizeof(bad), "redis+sentinel://127.0.0.1:%u/svc/tsen", sen.port);
    w = open_url(bad, T);
    rc = TIMED(worst, bound, "plain text through the sentinel to the TLS primary: leader",
               lease_leader(w, &h, err, sizeof(err)));
    cr_assert(rc == -EPROTO || rc == -ECONNRESET || rc == -ETIMEDOUT, "%d %s", rc, err);
    cr_assert(has(err, "ROLE") && has(err, "TLS"), "%s", err);
    lease_close(w);

    /* the primary killed: the sentinel promotes the replica (over TLS), the
     * holder's renewals go there */
    redis_signal(&p, SIGKILL);
    uint64_t t0 = redis_now_ms();
    int fails = 0;
    char last[ERRLEN] = "";
    uint64_t failing = 0;
    while ((rc = TIMED(failing, bound, "renew, the primary killed",
                       lease_renew(l, &mine, TTL_LONG, &h, err, sizeof(err)))) != 1) {
        cr_assert_lt(rc, 0, "a renewal lost the lease: %d", rc);
        cr_assert_lt(redis_now_ms() - t0, 30000, "no renewal through the TLS sentinel within "
                     "30 s of the primary's death: %d %s", rc, err);
        snprintf(last, sizeof(last), "%s", err);
        fails++;
        usleep(50000);
    }
    cr_log_info("over TLS, the primary killed: %d renewals failed (the slowest in %llu ms; "
                "last: %s), the first through the promoted replica after %llu ms", fails,
                (unsigned long long)failing, last, (unsigned long long)(redis_now_ms() - t0));
    assert_holder(&h, 1, A_ADDR, A_OWNER, "renewed on the promoted replica");
    cr_assert_str_eq(role_of(&rep), "master");
    cr_assert_str_eq(redis_str(&rep, "GET umbp:tsen:leader"), "1 " A_ADDR " " A_OWNER);
    rc = TIMED(worst, bound, "after the failover: a second owner's acquire",
               lease_acquire(l, B_ADDR, B_OWNER, TTL_LONG, 0, &h, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    rc = TIMED(worst, bound, "after the failover: release",
               lease_release(l, &mine, err, sizeof(err)));
    cr_assert_eq(rc, 0, "%d %s", rc, err);
    cr_assert_str_eq(redis_str(&rep, "GET umbp:tsen:leader"), "(nil)");
    cr_log_info("through a TLS sentinel: the slowest call (outside the failover) took %llu ms",
                (unsigned long long)worst);
    lease_close(l);
    redis_stop(&sen);
    redis_stop(&rep);
    redis_stop(&p);
}
