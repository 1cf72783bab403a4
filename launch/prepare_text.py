#!/usr/bin/env python3
"""prepare_text: UTF-8 text files -> a byte-level BPE tokenizer and the token shards the trainer
reads.

    python3 launch/prepare_text.py --out DIR [--vocab-size 8192] [--val-fraction 0.05]
        [--tokenizer tokenizer.json] [--eot '<|endoftext|>'] [--doc-separator LINE]
        [--overwrite] FILE_OR_GLOB...

Trains a GPT-2-style byte-level BPE tokenizer (Hugging Face `tokenizers`: ByteLevel
pre-tokenizer and decoder, the 256 byte symbols as its alphabet, so any UTF-8 text encodes and
decodes back to the same bytes) on the input files, locally -- nothing is downloaded -- or uses
the one given with --tokenizer, then encodes the files and writes into DIR:

    train.npy, val.npy   1-D token ids, dtype uint16 when the vocabulary has at most 65536 ids,
                         else uint32; val.npy holds the last --val-fraction of the tokens (rounded)
                         and train.npy the rest, as launch/tokenize does (no val.npy with 0)
    tokenizer.json       the tokenizer (decode with tokenizers.Tokenizer.from_file)
    meta.json            vocab_size (the trainer's --vocab must be at least this), dtype, token
                         counts, the end-of-text token and its id, the document separator, the
                         number of documents, the source files

Each input file is one document: the end-of-text token (--eot, a special token of the
vocabulary) follows each one. With --doc-separator LINE, a line that is exactly LINE (without its
line end, \\n or \\r\\n) also ends a document, as in the fortune files, whose short texts are
separated by lines of '%': the separator line is dropped, and neither the tokenizer's training nor
the shards see it -- the end-of-text id stands in its place. The end of a file still ends a
document; a document without text (two separators in a row, one at the start or the end of a
file) gets no end-of-text id. The text between separators keeps its exact bytes, so the ids of a
document decode to exactly its text. Text that spells the end-of-text token is encoded as plain
text, so the only end-of-text ids are those between documents. Then train with

    build/trainer --data DIR/train.npy --val-data DIR/val.npy --vocab <vocab_size of meta.json>

The corpus is streamed: the tokenizer trains from an iterator over chunks of whole lines, and
tokens are encoded a batch of chunks at a time and appended to the output, so memory does not grow
with the corpus. A progress bar goes to stderr (tqdm when it is installed and stderr is a terminal,
else a line per 10%).

Exit codes: 0 done; 2 bad input (one line on stderr saying what: no input files, a pattern that
matches nothing, a binary or non-UTF-8 file, no text, a --vocab-size out of range, an unreadable
--tokenizer, an empty or multi-line --doc-separator, an --out that holds files without
--overwrite); 130 interrupted.
"""

import argparse
import codecs
import glob
import json
import math
import os
import re
import shutil
import sys

EXIT_USAGE = 2
CHUNK_CHARS = 64 * 1024  # one string handed to the tokenizer (whole lines where lines allow)
DOC_END = None  # in the stream of text pieces: the current document ends here
READ_BYTES = 1 << 20  # one read from an input file
SNIFF_BYTES = 64 * 1024  # the first chunk of a file, checked for binary data up front
HEADER_BYTES = 128  # fixed .npy header size: room for any length, so it is rewritten in place
OUTPUTS = ("train.npy", "val.npy", "tokenizer.json", "meta.json")
UINT32_IDS = 1 << 32


class InputError(Exception):
    """Bad input: main prints the message as one line on stderr and exits 2."""


# ---------------------------------------------------------------------------------------------
# Input files


def expand_inputs(patterns):
    """The files named by `patterns` (paths, or globs expanded in name order), each once."""
    if not patterns:
        raise InputError("no input files given (pass text files or glob patterns)")
    files, seen = [], set()
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = [p for p in sorted(glob.glob(pattern, recursive=True)) if os.path.isfile(p)]
            if not matches:
                raise InputError(f"the pattern '{pattern}' matches no file")
        elif os.path.isdir(pattern):
            raise InputError(
                f"'{pattern}' is a directory; pass files or a pattern such as '{pattern}/*.txt'")
        elif not os.path.exists(pattern):
            raise InputError(f"no such file: '{pattern}'")
        else:
            matches = [pattern]
        for path in matches:
            key = os.path.realpath(path)
            if key not in seen:
                seen.add(key)
                files.append(path)
    return files


