#!/usr/bin/env bash
# launch/floors_table.py on hand-made benchmark CSV rows (no GPU): the floors table, and with
# --cap the parts in joules at the power cap (rows without --floors-at-cap left out), and a file
# written before the cap's columns refused with --cap.
#   tests/floors_table_test.sh BUILD_DIR   (the build directory is not used)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/tests/script_harness.sh"

cols=model,batch,ctx,forward_ms,backward_ms,optimizer_ms,forward_floor_ms,backward_floor_ms,optimizer_floor_ms,gemm_forward_ms,gemm_backward_ms,step_median_ms,copy_gb_s,power_w
cap=step_j,cap_limit_w,cap_gemm_j,cap_attention_j,cap_elementwise_j,cap_optimizer_j,cap_parts_j
{
  echo "$cols,$cap"
  # 10 + 20 + 1 ms against floors 8 + 16 + 1; at the cap 14 + 3 + 2 + 1 = 20 J = 28.57 ms at
  # 700 W, the step 30 ms at 693 W = 20.79 J.
  echo "small,16,1024,10,20,1,8,16,1,6,12,30,4150,693,20.79,700,14,3,2,1,20"
  # A run without --floors-at-cap: zeros in the cap's columns.
  echo "xl,4,512,17,35,14,15,32,14,13,26,66,4170,690,45.5,0,0,0,0,0,0"
} >"$tmp/rows.csv"
echo "$cols" >"$tmp/old.csv"
echo "small,16,1024,10,20,1,8,16,1,6,12,30,4150,693" >>"$tmp/old.csv"

out=$(python3 "$root/launch/floors_table.py" "$tmp/rows.csv" 2>&1)
[[ $out == *"| small | 16×1024 | 10.00 (8.00, 1.25×) | 20.00 (16.00, 1.25×) | 1.00 (1.00, 1.00×) | 6.00 / 12.00 | 30.00 | 25.00 | 4150 |"* ]] &&
  ok "floors: the small row" || fail "floors: $out"
[[ $(grep -c '^| xl' <<<"$out") -eq 1 ]] && ok "floors: every run" || fail "floors rows: $out"

out=$(python3 "$root/launch/floors_table.py" --cap "$tmp/rows.csv" 2>&1)
[[ $out == *"| small | 16×1024 | 14.00 (70%) | 3.00 | 2.00 | 1.00 | 20.00 | 28.57 at 700 W | 30.00 (693 W) | 1.04× |"* ]] &&
  ok "at the cap: the small row" || fail "at the cap: $out"
[[ $out != *"| xl"* ]] && ok "at the cap: a run without the flag left out" || fail "xl: $out"

out=$(python3 "$root/launch/floors_table.py" --cap "$tmp/old.csv" 2>&1)
rc=$?
[[ $rc -ne 0 && $out == *"has no cap_parts_j column"* ]] && ok "an older file: refused" ||
  fail "older file: exit $rc: $out"
out=$(python3 "$root/launch/floors_table.py" 2>&1)
rc=$?
[[ $rc -ne 0 && $out == *"usage: floors_table.py [--cap] results.csv"* ]] && ok "no file: usage" ||
  fail "usage: exit $rc: $out"

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
