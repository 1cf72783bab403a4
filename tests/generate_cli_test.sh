#!/usr/bin/env bash
# build/generate from the command line, on the CPU: a byte-level model (--tokenizer bytes) and,
# when Python's tokenizers is installed, a BPE model whose tokenizer.json the trainer copied into
# the run directory. Checks that greedy output and seeded samples are reproducible, that seeds
# differ, that a run directory, its model.safetensors, a step_N checkpoint and (with
# export_hf.py's dependencies) a Hugging Face folder give the same greedy text, that the prompt
# is printed and the end-of-text token stops a sample, and that every bad input exits 2 with one
# line.
# Usage: generate_cli_test.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: generate_cli_test.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0 passed=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok   $*"; passed=$((passed + 1)); }
gen=(timeout 120 "$build/generate" --device cpu --quiet)

# expect CODE PATTERN CMD...: CMD exits with CODE and prints one line on stderr matching PATTERN
# (command-line parse errors: that line and CLI11's "Run with --help for more information.").
expect() {
  local want=$1 pattern=$2 err rc
  shift 2
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  local lines
  lines=$(grep -cv "^Run with --help" <<<"$err")
  if [[ $rc -eq $want ]] && grep -qE -- "$pattern" <<<"$err" && [[ $lines -eq 1 ]]; then
    ok "exit $want: $err"
  else
    fail "exit $rc (wanted $want, one line matching '$pattern'): ${*:2}"
    sed 's/^/    /' <<<"$err" | tail -5
  fi
}
same() {  # same NAME A B
  if [[ "$2" == "$3" ]]; then ok "$1"; else fail "$1: '$2' vs '$3'"; fi
}

# ---- a byte-level model: 30 steps on a small text -------------------------------------------
for i in $(seq 1 200); do echo "the cat sat on the mat number $i and the dog ran away"; done \
  >"$tmp/corpus.txt"
"$build/launch/tokenize" --out-train "$tmp/bytes_train.npy" --out-val "$tmp/bytes_val.npy" \
  "$tmp/corpus.txt" >/dev/null || fail "tokenize"
timeout 300 "$build/trainer" --device cpu --model tiny --vocab 256 --ctx 64 --batch 4 --steps 30 \
  --lr 3e-3 --warmup 5 --data "$tmp/bytes_train.npy" --save-every 30 --log-every 30 \
  --out "$tmp/run_bytes" >"$tmp/train.log" 2>&1 || { fail "training"; tail "$tmp/train.log"; }

greedy=$("${gen[@]}" --model "$tmp/run_bytes" --tokenizer bytes --prompt "the cat" \
  --temperature 0 --max-new-tokens 40)
