#!/usr/bin/env bash
# On a 4-GPU machine with a prebuilt tree: the 4-rank GPU equivalence and resume tests, the
# headline command (xl 4x512, --ddp bucketed --shard-optim, 50 steps) and weak scaling 1 -> 2 -> 4
# with a bucket sweep (launch/plans/scaling.txt, or PLAN=FILE).
#   launch/gpu_x4.sh BUILD_DIR OUT_DIR
set -uo pipefail
build=${1:?usage: gpu_x4.sh BUILD_DIR OUT_DIR}
out=${2:?usage: gpu_x4.sh BUILD_DIR OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"
gpu_preflight "$build"
echo "== 4-rank GPU equivalence and resume"
timeout 400 mpirun --oversubscribe --bind-to none -np 4 "$build/tests/test_distributed_gpu" \
  > "$out/equivalence_np4.log" 2>&1
echo "exit $?: $(grep -E 'test cases' "$out/equivalence_np4.log" | tail -1)"
echo "== headline: 4 GPUs, xl 4x512, --ddp bucketed --shard-optim, 50 steps"
mpirun --oversubscribe --bind-to none -np 4 "$build/trainer" --benchmark --device cuda --model xl \
  --batch 4 --ctx 512 --ddp bucketed --shard-optim --warmup 5 --steps 50 --mode train \
  --csv "$out/headline.csv" 2>&1 | sed 's/^\[[^]]*\] //' | tee "$out/headline.log" |
  grep -E "optimizer state|memory per rank|forward|backward|comm |optimizer  |step +[0-9.]+ ±|^ +rank|^ +[0-9] "
NGPU=4 WARMUP=3 STEPS=12 PLAN="${PLAN:-$root/launch/plans/scaling.txt}" \
  "$root/launch/bench_ddp.sh" "$build" "$out/scaling.csv" xl 4 512 | grep -E "==|step +[0-9.]+ ±"
