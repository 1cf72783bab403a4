#!/usr/bin/env bash
# launch/prepare_text.py, from text to a model: it trains a byte-level BPE tokenizer on generated
# English-like text, writes train/val shards of the right dtype whose tokens decode back to the
# input exactly (non-ASCII UTF-8, CRLF, a literal end-of-text string included), reuses a given
# tokenizer.json, writes uint32 shards for a vocabulary past 65536, refuses every bad input with
# exit 2 and one line on stderr; the trainer trains 5 steps on the shards with the vocabulary of
# meta.json and refuses a smaller --vocab; --doc-separator ends documents at separator lines
# (dropped, also from the tokenizer's training; one end-of-text id per non-empty document, whose
# ids decode to exactly its text, at any chunk size). Skipped (77) without tokenizers and numpy.
# Usage: prepare_text_test.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: prepare_text_test.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
prep=(python3 "$root/launch/prepare_text.py" --quiet)
if ! python3 -c "import tokenizers, numpy" 2>/dev/null; then
  echo "Python's tokenizers or numpy is missing (launch/install_deps.sh installs them): skipped"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0 passed=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok   $*"; passed=$((passed + 1)); }
train=(timeout 300 "$build/trainer" --device cpu --model tiny --steps 5 --ctx 64 --batch 2
       --eval-batches 2)

# expect CODE PATTERN CMD...: CMD exits with CODE and says PATTERN, on one line of stderr
# (expect_all: of stdout and stderr together; the trainer logs its errors to stdout).
expect() { expect_lines "$1" "$2" 2 "${@:3}"; }
expect_all() { expect_lines "$1" "$2" all "${@:3}"; }
expect_lines() {
  local want=$1 pattern=$2 streams=$3
  shift 3
  local err rc
  if [[ $streams == all ]]; then err=$("$@" 2>&1); else err=$("$@" 2>&1 >/dev/null); fi
  rc=$?
  if [[ $rc -eq $want ]] && grep -qE -- "$pattern" <<<"$err" && [[ $(wc -l <<<"$err") -eq 1 ]]; then
    ok "exit $want: $err"
  else
    fail "exit $rc (wanted $want, one line matching '$pattern'): $*"
    sed 's/^/    /' <<<"$err" | tail -5
  fi
}

# check_shards DIR DTYPE FILE...: DIR's shards have DTYPE, meta.json agrees with them, and
# train + val decode to the files' text, each followed by the end-of-text token.
check_shards() {
  python3 - "$@" <<'PY'
import json, sys
import numpy as np
from tokenizers import Tokenizer
out, dtype, files = sys.argv[1], sys.argv[2], sys.argv[3:]
meta = json.load(open(f"{out}/meta.json"))
train, val = np.load(f"{out}/train.npy"), np.load(f"{out}/val.npy")
assert str(train.dtype) == dtype and str(val.dtype) == dtype, (train.dtype, val.dtype, dtype)
assert meta["dtype"] == dtype, meta["dtype"]
assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val)), meta
n = len(train) + len(val)
assert len(val) == int(n * meta["val_fraction"] + 0.5), (len(val), n)
ids = np.concatenate([train, val])
tok = Tokenizer.from_file(f"{out}/tokenizer.json")
assert int(ids.max()) < meta["vocab_size"] == max(tok.get_vocab().values()) + 1, meta
eot = meta["eot_id"]
assert tok.id_to_token(eot) == meta["eot"], (eot, meta["eot"])
# One end-of-text id per file, the last token of each: a literal "<|endoftext|>" in the text
# is text.
assert int((ids == eot).sum()) == len(files) and ids[-1] == eot, int((ids == eot).sum())
text = tok.decode(ids.tolist(), skip_special_tokens=False)
want = "".join(open(f, encoding="utf-8", newline="").read() + meta["eot"] for f in files)
assert text == want, "the tokens do not decode to the input text"
assert [s["path"] for s in meta["sources"]] == [__import__("os").path.abspath(f) for f in files]
print(f"{out}: {dtype}, vocab {meta['vocab_size']}, {len(train)} + {len(val)} tokens round-trip")
PY
}

# 1. A corpus: ~300 KB of generated English-like text in two files, and a third with non-ASCII
#    UTF-8, CRLF line ends, tabs, a line longer than a chunk and the end-of-text string as text.
python3 - "$tmp" <<'PY'
import random, sys
d = sys.argv[1]
rng = random.Random(1)
words = ("the of and to in is was that for it with as his on be at by had are but from or have "
         "an they which one you were her all she there would their we him been has when who will "
         "more no if out so said what up its about into than them can only other new some could "
         "time these two may then do first any my now such like our over man me even most made "
         "after also did many before must through back years where much your way well down "
         "river garden winter letter morning silver window journey harbour lantern").split()
