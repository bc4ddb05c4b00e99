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
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_check.h"
#include "leader_lease.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
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
