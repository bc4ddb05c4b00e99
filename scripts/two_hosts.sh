#!/usr/bin/env bash
# two_hosts.sh - distributed mode on one machine, as two hosts: two network
# namespaces on a bridge (scripts/netns.sh), umbp-master on host 1, one node
# per host (umbp-dist-node: a umbp runtime driven line by line).  Host 1
# stores objects (host put and the KV path), host 2 restores them over UCX
# (tcp on its veth) and checks every byte against what host 1 wrote; then
# everything is removed.  Says what it does at each step.
#
#   sudo scripts/two_hosts.sh [build-dir]      (default: build)
#
# Needs root (namespaces), a build with tests (umbp-dist-node) and the rdma
# tier (distributed mode).  Exit 0 every byte matched, 1 a failure, 77 this
# machine or build cannot run it (the reason is printed).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$repo/build}" 2>/dev/null && pwd) || { echo "two_hosts: no build dir ${1:-build}" >&2; exit 77; }
N="$repo/scripts/netns.sh"
NODE="$build/tests/umbp-dist-node"
MASTER="$build/master/umbp-master"
name="two$$"
name=${name:0:8}
work=$(mktemp -d /tmp/umbp-two-hosts.XXXXXX)
pids=()
COUNT=64 SIZE=262144 KV=32

say() { echo "== $*"; }
fail() {
  echo "two_hosts: FAILED: $*" >&2
  for f in "$work"/*.log; do [[ -f $f ]] && { echo "--- $(basename "$f")" >&2; tail -15 "$f" >&2; }; done
  exit 1
}
cleanup() {
  local p
  say "cleaning up: stopping ${#pids[@]} processes, removing namespaces $name-h1, $name-h2"
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  "$N" down "$name"
  rm -rf "$work"
}

for b in "$NODE" "$MASTER"; do
  [[ -x $b ]] || { echo "two_hosts: $b is not built (cmake --build $build)" >&2; exit 77; }
done
"$N" can || exit $?
probe=$(UCX_MEM_EVENTS=no "$NODE" '{"mode":"distributed"}' </dev/null 2>/dev/null | head -1)
if [[ $probe == *"'rdma' tier"* ]]; then
  echo "two_hosts: this libumbp has no distributed mode: $probe" >&2
  exit 77
fi
trap cleanup EXIT

say "making two hosts: namespaces $name-h1 and $name-h2 on bridge umbp-$name"
"$N" up "$name" 2 || fail "netns up"
a1=$("$N" addr "$name" 1)
a2=$("$N" addr "$name" 2)
say "host 1 is $a1, host 2 is $a2 (veth eth0 in each)"

secret="$work/cluster.secret"
head -c 32 /dev/urandom | base64 > "$secret"
chmod 600 "$secret"
say "starting umbp-master on host 1, $a1:7390, with a shared secret ($secret, mode 0600)"
"$N" exec "$name" 1 "$MASTER" --json "{\"listen\":\"$a1:7390\",\"secret_file\":\"$secret\"}" \
  > "$work/master.log" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 200); do
  "$N" exec "$name" 1 bash -c "exec 3<>/dev/tcp/$a1/7390" 2>/dev/null && { up=1; break; }
  sleep 0.05
done
((up)) || fail "umbp-master does not accept on $a1:7390"

MASTER_ADDRESS="$a1:7390"
NODE_JSON=""
NODE_SAY=say
ANSWER_S=90
QUIET=1
. "$repo/tests/netns/dist_nodes.sh"

start_node 1
start_node 2

say "host 1 stores $COUNT objects of $SIZE bytes (random bytes of seed 1) and $KV KV blocks (seed 2)"
cmd 1 put 1 $COUNT $SIZE
[[ $ans == "ok $COUNT" ]] || fail "put: $ans"
cmd 1 kvput 2 $KV
[[ $ans == "ok $KV" ]] || fail "kvput: $ans"

say "waiting until the master knows them (host 1's next heartbeat); host 2 asks"
found=0
for _ in $(seq 200); do
  cmd 2 lookup 1 $COUNT
  [[ $ans == "ok $COUNT "* ]] || { sleep 0.05; continue; }
  cmd 2 kvlookup 2 $KV # the KV blocks' events may come a heartbeat later
  [[ $ans == "ok $KV "* ]] && { found=1; break; }
  sleep 0.05
done
((found)) || fail "host 2 never found host 1's keys: $ans"

say "host 2 restores them into buffers poisoned with 0xA5 and compares every byte"
cmd 2 get 1 $COUNT $SIZE
echo "   host 2 get:   $ans   (hit miss wrong)"
read -r ok hit miss wrong _ <<< "$ans"
[[ $ok == ok && $hit == "$COUNT" && $wrong == 0 ]] || fail "host objects: $ans"
cmd 2 kvget 2 $KV
echo "   host 2 kvget: $ans"
read -r ok hit miss wrong _ <<< "$ans"
[[ $ok == ok && $hit == "$KV" && $wrong == 0 ]] || fail "KV blocks: $ans"

cmd 1 quit
cmd 2 quit
say "every byte of $((COUNT * SIZE)) object bytes and $KV KV blocks matched on host 2"
