#!/usr/bin/env python3
"""bench_dist_kv - distributed mode on one GPU host: a 10,000-token prefix
stored to its node's slice by one process (the owner) and restored to the GPU
by another (the reader, a second node), through ``import umbp`` with a real
umbp-master, UCX between the two nodes (over loopback here), against
baselines measured in the same run:

  raw TCP      the same bytes sent over one loopback TCP connection by a
               plain socket server and received into host memory (the limit
               the network path has on this host)
  pinned h2d   one contiguous pinned host -> device copy of the same bytes

  remote restore  the reader's first restore of a prefix: LOCATE at the
               master, UCX fetch of every block from the owner into the
               reader's slice (kept there as replicas), GPU copies
  local restore   the same prefix again, now from the reader's own slice
  network share   1 - local / remote: the part of a remote restore that is
               the fetch (the rest is the local restore)

Every restore is compared bit for bit with the owner's data (regenerated on
the reader from the same seed) in poisoned destination blocks; a mismatch
exits 1.  Prints "SKIP: ..." and exits 0 without CUDA or without the rdma
tier.  Environment: UMBP_LIBRARY, UMBP_MASTER (default build/master/
umbp-master); UCX_TLS / UCX_NET_DEVICES (default tcp over lo).

With --via-server the reader is an engine of a host whose umbp-server is
the node (standalone mode): the server fetches the owner's blocks into its
shared pool (kept as replicas) and the reader restores them from there.

Usage: python3 bench/python/bench_dist_kv.py [--layout mini|4k|32k]
       [--rounds N] [--blocks 625] [--via-server]
Environment also: UMBP_SERVER (default build/server/umbp-server).
"""
import argparse
import hashlib
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "connector"))

BLOCK = 16
POISON = 0x5A5A
LAYOUTS = {"mini": (16, 4, 128), "4k": (32, 1, 128), "32k": (32, 8, 128)}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def apply_opts(cfg, items):
    """NAME=VALUE strings into cfg (numbers and booleans as such)."""
    for kv_ in items or []:
        k_, _, v_ = kv_.partition("=")
        try:
            cfg[k_] = json.loads(v_)
        except ValueError:
            cfg[k_] = v_


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


# ---- a node: one runtime in its own process ------------------------------------------


class Node:
    def __init__(self, args):
        import torch

        import umbp

        self.torch, self.umbp = torch, umbp
        self.cuda = args.device == "cuda"
        self.dev = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.dev)
        L, H, D = LAYOUTS[args.layout]
        self.L, self.H, self.D = L, H, D
        self.nblk = args.blocks
        nb = 3 * self.nblk + 8
        self.caches = [torch.empty(2, nb, BLOCK, H, D, dtype=torch.bfloat16, device=self.dev)
                       for _ in range(L)]
        self.obj = L * 2 * BLOCK * H * D * 2
        self.nbytes = self.nblk * self.obj
        opts = {"mode": "distributed", "master_address": args.master, "capacity_bytes": args.capacity,
                "gpu_backend": "cuda" if self.cuda else "host", "heartbeat_ms": 50, "log_level": "warn",
                "timeout_ms": 60000, "lookup_timeout_ms": 5000, "node_host": args.role}
        if args.role == "reader" and args.socket_dir:  # an engine of its host's server
            opts = {"mode": "standalone", "socket_dir": args.socket_dir,
                    "gpu_backend": opts["gpu_backend"], "log_level": "warn", "timeout_ms": 60000,
                    "lookup_timeout_ms": 5000}
        apply_opts(opts, args.opt)
        self.rt = umbp.Runtime(opts)
        self.kv = self.rt.register_kv_caches(self.caches, layout="flash_attn")
        self.ns = umbp.Namespace.derive("bench/dist_kv", "", BLOCK, "NHD", "bfloat16")
        self.A = list(range(0, self.nblk))
        self.B = list(range(self.nblk, 2 * self.nblk))
        self.C = list(range(2 * self.nblk, 3 * self.nblk))

    def keys(self, seed, r):
        hashes = [hashlib.blake2b(f"{seed}/{r}/{i}".encode(), digest_size=32).digest()
                  for i in range(self.nblk)]
        return self.umbp.derive_keys(self.ns, (0, 0, 0, 0), 0, hashes)

    def fill(self, ids, seed, r):
        """Round r's contents into block ids: the same bits in any process."""
        torch = self.torch
        idx = torch.tensor(ids, device=self.dev)
        for li, c in enumerate(self.caches):
            g = torch.Generator(device=self.dev)  # noqa: the same stream in each node
            g.manual_seed(seed * 1_000_003 + r * 1009 + li)
            t = torch.empty(2, len(ids), BLOCK, self.H, self.D, dtype=torch.int16, device=self.dev)
            t.random_(-32768, 32767, generator=g)
            c.view(torch.int16).index_copy_(1, idx, t)
        self.sync()

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def poison(self, ids):
        idx = self.torch.tensor(ids, device=self.dev)
        for c in self.caches:
            c.view(self.torch.int16).index_fill_(1, idx, POISON)
        self.sync()

    def same(self, a, b):
        torch = self.torch
        ia, ib = torch.tensor(a, device=self.dev), torch.tensor(b, device=self.dev)
        for c in self.caches:
            c = c.view(torch.int16)
            if not torch.equal(c.index_select(1, ia), c.index_select(1, ib)):
                return False
        return True

    def timed(self, fn, what):
        self.sync()
        t = time.perf_counter()
        job = fn()
        job.wait()
        dt = time.perf_counter() - t
        if job.num_ok != len(job):
            log(f"FAIL: {what}: {len(job) - job.num_ok} of {len(job)} keys failed: {job.statuses[:4]}")
            sys.exit(1)
        job.release()
        return dt


