/*
 * test_master - the real umbp-master process over real TCP on loopback,
 * driven by master/master_client.c (net/session's poll() driver) as nodes
 * and lookup clients, and by raw sockets for broken peers.
 *
 * Every wait is a bounded loop on an outcome (a node seen suspect, a
 * connection closed); nothing asserts a duration.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "auth.h"
#include "master_client.h"
#include "proto.h"
#include "tcp.h"
#include "umbp/tier.h"

#include "master_fixture.h"
#include "scrape.h"
#include "test_util.h"

/* The log has `what` (the master writes it before it acts on the next
 * frame; a bounded wait covers stderr being written after a reply). */
static bool log_has(const struct master *m, const char *what)
{
    for (int i = 0; i < 500; i++) {
        if (strstr(tu_slurp(m->log), what))
            return true;
        usleep(10000);
    }
    return false;
}

/* ---- clients and nodes --------------------------------------------------------------- */

static struct mclient *client(const struct master *m, uint8_t role,
                              const struct net_auth_key *key, uint64_t timeout_ms)
{
    struct mclient_config cfg = {.address = m->addr, .auth = key, .role = role,
                                 .engine_id = "test", .timeout_ms = timeout_ms,
                                 .hello_timeout_ms = 5000};
    struct mclient *c;
    cr_assert_eq(mclient_create(&cfg, &c), 0);
    return c;
}

static umbp_key_t key_of(uint32_t i)
{
    umbp_key_t k;
    memset(&k, 0, sizeof(k));
    memcpy(k.bytes, &i, sizeof(i));
    k.bytes[31] = 0x5a;
    return k;
}

/* A node as the master sees one: an id, a key set and its event seq. */
struct node {
    struct mclient *c;
    struct proto_register reg;
    umbp_key_t *keys;
    uint64_t *sizes;
    size_t n, cap;
    uint64_t seq;
    uint32_t ref;
};

static void node_init(struct node *n, const struct master *m, uint32_t pid, const char *addr)
{
    memset(n, 0, sizeof(*n));
    n->c = client(m, PROTO_ROLE_NODE, NULL, 5000);
    snprintf(n->reg.host, sizeof(n->reg.host), "host-a");
    n->reg.pid = pid;
    n->reg.start_ns = 1234567;
    n->reg.capacity_bytes = 1 << 30;
    n->reg.addr_len = (uint32_t)strlen(addr);
    memcpy(n->reg.addr, addr, n->reg.addr_len);
    n->cap = 1 << 16;
    n->keys = calloc(n->cap, sizeof(*n->keys));
    n->sizes = calloc(n->cap, sizeof(*n->sizes));
}

static void node_free(struct node *n)
{
    mclient_destroy(n->c);
    free(n->keys);
    free(n->sizes);
}

static int node_register(struct node *n, struct proto_ack *a)
{
    n->reg.seq = n->seq;
    int rc = mclient_register(n->c, &n->reg, a);
    if (rc == 0)
        n->ref = a->node_ref;
    return rc;
}

/* Stores keys [lo, hi) locally (the node's own set) and says so in one
 * heartbeat whose events start at seq + 1 (+ skip: a lost bundle). */
static int node_store(struct node *n, uint32_t lo, uint32_t hi, uint64_t skip,
                      struct proto_ack *a)
{
    struct proto_node_event *ev = calloc(hi - lo, sizeof(*ev));
    n->seq += skip;
    for (uint32_t i = lo; i < hi; i++) {
        n->keys[n->n] = key_of(i);
        n->sizes[n->n++] = 4096 + i;
        ev[i - lo] = (struct proto_node_event){.seq = ++n->seq, .kind = PROTO_NODE_STORED,
                                               .key = key_of(i), .size = 4096 + i};
    }
    int rc = mclient_heartbeat(n->c, n->seq, n->n * 4096, ev, hi - lo, a);
    free(ev);
    return rc;
}

/* One heartbeat, then whatever the master asks (REGISTER, RESYNC), as a
 * node's runtime will do it.  The last acknowledgement in *a. */
