#!/usr/bin/env bash
# ucx_netns.sh - bench_ucx_fetch between two hosts: two network namespaces on
# a bridge (scripts/netns.sh), the owner in host 1, the requester in host 2,
# UCX and the raw TCP baseline both over the hosts' eth0 (the veth link).
#
#   bench/ucx_netns.sh BUILD_DIR [rounds (5)]
# Needs root and network namespaces (exit 77 with the reason otherwise).
# UCX_TLS defaults to tcp; UMBP_UCX_SPIN_US is passed through.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: ucx_netns.sh BUILD_DIR [rounds]}
rounds=${2:-5}
bin="$build/bench/bench_ucx_fetch"
[[ -x $bin ]] || { echo "ucx_netns.sh: no $bin (build with UCX)" >&2; exit 1; }
ns="$here/scripts/netns.sh"
name=ubench
bash "$ns" can || exit $?
trap 'bash "$ns" down $name' EXIT
bash "$ns" up $name 2 || exit 1
owner_addr=$(bash "$ns" addr $name 1)
UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=eth0 \
  bash "$ns" exec $name 2 "$bin" "$rounds" --owner-netns "$name-h1" --owner-addr "$owner_addr" "${@:3}"
