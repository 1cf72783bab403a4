#!/usr/bin/env bash
# Copies what a GPU run needs from a build tree into DIR (binaries stripped), small enough to
# travel to a GPU machine (launch/*.sh there take DIR as BUILD_DIR).
#   launch/gpu_stage.sh BUILD_DIR DIR
set -euo pipefail
build=${1:?usage: gpu_stage.sh BUILD_DIR DIR}
dir=${2:?usage: gpu_stage.sh BUILD_DIR DIR}
rm -rf "$dir"
mkdir -p "$dir/tests" "$dir/launch"
cp "$build/trainer" "$build/generate" "$dir/"
for f in "$build"/tests/test_* "$build"/tests/bench_*; do
  [[ -x $f && -f $f ]] && cp "$f" "$dir/tests/"
done
for f in tokenize weights_diff; do cp "$build/launch/$f" "$dir/launch/"; done
cp "$build/comm_bench" "$dir/"
strip "$dir/trainer" "$dir/generate" "$dir/comm_bench" "$dir"/tests/* "$dir"/launch/*
du -sh "$dir"
