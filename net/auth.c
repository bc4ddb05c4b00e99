/*
 * auth.c - the shared-secret handshake's keys and MACs (auth.h) over
 * libsodium.  Stateless; any thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "seterr.h"

_Static_assert(crypto_auth_BYTES == NET_AUTH_BYTES, "HMAC-SHA-512-256 gives 32 bytes");
_Static_assert(crypto_auth_KEYBYTES == NET_AUTH_BYTES, "crypto_auth takes a 32-byte key");

static void init(void)
{
    if (sodium_init() < 0)
        abort(); /* no entropy source: nothing here can be made safe */
}

void net_auth_key_from(const void *secret, size_t len, struct net_auth_key *key)
{
    init();
    crypto_generichash(key->k, sizeof(key->k), secret, len, NULL, 0);
}

int net_auth_key_load(const char *path, const char *option, struct net_auth_key *key,
                      char *err, size_t errlen)
{
    uint8_t buf[NET_AUTH_SECRET_MAX + 1];
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        net_seterr(err, errlen, "%s: cannot read %s: %s", option, path, strerror(e));
        return -e;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        net_seterr(err, errlen, "%s: %s is not a regular file", option, path);
        return -EINVAL;
    }
    if (st.st_mode & 077) {
        close(fd);
        net_seterr(err, errlen, "%s: %s is open to group or others (mode %03o): chmod 600 it",
                   option, path, (unsigned)(st.st_mode & 0777));
        return -EACCES;
    }
    ssize_t n = read(fd, buf, sizeof(buf));
    close(fd);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (n < NET_AUTH_SECRET_MIN || n > NET_AUTH_SECRET_MAX) {
        net_seterr(err, errlen, "%s: %s holds %zd bytes; a secret is %d .. %d bytes (e.g. "
                   "head -c 32 /dev/urandom | base64 > FILE)", option, path, n < 0 ? 0 : n,
                   NET_AUTH_SECRET_MIN, NET_AUTH_SECRET_MAX);
        sodium_memzero(buf, sizeof(buf));
        return -EINVAL;
    }
    net_auth_key_from(buf, (size_t)n, key);
    sodium_memzero(buf, sizeof(buf));
    return 0;
}

void net_auth_nonce(uint8_t nonce[NET_AUTH_BYTES])
{
    init();
    randombytes_buf(nonce, NET_AUTH_BYTES);
}

void net_auth_mac(const struct net_auth_key *key, bool server, const uint8_t sn[NET_AUTH_BYTES],
                  const uint8_t cn[NET_AUTH_BYTES], uint8_t mac[NET_AUTH_BYTES])
{
    uint8_t msg[6 + 2 * NET_AUTH_BYTES];
    memcpy(msg, server ? "umbp-s" : "umbp-c", 6);
    memcpy(msg + 6, sn, NET_AUTH_BYTES);
    memcpy(msg + 6 + NET_AUTH_BYTES, cn, NET_AUTH_BYTES);
    crypto_auth(mac, msg, sizeof(msg), key->k);
}

bool net_auth_verify(const struct net_auth_key *key, bool server,
                     const uint8_t sn[NET_AUTH_BYTES], const uint8_t cn[NET_AUTH_BYTES],
                     const uint8_t mac[NET_AUTH_BYTES])
{
    uint8_t msg[6 + 2 * NET_AUTH_BYTES];
    memcpy(msg, server ? "umbp-s" : "umbp-c", 6);
    memcpy(msg + 6, sn, NET_AUTH_BYTES);
    memcpy(msg + 6 + NET_AUTH_BYTES, cn, NET_AUTH_BYTES);
    return crypto_auth_verify(mac, msg, sizeof(msg), key->k) == 0;
}
