#!/usr/bin/env bash
# On a 2-GPU machine with a prebuilt tree: the data-parallel benchmark (xl 4x512, plan
# launch/plans/ddp.txt), traces of the bucketed runs with their overlap summaries, and (with a
# DATA_DIR) the PyTorch load check of a GPU-trained checkpoint.
#   launch/gpu_ddp.sh BUILD_DIR OUT_DIR [DATA_DIR]
set -uo pipefail
build=${1:?usage: gpu_ddp.sh BUILD_DIR OUT_DIR [DATA_DIR]}
out=${2:?usage: gpu_ddp.sh BUILD_DIR OUT_DIR [DATA_DIR]}
data=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"
"$root/launch/bench_ddp.sh" "$build" "$out/ddp.csv" xl 4 512
python3 "$root/launch/bench_table.py" "$out/ddp.csv"
for variant in "nccl 25" "ce 100"; do
  read -r transport mb <<<"$variant"
  trace="$out/trace_xl_bucketed${mb}_$transport.json"
  echo "== trace: 2 GPUs, bucketed $mb MiB, --grad-transport $transport"
  mpirun --oversubscribe --bind-to none -np 2 "$build/trainer" --benchmark --device cuda \
    --model xl --batch 4 --ctx 512 --warmup 3 --steps 4 --bucket-mb "$mb" \
    --grad-transport "$transport" --trace "$trace" 2>&1 | grep -E "trace|step +[0-9.]+ ±"
  python3 "$root/launch/trace_overlap.py" "$trace"
done
[[ -n "$data" ]] || exit 0
echo "== PyTorch loads a GPU-trained checkpoint"
"$build/trainer" --precision fp32 --d-model 64 --d-ff 160 --layers 2 --heads 4 --vocab 256 \
  --ctx 64 --batch 4 --steps 50 --lr 3e-3 --data "$data/fortunes_train.npy" \
  --val-data "$data/fortunes_val.npy" --eval-batches 2 --out /tmp/tl --overwrite > /tmp/tl.log 2>&1
val=$(grep -o '"val_loss":[0-9.e+-]*' /tmp/tl/metrics.jsonl | tail -1 | cut -d: -f2)
python3 "$root/launch/torch_load_check.py" /tmp/tl/model.safetensors "$data/fortunes_val.npy" \
  --vocab 256 --d-model 64 --d-ff 160 --layers 2 --heads 4 --ctx 64 --rows 4 --batches 2 --expect "$val"
