#!/usr/bin/env python3
"""runtime/tokenizer.h against Hugging Face `tokenizers`, through tests/tokenizer_cli.

    python3 tests/tokenizer_hf_check.py BUILD_DIR

Trains a small GPT-2-style byte-level BPE (ByteLevel pre-tokenizer and decoder, vocabulary 1000,
special token <|endoftext|>) on generated text (English words, numbers, punctuation, letters
and digits of other scripts, emoji, tabs, newlines), then checks that
  * the C++ encoding of a few hundred random strings is HF's, id for id, for that tokenizer.json,
    for it in GPT-2's layout (the fields and values of GPT-2's own tokenizer.json) and for a
    variant (ByteLevel inside a Sequence with add_prefix_space, merges as "a b" strings,
    ignore_merges, added tokens with lstrip / rstrip and normalized ones);
  * the C++ decoding of those ids is the original bytes (and HF's decoding);
  * GPT-2's regex cuts a text holding every Unicode code point (in letter, digit, punctuation
    and space contexts) into the same pieces in both: the Unicode tables match HF's;
  * random bytes, mostly invalid UTF-8 (which HF cannot take), decode back to themselves.
Prints the encoding speed of both. Exit 0 pass, 1 failure, 77 skipped (no `tokenizers`).
"""

import json
import os
import random
import subprocess
import sys
import tempfile
import time

try:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError:
    print("Python's tokenizers is missing (pip install tokenizers): skipped")
    sys.exit(77)

EOT = "<|endoftext|>"
WORDS = ("the of and to in is was that for it with as his on be at by had are but from or "
         "have an they which one you were her all she there would their we him been has when "
         "who will more no if out so said what up its about into than them can only other new "
         "some could time these two may then do first any my now such like our over man me even "
         "most made after also did many before must through back years where much your way well "
         "down should because each just those people how too little state good very make world "
         "still own see men work long get here between both life being under never day same "
         "another know while last might us great old year off come since against go came right "
         "used take three").split()
FOREIGN = ("café naïve résumé Straße groß Ж Жизнь москва Привет 東京 日本語 中文字 ٣ ٤٥٦ العربية "
           "हिन्दी ελληνικά Ωμέγα ½ ² ⅷ 𝟘𝟙 한국어 ñandú Ærø ĳ ǅ").split()
EMOJI = ["🙂", "😀", "👍🏽", "🎉", "❤️", "🇫🇷", "👨‍👩‍👧"]
PUNCT = list(".,;:!?-—–'\"()[]{}<>/\\|@#$%^&*_+=~`…«»¡¿")
SPACES = [" ", " ", " ", "  ", "\t", "\n", "\n\n", "\r\n", "   ", " \n", "\u00a0", "\u3000",
          "\u2028", "\u0085", "\u1680", "\u2009", "\x0b", "\x0c"]
ODD = ["\x00", "\x01", "\x1b", "\x7f", "\u0301", "\u200b", "\u200d", "\ufeff", "\u180e", "\ufffd",
       "\U0010ffff", "\ue000", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "''s",
       "\U00031350", "\U00011f04", "\U0001e030", "\U0001e4f0", "\u1c89", "\u0e4f"]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def corpus_lines(rng, n):
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(3, 25)):
            r = rng.random()
            if r < 0.6:
                w = rng.choice(WORDS)
                parts.append(w.capitalize() if rng.random() < 0.1 else w)
            elif r < 0.7:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 6))))
            elif r < 0.85:
                parts.append(rng.choice(FOREIGN))
            elif r < 0.9:
                parts.append(rng.choice(EMOJI))
            else:
                parts.append(rng.choice(PUNCT))
            parts.append(rng.choice([" "] * 8 + ["\t", ", ", ". ", "  "]))
        yield "".join(parts) + rng.choice(["\n", "\n\n", "\n"])


def random_code_point(rng):
    while True:
        cp = rng.randrange(0x110000) if rng.random() < 0.5 else rng.randrange(0x3000)
        if not 0xD800 <= cp < 0xE000:
            return chr(cp)


