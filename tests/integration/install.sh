#!/bin/bash
# `meson install` into a DESTDIR, then the installed tree alone: its ztctl and ztd (--version,
# status), and its Python binding imported by the build's python3 (Debian's, which meson runs on)
# from where it was installed, loading the installed libztclient without ZTCLIENT_LIB.
#   env: ZT_BUILD_ROOT, ZT_BINDIR (the prefix's bindir), ZT_PY_DIR, ZT_PY (the interpreter)
. "$(dirname "$0")/lib.sh"

D=$ZT_TMP/root
meson install -C "$ZT_BUILD_ROOT" --destdir "$D" --no-rebuild --quiet >"$ZT_TMP/install.log" 2>&1 ||
  fail "meson install: $(tail -n 20 "$ZT_TMP/install.log")"
ZTD=$D$ZT_BINDIR/ztd
ZTCTL=$D$ZT_BINDIR/ztctl
[ -x "$ZTD" ] && [ -x "$ZTCTL" ] || fail "no ztd or ztctl in $D$ZT_BINDIR"
"$ZTCTL" --version | grep -q "^ztctl " || fail "installed ztctl --version"
"$ZTD" --version | grep -q "^ztd " || fail "installed ztd --version"
start_ztd
ztctl status | grep -q "backend cpu" || fail "installed ztctl status: $(ztctl status 2>&1)"
[ -f "$D$ZT_PY_DIR/ztclient.py" ] || fail "no ztclient.py in $D$ZT_PY_DIR"
unset ZTCLIENT_LIB
PYTHONPATH=$D$ZT_PY_DIR "$ZT_PY" - "$SOCK" "$D" <<'PY' || fail "the installed binding"
import sys
import ztclient
assert ztclient.__file__.startswith(sys.argv[2]), ztclient.__file__
lib = ztclient._library_path()
assert lib.startswith(sys.argv[2]), lib   # the installed library, not one of the build's
with ztclient.connect(socket=sys.argv[1]) as c:
    assert c.status()["backend"] == "cpu"
    try:
        c.logs("j999999")
    except ztclient.ZtError as e:
        assert e.code == "ENOENT", e
print("installed binding:", ztclient.__file__, "with", lib)
PY
stop_ztd
echo "install: ok"
