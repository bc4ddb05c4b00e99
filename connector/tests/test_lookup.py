"""The scheduler's lookup client (include/umbp/lookup.h).  Two worker
processes each hold one rank's objects and serve lookups; the parent, like
vLLM's scheduler, asks both in one query.  Skipped (with the reason) while
the loaded library predates the lookup service; then only the clear
refusal is checked."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import umbp

needs_lookup = pytest.mark.skipif(
    not umbp.has_lookup_service(),
    reason="libumbp at %s predates the lookup service (umbp_lookup_client_*, umbp_lookup_serve "
           "of include/umbp/lookup.h, branch lookup)" % umbp.library_path)

N = 16
WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import umbp
    rank, n_store, lookup_dir, ns_hex = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ns = umbp.Namespace.from_hex(ns_hex)
    hashes = np.repeat(np.arange(%d, dtype=np.uint8)[:, None], 32, axis=1)
    keys = umbp.derive_keys(ns, (rank, 0, 0, 0), 0, hashes)
    rt = umbp.Runtime({"capacity_bytes": "16MiB", "gpu_backend": "host",
                       "rank": rank, "world_size": 2})
    buf = np.zeros(64, dtype=np.uint8)
    job = rt.put(keys[:n_store], [buf.ctypes.data] * n_store, 64)
    assert job.wait(10000) and job.ok.all()
    rt.serve_lookups(ns_hex, 0, rank, lookup_dir=lookup_dir)
    print("ready", flush=True)
    sys.stdin.read()  # serve until the parent closes stdin
    rt.close()
""" % N)


def _ns():
    return umbp.Namespace.derive("test/lookup-model", "", 16, "NHD", "bfloat16", tp=2)


def _rows(ns):
    hashes = np.repeat(np.arange(N, dtype=np.uint8)[:, None], 32, axis=1)
    return np.stack([umbp.derive_keys(ns, (r, 0, 0, 0), 0, hashes) for r in range(2)])


@pytest.mark.skipif(umbp.has_lookup_service(), reason="the library has the lookup service")
def test_an_old_library_refuses_clearly():
    for call in (lambda: umbp.LookupClient({"mode": "embedded"}),
                 lambda: umbp.lookup_socket_path("/tmp", "00" * 16, "", 0, 0)):
        with pytest.raises(umbp.LibraryTooOld) as ei:
            call()
        assert isinstance(ei.value, umbp.UmbpError) and isinstance(ei.value, NotImplementedError)
        assert "predates the lookup service" in str(ei.value)
    with umbp.Runtime({"capacity_bytes": "8MiB", "gpu_backend": "host"}) as rt:
        with pytest.raises(NotImplementedError, match="umbp_lookup_serve"):
            rt.serve_lookups("00" * 16, 0, 0)


@pytest.fixture
def workers(tmp_path):
    ns = _ns()
    procs = []
    for rank, n_store in ((0, 10), (1, 6)):
        p = subprocess.Popen([sys.executable, "-c", WORKER, str(rank), str(n_store),
                              str(tmp_path), ns.hex],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(p)
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", "a worker failed to start serving (rc %s)" % p.poll()
        yield ns, str(tmp_path), procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def _client(ns, lookup_dir):
    return umbp.LookupClient({"mode": "embedded", "namespace": ns.hex, "num_ranks": 2,
                              "dp_index": 0, "lookup_dir": lookup_dir, "lookup_instance": "",
                              "lookup_timeout_ms": 1000})


@needs_lookup
def test_query_across_two_serving_ranks(workers):
    ns, lookup_dir, procs = workers
    for rank in range(2):
        assert os.path.exists(umbp.lookup_socket_path(lookup_dir, ns.hex, "", 0, rank))
    rows = _rows(ns)
    with _client(ns, lookup_dir) as cl:
        assert cl.query(rows) == 6  # rank 1 holds only the first 6 blocks
        prefix, present, rc = cl.query_ex(rows)
        assert (prefix, rc) == (6, 0)
        assert present.shape == (2, N)
        assert present[0].tolist() == [True] * 10 + [False] * (N - 10)
        assert present[1].tolist() == [True] * 6 + [False] * (N - 6)
        # rows in another order, named by row_rank
        assert cl.query(rows[::-1].copy(), row_rank=[1, 0]) == 6
        # keys of the wrong rank miss
        assert cl.query(rows[::-1].copy()) == 0


@needs_lookup
def test_a_dead_rank_counts_as_misses_within_the_timeout(workers):
    ns, lookup_dir, procs = workers
    procs[1].stdin.close()
    procs[1].wait(10)
    rows = _rows(ns)
    with _client(ns, lookup_dir) as cl:
        t0 = time.monotonic()
        prefix, present, rc = cl.query_ex(rows)
        assert time.monotonic() - t0 < 5
        assert prefix == 0 and not present[1].any()
        assert rc < 0  # the dead rank's code
        assert present[0, :10].all()  # the live rank's answer is kept


@needs_lookup
def test_socket_paths_differ_by_rank_dp_and_instance(tmp_path):
    ns = _ns()
    d = str(tmp_path)
    p = umbp.lookup_socket_path(d, ns.hex, "", 0, 0)
    assert p.startswith(d + "/") and p.endswith(".sock")
    assert umbp.lookup_socket_path(d, ns.hex.upper(), "", 0, 0) == p
    assert umbp.lookup_socket_path(d, ns, "", 0, 0) == p  # a Namespace works too
    others = {umbp.lookup_socket_path(d, ns.hex, "", 0, 1),
              umbp.lookup_socket_path(d, ns.hex, "", 1, 0),
              umbp.lookup_socket_path(d, ns.hex, "engine-b", 0, 0)}
    assert p not in others and len(others) == 3
    with pytest.raises(umbp.UmbpError):
        umbp.lookup_socket_path(d, "not-hex", "", 0, 0)
    with pytest.raises(umbp.UmbpError):
        umbp.LookupClient({"mode": "embedded", "no_such_option": 1})
