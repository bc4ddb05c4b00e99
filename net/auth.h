/*
 * auth.h - the shared-secret handshake of the TCP transport, for peers
 * whose credentials cannot be checked (SO_PEERCRED does not cross hosts).
 *
 * Both ends hold the same secret (a file of at least 16 bytes, private to
 * its owner); the key is its BLAKE2b digest (crypto_generichash), so any
 * length works.  Challenge and response, nonces from both sides, HMAC
 * (crypto_auth: HMAC-SHA-512-256), before HELLO:
 *
 *   server -> AUTH_CHALLENGE { sn }                 at accept, seq 0
 *   client -> AUTH { cn, mac_c = HMAC(key, "umbp-c" | sn | cn) }, then HELLO
 *   server -> AUTH_OK { mac_s = HMAC(key, "umbp-s" | sn | cn) }, then HELLO_OK
 *
 * A client with a wrong secret, or none (it sends HELLO at once), gets
 * HELLO_ERR (-EACCES) and the server logs a line naming its address.  The
 * client checks mac_s, so it never talks to a server without the secret.
 * Fresh nonces on both sides make a recorded exchange useless to replay.
 * Nothing is encrypted: the secret keeps strangers out, it does not hide
 * keys or addresses on the wire.
 *
 * Threads: stateless functions; any thread (libsodium is initialised on
 * first use).
 */
#ifndef UMBP_NET_AUTH_H
#define UMBP_NET_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NET_AUTH_BYTES 32
#define NET_AUTH_SECRET_MIN 16
#define NET_AUTH_SECRET_MAX 4096

struct net_auth_key {
    uint8_t k[NET_AUTH_BYTES];
};

/* The key from the secret in file `path` (trailing newlines dropped).
 * Refused (-EINVAL, -EACCES, -errno) with err naming `option`: a file that
 * cannot be read, is readable or writable by group or others, or holds
 * fewer than NET_AUTH_SECRET_MIN bytes. */
int net_auth_key_load(const char *path, const char *option, struct net_auth_key *key,
                      char *err, size_t errlen);
/* The key from secret bytes given directly (tests). */
void net_auth_key_from(const void *secret, size_t len, struct net_auth_key *key);

void net_auth_nonce(uint8_t nonce[NET_AUTH_BYTES]);
/* mac of one side (server: mac_s, else mac_c) over both nonces. */
void net_auth_mac(const struct net_auth_key *key, bool server, const uint8_t sn[NET_AUTH_BYTES],
                  const uint8_t cn[NET_AUTH_BYTES], uint8_t mac[NET_AUTH_BYTES]);
/* Constant time. */
bool net_auth_verify(const struct net_auth_key *key, bool server,
                     const uint8_t sn[NET_AUTH_BYTES], const uint8_t cn[NET_AUTH_BYTES],
                     const uint8_t mac[NET_AUTH_BYTES]);

#endif /* UMBP_NET_AUTH_H */
