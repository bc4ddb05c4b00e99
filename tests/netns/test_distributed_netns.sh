#!/usr/bin/env bash
# test_distributed_netns - distributed mode across three hosts (network
# namespaces on a bridge, scripts/netns.sh): umbp-master on h1, a node
# (umbp-dist-node) on each of h1, h2, h3, UCX over tcp on each host's veth.
#   1. a put on h1 is read byte-exact on h2 and h3 (get and the KV path);
#   2. the owner's link cut (h3) with gets in flight: every get ends within
#      its bound with 0 wrong bytes; after healing, new objects flow again;
#   3. the same with nftables dropping every packet of the owner's host;
#   4. h2's umbp-server as h2's node (given umbp-server): an engine of h2
#      (standalone mode) reads h1's objects through it, and h3 reads what
#      that engine stored, from the server's pool, after the engine is gone.
# Every answer is read with a bound (read -t); every wait for an outcome is a
# bounded loop; nothing asserts a duration.  Exit 77 (ctest: skipped) with
# the reason where namespaces cannot be made or distributed mode is not
# built.  The namespaces and processes are removed on exit.
#
#   test_distributed_netns.sh <umbp-dist-node> <umbp-master> [<umbp-server>]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
N="$repo/scripts/netns.sh"
NODE=${1:?usage: test_distributed_netns.sh <umbp-dist-node> <umbp-master>}
MASTER=${2:?usage: test_distributed_netns.sh <umbp-dist-node> <umbp-master>}
SERVER=${3:-}
name="d$$"
name=${name:0:8}
work=$(mktemp -d "/tmp/test_distributed_netns.XXXXXX")
ANSWER_S=90 # bound on one answer, far past every timeout a node has
pids=()

