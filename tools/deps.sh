#!/usr/bin/env bash
# Installs what zt needs on a fresh Debian machine and puts the CUDA toolkit's nvcc on PATH.
# Sourced by tools/quickstart.sh and tools/test.sh; uses sudo when not root.
set -euo pipefail

zt_sudo() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

zt_packages=(meson ninja-build pkg-config gcc python3 libuv1-dev libmsgpack-dev liburing-dev libjansson-dev
             libmicrohttpd-dev libxxhash-dev)
# zt_install PACKAGE...: the Debian packages not installed yet (tools/test.sh adds the tests' own).
zt_install() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "zt: installing ${missing[*]}"
    zt_sudo apt-get update -qq
    zt_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
zt_install "${zt_packages[@]}"

# The CUDA toolkit is optional (the cpu backend needs none); when present, nvcc goes on PATH so
# meson's cuda feature finds it.
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/cuda/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
