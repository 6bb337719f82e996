#!/usr/bin/env bash
# Builds zt for the GPU machine into build-gpu/: release, CUDA on, libuv/msgpack-c/liburing/
# jansson linked statically (that machine has none of them). Run here, then carry build-gpu to
# the GPU machine and run tools/gpu_run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh
[ -d build-gpu ] || meson setup build-gpu -Dbuildtype=release -Dcuda=enabled -Dstatic_deps=true >/dev/null
ninja -C build-gpu
