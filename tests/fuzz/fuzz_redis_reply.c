/*
 * fuzz_redis_reply.c - libFuzzer target: umbp-master's leader lease in
 * Redis (net/leader_lease_redis.c over net/redis_conn.c and hiredis's
 * reader) reading a store's replies built from the input, through a real
 * TCP connection on 127.0.0.1 (fuzz_peer.h, on_bytes, plays the store).
 * Each input opens a lease on redis://127.0.0.1:<port>/fz and makes up to
 * four calls (leader, acquire, renew, release), as a master and its
 * clients do.
 *
 * The input: byte 0 picks the calls (2 bits each, four calls, bit pattern
 * 0..3: leader, acquire, renew, release), then the replies: each a u16
 * length (little-endian) and that many bytes, one per command the client
 * sends, in order.  When the input runs out, or a reply is not a whole
 * RESP reply (hiredis's reader says so), the store hangs up after it.
 *
 * Properties, each an abort() when broken (besides ASan / UBSan and those of
 * fuzz_peer.h):
 *   - every command the client sends is a RESP array of bulk strings (the
 *     store's own reader takes it) naming a command the lease uses;
 *   - each call returns what leader_lease.h allows (leader 0 or 1,
 *     acquire and renew 0 or 1, release 0) or one of the documented
 *     negative codes, with err saying what failed;
 *   - a holder it returns is a value the store may hold: epoch 0 (none)
 *     with nothing else, or epoch 1 .. 2^53 with an address and an owner
 *     that format back into a value that parses to the same holder.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_peer.h"
#include "leader_lease.h"
#include "redis_conn.h"
#include "util.h"

static struct fz_peer peer;
static char url[96];

static struct {
    const uint8_t *p;
    size_t n, pos;
    int commands;
} in;

static bool known_command(const redisReply *r)
{
    static const char *const names[] = {"EVAL", "EVALSHA", "GET", "AUTH", "PING", "ROLE",
                                        "SCRIPT", NULL};
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0)
        return false;
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type != REDIS_REPLY_STRING)
            return false;
    for (int i = 0; names[i]; i++)
        if (r->element[0]->len == strlen(names[i]) &&
            !strncasecmp(r->element[0]->str, names[i], r->element[0]->len))
            return true;
    return false;
}

/* Whether bytes are exactly one whole RESP reply (what a store sends). */
static bool whole_reply(const uint8_t *b, size_t len)
{
    redisReader *rd = redisReaderCreate();
    struct redis_reader_bound bound;
    void *rep = NULL;
    FZ_CHECK(rd);
    redis_reader_bound(rd, &bound); /* "*444444442" would take 3.5 GB */
    bool ok = redisReaderFeed(rd, (const char *)b, len) == REDIS_OK &&
              redisReaderGetReply(rd, &rep) == REDIS_OK && rep;
    if (rep)
        freeReplyObject(rep);
    redisReaderFree(rd);
    return ok;
}

static size_t on_bytes(struct fz_peer *p, const uint8_t *b, size_t len, struct proto_buf *out,
                       bool *over)
{
    (void)p;
    /* one command: hiredis's reader takes a client's array as it takes a
     * reply; how many bytes it used is what it has not left buffered */
    redisReader *rd = redisReaderCreate();
    struct redis_reader_bound bound;
    void *cmd = NULL;
    FZ_CHECK(rd);
    redis_reader_bound(rd, &bound);
    FZ_CHECK(redisReaderFeed(rd, (const char *)b, len) == REDIS_OK);
    FZ_CHECK(redisReaderGetReply(rd, &cmd) == REDIS_OK);
    if (!cmd) {
        redisReaderFree(rd);
        return 0; /* more bytes to come */
    }
    size_t used = len - (rd->len - rd->pos);
    if (!known_command(cmd)) {
        fprintf(stderr, "the lease sent a command the store would not know\n");
        abort();
    }
    freeReplyObject(cmd);
    redisReaderFree(rd);
    in.commands++;

    uint16_t rl = 0;
    if (in.n - in.pos >= 2) {
        memcpy(&rl, in.p + in.pos, 2);
        in.pos += 2;
    } else {
        in.pos = in.n;
    }
    size_t take = in.n - in.pos < rl ? in.n - in.pos : rl;
    fz_append(out, in.p + in.pos, take);
    in.pos += take;
    /* nothing more to say, or a reply the client must wait on past it */
    *over = in.pos >= in.n || !whole_reply(in.p + in.pos - take, take);
    return used;
}

