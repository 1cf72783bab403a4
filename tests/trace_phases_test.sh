#!/usr/bin/env bash
# launch/trace_phases.py on a hand-made --kernel-trace CSV (no GPU): forward runs from the
# embedding's forward to the end of the cross-entropy, backward from there to the embedding's
# backward; kernels are grouped as GEMMs, attention and elementwise, idle time is what no kernel of
# the compute stream covers, and the other streams' kernels are summed by name. A step without its
# backward is left out; a trace without the embedding's forward is an error.
#   tests/trace_phases_test.sh BUILD_DIR   (the build directory is not used)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/tests/script_harness.sh"

# One step at offset $1 µs: compute stream 7, the norm's sums on 8, AdamW on 9.
step() {
  local t=$1
  cat <<ROWS
0,7,$((t + 0)),10,"trainer::cuda::embedding_forward_kernel<__nv_bfloat16, 8>"
0,9,$((t + 20)),100,"trainer::cuda::adamw_vec4_kernel<__nv_bfloat16, trainer::cuda::F32Grad, float>"
0,7,$((t + 12)),100,"nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN"
0,7,$((t + 112)),50,"trainer::cuda::flash::tmafwd::flash_tma_fwd_kernel<64, true>"
0,7,$((t + 170)),10,"trainer::cuda::rope_kernel<__nv_bfloat16, 8, 4>"
0,7,$((t + 180)),50,"trainer::cuda::cross_entropy_kernel<__nv_bfloat16, 8, true>"
0,7,$((t + 240)),200,"nvjet_sm90_tss_192x192_64x3_1x2_h_bz_coopB_NTN"
0,8,$((t + 300)),50,"trainer::cuda::sum_squares_partials_kernel<true, trainer::cuda::F32Grad>"
0,7,$((t + 440)),100,"trainer::cuda::flash::wgbwd::flash_wgmma_bwd_kernel<64>"
0,7,$((t + 540)),20,"trainer::cuda::rmsnorm_backward_fused_kernel<__nv_bfloat16, 8>"
0,7,$((t + 560)),10,"trainer::cuda::embedding_backward_kernel<__nv_bfloat16, 8>"
ROWS
}
{
  echo "step,stream,start_us,duration_us,kernel"
  step 0
  step 1000
  echo '0,7,2000,10,"trainer::cuda::embedding_forward_kernel<__nv_bfloat16, 8>"'
} >"$tmp/trace.csv"
gzip -c "$tmp/trace.csv" >"$tmp/trace.csv.gz"

for f in trace.csv trace.csv.gz; do
  out=$(python3 "$root/launch/trace_phases.py" "$tmp/$f" 2>&1)
  [[ $out == "2 steps; medians in ms"* ]] && ok "$f: two whole steps" || fail "$f steps: $out"
  [[ $out == *"forward: 0.23 ms, 5 kernels"* && $out == *"backward: 0.33 ms, 4 kernels"* ]] &&
    ok "$f: phase spans and kernel counts" || fail "$f spans: $out"
  [[ $out == *"GEMMs          0.10  (nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN 0.10)"* &&
     $out == *"attention      0.05  (flash_tma_fwd_kernel 0.05)"* &&
     $out == *"elementwise    0.07  (cross_entropy_kernel 0.05)"* ]] &&
    ok "$f: forward's groups" || fail "$f forward groups: $out"
  [[ $out == *"idle           0.01"* && $out == *"idle           0.00"* ]] &&
    ok "$f: idle time (forward 10 us, backward none)" || fail "$f idle: $out"
  [[ $out == *"beside, on other streams: adamw_vec4_kernel 0.10, sum_squares_partials_kernel 0.05"* ]] &&
    ok "$f: the other streams" || fail "$f beside: $out"
done

grep -v embedding_forward "$tmp/trace.csv" >"$tmp/none.csv"
out=$(python3 "$root/launch/trace_phases.py" "$tmp/none.csv" 2>&1)
rc=$?
[[ $rc -ne 0 && $out == *"no embedding forward kernel in the trace"* ]] &&
  ok "no embedding forward: error" || fail "no embedding forward: exit $rc: $out"

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
