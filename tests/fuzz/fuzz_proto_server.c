/*
 * fuzz_proto_server.c - libFuzzer target: the byte stream umbp-server reads
 * from a client, parsed with proto_frame_parse(from_server = false) frame by
 * frame, every accessor of every record called, every valid frame re-encoded
 * and compared byte for byte (the properties are in fuzz_common.h).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Inet \
 *       tests/fuzz/fuzz_proto_server.c net/proto.c -o fuzz_proto_server
 *   ./fuzz_proto_server tests/fuzz/corpus/server
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_stream(data, size, false, NULL, NULL);
    return 0;
}