static int node_beat(struct node *n, struct proto_ack *a)
{
    int rc = mclient_heartbeat(n->c, n->seq, n->n * 4096, NULL, 0, a);
    if (rc == 0 && a->action == PROTO_ACK_REGISTER)
        rc = node_register(n, a);
    if (rc == 0 && a->action == PROTO_ACK_RESYNC)
        rc = mclient_resync(n->c, n->seq, n->n * 4096, n->keys, n->sizes, n->n, 0, a);
    return rc;
}

/* LOCATE of keys [lo, hi): how many have `ref` among their owners. */
static size_t owned_by(struct mclient *c, uint32_t lo, uint32_t hi, uint32_t ref, int *rc)
{
    umbp_key_t *k = calloc(hi - lo, sizeof(*k));
    struct proto_location *l = calloc(hi - lo, sizeof(*l));
    for (uint32_t i = lo; i < hi; i++)
        k[i - lo] = key_of(i);
    *rc = mclient_locate(c, k, hi - lo, l);
    size_t found = 0;
    for (uint32_t i = 0; i < hi - lo; i++)
        for (uint32_t r = 0; r < l[i].nrep; r++)
            if (l[i].refs[r] == ref) {
                found++;
                cr_expect_eq(l[i].size, 4096 + lo + i, "key %u: size %llu", lo + i,
                             (unsigned long long)l[i].size);
            }
    free(k);
    free(l);
    return found;
}

/* ---- tests ------------------------------------------------------------------------------ */

Test(master, register_heartbeat_lookup_returns_the_owner)
{
    struct master m = {0};
    master_start(&m, NULL);
    struct node n;
    struct proto_ack a;
    node_init(&n, &m, 1001, "ucx-worker-address-of-a");
    cr_assert_eq(node_register(&n, &a), 0, "%s", mclient_last_error(n.c));
    cr_assert_eq(a.action, PROTO_ACK_OK);
    cr_assert_neq(a.node_ref, 0);
    cr_assert_eq(node_store(&n, 0, 100, 0, &a), 0);
    cr_assert_eq(a.action, PROTO_ACK_OK);
    cr_assert_eq(a.seq, 100);

    struct mclient *look = client(&m, PROTO_ROLE_LOOKUP, NULL, 2000);
    int rc;
    cr_assert_eq(owned_by(look, 0, 100, n.ref, &rc), 100);
    cr_assert_eq(rc, 0);
    cr_assert_eq(owned_by(look, 100, 200, n.ref, &rc), 0, "keys never stored are misses");
    const struct proto_node_info *ni = mclient_node(look, n.ref);
    cr_assert_not_null(ni, "NODES rode along with LOCATE");
    cr_assert_eq(ni->addr_len, n.reg.addr_len);
    cr_assert_eq(memcmp(ni->addr, n.reg.addr, ni->addr_len), 0, "the worker address, exact");
    cr_assert_eq(ni->keys, 100);

    /* a removed key stops being returned */
    struct proto_node_event ev = {.seq = ++n.seq, .kind = PROTO_NODE_REMOVED, .key = key_of(7)};
    n.keys[7] = n.keys[--n.n];
    n.sizes[7] = n.sizes[n.n];
    cr_assert_eq(mclient_heartbeat(n.c, n.seq, 0, &ev, 1, &a), 0);
    cr_assert_eq(owned_by(look, 7, 8, n.ref, &rc), 0);
    cr_assert_eq(owned_by(look, 0, 100, n.ref, &rc), 99);
    mclient_destroy(look);
    node_free(&n);
    master_kill(&m, SIGTERM);
}

/* A node that failed to fetch from another reports it (SUSPECT): the master
 * stops returning it at once, and its next heartbeat makes it alive again.
 * A node cannot report itself. */