static void check_holder(const struct lease_holder *h)
{
    if (h->epoch == 0) {
        FZ_CHECK(!h->address[0] && !h->owner[0]);
        return;
    }
    FZ_CHECK(h->epoch <= (1ull << 53));
    char v[512], err[256];
    struct lease_holder back;
    FZ_CHECK(lease_value_format(h, v, sizeof(v)) == 0);
    FZ_CHECK(lease_value_parse(v, strlen(v), &back, err, sizeof(err)) == 0);
    FZ_CHECK(back.epoch == h->epoch && !strcmp(back.address, h->address) &&
             !strcmp(back.owner, h->owner));
}

static void check_rc(int rc, int hi, const char *err)
{
    static const int codes[] = {-ETIMEDOUT, -ECONNREFUSED, -ECONNRESET, -EPROTO, -EIO,
                                -EACCES, -ENOMEM};
    if (rc >= 0) {
        FZ_CHECK(rc <= hi);
        return;
    }
    bool known = false;
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        known = known || rc == codes[i];
    if (!known) {
        fprintf(stderr, "a lease call returned %d (%s)\n", rc, err);
        abort();
    }
    FZ_CHECK(err[0]);
}

static void cleanup(void) { close(peer.lfd); }

static void setup(void)
{
    umbp_log_set_level(UMBP_LOG_ERROR);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u/fz", (unsigned)fz_peer_listen_tcp(&peer));
    peer.on_bytes = on_bytes;
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!url[0])
        setup();
    memset(&in, 0, sizeof(in));
    in.p = data;
    in.n = size;
    uint8_t calls = size ? data[0] : 0;
    in.pos = size ? 1 : 0;

    struct lease *l = NULL;
    char err[512] = "";
    FZ_CHECK(lease_open(url, 5000, &l, err, sizeof(err)) == 0);
    fz_peer_start(&peer);
    const struct lease_holder mine = {.epoch = 7, .address = "127.0.0.1:7390",
                                      .owner = "fuzz-master"};
    for (int k = 0; k < 4; k++) {
        struct lease_holder h;
        memset(&h, 0x5a, sizeof(h));
        err[0] = 0;
        int rc;
        switch ((calls >> (2 * k)) & 3) {
        case 0:
            rc = lease_leader(l, &h, err, sizeof(err));
            check_rc(rc, 1, err);
            if (rc == 1)
                check_holder(&h);
            break;
        case 1:
            rc = lease_acquire(l, mine.address, mine.owner, 3000, 6, &h, err, sizeof(err));
            check_rc(rc, 1, err);
            if (rc >= 0)
                check_holder(&h);
            break;
        case 2:
            rc = lease_renew(l, &mine, 3000, &h, err, sizeof(err));
            check_rc(rc, 1, err);
            if (rc >= 0)
                check_holder(&h);
            break;
        default:
            rc = lease_release(l, &mine, err, sizeof(err));
            check_rc(rc, 0, err);
            break;
        }
        if (rc < 0)
            break; /* the next call would dial again: nobody listens for it */
    }
    lease_close(l);
    fz_peer_join(&peer);
    /* a redial nobody answered would be the next input's connection */
    struct pollfd q = {.fd = peer.lfd, .events = POLLIN};
    while (poll(&q, 1, 0) == 1) {
        int fd = accept4(peer.lfd, NULL, NULL, SOCK_CLOEXEC);
        FZ_CHECK(fd >= 0);
        close(fd);
    }
    return 0;
}
