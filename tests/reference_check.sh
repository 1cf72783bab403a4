#!/usr/bin/env bash
# Cross-checks of the whole trainer: (1) its validation loss on the weights it wrote equals an
# independent float64 NumPy implementation of SPEC.md reading model.safetensors by name;
# (2) `mpirun -np 1 trainer ...` trains exactly like `trainer ...`. Usage: reference_check.sh BUILD
set -uo pipefail
build=${1:?usage: reference_check.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 30000 /dev/urandom | base64 > "$tmp/text.txt"
"$build/launch/tokenize" --out-train "$tmp/train.npy" --out-val "$tmp/val.npy" --val-fraction 0.2 \
  "$tmp/text.txt" > /dev/null || exit 1
args=(--device cpu --d-model 32 --d-ff 48 --layers 2 --heads 4 --vocab 256 --ctx 12 --batch 3
      --steps 4 --lr 1e-2 --data "$tmp/train.npy" --val-data "$tmp/val.npy" --eval-batches 2
      --log-every 1)
passed=0 failed=0
"$build/trainer" "${args[@]}" --out "$tmp/a" > "$tmp/a.log" 2>&1 || { cat "$tmp/a.log"; exit 1; }
val=$(grep -o '"val_loss":[0-9.e+-]*' "$tmp/a/metrics.jsonl" | tail -1 | cut -d: -f2)
python3 "$here/numpy_reference.py" "$tmp/a/model.safetensors" "$tmp/val.npy" --layers 2 --heads 4 \
  --ctx 12 --rows 3 --batches 2 --expect "$val"
rc=$?
if [[ $rc -eq 77 ]]; then echo "numpy or safetensors missing: reference check skipped"; exit 77; fi
if [[ $rc -eq 0 ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

mpirun --oversubscribe -np 1 "$build/trainer" "${args[@]}" --out "$tmp/b" > "$tmp/b.log" 2>&1
if cmp -s <(grep -o '"loss":[^,]*' "$tmp/a/metrics.jsonl") <(grep -o '"loss":[^,]*' "$tmp/b/metrics.jsonl") &&
   cmp -s "$tmp/a/model.safetensors" "$tmp/b/model.safetensors"; then
  echo "mpirun -np 1: identical losses and weights"
  passed=$((passed + 1))
else
  echo "FAIL: mpirun -np 1 differs from a plain run"; failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
