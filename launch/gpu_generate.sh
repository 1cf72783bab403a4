#!/usr/bin/env bash
# On a GPU machine with a prebuilt tree: the README's main job on one GPU, then generation speed.
#   launch/gpu_generate.sh BUILD_DIR DATA_DIR OUT_DIR
# DATA_DIR holds what launch/prepare_text.py wrote for the fortunes corpus (train.npy, val.npy,
# tokenizer.json, meta.json), made elsewhere when the GPU machine lacks Python's tokenizers.
#   1. trains demo.sh's GPU model on it and prints greedy and sampled text from the GPU (bf16,
#      fp32) and the CPU decoder;
#   2. times decoding (tokens/s after the prompt, 3 runs of 256 new tokens without stopping) for
#      the demo model and for the small and xl presets (weights from one training step).
# Logs go to OUT_DIR; one line per measurement on stdout.
set -uo pipefail
build=${1:?usage: gpu_generate.sh BUILD_DIR DATA_DIR OUT_DIR}
data=${2:?usage: gpu_generate.sh BUILD_DIR DATA_DIR OUT_DIR}
out=${3:?usage: gpu_generate.sh BUILD_DIR DATA_DIR OUT_DIR}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
vocab=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
  "$data/meta.json")
run=/tmp/gen_demo
"$build/trainer" --model tiny --d-model 384 --d-ff 1536 --layers 6 --heads 6 --ctx 256 \
  --batch 32 --steps 600 --lr 1e-3 --warmup 100 --eval-every 200 --log-every 100 --vocab "$vocab" \
  --data "$data/train.npy" --val-data "$data/val.npy" --out "$run" --overwrite \
  >"$out/demo_train.log" 2>&1
echo "demo training: exit $?; $(grep -E 'validation loss' "$out/demo_train.log" | tail -1)"
cp "$data/tokenizer.json" "$run/" 2>/dev/null
for dev in "cuda --precision bf16" "cuda --precision fp32" "cpu"; do
  # shellcheck disable=SC2086
  text=$("$build/generate" --model "$run" --device $dev --temperature 0 --max-new-tokens 60 \
    --prompt "The meaning of life is" 2>>"$out/demo_generate.log")
  printf 'greedy, %s: %q\n' "$dev" "$text"
done
"$build/generate" --model "$run" --samples 3 --temperature 0.8 --max-new-tokens 120 \
  2>>"$out/demo_generate.log" | tee "$out/demo_samples.txt"

speed() {  # speed NAME MODEL_DIR DEVICE_ARGS...: three timed runs of 256 new tokens
  local name=$1 model=$2
  shift 2
  for i in 1 2 3; do
    "$build/generate" --model "$model" --tokenizer bytes --prompt "Once upon a time" \
      --max-new-tokens 256 --no-stop --seed "$i" "$@" 2>&1 >/dev/null |
      grep -oE '[0-9.]+ tokens/s' | sed "s|^|$name $* run $i: |"
  done
}
speed demo "$run" --device cuda --precision bf16
speed demo "$run" --device cuda --precision fp32
speed demo "$run" --device cpu
for preset in small xl; do
  "$build/trainer" --model "$preset" --vocab 50304 --ctx 1024 --batch 1 --steps 1 \
    --data "$data/train.npy" --out "/tmp/gen_$preset" --overwrite \
    >"$out/${preset}_train.log" 2>&1 ||
    { echo "$preset: training failed"; tail -3 "$out/${preset}_train.log"; continue; }
  speed "$preset" "/tmp/gen_$preset" --device cuda --precision bf16
  speed "$preset" "/tmp/gen_$preset" --device cuda --precision fp32
  rm -rf "/tmp/gen_$preset"
done
