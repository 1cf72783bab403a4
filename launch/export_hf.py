#!/usr/bin/env python3
"""export_hf: the trainer's weights -> a Hugging Face `transformers` LlamaForCausalLM folder.

    python3 launch/export_hf.py RUN_OR_FILE OUT_DIR [--tokenizer tokenizer.json]
        [--heads H] [--ctx T] [--dtype float32|bfloat16|float16] [--overwrite]

RUN_OR_FILE is a model.safetensors the trainer wrote (SPEC.md's names, fp32), a checkpoint
directory DIR/step_N, or a run's --out directory (its model.safetensors, else its newest step_N).
The trainer's files record the model config (vocab, d_model, d_ff, layers, heads, ctx) in their
metadata; a file without one (written by PyTorch, say) has its dimensions read from the tensor
shapes, and then --heads is needed (the shapes do not tell it) and --ctx sets
max_position_embeddings (default 256, the trainer's default --ctx). OUT_DIR receives

    config.json        LlamaForCausalLM: the dimensions, num_key_value_heads = heads, RMSNorm eps
                       1e-5, RoPE theta 10000, untied head, no biases, SiLU (SPEC.md's model)
    model.safetensors  the weights under the Hugging Face names, in --dtype (default float32)
    tokenizer.json, tokenizer_config.json, special_tokens_map.json
                       with --tokenizer (a `tokenizers` JSON file such as launch/prepare_text.py
                       writes), or without it the tokenizer.json beside the weights (the trainer
                       copies its data's into --out): AutoTokenizer loads them; <|endoftext|>,
                       when the tokenizer has it, is the eos token (also eos_token_id in
                       config.json)

Load the result with

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(OUT_DIR)
    tok = AutoTokenizer.from_pretrained(OUT_DIR)

and train on from it again with `build/trainer --init-from OUT_DIR ...` (the same dimensions).
Needs numpy and safetensors only (no torch); a tensor is read, converted and written one at a
time, so memory stays near the size of the largest tensor.

Exit codes: 0 done; 2 bad input (one line on stderr saying what).
"""

import argparse
import json
import os
import re
import sys

EXIT_USAGE = 2
EPS = 1e-5  # SPEC.md: RMSNorm eps
THETA = 10000.0  # SPEC.md: RoPE theta
EOT = "<|endoftext|>"
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


class InputError(Exception):
    """Bad input: main prints the message as one line on stderr and exits 2."""


# ---------------------------------------------------------------------------------------------
# Names and the RoPE permutation


def hf_name(name):
    """SPEC.md's tensor name -> the Hugging Face Llama name.

    SwiGLU: ours is ffn(x) = w2(silu(w1 x) * w3 x), Llama's MLP is down(silu(gate x) * up x), so
    w1 -> gate_proj, w3 -> up_proj, w2 -> down_proj."""
    top = {"token_embeddings.weight": "model.embed_tokens.weight",
           "ln_final.weight": "model.norm.weight", "lm_head.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    part = {"attn.q_proj.weight": "self_attn.q_proj.weight",
            "attn.k_proj.weight": "self_attn.k_proj.weight",
            "attn.v_proj.weight": "self_attn.v_proj.weight",
            "attn.output_proj.weight": "self_attn.o_proj.weight",
            "ffn.w1.weight": "mlp.gate_proj.weight", "ffn.w3.weight": "mlp.up_proj.weight",
            "ffn.w2.weight": "mlp.down_proj.weight", "ln1.weight": "input_layernorm.weight",
            "ln2.weight": "post_attention_layernorm.weight"}[m.group(2)]
    return f"model.layers.{m.group(1)}.{part}"