Test(master, a_node_reported_failing_is_skipped_until_its_next_heartbeat)
{
    struct master m = {0};
    master_start(&m, NULL);
    struct node a, b;
    struct proto_ack ack;
    node_init(&a, &m, 1001, "addr-a");
    node_init(&b, &m, 1002, "addr-b");
    cr_assert_eq(node_register(&a, &ack), 0, "%s", mclient_last_error(a.c));
    cr_assert_eq(node_register(&b, &ack), 0, "%s", mclient_last_error(b.c));
    cr_assert_eq(node_store(&a, 0, 10, 0, &ack), 0);
    struct mclient *look = client(&m, PROTO_ROLE_LOOKUP, NULL, 2000);
    int rc;
    cr_assert_eq(owned_by(look, 0, 10, a.ref, &rc), 10);

    uint32_t self = a.ref; /* a report about oneself is ignored */
    cr_assert_eq(mclient_suspect(a.c, &self, 1), 0);
    cr_assert_eq(mclient_nodes(a.c), 0); /* behind the report: it was handled */
    cr_assert_eq(owned_by(look, 0, 10, a.ref, &rc), 10);

    uint32_t r = a.ref;
    cr_assert_eq(mclient_suspect(b.c, &r, 1), 0);
    cr_assert_eq(mclient_nodes(b.c), 0);
    cr_assert_eq(owned_by(look, 0, 10, a.ref, &rc), 0, "a reported node is not returned");
    cr_assert_eq(rc, 0);
    const struct proto_node_info *ni = mclient_node(look, a.ref);
    cr_assert_not_null(ni);
    cr_assert_eq(ni->state, PROTO_NODE_SUSPECT);
    cr_assert(log_has(&m, "failed to fetch from it"), "%s", tu_slurp(m.log));

    cr_assert_eq(node_beat(&a, &ack), 0);
    cr_assert_eq(owned_by(look, 0, 10, a.ref, &rc), 10, "alive again after its heartbeat");
    uint32_t bad[2] = {999999, 0}; /* unknown refs change nothing */
    cr_assert_eq(mclient_suspect(b.c, bad, 2), 0);
    cr_assert_eq(mclient_nodes(b.c), 0);
    cr_assert_eq(owned_by(look, 0, 10, a.ref, &rc), 10);
    mclient_destroy(look);
    node_free(&a);
    node_free(&b);
    master_kill(&m, SIGTERM);
}

Test(master, a_gap_in_events_asks_a_resync_and_the_index_is_right_after)
{
    struct master m = {0};
    master_start(&m, NULL);
    struct node n;
    struct proto_ack a;
    node_init(&n, &m, 1002, "addr-b");
    cr_assert_eq(node_register(&n, &a), 0);
    cr_assert_eq(node_store(&n, 0, 50, 0, &a), 0);
    cr_assert_eq(a.action, PROTO_ACK_OK);
    /* events 51 .. 60 are lost; 61 .. 90 arrive */
    n.seq += 10;
    for (uint32_t i = 50; i < 60; i++) { /* the node stored them */
        n.keys[n.n] = key_of(i);
        n.sizes[n.n++] = 4096 + i;
    }
    cr_assert_eq(node_store(&n, 60, 90, 0, &a), 0);
    cr_assert_eq(a.action, PROTO_ACK_RESYNC, "a gap asks for a resync");
    cr_assert_eq(a.seq, 50, "events after the gap are not applied");
    struct mclient *look = client(&m, PROTO_ROLE_LOOKUP, NULL, 2000);
    int rc;
    cr_assert_eq(owned_by(look, 60, 90, n.ref, &rc), 0);
    /* while the resync is asked, heartbeats keep asking */
    cr_assert_eq(mclient_heartbeat(n.c, n.seq, 0, NULL, 0, &a), 0);
    cr_assert_eq(a.action, PROTO_ACK_RESYNC);
    /* the node's whole set in frames of 16 keys */
    cr_assert_eq(mclient_resync(n.c, n.seq, 0, n.keys, n.sizes, n.n, 16, &a), 0);
    cr_assert_eq(a.action, PROTO_ACK_OK);
    cr_assert_eq(a.seq, n.seq);
    cr_assert_eq(owned_by(look, 0, 90, n.ref, &rc), 90, "every key after the resync");
    cr_assert_eq(owned_by(look, 90, 120, n.ref, &rc), 0);
    /* and events go on from the resync's seq */
    cr_assert_eq(node_store(&n, 90, 100, 0, &a), 0);
    cr_assert_eq(a.action, PROTO_ACK_OK);
    cr_assert_eq(owned_by(look, 0, 100, n.ref, &rc), 100);
    cr_assert(log_has(&m, "resync asked"));
    mclient_destroy(look);
    node_free(&n);
    master_kill(&m, SIGTERM);
}

