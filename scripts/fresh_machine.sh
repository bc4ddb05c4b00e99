#!/usr/bin/env bash
# fresh_machine.sh - runs the README's commands on a fresh Debian 12, as a
# new user's machine would be: a minimal Debian 12 root (debootstrap
# --variant=minbase: no compiler, no Python, nothing of ours), this tree
# cloned into it, then in a chroot `scripts/demo.sh` and the given test
# command (default `scripts/test.sh --no-sanitize`).  A package missing
# from scripts/setup.sh fails here, where a run on a developer's machine
# finds it already installed.
#
#   scripts/fresh_machine.sh [ROOT (/var/tmp/umbp-fresh)] [-- TEST COMMAND]
#
# Needs root and a Debian mirror (apt's own, from /etc/apt/sources.list.d);
# installs debootstrap on the host.  The root is kept between runs (the
# bootstrap takes minutes); `rm -rf ROOT` starts over.  /proc, /sys, /dev
# and /run/netns are bind-mounted for the run (and the root onto itself, so
# that / is a mount point as on a machine) and unmounted at exit; an
# installed Debian's /etc/hosts (localhost) is written, which debootstrap
# leaves out.  The
# GPU paths need nvcc or hipcc, which Debian 12 does not ship: a fresh root
# builds without them, as CI on a machine without them does.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=/var/tmp/umbp-fresh
if [[ $# -gt 0 && $1 != -- ]]; then root=$1; shift; fi
[[ ${1:-} == -- ]] && shift
cmd=${*:-scripts/test.sh --no-sanitize}
if [[ $(id -u) -ne 0 ]]; then
  echo "fresh_machine: needs root (debootstrap, chroot, mounts)" >&2
  exit 77
fi
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}

if [[ ! -x $root/usr/bin/apt-get ]]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
  }
  echo "fresh_machine: bootstrapping Debian 12 (minbase) into $root from $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.bootstrap.log" 2>&1 || {
    tail -20 "$root.bootstrap.log" >&2
    exit 1
  }
fi

mounts=()
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() { # bind SRC DST
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
}
# / a mount point, as on a machine (ip netns exec remounts it rslave)
bind "$root" "$root"
bind /proc "$root/proc"
bind /sys "$root/sys"
bind /dev "$root/dev"
bind /dev/pts "$root/dev/pts"
mkdir -p /run/netns
bind /run/netns "$root/run/netns"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# debootstrap writes no /etc/hosts; an installed Debian has this one
[[ -s $root/etc/hosts ]] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' \
  >"$root/etc/hosts"

# the tree as committed (a clean clone, as CI takes it)
rm -rf "$root/umbp"
git clone -q "$repo" "$root/umbp"
echo "fresh_machine: in the fresh root: scripts/demo.sh, then $cmd"
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 /bin/bash -c "cd /umbp && scripts/demo.sh && $cmd"
echo "fresh_machine: the README's commands passed on a fresh Debian 12"
