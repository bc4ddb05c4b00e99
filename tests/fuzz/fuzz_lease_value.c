/*
 * fuzz_lease_value.c - the decoder of the leader value that umbp-master's
 * clients and standbys read from the lease store (net/leader_lease.c,
 * lease_value_parse): "<epoch> <address> <owner>", bytes from another
 * process (Redis, and whoever else can write to it).
 *
 * Input: the value's bytes, as GET returns them.  Properties, each an
 * abort() when broken:
 *   - the decoder answers 0 or -EPROTO, and -EPROTO names the value and
 *     a field ("leader value: ...");
 *   - an accepted value has an epoch in 1 .. 2^53, an address that is
 *     host:port with a port, and a printable owner, each NUL-terminated
 *     within its field;
 *   - it formats back (lease_value_format) into a value that parses to the
 *     same holder.
 * The same bytes, split at their first NUL into host and port, are a
 * sentinel's answer for the primary (lease_primary_parse): 0 or -EPROTO
 * naming "sentinel reply: ", and an accepted one has a printable host
 * without spaces and a port in 1 .. 65535 whose digits are the input's.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fuzz_check.h"
#include "leader_lease.h"

static void primary(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t hl = nul ? (size_t)(nul - data) : size;
    const char *port = nul ? (const char *)nul + 1 : "";
    size_t pl = nul ? size - hl - 1 : 0;
    char host[64], err[256] = "";
    uint16_t p = 0;
    int rc = lease_primary_parse((const char *)data, hl, port, pl, host, sizeof(host), &p, err,
                                 sizeof(err));
    if (rc) {
        FZ_CHECK(rc == -EPROTO);
        FZ_CHECK(!strncmp(err, "sentinel reply: ", 16));
        return;
    }
    FZ_CHECK(strlen(host) == hl && hl < sizeof(host) && !strchr(host, ' '));
    FZ_CHECK(p >= 1);
    char back[8];
    snprintf(back, sizeof(back), "%u", (unsigned)p);
    FZ_CHECK(pl >= strlen(back)); /* leading zeros allowed, nothing else */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    primary(data, size);
    char err[256] = "";
    struct lease_holder h, again;
    int rc = lease_value_parse((const char *)data, size, &h, err, sizeof(err));
    if (rc) {
        FZ_CHECK(rc == -EPROTO);
        FZ_CHECK(!strncmp(err, "leader value: ", 14));
        return 0;
    }
    FZ_CHECK(h.epoch >= 1 && h.epoch <= (1ull << 53));
    FZ_CHECK(memchr(h.address, 0, sizeof(h.address)) && h.address[0]);
    FZ_CHECK(memchr(h.owner, 0, sizeof(h.owner)) && h.owner[0]);
    FZ_CHECK(strchr(h.address, ':') && !strchr(h.owner, ' '));
    char v[512];
    FZ_CHECK(lease_value_format(&h, v, sizeof(v)) == 0);
    FZ_CHECK(lease_value_parse(v, strlen(v), &again, err, sizeof(err)) == 0);
    FZ_CHECK(again.epoch == h.epoch && !strcmp(again.address, h.address) &&
             !strcmp(again.owner, h.owner));
    return 0;
}