def rope_rows_to_hf(w, heads):
    """Permutes the rows of q_proj or k_proj (d_out = heads * dh rows) per head so that Hugging
    Face's RoPE computes what ours does.

    Ours (SPEC.md) rotates the interleaved pairs (x[2j], x[2j+1]) of a head by the angle
    a_j = pos * theta^(-2j/dh):  x'[2j] = x[2j] cos a_j - x[2j+1] sin a_j,
                                 x'[2j+1] = x[2j] sin a_j + x[2j+1] cos a_j.
    HF's LlamaRotaryEmbedding has inv_freq[j] = theta^(-2j/dh) for j < dh/2 and cos, sin =
    cat(freqs, freqs), so apply_rotary_pos_emb (y * cos + rotate_half(y) * sin) gives, for
    j < dh/2:                    y'[j] = y[j] cos a_j - y[j + dh/2] sin a_j,
                                 y'[j + dh/2] = y[j] sin a_j + y[j + dh/2] cos a_j:
    the same rotation of the pairs (y[j], y[j + dh/2]). With the head's rows reordered as
    y[j] = x[2j], y[j + dh/2] = x[2j+1] (HF row p*dh/2 + j = our row 2j + p, p = 0, 1), HF's
    rotated q and k are ours with the same permutation P applied to both: y'_q = P x'_q,
    y'_k = P x'_k, and the scores y'_q . y'_k = x'_q . x'_k (P is orthogonal). v, o_proj and
    the attention output are untouched. In numpy: row (h, j, p) -> (h, p, j)."""
    d_out, d_in = w.shape
    dh = d_out // heads
    return w.reshape(heads, dh // 2, 2, d_in).transpose(0, 2, 1, 3).reshape(d_out, d_in)


def tensor_names(layers, ffn=("w1", "w2", "w3")):
    """Our tensor names in SPEC.md's order; ffn=("w1", "w3", "w2") gives the order Hugging Face's
    own files list them (gate, up, down)."""
    names = ["token_embeddings.weight"]
    for i in range(layers):
        names += [f"layers.{i}.attn.{n}_proj.weight" for n in ("q", "k", "v", "output")]
        names += [f"layers.{i}.ffn.{n}.weight" for n in ffn]
        names += [f"layers.{i}.ln1.weight", f"layers.{i}.ln2.weight"]
    return names + ["ln_final.weight", "lm_head.weight"]


# ---------------------------------------------------------------------------------------------
# Input


def weights_file(path):
    """The model.safetensors that RUN_OR_FILE names."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise InputError(f"no such file or directory: '{path}'")
    direct = os.path.join(path, "model.safetensors")
    if os.path.isfile(direct):
        return direct
    steps = []
    for e in os.listdir(path):
        m = re.fullmatch(r"step_(\d+)", e)
        if m and os.path.isfile(os.path.join(path, e, "model.safetensors")):
            steps.append((int(m.group(1)), e))
    if not steps:
        raise InputError(f"'{path}' holds no model.safetensors and no step_N checkpoint")
    return os.path.join(path, max(steps)[1], "model.safetensors")


def model_config(f, path, heads, ctx):
    """(vocab, d_model, d_ff, layers, heads, ctx) from the file's metadata or its shapes."""
    meta = f.metadata() or {}
    names = set(f.keys())
    if "config" in meta:
        try:
            c = json.loads(meta["config"])
            cfg = {k: int(c[k]) for k in ("vocab", "d_model", "d_ff", "n_layers", "n_heads", "ctx")}
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"{path}: unreadable model config in the metadata: {e}") from None
        if heads is not None and heads != cfg["n_heads"]:
            raise InputError(f"--heads {heads}, but {path} records heads {cfg['n_heads']}")
        if ctx is not None:
            cfg["ctx"] = ctx
        return cfg
    if heads is None:
        raise InputError(f"{path} records no model config: pass --heads (the tensor shapes do "
                         "not tell the number of attention heads)")
    for need in ("token_embeddings.weight", "layers.0.ffn.w1.weight"):
        if need not in names:
            raise InputError(f"{path} has no tensor '{need}' (not the trainer's model?)")
    vocab, d = f.get_slice("token_embeddings.weight").get_shape()
    layers = 0
    while f"layers.{layers}.attn.q_proj.weight" in names:
        layers += 1
    d_ff = f.get_slice("layers.0.ffn.w1.weight").get_shape()[0]
    return {"vocab": vocab, "d_model": d, "d_ff": d_ff, "n_layers": layers, "n_heads": heads,
            "ctx": 256 if ctx is None else ctx}


