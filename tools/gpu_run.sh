#!/usr/bin/env bash
# On the GPU machine, from the repository root with build-gpu/ (tools/gpu_build.sh) present:
# the gpu suite, the integration suite against a ztd that picks the cuda backend, and the
# benchmarks (the step against PyTorch, the CPU AdamW, the NVMe tier, the copy engine; with two
# GPUs the collectives and the data-parallel scaling against FSDP2). Prints
# every result; exits non-zero if a test failed.
# Usage: tools/gpu_run.sh [OUTDIR] [--tests-only]   (OUTDIR receives the logs and the
# benchmark JSON; --tests-only skips the benchmarks)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/zt-gpu}
tests_only=${2:-}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
b=${ZT_GPU_BUILD:-build-gpu}  # another build of the same tree: ZT_GPU_BUILD
nvidia-smi -L
echo "cpus: nproc $(nproc), online $(cat /sys/devices/system/cpu/online), $(grep -c ^processor /proc/cpuinfo) in cpuinfo"
fails=0
run() { # name command...
  local name=$1; shift
  local lines=8
  if "$@" >"$out/$name.log" 2>&1; then echo "PASS $name"; else
    local rc=$?
    if [ $rc -eq 77 ]; then echo "SKIP $name"; else
      echo "FAIL $name (rc $rc)"
      fails=$((fails + 1))
      lines=60 # the reason, even where the logs under OUT do not come back
    fi
  fi
  tail -n $lines "$out/$name.log" | sed 's/^/    /'
}
run cuda_ops "$b/tests/gpu/test_cuda_ops"
run cuda_lowp "$b/tests/gpu/test_cuda_lowp"
run cuda_flash "$b/tests/gpu/test_cuda_flash"
run cuda_varlen "$b/tests/gpu/test_cuda_varlen"
run cuda_train "$b/tests/gpu/test_cuda_train"
run cuda_mixed "$b/tests/gpu/test_cuda_mixed"
run cuda_offload "$b/tests/gpu/test_cuda_offload"
run cuda_mem "$b/tests/gpu/test_cuda_mem"
run comm_nccl "$b/tests/gpu/test_comm_nccl"
run cuda_dp "$b/tests/gpu/test_cuda_dp"
run model_parity_cuda "$b/tests/gpu/test_parity_cuda" tests/data/parity cuda
export ZTD=$b/engine/server/ztd ZTCTL=$b/client/ztctl/ztctl ZT_TEST_BIN_DIR=$b/tests/integration
for t in train restart bad_input memory offload_eio offload_resume parallel_gpu peers two_daemons \
  offload_default_gpu; do
  run "integration_$t" bash "tests/integration/$t.sh"
done
if [ "$tests_only" != --tests-only ]; then
python3 tools/bench/gpu_step_bench.py --ztrain "$b/tools/ztrain" --json "$out/bench.json" \
  2>&1 | tee "$out/bench.log"
python3 tools/bench/offload_bench.py --ztrain "$b/tools/ztrain" --json "$out/offload.json" \
  2>&1 | tee "$out/offload.log"
# Issue 18: GPT-2 1.5 B clipped at 1.0 (the updates landing behind the next forward), then four
# micro-batches a step micro-major against unit-major.
python3 tools/bench/offload_bench.py --ztrain "$b/tools/ztrain" --json "$out/offload_clip.json" \
  --clip 1.0 --runs gpt2-1.5b:auto:auto:auto,gpt2-1.5b:host:host:1 2>&1 | tee "$out/offload_clip.log"
python3 tools/bench/offload_bench.py --ztrain "$b/tools/ztrain" --json "$out/offload_order.json" \
  --no-torch --grad-accum 4 --clip 1.0 \
  --runs gpt2-1.5b:host:host:1:micro,gpt2-1.5b:host:host:1:unit 2>&1 | tee "$out/offload_order.log"
python3 tools/bench/cpu_adam_vs_torch.py --bench "$b/tests/unit/offload/bench_cpu_adam" \
  2>&1 | tee "$out/cpu_adam.log"
# The NVMe store against a raw io_uring O_DIRECT loop on the machine's disk (the build
# directory unless ZT_BENCH_NVME_DIR says otherwise; the bench prints the filesystem and removes
# its files): 3 GiB, each side three times, 36 GiB of I/O in all. Exits 77 where io_uring is
# refused.
timeout 300 "$b/tests/unit/offload/bench_nvme" "${ZT_BENCH_NVME_DIR:-$b}" --size 3G --reps 3 \
  2>&1 | tee "$out/nvme.log"
# The CUDA copy engine against pinned cudaMemcpyAsync, each way and both at once.
"$b/tests/gpu/bench_copy" 2>&1 | tee "$out/copy.log"
# Several GPUs (issue 6), with two or more: ZeRO's per-unit collectives against NCCL's
# all-reduce, then zt on two GPUs against zt on one and FSDP2 on two ranks.
if [ "$(nvidia-smi -L | grep -c '^GPU ')" -ge 2 ]; then
  timeout 300 "$b/tests/gpu/bench_comm" 2>&1 | tee "$out/comm.log"
  timeout 900 python3 tools/bench/dp_bench.py --build "$b" --json "$out/dp.json" \
    2>&1 | tee "$out/dp.log"
else
  echo "SKIP bench_comm, dp_bench: they need 2 GPUs"
fi
fi
echo "gpu_run: $fails failed"
exit $((fails > 0))
