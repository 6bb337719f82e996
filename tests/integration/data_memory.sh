#!/bin/bash
# The runner's data in the job's host memory: a file of many small documents needs the packer's
# tables (its order and rows, counted from the file's header at admission) and the step's rows;
# plan shows them; under a --host-mem-limit that holds the training but not those tables the
# job is refused with the numbers, while the same file packed by windows (no tables) fits and
# runs; with room for both the documents job runs.
. "$(dirname "$0")/lib.sh"
PYDIR=$(cd "$(dirname "$0")/../../client/python" && pwd)

# 200000 documents of 2 or 3 tokens: some 8 MB of tables at seq_len 16
PYTHONPATH=$PYDIR python3 - "$ZT_TMP/many.tok" <<'PY' || fail "write_tokens"
import sys, zttokens
docs = [[(7 * i) % 256, (11 * i + 3) % 256] + ([i % 256] if i % 2 else []) for i in range(200000)]
zttokens.write_tokens(sys.argv[1], docs, vocab=256)
PY
spec "$ZT_TMP/docs.json" "$ZT_TMP/many.tok" 2
spec "$ZT_TMP/win.json" "$ZT_TMP/many.tok" 2
sed -i 's|"path": "\([^"]*\)"}|"path": "\1", "packing": "windows"}|' "$ZT_TMP/win.json"

start_ztd --backend cpu
docs=$(ztctl --json plan "$ZT_TMP/docs.json") || fail "plan: $docs"
win=$(ztctl --json plan "$ZT_TMP/win.json") || fail "plan of windows: $win"
sizes=$(python3 - "$docs" "$win" <<'PY'
import json, sys
d, w = (json.loads(a) for a in sys.argv[1:3])
n_docs, n_tokens, T = 200000, 500000, 16
# zt__packer_init: the order, and each row's first document and offset
want = (n_docs + 2 * (2 * n_docs + n_tokens // T + 1)) * 8
assert d["data_table_bytes"] == want and w["data_table_bytes"] == 0, (d, w)
assert d["host_bytes"] == w["host_bytes"] + want, (d["host_bytes"], w["host_bytes"], want)
print(d["host_bytes"], want, d["host_bytes"] - want // 2)
PY
) || fail "the plans' host bytes: $docs $win"
read -r need tables fit <<<"$sizes"
ztctl plan "$ZT_TMP/docs.json" | grep -q "^host: .* while it runs (the packed documents' tables 8.1 MiB)" ||
  fail "plan's host line: $(ztctl plan "$ZT_TMP/docs.json")"
stop_ztd

# room for the training and half the tables
start_ztd --backend cpu --host-mem-limit "$fit"
expect_fail 1 "for its data (the packed documents' tables 8.11 MiB, the step's rows 768 B); host limit" \
  ztctl submit "$ZT_TMP/docs.json"
job=$(submit "$ZT_TMP/win.json")
wait_state "$job" done
stop_ztd

# room for both
start_ztd --backend cpu --host-mem-limit "$need"
job=$(submit "$ZT_TMP/docs.json")
wait_state "$job" done
stop_ztd
echo "data_memory: ok (tables of $tables bytes)"
