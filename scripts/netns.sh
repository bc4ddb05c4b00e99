#!/usr/bin/env bash
# netns.sh - hosts for distributed-mode tests on one machine: one network
# namespace per host, each with a veth pair into one bridge, so that traffic
# between "hosts" crosses a real (virtual) link and nothing else (no route
# out, loopback inside each).  Links can be cut and packets dropped, which is
# how the tests make a partition.
#
#   scripts/netns.sh up   <name> <hosts>   hosts <name>-h1 .. -hN, 10.<net>.0.i/24
#   scripts/netns.sh down <name>           remove them (idempotent)
#   scripts/netns.sh addr <name> <i>       host i's address
#   scripts/netns.sh exec <name> <i> cmd.. run cmd in host i
#   scripts/netns.sh cut  <name> <i>       host i's link down (both ends)
#   scripts/netns.sh heal <name> <i>       and up again
#   scripts/netns.sh drop <name> <i>       host i drops every packet from the
#                                          bridge (nftables), link left up
#   scripts/netns.sh undrop <name> <i>
#   scripts/netns.sh can                   exit 0 if this machine can do it
#                                          (root, ip netns, a bridge); else 77
#                                          with the reason on stderr
#
# <name> is 1-8 of [a-z0-9]; the bridge is umbp-<name>, the host ends of the
# veth pairs <name>-vN.  Exit status 77 means "cannot here" (not root, no
# ip/bridge support): tests skip with the reason.  Every command is bounded
# (no waits), and `up` removes what it made if it fails half way.
set -uo pipefail

die() { echo "netns.sh: $*" >&2; exit 1; }
skip() { echo "netns.sh: cannot create network namespaces here: $*" >&2; exit 77; }

net_of() { # a /16 per name, from its characters, in 10.64.0.0 .. 10.127.0.0
  local sum=0 i c
  for ((i = 0; i < ${#1}; i++)); do
    printf -v c '%d' "'${1:i:1}"
    sum=$(((sum * 31 + c) % 64))
  done
  echo $((64 + sum))
}

check_name() {
  [[ "$1" =~ ^[a-z0-9]{1,8}$ ]] || die "name must be 1-8 of [a-z0-9], got '$1'"
}

can() {
  [[ $(id -u) -eq 0 ]] || skip "not root"
  command -v ip >/dev/null || skip "no ip (iproute2)"
  local probe="umbpprobe$$"
  ip netns add "$probe" 2>/dev/null || skip "ip netns add failed"
  # exec mounts a private /sys for the namespace: a chroot whose / is not a
  # mount point, or a container without the right to mount, refuses it
  local why
  why=$(ip netns exec "$probe" true 2>&1) || {
    ip netns del "$probe" 2>/dev/null
    skip "ip netns exec failed: ${why//$'\n'/ }"
  }
  ip netns del "$probe" 2>/dev/null
  ip link add "umbp-p$$" type bridge 2>/dev/null || skip "cannot create a bridge"
  ip link del "umbp-p$$" 2>/dev/null
  return 0
}

down() {
  local name=$1 ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name}-h[0-9]+$"); do
    ip netns del "$ns" 2>/dev/null
  done
  ip link del "umbp-$name" 2>/dev/null
  return 0
}

up() {
  local name=$1 n=$2 i net
  [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 32)) || die "hosts must be 1..32, got '$n'"
  can
  down "$name"
  net=$(net_of "$name")
  trap 'down "$name"' ERR
  set -e
  ip link add "umbp-$name" type bridge
  ip link set "umbp-$name" up
  for ((i = 1; i <= n; i++)); do
    ip netns add "$name-h$i"
    ip link add "$name-v$i" type veth peer name eth0 netns "$name-h$i"
    ip link set "$name-v$i" master "umbp-$name" up
    ip -n "$name-h$i" link set lo up
    ip -n "$name-h$i" addr add "10.$net.0.$i/24" dev eth0
    ip -n "$name-h$i" link set eth0 up
  done
  set +e
  trap - ERR
}

nft_in() { # host i, nft arguments
  command -v nft >/dev/null || skip "no nft (nftables): scripts/setup.sh installs it"
  ip netns exec "$1" nft "${@:2}"
}

cmd=${1:-}
shift || true
case $cmd in
  can) can ;;
  up) [[ $# -eq 2 ]] || die "usage: up <name> <hosts>"; check_name "$1"; up "$1" "$2" ;;
  down) [[ $# -eq 1 ]] || die "usage: down <name>"; check_name "$1"; down "$1" ;;
  addr) [[ $# -eq 2 ]] || die "usage: addr <name> <i>"; check_name "$1"; echo "10.$(net_of "$1").0.$2" ;;
  exec) [[ $# -ge 3 ]] || die "usage: exec <name> <i> cmd..."; check_name "$1"
    ns="$1-h$2"; shift 2; exec ip netns exec "$ns" "$@" ;;
  cut) check_name "$1"; ip link set "$1-v$2" down ;;
  heal) check_name "$1"; ip link set "$1-v$2" up ;;
  drop) check_name "$1"
    nft_in "$1-h$2" add table inet umbp_drop &&
      nft_in "$1-h$2" add chain inet umbp_drop in '{ type filter hook input priority 0; policy accept; }' &&
      nft_in "$1-h$2" add rule inet umbp_drop in iifname eth0 drop &&
      nft_in "$1-h$2" add chain inet umbp_drop out '{ type filter hook output priority 0; policy accept; }' &&
      nft_in "$1-h$2" add rule inet umbp_drop out oifname eth0 drop ;;
  undrop) check_name "$1"; nft_in "$1-h$2" delete table inet umbp_drop ;;
  *) die "unknown command '$cmd' (up, down, addr, exec, cut, heal, drop, undrop, can)" ;;
esac
