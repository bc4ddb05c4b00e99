#!/usr/bin/env bash
# Installs every Debian package umbp needs to build, test and benchmark.
# Idempotent; run as root (or with sudo available).  Set UMBP_WITH_HIP=1 to
# also install Debian's hipcc so the HIP copy-engine path is compiled.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libev-dev libck-dev libnuma-dev libjson-c-dev libxxhash-dev
  libmicrohttpd-dev libsodium-dev
  libibverbs-dev librdmacm-dev
  iproute2 nftables curl
  libucx-dev ucx-utils
  redis-server libhiredis-dev
  libssl-dev openssl
  libcriterion-dev
  clang libclang-rt-14-dev
  python3 python3-numpy python3-pytest python3-torch python3-setuptools
  python3-wheel python3-pip python3-prometheus-client
  patchelf
)
if [[ "${UMBP_WITH_HIP:-0}" == 1 ]]; then
  packages+=(hipcc libamdhip64-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
