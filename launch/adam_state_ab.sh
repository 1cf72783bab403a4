#!/usr/bin/env bash
# One GPU: AdamW's moments in fp32 (the default) against --adam-state bf16, alternating, in one
# lease.
#   launch/adam_state_ab.sh BUILD_DIR OUT.csv [ROUNDS] [SHAPES]
# SHAPES: "model:batch:ctx ..." (default 2.7B:4:512 xl:4:512); each run is trainer --benchmark
# --device cuda --warmup 5 --steps 20 [--adam-state bf16] and appends one row to OUT.csv (column
# adam_state).
set -uo pipefail
build=${1:?usage: adam_state_ab.sh BUILD_DIR OUT.csv [ROUNDS] [SHAPES]}
csv=${2:?usage: adam_state_ab.sh BUILD_DIR OUT.csv [ROUNDS] [SHAPES]}
rounds=${3:-2}
shapes=${4:-2.7B:4:512 xl:4:512}
for ((r = 1; r <= rounds; ++r)); do
  for shape in $shapes; do
    IFS=: read -r model batch ctx <<<"$shape"
    for state in fp32 bf16; do
      out=$("$build/trainer" --benchmark --device cuda --model "$model" --batch "$batch" \
        --ctx "$ctx" --warmup 5 --steps 20 --csv "$csv" --adam-state "$state" 2>&1)
      printf '%-6s %2s x %-5s %-5s %s | %s\n' "$model" "$batch" "$ctx" "$state" \
        "$(grep -E "step +[0-9.]+ ±" <<<"$out" | sed -E 's/.*step +//')" \
        "$(grep -E "^.*optimizer +[0-9.]+ ±" <<<"$out" | sed -E 's/.*optimizer +//')"
    done
  done
done
