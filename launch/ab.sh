#!/usr/bin/env bash
# One GPU: trainer variants (binaries or flags) alternating in one lease, so that they are compared
# on the same machine and clocks.
#   launch/ab.sh OUT_PREFIX ROUNDS "SHAPES" VARIANT...
# SHAPES: "model:batch:ctx ..."; VARIANT: "LABEL|TRAINER [FLAGS...]", e.g.
#   launch/ab.sh out/ab 2 "2.7B:4:512" "before|old/trainer" "off|build/trainer --overlap-update off"
# Each cell of each round is one trainer --benchmark --device cuda --warmup 5 --steps 20 run (env
# WARMUP, STEPS: e.g. STEPS=300 to compare variants held at the GPU's power cap) that
# appends a row to OUT_PREFIX.LABEL.csv (one file per variant: binaries of different versions may
# write different columns) and prints its step, wall (host clock, launch to launch), optimizer and
# GPU (SM clock and power, where NVML is found) lines.
set -uo pipefail
usage="usage: ab.sh OUT_PREFIX ROUNDS \"SHAPES\" \"LABEL|TRAINER [FLAGS...]\"..."
prefix=${1:?$usage}
rounds=${2:?$usage}
shapes=${3:?$usage}
shift 3
[[ $# -ge 1 ]] || { echo "$usage" >&2; exit 2; }
for ((r = 1; r <= rounds; ++r)); do
  for shape in $shapes; do
    IFS=: read -r model batch ctx <<<"$shape"
    for variant in "$@"; do
      label=${variant%%|*}
      read -r -a cmd <<<"${variant#*|}"
      out=$("${cmd[@]}" --benchmark --device cuda --model "$model" --batch "$batch" --ctx "$ctx" \
        --warmup "${WARMUP:-5}" --steps "${STEPS:-20}" --csv "$prefix.$label.csv" 2>&1)
      rc=$?
      printf '%-6s %2s x %-5s %-8s rc %d | step %s | wall %s | optimizer %s | GPU %s\n' "$model" \
        "$batch" "$ctx" "$label" "$rc" "$(grep -E "step +[0-9.]+ ±" <<<"$out" | sed -E 's/.*step +//')" \
        "$(grep -E "wall +[0-9.]+ ms per step" <<<"$out" | sed -E 's/.*wall +([0-9.]+) ms.*/\1/')" \
        "$(grep -E "optimizer +[0-9.]+ ±" <<<"$out" | sed -E 's/.*optimizer +//')" \
        "$(grep -E " GPU +SM clock" <<<"$out" | sed -E 's/^.* GPU +(SM clock.*) \(rank 0.*$/\1/')"
    done
  done
done
