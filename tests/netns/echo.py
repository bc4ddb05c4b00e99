#!/usr/bin/env python3
"""A TCP echo for test_netns.sh: `echo.py serve ADDR PORT` answers one
connection at a time with the bytes it was sent (until the client shuts
down its side); `echo.py send ADDR PORT NBYTES TIMEOUT_S` sends random
bytes, reads them back and exits 0 only if every byte came back, 2 if the
connection could not be made or stalled within the timeout."""
import os
import socket
import sys


def serve(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(8)
    print("ready", flush=True)
    while True:
        c, _ = s.accept()
        with c:
            c.settimeout(30)
            try:
                while True:
                    b = c.recv(1 << 16)
                    if not b:
                        break
                    c.sendall(b)
            except OSError:
                pass


def send(addr, port, n, timeout):
    data = os.urandom(n)
    try:
        c = socket.create_connection((addr, port), timeout=timeout)
        c.settimeout(timeout)
        got = bytearray()
        sent = 0
        while sent < n or len(got) < n:
            if sent < n:
                sent += c.send(data[sent:sent + (1 << 16)])
                if sent == n:
                    c.shutdown(socket.SHUT_WR)
            b = c.recv(1 << 16)
            if not b:
                break
            got += b
        c.close()
    except OSError as e:
        print(f"no echo: {e}", file=sys.stderr)
        return 2
    if bytes(got) != data:
        print(f"echo differs: {len(got)} of {n} bytes back", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])))
