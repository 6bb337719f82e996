#!/bin/bash
# The systemd units meson installs (tools/systemd) pass systemd-analyze verify: the system unit
# and the user unit, as configured for the build's prefix, with ExecStart pointed at the ztd of
# this build (the prefix's need not exist here). Skipped (77) where systemd-analyze is absent or
# cannot run (a container without a manager).
#   units.sh SYSTEM_UNIT USER_UNIT
set -u
: "${ZTD:?ZTD must name the ztd binary}"
command -v systemd-analyze >/dev/null || { echo "no systemd-analyze"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zt-units.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/run"
export XDG_RUNTIME_DIR=$tmp/run

verify() { # verify NAME UNIT [--user]
  local unit=$tmp/$1
  grep -q '^ExecStart=/.*/ztd\b' "$2" || { echo "FAIL: $2 has no ExecStart of ztd"; exit 1; }
  sed "s|^ExecStart=[^ ]*/ztd|ExecStart=$ZTD|" "$2" >"$unit"
  local out rc=0
  out=$(systemd-analyze ${3:-} verify "$unit" 2>&1) || rc=$?
  case "$out" in
    *"Failed to initialize manager"* | *"Failed to lookup"* | *"System has not been booted"*)
      echo "systemd-analyze cannot run here: $out"; exit 77 ;;
  esac
  # a warning (an unknown key, a bad value) fails too
  [ "$rc" -eq 0 ] && [ -z "$out" ] || { echo "FAIL: $1 ($2): $out"; exit 1; }
  echo "ok: $1 verifies"
}
verify ztd.service "$1"
verify ztd-user.service "$2" --user
grep -q '^WantedBy=default.target' "$2" || { echo "FAIL: the user unit is not for default.target"; exit 1; }
echo "units: ok"
