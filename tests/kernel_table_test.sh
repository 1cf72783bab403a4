#!/usr/bin/env bash
# launch/kernel_table.py on a hand-made Nsight Compute log (no GPU): the step runs from the end of
# the first update to the end of the second, whether each update is one AdamW launch or a run of
# them, and the phase sums split forward (up to the cross-entropy kernel), backward, the gradient
# norm's sums beside it and the update.
#   tests/kernel_table_test.sh BUILD_DIR   (the build directory is not used)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/tests/script_harness.sh"

# An ncu --csv --page raw log: its own unquoted messages, a header, a units row, then one row per
# kernel (durations in ns, with thousands separators as ncu writes them).
log() {
  echo "==PROF== Connected to process 1"
  echo '"ID","Kernel Name","gpu__time_duration.sum"'
  echo '"","","nsecond"'
  local i=0
  for k in "$@"; do
    echo "\"$i\",\"void ${k%%=*}(int)\",\"${k#*=}\""
    i=$((i + 1))
  done
}
step=(embedding_forward=1,000 gemm=5,000 cross_entropy=2,000 gemm=6,000 sum_squares=500)
log init=9 "${step[@]}" adamw_vec4=3,000 "${step[@]}" adamw_vec4=4,000 tail=7 >"$tmp/one.csv"
log "${step[@]}" adamw_vec4=1,000 adamw_vec4=1,000 "${step[@]}" adamw_vec4=2,000 \
  adamw_vec4=2,000 adamw_vec4=1,000 "${step[@]}" >"$tmp/runs.csv"
log "${step[@]}" adamw_vec4=1,000 >"$tmp/short.csv"

out=$(python3 "$root/launch/kernel_table.py" "$tmp/one.csv" 2>&1)
[[ $out == *"kernels in the step: 6, their GPU time alone: 0.018 ms"* ]] &&
  ok "one launch per update: the second step" || fail "one launch per update: $out"
[[ $out == *"forward 3 kernels 0.008 ms | backward 1 kernels 0.006 ms (+ 1 norm sums 0.001 ms beside it) | optimizer 1 launches 0.004 ms"* ]] &&
  ok "one launch per update: phases" || fail "one launch per update phases: $out"

out=$(python3 "$root/launch/kernel_table.py" "$tmp/runs.csv" 2>&1)
[[ $out == *"kernels in the step: 8, their GPU time alone: 0.019 ms"* ]] &&
  ok "a run of launches per update: the second step" || fail "runs: $out"
[[ $out == *"| optimizer 3 launches 0.005 ms"* ]] && ok "a run of launches: one optimizer" ||
  fail "runs, optimizer: $out"
[[ $out == *"0.005  25.6%      3  adamw_vec4"* ]] && ok "a run of launches: grouped by name" ||
  fail "runs, table: $out"

out=$(python3 "$root/launch/kernel_table.py" "$tmp/short.csv" 2>&1)
rc=$?
[[ $rc -ne 0 && $out == *"fewer than two AdamW updates (1)"* ]] && ok "one update: error" ||
  fail "one update: exit $rc: $out"

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