[[ $? -eq 0 && $greedy == "the cat"* && ${#greedy} -ge 40 ]] && ok "greedy: '$greedy'" ||
  fail "greedy output '$greedy'"
same "greedy again" "$greedy" "$("${gen[@]}" --model "$tmp/run_bytes" --tokenizer bytes \
  --prompt "the cat" --temperature 0 --max-new-tokens 40)"
same "model.safetensors gives the run's text" "$greedy" "$("${gen[@]}" \
  --model "$tmp/run_bytes/model.safetensors" --tokenizer bytes --prompt "the cat" \
  --temperature 0 --max-new-tokens 40)"
same "step_30 gives the run's text" "$greedy" "$("${gen[@]}" --model "$tmp/run_bytes/step_30" \
  --tokenizer bytes --prompt "the cat" --temperature 0 --max-new-tokens 40)"
sample() { "${gen[@]}" --model "$tmp/run_bytes" --tokenizer bytes --prompt "the" \
  --temperature 1.2 --top-k 0 --max-new-tokens 60 "$@"; }
a=$(sample --seed 7)
same "seed 7 twice" "$a" "$(sample --seed 7)"
[[ "$a" != "$(sample --seed 8)" ]] && ok "seeds 7 and 8 differ" || fail "seeds 7 and 8 agree"
two=$(sample --seed 7 --samples 2)
grep -qF -- "--- sample 2 ---" <<<"$two" && grep -qF -- "${a#the}" <<<"$two" &&
  ok "--samples 2: the first is seed 7's" || fail "--samples 2: '$two'"

# ---- bad input: one line, exit 2 ------------------------------------------------------------
m=(--model "$tmp/run_bytes" --tokenizer bytes)
expect 2 "--model.*required" "${gen[@]}"
expect 2 "no such file" "${gen[@]}" --model "$tmp/nothing"
mkdir -p "$tmp/empty"
expect 2 "neither model.safetensors" "${gen[@]}" --model "$tmp/empty"
expect 2 "no tokenizer.json beside" "${gen[@]}" --model "$tmp/run_bytes"
expect 2 "tokenizer.json|cannot|No such" "${gen[@]}" --model "$tmp/run_bytes" \
  --tokenizer "$tmp/missing.json"
expect 2 "--top-p" "${gen[@]}" "${m[@]}" --top-p 0
expect 2 "--temperature" "${gen[@]}" "${m[@]}" --temperature -1
expect 2 "--top-k" "${gen[@]}" "${m[@]}" --top-k -3
expect 2 "--max-new-tokens" "${gen[@]}" "${m[@]}" --max-new-tokens 0
expect 2 "--device" "$build/generate" "${m[@]}" --device tpu
expect 2 "fp32" "${gen[@]}" "${m[@]}" --precision bf16
expect 2 "empty prompt needs an end-of-text" "${gen[@]}" "${m[@]}"
expect 2 "context is 64" "${gen[@]}" "${m[@]}" --prompt "$(head -c 200 "$tmp/corpus.txt")"
expect 2 "prompt-file" "${gen[@]}" "${m[@]}" --prompt-file "$tmp/none.txt"
python3 - "$tmp/foreign.safetensors" <<'PY' 2>/dev/null
import json, struct, sys
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")
PY
expect 2 "no model config" "${gen[@]}" --model "$tmp/foreign.safetensors" --tokenizer bytes
if [[ -x "$build/trainer" ]] && ! "$build/generate" --device cuda --model "$tmp/run_bytes" \
  --tokenizer bytes --prompt x --max-new-tokens 1 >/dev/null 2>&1; then
  expect 2 "CUDA|GPU" "$build/generate" --quiet --device cuda "${m[@]}" --prompt x
fi

# ---- a BPE model: the tokenizer found beside the run, stop at end-of-text -------------------
if python3 -c "import tokenizers, numpy" 2>/dev/null; then
  for i in $(seq 1 300); do printf 'Fortune %d says: be kind.\n%%\n' "$i"; done >"$tmp/docs.txt"
  python3 "$root/launch/prepare_text.py" --quiet --out "$tmp/bpe" --vocab-size 300 \
    --doc-separator % "$tmp/docs.txt" >/dev/null || fail "prepare_text"
  vocab=$(python3 -c "import json; print(json.load(open('$tmp/bpe/meta.json'))['vocab_size'])")
  timeout 300 "$build/trainer" --device cpu --model tiny --vocab "$vocab" --ctx 64 --batch 4 \
    --steps 60 --lr 3e-3 --warmup 5 --data "$tmp/bpe/train.npy" --log-every 60 \
    --out "$tmp/bpe/run" >"$tmp/train_bpe.log" 2>&1 ||
    { fail "BPE training"; tail "$tmp/train_bpe.log"; }
  out=$("$build/generate" --device cpu --model "$tmp/bpe/run" --temperature 0 \
    --max-new-tokens 50 2>"$tmp/gen.err")
  # An empty prompt starts a document; greedy then writes one fortune and stops at end-of-text.
  if [[ $? -eq 0 ]] && grep -q "tokenizer $tmp/bpe/run/tokenizer.json" "$tmp/gen.err" &&
    grep -q "ended at end-of-text" "$tmp/gen.err" && grep -q "be kind" <<<"$out"; then
    ok "BPE: tokenizer found beside the run, stopped at end-of-text: '$out'"
  else
    fail "BPE generation: '$out'"
    cat "$tmp/gen.err"
  fi
  expect 2 "has [0-9]+ token ids but the model's vocabulary has 256" "${gen[@]}" \
    --model "$tmp/run_bytes" --tokenizer "$tmp/bpe/tokenizer.json"
  # A Hugging Face folder gives the same greedy text (export_hf.py needs numpy and safetensors).
  if python3 -c "import safetensors" 2>/dev/null &&
    python3 "$root/launch/export_hf.py" "$tmp/bpe/run" "$tmp/hf" \
      --tokenizer "$tmp/bpe/tokenizer.json" >/dev/null 2>&1; then
    same "Hugging Face folder gives the run's text" "$out" "$("${gen[@]}" --model "$tmp/hf" \
      --temperature 0 --max-new-tokens 50)"
  else
    echo "skip Hugging Face folder (export_hf.py's dependencies missing)"
  fi
else
  echo "skip BPE cases: Python's tokenizers or numpy is missing"
fi

echo "generate CLI: $passed passed, $failures failed"
((failures == 0))
