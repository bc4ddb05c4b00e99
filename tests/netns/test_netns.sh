#!/usr/bin/env bash
# test_netns - the hosts of the distributed-mode tests (scripts/netns.sh):
# two namespaces on a bridge carry TCP byte for byte; a cut link and dropped
# packets make a peer unreachable within a bound and healing brings it back;
# `down` leaves nothing behind.  Exit 77 (ctest: skipped) where namespaces
# cannot be made, with the reason.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
N="$repo/scripts/netns.sh"
PY=${PYTHON:-/usr/bin/python3}
name="t$$"
name=${name:0:8}
fail() { echo "FAIL: $*" >&2; exit 1; }

"$N" can || exit $?
trap '"$N" down "$name"' EXIT
"$N" up "$name" 2 || fail "up"
a1=$("$N" addr "$name" 1)
[[ $a1 =~ ^10\.[0-9]+\.0\.1$ ]] || fail "address of host 1: $a1"

"$N" exec "$name" 1 "$PY" "$here/echo.py" serve "$a1" 7070 > "/tmp/$name.serve" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; "$N" down "$name"' EXIT
for _ in $(seq 100); do grep -q ready "/tmp/$name.serve" 2>/dev/null && break; sleep 0.05; done
grep -q ready "/tmp/$name.serve" || fail "the echo server did not start: $(cat /tmp/$name.serve)"

# 1. host 2 reaches host 1 across the bridge, byte for byte
"$N" exec "$name" 2 "$PY" "$here/echo.py" send "$a1" 7070 4194304 10 || fail "echo across the bridge"
# ... and the root namespace does not (no address on the bridge, no route)
"$PY" "$here/echo.py" send "$a1" 7070 16 1 2>/dev/null && fail "the root namespace reached a host"

# 2. a cut link: the peer is unreachable, and the attempt ends by its timeout
"$N" cut "$name" 1 || fail "cut"
"$N" exec "$name" 2 "$PY" "$here/echo.py" send "$a1" 7070 4096 1 2>/dev/null
rc=$?
[[ $rc -eq 2 ]] || fail "through a cut link: exit $rc, want 2 (no echo within 1 s)"
"$N" heal "$name" 1 || fail "heal"
"$N" exec "$name" 2 "$PY" "$here/echo.py" send "$a1" 7070 65536 10 || fail "echo after healing"

# 3. dropped packets (nftables), the link up
if command -v nft >/dev/null; then
  "$N" drop "$name" 1 || fail "drop"
  "$N" exec "$name" 2 "$PY" "$here/echo.py" send "$a1" 7070 4096 1 2>/dev/null
  rc=$?
  [[ $rc -eq 2 ]] || fail "with packets dropped: exit $rc, want 2"
  "$N" undrop "$name" 1 || fail "undrop"
  "$N" exec "$name" 2 "$PY" "$here/echo.py" send "$a1" 7070 65536 10 || fail "echo after undrop"
else
  echo "test_netns: no nft (nftables; scripts/setup.sh installs it): packet drops not checked"
fi

# 4. down removes every namespace and the bridge
kill $server 2>/dev/null
wait $server 2>/dev/null
"$N" down "$name"
ip netns list | grep -q "^$name-h" && fail "namespaces left after down"
ip link show "umbp-$name" >/dev/null 2>&1 && fail "bridge left after down"
rm -f "/tmp/$name.serve"
trap - EXIT
echo "test_netns: passed"