def sniff_text(path):
    """Refuses a file whose first chunk is not text (NUL bytes, invalid UTF-8); returns its size."""
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
            at_end = len(head) < SNIFF_BYTES
        size = os.path.getsize(path)
    except OSError as e:
        raise InputError(f"cannot read '{path}': {e.strerror}") from None
    nul = head.find(b"\0")
    if nul >= 0:
        raise InputError(f"'{path}' looks binary (a NUL byte at offset {nul}); pass text files")
    try:
        # final=at_end: a character cut by the chunk's end is not an error.
        codecs.getincrementaldecoder("utf-8")().decode(head, final=at_end)
    except UnicodeDecodeError as e:
        raise InputError(f"'{path}' is not UTF-8 text (invalid byte 0x{head[e.start]:02x} "
                         f"at offset {e.start})") from None
    return size


def read_chunks(path, progress):
    """The text of `path` as strings of about CHUNK_CHARS that end at line ends.

    A line longer than a chunk is cut at its last space before the limit (else at the limit).
    The pieces concatenate to the file exactly: newlines (\\n, \\r\\n) are kept as they are.
    Raises InputError on invalid UTF-8, with the byte offset.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""  # decoded text not yet handed out
    offset = 0  # bytes read so far
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(f"cannot read '{path}': {e.strerror}") from None
    with f:
        while True:
            block = f.read(READ_BYTES)
            held = len(decoder.getstate()[0])  # bytes of a character cut by the last block
            try:
                pending += decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                # e.start counts from the held bytes, then this block.
                raise InputError(f"'{path}' is not UTF-8 text (invalid byte at offset "
                                 f"{offset - held + e.start})") from None
            offset += len(block)
            progress.advance(len(block))
            while len(pending) > CHUNK_CHARS or (not block and pending):
                if len(pending) <= CHUNK_CHARS:
                    cut = len(pending)  # the rest of the file
                else:
                    # Cut after a newline; in a longer line, before a space, where the next
                    # word starts as it would anyway (GPT-2's pre-tokenizer gives " word");
                    # else anywhere.
                    cut = pending.rfind("\n", 0, CHUNK_CHARS) + 1
                    if cut == 0:
                        cut = pending.rfind(" ", 0, CHUNK_CHARS)
                        if cut <= 0:
                            cut = CHUNK_CHARS
                yield pending[:cut]
                pending = pending[cut:]
            if not block:
                return


def split_at_separators(chunks, separator):
    """The chunks of one file (read_chunks) as text pieces, with DOC_END for each separator line.

    A separator line is a line, whole, whose text without its line end (\\n or \\r\\n) is
    `separator`; the line, its line end included, is dropped. The pieces keep every other byte.
    Chunks may end anywhere (a line longer than a chunk is cut inside), so the start of a line
    that could still turn out to be a separator is held back and put before the next chunk, and
    after a chunk that ends inside a longer line, the text up to the next line end is not searched.
    """
    line = re.compile("^" + re.escape(separator) + r"\r?\n", re.MULTILINE)
    held = ""  # the last line of the text so far, unended: a separator's start, or empty
    mid_line = False  # the next chunk continues a line that is no separator
    for chunk in chunks:
        text = held + chunk
        held = ""
        start = 0  # where a separator line may begin
        if mid_line:
            start = text.find("\n") + 1
            if start == 0:  # no line end: all of it continues that line
                yield text
                continue
        # The unended last line: held while it may still become a separator line (its line end
        # or the rest of its text in the next chunk), else handed out, and the next chunk goes
        # on inside it.
        last = text.rfind("\n") + 1
        tail = text[last:]
        if separator.startswith(tail) or tail == separator + "\r":
            held, text = tail, text[:last]
            mid_line = False
        else:
            mid_line = True
        done = 0  # text[:done] is handed out
        for m in line.finditer(text, start):  # `^` matches at `start` and after each \n
            if m.start() > done:
                yield text[done:m.start()]
            yield DOC_END
            done = m.end()
        if done < len(text):
            yield text[done:]
    # The file's last line, without a line end.
    if held == separator:
        yield DOC_END
    elif held:
        yield held


# ---------------------------------------------------------------------------------------------
# Progress on stderr


class Progress:
    """Bytes done of a known total: tqdm on a terminal, else a line at each 10%."""

    def __init__(self, total, label, quiet):
        self.total, self.label, self.quiet = max(total, 1), label, quiet
        self.done, self.shown, self.bar = 0, -1, None
        if quiet:
            return
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, file=sys.stderr)
            except ImportError:
                pass

    def advance(self, n):
        self.done += n
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.update(n)
            return
        tenth = min(10, self.done * 10 // self.total)
        if tenth > self.shown:
            self.shown = tenth
            print(f"prepare_text: {self.label} {tenth * 10}%", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def documents(files, separator, label, total, quiet):
    """The corpus as text pieces (str, never empty) and DOC_END after each document's pieces.

    Each file is a document, or with a separator (not None) each stretch of a file between
    separator lines (split_at_separators). A document without text gets no DOC_END. One progress
    bar over all the files.
    """
    progress = Progress(total, label, quiet)
    try:
        for path in files:
            pieces = read_chunks(path, progress)
            if separator is not None:
                pieces = split_at_separators(pieces, separator)
            has_text = False  # the current document has text
            for piece in pieces:
                if piece is DOC_END:
                    if has_text:
                        yield DOC_END
                    has_text = False
                elif piece:
                    has_text = True
                    yield piece
            if has_text:  # the end of the file ends its last document
                yield DOC_END
    finally:
        progress.close()


# ---------------------------------------------------------------------------------------------
# The tokenizer


def train_tokenizer(files, separator, total, vocab_size, eot, quiet):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    # GPT-2's byte-level BPE: no normalizer (it would change the text), bytes mapped to printable
    # symbols, no prefix space (it would add a byte), and every byte in the alphabet from the
    # start, so no input needs an unknown token.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,  # a pair seen once is not worth a token
        special_tokens=[eot],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # Its own bars would fight ours while it reads (it cannot know how many chunks come).
        show_progress=False)

    def chunks():
        # The documents' text, each piece within one document; no separator lines.
        for piece in documents(files, separator, "training the tokenizer", total, quiet):
            if piece is not DOC_END:
                yield piece
        if not quiet:  # the merges come after the last chunk, without a bar
            print(f"prepare_text: computing the merges of a {vocab_size}-token vocabulary",
                  file=sys.stderr, flush=True)

    tokenizer.train_from_iterator(chunks(), trainer=trainer)
    return tokenizer


def load_tokenizer(path):
    from tokenizers import Tokenizer
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise InputError(f"cannot read --tokenizer '{path}': {e.strerror}") from None
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the Rust side raises a plain Exception for any bad file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read --tokenizer '{path}': {reason}") from None


def eot_id(tokenizer, eot, where):
    """The id of `eot`, which must be a special token of the tokenizer."""
    special = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    if eot not in special:
        known = ", ".join(sorted(special)) or "none"
        raise InputError(f"--eot '{eot}' is not a special token of {where} "
                         f"(its special tokens: {known})")
    return special[eot]


def id_bound(tokenizer):
    """One past the largest id the tokenizer can give: the trainer's smallest --vocab."""
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    return max(ids) + 1 if ids else 0


