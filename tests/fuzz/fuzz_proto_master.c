/*
 * fuzz_proto_master.c - libFuzzer target: umbp-master's decoders and its
 * directory.  The first input byte picks the side: even, the stream the
 * master reads from a node (every accessor of every record called, every
 * valid frame re-encoded byte for byte: fuzz_common.h), each valid frame
 * then fed to a directory (master/directory.c) as the master does:
 * REGISTER, HEARTBEAT, RESYNC, LOCATE, NODES, with a sweep between frames on
 * a clock the input moves; odd, the stream a client reads from the master
 * (AUTH_CHALLENGE, AUTH_OK, the acknowledgements, LOCATE_R, NODES_R).
 *
 *   cmake -B build-fuzz -DCMAKE_C_COMPILER=clang -DUMBP_BUILD_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_proto_master
 *   build-fuzz/tests/fuzz/fuzz_proto_master -max_total_time=300 /tmp/corpus-m \
 *       tests/fuzz/corpus/master
 */
#include "directory.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct directory *dir;
static struct dir_node *node;
static uint64_t now;

static void gone(void *ctx, struct dir_node *n)
{
    (void)ctx;
    if (n == node)
        node = NULL;
}

static void on_frame(const struct proto_frame *f)
{
    struct proto_ack a;
    char err[256];
    now += (f->seq & 0xff) * 1000000ull; /* the input moves the clock */
    dir_sweep(dir, now, 50000000ull, 150000000ull);
    switch (f->type) {
    case PROTO_REGISTER: {
        struct proto_register r;
        if (proto_get_register(f, &r, err, sizeof(err)) == 0)
            FZ_CHECK(dir_register(dir, &r, now, &node, &a) == 0 ||
                     dir_node_count(dir) == 4);
        break;
    }
    case PROTO_HEARTBEAT:
        dir_heartbeat(dir, node, f, now, &a, err, sizeof(err));
        break;
    case PROTO_RESYNC:
        dir_resync(dir, node, f, now, &a, err, sizeof(err));
        break;
    case PROTO_LOCATE:
        for (uint32_t i = 0; i < f->n; i++) {
            umbp_key_t k;
            struct proto_location l;
            FZ_CHECK(proto_get_key(f, i, &k) == 0);
            dir_locate(dir, &k, &l);
            FZ_CHECK(l.nrep <= 2 && (l.nrep == 0) == (l.size == 0));
        }
        break;
    case PROTO_SUSPECT:
        for (uint32_t i = 0; i < f->n; i++) {
            int32_t v;
            FZ_CHECK(proto_get_status(f, i, &v) == 0);
            FZ_CHECK(dir_report(dir, (uint32_t)v) <= 1);
        }
        break;
    case PROTO_NODES: {
        static struct proto_node_info ni[4];
        FZ_CHECK(dir_nodes(dir, now, ni, 4) == dir_node_count(dir));
        break;
    }
    }
    FZ_CHECK(dir_key_count(dir) <= 4096);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1) {
        fz_stream(data + 1, size - 1, true, NULL, NULL);
        return 0;
    }
    struct dir_config cfg = {.max_nodes = 4, .max_replicas = 2, .max_keys = 4096,
                             .on_gone = gone};
    FZ_CHECK(dir_create(&cfg, &dir) == 0);
    node = NULL;
    now = 1;
    fz_stream(data + 1, size - 1, false, on_frame, NULL);
    dir_destroy(dir);
    return 0;
}