Test(master, a_silent_node_becomes_suspect_then_dead_and_its_keys_go)
{
    struct master m = {0};
    master_start(&m, "\"heartbeat_suspect_ms\": 300, \"heartbeat_dead_ms\": 900");
    struct node n, other;
    struct proto_ack a;
    node_init(&n, &m, 1003, "addr-c");
    node_init(&other, &m, 1004, "addr-d");
    cr_assert_eq(node_register(&n, &a), 0);
    cr_assert_eq(node_store(&n, 0, 20, 0, &a), 0);
    cr_assert_eq(node_register(&other, &a), 0);
    struct mclient *look = client(&m, PROTO_ROLE_LOOKUP, NULL, 2000);
    int rc;
    cr_assert_eq(owned_by(look, 0, 20, n.ref, &rc), 20);
    /* n stops heartbeating; `other` keeps on */
    bool suspect = false;
    for (int i = 0; i < 1000 && !suspect; i++) {
        cr_assert_eq(node_beat(&other, &a), 0);
        mclient_nodes(look);
        const struct proto_node_info *ni = mclient_node(look, n.ref);
        suspect = ni && ni->state == PROTO_NODE_SUSPECT;
        if (!suspect)
            usleep(10000);
    }
    cr_assert(suspect, "node never became suspect");
    cr_assert_eq(owned_by(look, 0, 20, n.ref, &rc), 0, "a suspect node is not returned");
    cr_assert_eq(rc, 0);
    cr_assert(mclient_node(look, other.ref) && mclient_node(look, other.ref)->state ==
              PROTO_NODE_ALIVE, "the node that heartbeats stays alive");
    bool gone = false;
    for (int i = 0; i < 1000 && !gone; i++) {
        cr_assert_eq(node_beat(&other, &a), 0);
        mclient_nodes(look);
        gone = !mclient_node(look, n.ref);
        if (!gone)
            usleep(10000);
    }
    cr_assert(gone, "node never declared dead");
    cr_assert(log_has(&m, "keys leave the index"));
    /* the dead node comes back: told to register, then a new resync */
    cr_assert_eq(mclient_heartbeat(n.c, n.seq, 0, NULL, 0, &a), 0);
    cr_assert_eq(a.action, PROTO_ACK_REGISTER);
    cr_assert_eq(node_beat(&n, &a), 0);
    cr_assert_eq(a.action, PROTO_ACK_OK);
    cr_assert_eq(owned_by(look, 0, 20, n.ref, &rc), 20);
    mclient_destroy(look);
    node_free(&n);
    node_free(&other);
    master_kill(&m, SIGTERM);
}

Test(master, a_node_restarting_under_a_new_pid_is_a_new_node)
{
    struct master m = {0};
    master_start(&m, NULL);
    struct proto_ack a;
    /* the first engine: a real process that registers, stores and exits */
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    pid_t child = fork();
    if (child == 0) {
        struct node n;
        node_init(&n, &m, (uint32_t)getpid(), "old");
        uint32_t ref = 0;
        if (node_register(&n, &a) == 0 && node_store(&n, 0, 10, 0, &a) == 0)
            ref = n.ref;
        (void)!write(pipefd[1], &ref, sizeof(ref));
        _exit(0);
    }
    uint32_t old_ref = 0;
    cr_assert_eq(read(pipefd[0], &old_ref, sizeof(old_ref)), sizeof(old_ref));
    int st;
    waitpid(child, &st, 0);
    cr_assert_neq(old_ref, 0);
    /* the restarted engine: same host, a new pid */
    struct node n;
    node_init(&n, &m, (uint32_t)getpid(), "new");
    cr_assert_eq(node_register(&n, &a), 0);
    cr_assert_neq(n.ref, old_ref, "a new pid is a new node");
    cr_assert_eq(a.action, PROTO_ACK_OK, "a fresh node (seq 0) needs no resync");
    struct mclient *look = client(&m, PROTO_ROLE_LOOKUP, NULL, 2000);
    int rc;
    cr_assert_eq(owned_by(look, 0, 10, n.ref, &rc), 0, "the old node's keys are not the new one's");
    cr_assert_eq(owned_by(look, 0, 10, old_ref, &rc), 10, "until the old node is declared dead");
    cr_assert_not_null(mclient_node(look, old_ref));
    cr_assert_not_null(mclient_node(look, n.ref));
    cr_assert_str_eq((char *)mclient_node(look, n.ref)->addr, "new");
    mclient_destroy(look);
    node_free(&n);
    close(pipefd[0]);
    close(pipefd[1]);
    master_kill(&m, SIGTERM);
}