fail() {
  echo "FAIL: $*" >&2
  # the master's view (its /metrics, on loopback inside host 1)
  [[ -n ${mport:-} ]] &&
    "$N" exec "$name" 1 curl -s -m 5 "http://127.0.0.1:$mport/metrics" 2>/dev/null |
    grep -E '^umbp_master_(nodes|keys|heartbeats|events|locate_(keys|hits))' >&2
  for f in "$work"/*.log; do [[ -f $f ]] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  "$N" down "$name"
  rm -rf "$work"
}

[[ -x $NODE && -x $MASTER ]] || { echo "test_distributed_netns: $NODE or $MASTER not built" >&2; exit 77; }
"$N" can || exit $?
probe=$(UCX_MEM_EVENTS=no "$NODE" '{"mode":"distributed"}' </dev/null 2>&1 | head -1)
if [[ $probe == *"'rdma' tier"* ]]; then
  echo "test_distributed_netns: distributed mode is not built into this libumbp: $probe" >&2
  exit 77
fi
trap cleanup EXIT
"$N" up "$name" 3 || fail "netns up"
a1=$("$N" addr "$name" 1)
port=7390
mport=9390
secret="$work/secret"
head -c 32 /dev/urandom | base64 > "$secret"
chmod 600 "$secret"

# ---- the master on h1 ----------------------------------------------------------
"$N" exec "$name" 1 "$MASTER" --json "{\"listen\":\"$a1:$port\",\"secret_file\":\"$secret\",\"heartbeat_suspect_ms\":1000,\"heartbeat_dead_ms\":2000,\"metrics_port\":$mport}" \
  > "$work/master.log" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 200); do
  "$N" exec "$name" 1 bash -c "exec 3<>/dev/tcp/$a1/$port" 2>/dev/null && { up=1; break; }
  sleep 0.05
done
((up)) || fail "umbp-master does not accept on $a1:$port"

# ---- nodes ---------------------------------------------------------------------
MASTER_ADDRESS="$a1:$port"
NODE_JSON=',"heartbeat_ms":100,"timeout_ms":3000,"lookup_timeout_ms":500'
QUIET=0
. "$here/dist_nodes.sh"
expect_put() { # host seed count size
  cmd "$1" put "$2" "$3" "$4"
  [[ $ans == "ok $3" ]] || fail "h$1: put $2: $ans"
}
# get verb host seed count [size] -> sets HIT MISS; fails on a wrong byte
get() {
  local verb=$1 h=$2
  cmd "$h" "$verb" "${@:3}"
  read -r ok HIT MISS WRONG _ <<< "$ans"
  [[ $ok == ok ]] || fail "h$h: $verb ${*:3}: $ans"
  [[ $WRONG == 0 ]] || fail "h$h: $verb ${*:3}: $WRONG keys with wrong bytes"
}
until_found() { # host seed count [lookup|kvlookup]
  local i
  for i in $(seq 400); do
    cmd "$1" "${4:-lookup}" "$2" "$3" > /dev/null
    [[ $ans == "ok $3 "* ]] && return 0
    sleep 0.05
  done
  fail "h$1 never found the $3 keys of seed $2 (last: $ans)"
}

start_node 1
start_node 2 ',"cache_remote_fetches":false'
start_node 3

# 1. h1's objects, byte-exact on h2 and h3
expect_put 1 1 32 262144
cmd 1 kvput 2 16
[[ $ans == "ok 16" ]] || fail "kvput: $ans"
until_found 2 1 32
until_found 3 1 32
# the kv keys' stored events may reach the master a heartbeat later
until_found 2 2 16 kvlookup
until_found 3 2 16 kvlookup
for h in 2 3; do
  get get "$h" 1 32 262144
  [[ $HIT == 32 ]] || fail "h$h: $HIT of 32 hit"
  get kvget "$h" 2 16
  [[ $HIT == 16 ]] || fail "h$h: kv: $HIT of 16 hit"
done

# 2./3. the owner (h3) cut off, then its packets dropped, with gets in flight
fault() { # what undo seed
  expect_put 3 "$3" 64 1048576
  until_found 2 "$3" 64
  cmd 2 aget "$3" 64 1048576
  [[ $ans == "ok submitted" ]] || fail "aget: $ans"
  "$N" "$1" "$name" 3 || fail "$1"
  get await 2
  echo "h2: with h3 ${1}: $HIT hit, $MISS miss, 0 wrong"
  get get 2 "$3" 8 1048576 # while it is still cut off: misses, bounded
  [[ $HIT == 0 ]] || fail "h2 read $HIT keys from an unreachable owner"
  "$N" "$2" "$name" 3 || fail "$2"
  # healed: a new object of h3's reaches h2 (the old ones may be quarantined)
  expect_put 3 $(($3 + 1)) 8 65536
  until_found 2 $(($3 + 1)) 8
  local i
  for i in $(seq 100); do
    get get 2 $(($3 + 1)) 8 65536
    [[ $HIT == 8 ]] && return 0
    sleep 0.1
  done
  fail "h2 does not read h3's objects after $2"
}
fault cut heal 10
if command -v nft > /dev/null; then
  fault drop undrop 20
else
  echo "test_distributed_netns: no nft (nftables; scripts/setup.sh installs it): drops not checked"
fi

# 4. h2's umbp-server as the host's node, an engine of h2 attached to it
if [[ -n $SERVER && -x $SERVER ]]; then
  sdir="$work/srv2"
  mkdir -p "$sdir"
  "$N" exec "$name" 2 env UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_MEM_EVENTS=no "$SERVER" --json \
    "{\"socket_dir\":\"$sdir\",\"capacity_bytes\":\"256MiB\",\"master_address\":\"$MASTER_ADDRESS\",\"secret_file\":\"$secret\",\"node_host\":\"h2srv\",\"heartbeat_ms\":100,\"timeout_ms\":3000,\"lookup_timeout_ms\":500}" \
    > "$work/server2.log" 2>&1 &
  pids+=($!)
  up=0
  for _ in $(seq 200); do
    [[ -S $sdir/umbp-dp0.sock ]] && { up=1; break; }
    sleep 0.05
  done
  ((up)) || fail "h2's umbp-server does not serve"
  start_driver e2 2 "{\"mode\":\"standalone\",\"socket_dir\":\"$sdir\",\"gpu_backend\":\"host\",\"timeout_ms\":8000}"
  until_found e2 1 32 # through its server: the master's answer
  get get e2 1 32 262144
  [[ $HIT == 32 ]] || fail "h2's engine read $HIT of 32 of h1's objects through its server"
  get kvget e2 2 16
  [[ $HIT == 16 ]] || fail "h2's engine: kv: $HIT of 16"
  expect_put e2 40 24 131072
  cmd e2 quit # the engine goes; its objects are the server's
  until_found 3 40 24
  get get 3 40 24 131072
  [[ $HIT == 24 ]] || fail "h3 read $HIT of 24 from h2's server"
  echo "h2's server as the node: its engine read h1's objects, h3 read the engine's"
else
  echo "test_distributed_netns: no umbp-server given: the server as a node not checked"
fi

for h in 1 2 3; do cmd "$h" quit; done
echo "test_distributed_netns: passed"
