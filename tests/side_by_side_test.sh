#!/usr/bin/env bash
# launch/side_by_side.sh and its table (launch/side_by_side.py) without a GPU: the CPU backend on
# the tiny model with PyTorch skipped runs every cell twice and tabulates them; given PyTorch rows,
# the table's ratios are PyTorch's best time over each of ours; PASSES=1 runs ours once; bad
# cells, a bad PASSES, TORCH_STEPS or TORCH_WARMUP, a failing run and an empty directory are errors.
# Usage: side_by_side_test.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: side_by_side_test.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$(dirname "$0")/script_harness.sh"
sbs() { DEVICE=cpu TORCH=0 WARMUP=0 STEPS=2 bash "$root/launch/side_by_side.sh" "$build" "$@"; }

# 1. Two cells, ours twice each, one table line per set of flags.
out=$(sbs "$tmp/a" "tiny:2:32:compile" "tiny:2:32:compile:--lr 1e-3" 2>&1)
rc=$?
[[ $rc -eq 0 ]] && ok "CPU run exits 0" || fail "CPU run exit $rc: $out"
for f in default lr_1e_3; do
  rows=$(($(wc -l < "$tmp/a/ours_$f.csv") - 1))
  [[ $rows -eq 2 ]] && ok "ours_$f.csv has 2 runs" || fail "ours_$f.csv has $rows runs"
done
grep -qE '^\| tiny \| 2×32 \|  \| [0-9.]+, [0-9.]+ \| — \| — \|$' <<<"$out" &&
  ok "default line without PyTorch" || fail "no default line in: $out"
grep -qF '| tiny | 2×32 | `--lr 1e-3` |' <<<"$out" && ok "flags line" || fail "no flags line"

# One pass only (PASSES=1): one run per cell.
PASSES=1 sbs "$tmp/p" "tiny:2:32:compile" > /dev/null 2>&1
rows=$(($(wc -l < "$tmp/p/ours_default.csv") - 1))
[[ $rows -eq 1 ]] && ok "PASSES=1: one run" || fail "PASSES=1: $rows runs"

# 2. Ratios: PyTorch's best mode over each of ours, slowest run first.
mkdir -p "$tmp/b"
head -1 "$tmp/a/ours_default.csv" > "$tmp/b/ours_default.csv"
python3 - "$tmp/a/ours_default.csv" "$tmp/b/ours_default.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
w = csv.DictWriter(open(sys.argv[2], "a", newline=""), fieldnames=rows[0].keys())
for ms in ("5.0", "4.0"):
    rows[0]["step_median_ms"] = ms
    w.writerow(rows[0])
PY
printf '%s\n' 'time,torch,mode,model,batch,ctx,warmup,steps,step_median_ms,step_min_ms,step_max_ms,tokens_per_s' \
  '1,2.11,compile,tiny,2,32,5,15,10.0,9.9,10.1,1' '2,2.11,eager,tiny,2,32,5,15,20.0,19.9,20.1,1' \
  '3,2.11,compile,tiny,4,32,5,15,1.0,1.0,1.0,1' > "$tmp/b/torch.csv"
table=$(python3 "$root/launch/side_by_side.py" "$tmp/b")
want='| tiny | 2×32 |  | 5.00, 4.00 | 10.00 (`compile`), 20.00 (`eager`) | 2.00–2.50× |'
grep -qxF "$want" <<<"$table" && ok "ratios $want" || fail "ratios: $table"

# Each run's label and times, for the clock table; the steps each side timed under the table.
labels=$(cut -f1 "$tmp/a/runs.txt" | sort | uniq -c | sed 's/^ *//')
[[ $labels == $'2 ours tiny 2×32\n2 ours tiny 2×32 --lr 1e-3' ]] && ok "runs.txt labels" ||
  fail "runs.txt labels: $labels"
