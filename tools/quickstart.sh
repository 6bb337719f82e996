#!/usr/bin/env bash
# The main job, from nothing: installs dependencies, builds zt into build/, starts ztd on a
# private socket, tokenizes a text every Debian machine has (the GPL-3 licence, byte-level), and
# trains a small GPT on it with live progress in ztctl. The cpu backend is used when no GPU is
# found. ztd is stopped at the end; its state stays in build/quickstart/state.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh

[ -d build ] || meson setup build -Dbuildtype=release >/dev/null
ninja -C build >/dev/null

work=build/quickstart
mkdir -p "$work"
sock="$work/ztd.sock"
./build/engine/server/ztd --socket "$sock" --state-dir "$work/state" --log-level warn &
ztd_pid=$!
trap 'kill -TERM $ztd_pid 2>/dev/null; wait $ztd_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

ztctl() { ./build/client/ztctl/ztctl --socket "$sock" "$@"; }
corpus=/usr/share/common-licenses/GPL-3
ztctl tokenize --bytes "$corpus" "$work/gpl3.tok"
ztctl status
# one long text: its rows are windows drawn at random (the job's "packing": "windows"), not the
# document packed in order
cp tools/jobs/tiny-gpt.json "$work/job.json"
(cd "$work" && ../../build/client/ztctl/ztctl --socket ztd.sock submit job.json --watch)
ztctl jobs
