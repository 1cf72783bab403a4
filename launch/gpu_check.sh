#!/usr/bin/env bash
# On a GPU machine with a prebuilt tree: every GPU test (one and two GPUs) and the failure test.
#   launch/gpu_check.sh BUILD_DIR OUT_DIR
# Prints one line per test program and a closing "N passed, N failed" line; logs go to OUT_DIR.
set -uo pipefail
build=${1:?usage: gpu_check.sh BUILD_DIR OUT_DIR}
out=${2:?usage: gpu_check.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"
gpu_preflight "$build"
passed=0 failed=0
check() {  # check NAME TIMEOUT CMD...
  local name=$1 t=$2
  shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  if [[ $rc -eq 0 ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  printf '%-28s exit %3d  %4d s  %s\n' "$name" "$rc" $((SECONDS - t0)) \
    "$(grep -E 'test cases|passed|failed' "$out/$name.log" | tail -1)"
  [[ $rc -eq 0 ]] || grep -E -B2 -A6 "FAILED|REQUIRE|error|with expansion" "$out/$name.log" | head -40
}
for t in test_optim_gpu test_cuda_kernels test_cuda_model test_cuda_decoder test_flash_attention; do
  check "$t" 150 "$build/tests/$t"
done
ngpu=$(nvidia-smi -L | wc -l)
if [[ $ngpu -ge 2 ]]; then
  check test_distributed_gpu_np2 300 mpirun --oversubscribe -np 2 "$build/tests/test_distributed_gpu"
  python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 256, 200000).astype('<u2'))"
  check gpu_failures 120 bash "$(dirname "$0")/../tests/gpu_failures.sh" "$build" /tmp/tok.npy
fi
echo "$passed passed, $failed failed"
