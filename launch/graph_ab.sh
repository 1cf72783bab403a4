#!/usr/bin/env bash
# One GPU: the training step launched kernel by kernel against --cuda-graph, alternating, in one
# lease, so that the two are compared on the same machine and clocks.
#   launch/graph_ab.sh BUILD_DIR OUT.csv [ROUNDS] [SHAPES]
# SHAPES: "model:batch:ctx ..." (default small:4:512 small:16:1024 medium:4:512); each run is
# trainer --benchmark --device cuda --warmup 5 --steps 20, with or without --cuda-graph, and
# appends one row to OUT.csv (the `graph` column says which). launch/bench_table.py reads it.
set -uo pipefail
build=${1:?usage: graph_ab.sh BUILD_DIR OUT.csv [ROUNDS] [SHAPES]}
csv=${2:?usage: graph_ab.sh BUILD_DIR OUT.csv [ROUNDS] [SHAPES]}
rounds=${3:-2}
shapes=${4:-small:4:512 small:16:1024 medium:4:512}
for ((r = 1; r <= rounds; ++r)); do
  for shape in $shapes; do
    IFS=: read -r model batch ctx <<<"$shape"
    for graph in "" --cuda-graph; do
      line=$("$build/trainer" --benchmark --device cuda --model "$model" --batch "$batch" \
        --ctx "$ctx" --warmup 5 --steps 20 --csv "$csv" $graph 2>&1 | grep -E "step +[0-9.]+ ±")
      printf '%-6s %2s x %-5s %-13s %s\n' "$model" "$batch" "$ctx" "${graph:-eager}" \
        "$(sed -E 's/.*step +//' <<<"$line")"
    done
  done
done
