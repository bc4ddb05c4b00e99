#!/usr/bin/env bash
# Sets up, builds and runs the main job: embedded mode on a synthetic
# multi-layer KV cache, every restored byte verified.  Extra arguments go to
# umbp-demo (--blocks, --layers, --heads, --head-dim, --block-tokens, --batch,
# --config).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target umbp-demo
exec build/umbp-demo "$@"
