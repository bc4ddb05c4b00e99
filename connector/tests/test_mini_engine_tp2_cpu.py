"""The miniature engine at TP=2 on the CPU (gpu/mini_engine.py --tp 2): the
2-layer stand-in Llama (4 heads, 2 KV heads) sharded Megatron-style over two
rank processes with a gloo all-reduce, a 260-token prompt, the real vLLM
connector per rank and libumbp.  Checks: the TP=2 paged forward equals the
TP=1 forward; B restores into other block ids, decodes what the no-connector
TP=2 engine decodes, first-token logits exactly, restored bytes equal A's per
rank; after rank 1 lost its copies of half the blocks the scheduler's hit
shrinks to what both ranks hold and the decode is still exact.  Embedded and
standalone.  Every wait has a timeout; the rank processes end with their
engine process."""
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import mini_engine_check_names, server_binary

pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "gpu", "mini_engine.py")
REPO = os.path.dirname(os.path.dirname(HERE))


def _run(tmp_path, mode, env=None, timeout=120):
    out = tmp_path / "mini_engine.json"
    args = [sys.executable, SCRIPT, "--device", "cpu", "--tp", "2", "--mode", mode, "--prompt-tokens", "260",
            "--timeout", "60", "--deadline", "100", "--out", str(out)]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env or dict(os.environ), start_new_session=True)
    try:
        so, se = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)  # its own session: the orchestrator, its engine processes and their ranks
        so, se = p.communicate(timeout=10)
        pytest.fail(f"mini_engine --tp 2 --mode {mode} did not finish in {timeout} s:\n{so[-6000:]}\n{se[-3000:]}")
    res = json.loads(out.read_text()) if out.exists() else None
    return p, so, se, res


def _no_leftovers(p):
    """Nothing of the run's session survives it (engine and rank processes, the server)."""
    deadline = time.time() + 5
    left = []
    while time.time() < deadline:
        r = subprocess.run(["ps", "-o", "pid=", "-s", str(p.pid)], capture_output=True, text=True, timeout=10)
        left = r.stdout.split()
        if not left:
            return
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    pytest.fail(f"processes left of session {p.pid}: {left}")


def test_tp2_embedded(tmp_path):
    t0 = time.time()
    p, so, se, res = _run(tmp_path, "embedded")
    tail = so[-8000:] + "\n--- stderr ---\n" + se[-4000:]
    assert p.returncode == 0, tail
    assert res["ok"] and not mini_engine_check_names(res, ok=False), tail
    names = mini_engine_check_names(res)
    for must in ("rank 0: TP=2 paged forward (rank 0's shard, all-reduced) = the model's TP=1 forward (float32): "
                 "logits",
                 "rank 1: TP=2 paged forward (rank 1's shard, all-reduced) = the model's TP=1 forward (float32): "
                 "greedy tokens",
                 "TP=2: each rank's paged KV cache holds its KV heads only",
                 "restore: the greedy decode = the reference's, token for token, in every run",
                 "restore: the first token's logits = the reference's",
                 "restore: the restored blocks are A's bytes (all of them in the first run, a sample in the others)",
                 "restore: into other block ids than A's",
                 "partial: rank 1 holds blocks [0, 8) only, the other ranks all 16",
                 "partial: the scheduler's hit shrinks to what every rank holds (128 tokens)",
                 "partial: the reference engine held blocks [0, 8) in its local prefix cache",
                 "partial: the greedy decode = the reference's with the same blocks cached, token for token",
                 "partial: the first token's logits = that reference's",
                 "partial: the restored blocks are A's bytes on every rank",
                 "umbp: every rank sampled the same tokens from the same logits (the all-reduce agrees)",
                 "umbp: engine clean (every block back, every job released, nothing held)"):
        assert f"embedded-tp2: {must}" in names, (must, names)
    scen = res["scenarios"][0]
    assert scen["info"]["main"]["partial"]["hit_tokens"] == 128
    part = [c for c in scen["checks"] if c["name"] == "partial: the first token's logits = that reference's"]
    assert part and part[0]["detail"] == "max |diff| 0", part  # exact against the locally cached reference
    logits = [c for c in scen["checks"] if c["name"] == "restore: the first token's logits = the reference's"]
    assert logits and logits[0]["detail"] == "max |diff| 0", logits  # exact, not within a tolerance
    assert res["summary"][0]["hit_tokens"] == 256
    _no_leftovers(p)
    assert time.time() - t0 < 90


def test_tp2_standalone(tmp_path):
    srv = server_binary()
    if srv is None:
        pytest.skip("no umbp-server (set UMBP_SERVER or build build/server/umbp-server)")
    p, so, se, res = _run(tmp_path, "standalone", env=dict(os.environ, UMBP_SERVER=srv))
    tail = so[-8000:] + "\n--- stderr ---\n" + se[-4000:]
    assert p.returncode == 0, tail
    assert res["ok"] and not mini_engine_check_names(res, ok=False), tail
    names = mini_engine_check_names(res, ok=True)
    for must in ("A: every full prompt block stored",
                 "B (A alive): restore: the greedy decode = the reference's, token for token, in every run",
                 "B (A exited): A's process (and its rank processes) have exited",
                 "B (A exited): restore: the restored blocks are A's bytes (all of them in the first run, "
                 "a sample in the others)",
                 "B (A exited): restore: the first token's logits = the reference's",
                 "B (A exited): partial: the scheduler's hit shrinks to what every rank holds (128 tokens)",
                 "B (A exited): partial: the reference engine held blocks [0, 8) in its local prefix cache",
                 "B (A exited): partial: the greedy decode = the reference's with the same blocks cached, token for token",
                 "B (A exited): partial: the restored blocks are A's bytes on every rank",
                 "umbp-server stops cleanly on SIGTERM"):
        assert f"standalone-tp2: {must}" in names, (must, names)
    _no_leftovers(p)
