#!/usr/bin/env bash
# The main job: from text to a model you can talk to.
#   1. install what is missing and build;
#   2. train a byte-level BPE tokenizer (vocab 4096) on the `fortunes` package's text, one
#      document per fortune, and write the token files (launch/prepare_text.py);
#   3. train a model on them: on the GPU when there is one (6 blocks of width 384, 600 steps of
#      32 x 256 tokens), else on the CPU backend (the tiny preset, 300 steps of 8 x 128);
#   4. print three samples (build/generate) and export a Hugging Face folder
#      (launch/export_hf.py) that transformers loads as LlamaForCausalLM.
# Everything lands in runs/demo (OUT_DIR), which a second run replaces; the data in data/fortunes.
# Extra arguments go to the trainer.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
out=${OUT_DIR:-$root/runs/demo}
data=$root/data/fortunes
"$root/launch/install_deps.sh"
BUILD_DIR=$build "$root/launch/build.sh"

corpus=${FORTUNES_DIR:-/usr/share/games/fortunes}
mapfile -t files < <(find "$corpus" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' |
  LC_ALL=C sort)
((${#files[@]} > 0)) || {
  echo "demo.sh: no fortune text files under $corpus (apt-get install fortunes)" >&2
  exit 2
}
if [[ ! -f $data/meta.json ]]; then
  python3 "$root/launch/prepare_text.py" --out "$data" --vocab-size 4096 --doc-separator % \
    --overwrite "${files[@]}"
fi
vocab=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
  "$data/meta.json")

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The larger model when the trainer will run on a GPU: one is visible and the build has CUDA.
if nvidia-smi -L >/dev/null 2>&1 && ldd "$build/trainer" | grep -q cublasLt; then
  model=(--model tiny --d-model 384 --d-ff 1536 --layers 6 --heads 6 --ctx 256 --batch 32
         --steps 600 --lr 1e-3 --warmup 100 --eval-every 200 --log-every 100)
else
  model=(--model tiny --ctx 128 --batch 8 --steps 300 --lr 3e-3 --warmup 20 --eval-every 100
         --log-every 50)
fi
"$build/trainer" "${model[@]}" --vocab "$vocab" --data "$data/train.npy" \
  --val-data "$data/val.npy" --out "$out" --overwrite "$@"

echo
echo "=== three samples (build/generate --model $out --samples 3) ==="
"$build/generate" --model "$out" --samples 3 --temperature 0.8 --max-new-tokens 120

echo
python3 "$root/launch/export_hf.py" "$out" "$out/hf" --overwrite  # the tokenizer: the run's copy
echo "Hugging Face folder: $out/hf (transformers: AutoModelForCausalLM.from_pretrained)"
echo "More text: $build/generate --model $out --prompt 'Your text' --samples 3"