def owner(args):
    n = Node(args)
    for r in range(args.rounds):
        n.fill(n.A, args.seed, r)
        n.timed(lambda: n.rt.store_blocks(n.kv, n.keys(args.seed, r), n.A), f"store {r}")
    print("stored", flush=True)
    sys.stdin.read()  # until the parent closes it
    n.rt.deregister(n.kv)
    n.rt.close()


def raw_tcp_get(port, nbytes, buf):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    t = time.perf_counter()
    s.sendall(nbytes.to_bytes(8, "little"))
    view, got = memoryview(buf), 0
    while got < nbytes:
        k = s.recv_into(view[got:], min(nbytes - got, 8 << 20))
        if k == 0:
            raise SystemExit("raw TCP server closed early")
        got += k
    dt = time.perf_counter() - t
    s.close()
    return dt


def reader(args):
    n = Node(args)
    torch = n.torch
    out = {"layout": args.layout, "blocks": n.nblk, "object_bytes": n.obj, "bytes": n.nbytes,
           "remote": [], "local": [], "tcp": [], "h2d": []}
    host = torch.empty(n.nbytes, dtype=torch.uint8, pin_memory=n.cuda)
    dbuf = torch.empty(n.nbytes, dtype=torch.uint8, device=n.dev)
    for r in range(args.rounds):
        keys = n.keys(args.seed, r)
        n.fill(n.C, args.seed, r)  # what the owner stored
        n.poison(n.B)
        out["remote"].append(n.timed(lambda: n.rt.load_blocks(n.kv, keys, n.B), f"remote restore {r}"))
        if not n.same(n.B, n.C):
            log(f"FAIL: remote restore {r}: bytes differ from the owner's")
            sys.exit(1)
        n.poison(n.B)
        out["local"].append(n.timed(lambda: n.rt.load_blocks(n.kv, keys, n.B), f"local restore {r}"))
        if not n.same(n.B, n.C):
            log(f"FAIL: local restore {r}: bytes differ from the owner's")
            sys.exit(1)
        out["tcp"].append(raw_tcp_get(args.tcp_port, n.nbytes, host.numpy()))
        n.sync()
        t = time.perf_counter()
        dbuf.copy_(host, non_blocking=True)
        n.sync()
        out["h2d"].append(time.perf_counter() - t)
    n.rt.deregister(n.kv)
    n.rt.close()
    print(json.dumps(out), flush=True)


# ---- the parent: master, raw TCP server, two nodes -----------------------------------


def tcp_server(sock, nbytes_max):
    payload = os.urandom(1 << 20) * ((nbytes_max >> 20) + 1)
    view = memoryview(payload)
    while True:
        try:
            c, _ = sock.accept()
        except OSError:
            return
        c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        want = int.from_bytes(c.recv(8), "little")
        sent = 0
        while sent < want:
            sent += c.send(view[sent:min(want, sent + (8 << 20))])
        c.close()


def start(cmd, env, what):
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return p


def wait_line(p, want, timeout, what):
    r, _, _ = select.select([p.stdout], [], [], timeout)
    line = p.stdout.readline() if r else ""
    if want not in line:
        p.kill()
        raise SystemExit(f"{what} did not say {want!r} within {timeout} s: {line!r}")
    return line


