/*
 * test_lookup_path - where a rank's lookup service listens
 * (umbp_lookup_socket_path), the lookup client's options, and the query's
 * argument checks.  No sockets are opened here (tests/integration/
 * test_lookup.c has the services and clients).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "umbp/lookup.h"
#include "umbp/umbp.h"

#define NS "0123456789abcdef0123456789abcdef"
#define NS2 "0123456789abcdef0123456789abcdee"

static void path_of(const char *dir, const char *ns, const char *inst, uint32_t dp,
                    uint32_t rank, char *out)
{
    int rc = umbp_lookup_socket_path(dir, ns, inst, dp, rank, out, 108);
    cr_assert_eq(rc, 0, "umbp_lookup_socket_path = %d: %s", rc, umbp_last_error());
}

Test(lookup_path, shape_and_stable)
{
    char a[108], b[108];
    path_of("/run/x", NS, "", 0, 0, a);
    path_of("/run/x/", NS, NULL, 0, 0, b); /* a trailing '/' is not doubled; NULL = "" */
    cr_assert_str_eq(a, b);
    cr_assert_eq(strncmp(a, "/run/x/umbp-lk-", 15), 0, "%s", a);
    cr_assert_eq(strlen(a), strlen("/run/x/umbp-lk-") + 24 + strlen(".sock"), "%s", a);
    cr_assert_str_eq(a + strlen(a) - 5, ".sock");
    for (size_t i = 15; i < 15 + 24; i++)
        cr_assert((a[i] >= '0' && a[i] <= '9') || (a[i] >= 'a' && a[i] <= 'f'), "%s", a);
    /* pinned: a change of the derivation would strand running engines */
    cr_assert_str_eq(a, "/run/x/umbp-lk-2d3f307d96f1f535f5556d64.sock");
    /* the namespace's case does not matter */
    path_of("/run/x", "0123456789ABCDEF0123456789ABCDEF", "", 0, 0, b);
    cr_assert_str_eq(a, b);
}

Test(lookup_path, distinct_for_every_part)
{
    char p[6][108];
    path_of("/run/x", NS, "", 0, 0, p[0]);
    path_of("/run/x", NS, "", 0, 1, p[1]);
    path_of("/run/x", NS, "", 1, 0, p[2]);
    path_of("/run/x", NS, "a", 0, 0, p[3]);
    path_of("/run/x", NS2, "", 0, 0, p[4]);
    /* the separators keep (dp, rank) = (1, 10) apart from (11, 0) */
    path_of("/run/x", NS, "1", 1, 0, p[5]);
    for (int i = 0; i < 6; i++)
        for (int j = i + 1; j < 6; j++)
            cr_assert_str_neq(p[i], p[j], "%d and %d: %s", i, j, p[i]);
    char q[108], r[108];
    path_of("/run/x", NS, "", 1, 10, q);
    path_of("/run/x", NS, "", 11, 0, r);
    cr_assert_str_neq(q, r);
}

Test(lookup_path, default_dir)
{
    char p[108], want[108];
    setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
    path_of(NULL, NS, "", 0, 0, p);
    path_of("/run/user/4242/umbp", NS, "", 0, 0, want);
    cr_assert_str_eq(p, want);
    path_of("", NS, "", 0, 0, p);
    cr_assert_str_eq(p, want);
    unsetenv("XDG_RUNTIME_DIR");
    char dir[64];
    snprintf(dir, sizeof(dir), "/tmp/umbp-%u", (unsigned)geteuid());
    path_of(NULL, NS, "", 0, 0, p);
    path_of(dir, NS, "", 0, 0, want);
    cr_assert_str_eq(p, want);
}

