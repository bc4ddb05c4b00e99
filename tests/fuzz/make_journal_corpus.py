#!/usr/bin/env python3
"""Seeds of fuzz_journal_adopt: journal slot areas written from the layout in
store/journal.h (64-byte slots: u32 state, u32 pad, u64 offset,
u64 size, u64 oid, 32-byte key), independently of journal.c.  The first byte
of each seed is the fuzzer's switch: odd = the next 48 bytes replace the
header; bit 1 = the next 256 bytes are the namespace table's entries 1..4
(64 bytes each: a NUL-terminated name), which records name in the top 16
bits of their oid.  Every input is also decoded as a whole <name>.ns
file.  Run from the repository root."""
import os
import struct

OUT = os.path.join(os.path.dirname(__file__), "corpus", "journal")
FREE, PENDING, PUBLISHED = 0, 1, 2


def slot(state, off, size, oid, key, ns=0):
    return struct.pack("<IIQQQ", state, 0, off, size, oid | ns << 48) + key.ljust(32, b"\0")


def names(*v):
    return b"".join(n.ljust(64, b"\0") for n in v).ljust(256, b"\0")


SEEDS = {
    "three_published_one_pending.bin": b"\x00" + slot(PUBLISHED, 0, 4096, 1, b"a")
    + slot(PUBLISHED, 4096, 1000, 2, b"b") + slot(PENDING, 8192, 256, 3, b"c")
    + slot(PUBLISHED, 16384, 65536, 4, b"d"),
    "overlapping_and_outside.bin": b"\x00" + slot(PUBLISHED, 0, 8192, 1, b"a")
    + slot(PUBLISHED, 4096, 4096, 2, b"b") + slot(PUBLISHED, 1 << 40, 16, 3, b"c")
    + slot(PUBLISHED, 256, 0, 4, b"e"),
    "duplicate_key_unaligned.bin": b"\x00" + slot(PUBLISHED, 0, 100, 1, b"x")
    + slot(PUBLISHED, 512, 100, 2, b"x") + slot(PUBLISHED, 777, 10, 3, b"y"),
    "bad_header.bin": b"\x01" + b"\x00" * 48 + slot(PUBLISHED, 0, 64, 1, b"z"),
    "namespaces.bin": b"\x02" + names(b"a", b"b" * 64, b"", b"d\0x")
    + slot(PUBLISHED, 0, 4096, 1, b"a", 1) + slot(PUBLISHED, 4096, 100, 2, b"b", 2)
    + slot(PENDING, 8192, 256, 3, b"c", 1) + slot(PUBLISHED, 12288, 64, 4, b"d", 4)
    + slot(PUBLISHED, 16384, 64, 5, b"e", 0xffff) + slot(PUBLISHED, 20480, 64, 6, b"f", 3),
    # the whole input is also decoded as a <name>.ns file (pool id at 16..23)
    "ns_table.bin": struct.pack("<QIIQ", 0x424154534E504D55, 1, 64, 77).ljust(64, b"\0")
    + names(b"a", b"tenant-b", b"", b"c\0x"),
}

if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
