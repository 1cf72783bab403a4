#!/usr/bin/env bash
# GPU failure handling on 2 GPUs: a rank that stops answering mid-run makes the NCCL watchdog of the
# other rank end every rank, with a message naming the rank and the collective, well before the
# timeout of this script. Usage: gpu_failures.sh BUILD_DIR DATA.npy
set -uo pipefail
build=${1:?usage: gpu_failures.sh BUILD_DIR DATA.npy}
data=${2:?usage: gpu_failures.sh BUILD_DIR DATA.npy}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
start=$(date +%s)
out=$(timeout 180 mpirun --oversubscribe -np 2 "$build/trainer" --device cuda --d-model 64 \
  --d-ff 128 --layers 2 --heads 2 --vocab 256 --ctx 64 --batch 4 --steps 100 --data "$data" \
  --comm-timeout 10 --debug-stall-at-step 3 --debug-stall-rank 1 2>&1)
rc=$?
secs=$(( $(date +%s) - start ))
echo "$out" | grep -E "stops answering|has not completed|aborting" | head -5
if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "rank 0/2: .*has not completed after" <<<"$out"; then
  echo "watchdog: every rank stopped (exit $rc) after ${secs} s"
  echo "1 passed, 0 failed"
  exit 0
fi
echo "FAIL: exit $rc after ${secs} s"
echo "$out" | tail -20
echo "0 passed, 1 failed"
exit 1
