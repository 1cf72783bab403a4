#!/usr/bin/env bash
# Ours beside PyTorch on one machine and one lease, the way docs/performance.md ("Against PyTorch in
# the same lease") compares them, and the table with the ratios:
#
#   launch/side_by_side.sh BUILD_DIR OUT_DIR [CELL...]
#
# CELL is model:batch:ctx:torch_mode[:trainer flags], torch_mode one of launch/torch_step_bench.py's
# (eager, compile, reduce-overhead). Without cells: the issue's three, plus 2.7B with
# --update-sms 0 (every SM to forward's GEMMs; the default, auto, leaves 24 to the update there).
# Order: ours on every cell, PyTorch once per distinct (model, batch, ctx, mode), ours again, so
# that drift shows as a spread between ours' two runs. Then launch/side_by_side.py OUT_DIR prints
# the table.
#
# Env: DEVICE (cuda), WARMUP (5), STEPS (20, ours; PyTorch takes 15 after 5 as ANCHORS.md did),
# PASSES (2; 1 runs ours only before PyTorch, when device time is short),
# TORCH=0 skips PyTorch (also skipped, with a note, when torch is not importable). Exits 1 when
# a run of ours failed (its last lines are in the log), 2 for a bad argument.
# Files: OUT_DIR/ours_<label>.csv (one per set of trainer flags, the label made of them; "default"
# for none) with the flags in OUT_DIR/ours_<label>.flags, OUT_DIR/torch.csv, OUT_DIR/log.txt.
set -uo pipefail
usage="usage: side_by_side.sh BUILD_DIR OUT_DIR [model:batch:ctx:torch_mode[:flags]...]"
build=${1:?$usage}
out=${2:?$usage}
shift 2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cells=("$@")
if [[ ${#cells[@]} -eq 0 ]]; then
  cells=("small:4:512:reduce-overhead" "small:16:1024:compile" "2.7B:4:512:compile"
         "2.7B:4:512:compile:--update-sms 0")
fi
[[ ${PASSES:-2} =~ ^[12]$ ]] || { echo "side_by_side.sh: PASSES must be 1 or 2" >&2; exit 2; }
device=${DEVICE:-cuda}
warmup=${WARMUP:-5}
steps=${STEPS:-20}
[[ -x $build/trainer ]] || { echo "side_by_side.sh: no trainer in $build" >&2; exit 2; }
for cell in "${cells[@]}"; do
  IFS=: read -r model batch ctx mode flags <<<"$cell"
  if [[ -z $model || ! $batch =~ ^[0-9]+$ || ! $ctx =~ ^[0-9]+$ ||
        ! $mode =~ ^(eager|compile|reduce-overhead)$ ]]; then
    echo "side_by_side.sh: bad cell '$cell' (model:batch:ctx:eager|compile|reduce-overhead[:flags])" >&2
    exit 2
  fi
done
mkdir -p "$out"
log=$out/log.txt
failed=0

ours() {  # one run of every cell
  for cell in "${cells[@]}"; do
    IFS=: read -r model batch ctx mode flags <<<"$cell"
    read -r -a extra <<<"$flags"
    label=$(tr -c 'A-Za-z0-9.\n' '_' <<<"${flags:-default}" | sed 's/^_*//')
    printf '%s\n' "$flags" > "$out/ours_$label.flags"
    res=$("$build/trainer" --benchmark --device "$device" --model "$model" --batch "$batch" \
      --ctx "$ctx" --warmup "$warmup" --steps "$steps" "${extra[@]}" --csv "$out/ours_$label.csv" 2>&1)
    rc=$?
    printf 'ours  %-6s %3s x %-5s %-20s rc %d | %s\n' "$model" "$batch" "$ctx" "${flags:-}" "$rc" \
      "$(grep -E "step +[0-9.]+ ±" <<<"$res" | sed -E 's/.*step +//')" | tee -a "$log"
    [[ $rc -eq 0 ]] || { echo "$res" | tail -5 | tee -a "$log"; failed=1; }
  done
}

ours
if [[ ${TORCH:-1} != 0 ]] && python3 -c "import torch" 2>/dev/null; then
  declare -A done_cells=()
  for cell in "${cells[@]}"; do
    IFS=: read -r model batch ctx mode flags <<<"$cell"
    key=$model:$batch:$ctx:$mode
    [[ -n ${done_cells[$key]:-} ]] && continue
    done_cells[$key]=1
    python3 "$root/launch/torch_step_bench.py" --model "$model" --batch "$batch" --ctx "$ctx" \
      --mode "$mode" --csv "$out/torch.csv" 2>&1 | tail -1 | sed 's/^/torch /' | tee -a "$log"
  done
else
  echo "PyTorch skipped (TORCH=0 or torch not importable)" | tee -a "$log"
fi
[[ ${PASSES:-2} == 1 ]] || ours
python3 "$root/launch/side_by_side.py" "$out" || failed=1
exit $failed
