/*
 * ucx_tls.h - reading a UCX transport list (UCX_TLS as UCX read it: "all",
 * a comma-separated list, or "^" and a list to leave out), for the settings
 * net/ucx.c gives only where a transport may come up.  No UCX here: the unit
 * test (tests/unit/test_ucx_tls.c) builds on a host without it.  Any thread
 * (no state).
 */
#ifndef UMBP_NET_UCX_TLS_H
#define UMBP_NET_UCX_TLS_H

#include <stdbool.h>

/* Whether `tls` can bring up the tcp transport: it names "tcp" or "all", or
 * it is an exclusion ("^...") that names neither. */
bool ucx_tls_names_tcp(const char *tls);

/* Whether tcp is the only network transport `tls` can bring up: a list of
 * "tcp" and at most "self" (no "all", no exclusion, no shared-memory or RDMA
 * transport, whose rendezvous moves bytes without a copy through a bounce
 * buffer). */
bool ucx_tls_tcp_only(const char *tls);

#endif /* UMBP_NET_UCX_TLS_H */
