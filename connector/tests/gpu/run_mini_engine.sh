#!/usr/bin/env bash
# The miniature engine of issue 7 on a GPU machine (mini_engine.py says what it
# does): embedded, standalone and distributed scenarios, exit status 0 only if every check
# passed, or "skipped: ..." and 0 where there is no CUDA device or no
# transformers (CI).
#
#   connector/tests/gpu/run_mini_engine.sh [mini_engine.py options]   (default: --mode all)
#
# Tensor parallelism: --tp 2 runs the model's Megatron shards in two rank
# processes per engine (scenarios embedded-tp2 and standalone-tp2: TP=2 forward
# = TP=1 forward, exact restores per rank, a hit only where both ranks hold a
# block); --gpus 2 puts rank r on cuda:r with NCCL (a 2-GPU machine), without
# it both ranks share one GPU over gloo:
#
#   connector/tests/gpu/run_mini_engine.sh --tp 2 --gpus 2
#
# Environment: UMBP_LIBRARY (default build/libumbp.so), UMBP_SERVER (default
# build/server/umbp-server), UMBP_MASTER (default build/master/umbp-master; the
# distributed scenario skips without it), relative to the repository unless
# absolute; UCX_TLS / UCX_NET_DEVICES (default tcp on lo: every node is on this host);
# PYTHON (default python3); OUT: the results go to $OUT/mini_engine.json.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
abs() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$repo/$1" ;; esac; }
UMBP_LIBRARY=$(abs "${UMBP_LIBRARY:-build/libumbp.so}")
UMBP_SERVER=$(abs "${UMBP_SERVER:-build/server/umbp-server}")
export UMBP_LIBRARY UMBP_SERVER
if [ -n "${UMBP_MASTER:-}" ] || [ -x "$repo/build/master/umbp-master" ]; then
  UMBP_MASTER=$(abs "${UMBP_MASTER:-build/master/umbp-master}")
  export UMBP_MASTER
fi
export PYTHONPATH="$repo/connector${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
  echo "skipped: no $py"
  exit 0
fi
mode=0
for a in "$@"; do
  case $a in --mode | --mode=*) mode=1 ;; esac
done
[ "$mode" = 1 ] || set -- --mode all "$@"
exec "$py" "$here/mini_engine.py" "$@"