def npy_dtype(vocab_size):
    """uint16 when every id fits, else uint32 (a vocabulary past 2^32 ids is refused earlier)."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


# ---------------------------------------------------------------------------------------------
# Output


def npy_header(dtype, n):
    """A NumPy 1.0 header of exactly HEADER_BYTES for a 1-D little-endian array of n ids."""
    descr = {"uint16": "<u2", "uint32": "<u4"}[dtype]
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, n)
    room = HEADER_BYTES - 10
    header = b"\x93NUMPY\x01\x00" + room.to_bytes(2, "little") + d.ljust(room - 1).encode() + b"\n"
    assert len(header) == HEADER_BYTES
    return header


def check_out_dir(out, overwrite, cleanup):
    """Refuses an --out that holds files unless overwrite; creates it (and has cleanup remove it
    again should the run fail before writing its outputs)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"--out '{out}' exists and is not a directory")
    if os.path.isdir(out):
        present = sorted(os.listdir(out))
        if present and not overwrite:
            shown = ", ".join(present[:4]) + (", ..." if len(present) > 4 else "")
            raise InputError(f"--out '{out}' already holds files ({shown}); pass --overwrite to "
                             f"replace {', '.join(OUTPUTS)}")
    try:
        if not os.path.isdir(out):
            os.makedirs(out)
            cleanup.append(out)
    except OSError as e:
        raise InputError(f"cannot create --out '{out}': {e.strerror}") from None