grep -qxF "Medians of ours 2 steps after 0; PyTorch 15 steps after 5." <<<"$table" &&
  ok "steps timed under the table" || fail "steps timed: $table"

# The clock table from runs.txt and nvidia-smi's samples: busy samples only (utilization >= 50),
# a cut-off last line ignored, a run without busy samples shown empty.
printf 'ours tiny 2×32\t2026/11/26 21:50:00.000\t2026/11/26 21:50:01.000\n' > "$tmp/b/runs.txt"
printf 'torch tiny 2×32 compile\t2026/11/26 21:50:02.000\t2026/11/26 21:50:03.000\n' >> "$tmp/b/runs.txt"
printf '%s\n' '2026/11/26 21:50:00.100, 95, 1500, 690.1, 50' '2026/11/26 21:50:00.150, 10, 1980, 100.0, 49' \
  '2026/11/26 21:50:00.200, 97, 1620, 692.0, 52' '2026/11/26 21:50:00.250, 99, 1560, 693.5, 51' \
  '2026/11/26 21:50:02.500, 20, 1980, 90.0, 45' '2026/11/26 21:50:0' > "$tmp/b/gpu_samples.csv"
table=$(python3 "$root/launch/side_by_side.py" "$tmp/b")
grep -qxF '| ours tiny 2×32 | 3 | 1560 | 692 | 50–52 |' <<<"$table" && ok "clock table: busy medians" ||
  fail "clock table: $table"
grep -qxF '| torch tiny 2×32 compile | 0 | — | — | — |' <<<"$table" && ok "clock table: idle run" ||
  fail "clock table (idle run): $table"
grep -qxF '| run | busy samples | SM clock MHz | power W | temperature °C |' <<<"$table" &&
  ok "clock table: power column unnamed without gpu_samples.power" || fail "power column: $table"
echo power.draw.instant > "$tmp/b/gpu_samples.power"
table=$(python3 "$root/launch/side_by_side.py" "$tmp/b")
grep -qxF '| run | busy samples | SM clock MHz | power W (instantaneous) | temperature °C |' \
  <<<"$table" && ok "clock table: the instantaneous power named" || fail "power column: $table"

# 3. Errors: a bad cell (exit 2, nothing run), a failing run (exit 1), no rows (exit non-zero).
out=$(sbs "$tmp/c" "tiny:2:32:fast" 2>&1)
rc=$?
[[ $rc -eq 2 && $out == *"bad cell 'tiny:2:32:fast'"* && ! -e $tmp/c ]] &&
  ok "bad cell: exit 2, named" || fail "bad cell: exit $rc: $out"
out=$(sbs "$tmp/d" "tiny:2:32:compile:--lr -1" 2>&1)
rc=$?
[[ $rc -eq 1 && $out == *"--lr"* ]] && ok "failing run: exit 1, its error shown" ||
  fail "failing run: exit $rc: $out"
out=$(PASSES=3 sbs "$tmp/f" "tiny:2:32:compile" 2>&1)
rc=$?
[[ $rc -eq 2 && $out == *"PASSES must be 1 or 2"* ]] && ok "PASSES=3: exit 2" ||
  fail "PASSES=3: exit $rc: $out"
for bad in "TORCH_STEPS=0" "TORCH_STEPS=x" "TORCH_WARMUP=-1"; do
  out=$(export "$bad"; sbs "$tmp/g" "tiny:2:32:compile" 2>&1)
  rc=$?
  [[ $rc -eq 2 && $out == *"${bad%%=*} must be"* && ! -e $tmp/g ]] && ok "$bad: exit 2, named" ||
    fail "$bad: exit $rc: $out"
done
mkdir -p "$tmp/e"
out=$(python3 "$root/launch/side_by_side.py" "$tmp/e" 2>&1)
rc=$?
[[ $rc -ne 0 && $out == *"no ours_*.csv rows"* ]] && ok "empty directory: error" ||
  fail "empty directory: exit $rc: $out"

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
