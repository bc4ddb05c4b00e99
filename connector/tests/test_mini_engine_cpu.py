"""The miniature engine of issue 7 (gpu/mini_engine.py) on the CPU: its
small config (a 2-layer stand-in Llama, a 500-token prompt) through the real
vLLM connector and libumbp (CPU tensors, the host GPU backend).  It runs the
paged-attention validation, the embedded scenarios (NHD with sync loads; HND
with async loads; the direct umbp calls) and the standalone one (A stores, B
restores while A is alive and after A exited, against a real umbp-server), the
distributed one (a real umbp-master; A's node stores, B1's node restores from
A over UCX on loopback while A is alive; after A and B1 exited B2 misses
cleanly and recomputes; skipped without the rdma tier or umbp-master), and
shows that the checks catch wrong restores.  The GPU run is
gpu/run_mini_engine.sh."""
import json
import os
import subprocess
import sys

import pytest
from conftest import mini_engine_check_names, server_binary

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "gpu", "mini_engine.py")
WRAPPER = os.path.join(HERE, "gpu", "run_mini_engine.sh")
REPO = os.path.dirname(os.path.dirname(HERE))


def _run(tmp_path, *args, env=None, timeout=150):
    out = tmp_path / "mini_engine.json"
    r = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--out", str(out), *args],
                       capture_output=True, text=True, timeout=timeout, env=env or dict(os.environ))
    res = json.loads(out.read_text()) if out.exists() else None
    return r, res


def _tail(r):
    return r.stdout[-8000:] + "\n--- stderr ---\n" + r.stderr[-4000:]


def test_embedded(tmp_path):
    r, res = _run(tmp_path, "--mode", "embedded")
    assert r.returncode == 0, _tail(r)
    assert res["ok"] and not mini_engine_check_names(res, ok=False)
    scen = {s["name"]: s for s in res["scenarios"]}
    assert {"embedded", "embedded-hnd-async"} <= set(scen)
    names = mini_engine_check_names(res)
    for must in ("embedded: paged forward = the model's forward (float32): logits",
                 "embedded: paged forward = the model's forward (float32): greedy tokens",
                 "embedded: restore: the greedy decode = the reference's, token for token, in every run",
                 "embedded: restore: the restored blocks are A's bytes (all of them in the first run, "
                 "a sample in the others)",
                 "embedded-hnd-async: restore: every hit block loaded, no load failed, nothing recomputed",
                 "embedded: umbp: engine clean (every block back, every job released, nothing held)"):
        assert must in names, (must, names)
    row = res["summary"][0]
    assert row["hit_tokens"] == 496 and row["ttft_restore_ms"] > 0 and row["load_ms"] > 0, row
    assert "TTFT rest" in r.stdout  # the summary table


def test_standalone(tmp_path):
    srv = server_binary()
    if srv is None:
        pytest.skip("no umbp-server (set UMBP_SERVER or build build/server/umbp-server)")
    r, res = _run(tmp_path, "--mode", "standalone", env=dict(os.environ, UMBP_SERVER=srv))
    assert r.returncode == 0, _tail(r)
    names = mini_engine_check_names(res, ok=True)
    for must in ("A: every full prompt block stored",
                 "B (A alive): restore: the greedy decode = the reference's, token for token, in every run",
                 "B (A exited): A's process has exited",
                 "B (A exited): restore: the restored blocks are A's bytes (all of them in the first run, "
                 "a sample in the others)",
                 "B (A exited): A's decode = the reference's (the KV A stored is what a full prefill computes)",
                 "umbp-server stops cleanly on SIGTERM"):
        assert f"standalone: {must}" in names, (must, names)


def _master_binary():
    """$UMBP_MASTER, this tree's build, the one beside the loaded library, the
    PATH's; None when there is none."""
    import shutil

    import umbp

    lib_dir = os.path.dirname(umbp.library_path)
    for cand in (os.environ.get("UMBP_MASTER"), os.path.join(REPO, "build", "master", "umbp-master"),
                 os.path.join(lib_dir, "master", "umbp-master"), shutil.which("umbp-master")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def test_distributed(tmp_path):
    import umbp

    try:
        umbp.mode_properties("distributed")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"this libumbp has no rdma tier (built without UCX): {e}")
    master = _master_binary()
    if master is None:
        pytest.skip("no umbp-master (set UMBP_MASTER or build build/master/umbp-master)")
    env = dict(os.environ, UMBP_MASTER=master, UCX_TLS="tcp", UCX_NET_DEVICES="lo", UCX_MEM_EVENTS="no")
    r, res = _run(tmp_path, "--mode", "distributed", env=env, timeout=300)
    assert res is not None, _tail(r)
    scen = {s["name"]: s for s in res["scenarios"]}
    if scen.get("distributed", {}).get("skipped"):
        pytest.skip(scen["distributed"]["skipped"])
    assert r.returncode == 0, _tail(r)
    names = mini_engine_check_names(res, ok=True)
    assert not mini_engine_check_names(res, ok=False)
    for must in ("A: every full prompt block stored",
                 "A: umbp-master locates every stored block (a scheduler lookup through umbp.LookupClient)",
                 "B (A alive): restore: the lookup finds 496 tokens (31 blocks: all but the last prompt block) "
                 "in every run",
                 "B (A alive): restore: the greedy decode = the reference's, token for token, in every run",
                 "B (A alive): restore: the restored blocks are A's bytes (all of them in the first run, "
                 "a sample in the others)",
                 "B (A alive): restore: every hit block loaded, no load failed, nothing recomputed",
                 "umbp-master marks every node that held A's blocks (A's, B1's) suspect after they exited",
                 "B (A exited): A's process has exited",
                 "B (A exited): miss: the lookup finds nothing (0 hit tokens) in every run",
                 "B (A exited): miss: a clean miss (umbp-master answered; no lookup error)",
                 "B (A exited): miss: nothing loaded, no load failed, nothing truncated",
                 "B (A exited): miss: the greedy decode (recomputed) = the reference's, token for token, "
                 "in every run",
                 "B (A exited): A's decode = the reference's (the KV A stored is what a full prefill computes)",
                 "umbp-master stops cleanly on SIGTERM"):
        assert f"distributed: {must}" in names, (must, names)
    assert res["summary"][0]["hit_tokens"] == 496, res["summary"]


@pytest.mark.parametrize("fault,caught", [
    # the restore "succeeds" but the blocks hold zeros: every check of the outcome fails
    ("lose-restore", ["greedy decode", "first token's logits", "A's bytes"]),
    # one restored block of 31 holds zeros: the bytes and the logits show it (the tokens need not)
    ("lose-one-block", ["first token's logits", "A's bytes"]),
    # every block one position off: attention over the restored prefix is a set, so only the
    # byte comparison can see it
    ("rotate-loads", ["A's bytes"]),
])
def test_checks_catch_wrong_restores(tmp_path, fault, caught):
    r, res = _run(tmp_path, "--mode", "embedded", "--only", "embedded", "--inject", fault)
    assert r.returncode == 1, _tail(r)
    failed = mini_engine_check_names(res, ok=False)
    for what in caught:
        assert any(what in f for f in failed), (what, failed)


def test_skips_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    r = subprocess.run(["bash", WRAPPER], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, _tail(r)
    assert r.stdout.startswith("skipped: no CUDA"), r.stdout
    assert json.loads((tmp_path / "mini_engine.json").read_text())["skipped"]
