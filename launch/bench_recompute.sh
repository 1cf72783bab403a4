#!/usr/bin/env bash
# Step time and GPU memory with and without activation recompute on one GPU: each
# model:batch:ctx cell is benchmarked (--benchmark --mode train, bf16 unless EXTRA_ARGS says
# otherwise) with --recompute none, ffn and block; one CSV per mode in OUT_DIR, cells that do not
# fit recorded as out of memory; then the table of docs/performance.md.
#
#   launch/bench_recompute.sh BUILD_DIR OUT_DIR ["model:batch:ctx ..."] [MODES]
set -uo pipefail
build=${1:?usage: bench_recompute.sh BUILD_DIR OUT_DIR [CELLS] [MODES]}
out=${2:?usage: bench_recompute.sh BUILD_DIR OUT_DIR [CELLS] [MODES]}
cells=${3:-"small:4:512 small:4:4096 xl:4:512 xl:4:4096 2.7B:4:512 2.7B:4:4096"}
modes=${4:-"none ffn block"}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
extra=${EXTRA_ARGS:-}
for cell in $cells; do
  IFS=: read -r model batch ctx <<<"$cell"
  for mode in $modes; do
    echo -n "--recompute $mode: "
    EXTRA_ARGS="$extra --recompute $mode" "$root/launch/bench_sizes.sh" "$build" \
      "$out/recompute_$mode.csv" "$model" "$ctx" "$batch"
  done
done
args=()
for mode in $modes; do args+=("$mode=$out/recompute_$mode.csv"); done
python3 "$root/launch/recompute_table.py" "${args[@]}" | tee "$out/recompute_table.md"
