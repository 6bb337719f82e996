#!/bin/bash
# Documents with a loss mask through ztd: `ztctl pack` writes a version 2 token file (a bad line
# refused with its number, nothing written), the Python writer writes the same bytes, a file job
# trains on it packed by documents (the default for version 2) and by windows, and bad files
# are refused at submit naming the file and the index while the daemon goes on serving.
. "$(dirname "$0")/lib.sh"
PYDIR=$(cd "$(dirname "$0")/../../client/python" && pwd)

# 40 documents of 3..40 tokens: a prompt (masked by labels or loss_mask) and a reply
python3 - "$ZT_TMP/docs.jsonl" <<'PY'
import json, random, sys
rng = random.Random(3)
with open(sys.argv[1], "w") as f:
    for i in range(40):
        n = rng.randrange(3, 41)
        ids = [rng.randrange(0, 256) for _ in range(n)]
        p = rng.randrange(1, n)
        if i % 2:
            f.write(json.dumps({"input_ids": ids, "labels": [-100] * p + ids[p:]}) + "\n")
        else:
            f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * p + [1] * (n - p)}) + "\n")
PY
out=$(ztctl pack "$ZT_TMP/docs.jsonl" "$ZT_TMP/docs.tok" --vocab 256) || fail "pack: $out"
case "$out" in *"40 documents"*"vocab 256"*) ;; *) fail "pack said: $out" ;; esac
ztctl --json pack "$ZT_TMP/docs.jsonl" "$ZT_TMP/docs2.tok" --vocab 256 | json_get documents |
  grep -qx 40 || fail "pack --json"
# the Python binding's writer: the same bytes
PYTHONPATH=$PYDIR python3 - "$ZT_TMP/docs.jsonl" "$ZT_TMP/py.tok" <<'PY' || fail "write_tokens"
import json, sys, zttokens
docs = [json.loads(l) for l in open(sys.argv[1])]
r = zttokens.write_tokens(sys.argv[2], docs, vocab=256)
assert r["documents"] == 40 and r["vocab"] == 256, r
try:
    zttokens.write_tokens(sys.argv[2] + ".bad", [[1, 2], {"input_ids": [1, 2], "labels": [1, 3]}])
    raise SystemExit("a label that is not its input id was written")
except ValueError as e:
    assert "document 1: labels[1]" in str(e), e
PY
cmp "$ZT_TMP/docs.tok" "$ZT_TMP/py.tok" || fail "ztctl pack and ztclient.write_tokens differ"

# bad lines: the line's number, nothing written
printf '{"input_ids": [1, 2]}\n{"input_ids": [1, 2\n' >"$ZT_TMP/bad1.jsonl"
expect_fail 1 "bad1.jsonl line 2: not a JSON object" ztctl pack "$ZT_TMP/bad1.jsonl" "$ZT_TMP/bad.tok"
printf '{"input_ids": [1, 2, 3], "labels": [-100, 2]}\n' >"$ZT_TMP/bad2.jsonl"
expect_fail 1 "line 1: labels must be an array as long as input_ids (3)" \
  ztctl pack "$ZT_TMP/bad2.jsonl" "$ZT_TMP/bad.tok"
printf '\n{"input_ids": [1, 300]}\n' >"$ZT_TMP/bad3.jsonl"
expect_fail 1 "line 2: input_ids[1] is not an integer in [0, 256)" \
  ztctl pack "$ZT_TMP/bad3.jsonl" "$ZT_TMP/bad.tok" --vocab 256
printf '{"input_ids": [1, 2], "loss_mask": [1, 2]}\n' >"$ZT_TMP/bad4.jsonl"
expect_fail 1 "line 1: loss_mask[1] is neither 0 nor 1" ztctl pack "$ZT_TMP/bad4.jsonl" "$ZT_TMP/bad.tok"
[ ! -e "$ZT_TMP/bad.tok" ] && [ ! -e "$ZT_TMP/bad.tok.tmp" ] || fail "a refused pack wrote a file"

