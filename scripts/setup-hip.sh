#!/bin/sh
# Optional: installs Debian's HIP compiler and runtime (ROCm 5.2) so that the
# HIP backend of gpu/ is built.  It compiles kernels for gfx90a (MI200); it
# does not know gfx942 (MI300).  No AMD GPU is needed to build.
set -eu
if [ "$(id -u)" -ne 0 ]; then
    echo "setup-hip.sh: run as root (apt-get install)" >&2
    exit 1
fi
apt-get install -y hipcc libamdhip64-dev
echo "setup-hip.sh: reconfigure with cmake; it should print 'umbp_gpu: HIP backend'"
