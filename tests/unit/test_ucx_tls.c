/*
 * test_ucx_tls - reading UCX_TLS (net/ucx_tls.c): which lists can bring up
 * the tcp transport (where net/ucx.c sets the tcp transport's segment size)
 * and which leave tcp the only network transport (where it makes objects up
 * to 1 MiB go eager).  A wrong answer either way moves bytes slower: eager
 * where RDMA's rendezvous would copy nothing, or a tcp setting UCX warns
 * about.  One table, both answers per list.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "ucx_tls.h"

struct tls_case {
    const char *tls;
    bool names_tcp, tcp_only;
};

static const struct tls_case cases[] = {
    {"tcp", true, true},
    {"tcp,self", true, true},
    {"self,tcp", true, true},
    {"tcp,,self", true, true},        /* an empty name is no transport */
    {"all", true, false},
    {"^rc", true, false},             /* everything but rc: tcp among them */
    {"^tcp", false, false},
    {"^rc,tcp", false, false},
    {"^all", false, false},
    {"tcp,rc", true, false},
    {"rc,tcp", true, false},
    {"tcp,cma", true, false},
    {"tcp,posix,sysv", true, false},
    {"tcp,all", true, false},
    {"self", false, false},
    {"rc,ud", false, false},
    {"sm", false, false},
    {"", false, false},
    {"tcpx", false, false},           /* names are compared whole */
    {"TCP", false, false},            /* UCX's own output is lower case */
};

Test(ucx_tls, table)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct tls_case *c = &cases[i];
        cr_expect_eq(ucx_tls_names_tcp(c->tls), c->names_tcp, "names_tcp(\"%s\"): want %d",
                     c->tls, c->names_tcp);
        cr_expect_eq(ucx_tls_tcp_only(c->tls), c->tcp_only, "tcp_only(\"%s\"): want %d", c->tls,
                     c->tcp_only);
    }
}

Test(ucx_tls, a_list_longer_than_the_buffer_is_read_up_to_it)
{
    /* 300 bytes: "self," repeated, then tcp past byte 255: not seen */
    char tls[320] = "";
    while (strlen(tls) < 300)
        strcat(tls, "self,");
    strcat(tls, "tcp");
    cr_expect_not(ucx_tls_names_tcp(tls));
    cr_expect_not(ucx_tls_tcp_only(tls));
    /* and the caller's string is not changed (strtok_r works on a copy) */
    cr_expect_eq(strlen(tls), 303);
}