def encode_to(tokenizer, files, separator, total, dtype, eot, tmp_path, quiet):
    """Encodes every document, EOT after each, into the .npy at tmp_path; returns the token
    count and the document count."""
    import numpy as np
    np_dtype = np.dtype(dtype).newbyteorder("<")
    # Text per encode call: chunks enough for the Rust side's threads, few enough that the
    # encodings (some hundred bytes a token) stay around 100 MB. Pieces are encoded one by one
    # (none runs across a document's end), so how they are batched does not change the ids.
    batch_chars = min(32, max(8, 2 * (os.cpu_count() or 1))) * CHUNK_CHARS
    # encode_batch_fast (tokenizers >= 0.20) skips the offsets nobody reads here.
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    eot_bytes = np.array([eot], dtype=np_dtype).tobytes()
    count = docs = 0
    with open(tmp_path, "wb") as out:
        out.write(npy_header(dtype, 0))  # rewritten with the length at the end

        def flush(pending):
            """Writes the pending pieces' ids, and an EOT for each DOC_END, in order."""
            nonlocal count, docs
            texts = [p for p in pending if p is not DOC_END]
            encodings = iter(encode_batch(texts, add_special_tokens=False) if texts else ())
            for piece in pending:
                if piece is DOC_END:
                    out.write(eot_bytes)
                    count += 1
                    docs += 1
                else:
                    ids = np.asarray(next(encodings).ids, dtype=np_dtype)
                    out.write(ids.tobytes())
                    count += len(ids)
            pending.clear()

        pending, chars = [], 0
        for piece in documents(files, separator, "encoding", total, quiet):
            pending.append(piece)
            if piece is not DOC_END:
                chars += len(piece)
                if chars >= batch_chars:
                    flush(pending)
                    chars = 0
        flush(pending)
    return count, docs


def split_tail(tmp_train, tmp_val, dtype, n_total, n_val):
    """Moves the last n_val ids of tmp_train into the .npy tmp_val, fixes both headers."""
    width = 2 if dtype == "uint16" else 4
    n_train = n_total - n_val
    with open(tmp_train, "r+b") as src:
        if tmp_val is not None:
            with open(tmp_val, "wb") as dst:
                dst.write(npy_header(dtype, n_val))
                src.seek(HEADER_BYTES + n_train * width)
                shutil.copyfileobj(src, dst, 16 << 20)
        src.truncate(HEADER_BYTES + n_train * width)
        src.seek(0)
        src.write(npy_header(dtype, n_train))


