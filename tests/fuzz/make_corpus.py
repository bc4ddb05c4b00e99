#!/usr/bin/env python3
"""make_corpus.py - seed corpora for the proto fuzzers: valid frames of every type.

Written from the layouts in net/proto.h with Python's struct module,
not through proto.c, so the seeds are also an independent statement of the
wire format (the fuzzers reject nothing here: tests/unit/test_shm_proto.c
parses every seed).  Writes tests/fuzz/corpus/server/ (frames a client sends)
and tests/fuzz/corpus/client/ (frames a server sends); the output is
committed, rerun this after a protocol change:

    python3 tests/fuzz/make_corpus.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

MAGIC = 0x554D4250
VERSION = 2
NAME_MAX = 64
ERRMSG_MAX = 192
MiB = 1 << 20
GiB = 1 << 30

T = dict(HELLO=1, HELLO_OK=2, HELLO_ERR=3, LOOKUP=4, LOOKUP_R=5, RESERVE=6,
         RESERVE_R=7, PUBLISH=8, PUBLISH_R=9, ABORT=10, ACQUIRE=11, ACQUIRE_R=12,
         RELEASE=13, RELEASE_R=14, CLEAR=15, CLEAR_R=16, STATS=17, STATS_R=18,
         PING=19, PONG=20, EVENTS=21, ERROR=22, SESSIONS=23, SESSIONS_R=24,
         WAITING=39, PUBLISH_AS=40)

EPROTO = 71
ENOENT = 2
ENOSPC = 28
EXISTS = 1  # UMBP_TIER_EXISTS
UMBP_E_STALE = -4100


def frame(type_name, seq, records, arg=0):
    """header (u32 len, u16 type, u16 flags, u64 seq), body (u32 n, u32 arg, records)"""
    body = struct.pack("<II", len(records), arg & 0xFFFFFFFF) + b"".join(records)
    return struct.pack("<IHHQ", len(body), T[type_name], 0, seq) + body


def name(s, cap):
    b = s.encode()
    assert len(b) < cap
    return b + b"\0" * (cap - len(b))


def key(i):
    return bytes((i * 37 + j * 11) & 0xFF for j in range(32))


def hello(role, flags=0, engine="vllm-0", ns=""):
    return struct.pack("<IHBBIIII", MAGIC, VERSION, role, 0, flags, 4242, 1, 2) + \
        name(engine, NAME_MAX) + name(ns, NAME_MAX)


def welcome(pool_size=GiB):
    return struct.pack("<HHIQQQQ", VERSION, 0, 30000, 7, 0x1234ABCD, pool_size,
                       pool_size - MiB)


def error(status, msg):
    return struct.pack("<i", status) + name(msg, ERRMSG_MAX)


def key_u64(i, v):
    return key(i) + struct.pack("<Q", v)


def region(status, offset=0, size=0, token=0):
    return struct.pack("<iIQQQ", status, 0, offset, size, token)


def status(v):
    return struct.pack("<i", v)


def event(t, i):
    return struct.pack("<I", t) + key(i)


def stats():
    return struct.pack("<20Q", *[(i + 1) * 1000 for i in range(20)])


def session(sid, role, engine, ns):
    return struct.pack("<QIIIIIIQQQ", sid, 100 + sid, 1000, role, sid, 0, 0, 3, 1, 99) + \
        name(engine, NAME_MAX) + name(ns, NAME_MAX)


def server_seeds():
    """Frames a client sends: what umbp-server parses."""
    s = {
        "hello_worker": frame("HELLO", 1, [hello(0, 1, "vllm-0", "tenant-a")], arg=11000),
        "hello_lookup": frame("HELLO", 1, [hello(1)]),
        "hello_admin": frame("HELLO", 1, [hello(2, 0, "umbp")]),
        "lookup_touch": frame("LOOKUP", 2, [key(i) for i in range(3)], arg=1),
        "lookup_empty": frame("LOOKUP", 3, []),
        "reserve": frame("RESERVE", 4, [key_u64(i, (i + 1) * 4096) for i in range(4)]),
        "publish": frame("PUBLISH", 5, [key_u64(i, 100 + i) for i in range(2)]),
        "reserve_ahead": frame("RESERVE", 13, [key_u64(i, 65536) for i in range(8, 12)],
                               arg=30000),
        "publish_as": frame("PUBLISH_AS", 14, [key_u64(8 + i, 100 + i) + key(20 + i)
                                               for i in range(2)]),
        "abort": frame("ABORT", 6, [key_u64(9, 77)]),
        "acquire": frame("ACQUIRE", 7, [key(i) for i in range(2)], arg=30000),
        "release": frame("RELEASE", 8, [key_u64(i, 200 + i) for i in range(2)]),
        "clear": frame("CLEAR", 9, []),
        "stats": frame("STATS", 10, []),
        "ping": frame("PING", 11, []),
        "sessions": frame("SESSIONS", 12, []),
    }
    s["stream"] = b"".join(s[k] for k in ("hello_worker", "lookup_touch", "reserve",
                                          "publish", "reserve_ahead", "publish_as",
                                          "acquire", "release", "ping"))
    return s


def client_seeds():
    """Frames a server sends: what the client runtime parses."""
    s = {
        "hello_ok": frame("HELLO_OK", 1, [welcome()]),
        "hello_err": frame("HELLO_ERR", 1, [error(-EPROTO, "HELLO.version: 9 not spoken")],
                           arg=-EPROTO),
        "lookup_r": frame("LOOKUP_R", 2, [b"\x01", b"\x00", b"\x01"]),
        "reserve_r": frame("RESERVE_R", 4, [region(0, 0, 4096, 11), region(EXISTS),
                                            region(-ENOSPC), region(0, 8192, 16384, 12)]),
        "publish_r": frame("PUBLISH_R", 5, [status(0), status(-ENOENT)]),
        "acquire_r": frame("ACQUIRE_R", 7, [region(0, 4096, 4096, 21), region(-ENOENT)]),
        "release_r": frame("RELEASE_R", 8, [status(0), status(UMBP_E_STALE)]),
        "clear_r": frame("CLEAR_R", 9, [], arg=0),
        "stats_r": frame("STATS_R", 10, [stats()]),
        "pong": frame("PONG", 11, []),
        "waiting": frame("WAITING", 7, [], arg=1000),
        "events": frame("EVENTS", 0, [event(1, 1), event(2, 2)], arg=5),
        "error": frame("ERROR", 0, [error(-EPROTO, "RESERVE.n: 70000 records exceed 65536")]),
        "sessions_r": frame("SESSIONS_R", 12, [session(1, 0, "vllm-0", "tenant-a"),
                                               session(2, 2, "umbp", "")]),
    }
    s["stream"] = b"".join(s[k] for k in ("hello_ok", "lookup_r", "reserve_r", "events",
                                          "publish_r", "waiting", "acquire_r", "release_r",
                                          "pong"))
    return s


def write(sub, seeds):
    d = os.path.join(HERE, "corpus", sub)
    os.makedirs(d, exist_ok=True)
    for n, data in sorted(seeds.items()):
        with open(os.path.join(d, n + ".bin"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("server", server_seeds())
    write("client", client_seeds())
