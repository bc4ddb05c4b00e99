/*
 * fuzz_proto_client.c - libFuzzer target: the byte stream a client reads from
 * umbp-server, parsed with proto_frame_parse(from_server = true) frame by
 * frame, with the properties of fuzz_common.h, and every RESERVE_R and
 * ACQUIRE_R item put through proto_region_check against an oracle written
 * here (offset + size computed with an overflow check), for pool sizes taken
 * from the input: the pool_size of a HELLO_OK earlier in the stream (as a
 * client learns it) or else the input's first 8 bytes, and the sizes at and
 * around the item's own end.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Inet \
 *       tests/fuzz/fuzz_proto_client.c net/proto.c -o fuzz_proto_client
 *   ./fuzz_proto_client tests/fuzz/corpus/client
 */
#include "fuzz_common.h"

#define TIER_EXISTS 1 /* UMBP_TIER_EXISTS, restated */

static uint64_t pool_size; /* of the stream being parsed */

static bool region_acceptable(const struct proto_region_item *it, uint64_t want, uint64_t pool,
                              bool is_reserve)
{
    uint64_t end;

    if (it->status != 0) {
        if (it->status > 0 && !(is_reserve && it->status == TIER_EXISTS))
            return false;
        return it->offset == 0 && it->size == 0 && it->token == 0;
    }
    if ((want && it->size != want) || it->size == 0)
        return false;
    return !__builtin_add_overflow(it->offset, it->size, &end) && end <= pool;
}

static void check_region(const struct proto_region_item *it, uint64_t want, uint64_t pool,
                         bool is_reserve)
{
    char err[256] = "";
    int rc = proto_region_check(it, want, pool, is_reserve, err, sizeof(err));

    FZ_CHECK(rc == 0 || rc == -EPROTO);
    FZ_CHECK((rc == 0) == region_acceptable(it, want, pool, is_reserve));
    if (rc)
        FZ_CHECK(strncmp(err, is_reserve ? "RESERVE_R." : "ACQUIRE_R.", 10) == 0);
}

static void on_frame(const struct proto_frame *f)
{
    struct proto_welcome w;

    if (f->type == PROTO_HELLO_OK && proto_get_welcome(f, &w, NULL, 0) == 0)
        pool_size = w.pool_size;
}

static void on_record(const struct proto_frame *f, uint32_t i, const union fz_rec *r)
{
    const struct proto_region_item *it = &r->region;
    uint64_t end = it->offset + it->size; /* may wrap: that is a case too */
    const uint64_t pools[] = {pool_size, end, end - 1, end + 1, UINT64_MAX, 0};
    const uint64_t wants[] = {0, it->size, it->size + 1};

    (void)i;
    if (f->type != PROTO_RESERVE_R && f->type != PROTO_ACQUIRE_R)
        return;
    for (size_t p = 0; p < sizeof(pools) / sizeof(pools[0]); p++)
        for (size_t w = 0; w < sizeof(wants) / sizeof(wants[0]); w++) {
            check_region(it, wants[w], pools[p], f->type == PROTO_RESERVE_R);
            check_region(it, wants[w], pools[p], f->type != PROTO_RESERVE_R);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pool_size = 0;
    if (size >= 8)
        memcpy(&pool_size, data, 8);
    fz_stream(data, size, true, on_frame, on_record);
    return 0;
}
