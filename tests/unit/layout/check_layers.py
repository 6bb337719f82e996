#!/usr/bin/env python3
"""The folders are floors (DESIGN.md "Layout"): a source file may include its own floor and the
floors below it that it is allowed to stand on, never one above. Run over the source tree; prints
every include that breaks the rule and exits 1 if there is one."""
import os
import re
import sys

# floor -> the floors it may include (besides itself)
BELOW = {
    "engine/base": set(),
    "engine/comm": {"engine/base"},
    "engine/kernels": {"engine/base"},
    "engine/model": {"engine/base", "engine/kernels"},
    "offload": {"engine/base", "engine/kernels"},
    "engine/plan": {"engine/base", "engine/kernels", "engine/model", "offload"},
    "engine/train": {"engine/base", "engine/comm", "engine/kernels", "engine/model", "offload",
                     "engine/plan"},
    "proto": set(),
    "client": {"proto"},
    "engine/job": {"engine/base", "engine/comm", "engine/kernels", "engine/model", "offload",
                   "engine/plan", "engine/train", "proto", "client"},
    "engine/server": {"engine/base", "engine/comm", "engine/kernels", "engine/model", "offload",
                      "engine/plan", "engine/train", "proto", "client", "engine/job"},
    "engine": None,  # engine/main.c, ztd's entry: anything
}
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def floor_of(path):
    best = None
    for f in BELOW:
        if path == f or path.startswith(f + "/"):
            if best is None or len(f) > len(best):
                best = f
    return best


def main(root):
    bad = 0
    for top in ("engine", "offload", "proto", "client"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                here = floor_of(os.path.dirname(rel))
                if here is None:
                    print(f"{rel}: in no floor of the layout")
                    bad += 1
                    continue
                with open(os.path.join(root, rel), encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue  # a header of the file's own folder
                        there = floor_of(os.path.dirname(m.group(1)))
                        if there is None and m.group(1).startswith("zt/"):
                            there = "client"  # the public client header
                        if there == here or BELOW[here] is None or there in BELOW[here]:
                            continue
                        print(f"{rel}:{n}: includes {m.group(1)} ({there or 'no floor'}), "
                              f"not below {here}")
                        bad += 1
    print(f"{bad} include(s) across floors" if bad else "layers: every include goes down")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
