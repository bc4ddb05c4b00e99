/*
 * fuzz_lookup_client.c - libFuzzer target: the scheduler's lookup client
 * (lookup/lookup_client.c, embedded mode, over net/session.c and its poll()
 * driver) reading a worker's answers built from the input, through a real
 * Unix socket at the rank's lookup path (fuzz_peer.h plays the worker's
 * lookup service).  Each input makes a fresh client (one rank) and one query
 * of 1..64 keys through umbp_lookup_client_query, as a scheduler calls it.
 *
 * The input: byte 0 is flags, byte 1 the number of keys (1 + byte % 64),
 * then the records and the rest.  The peer answers the client's HELLO and
 * LOOKUP with
 *   - bit 0: a valid HELLO_OK for the HELLO's seq, else nothing;
 *   - bit 1: a LOOKUP_R framed exactly for the LOOKUP (its seq and n), whose
 *     records are the next n input bytes (bit 2: each masked to 0 or 1);
 *   - then every remaining input byte, raw.
 *
 * Properties, each an abort() when broken (besides ASan / UBSan and those of
 * fuzz_peer.h):
 *   - the client's frames are a HELLO of role lookup naming its namespace,
 *     DP index and rank, then one LOOKUP of the query's keys, in order;
 *   - the query returns 0 or a negative code; when not 0 every key misses
 *     (a rank that answers badly has its rows absent) and the prefix is 0;
 *     when 0 the prefix is the run of present keys and every answer is 0 or 1;
 *   - a valid HELLO_OK then a valid LOOKUP_R (bits 0 and 1, every record 0 or
 *     1) is answered 0 with exactly those records, whatever bytes follow.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fuzz_peer.h"
#include "umbp/lookup.h"
#include "umbp/umbp.h"
#include "util.h"

#define NS "0123456789abcdef0123456789abcdef"
#define MAX_KEYS 64

static struct fz_peer peer;
static char dir[64], path[128], json[256];

/* What the peer saw and is to answer (peer thread, then read after join). */
static struct {
    const uint8_t *data;
    size_t size;
    uint32_t nkeys;
    uint64_t hello_seq;
    bool hello_ok;                 /* the HELLO was as it must be */
    int lookups;
    umbp_key_t keys[MAX_KEYS];     /* the LOOKUP's */
    uint32_t lookup_n;
} x;

static void cleanup(void)
{
    close(peer.lfd);
    unlink(path);
    rmdir(dir);
}

static void setup(void)
{
    umbp_log_set_level(UMBP_LOG_ERROR);
    snprintf(dir, sizeof(dir), "/tmp/umbp-fuzz-lkc-%d", (int)getpid());
    FZ_CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST);
    FZ_CHECK(umbp_lookup_socket_path(dir, NS, "", 0, 0, path, sizeof(path)) == 0);
    fz_peer_listen_unix(&peer, path);
    snprintf(json, sizeof(json),
             "{\"mode\":\"embedded\",\"namespace\":\"%s\",\"lookup_dir\":\"%s\","
             "\"num_ranks\":1,\"lookup_timeout_ms\":5000}", NS, dir);
    atexit(cleanup);
}

static bool hello_as_it_must_be(const struct proto_frame *f)
{
    struct proto_hello h;
    if (proto_get_hello(f, &h, NULL, 0) < 0)
        return false;
    return h.role == PROTO_ROLE_LOOKUP && h.version == PROTO_VERSION && h.dp_rank == 0 &&
           h.tp_rank == 0 && strncmp(h.name_space, NS, sizeof(h.name_space)) == 0;
}

