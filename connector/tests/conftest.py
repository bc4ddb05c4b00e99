"""pytest setup: `umbp` from this tree (connector/ on sys.path) and the
library from $UMBP_LIBRARY, else the repo's build/libumbp.so (exported in
the environment so that subprocesses load the same one)."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CONNECTOR = os.path.dirname(HERE)
REPO = os.path.dirname(CONNECTOR)

if not os.environ.get("UMBP_LIBRARY"):
    built = os.path.join(REPO, "build", "libumbp.so")
    if os.path.exists(built):
        os.environ["UMBP_LIBRARY"] = built
sys.path.insert(0, CONNECTOR)
os.environ["PYTHONPATH"] = CONNECTOR + os.pathsep + os.environ.get("PYTHONPATH", "")

import umbp  # noqa: E402


def pytest_report_header(config):
    return "umbp library: %s (lookup service: %s)" % (
        umbp.library_path, "yes" if umbp.has_lookup_service() else "no")


def host_options(**kw):
    opts = {"capacity_bytes": "64MiB", "gpu_backend": "host"}
    opts.update(kw)
    return opts


@pytest.fixture
def rt():
    r = umbp.Runtime(host_options(enable_events=True))
    yield r
    r.close()


def _daemon_binary(env, subdir, name):
    """A daemon tests start: $env, this tree's build, the one beside the
    loaded library, or the PATH's; None when there is none."""
    for cand in (os.environ.get(env),
                 os.path.join(REPO, "build", subdir, name),
                 os.path.join(os.path.dirname(umbp.library_path), subdir, name),
                 os.path.join(os.path.dirname(umbp.library_path), name),
                 shutil.which(name)):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def master_binary():
    """umbp-master: $UMBP_MASTER, build/master/, beside the library, PATH."""
    return _daemon_binary("UMBP_MASTER", "master", "umbp-master")


def server_binary():
    """umbp-server: $UMBP_SERVER, build/server/, beside the library, PATH."""
    return _daemon_binary("UMBP_SERVER", "server", "umbp-server")


def stop_process(proc, bound_s=60.0):
    """SIGSTOP `proc` and wait until every thread of it is stopped.  The
    signal is only queued when send_signal returns: until one of its threads
    takes it, another (the server's loop, woken by a request) may go on
    answering, which a test of a stalled peer would read as a hit."""
    import time

    proc.send_signal(signal.SIGSTOP)
    task = "/proc/%d/task" % proc.pid
    deadline = time.monotonic() + bound_s
    while True:
        states = []
        for tid in os.listdir(task):
            try:
                with open(os.path.join(task, tid, "stat")) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                pass  # the thread exited
        # every thread stopped ('Z': exited, not yet reaped, runs nothing)
        if any(s in ("T", "t") for s in states) and all(s in ("T", "t", "Z") for s in states):
            return
        assert time.monotonic() < deadline, "process %d did not stop within %.0f s" % (proc.pid, bound_s)
        time.sleep(0.001)


@pytest.fixture
def server(tmp_path):
    """A real umbp-server (64 MiB) on a socket dir of its own: (process, socket_dir)."""
    binary = server_binary()
    if binary is None:
        pytest.skip("no umbp-server binary (UMBP_SERVER, next to the library, build/, PATH)")
    sock = tmp_path / "s"
    p = subprocess.Popen([binary, "--json", json.dumps({"socket_dir": str(sock), "capacity_bytes": "64MiB"})],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = p.stdout.readline()
    if "serving" not in line:
        p.kill()
        pytest.fail(f"umbp-server did not start: {line}{p.stdout.read()}")
    yield p, str(sock)
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def mini_engine_check_names(res, ok=None):
    """'scenario: check' of a mini_engine.py result, all or only those with ok."""
    return [f"{s['name']}: {c['name']}" for s in res["scenarios"] for c in s["checks"]
            if ok is None or c["ok"] == ok]
