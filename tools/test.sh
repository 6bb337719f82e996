#!/usr/bin/env bash
# The test command: installs dependencies, builds zt with ASan+UBSan into build-test/, runs every
# suite (unit, integration; gpu tests skip without a GPU), and ends with one line
# "N passed, N failed, N skipped" computed from meson's test log. Exit status: 0 only if nothing
# failed.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh
# what only the tests use: a headless browser for the dashboard (tests/integration/dashboard.sh)
zt_install chromium

builddir=${ZT_TEST_BUILDDIR:-build-test}
if [ ! -d "$builddir" ]; then
  meson setup "$builddir" -Db_sanitize=address,undefined -Dbuildtype=debugoptimized >/dev/null
fi
ninja -C "$builddir"

# What the tests read ztd's files with, from PyPI: prometheus-client's text-format parser (the
# http test), TensorBoard's event reader (the series test), and tokenizers, transformers and
# jinja2, which renders chat templates (no torch: the chat_template test), in a venv of their own;
# tests that need them find it through ZT_TEST_PYTHON (and fail when it lacks them).
venv=$builddir/test-venv
zt_pip=(prometheus-client tensorboard tokenizers transformers jinja2)
if ! "$venv/bin/python" -c 'import prometheus_client, tensorboard, tokenizers, transformers, jinja2' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "${zt_pip[@]}"
fi
export ZT_TEST_PYTHON=$(cd "$venv" && pwd)/bin/python  # absolute: tests run in other directories

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
set +e
meson test -C "$builddir" --print-errorlogs --num-processes 2 --timeout-multiplier 3 "$@"
set -e

# Count from the log, not from meson's summary: every test's real result.
python3 - "$builddir/meson-logs/testlog.json" <<'PY'
import json, sys
passed = failed = skipped = 0
with open(sys.argv[1]) as f:
    for line in f:
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
if passed + failed == 0:
    print("no test ran", file=sys.stderr)
    sys.exit(1)
sys.exit(1 if failed else 0)
PY