static bool on_frame(struct fz_peer *p, const struct proto_frame *f, struct proto_buf *out)
{
    (void)p;
    if (f->type == PROTO_HELLO) {
        FZ_CHECK(x.hello_seq == 0 && x.lookups == 0); /* one HELLO, first */
        x.hello_seq = f->seq;
        x.hello_ok = hello_as_it_must_be(f);
        return false; /* its LOOKUP comes behind it, unanswered */
    }
    FZ_CHECK(f->type == PROTO_LOOKUP && x.hello_seq && f->seq == x.hello_seq + 1);
    FZ_CHECK(f->n == x.nkeys && f->arg == 0); /* no touch: a query never refreshes */
    x.lookups++;
    x.lookup_n = f->n;
    for (uint32_t i = 0; i < f->n; i++)
        FZ_CHECK(proto_get_key(f, i, &x.keys[i]) == 0);

    uint8_t flags = x.size ? x.data[0] : 0;
    size_t pos = x.size < 2 ? x.size : 2;
    if (flags & 1) {
        struct proto_welcome w = {.version = PROTO_VERSION, .lease_ttl_ms = 30000,
                                  .pool_size = 1 << 20, .capacity_bytes = 1 << 20};
        FZ_CHECK(proto_begin(out, PROTO_HELLO_OK, x.hello_seq, 1, 0) == 0 &&
                 proto_put_welcome(out, &w) == 0 && proto_end(out) == 0);
    }
    if (flags & 2) {
        uint8_t rec[MAX_KEYS] = {0};
        for (uint32_t i = 0; i < f->n && pos < x.size; i++, pos++)
            rec[i] = (flags & 4) ? x.data[pos] & 1 : x.data[pos];
        fz_raw_frame(out, PROTO_LOOKUP_R, f->seq, f->n, 0, rec, f->n);
    }
    fz_append(out, x.data + pos, x.size - pos);
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0])
        setup();
    memset(&x, 0, sizeof(x));
    x.data = data;
    x.size = size;
    x.nkeys = 1 + (size > 1 ? data[1] % MAX_KEYS : 0);

    umbp_lookup_client_t *c = NULL;
    if (umbp_lookup_client_create(json, &c) != 0) {
        fprintf(stderr, "umbp_lookup_client_create: %s\n", umbp_last_error());
        abort();
    }
    peer.on_frame = on_frame;
    fz_peer_start(&peer);

    umbp_key_t keys[MAX_KEYS];
    for (uint32_t i = 0; i < x.nkeys; i++) {
        memset(&keys[i], 0, sizeof(keys[i]));
        keys[i].bytes[0] = (uint8_t)i;
        keys[i].bytes[31] = 0xa5;
    }
    uint8_t present[MAX_KEYS];
    memset(present, 0xee, sizeof(present));
    size_t prefix = 12345;
    int rc = umbp_lookup_client_query(c, keys, x.nkeys, 1, NULL, present, &prefix);
    umbp_lookup_client_destroy(c);
    fz_peer_join(&peer);

    FZ_CHECK(x.hello_ok && x.lookups == 1 && x.lookup_n == x.nkeys);
    FZ_CHECK(memcmp(x.keys, keys, x.nkeys * sizeof(keys[0])) == 0);
    FZ_CHECK(rc <= 0 && prefix <= x.nkeys);
    if (rc != 0) {
        FZ_CHECK(prefix == 0);
        for (uint32_t i = 0; i < x.nkeys; i++)
            FZ_CHECK(present[i] == 0);
    } else {
        size_t run = 0;
        while (run < x.nkeys && present[run])
            run++;
        FZ_CHECK(prefix == run);
        for (uint32_t i = 0; i < x.nkeys; i++)
            FZ_CHECK(present[i] <= 1);
    }
    uint8_t flags = size ? data[0] : 0;
    if ((flags & 3) == 3) {
        bool valid = size >= 2 + x.nkeys;
        for (uint32_t i = 0; valid && i < x.nkeys; i++)
            valid = ((flags & 4) ? data[2 + i] & 1 : data[2 + i]) <= 1;
        if (valid) {
            if (rc != 0) {
                fprintf(stderr, "a valid answer was refused: %d (%s)\n", rc, umbp_last_error());
                abort();
            }
            for (uint32_t i = 0; i < x.nkeys; i++)
                FZ_CHECK(present[i] == ((flags & 4) ? data[2 + i] & 1 : data[2 + i]));
        }
    }
    return 0;
}
