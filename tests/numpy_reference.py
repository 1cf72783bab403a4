#!/usr/bin/env python3
"""An independent float64 NumPy implementation of SPEC.md's model, as a cross-check of the
trainer: it loads a model.safetensors written by the trainer by the SPEC names (as a PyTorch user
would), rebuilds the validation batches of the sequential sampler, and compares the mean loss with
the one the trainer reported.

    numpy_reference.py MODEL.safetensors VAL.npy --layers L --heads H --ctx T --rows G
                       --batches E --expect LOSS [--tol 1e-4]

Exits 77 (skipped) when numpy or safetensors is not installed. Other tests import it as a module
for forward_logits, load_weights, sequential_batch and token_losses.
"""
import argparse
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)


def rmsnorm(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w


def rope(x, theta=10000.0):
    # x: (B, H, T, dh); interleaved pairs (x[2j], x[2j+1]) rotated by pos * theta^(-2j/dh).
    T, dh = x.shape[-2], x.shape[-1]
    j = np.arange(dh // 2)
    ang = np.arange(T)[:, None] * theta ** (-2.0 * j / dh)[None, :]
    c, s = np.cos(ang), np.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def forward(p, ids, layers, heads):
    x = p["token_embeddings.weight"][ids]  # (B, T, d)
    B, T, d = x.shape
    dh = d // heads
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    split = lambda t: t.reshape(B, T, heads, dh).transpose(0, 2, 1, 3)
    for i in range(layers):
        g = lambda n: p[f"layers.{i}.{n}.weight"]
        h = rmsnorm(x, g("ln1"))
        q, k, v = (split(h @ g(f"attn.{n}_proj").T) for n in "qkv")
        q, k = rope(q), rope(k)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
        s[..., mask] = -np.inf
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(0, 2, 1, 3).reshape(B, T, d) @ g("attn.output_proj").T
        h = rmsnorm(x, g("ln2"))
        a1, a3 = h @ g("ffn.w1").T, h @ g("ffn.w3").T
        x = x + (a1 / (1 + np.exp(-a1)) * a3) @ g("ffn.w2").T
    return rmsnorm(x, p["ln_final.weight"]) @ p["lm_head.weight"].T


def forward_logits(p, ids, layers, heads):
    """The model's logits (B, T, vocab) for token ids (B, T), in float64: `p` maps SPEC.md's
    names to arrays (load_weights). For other scripts that import this file as a module."""
    return forward(p, np.asarray(ids), layers, heads)


def load_weights(path):
    """A model.safetensors by SPEC.md's names, as float64 arrays."""
    return {k: v.astype(np.float64) for k, v in load_file(path).items()}


def sequential_batch(tokens, ctx, rows, step):
    """Inputs and targets (rows, ctx) of global batch `step` of the sequential sampler (SPEC.md),
    which the trainer's validation passes use."""
    N, T, G = len(tokens), ctx, rows
    offs = [((step * G + r) * T) % (N - T - 1) for r in range(G)]
    ids = np.stack([tokens[o:o + T] for o in offs])
    tgt = np.stack([tokens[o + 1:o + T + 1] for o in offs])
    return ids, tgt


def token_losses(logits, tgt):
    """-log_softmax(logits)[target] per position."""
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    return lse - np.take_along_axis(logits, tgt[..., None], -1)[..., 0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("val")
    for n in ("layers", "heads", "ctx", "rows", "batches"):
        ap.add_argument("--" + n, type=int, required=True)
    ap.add_argument("--expect", type=float, required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    p = load_weights(a.model)
    tokens = np.load(a.val).astype(np.int64)
    losses = []
    for s in range(a.batches):
        ids, tgt = sequential_batch(tokens, a.ctx, a.rows, s)
        losses.append(token_losses(forward(p, ids, a.layers, a.heads), tgt))
    loss = float(np.mean(losses))
    rel = abs(loss - a.expect) / abs(loss)
    print(f"numpy float64 loss {loss:.8f}, trainer {a.expect:.8f}, relative difference {rel:.2e}")
    if rel < a.tol:
        print("1 passed, 0 failed")
        return 0
    print("0 passed, 1 failed")
    return 1


if __name__ == "__main__":
    sys.exit(main())