def gbs(n, s):
    return n / s / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", default="mini", choices=sorted(LAYOUTS))
    ap.add_argument("--blocks", type=int, default=625)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--capacity", default="8GiB")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--opt", action="append", metavar="NAME=VALUE")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: CPU tensors and the host copy backend (a check of the path; the "
                         "\"pinned h2d\" baseline is then a memcpy)")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--via-server", action="store_true",
                    help="the reader is an engine of a umbp-server that is its host's node")
    ap.add_argument("--server-opt", action="append", metavar="NAME=VALUE",
                    help="--via-server: an option of the server (repeatable)")
    ap.add_argument("--socket-dir", help=argparse.SUPPRESS)
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--tcp-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "owner":
        return owner(args)
    if args.role == "reader":
        return reader(args)
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device (--device cpu checks the path on the CPU)")
        return 0
    import umbp

    try:
        umbp.mode_properties("distributed")
    except Exception as e:
        print(f"SKIP: this libumbp has no distributed mode ({e})")
        return 0
    env = dict(os.environ)
    env.setdefault("UCX_TLS", "tcp")
    env.setdefault("UCX_NET_DEVICES", "lo")
    env.setdefault("UCX_MEM_EVENTS", "no")
    master_bin = os.environ.get("UMBP_MASTER") or os.path.join(REPO, "build", "master", "umbp-master")
    mport = free_port()
    master = subprocess.Popen([master_bin, "--json", json.dumps({"listen": f"127.0.0.1:{mport}",
                                                                 "log_level": "warn"})],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_line(master, "serving", 30, "umbp-master")
    threading.Thread(target=lambda: [None for _ in master.stdout], daemon=True).start()
    L, H, D = LAYOUTS[args.layout]
    nbytes = args.blocks * L * 2 * BLOCK * H * D * 2
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    threading.Thread(target=tcp_server, args=(lsock, nbytes), daemon=True).start()
    base = [sys.executable, os.path.abspath(__file__), "--layout", args.layout, "--blocks", str(args.blocks),
            "--rounds", str(args.rounds), "--capacity", args.capacity, "--seed", str(args.seed),
            "--device", args.device, "--master", f"127.0.0.1:{mport}", "--tcp-port", str(lsock.getsockname()[1])]
    for o in args.opt or []:
        base += ["--opt", o]
    server = None
    if args.via_server:
        import tempfile
        sdir = tempfile.mkdtemp(prefix="umbp-bench-dist-")
        server_bin = os.environ.get("UMBP_SERVER") or os.path.join(REPO, "build", "server", "umbp-server")
        scfg = {"socket_dir": sdir, "capacity_bytes": args.capacity, "master_address": f"127.0.0.1:{mport}",
                "heartbeat_ms": 50, "node_host": "reader-server", "log_level": "warn", "timeout_ms": 60000,
                "lookup_timeout_ms": 5000}
        apply_opts(scfg, args.server_opt)
        server = subprocess.Popen([server_bin, "--json", json.dumps(scfg)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        wait_line(server, "serving", 60, "umbp-server")
        threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
        base += ["--socket-dir", sdir]
    own = start(base + ["--role", "owner"], env, "owner")
    try:
        wait_line(own, "stored", args.timeout, "the owner")
        time.sleep(0.5)  # its last events reach the master (heartbeat_ms 50)
        r = subprocess.run(base + ["--role", "reader"], env=env, stdout=subprocess.PIPE, text=True,
                           timeout=args.timeout)
    finally:
        own.stdin.close()
        own.wait(60)
        if server is not None:
            server.terminate()
            server.wait(30)
        master.terminate()
        master.wait(15)
        lsock.close()
    if r.returncode != 0:
        raise SystemExit(f"the reader failed (exit {r.returncode})")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    n = res["bytes"]
    rem, loc, tcp, h2d = res["remote"], res["local"], res["tcp"], res["h2d"]
    tls = env.get("UCX_TLS")
    how = ", the reader an engine of its host's umbp-server (the node)" if args.via_server else ""
    print(f"## distributed{how}, UCX_TLS={tls} over {env.get('UCX_NET_DEVICES')}: {res['blocks']} blocks of "
          f"{res['object_bytes']} bytes ({n / 1e6:.0f} MB), layout {res['layout']}, {args.rounds} rounds; "
          f"{'GPU' if args.device == 'cuda' else 'CPU tensors (host backend)'}; every byte verified")
    print("| case | umbp GB/s | baseline | baseline GB/s | ratio |")
    print("|---|---|---|---|---|")
    for name, xs, bname, bs in (("remote restore best", min(rem), "raw TCP best", min(tcp)),
                                ("remote restore median", statistics.median(rem), "raw TCP median",
                                 statistics.median(tcp)),
                                ("local restore best", min(loc), "pinned h2d best", min(h2d)),
                                ("local restore median", statistics.median(loc), "pinned h2d median",
                                 statistics.median(h2d))):
        print(f"| {name} | {gbs(n, xs):.2f} | {bname} | {gbs(n, bs):.2f} | {bs / xs:.3f}× |")
    share = [1 - l_ / r_ for l_, r_ in zip(loc, rem)]
    print(f"network share of a remote restore (1 - local/remote), median: {statistics.median(share) * 100:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