def check_tensors(f, path, cfg):
    """Exactly SPEC.md's tensors, with the config's shapes, in fp32."""
    v, d, ff, L = cfg["vocab"], cfg["d_model"], cfg["d_ff"], cfg["n_layers"]
    h = cfg["n_heads"]
    if h <= 0 or d % h or (d // h) % 2:
        raise InputError(f"d_model {d} with {h} heads: the head dimension must be a whole even "
                         "number (RoPE rotates pairs)")
    shapes = {"token_embeddings.weight": [v, d], "ln_final.weight": [d], "lm_head.weight": [v, d]}
    for i in range(L):
        for n in ("q", "k", "v", "output"):
            shapes[f"layers.{i}.attn.{n}_proj.weight"] = [d, d]
        shapes.update({f"layers.{i}.ffn.w1.weight": [ff, d], f"layers.{i}.ffn.w3.weight": [ff, d],
                       f"layers.{i}.ffn.w2.weight": [d, ff], f"layers.{i}.ln1.weight": [d],
                       f"layers.{i}.ln2.weight": [d]})
    have = set(f.keys())
    for name in tensor_names(L):
        if name not in have:
            raise InputError(f"{path} has no tensor '{name}' (not the trainer's model weights?)")
        got = list(f.get_slice(name).get_shape())
        if got != shapes[name]:
            raise InputError(f"{path}: tensor '{name}' has shape {got}, expected {shapes[name]} "
                             "for the model config")
        dtype = f.get_slice(name).get_dtype()
        if dtype != "F32":
            raise InputError(f"{path}: tensor '{name}' has dtype {dtype} (need F32)")
    extra = sorted(have - set(shapes))
    if extra:
        raise InputError(f"{path} holds tensor '{extra[0]}', which the model does not have")


# ---------------------------------------------------------------------------------------------
# Output


def convert(w, dtype):
    """fp32 array -> the bytes of `dtype` (bf16 rounded to nearest even, as torch does)."""
    import numpy as np
    if dtype == "float32":
        return np.ascontiguousarray(w, dtype="<f4").tobytes()
    if dtype == "float16":
        h = w.astype("<f2")
        if not np.all(np.isfinite(h) | ~np.isfinite(w)):
            raise InputError("a weight overflows float16 (|w| > 65504): use --dtype bfloat16")
        return h.tobytes()
    u = np.ascontiguousarray(w, dtype="<f4").view("<u4").astype(np.uint64)
    b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    b[np.isnan(w)] = 0x7FC0
    return b.tobytes()


def write_safetensors(path, tensors, dtype):
    """Streams [(name, shape, producer)] into a safetensors file: the header first (sizes follow
    from the shapes), then each tensor as producer() returns it, converted to `dtype`."""
    size = 2 if dtype != "float32" else 4
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in tensors:
        n = size
        for s in shape:
            n *= s
        header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-aligned
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as out:
            out.write(len(text).to_bytes(8, "little"))
            out.write(text)
            for _, _, produce in tensors:
                out.write(convert(produce(), dtype))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path, obj):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as out:
        json.dump(obj, out, indent=2)
        out.write("\n")
    os.replace(tmp, path)


def beside_weights(src):
    """The tokenizer.json in the weights' folder, or in the run above a step_N; else None."""
    folder = os.path.dirname(os.path.abspath(src))
    places = [folder]
    if re.fullmatch(r"step_\d+", os.path.basename(folder)):
        places.append(os.path.dirname(folder))
    for place in places:
        path = os.path.join(place, "tokenizer.json")
        if os.path.isfile(path):
            return path
    return None


