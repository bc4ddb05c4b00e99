"""The scheduler's lookup client (include/umbp/lookup.h).  Two worker
processes each hold one rank's objects and serve lookups; the parent, like
vLLM's scheduler, asks both in one query.  Skipped (with the reason) while
the loaded library predates the lookup service; then only the clear
refusal is checked."""
import errno
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import umbp
from forking import in_child

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


def _client_options(ns, lookup_dir):
    return {"mode": "embedded", "namespace": ns.hex, "num_ranks": 2, "dp_index": 0,
            "lookup_dir": lookup_dir, "lookup_instance": "", "lookup_timeout_ms": 1000}


def _client(ns, lookup_dir):
    return umbp.LookupClient(_client_options(ns, lookup_dir))


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


# ---- fork ------------------------------------------------------------------

def _check_the_parents_client_in_a_child(cl, opts, rows, expect):
    """In forked children (each exits with a code the parent checks): a
    query on the parent's client raises EBADF naming the parent, also while
    a thread of the parent held the client's lock at the fork; close()
    frees nothing of the parent's (twice); the client's collection (its
    __del__, as at exit) does not crash; a child's own client works.  Then
    the parent's client still answers."""
    import gc
    parent = os.getpid()

    def use():
        for q in (lambda: cl.query(rows), lambda: cl.query_ex(rows)):
            try:
                q()
                return 1  # asked through the parent's connections
            except umbp.UmbpError as e:
                if not (e.code == -errno.EBADF and "pid %d" % parent in str(e)
                        and "forked child" in str(e)):
                    print("not the forked-child error:", e)
                    return 2
        if not cl.closed:
            return 3
        cl.close()  # drops the pointer, destroys nothing
        cl.close()
        try:
            cl.query(rows)
            return 4
        except umbp.UmbpError as e:
            if "pid %d" % parent not in str(e):
                return 5
        return 0

    cl._lock.acquire()  # as if another thread of the parent were querying at the fork
    try:
        st = in_child(use)
    finally:
        cl._lock.release()
    assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, st

    def collect_then_own(opts):
        def child():
            cl.__del__()  # what its collection at the child's exit runs: close()
            gc.collect()
            with umbp.LookupClient(opts) as own:  # a child's own client works
                got = own.query(rows)
                if got != expect:
                    print("child's own client: %d, not %d" % (got, expect))
                    return 6
            return 0
        return child

    st = in_child(collect_then_own(opts))
    assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, st

    def close_first():
        cl.close()
        return 0

    st = in_child(close_first)
    assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, st
    # the parent's client is untouched by its children
    assert not cl.closed
    assert cl.query(rows) == expect
    assert cl.query_ex(rows)[2] == 0


@needs_lookup
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12: fork of a threaded process
def test_a_forked_child_finds_the_parents_embedded_client_dead(workers):
    """Before: the child's query asked the ranks through the parent's
    connections and answered (child exit 1)."""
    ns, lookup_dir, procs = workers
    rows = _rows(ns)
    with _client(ns, lookup_dir) as cl:
        assert cl.query(rows) == 6  # connected before the fork
        _check_the_parents_client_in_a_child(cl, _client_options(ns, lookup_dir), rows, 6)


@needs_lookup
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12: fork of a threaded process
def test_a_forked_child_finds_the_parents_standalone_client_dead(server):
    """Before: the child's query went to the parent's lookup runtime, which
    has no threads in the child: it waited out lookup_timeout_ms and
    reported every key absent (0, E_TIMEOUT; child exit 1); close() in the
    child ran umbp_lookup_client_destroy on the parent's runtime."""
    proc, sock = server
    keys = np.random.default_rng(40).integers(0, 256, (5, 32), dtype=np.uint8)
    buf = np.zeros(64, dtype=np.uint8)
    with umbp.Runtime({"mode": "standalone", "socket_dir": sock, "gpu_backend": "host"}) as rt:
        job = rt.put(keys[:3], [buf.ctypes.data] * 3, 64)
        assert job.wait(10000) and job.ok.all()
        opts = {"mode": "standalone", "socket_dir": sock, "lookup_timeout_ms": 2000}
        with umbp.LookupClient(opts) as cl:
            assert cl.query(keys) == 3
            _check_the_parents_client_in_a_child(cl, opts, keys, 3)
