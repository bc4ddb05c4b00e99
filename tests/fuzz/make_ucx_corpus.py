#!/usr/bin/env python3
"""make_ucx_corpus.py - seeds for fuzz_ucx_wire: valid FETCH and DATA messages.

Written from the layout in net/ucx_wire.h with Python's struct module, not
through ucx_wire.c.  Each seed is the fuzzer's input: a selector byte (0
FETCH, 1 DATA), the header's length (u16 LE), the header, the data.  Writes
tests/fuzz/corpus/ucx/ (committed; rerun after a change of the messages):

    python3 tests/fuzz/make_ucx_corpus.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC, VERSION, FETCH, DATA = 0x46504D55, 3, 1, 2
ENOENT, EMSGSIZE, EIO, EACCES = 2, 90, 5, 13
NONCE = bytes(range(100, 116))
MAC = bytes(range(200, 216))


def fetch(req_id, recs):
    hdr = struct.pack("<IHHQII16s16s", MAGIC, VERSION, FETCH, req_id, len(recs), 0, NONCE, MAC)
    data = b"".join(key + struct.pack("<Q", mx) for key, mx in recs)
    return b"\0" + struct.pack("<H", len(hdr)) + hdr + data


def data(req_id, index, status, size, payload=b""):
    hdr = struct.pack("<IHHQIiQ16s", MAGIC, VERSION, DATA, req_id, index, status, size, MAC)
    return b"\1" + struct.pack("<H", len(hdr)) + hdr + payload


def main():
    out = os.path.join(HERE, "corpus", "ucx")
    os.makedirs(out, exist_ok=True)
    k = lambda i: bytes((i * 7 + j) & 0xFF for j in range(32))
    seeds = {
        "fetch_one": fetch(1, [(k(1), 4096)]),
        "fetch_three": fetch(77, [(k(1), 4096), (k(2), 2 << 20), (k(3), 1 << 32)]),
        "data_bytes": data(77, 0, 0, 16, bytes(range(16))),
        "data_empty_object": data(77, 1, 0, 0),
        "data_miss": data(77, 2, -ENOENT, 0),
        "data_too_large": data(5, 0, -EMSGSIZE, 3 << 20),
        "data_io": data(5, 3, -EIO, 0),
        "data_refused": data(5, 4, -EACCES, 0),
    }
    for name, b in seeds.items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(b)


if __name__ == "__main__":
    main()