Test(master, kill9_and_restart_of_the_master_relearns_every_node)
{
    struct master m = {0};
    master_start(&m, NULL);
    struct node n1, n2;
    struct proto_ack a;
    node_init(&n1, &m, 2001, "n1");
    node_init(&n2, &m, 2002, "n2");
    cr_assert_eq(node_register(&n1, &a), 0);
    cr_assert_eq(node_register(&n2, &a), 0);
    cr_assert_eq(node_store(&n1, 0, 3000, 0, &a), 0);
    cr_assert_eq(node_store(&n2, 3000, 5000, 0, &a), 0);
    master_kill(&m, SIGKILL);
    master_start(&m, NULL); /* same port: no operator action anywhere else */
    struct mclient *look = client(&m, PROTO_ROLE_LOOKUP, NULL, 2000);
    int rc;
    cr_assert_eq(owned_by(look, 0, 5000, n1.ref, &rc), 0, "a new master knows nothing");
    /* the nodes' heartbeats: a lost connection, then reconnect with
     * backoff, REGISTER, RESYNC */
    for (int i = 0; i < 500; i++) {
        int r1 = node_beat(&n1, &a), r2 = node_beat(&n2, &a);
        if (r1 == 0 && r2 == 0 && a.action == PROTO_ACK_OK &&
            owned_by(look, 0, 3000, n1.ref, &rc) == 3000)
            break;
        usleep(10000);
    }
    cr_assert_eq(owned_by(look, 0, 3000, n1.ref, &rc), 3000);
    cr_assert_eq(owned_by(look, 3000, 5000, n2.ref, &rc), 2000);
    cr_assert(log_has(&m, "resynced: 3000 keys"));
    mclient_destroy(look);
    node_free(&n1);
    node_free(&n2);
    master_kill(&m, SIGTERM);
}

Test(master, sigstop_lookups_end_by_their_timeout_single_flight)
{
    struct master m = {0};
    master_start(&m, NULL);
    struct node n;
    struct proto_ack a;
    node_init(&n, &m, 3001, "n");
    cr_assert_eq(node_register(&n, &a), 0);
    cr_assert_eq(node_store(&n, 0, 10, 0, &a), 0);
    struct mclient *look = client(&m, PROTO_ROLE_LOOKUP, NULL, 300);
    int rc;
    cr_assert_eq(owned_by(look, 0, 10, n.ref, &rc), 10);
    tu_kill_wait(m.pid, SIGSTOP);
    cr_assert_eq(owned_by(look, 0, 10, n.ref, &rc), 0);
    cr_assert_eq(rc, UMBP_E_TIMEOUT, "the stuck lookup ends by lookup_timeout_ms");
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(owned_by(look, 0, 10, n.ref, &rc), 0);
        cr_assert_eq(rc, UMBP_E_NOT_ATTEMPTED, "later lookups miss without asking");
    }
    kill(m.pid, SIGCONT);
    bool back = false;
    for (int i = 0; i < 500 && !back; i++) {
        back = owned_by(look, 0, 10, n.ref, &rc) == 10;
        if (!back)
            usleep(10000);
    }
    cr_assert(back, "lookups answer again once the master runs");
    mclient_destroy(look);
    node_free(&n);
    master_kill(&m, SIGTERM);
}

/* ---- raw peers ----------------------------------------------------------------------------- */

