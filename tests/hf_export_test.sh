#!/usr/bin/env bash
# Export to Hugging Face and back (launch/export_hf.py, --init-from DIR): a tiny model trained on
# the CPU is exported; `transformers` loads it as LlamaForCausalLM and its logits equal an
# independent float64 NumPy forward of SPEC.md's model (tests/numpy_reference.py) on the
# trainer's own file, its loss on the validation rows equals the trainer's validation loss, and
# AutoTokenizer loads the tokenizer; a bfloat16 export equals the same forward on bf16-rounded
# weights; `trainer --init-from` the exported folders (1 step at --lr 0) gives back the exported
# weights exactly; wrong inputs are refused by name. Skipped (77) without numpy, safetensors,
# torch, transformers or tokenizers.
# Usage: hf_export_test.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: hf_export_test.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
missing=$(python3 -c "import numpy, safetensors, torch, transformers, tokenizers" 2>&1 | tail -1)
if [[ -n $missing ]]; then
  echo "skipped: $missing (pip install numpy safetensors torch transformers)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok() { echo "ok   $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
export_hf() { python3 "$root/launch/export_hf.py" "$@"; }

# 1. A tiny model (head dim 12: not a power of two; vocab 257 = 256 bytes + <|endoftext|>).
head -c 30000 /dev/urandom | base64 > "$tmp/text.txt"
"$build/launch/tokenize" --out-train "$tmp/train.npy" --out-val "$tmp/val.npy" --val-fraction 0.2 \
  "$tmp/text.txt" > /dev/null || exit 1
model=(--device cpu --d-model 48 --d-ff 80 --layers 2 --heads 4 --vocab 257 --ctx 16 --batch 3
       --data "$tmp/train.npy" --val-data "$tmp/val.npy" --eval-batches 2 --log-every 1)
"$build/trainer" "${model[@]}" --steps 6 --save-every 3 --lr 1e-2 --out "$tmp/run" \
  > "$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; exit 1; }
val=$(grep -o '"val_loss":[0-9.e+-]*' "$tmp/run/metrics.jsonl" | tail -1 | cut -d: -f2)

# 2. A byte-level tokenizer whose ids are the tokenize tool's (id = byte value), and
#    <|endoftext|> = 256.
python3 - "$tmp/tokenizer.json" <<'PY' || exit 1
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))  # GPT-2's byte map
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens(["<|endoftext|>"])
tok.save(sys.argv[1])
PY

# 3. Export the run (its final model.safetensors) with the tokenizer; the checkpoint step_3 in
#    bfloat16.
if out=$(export_hf "$tmp/run" "$tmp/hf" --tokenizer "$tmp/tokenizer.json" 2>&1); then
  ok "export: $out"
else
  fail "export: $out"
fi
if out=$(export_hf "$tmp/run/step_3" "$tmp/hf_bf16" --dtype bfloat16 2>&1); then
  ok "export of a checkpoint directory in bfloat16"
else
  fail "bf16 export: $out"
fi

# 4. transformers against the NumPy reference, the trainer's validation loss and the tokenizer.
python3 - "$tmp" "$root/tests" "$val" > "$tmp/checks.log" 2>&1 <<'PY'
import json, sys
tmp, tests, trainer_val = sys.argv[1], sys.argv[2], float(sys.argv[3])
sys.path.insert(0, tests)
import numpy as np
import torch
import transformers
from transformers import AutoTokenizer, LlamaForCausalLM
import numpy_reference as ref

torch.manual_seed(0)
transformers.logging.set_verbosity_error()  # e.g. a text longer than model_max_length = ctx
transformers.logging.disable_progress_bar()
L, H, T, G, E, V = 2, 4, 16, 3, 2, 257
failed = 0
def check(cond, what):  # the shell counts the lines
    global failed
    print(("ok   " if cond else "FAIL: ") + what, flush=True)
    failed += not cond

