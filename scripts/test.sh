#!/usr/bin/env bash
# Sets up, builds and runs every test: the release build, then the
# ASan+UBSan build.  Usage: scripts/test.sh [--no-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j 1
# libumbp.so is loaded into engine processes beside other libraries: it
# exports the umbp_ API and nothing else
if leaked=$(nm -D --defined-only build/libumbp.so | awk '{print $3}' | grep -v '^umbp_'); then
  echo "scripts/test.sh: libumbp.so exports symbols outside the umbp_ API:" $leaked >&2
  exit 1
fi
# the build without OpenSSL (a machine without libssl-dev): it must compile
# without warnings and refuse rediss:// by name; its TLS tests skip saying why
cmake -S . -B build-nossl -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUMBP_WITH_OPENSSL=OFF \
  -DUMBP_BUILD_BENCH=OFF -DUMBP_GPU_CUDA=OFF -DCMAKE_C_FLAGS=-Werror >/dev/null
cmake --build build-nossl -j "$jobs" --target test_lease
build-nossl/tests/test_lease --jobs 1 --filter 'lease_url/*'
# two engine processes sharing one umbp-server, host backend: a prefix stored
# by one is restored byte-exact by the other (the GPU run is bench_kv_engines
# with cuda on a machine with GPUs)
build/bench/bench_kv_engines 2 host 1 2 4 4 2>/dev/null | grep "every byte verified"
# the server benchmarks speak the wire protocol themselves: a short run of
# each keeps them in step with it (their numbers are in docs/benchmarks.md)
build/bench/bench_server_fairness "" 2 2>/dev/null | tail -1
build/bench/bench_reconnect 2>/dev/null | tail -1
# the Python package against the library just built (Debian's python3: it
# has numpy, pytest and torch)
UMBP_LIBRARY="$PWD/build/libumbp.so" UMBP_SERVER="$PWD/build/server/umbp-server" \
  /usr/bin/python3 -m pytest -q -rs connector/tests

# Huge pages: the suites above ran with whatever the machine has reserved
# (usually none: the fallback path).  Where we may, reserve 2 MiB pages for
# a second pass of the pool tests and the demo, so the huge-page path runs
# too, then give them back.
hp=/proc/sys/vm/nr_hugepages
if [[ -w $hp ]]; then
  old=$(cat $hp)
  trap 'echo "$old" > '"$hp"' 2>/dev/null || true' EXIT
  echo $((old + 96)) > $hp 2>/dev/null || true
  if (( $(cat $hp) > old )); then
    echo "scripts/test.sh: huge-page pass ($(( $(cat $hp) - old )) x 2 MiB reserved)"
    build/tests/test_dram_pool --jobs 1
    out=$(UMBP_DRAM_USE_HUGEPAGES=1 build/umbp-demo --blocks 32 2>&1)
    echo "$out" | tail -2
    if grep -q "nr_hugepages" <<<"$out"; then
      echo "scripts/test.sh: huge pages were reserved but the demo's pool fell back" >&2
      exit 1
    fi
  else
    echo "scripts/test.sh: no 2 MiB huge pages could be reserved; huge-page pass skipped"
  fi
  echo "$old" > $hp
fi

if [[ "${1:-}" != "--no-sanitize" ]]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DUMBP_SANITIZE=ON -DUMBP_BUILD_BENCH=OFF
  cmake --build build-asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j 1