def main(argv=None):
    # The help is the docstring, which says what is written and how to train on it.
    ap = argparse.ArgumentParser(prog="prepare_text.py", description=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", metavar="FILE_OR_GLOB",
                    help="UTF-8 text files, or glob patterns (quoted; matches in name order; ** "
                    "recurses), read in the order given")
    ap.add_argument("--out", required=True, metavar="DIR",
                    help="output directory: train.npy, val.npy, tokenizer.json, meta.json")
    ap.add_argument("--vocab-size", type=int, default=None, metavar="N",
                    help="vocabulary to train, including the 256 bytes and --eot; a small "
                    "corpus may give fewer (pairs seen once are not merged) [default: 8192]")
    ap.add_argument("--tokenizer", metavar="FILE",
                    help="use this tokenizer.json instead of training one (--eot must be one of "
                    "its special tokens)")
    ap.add_argument("--val-fraction", type=float, default=0.05, metavar="F",
                    help="share of the tokens, taken from the end, that goes to val.npy, in "
                    "[0, 1); 0 writes no val.npy [default: 0.05]")
    ap.add_argument("--eot", default="<|endoftext|>", metavar="TOKEN",
                    help="end-of-text special token written after each document "
                    "[default: <|endoftext|>]")
    ap.add_argument("--doc-separator", metavar="LINE",
                    help="a line that is exactly LINE (without its line end) ends a document "
                    "and is dropped: its end-of-text id stands in its place (e.g. '%%' for "
                    "fortune files) [default: none: each file is one document]")
    # For the tests: a chunk size small enough that their separators fall at chunk boundaries.
    ap.add_argument("--chunk-chars", type=int, default=CHUNK_CHARS, help=argparse.SUPPRESS)
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the outputs in an --out that already holds files")
    ap.add_argument("--quiet", action="store_true", help="no progress output")
    args = ap.parse_args(argv)

    cleanup = []  # temporary files, and --out if this run created it
    try:
        return run(args, cleanup)
    except InputError as e:
        print(f"prepare_text: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # writing the outputs: a full disk, a read-only directory
        print(f"prepare_text: error: {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("prepare_text: interrupted", file=sys.stderr)
        return 130
    finally:
        for p in cleanup:  # what did not reach its final name; a created --out left empty
            if os.path.isfile(p):
                os.remove(p)
            elif os.path.isdir(p) and not os.listdir(p):
                os.rmdir(p)


def run(args, cleanup):
    # Everything that can be refused is checked before the long work starts.
    if not 0.0 <= args.val_fraction < 1.0:
        raise InputError(f"--val-fraction {args.val_fraction} must be in [0, 1)")
    if not args.eot:
        raise InputError("--eot must not be empty")
    separator = args.doc_separator
    if separator == "":
        # A blank line separates paragraphs inside documents as often as documents: refused
        # rather than guessed at.
        raise InputError("--doc-separator must not be empty (a blank-line separator would "
                         "split documents at every paragraph)")
    if separator is not None and ("\n" in separator or "\r" in separator):
        raise InputError("--doc-separator must be one line: no \\n or \\r in it")
    if args.chunk_chars < 1:
        raise InputError(f"--chunk-chars {args.chunk_chars} must be at least 1")
    global CHUNK_CHARS
    CHUNK_CHARS = args.chunk_chars
    if args.tokenizer is not None and args.vocab_size is not None:
        raise InputError("--vocab-size applies only when training a tokenizer, not with "
                         "--tokenizer (its vocabulary is given)")
    vocab_size = 8192 if args.vocab_size is None else args.vocab_size
    if args.tokenizer is None:
        if vocab_size > UINT32_IDS:
            raise InputError(f"--vocab-size {vocab_size} is too large: ids must fit uint32 "
                             f"(at most {UINT32_IDS})")
        if vocab_size < 256 + 1:
            raise InputError(f"--vocab-size {vocab_size} is too small: at least 257 (the 256 "
                             f"bytes and --eot)")
    try:
        import numpy  # noqa: F401 (checked here, used for the output)
        import tokenizers  # noqa: F401
    except ImportError as e:
        raise InputError(f"{e.name} is not installed: python3 -m pip install tokenizers numpy") \
            from None

    files = expand_inputs(args.inputs)
    sizes = [sniff_text(p) for p in files]
    total = sum(sizes)
    if total == 0:
        raise InputError(f"the input files hold no text ({len(files)} empty file(s))")
    # Empty files are not documents: they would only add end-of-text tokens.
    sources = [(p, s) for p, s in zip(files, sizes) if s > 0]
    files = [p for p, _ in sources]
    out = args.out
    own = {os.path.realpath(os.path.join(out, name)) for name in OUTPUTS}
    clash = [p for p in files if os.path.realpath(p) in own]
    if clash:
        raise InputError(f"'{clash[0]}' is an input and an output; write --out elsewhere")

    if args.tokenizer is not None:
        tokenizer = load_tokenizer(args.tokenizer)
        eot = eot_id(tokenizer, args.eot, f"--tokenizer '{args.tokenizer}'")
    check_out_dir(out, args.overwrite, cleanup)
    quiet = args.quiet
    if args.tokenizer is None:
        tokenizer = train_tokenizer(files, separator, total, vocab_size, args.eot, quiet)
        eot = eot_id(tokenizer, args.eot, "the trained tokenizer")
    vocab = id_bound(tokenizer)
    if vocab > UINT32_IDS:
        raise InputError(f"--tokenizer '{args.tokenizer}' has ids up to {vocab - 1}: more than "
                         "uint32 holds")
    dtype = npy_dtype(vocab)
    # Text that spells --eot is text: the only end-of-text ids are the ones between documents. (A
    # run-time setting: tokenizer.json does not keep it. Older tokenizers lack it.)
    if hasattr(tokenizer, "encode_special_tokens"):
        tokenizer.encode_special_tokens = True

    def tmp(name):
        path = os.path.join(out, f".{name}.tmp.{os.getpid()}")
        cleanup.insert(0, path)  # before --out: the files go first, then the directory
        return path

    tmp_train = tmp("train.npy")
    n_total, n_docs = encode_to(tokenizer, files, separator, total, dtype, eot, tmp_train, quiet)
    if n_docs == 0:  # the files hold separator lines only
        raise InputError(f"the input files hold no text besides --doc-separator lines "
                         f"({len(files)} file(s))")
    # The split of launch/tokenize.cpp: the last round(n * f) tokens (half away from zero) validate.
    n_val = min(n_total, math.floor(n_total * args.val_fraction + 0.5))
    tmp_val = tmp("val.npy") if args.val_fraction > 0 else None
    split_tail(tmp_train, tmp_val, dtype, n_total, n_val)

    tmp_tok = tmp("tokenizer.json")
    if args.tokenizer is not None:
        shutil.copyfile(args.tokenizer, tmp_tok)  # the user's file as it is
    else:
        tokenizer.save(tmp_tok)
    meta = {
        "producer": "launch/prepare_text.py",
        "vocab_size": vocab,  # the trainer's --vocab must be at least this
        "dtype": dtype,
        "train": "train.npy",
        "train_tokens": n_total - n_val,
        "val": "val.npy" if tmp_val else None,
        "val_tokens": n_val,
        "val_fraction": args.val_fraction,
        "split": "val holds the last val_tokens of the token stream, train the rest",
        "eot": args.eot,
        "eot_id": eot,
        "tokenizer": "tokenizer.json",
        "tokenizer_source": os.path.abspath(args.tokenizer) if args.tokenizer else None,
        "requested_vocab_size": None if args.tokenizer else vocab_size,
        "doc_separator": separator,  # null: each file is one document
        "documents": n_docs,  # = the end-of-text ids
        "text_bytes": total,
        "sources": [{"path": os.path.abspath(p), "bytes": s} for p, s in sources],
    }
    tmp_meta = tmp("meta.json")
    with open(tmp_meta, "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")

    # Final names last, meta.json the very last: a directory with meta.json is complete.
    if os.path.exists(os.path.join(out, "meta.json")):
        os.remove(os.path.join(out, "meta.json"))
    os.replace(tmp_train, os.path.join(out, "train.npy"))
    if tmp_val:
        os.replace(tmp_val, os.path.join(out, "val.npy"))
    elif os.path.exists(os.path.join(out, "val.npy")):
        os.remove(os.path.join(out, "val.npy"))  # a stale one from an earlier run
    os.replace(tmp_tok, os.path.join(out, "tokenizer.json"))
    os.replace(tmp_meta, os.path.join(out, "meta.json"))

    if not args.tokenizer and vocab < vocab_size:
        print(f"prepare_text: note: the corpus gave {vocab} tokens of the --vocab-size "
              f"{vocab_size} asked for", file=sys.stderr)
    docs = f", {n_docs} document(s)" if separator is not None else ""
    print(f"prepare_text: {len(files)} file(s){docs}, {total} bytes -> {out}: vocab {vocab}, "
          f"{dtype}, train {n_total - n_val} tokens, val {n_val} tokens, eot id {eot}")
    print(f"  train with: --data {os.path.join(out, 'train.npy')}"
          + (f" --val-data {os.path.join(out, 'val.npy')}" if tmp_val else "")
          + f" --vocab {vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
