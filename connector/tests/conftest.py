"""pytest setup: `umbp` from this tree (connector/ on sys.path) and the
library from $UMBP_LIBRARY, else the repo's build/libumbp.so (exported in
the environment so that subprocesses load the same one)."""
import os
import shutil
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


def master_binary():
    """The umbp-master tests start: $UMBP_MASTER, this tree's build, the one
    beside the loaded library, or the PATH's; None when there is none."""
    for cand in (os.environ.get("UMBP_MASTER"),
                 os.path.join(REPO, "build", "master", "umbp-master"),
                 os.path.join(os.path.dirname(umbp.library_path), "master", "umbp-master"),
                 os.path.join(os.path.dirname(umbp.library_path), "umbp-master"),
                 shutil.which("umbp-master")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def server_binary():
    """The umbp-server tests start: $UMBP_SERVER, this tree's build, the one
    beside the loaded library, or the PATH's; None when there is none."""
    for cand in (os.environ.get("UMBP_SERVER"),
                 os.path.join(REPO, "build", "server", "umbp-server"),
                 os.path.join(os.path.dirname(umbp.library_path), "server", "umbp-server"),
                 os.path.join(os.path.dirname(umbp.library_path), "umbp-server"),
                 shutil.which("umbp-server")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def mini_engine_check_names(res, ok=None):
    """'scenario: check' of a mini_engine.py result, all or only those with ok."""
    return [f"{s['name']}: {c['name']}" for s in res["scenarios"] for c in s["checks"]
            if ok is None or c["ok"] == ok]