major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
dtype_kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
def load(path):
    m = LlamaForCausalLM.from_pretrained(path, attn_implementation="eager",
                                         **{dtype_kw: torch.float32})
    return m.eval()

val = np.load(f"{tmp}/val.npy").astype(np.int64)
rng = np.random.default_rng(0)
seqs = [ref.sequential_batch(val, T, G, s)[0] for s in range(E)]
seqs += [rng.integers(0, V, size=(2, T)), rng.integers(0, V, size=(1, 5)),
         np.array([[256, 0, 255, 1, 256, 128]])]

def compare(model, p, what):
    worst = 0.0
    with torch.no_grad():
        for ids in seqs:
            got = model(torch.tensor(ids)).logits.double().numpy()
            want = ref.forward_logits(p, ids, L, H)
            worst = max(worst, np.abs(got - want).max() / max(1.0, np.abs(want).max()))
    check(worst <= 1e-4, f"{what}: max |HF - NumPy| / max(1, max |logit|) = {worst:.2e} "
          f"over {len(seqs)} batches (<= 1e-4)")
    return worst

model = load(f"{tmp}/hf")
p = ref.load_weights(f"{tmp}/run/model.safetensors")
compare(model, p, "fp32 export logits")

# The test would see a wrong permutation: q and k rows left in our order change the logits.
with torch.no_grad():
    for i in range(L):
        for n in ("q", "k"):
            getattr(model.model.layers[i].self_attn, f"{n}_proj").weight.copy_(
                torch.from_numpy(p[f"layers.{i}.attn.{n}_proj.weight"]).float())
    bad = max(np.abs(model(torch.tensor(s)).logits.double().numpy()
                     - ref.forward_logits(p, s, L, H)).max() for s in seqs)
check(bad > 1e-3, f"without the q/k permutation the logits differ by {bad:.2e}")

# The validation loss, as Hugging Face computes it (labels = the inputs, shifted inside).
model = load(f"{tmp}/hf")
losses = []
with torch.no_grad():
    for s in range(E):
        ids, tgt = ref.sequential_batch(val, T, G, s)
        seq = torch.tensor(np.concatenate([ids, tgt[:, -1:]], axis=1))  # T + 1 tokens
        losses.append(model(input_ids=seq, labels=seq).loss.item())
hf_val = float(np.mean(losses))
rel = abs(hf_val - trainer_val) / trainer_val
check(rel < 1e-5, f"validation loss: transformers {hf_val:.7f}, trainer {trainer_val:.7f}, "
      f"relative difference {rel:.1e} (< 1e-5)")

# The config and the tokenizer.
cfg = model.config
check((cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
       cfg.num_key_value_heads, cfg.vocab_size, cfg.max_position_embeddings, cfg.rms_norm_eps,
       cfg.tie_word_embeddings, cfg.eos_token_id) == (48, 80, 2, 4, 4, 257, 16, 1e-5, False, 256),
      "config.json: dimensions, eps, untied, eos_token_id 256")
tok = AutoTokenizer.from_pretrained(f"{tmp}/hf")
text = open(f"{tmp}/text.txt", "rb").read()[:200].decode() + " é\n"
ids = tok.encode(text, add_special_tokens=False)
check(ids == list(text.encode()) and tok.decode(ids) == text and tok.eos_token == "<|endoftext|>"
      and tok.eos_token_id == 256, "AutoTokenizer: byte ids, decode, eos <|endoftext|> = 256")
with torch.no_grad():
    out = model.generate(torch.tensor([ids[:8]]), max_new_tokens=4, do_sample=False)
check(out.shape == (1, 12), "generate: 4 greedy tokens")

# bfloat16: the same forward on the weights rounded to bf16 (nearest even), which the importer
# must give back exactly.
step3 = ref.load_file(f"{tmp}/run/step_3/model.safetensors")
def bf16(w):
    u = w.view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
