#!/usr/bin/env python3
"""Seeds for fuzz_proto_master (tests/fuzz/corpus/master): byte streams of
umbp-master's frames, laid out as net/proto.h says.  The first byte picks the
side (even: what the master reads; odd: what a client reads)."""
import os
import struct
import sys

HELLO, HELLO_OK, HELLO_ERR, ERROR = 1, 2, 3, 22
AUTH_CHALLENGE, AUTH, AUTH_OK = 25, 26, 27
REGISTER, REGISTER_R, HEARTBEAT, HEARTBEAT_R = 28, 29, 30, 31
RESYNC, RESYNC_R, LOCATE, LOCATE_R, NODES, NODES_R = 32, 33, 34, 35, 36, 37
SUSPECT = 38


def frame(typ, seq, recs, arg=0):
    body = struct.pack('<II', len(recs), arg) + b''.join(recs)
    return struct.pack('<IHHQ', len(body), typ, 0, seq) + body


def key(i):
    return struct.pack('<I', i) + bytes(27) + b'\x5a'


def hello(role=3):
    return struct.pack('<IHBBIIII', 0x554d4250, 3, role, 0, 0, 1, 0, 0) + bytes(128)


def register(pid, seq=0, addr=b'worker-address'):
    return (b'host-a'.ljust(64, b'\0') + struct.pack('<II', pid, len(addr)) +
            struct.pack('<QQQQ', 99, 1 << 30, 0, seq) + addr.ljust(1024, b'\0'))


def event(seq, kind, k=None, size=0):
    return struct.pack('<QII', seq, kind, 0) + (k or bytes(32)) + struct.pack('<Q', size)


def ack(seq, action, ref):
    return struct.pack('<QII', seq, action, ref)


def location(refs, size):
    r = list(refs) + [0] * (4 - len(refs))
    return struct.pack('<IIQ', len(refs), 0, size if refs else 0) + struct.pack('<4I', *r)


def node_info(ref, state, addr=b'addr'):
    return (struct.pack('<II', ref, state) + b'host-a'.ljust(64, b'\0') +
            struct.pack('<II', 7, len(addr)) + struct.pack('<6Q', 1, 2, 3, 4, 5, 6) +
            addr.ljust(1024, b'\0'))


def main(out):
    os.makedirs(out, exist_ok=True)
    node = (frame(HELLO, 1, [hello()]) + frame(REGISTER, 2, [register(10)]) +
            frame(HEARTBEAT, 3, [event(3, 0, size=300)] +
                  [event(i + 1, 1, key(i), 4096) for i in range(3)]) +
            frame(HEARTBEAT, 4, [event(4, 0)] + [event(4, 2, key(1))]) +
            frame(LOCATE, 5, [key(i) for i in range(4)]) + frame(NODES, 6, [], 0) +
            frame(SUSPECT, 7, [struct.pack('<I', 1), struct.pack('<I', 2)]) +
            frame(LOCATE, 8, [key(0)]))
    gap = (frame(REGISTER, 2, [register(11, seq=5)]) +
           frame(RESYNC, 3, [event(5, 0)] + [event(0, 1, key(i), 100) for i in range(5)], 1) +
           frame(RESYNC, 4, [event(5, 0)] + [event(0, 1, key(9), 100)], 2) +
           frame(HEARTBEAT, 5, [event(7, 0)] + [event(7, 1, key(20), 5)]) +
           frame(LOCATE, 250, [key(i) for i in range(10)]) +
           frame(REGISTER, 251, [register(12)]) + frame(NODES, 7, [], 3))
    client = (frame(AUTH_CHALLENGE, 0, [bytes(range(32))]) + frame(AUTH_OK, 1, [bytes(32)]) +
              frame(REGISTER_R, 2, [ack(0, 0, 1)]) + frame(HEARTBEAT_R, 3, [ack(3, 1, 1)]) +
              frame(RESYNC_R, 4, [ack(3, 2, 0)]) +
              frame(LOCATE_R, 5, [location([1, 2], 4096), location([], 0)], 9) +
              frame(NODES_R, 6, [node_info(1, 0), node_info(2, 1)], 9))
    auth = frame(AUTH, 1, [bytes(64)]) + frame(HELLO, 2, [hello(1)])
    seeds = {'node': b'\0' + node, 'gap': b'\0' + gap, 'client': b'\1' + client,
             'auth': b'\0' + auth}
    for name, data in seeds.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(data)


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else
         os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus', 'master'))
