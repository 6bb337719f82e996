"""Where `meson install` puts the Python binding (client/meson.build): prints the directory under
PREFIX that this interpreter (Debian's python3, which meson runs on) has on its path, and that
directory's relative path to LIBDIR, where libztclient goes.

    install_dir.py PREFIX LIBDIR FALLBACK

Debian's python3 looks in /usr/local/lib/python3.X/dist-packages for a /usr/local prefix and in
/usr/lib/python3/dist-packages for /usr; another prefix gets FALLBACK (meson's choice) and needs
PYTHONPATH."""
import os
import sys

prefix, libdir, fallback = sys.argv[1:4]
found = [p for p in sys.path if p.startswith(prefix.rstrip("/") + "/") and
         os.path.basename(p) in ("dist-packages", "site-packages")]
where = found[0] if found else fallback
print(where)
print(os.path.relpath(libdir, where))