static int raw_connect(const struct master *m)
{
    int fd;
    int rc = net_tcp_connect(m->addr, &fd);
    if (rc == -EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        poll(&p, 1, 5000);
        rc = 0;
    }
    cr_assert_eq(rc, 0);
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void raw_send(int fd, const struct proto_buf *b)
{
    cr_assert_eq(send(fd, b->data, b->len, MSG_NOSIGNAL), (ssize_t)b->len);
}

/* Reads one frame into buf; its type, or -1 at EOF. */
static int raw_recv(int fd, uint8_t *buf, size_t cap, struct proto_frame *f)
{
    size_t have = 0;
    for (;;) {
        char err[256];
        long n = proto_frame_parse(buf, have, true, f, err, sizeof(err));
        cr_assert_geq(n, 0, "the master sent a bad frame: %s", err);
        if (n > 0)
            return f->type;
        ssize_t r = recv(fd, buf + have, cap - have, 0);
        if (r <= 0)
            return -1;
        have += (size_t)r;
    }
}

static void raw_hello(int fd, uint8_t role)
{
    struct proto_buf b = {0};
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION, .role = role,
                            .pid = 1};
    proto_begin(&b, PROTO_HELLO, 1, 1, 0);
    proto_put_hello(&b, &h);
    cr_assert_eq(proto_end(&b), 0);
    raw_send(fd, &b);
    proto_buf_free(&b);
    static uint8_t buf[1 << 16];
    struct proto_frame f;
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), PROTO_HELLO_OK);
}

/* Sends frame bytes, expects ERROR naming `field`. */
static void expect_error(const struct master *m, struct proto_buf *b, const char *field)
{
    int fd = raw_connect(m);
    raw_hello(fd, PROTO_ROLE_NODE);
    raw_send(fd, b);
    static uint8_t buf[1 << 16];
    struct proto_frame f;
    struct proto_error e;
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), PROTO_ERROR);
    cr_assert_eq(proto_get_error(&f, &e), 0);
    cr_assert(strstr(e.message, field), "ERROR '%s' should name %s", e.message, field);
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), -1, "then the connection is closed");
    close(fd);
}

Test(master, bad_frames_get_an_error_naming_the_field)
{
    struct master m = {0};
    master_start(&m, NULL);
    struct proto_buf b = {0};
    /* REGISTER with addr_len past its field (patched after a valid build) */
    struct proto_register r = {.host = "h", .pid = 1, .start_ns = 1, .capacity_bytes = 1};
    proto_begin(&b, PROTO_REGISTER, 2, 1, 0);
    proto_put_register(&b, &r);
    cr_assert_eq(proto_end(&b), 0);
    uint32_t big = 2000;
    memcpy(b.data + PROTO_HDR_SIZE + PROTO_BODY_HDR_SIZE + PROTO_NAME_MAX + 4, &big, 4);
    expect_error(&m, &b, "REGISTER.addr_len");
    proto_buf_free(&b);
    /* HEARTBEAT whose record 0 is not STATUS */
    struct proto_node_event ev = {.seq = 1, .kind = PROTO_NODE_STORED, .size = 1};
    proto_begin(&b, PROTO_HEARTBEAT, 2, 1, 0);
    proto_put_node_event(&b, &ev);
    cr_assert_eq(proto_end(&b), 0);
    expect_error(&m, &b, "HEARTBEAT.kind");
    proto_buf_free(&b);
    /* RESYNC with an unknown flag (the codec refuses it) */
    struct proto_node_event st = {.kind = PROTO_NODE_STATUS};
    proto_begin(&b, PROTO_RESYNC, 2, 1, PROTO_RESYNC_FIRST);
    proto_put_node_event(&b, &st);
    cr_assert_eq(proto_end(&b), 0);
    b.data[PROTO_HDR_SIZE + 4] |= 0x80;
    expect_error(&m, &b, "RESYNC.arg");
    proto_buf_free(&b);
    /* RESYNC without FIRST */
    proto_begin(&b, PROTO_RESYNC, 2, 1, PROTO_RESYNC_LAST);
    proto_put_node_event(&b, &st);
    cr_assert_eq(proto_end(&b), 0);
    int fd = raw_connect(&m);
    raw_hello(fd, PROTO_ROLE_NODE);
    struct proto_buf rb = {0};
    r.seq = 0;
    proto_begin(&rb, PROTO_REGISTER, 3, 1, 0);
    proto_put_register(&rb, &r);
    proto_end(&rb);
    raw_send(fd, &rb);
    static uint8_t buf[1 << 16];
    struct proto_frame f;
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), PROTO_REGISTER_R);
    raw_send(fd, &b);
    struct proto_error e;
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), PROTO_ERROR);
    cr_assert_eq(proto_get_error(&f, &e), 0);
    cr_assert(strstr(e.message, "RESYNC.arg"), "%s", e.message);
    close(fd);
    proto_buf_free(&b);
    proto_buf_free(&rb);
    cr_assert(log_has(&m, "malformed frame: REGISTER.addr_len"));
    master_kill(&m, SIGTERM);
}