start_ztd
spec "$ZT_TMP/docs.json" "$ZT_TMP/docs.tok" 30
job=$(submit "$ZT_TMP/docs.json")
spec "$ZT_TMP/win.json" "$ZT_TMP/docs.tok" 30
sed -i 's|"path": "\([^"]*\)"}|"path": "\1", "packing": "windows"}|' "$ZT_TMP/win.json"
win=$(submit "$ZT_TMP/win.json")
wait_state "$job" done
wait_state "$win" done
python3 - "$(ztctl --json show "$job")" "$(ztctl --json show "$win")" <<'PY' || fail "document jobs"
import json, math, sys
d, w = (json.loads(a) for a in sys.argv[1:3])
assert "packing" not in d["spec"]["data"] and w["spec"]["data"]["packing"] == "windows", w["spec"]
ld = [x[-1] if isinstance(x, list) else x for x in d["losses"]]
lw = [x[-1] if isinstance(x, list) else x for x in w["losses"]]
assert len(ld) == len(lw) == 30 and all(math.isfinite(x) for x in ld + lw), (ld, lw)
assert ld != lw, "documents and windows made the same batches"
print("documents: 30 steps packed by documents and by windows")
PY

# the same file streamed by ztctl: its rows go with their loss mask and document starts
spec "$ZT_TMP/stream.json" stream 10
out=$(ztctl --json submit "$ZT_TMP/stream.json" --data "$ZT_TMP/docs.tok" --wait) ||
  fail "streaming a version 2 file: $out"
sid=$(printf '%s\n' "$out" | job_id_of)
[ "$(state "$sid")" = done ] || fail "the streamed job: $(ztctl show "$sid")"

# bad files at submit, naming the file; the daemon goes on serving
head -c -8 "$ZT_TMP/docs.tok" >"$ZT_TMP/trunc.tok"
spec "$ZT_TMP/trunc.json" "$ZT_TMP/trunc.tok" 5
expect_fail 1 "data.path: $ZT_TMP/trunc.tok: truncated or padded" ztctl submit "$ZT_TMP/trunc.json"
# a token past the file's own vocabulary (a writer's bug): the index named, no byte of it echoed
python3 - "$ZT_TMP/docs.tok" "$ZT_TMP/over.tok" <<'PY'
import sys
raw = bytearray(open(sys.argv[1], "rb").read())
raw[48 + 2 * 5:48 + 2 * 5 + 2] = (300).to_bytes(2, "little")
open(sys.argv[2], "wb").write(raw)
PY
spec "$ZT_TMP/over.json" "$ZT_TMP/over.tok" 5
expect_fail 1 "(index 5 of the file) is not below the file's vocabulary 256" \
  ztctl submit "$ZT_TMP/over.json"
ztctl pack "$ZT_TMP/docs.jsonl" "$ZT_TMP/big.tok" --vocab 300 >/dev/null || fail "pack --vocab 300"
spec "$ZT_TMP/big.json" "$ZT_TMP/big.tok" 5
expect_fail 1 "data.path: $ZT_TMP/big.tok: token vocabulary 300 is larger than model.vocab 256" \
  ztctl submit "$ZT_TMP/big.json"
sed 's|"path": "\([^"]*\)"}|"path": "\1", "packing": "rows"}|' "$ZT_TMP/docs.json" >"$ZT_TMP/p.json"
expect_fail 1 'data.packing must be "documents" or "windows"' ztctl submit "$ZT_TMP/p.json"
sed 's|"path": "\([^"]*\)"}|"path": "\1", "packing": "windows", "shuffle": true}|' \
  "$ZT_TMP/docs.json" >"$ZT_TMP/p.json"
expect_fail 1 "data.shuffle shuffles documents" ztctl submit "$ZT_TMP/p.json"
again=$(submit "$ZT_TMP/docs.json")
wait_state "$again" done
[ "$(ztctl --json show "$again" | json_get losses)" = "$(ztctl --json show "$job" | json_get losses)" ] ||
  fail "the same documents job gave other losses"
stop_ztd
echo "documents: ok"