fi
if [[ "${1:-}" != "--no-sanitize" ]]; then
  # ThreadSanitizer: Criterion aborts under it, so the plain programs drive
  # the caller, loop, copy and evictor threads instead.  Any report fails.
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUMBP_SANITIZE_THREAD=ON \
    -DUMBP_BUILD_TESTS=OFF
  cmake --build build-tsan -j "$jobs"
  export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp halt_on_error=1 exitcode=66"
  export UMBP_LOOKUP_TIMEOUT_MS=10000 # TSan slows everything ~10x
  # libumbp links UCX (the rdma tier) wherever UCX is built: its memory-event
  # hooks (libucm) intercept madvise when a thread exits, after TSan's state
  # for that thread is gone, and crash there (ucm_madvise), even in a process
  # that never uses UCX.  umbp maps its pools once and needs no memory events.
  export UCX_MEM_EVENTS=no UCX_WARN_UNUSED_ENV_VARS=n
  build-tsan/umbp-demo --blocks 64 2>/dev/null | tail -1
  UMBP_POLL_WAIT=on build-tsan/umbp-demo --blocks 64 2>/dev/null | tail -1
  build-tsan/bench/bench_alloc 20000 | tail -1
  build-tsan/bench/bench_lookup 200 | tail -1
  build-tsan/bench/bench_putget 64 1 | tail -1
  # the GPU KV path (caller, loop, waiter, engine, two engines and a server)
  # on the host backend with a device thread (gpu/gpu_host_async.c)
  UMBP_GPU_HOST_ASYNC=1 build-tsan/bench/bench_kv_engines 2 host 1 2 4 4 2>/dev/null |
    grep "every byte verified"
  # key derivation on the caller's parallel-for (runtime/par.c) and its helpers
  UMBP_PAR_THREADS=2 build-tsan/bench/bench_py_baseline 50 | tail -1
  # standalone: the server and its clients (lookups, put/get, 8 clients'
  # metadata traffic), both built with TSan
  build-tsan/bench/bench_standalone "" 0.05 2>/dev/null | tail -1
  # distributed mode: umbp-master serving a node's heartbeats, lookups and a
  # 1M-key resync (bench_master), and a UCX fetch between two processes.
  # UCX's memory-event hooks go off under TSan: they intercept madvise at a
  # thread's exit, after TSan's state for the thread is gone (a SIGSEGV in
  # ucm_madvise); umbp maps its pool once and needs no memory events.
  build-tsan/bench/bench_master 200 2>/dev/null | tail -1
  build-tsan/bench/bench_ucx_fetch 1 2>/dev/null | tail -1
  # a node: two runtimes in distributed mode (owner and reader) with a real
  # umbp-master: puts, heartbeats, LOCATE, UCX fetches into the slice
  build-tsan/bench/bench_dist 1 16 65536 2>/dev/null | tail -1
  # the same read through the reader's host's umbp-server as the node (the
  # server hosts the rdma tier; a TSan report there ends it: the bench fails)
  build-tsan/bench/bench_dist --server 1 16 65536 2>/dev/null | tail -1
  # two umbp-masters on a Redis lease (their lease threads) and synthetic
  # nodes following the leader (their watch threads), through kill -9 and
  # SIGTERM failovers; the masters' own reports go to their logs
  out=$(mktemp)
  build-tsan/bench/bench_failover -t 1000 -r 2 -n 4 -K >"$out" 2>&1 || { cat "$out"; exit 1; }
  grep -E "^SIGTERM every node|skipped" "$out" || true
  fo=$(sed -n 's/^logs kept in //p' "$out")
  rm -f "$out"
  if [[ -n "$fo" ]]; then
    if grep -l ThreadSanitizer "$fo"/*.log; then echo "TSan report in umbp-master"; exit 1; fi
    rm -rf "$fo"
  fi
  unset TSAN_OPTIONS UMBP_LOOKUP_TIMEOUT_MS UCX_MEM_EVENTS UCX_WARN_UNUSED_ENV_VARS
  echo "scripts/test.sh: ThreadSanitizer pass clean"
fi
if [[ "${1:-}" != "--no-sanitize" ]]; then
  # Every decoder of bytes from outside the process (the wire codec on both
  # sides, a whole server session, a client session, umbp-master's frames
  # and directory, the UCX fetch messages, a dead server's journal, the leader
  # value in the lease store, the UCX_TLS list, a config's JSON and
  # environment, a worker's lookup service, the scheduler's lookup client, the
  # master's client, the master's per-connection handlers, the umbp tool's
  # client, the leader lease's Redis replies), fuzzed for a bounded
  # time (UMBP_FUZZ_SECONDS each, default 60) from the committed seeds; any
  # crash, leak or UB report fails the run.
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DUMBP_BUILD_FUZZ=ON \
    -DUMBP_BUILD_TESTS=OFF -DUMBP_BUILD_BENCH=OFF
  cmake --build build-fuzz -j "$jobs" --target fuzz_proto_server fuzz_proto_client \
    fuzz_server_session fuzz_journal_adopt fuzz_net_session fuzz_proto_master fuzz_ucx_wire \
    fuzz_lease_value fuzz_ucx_tls fuzz_options fuzz_lookup_serve fuzz_lookup_client \
    fuzz_master_client fuzz_master_session fuzz_sync_client \
    $(pkg-config --exists hiredis && echo fuzz_redis_reply)
  secs=${UMBP_FUZZ_SECONDS:-60}
  for f in tests/fuzz/corpus/server:build-fuzz/tests/fuzz/fuzz_proto_server \
           tests/fuzz/corpus/client:build-fuzz/tests/fuzz/fuzz_proto_client \
           server/fuzz/corpus:build-fuzz/server/fuzz_server_session \
           tests/fuzz/corpus/journal:build-fuzz/tests/fuzz/fuzz_journal_adopt \
           tests/fuzz/corpus/session:build-fuzz/tests/fuzz/fuzz_net_session \
           tests/fuzz/corpus/master:build-fuzz/tests/fuzz/fuzz_proto_master \
           tests/fuzz/corpus/ucx:build-fuzz/tests/fuzz/fuzz_ucx_wire \
           tests/fuzz/corpus/lease:build-fuzz/tests/fuzz/fuzz_lease_value \
           tests/fuzz/corpus/tls:build-fuzz/tests/fuzz/fuzz_ucx_tls \
           tests/fuzz/corpus/options:build-fuzz/tests/fuzz/fuzz_options \
           tests/fuzz/corpus/lookup:build-fuzz/tests/fuzz/fuzz_lookup_serve \
           tests/fuzz/corpus/lookup_client:build-fuzz/tests/fuzz/fuzz_lookup_client \
           tests/fuzz/corpus/master_client:build-fuzz/tests/fuzz/fuzz_master_client \
           tests/fuzz/corpus/master_session:build-fuzz/tests/fuzz/fuzz_master_session \
           tests/fuzz/corpus/sync_client:build-fuzz/tests/fuzz/fuzz_sync_client \
           tests/fuzz/corpus/redis:build-fuzz/tests/fuzz/fuzz_redis_reply; do
    seeds=${f%%:*} bin=${f#*:}
    if [[ ! -x $bin ]]; then
      echo "scripts/test.sh: $bin not built (fuzz_redis_reply needs hiredis): skipped"
      continue
    fi
    scratch=$(mktemp -d)
    extra=()
    # a server session's slices (4,096 records) take frames of ~131 KB
    [[ $bin == *fuzz_server_session ]] && extra=(-max_len=262144)
    "$bin" -max_total_time="$secs" -print_final_stats=1 "${extra[@]}" "$scratch" "$seeds" 2>&1 |
      grep -E "stat::number_of_executed_units|Done|ERROR|SUMMARY" | tail -2
    rm -rf "$scratch"
  done
  echo "scripts/test.sh: fuzzing clean (${secs} s per target)"
fi
echo "scripts/test.sh: all tests passed"