/* ---- the shared-secret handshake ------------------------------------------------------------ */

static void write_secret(const char *path, const char *secret)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(secret, f);
    fclose(f);
    chmod(path, 0600);
}

Test(master, the_shared_secret_lets_in_only_who_holds_it)
{
    char path[128], extra[256];
    snprintf(path, sizeof(path), "/tmp/test_master.%d.secret", getpid());
    write_secret(path, "correct horse battery staple\n");
    struct master m = {0};
    snprintf(extra, sizeof(extra), "\"secret_file\": \"%s\", \"handshake_timeout_ms\": 300", path);
    master_start(&m, extra);
    struct net_auth_key good, bad;
    cr_assert_eq(net_auth_key_load(path, "secret_file", &good, NULL, 0), 0);
    net_auth_key_from("correct horse battery stapler", 29, &bad);
    umbp_key_t k = key_of(1);
    struct proto_location l;

    struct mclient *c = client(&m, PROTO_ROLE_LOOKUP, &good, 2000);
    cr_assert_eq(mclient_locate(c, &k, 1, &l), 0, "%s", mclient_last_error(c));
    mclient_destroy(c);

    c = client(&m, PROTO_ROLE_LOOKUP, &bad, 2000);
    cr_assert_lt(mclient_locate(c, &k, 1, &l), 0);
    cr_assert(strstr(mclient_last_error(c), "wrong shared secret"), "%s",
              mclient_last_error(c));
    cr_assert(log_has(&m, "(127.0.0.1:"), "the log names the peer");
    cr_assert(log_has(&m, "refused: AUTH.mac: wrong shared secret"));
    mclient_destroy(c);

    c = client(&m, PROTO_ROLE_LOOKUP, NULL, 2000);
    cr_assert_lt(mclient_locate(c, &k, 1, &l), 0);
    cr_assert(strstr(mclient_last_error(c), "no secret"), "%s", mclient_last_error(c));
    mclient_destroy(c);

    /* a client that skips the handshake: HELLO_ERR */
    int fd = raw_connect(&m);
    static uint8_t buf[1 << 16];
    struct proto_frame f;
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), PROTO_AUTH_CHALLENGE);
    struct proto_buf b = {0};
    struct proto_hello h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
                            .role = PROTO_ROLE_LOOKUP, .pid = 1};
    proto_begin(&b, PROTO_HELLO, 1, 1, 0);
    proto_put_hello(&b, &h);
    proto_end(&b);
    raw_send(fd, &b);
    proto_buf_free(&b);
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), PROTO_HELLO_ERR);
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), -1);
    close(fd);
    cr_assert(log_has(&m, "refused: AUTH: missing"));

    /* a peer that stops mid-handshake is timed out */
    fd = raw_connect(&m);
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), PROTO_AUTH_CHALLENGE);
    cr_assert_eq(raw_recv(fd, buf, sizeof(buf), &f), -1, "closed by handshake_timeout_ms");
    close(fd);
    cr_assert(log_has(&m, "did not finish AUTH and HELLO within handshake_timeout_ms"));
    master_kill(&m, SIGTERM);
    unlink(path);
}