def paragraph():
    out = []
    for _ in range(rng.randint(2, 6)):
        s = " ".join(rng.choice(words) for _ in range(rng.randint(4, 18)))
        out.append(s[0].upper() + s[1:] + rng.choice(".!?"))
    return " ".join(out) + "\n\n"
for name in ("a.txt", "b.txt"):
    with open(f"{d}/{name}", "w") as f:
        f.write("".join(paragraph() for _ in range(600)))
with open(f"{d}/utf8.txt", "w", newline="") as f:
    f.write("naïve café — 東京 🙂\r\nTabs\there, <|endoftext|> as text, ünïcödé: Ελληνικά, "
            "Русский, العربية, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢\n" + "long " * 20000 + "\nno newline at the end ¿")
PY
corpus=("$tmp/a.txt" "$tmp/b.txt" "$tmp/utf8.txt")

# 2. Train a tokenizer (vocab 1024) and write the shards.
if "${prep[@]}" --out "$tmp/d1" --vocab-size 1024 "${corpus[@]}" > "$tmp/d1.log" 2>&1; then
  ok "trained a tokenizer: $(head -1 "$tmp/d1.log")"
else
  fail "prepare_text on the corpus"; cat "$tmp/d1.log"
fi
for f in train.npy val.npy tokenizer.json meta.json; do
  [[ -f $tmp/d1/$f ]] || fail "no $f in the output"
done
[[ -z $(find "$tmp/d1" -name '.*tmp*') ]] || fail "temporary files left in the output"
check_shards "$tmp/d1" uint16 "${corpus[@]}" && ok "uint16 shards decode to the input" ||
  fail "uint16 shards"
vocab=$(python3 -c "import json; print(json.load(open('$tmp/d1/meta.json'))['vocab_size'])")
[[ $vocab -gt 300 && $vocab -le 1024 ]] && ok "vocab_size $vocab" || fail "vocab_size $vocab"

# 3. The trainer trains on them with meta.json's vocabulary, and refuses a smaller one even
#    though the ids of the shards might fit it.
if "${train[@]}" --vocab "$vocab" --data "$tmp/d1/train.npy" --val-data "$tmp/d1/val.npy" \
  > "$tmp/t1.log" 2>&1; then
  ok "trainer: 5 steps on the uint16 shards with --vocab $vocab"
else
  fail "trainer on the uint16 shards"; tail -5 "$tmp/t1.log"
fi
smaller="is smaller than the vocabulary of the tokenizer that made token file"
expect_all 2 "--vocab $((vocab - 1)) $smaller '.*train.npy': $vocab tokens .*meta.json" \
  "${train[@]}" --vocab $((vocab - 1)) --data "$tmp/d1/train.npy"

# 4. The same tokenizer given with --tokenizer gives the same tokens; the file is copied as is.
"${prep[@]}" --out "$tmp/d2" --tokenizer "$tmp/d1/tokenizer.json" "${corpus[@]}" > /dev/null 2>&1
if cmp -s "$tmp/d1/train.npy" "$tmp/d2/train.npy" && cmp -s "$tmp/d1/val.npy" "$tmp/d2/val.npy" &&
  cmp -s "$tmp/d1/tokenizer.json" "$tmp/d2/tokenizer.json"; then
  ok "--tokenizer: the same shards"
else
  fail "--tokenizer gives other shards"
fi

# 5. A vocabulary past 65536: uint32 shards. BPE training cannot reach it on a small corpus, so
#    the tokenizer is built: the 256 byte symbols, unused ids up to 69999, end-of-text 70000.
python3 - "$tmp/big.json" <<'PY'
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
vocab.update({f"<unused{i}>": i for i in range(len(vocab), 70000)})
tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens(["<|endoftext|>"])
tok.save(sys.argv[1])
PY
head -c 8000 "$tmp/a.txt" > "$tmp/small.txt"
big=("$tmp/small.txt" "$tmp/utf8.txt")
"${prep[@]}" --out "$tmp/d3" --tokenizer "$tmp/big.json" --val-fraction 0.1 "${big[@]}" \
  > /dev/null 2>&1 || fail "prepare_text with the 70001-token tokenizer"
