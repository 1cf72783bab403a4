#!/usr/bin/env python3
"""Loads a trainer checkpoint into a PyTorch module named as in SPEC.md, with
`model.load_state_dict(safetensors.torch.load_file(path))` (strict), then recomputes the
validation loss the trainer reported (sequential sampler) and compares.

    torch_load_check.py MODEL.safetensors VAL.npy --vocab V --d-model D --d-ff F --layers L
                        --heads H --ctx T --rows G --batches E --expect LOSS [--tol 1e-4]
"""
import argparse
import math
import sys

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import load_file


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (
            nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x):
        B, T, d = x.shape
        dh = d // self.h
        split = lambda t: t.view(B, T, self.h, dh).transpose(1, 2)
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        j = torch.arange(dh // 2, dtype=torch.float64)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * 10000.0 ** (-2 * j / dh)[None]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)

        def rope(t):  # interleaved pairs (t[2j], t[2j+1])
            a, b = t[..., 0::2], t[..., 1::2]
            return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)

        y = torch.nn.functional.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        return self.output_proj(y.transpose(1, 2).reshape(B, T, d))


class FFN(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w1, self.w2, self.w3 = (nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False),
                                     nn.Linear(d, f, bias=False))

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d, f, h):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.ffn = RMSNorm(d), Attention(d, h), RMSNorm(d), FFN(d, f)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab, d, f, layers, h):
        super().__init__()
        self.token_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, f, h) for _ in range(layers))
        self.ln_final = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.token_embeddings(ids)
        for b in self.layers:
            x = b(x)
        return self.lm_head(self.ln_final(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("val")
    for n in ("vocab", "d-model", "d-ff", "layers", "heads", "ctx", "rows", "batches"):
        ap.add_argument("--" + n, type=int, required=True)
    ap.add_argument("--expect", type=float, required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    model = TransformerLM(a.vocab, a.d_model, a.d_ff, a.layers, a.heads).double()
    model.load_state_dict(load_file(a.model))  # strict: every name and shape must match
    tokens = torch.from_numpy(np.load(a.val).astype(np.int64))
    N, T, G = len(tokens), a.ctx, a.rows
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(a.batches):
            offs = [((s * G + r) * T) % (N - T - 1) for r in range(G)]
            ids = torch.stack([tokens[o:o + T] for o in offs])
            tgt = torch.stack([tokens[o + 1:o + T + 1] for o in offs])
            logits = model(ids)
            total += nn.functional.cross_entropy(logits.view(-1, a.vocab), tgt.view(-1),
                                                 reduction="sum").item()
            count += tgt.numel()
    loss = total / count
    rel = abs(loss - a.expect) / abs(loss)
    print(f"PyTorch load_state_dict(strict) OK; float64 loss {loss:.7f}, trainer {a.expect:.7f}, "
          f"relative difference {rel:.2e}")
    return 0 if rel < a.tol and math.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(main())
