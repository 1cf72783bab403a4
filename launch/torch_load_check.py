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

from torch_model import TransformerLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("val")
    for n in ("vocab", "d-model", "d-ff", "layers", "heads", "ctx", "rows", "batches"):
        ap.add_argument("--" + n, type=int, required=True)
    ap.add_argument("--expect", type=float, required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    model = TransformerLM(a.vocab, a.d_model, a.d_ff, a.layers, a.heads, a.ctx).double()
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