rounded = {k: bf16(v) for k, v in step3.items()}
compare(load(f"{tmp}/hf_bf16"), {k: v.astype(np.float64) for k, v in rounded.items()},
        "bf16 export logits (reference on bf16-rounded weights)")
ref_save = __import__("safetensors.numpy", fromlist=["save_file"]).save_file
ref_save(rounded, f"{tmp}/step3_bf16.safetensors")
ref_save(step3, f"{tmp}/bare.safetensors")  # no metadata: the exporter needs --heads
sys.exit(1 if failed else 0)
PY
rc=$?
cat "$tmp/checks.log"
passed=$((passed + $(grep -c '^ok ' "$tmp/checks.log")))
failed=$((failed + $(grep -c '^FAIL: ' "$tmp/checks.log")))
if [[ $rc -ne 0 ]] && ! grep -q '^FAIL: ' "$tmp/checks.log"; then
  fail "the transformers checks stopped (exit $rc)"
fi

# 5. Back into the trainer: --init-from the folders, one step at --lr 0 (AdamW then leaves every
#    weight as it is), and the written weights equal the exported ones exactly.
back() {  # back NAME FOLDER REFERENCE
  local diff
  if ! "$build/trainer" "${model[@]}" --steps 1 --lr 0 --init-from "$2" --out "$tmp/$1" \
    > "$tmp/$1.log" 2>&1; then
    fail "--init-from $2: $(tail -1 "$tmp/$1.log")"
    return
  fi
  diff=$("$build/launch/weights_diff" "$3" "$tmp/$1/model.safetensors")
  [[ $diff == "max |A - B| / max |A| = 0 over 21 tensors"* ]] &&
    ok "--init-from $(basename "$2"): the original weights, exactly ($diff)" ||
    fail "--init-from $2: $diff"
}
back back_fp32 "$tmp/hf" "$tmp/run/model.safetensors"
back back_bf16 "$tmp/hf_bf16" "$tmp/step3_bf16.safetensors"

# 6. Refusals, one line each, exit 2.
refuses() {  # refuses WHAT NEEDLE CMD...
  local what=$1 needle=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  [[ $rc -eq 2 && $out == *"$needle"* ]] && ok "$what: exit 2, named" ||
    fail "$what: rc $rc: $(tail -2 <<<"$out")"
}
refuses "--init-from a folder of another size" \
  "config.json has hidden_size 48 but this run has --d-model 32" \
  "$build/trainer" "${model[@]}" --d-model 32 --steps 1 --init-from "$tmp/hf"
refuses "--init-from a directory without config.json" "is a directory without config.json" \
  "$build/trainer" "${model[@]}" --steps 1 --init-from "$tmp/run"
refuses "export of a file without a config, no --heads" "pass --heads" \
  export_hf "$tmp/bare.safetensors" "$tmp/bare_hf"
refuses "export into a folder that holds one" "already holds config.json" \
  export_hf "$tmp/run" "$tmp/hf"
python3 - "$tmp/tokenizer.json" "$tmp/tokenizer_258.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["added_tokens"].append(dict(t["added_tokens"][0], id=257, content="<|pad|>"))
json.dump(t, open(sys.argv[2], "w"))
PY
refuses "a tokenizer with more ids than the model" \
  "has token ids up to 257, but the model's vocabulary has 257" \
  export_hf "$tmp/run" "$tmp/hf_258" --tokenizer "$tmp/tokenizer_258.json"
if out=$(export_hf "$tmp/bare.safetensors" "$tmp/bare_hf" --heads 4 --ctx 16 2>&1) &&
  cmp -s "$tmp/bare_hf/model.safetensors" <(
    export_hf "$tmp/run/step_3" "$tmp/step3_hf" > /dev/null && cat "$tmp/step3_hf/model.safetensors"
  ); then
  ok "export of a file without a config, with --heads: the checkpoint's export, byte for byte"
else
  fail "export with --heads: $out"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