def random_string(rng, extra):
    parts = []
    for _ in range(rng.randint(0, 30)):
        r = rng.random()
        if r < 0.3:
            parts.append(rng.choice(WORDS))
        elif r < 0.4:
            parts.append(rng.choice(FOREIGN))
        elif r < 0.5:
            parts.append(str(rng.randint(0, 99999)))
        elif r < 0.6:
            parts.append(rng.choice(PUNCT))
        elif r < 0.75:
            parts.append(rng.choice(SPACES))
        elif r < 0.8:
            parts.append(rng.choice(EMOJI))
        elif r < 0.87:
            parts.append(rng.choice(ODD))
        elif r < 0.94:
            parts.append(random_code_point(rng))
        else:
            parts.append(rng.choice(extra))
    return "".join(parts)


def run_cli(cli, tokenizer, mode, data):
    proc = subprocess.run([cli, tokenizer, mode], input=data, capture_output=True, timeout=300)
    if proc.returncode != 0:
        fail(f"tokenizer_cli {mode} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return proc.stdout


def cli_encode(cli, tokenizer, texts):
    data = b"".join(b"%d\n" % len(t) + t for t in texts)
    lines = run_cli(cli, tokenizer, "encode", data).decode().split("\n")
    if len(lines) != len(texts) + 1:
        fail(f"tokenizer_cli encode gave {len(lines) - 1} lines for {len(texts)} texts")
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def cli_decode(cli, tokenizer, id_lists):
    data = "".join(" ".join(map(str, ids)) + "\n" for ids in id_lists).encode()
    out, pos, texts = run_cli(cli, tokenizer, "decode", data), 0, []
    while pos < len(out):
        nl = out.index(b"\n", pos)
        n = int(out[pos:nl])
        texts.append(out[nl + 1:nl + 1 + n])
        pos = nl + 1 + n
    return texts


def compare(name, cli, path, texts, round_trip):
    hf = Tokenizer.from_file(path)
    want = [hf.encode(t).ids for t in texts]
    got = cli_encode(cli, path, [t.encode() for t in texts])
    bad = [i for i in range(len(texts)) if want[i] != got[i]]
    for i in bad[:5]:
        print(f"  mismatch: {texts[i]!r}\n    HF : {want[i]}\n    C++: {got[i]}")
    if bad:
        fail(f"{name}: {len(bad)} of {len(texts)} strings encode differently")
    decoded = cli_decode(cli, path, want)
    for t, ids, d in zip(texts, want, decoded):
        if round_trip and d != t.encode():
            fail(f"{name}: C++ decodes {t!r} as {d!r}")
        if hf.decode(ids, skip_special_tokens=False).encode() != d:
            fail(f"{name}: {t!r} decodes as {d!r} in C++, "
                 f"{hf.decode(ids, skip_special_tokens=False)!r} in HF")
    back = "decode back" if round_trip else "decode as in HF (the added prefix spaces stay)"
    print(f"ok   {name}: {len(texts)} strings ({sum(map(len, want))} ids) encode as HF does and "
          f"{back}")


def check_pieces(cli, path):
    # Every code point c in "x c 7 c , c  c\t": joined with x if a letter, 7 if a number, ","
    # if neither, split off from the space run if whitespace. Chunks end before an "x".
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    total = 0
    for start in range(0, len(cps), 65536):
        text = "".join(f"x{c}7{c},{c} {c}\t" for c in map(chr, cps[start:start + 65536]))
        want = [len(p) for p, _ in pre.pre_tokenize_str(text)]
        got = [int(x) for x in run_cli(cli, path, "pieces", text.encode()).split()]
        if want != got:
            k = next(i for i in range(min(len(want), len(got))) if want[i] != got[i])
            off = sum(want[:k])
            fail(f"pieces differ from code point U+{cps[start]:04X} on, at byte {off}: "
                 f"{text.encode()[max(0, off - 20):off + 20]!r}, HF {want[k]} C++ {got[k]}")
        total += len(want)
    print(f"ok   GPT-2 regex pieces: all {len(cps)} code points in 4 contexts, {total} pieces")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tokenizer_hf_check.py BUILD_DIR")
    cli = os.path.join(sys.argv[1], "tests", "tokenizer_cli")
    if not os.access(cli, os.X_OK):
        fail(f"{cli} is missing (cmake --build {sys.argv[1]} --target tokenizer_cli)")
    rng = random.Random(20240611)
    tmp = tempfile.mkdtemp(prefix="tokenizer_hf_check.")
    try:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(list(corpus_lines(rng, 4000)), trainer=trainer)
        plain = os.path.join(tmp, "plain.json")
        tok.save(plain)

        # GPT-2's own layout: "a b" merges, empty subword prefix and suffix, no use_regex, the
        # end-of-text token normalized, a post-processor that keeps offsets.
        gpt2 = json.loads(tok.to_str())
        model = gpt2["model"]
        model.update(continuing_subword_prefix="", end_of_word_suffix="",
                     merges=[" ".join(m) for m in model["merges"]])
        for key in ("byte_fallback", "ignore_merges"):
            del model[key]
        del gpt2["pre_tokenizer"]["use_regex"]
        gpt2["added_tokens"][0]["normalized"] = True
        gpt2["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True,
                                  "trim_offsets": False}
        gpt2_path = os.path.join(tmp, "gpt2_layout.json")
        with open(gpt2_path, "w", encoding="utf-8") as f:
            json.dump(gpt2, f, ensure_ascii=False)

        # The variant: more added tokens (HF gives the ids), then the fields edited.
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True),
                                AddedToken("<sep>", special=True, normalized=False)])
        tok.add_tokens([AddedToken("hello", normalized=True), AddedToken("lo w", normalized=False)])
        variant = json.loads(tok.to_str())
        variant["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            dict(variant["pre_tokenizer"], add_prefix_space=True)]}
        variant["model"]["merges"] = [" ".join(m) for m in variant["model"]["merges"]]
        variant["model"]["ignore_merges"] = True
        varied = os.path.join(tmp, "variant.json")
        with open(varied, "w", encoding="utf-8") as f:
            json.dump(variant, f, ensure_ascii=False)

        fixed = ["", " ", "  ", "\n", "a  \n\n b", "hello   ", "hello world", EOT, EOT + EOT,
                 " " + EOT + " x", "<|endoftext", "it's we're I'LL", "naïve café — 東京 🙂",
                 "\t\t\n  \r\n", "x <mask>  y", "<sep><mask>", "hellohello", "lo world"]
        extra = [EOT, "<|endof", "<mask>", " <mask> ", "<sep>", "hello", "lo w"]
        texts = fixed + [random_string(rng, extra) for _ in range(400)]
        compare("trained tokenizer.json", cli, plain, texts, True)
        compare("GPT-2's layout", cli, gpt2_path, texts, True)
        compare("variant (Sequence, add_prefix_space, \"a b\" merges, ignore_merges, "
                "lstrip/rstrip/normalized added tokens)", cli, varied, texts, False)

        check_pieces(cli, plain)

        raw = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 60))) for _ in range(300)]
        got = cli_decode(cli, plain, cli_encode(cli, plain, raw))
        if got != raw:
            fail("random bytes do not decode back to themselves")
        print(f"ok   {len(raw)} random byte strings (invalid UTF-8) decode back to themselves")

        # Speed: one ~4 MB text. HF's time is for its single-string encode.
        big = "".join(corpus_lines(random.Random(5), 40000))
        hf = Tokenizer.from_file(plain)
        t0 = time.perf_counter()
        want = hf.encode(big).ids
        t_hf = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = cli_encode(cli, plain, [big.encode()])[0]
        t_cpp = time.perf_counter() - t0
        if got != want:
            fail("the 4 MB text encodes differently")
        mb = len(big.encode()) / 1e6
        print(f"ok   {mb:.1f} MB text, {len(want)} ids, the same: C++ {mb / t_cpp:.1f} MB/s "
              f"(whole tokenizer_cli run), HF {mb / t_hf:.1f} MB/s")
    finally:
        for name in os.listdir(tmp):
            os.remove(os.path.join(tmp, name))
        os.rmdir(tmp)
    print("PASS")


if __name__ == "__main__":
    main()
