#!/usr/bin/env bash
# On a GPU machine with a prebuilt tree: the single-GPU size sweep and the attention benchmark.
#   launch/gpu_bench.sh BUILD_DIR OUT_DIR
set -uo pipefail
build=${1:?usage: gpu_bench.sh BUILD_DIR OUT_DIR}
out=${2:?usage: gpu_bench.sh BUILD_DIR OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"
"$root/launch/bench_sizes.sh" "$build" "$out/sizes.csv" "${MODELS:-small medium large xl 2.7B}" \
  "${CTXS:-128 256 512 1024}" 4
"$root/launch/bench_sizes.sh" "$build" "$out/sizes.csv" small 1024 16
BUILD_DIR=$build "$root/launch/bench_attention.sh" "$out/attention" --iters 20 > "$out/attention.log" 2>&1
tail -30 "$out/attention.log"