check_shards "$tmp/d3" uint32 "${big[@]}" && ok "uint32 shards decode to the input" ||
  fail "uint32 shards"
python3 -c "
import json, numpy as np
m = json.load(open('$tmp/d3/meta.json'))
assert m['vocab_size'] == 70001 and m['eot_id'] == 70000, m
assert np.load('$tmp/d3/train.npy').max() == 70000  # an id past 65535 in the shard
" && ok "meta.json: vocab_size 70001, eot_id 70000" || fail "meta.json of the uint32 shards"
(cd "$root/launch" && python3 -c "
import prepare_text as p
assert (p.npy_dtype(256), p.npy_dtype(65536), p.npy_dtype(65537)) == ('uint16', 'uint16', 'uint32')
") && ok "dtype: uint16 up to 65536 ids, uint32 past" || fail "npy_dtype"
if "${train[@]}" --vocab 70001 --data "$tmp/d3/train.npy" --val-data "$tmp/d3/val.npy" \
  > "$tmp/t3.log" 2>&1; then
  ok "trainer: 5 steps on the uint32 shards with --vocab 70001"
else
  fail "trainer on the uint32 shards"; tail -5 "$tmp/t3.log"
fi
expect_all 2 "--vocab 70000 $smaller '.*train.npy': 70001 tokens" \
  "${train[@]}" --vocab 70000 --data "$tmp/d3/train.npy"

# 6. Bad input: exit 2 and one line that says what.
printf 'some text \0 with a NUL' > "$tmp/nul.txt"
printf 'caf\xe9 in Latin-1\n' > "$tmp/latin1.txt"
python3 -c "
import sys; sys.stdout.buffer.write(b'fine text\n' * 20000 + b'then \xff\xfe\n')" > "$tmp/late.txt"
: > "$tmp/empty.txt"
echo '{"not": "a tokenizer"}' > "$tmp/bad.json"
expect 2 "no input files" "${prep[@]}" --out "$tmp/x"
expect 2 "the pattern '.*nothing\*.txt' matches no file" "${prep[@]}" --out "$tmp/x" \
  "$tmp/nothing*.txt"
expect 2 "no such file: '.*missing.txt'" "${prep[@]}" --out "$tmp/x" "$tmp/missing.txt"
expect 2 "'.*nul.txt' looks binary \(a NUL byte at offset 10\)" "${prep[@]}" --out "$tmp/x" \
  "$tmp/a.txt" "$tmp/nul.txt"
expect 2 "'.*latin1.txt' is not UTF-8 text \(invalid byte 0xe9 at offset 3\)" "${prep[@]}" \
  --out "$tmp/x" "$tmp/latin1.txt"
expect 2 "'.*late.txt' is not UTF-8 text \(invalid byte at offset 200005\)" "${prep[@]}" \
  --out "$tmp/x" "$tmp/late.txt"
expect 2 "the input files hold no text" "${prep[@]}" --out "$tmp/x" "$tmp/empty.txt"
expect 2 "--vocab-size 256 is too small: at least 257" "${prep[@]}" --out "$tmp/x" \
  --vocab-size 256 "$tmp/a.txt"
expect 2 "--vocab-size 4294967297 is too large: ids must fit uint32" "${prep[@]}" --out "$tmp/x" \
  --vocab-size 4294967297 "$tmp/a.txt"
expect 2 "cannot read --tokenizer '.*none.json': No such file" "${prep[@]}" --out "$tmp/x" \
  --tokenizer "$tmp/none.json" "$tmp/a.txt"
expect 2 "cannot read --tokenizer '.*bad.json'" "${prep[@]}" --out "$tmp/x" \
  --tokenizer "$tmp/bad.json" "$tmp/a.txt"
expect 2 "--eot '<s>' is not a special token of --tokenizer" "${prep[@]}" --out "$tmp/x" \
  --tokenizer "$tmp/d1/tokenizer.json" --eot '<s>' "$tmp/a.txt"
expect 2 "--out '.*d1' already holds files .*; pass --overwrite" "${prep[@]}" --out "$tmp/d1" \
  "$tmp/a.txt"
expect 2 "--val-fraction 1.0 must be in \[0, 1\)" "${prep[@]}" --out "$tmp/x" --val-fraction 1 \
  "$tmp/a.txt"
expect 2 "--doc-separator must not be empty" "${prep[@]}" --out "$tmp/x" --doc-separator '' \
  "$tmp/a.txt"
expect 2 "--doc-separator must be one line" "${prep[@]}" --out "$tmp/x" --doc-separator $'%\n%' \
  "$tmp/a.txt"
printf '%%\n%%\r\n%%' > "$tmp/only_seps.txt"
expect 2 "the input files hold no text besides --doc-separator lines" "${prep[@]}" --out "$tmp/x" \
  --doc-separator % "$tmp/only_seps.txt"
[[ ! -e $tmp/x ]] && ok "a refused run leaves no --out behind" || fail "$tmp/x was left behind"

# 7. --overwrite replaces the outputs; --val-fraction 0 writes no val.npy (and removes the old).
if "${prep[@]}" --out "$tmp/d1" --overwrite --val-fraction 0 --vocab-size 512 "$tmp/a.txt" \
  > /dev/null 2>&1 && [[ ! -e $tmp/d1/val.npy ]] &&
  python3 -c "import json; m = json.load(open('$tmp/d1/meta.json'))
assert m['val'] is None and m['val_tokens'] == 0 and m['vocab_size'] <= 512, m"; then
  ok "--overwrite, --val-fraction 0"
else
  fail "--overwrite --val-fraction 0"
fi

# 8. --help explains the command.
python3 "$root/launch/prepare_text.py" --help | grep -q "byte-level BPE tokenizer" &&
  ok "--help" || fail "--help"
python3 "$root/launch/prepare_text.py" --help | grep -q -- "--doc-separator LINE" &&
  ok "--help names --doc-separator" || fail "--help lacks --doc-separator"

# 9. --doc-separator: files of short documents between separator lines, as the fortune files.
#    s1: a separator at the start, CRLF lines and a CRLF separator, two separators in a row,
#    non-ASCII text, lines that are not quite separators, the end-of-text string as text, a
#    document longer than many chunks, a separator at the end. s2 (with --chunk-chars 64): a
#    chunk ends just before a separator line, the next just after one, the file ends with a
#    separator without a line end. s3: no separator, no line end at the end. s4: separators only.
python3 - "$tmp" <<'PY'
import random, sys
d = sys.argv[1]
rng = random.Random(2)
words = "river garden winter letter morning silver window journey harbour lantern".split()
def para(n):
    return " ".join(rng.choice(words) for _ in range(n)) + ".\n"
s1 = ("%\n" "first document\r\nwith CRLF lines\r\n" "%\r\n" "%\n"
      "naïve café — 東京 🙂 Ελληνικά\n%%\n % \n% \na%\n%\r\r\n<|endoftext|> as text\n" "%\n"
      + "".join(para(rng.randint(3, 30)) for _ in range(40)) + "%\n"
      "last one\n" "%\n")
s2 = ("x" * 63 + "\n" "%\n" + "z" * 59 + "\n" "%\n" "after the boundaries\r\n" "%")
for name, text in (("s1", s1), ("s2", s2), ("s3", "a file without separators\nno line end"),
                   ("s4", "%\n%\r\n%\n")):
    with open(f"{d}/{name}.txt", "w", newline="") as f:
        f.write(text)
# s5: 200 short documents between lines of 8 tildes (some CRLF); no tilde in the documents.
with open(f"{d}/s5.txt", "w", newline="") as f:
    for i in range(200):
        f.write(para(rng.randint(2, 12)) + rng.choice(["~~~~~~~~\n", "~~~~~~~~\r\n"]))
PY
# The boundaries of s2 are where its comment says, with chunks of 64 characters.
(cd "$root/launch" && python3 -c "
import prepare_text as p
p.CHUNK_CHARS = 64
class Quiet:
    def advance(self, n): pass
chunks = list(p.read_chunks('$tmp/s2.txt', Quiet()))
assert chunks[1].startswith('%\n') and chunks[1].endswith('\n%\n'), chunks
") && ok "s2: separators at chunk boundaries with --chunk-chars 64" || fail "s2's chunk boundaries"

# check_docs DIR SEPARATOR FILE...: one end-of-text id after each non-empty document of the files
# split at SEPARATOR lines (here by a plain line-by-line reading of each whole file), the ids
# between end-of-text ids decode to exactly each document's text, meta.json agrees.
check_docs() {
  python3 - "$@" <<'PY'
import json, sys
import numpy as np
from tokenizers import Tokenizer
out, sep, files = sys.argv[1], sys.argv[2], sys.argv[3:]
docs = []
for path in files:
    cur = ""  # the current document's text
    lines = open(path, encoding="utf-8", newline="").read().split("\n")
    for i, line in enumerate(lines):
        ended = i < len(lines) - 1  # the last piece has no \n (and is empty after one)
        content = line[:-1] if ended and line.endswith("\r") else line
        if content == sep:
            if cur:
                docs.append(cur)
            cur = ""
        else:
            cur += line + "\n" * ended
    if cur:
        docs.append(cur)
meta = json.load(open(f"{out}/meta.json"))
ids = np.concatenate([np.load(f"{out}/train.npy"), np.load(f"{out}/val.npy")])
tok = Tokenizer.from_file(f"{out}/tokenizer.json")
eot = meta["eot_id"]
ends = np.flatnonzero(ids == eot)
assert meta["doc_separator"] == sep, meta["doc_separator"]
assert len(ends) == len(docs) == meta["documents"], (len(ends), len(docs), meta["documents"])
assert ids[-1] == eot
starts = np.concatenate([[0], ends[:-1] + 1])
for i, (a, b) in enumerate(zip(starts, ends)):
    text = tok.decode(ids[a:b].tolist(), skip_special_tokens=False)
    assert text == docs[i], (i, text[:80], docs[i][:80])
print(f"{out}: {len(docs)} documents round-trip")
PY
}
sep_files=("$tmp/s1.txt" "$tmp/s2.txt" "$tmp/s3.txt" "$tmp/s4.txt")
if "${prep[@]}" --out "$tmp/d9" --vocab-size 512 --doc-separator % --chunk-chars 64 \
  "${sep_files[@]}" > "$tmp/d9.log" 2>&1; then
  ok "--doc-separator %: $(grep -m1 'document(s)' "$tmp/d9.log")"
else
  fail "prepare_text --doc-separator %"; cat "$tmp/d9.log"
fi
check_docs "$tmp/d9" % "${sep_files[@]}" && ok "--doc-separator %: documents decode exactly" ||
  fail "--doc-separator % documents"
# By hand: s1 holds 4 documents, s2 3, s3 1, s4 none.
python3 -c "import json; m = json.load(open('$tmp/d9/meta.json')); assert m['documents'] == 8, m" &&
  ok "meta.json: doc_separator %, 8 documents" || fail "meta.json documents of d9"
# Chunks of 2 characters: a separator line's \r and \n fall into different chunks.
"${prep[@]}" --out "$tmp/d10" --tokenizer "$tmp/d9/tokenizer.json" --doc-separator % \
  --chunk-chars 2 "${sep_files[@]}" > /dev/null 2>&1 || fail "prepare_text --chunk-chars 2"
check_docs "$tmp/d10" % "${sep_files[@]}" && ok "--doc-separator % with 2-character chunks" ||
  fail "--doc-separator % with 2-character chunks"
# Without --doc-separator: as before, each file is one document, separator lines are text.
"${prep[@]}" --out "$tmp/d11" --tokenizer "$tmp/d9/tokenizer.json" "${sep_files[@]}" \
  > /dev/null 2>&1 || fail "prepare_text without --doc-separator"
check_shards "$tmp/d11" uint16 "${sep_files[@]}" &&
  python3 -c "import json; m = json.load(open('$tmp/d11/meta.json'))
assert m['doc_separator'] is None and m['documents'] == 4, m" &&
  ok "without --doc-separator: one document per file" || fail "without --doc-separator"
# The tokenizer does not train on separator lines: 8 tildes 200 times make a token of tildes
# without --doc-separator, none with it (a separator cut by chunks of 5 characters included).
for flag in with without; do
  opt=(); [[ $flag == with ]] && opt=(--doc-separator '~~~~~~~~' --chunk-chars 5)
  "${prep[@]}" --out "$tmp/d12$flag" --vocab-size 300 "${opt[@]}" "$tmp/s5.txt" > /dev/null 2>&1 ||
    fail "prepare_text on s5 $flag --doc-separator"
done
check_docs "$tmp/d12with" '~~~~~~~~' "$tmp/s5.txt" && ok "s5: 200 documents decode exactly" ||
  fail "s5 documents"
tildes() {
  python3 -c "from tokenizers import Tokenizer
print(sum('~~' in t for t in Tokenizer.from_file('$1/tokenizer.json').get_vocab()))"
}
[[ $(tildes "$tmp/d12with") -eq 0 && $(tildes "$tmp/d12without") -gt 0 ]] &&
  ok "the tokenizer does not see separator lines" ||
  fail "tokens of tildes: $(tildes "$tmp/d12with") with --doc-separator"

echo "$passed passed, $failures failed"
[[ $failures -eq 0 ]]
