#!/bin/bash
# Paths of TCP clients' jobs are confined: files only inside ztd --data-root (a symlink out of it
# is followed, and refused), offload.nvme_dir only inside ztd --nvme-dir, none at all without
# them; Unix-socket clients keep naming any file. A model.hf directory outside the roots is refused
# the same whether it exists or not (its config.json is read only once it is inside). A file that is not a safetensors file named as
# the init is refused without a byte of it or its size in the reply.
. "$(dirname "$0")/lib.sh"

port=$((20000 + RANDOM % 20000))
printf '%s\n' an-integration-test-token-0123456789 >"$ZT_TMP/token"
chmod 600 "$ZT_TMP/token"
tcp() { "$ZTCTL" --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/token" "$@"; }

mkdir -p "$ZT_TMP/data" "$ZT_TMP/outside" "$ZT_TMP/nvme" "$ZT_TMP/nvme-out"
make_tokens "$ZT_TMP/data/in.zt"
cp "$ZT_TMP/data/in.zt" "$ZT_TMP/outside/out.zt"
ln -s "$ZT_TMP/outside/out.zt" "$ZT_TMP/data/link.zt"
# a file like /etc/passwd, inside the root: readable by the daemon, not a safetensors file
secret="$ZT_TMP/data/passwd"
printf 'root:x:0:0:root:/root:/bin/bash\nsecretuser:x:1000:1000:Secret Person:/home/s:/bin/sh\n' >"$secret"
size=$(stat -c %s "$secret")

start_ztd --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/token" --data-root "$ZT_TMP/data" \
  --nvme-dir "$ZT_TMP/nvme"

spec "$ZT_TMP/out.json" "$ZT_TMP/outside/out.zt" 4
spec "$ZT_TMP/link.json" "$ZT_TMP/data/link.zt" 4
spec "$ZT_TMP/in.json" "$ZT_TMP/data/in.zt" 4
spec "$ZT_TMP/init-out.json" "$ZT_TMP/data/in.zt" 4
sed -i "s|\"init\": {\"seed\": 1}|\"init\": {\"safetensors\": \"$ZT_TMP/outside/x.safetensors\"}|" \
  "$ZT_TMP/init-out.json"
spec "$ZT_TMP/secret.json" "$ZT_TMP/data/in.zt" 4
sed -i "s|\"init\": {\"seed\": 1}|\"init\": {\"safetensors\": \"$secret\"}|" "$ZT_TMP/secret.json"
spec "$ZT_TMP/nvme-out.json" stream 4 \
  "\"offload\": {\"optimizer\": \"nvme\", \"nvme_dir\": \"$ZT_TMP/nvme-out\"}"
spec "$ZT_TMP/nvme-in.json" stream 4 \
  "\"offload\": {\"optimizer\": \"nvme\", \"nvme_dir\": \"$ZT_TMP/nvme\"}"
python3 "$(dirname "$0")/hf_files.py" make-llama "$ZT_TMP/outside/hf" || fail "making an hf directory"
cp -r "$ZT_TMP/outside/hf" "$ZT_TMP/data/hf"
hf_spec() {
  printf '{"model": {"hf": "%s", "seq_len": 16}, "train": {"steps": 2, "micro_batch": 2},
           "data": {"source": "stream"}}\n' "$2" >"$1"
}
hf_spec "$ZT_TMP/hf-out.json" "$ZT_TMP/outside/hf"
hf_spec "$ZT_TMP/hf-none.json" "$ZT_TMP/outside/none"
hf_spec "$ZT_TMP/hf-in.json" "$ZT_TMP/data/hf"

for cmd in plan submit; do
  expect_fail 1 "data.path: $ZT_TMP/outside/out.zt is outside ztd --data-root" tcp "$cmd" "$ZT_TMP/out.json"
  expect_fail 1 "data.path: $ZT_TMP/data/link.zt is outside ztd --data-root" tcp "$cmd" "$ZT_TMP/link.json"
  expect_fail 1 "model.init.safetensors: $ZT_TMP/outside/x.safetensors is outside ztd --data-root" \
    tcp "$cmd" "$ZT_TMP/init-out.json"
  expect_fail 1 "offload.nvme_dir: $ZT_TMP/nvme-out is outside ztd --nvme-dir" tcp "$cmd" "$ZT_TMP/nvme-out.json"
  expect_fail 1 "model.hf: $ZT_TMP/outside/hf is outside ztd --data-root" tcp "$cmd" "$ZT_TMP/hf-out.json"
  expect_fail 1 "model.hf: $ZT_TMP/outside/none is outside ztd --data-root" tcp "$cmd" "$ZT_TMP/hf-none.json"
  # over TCP or not, the reply quotes nothing of the file, not even its size
  for via in tcp ztctl; do
    out=$($via "$cmd" "$ZT_TMP/secret.json" 2>&1) && fail "$via $cmd of a non-safetensors init was accepted"
    case "$out" in *"not a safetensors file (bad header)"*) ;; *) fail "$via $cmd: $out" ;; esac
    for leak in root /bin secretuser Secret "$size"; do
      case "${out//$ZT_TMP/}" in *"$leak"*) fail "$via $cmd: the reply quotes '$leak' of the file: $out" ;; esac
    done
    echo "ok: $via $cmd of $secret: $out"
  done
done
[ -z "$(ls "$STATE/jobs")" ] || fail "a refused submit left a job: $(ls "$STATE/jobs")"

# inside the roots TCP jobs run; the Unix socket's clients name any file
job=$(tcp submit "$ZT_TMP/in.json") || fail "TCP submit inside --data-root: $job"
wait_end "$job" done 120
grep -q '"client": "tcp"' "$STATE/jobs/$job/status.json" || fail "job $job does not record its client"
tcp plan "$ZT_TMP/nvme-in.json" >/dev/null || fail "TCP plan with nvme_dir inside --nvme-dir"
tcp plan "$ZT_TMP/hf-in.json" >/dev/null || fail "TCP plan of a model.hf inside --data-root"
job=$(submit "$ZT_TMP/out.json")
wait_end "$job" done 120
stop_ztd

# without --data-root and --nvme-dir a TCP client's job names no path: stream data only
start_ztd --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/token"
expect_fail 1 "data.path: $ZT_TMP/data/in.zt is not allowed: this client may name no such path (no ztd --data-root)" \
  tcp submit "$ZT_TMP/in.json"
expect_fail 1 "offload.nvme_dir: $ZT_TMP/nvme is not allowed" tcp plan "$ZT_TMP/nvme-in.json"
spec "$ZT_TMP/stream.json" stream 4
tcp plan "$ZT_TMP/stream.json" >/dev/null || fail "TCP plan of a stream job"
ztctl plan "$ZT_TMP/nvme-in.json" >/dev/null || fail "a Unix-socket client's nvme_dir was refused"
stop_ztd
echo "confine: ok"
