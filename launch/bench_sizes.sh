#!/usr/bin/env bash
# Benchmarks model sizes x context lengths on one GPU (bf16, --benchmark --mode train) and appends
# one CSV row per cell; cells that do not fit are recorded as "oom", not fatal.
#
#   launch/bench_sizes.sh BUILD_DIR OUT.csv ["small medium ..."] ["128 256 512 1024"] [BATCH]
#
# Render the CSV as the table of docs/performance.md with launch/bench_table.py.
set -uo pipefail
build=${1:?usage: bench_sizes.sh BUILD_DIR OUT.csv [MODELS] [CTXS] [BATCH]}
csv=${2:?usage: bench_sizes.sh BUILD_DIR OUT.csv [MODELS] [CTXS] [BATCH]}
models=${3:-"small medium large xl 2.7B"}
ctxs=${4:-"128 256 512 1024"}
batch=${5:-4}
warmup=${WARMUP:-5}
steps=${STEPS:-15}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for model in $models; do
  for ctx in $ctxs; do
    log=$(mktemp)
    "$build/trainer" --benchmark --device cuda --model "$model" --batch "$batch" --ctx "$ctx" \
      --warmup "$warmup" --steps "$steps" --mode train --csv "$csv" ${EXTRA_ARGS:-} > "$log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then
      grep -E "step +[0-9.]+ ±" "$log" | sed "s/^/$model x$batch x$ctx: /"
    elif grep -q "does not fit" "$log"; then
      echo "$model x$batch x$ctx: out of memory"
      echo "oom,$model,,,,,,$ctx,$batch" >> "$csv"
    else
      echo "$model x$batch x$ctx: FAILED (exit $rc)"; tail -5 "$log"
    fi
    rm -f "$log"
  done
done