Test(master, options_are_refused_naming_them)
{
    char path[128];
    snprintf(path, sizeof(path), "/tmp/test_master.%d.open-secret", getpid());
    write_secret(path, "0123456789abcdef0123");
    chmod(path, 0644);
    struct {
        const char *json, *says;
    } cases[] = {
        {"{\"listen\": \"0.0.0.0:1\"}", "set secret_file"},
        {"{\"heartbeat_suspect_ms\": 500, \"heartbeat_dead_ms\": 400}", "heartbeat_dead_ms"},
        {"{\"listen\": \"nohost\"}", "listen"},
        {"{\"max_replicas\": 9}", "max_replicas"},
        {"{\"lease_url\": \"redis://127.0.0.1:6379\"}", "cluster"},
        {"{\"lease_url\": \"etcd://127.0.0.1:2379/c\"}", "unknown store"},
        {"{\"lease_url\": \"redis://127.0.0.1:6379/a b\"}", "cluster name"},
        {"{\"lease_url\": \"redis://127.0.0.1:6379/c\", \"lease_ttl_ms\": 900, "
         "\"lease_timeout_ms\": 400}", "lease_timeout_ms"},
        {"{\"listen\": \"0.0.0.0:1\", \"secret_file\": \"/nonexistent\", "
         "\"lease_url\": \"redis://127.0.0.1:6379/c\"}", "advertise"},
        {"{\"advertise\": \"10.0.0.1:7390\"}", "without lease_url"},
        /* the wildcard came from advertise: the message names it, not listen */
        {"{\"lease_url\": \"redis://127.0.0.1:6379/c\", \"advertise\": \"0.0.0.0:1\"}",
         "advertise 0.0.0.0:1 is a wildcard"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int p[2];
        cr_assert_eq(pipe(p), 0);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(p[1], 2);
            execl(UMBP_MASTER_BIN, "umbp-master", "--json", cases[i].json, (char *)NULL);
            _exit(127);
        }
        close(p[1]);
        char out[1024] = "";
        size_t n = 0;
        ssize_t r;
        while ((r = read(p[0], out + n, sizeof(out) - 1 - n)) > 0)
            n += (size_t)r;
        out[n] = 0;
        close(p[0]);
        int st;
        waitpid(pid, &st, 0);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s should fail", cases[i].json);
        cr_expect(strstr(out, cases[i].says), "%s: '%s' should name %s", cases[i].json, out,
                  cases[i].says);
    }
    char json[256];
    snprintf(json, sizeof(json), "{\"secret_file\": \"%s\"}", path);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 2);
        execl(UMBP_MASTER_BIN, "umbp-master", "--json", json, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char out[1024] = "";
    ssize_t r = read(p[0], out, sizeof(out) - 1);
    out[r > 0 ? r : 0] = 0;
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    cr_expect(strstr(out, "chmod 600"), "an open secret file is refused: '%s'", out);
    unlink(path);
}

Test(master, metrics_count_nodes_keys_and_refusals)
{
    struct master m = {0};
    uint16_t mport = free_port();
    char extra[128];
    snprintf(extra, sizeof(extra), "\"metrics_port\": %u, \"heartbeat_suspect_ms\": 200, "
             "\"heartbeat_dead_ms\": 60000", mport);
    master_start(&m, extra);
    struct node n;
    struct proto_ack a;
    node_init(&n, &m, 4001, "x");
    cr_assert_eq(node_register(&n, &a), 0);
    cr_assert_eq(node_store(&n, 0, 42, 0, &a), 0);
    bool seen = false;
    char *body = NULL, err[768] = "";
    for (int i = 0; i < 500 && !seen; i++) {
        free(body);
        body = tu_scrape("127.0.0.1", mport, 5000, err, sizeof(err));
        seen = body && tu_sample(body, "umbp_master_nodes{state=\"alive\"}") == 1 &&
               tu_sample(body, "umbp_master_keys") == 42 &&
               tu_sample(body, "umbp_master_events_total") == 42;
        if (!seen)
            usleep(10000);
    }
    cr_assert(seen, "metrics never showed the node and its keys: %s", body ? body : err);
    free(body);
    node_free(&n);
    master_kill(&m, SIGTERM);
}