Test(lookup_path, refused)
{
    char p[108], dir[200];
    memset(dir, 'd', sizeof(dir));
    dir[0] = '/';
    dir[80] = '\0'; /* 80 + "/umbp-lk-" + 24 + ".sock" > 107 */
    cr_assert_eq(umbp_lookup_socket_path(dir, NS, "", 0, 0, p, sizeof(p)), -ENAMETOOLONG);
    cr_assert(strstr(umbp_last_error(), "lookup_dir"), "%s", umbp_last_error());
    dir[60] = '\0';
    cr_assert_eq(umbp_lookup_socket_path(dir, NS, "", 0, 0, p, sizeof(p)), 0, "%s",
                 umbp_last_error());
    cr_assert_eq(umbp_lookup_socket_path(dir, NS, "", 0, 0, p, 20), -ERANGE);
    cr_assert_eq(umbp_lookup_socket_path("/run", "0123", "", 0, 0, p, sizeof(p)), -EINVAL);
    cr_assert(strstr(umbp_last_error(), "namespace"), "%s", umbp_last_error());
    cr_assert_eq(umbp_lookup_socket_path("/run", NS "00", "", 0, 0, p, sizeof(p)), -EINVAL);
    cr_assert_eq(umbp_lookup_socket_path("/run", "0123456789abcdef0123456789abcdeg", "", 0,
                                         0, p, sizeof(p)), -EINVAL);
    cr_assert_eq(umbp_lookup_socket_path("/run", NULL, "", 0, 0, p, sizeof(p)), -EINVAL);
    cr_assert_eq(umbp_lookup_socket_path("/run", NS, "a/b", 0, 0, p, sizeof(p)), -EINVAL);
    cr_assert(strstr(umbp_last_error(), "lookup_instance"), "%s", umbp_last_error());
    cr_assert_eq(umbp_lookup_socket_path("/run", NS, "0123456789012345678901234567890123",
                                         0, 0, p, sizeof(p)), -EINVAL);
    cr_assert(strstr(umbp_last_error(), "lookup_instance"), "%s", umbp_last_error());
    cr_assert_eq(umbp_lookup_socket_path("relative", NS, "", 0, 0, p, sizeof(p)), -EINVAL);
    cr_assert(strstr(umbp_last_error(), "lookup_dir"), "%s", umbp_last_error());
    cr_assert_eq(umbp_lookup_socket_path("/run", NS, "", 0, 0, NULL, 108), -EINVAL);
}

/* ---- the client's options ---------------------------------------------------- */

static void refused(const char *json, const char *option)
{
    umbp_lookup_client_t *c = (umbp_lookup_client_t *)0x1;
    int rc = umbp_lookup_client_create(json, &c);
    cr_expect_lt(rc, 0, "%s was accepted", json);
    cr_expect_eq(c, (umbp_lookup_client_t *)0x1, "%s: *out written on failure", json);
    cr_expect(strstr(umbp_last_error(), option), "%s: the message '%s' does not name %s",
              json, umbp_last_error(), option);
    if (rc == 0 && c != (umbp_lookup_client_t *)0x1)
        umbp_lookup_client_destroy(c);
}

Test(lookup_client, bad_options_named)
{
    refused("{}", "namespace");
    refused("{\"namespace\": \"xyz\"}", "namespace");
    refused("{\"namespace\": \"" NS "0\"}", "namespace");
    refused("{\"namespace\": \"" NS "\", \"num_ranks\": 0}", "num_ranks");
    refused("{\"namespace\": \"" NS "\", \"num_ranks\": 4097}", "num_ranks");
    refused("{\"namespace\": \"" NS "\", \"lookup_timeout_ms\": 0}", "lookup_timeout_ms");
    refused("{\"namespace\": \"" NS "\", \"lookup_timeout_ms\": 60001}", "lookup_timeout_ms");
    refused("{\"namespace\": \"" NS "\", \"lookup_timeout_ms\": \"1s\"}", "lookup_timeout_ms");
    refused("{\"namespace\": \"" NS "\", \"dp_index\": -1}", "dp_index");
    refused("{\"namespace\": \"" NS "\", \"dp_index\": 65536}", "dp_index");
    /* distributed: the master's address is required, and a remote one
     * needs the cluster's secret */
    refused("{\"namespace\": \"" NS "\", \"mode\": \"distributed\"}", "master_address");
    refused("{\"mode\": \"distributed\", \"master_address\": \"nohost\"}", "master_address");
    refused("{\"mode\": \"distributed\", \"master_address\": \"10.1.2.3:7390\"}",
            "secret_file");
    refused("{\"mode\": \"distributed\", \"master_address\": \"127.0.0.1:7390\", "
            "\"secret_file\": \"/nonexistent-umbp-secret\"}", "secret_file");
    refused("{\"namespace\": \"" NS "\", \"lookup_instance\": \"a b\"}", "lookup_instance");
    refused("{\"namespace\": \"" NS "\", \"lookup_instance\": "
            "\"0123456789012345678901234567890123\"}", "lookup_instance");
    refused("{\"namespace\": \"" NS "\", \"lookup_dir\": \"relative/dir\"}", "lookup_dir");
    refused("{\"namespace\": \"" NS "\", \"lookup_dir\": \"/dev/null\"}", "lookup_dir");
    refused("{\"namespace\": \"" NS "\", \"lookup_dir\": \"/nonexistent-umbp/a/b\"}",
            "lookup_dir");
    refused("{\"namespace\": \"" NS "\", \"capacity_bytes\": 1}", "capacity_bytes");
    refused("{\"namespace\": \"" NS "\", \"bogus\": 1}", "bogus");
    refused("{\"mode\": \"standalone\", \"socket_dir\": \"rel\"}", "socket_dir");
    refused("{\"mode\": \"standalone\", \"startup_timeout_ms\": 0}", "startup_timeout_ms");
    refused("{\"mode\": \"standalone\", \"reconnect_max_ms\": 5}", "reconnect_max_ms");
    refused("not json", "JSON");
    refused(NULL, "namespace"); /* embedded by default: the namespace is required */
    setenv("UMBP_NUM_RANKS", "0", 1);
    refused("{\"namespace\": \"" NS "\"}", "UMBP_NUM_RANKS");
    unsetenv("UMBP_NUM_RANKS");
    umbp_lookup_client_t *c = NULL;
    cr_assert_eq(umbp_lookup_client_create("{\"namespace\": \"" NS "\"}", NULL), -EINVAL);
    cr_assert_eq(c, NULL);
}

