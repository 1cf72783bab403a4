#!/usr/bin/env bash
# The CS336 memory-profiling table as a command: for each model:batch:ctx cell and precision, one
# --benchmark --mode train step with --memory-report, then the table of docs/performance.md
# (launch/memory_table.py): the plan by category, what a forward needs, and the GPU memory in use.
#
#   launch/memory_table.sh BUILD_DIR OUT_DIR ["model:batch:ctx ..."] ["fp32 bf16 fp16"]
set -uo pipefail
build=${1:?usage: memory_table.sh BUILD_DIR OUT_DIR [CELLS] [PRECISIONS]}
out=${2:?usage: memory_table.sh BUILD_DIR OUT_DIR [CELLS] [PRECISIONS]}
cells=${3:-"2.7B:4:128 2.7B:4:256 2.7B:4:512"}
precisions=${4:-"fp32 bf16 fp16"}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
reports=()
for cell in $cells; do
  IFS=: read -r model batch ctx <<<"$cell"
  for p in $precisions; do
    name="$model-$batch-$ctx-$p"
    if "$build/trainer" --benchmark --device cuda --model "$model" --batch "$batch" --ctx "$ctx" \
      --precision "$p" --warmup 1 --steps 2 --mode train --memory-report "$out/$name.json" \
      ${EXTRA_ARGS:-} > "$out/$name.log" 2>&1; then
      reports+=("$out/$name.json")
    elif grep -q "does not fit\|out of memory" "$out/$name.log"; then
      echo "$name: out of memory"
    else
      echo "$name: FAILED"; tail -5 "$out/$name.log"
    fi
  done
done
python3 "$root/launch/memory_table.py" "${reports[@]}" | tee "$out/memory_table.md"