def tokenizer_info(path, vocab):
    """(the tokenizer.json text, the end-of-text id or None); refuses ids past the model's."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        tok = json.loads(text)
    except (OSError, ValueError) as e:
        raise InputError(f"--tokenizer {path}: cannot read it as JSON: {e}") from None
    model = tok.get("model") if isinstance(tok, dict) else None
    if not isinstance(model, dict) or "vocab" not in model:
        raise InputError(f"--tokenizer {path}: not a `tokenizers` JSON file (no model.vocab)")
    ids = {}
    if isinstance(model["vocab"], dict):  # BPE, WordPiece, WordLevel
        ids.update(model["vocab"])
    else:  # Unigram: [[piece, score], ...]
        ids.update({p[0]: i for i, p in enumerate(model["vocab"])})
    for t in tok.get("added_tokens") or []:
        ids[t["content"]] = t["id"]
    top = max(ids.values(), default=-1)
    if top >= vocab:
        raise InputError(f"--tokenizer {path} has token ids up to {top}, but the model's "
                         f"vocabulary has {vocab} (ids 0..{vocab - 1})")
    return text, ids.get(EOT)


def export(args):
    try:
        import numpy  # noqa: F401  (convert needs it)
        from safetensors import safe_open
    except ImportError as e:
        raise InputError(f"needs numpy and safetensors ({e}): pip install numpy safetensors")
    src = weights_file(args.source)
    for flag in ("heads", "ctx"):
        v = getattr(args, flag)
        if v is not None and v <= 0:
            raise InputError(f"--{flag} must be positive (got {v})")
    out = args.out_dir
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"OUT_DIR '{out}' exists and is not a directory")
    if os.path.isdir(out) and not args.overwrite:
        taken = [n for n in ("config.json", "model.safetensors", "tokenizer.json")
                 if os.path.exists(os.path.join(out, n))]
        if taken:
            raise InputError(f"'{out}' already holds {taken[0]}: pass --overwrite to replace it")
    try:
        f = safe_open(src, framework="numpy")
    except Exception as e:  # the library raises its own types for bad files
        raise InputError(f"cannot read {src} as safetensors: {e}") from None
    cfg = model_config(f, src, args.heads, args.ctx)
    check_tensors(f, src, cfg)
    tokenizer, eot = (None, None)
    if args.tokenizer is None:  # the one the trainer copied into the run, if any
        args.tokenizer = beside_weights(src)
    if args.tokenizer:
        tokenizer, eot = tokenizer_info(args.tokenizer, cfg["vocab"])

    os.makedirs(out, exist_ok=True)
    heads = cfg["n_heads"]

    def producer(name):
        def produce():
            w = f.get_tensor(name)
            if name.endswith(("attn.q_proj.weight", "attn.k_proj.weight")):
                w = rope_rows_to_hf(w, heads)
            return w
        return produce

    tensors = [(hf_name(n), f.get_slice(n).get_shape(), producer(n))
               for n in tensor_names(cfg["n_layers"], ffn=("w1", "w3", "w2"))]
    write_safetensors(os.path.join(out, "model.safetensors"), tensors, args.dtype)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg["vocab"],
        "hidden_size": cfg["d_model"],
        "intermediate_size": cfg["d_ff"],
        "num_hidden_layers": cfg["n_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": cfg["d_model"] // heads,
        "hidden_act": "silu",
        "max_position_embeddings": cfg["ctx"],
        "rms_norm_eps": EPS,
        "rope_theta": THETA,  # transformers 4.x reads it here, 5.x moves it into rope_parameters
        "rope_parameters": {"rope_type": "default", "rope_theta": THETA},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        # LlamaConfig's defaults (bos 1, eos 2) are some other tokenizer's: say there are none.
        "bos_token_id": None,
        "eos_token_id": eot,
        "pad_token_id": None,
        "torch_dtype": args.dtype,
        "dtype": args.dtype,
    }
    write_json(os.path.join(out, "config.json"), config)
    if tokenizer is not None:
        special = {"eos_token": EOT} if eot is not None else {}
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as t:
            t.write(tokenizer)
        write_json(os.path.join(out, "tokenizer_config.json"), {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": cfg["ctx"],
            "clean_up_tokenization_spaces": False,
            **special,
        })
        write_json(os.path.join(out, "special_tokens_map.json"), special)
    n_params = sum(int(numpy.prod(s)) for _, s, _ in tensors)
    print(f"export_hf: {src} -> {out}: LlamaForCausalLM, vocab {cfg['vocab']}, d_model "
          f"{cfg['d_model']}, d_ff {cfg['d_ff']}, {cfg['n_layers']} layers, {heads} heads, ctx "
          f"{cfg['ctx']}, {n_params:,} parameters in {args.dtype}"
          + (f", tokenizer (eos {EOT} = {eot})" if eot is not None else
             ", tokenizer" if tokenizer is not None else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Exports the trainer's weights as a Hugging Face LlamaForCausalLM folder.")
    ap.add_argument("source", metavar="RUN_OR_FILE",
                    help="model.safetensors, a checkpoint DIR/step_N, or a run's --out directory")
    ap.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write")
    ap.add_argument("--tokenizer", metavar="tokenizer.json",
                    help="a `tokenizers` JSON file [default: the tokenizer.json beside the "
                    "weights, if any]")
    ap.add_argument("--heads", type=int, help="attention heads (for files without a config)")
    ap.add_argument("--ctx", type=int,
                    help="max_position_embeddings (default: the recorded ctx, else 256)")
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES),
                    help="of the written weights (default float32)")
    ap.add_argument("--overwrite", action="store_true", help="replace files in OUT_DIR")
    args = ap.parse_args(argv)
    try:
        export(args)
    except InputError as e:
        print(f"export_hf: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
