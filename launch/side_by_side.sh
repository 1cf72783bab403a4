#!/usr/bin/env bash
# Ours beside PyTorch on one machine and one lease, the way docs/performance.md ("Against PyTorch in
# the same lease") compares them, and the table with the ratios:
#
#   launch/side_by_side.sh BUILD_DIR OUT_DIR [CELL...]
#
# CELL is model:batch:ctx:torch_mode[:trainer flags], torch_mode one of launch/torch_step_bench.py's
# (eager, compile, reduce-overhead). Without cells: the issue's three, plus 2.7B with
# --update-sms 0 (every SM to forward's GEMMs; the default, auto, leaves 32 to the update there).
# Order: ours on every cell, PyTorch once per distinct (model, batch, ctx, mode), ours again, so
# that drift shows as a spread between ours' two runs. Then launch/side_by_side.py OUT_DIR prints
# the table.
#
# Env: DEVICE (cuda), WARMUP (5), STEPS (20, ours), TORCH_WARMUP (5), TORCH_STEPS (15, as
# ANCHORS.md measured PyTorch), PASSES (2; 1 runs ours only before PyTorch, when device time is
# short), GPU_SAMPLES (1: with nvidia-smi on the cuda device, every run's SM clock and power are
# sampled every 50 ms, and the table's second part gives their medians while the GPU is busy; the
# power is the board's instantaneous draw where nvidia-smi has power.draw.instant, else
# power.draw, on recent drivers an average over a second).
# An H100 or H200 reaches its 700 W cap within a second of load and then lowers its clocks, so
# the default windows (about 0.5 s of small's steps) see the cap's onset; STEPS=300
# TORCH_STEPS=300 measure both sides held at the cap, as a long training run is.
# TORCH=0 skips PyTorch (also skipped, with a note, when torch is not importable). Exits 1 when
# a run of ours failed (its last lines are in the log), 2 for a bad argument.
# Files: OUT_DIR/ours_<label>.csv (one per set of trainer flags, the label made of them; "default"
# for none) with the flags in OUT_DIR/ours_<label>.flags, OUT_DIR/torch.csv, OUT_DIR/log.txt,
# OUT_DIR/runs.txt (each run's label, start and end), OUT_DIR/gpu_samples.csv and
# OUT_DIR/gpu_samples.power (the nvidia-smi field of the samples' power).
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
[[ ${TORCH_STEPS:-15} =~ ^[1-9][0-9]*$ ]] ||
  { echo "side_by_side.sh: TORCH_STEPS must be a positive integer" >&2; exit 2; }
[[ ${TORCH_WARMUP:-5} =~ ^[0-9]+$ ]] ||
  { echo "side_by_side.sh: TORCH_WARMUP must be an integer >= 0" >&2; exit 2; }
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
runs=$out/runs.txt  # label, start and end of every run, in nvidia-smi's timestamp format
: > "$runs"
sampler=
stamp() { date '+%Y/%m/%d %H:%M:%S.%3N'; }
if [[ ${GPU_SAMPLES:-1} != 0 && $device == cuda ]] && command -v nvidia-smi > /dev/null; then
  visible=${CUDA_VISIBLE_DEVICES:-0}
  # The board's power now where nvidia-smi knows the field; power.draw, its one-second average on
  # recent drivers, trails the load through a 20-step window.
  power=power.draw
  nvidia-smi --query-gpu=power.draw.instant --format=csv,noheader > /dev/null 2>&1 &&
    power=power.draw.instant
  echo "$power" > "$out/gpu_samples.power"  # which one the table's power column is
  nvidia-smi -i "${visible%%,*}" --format=csv,noheader,nounits -lms 50 \
    --query-gpu=timestamp,utilization.gpu,clocks.sm,$power,temperature.gpu \
    > "$out/gpu_samples.csv" 2> /dev/null &
  sampler=$!
  trap '[[ -n $sampler ]] && kill "$sampler" 2> /dev/null' EXIT
fi
timed() {  # timed LABEL CMD...: runs CMD, recording when it ran
  local start rc
  start=$(stamp)
  "${@:2}"
  rc=$?
  printf '%s\t%s\t%s\n' "$1" "$start" "$(stamp)" >> "$runs"
  return $rc
}

ours() {  # one run of every cell
  for cell in "${cells[@]}"; do
    IFS=: read -r model batch ctx mode flags <<<"$cell"
    read -r -a extra <<<"$flags"
    label=$(tr -c 'A-Za-z0-9.\n' '_' <<<"${flags:-default}" | sed 's/^_*//')
    printf '%s\n' "$flags" > "$out/ours_$label.flags"
    res=$(timed "ours $model $batch×$ctx${flags:+ $flags}" "$build/trainer" --benchmark \
      --device "$device" --model "$model" --batch "$batch" --ctx "$ctx" --warmup "$warmup" \
      --steps "$steps" "${extra[@]}" --csv "$out/ours_$label.csv" 2>&1)
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
    timed "torch $model $batch×$ctx $mode" python3 "$root/launch/torch_step_bench.py" \
      --model "$model" --batch "$batch" --ctx "$ctx" --mode "$mode" \
      --warmup "${TORCH_WARMUP:-5}" --steps "${TORCH_STEPS:-15}" --csv "$out/torch.csv" 2>&1 |
      tail -1 | sed 's/^/torch /' | tee -a "$log"
  done
else
  echo "PyTorch skipped (TORCH=0 or torch not importable)" | tee -a "$log"
fi
[[ ${PASSES:-2} == 1 ]] || ours
if [[ -n $sampler ]]; then
  kill "$sampler" 2> /dev/null
  wait "$sampler" 2> /dev/null
  sampler=
fi
python3 "$root/launch/side_by_side.py" "$out" || failed=1
exit $failed
