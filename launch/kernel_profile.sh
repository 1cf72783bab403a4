#!/usr/bin/env bash
# Per-kernel GPU time of one training step, measured by Nsight Compute (each kernel timed alone,
# so the sum leaves out the gaps between kernels), grouped by kernel:
#   launch/kernel_profile.sh BUILD_DIR OUT_PREFIX [trainer flags...]
# Runs `trainer --benchmark --warmup 0 --steps 2` under ncu and keeps the second step (the kernels
# after the first AdamW launch up to the second). Writes OUT_PREFIX.csv (raw ncu rows) and
# prints the table of launch/kernel_table.py.
set -euo pipefail
build=${1:?usage: kernel_profile.sh BUILD_DIR OUT_PREFIX [trainer flags...]}
out=${2:?usage: kernel_profile.sh BUILD_DIR OUT_PREFIX [trainer flags...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
  --launch-count "${LAUNCH_COUNT:-4000}" --log-file "$out.csv" \
  "$build/trainer" --benchmark --device cuda --warmup 0 --steps 2 "$@" >"$out.log" 2>&1
python3 "$here/kernel_table.py" "$out.csv"