/* Distributed: no master there is a miss within the bound, never a hang or
 * an error at creation (the master may start after the scheduler). */
Test(lookup_client, distributed_without_master_misses)
{
    umbp_lookup_client_t *c = NULL;
    cr_assert_eq(umbp_lookup_client_create("{\"mode\": \"distributed\", \"master_address\": "
                                           "\"127.0.0.1:1\", \"lookup_timeout_ms\": 200}", &c),
                 0, "%s", umbp_last_error());
    umbp_key_t k[4];
    memset(k, 7, sizeof(k));
    uint8_t present[4] = {1, 1, 1, 1};
    size_t prefix = 9;
    int rc = umbp_lookup_client_query(c, k, 4, 1, NULL, present, &prefix);
    cr_assert_lt(rc, 0);
    cr_assert_eq(prefix, 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(present[i], 0);
    cr_assert(strstr(umbp_last_error(), "umbp-master"), "%s", umbp_last_error());
    umbp_lookup_client_destroy(c);
}

Test(lookup_client, query_arguments)
{
    char dir[] = "/tmp/umbp-lkq-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char json[256];
    snprintf(json, sizeof(json), "{\"namespace\": \"" NS "\", \"num_ranks\": 2, "
             "\"lookup_dir\": \"%s\", \"lookup_timeout_ms\": 50}", dir);
    umbp_lookup_client_t *c = NULL;
    cr_assert_eq(umbp_lookup_client_create(json, &c), 0, "%s", umbp_last_error());
    umbp_key_t keys[6] = {{{1}}, {{2}}, {{3}}, {{4}}, {{5}}, {{6}}};
    uint8_t present[6];
    size_t prefix = 99;
    uint32_t bad_rank[2] = {0, 2};
    cr_assert_eq(umbp_lookup_client_query(c, keys, 2, 3, NULL, present, &prefix), -EINVAL);
    cr_assert_eq(prefix, 0);
    cr_assert(strstr(umbp_last_error(), "num_ranks"), "%s", umbp_last_error());
    cr_assert_eq(umbp_lookup_client_query(c, keys, 3, 2, bad_rank, present, &prefix), -EINVAL);
    cr_assert(strstr(umbp_last_error(), "row_rank"), "%s", umbp_last_error());
    cr_assert_eq(umbp_lookup_client_query(c, keys, 3, 0, NULL, present, &prefix), -EINVAL);
    cr_assert_eq(umbp_lookup_client_query(c, NULL, 3, 1, NULL, present, &prefix), -EINVAL);
    cr_assert_eq(umbp_lookup_client_query(c, keys, 3, 1, NULL, present, NULL), -EINVAL);
    cr_assert_eq(umbp_lookup_client_query(NULL, keys, 3, 1, NULL, present, &prefix), -EINVAL);
    prefix = 99;
    cr_assert_eq(umbp_lookup_client_query(c, keys, 0, 2, NULL, present, &prefix), 0);
    cr_assert_eq(prefix, 0);
    /* nobody serves: every row misses, the code says why, nothing waits */
    memset(present, 7, sizeof(present));
    int rc = umbp_lookup_client_query(c, keys, 3, 2, NULL, present, &prefix);
    cr_assert_lt(rc, 0);
    cr_assert_eq(prefix, 0);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(present[i], 0);
    /* again: backing off (not asked), or, on a slow machine past the first
     * backoff, refused again */
    rc = umbp_lookup_client_query(c, keys, 3, 2, NULL, present, &prefix);
    cr_assert(rc == UMBP_E_NOT_ATTEMPTED || rc == -ENOENT, "rc %d (%s)", rc, umbp_strerror(rc));
    umbp_lookup_client_destroy(c);
    umbp_lookup_client_destroy(NULL);
    rmdir(dir);
}
