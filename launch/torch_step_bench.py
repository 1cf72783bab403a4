#!/usr/bin/env python3
"""PyTorch's training step for the model of SPEC.md, timed as ANCHORS.md did, so that it can run on
the same GPU lease as `trainer --benchmark`:

    launch/torch_step_bench.py --model small --batch 4 --ctx 512 --mode compile [--csv out.csv]

bf16 autocast over fp32 parameters, F.scaled_dot_product_attention(is_causal=True), fused AdamW,
gradient clipping at 1.0; --mode eager | compile (torch.compile's default) | reduce-overhead
(torch.compile with CUDA graphs). Synthetic tokens. Prints (and appends to --csv) the median step
of --steps timed steps after --warmup, from CUDA events around each whole step.
"""
import argparse
import csv
import os
import statistics
import time

import torch
import torch.nn.functional as F

from torch_model import PRESETS, TransformerLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--mode", default="compile", choices=["eager", "compile", "reduce-overhead"])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_step_bench.py: no CUDA device")
    torch.manual_seed(0)
    d, f, layers, h = PRESETS[a.model]
    model = TransformerLM(a.vocab, d, f, layers, h, a.ctx).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    fwd = model
    if a.mode != "eager":
        fwd = torch.compile(model, mode=None if a.mode == "compile" else "reduce-overhead")
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step():
        ids = torch.randint(0, a.vocab, (a.batch, a.ctx + 1), device="cuda", generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(ids[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.time()
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    times = []
    for _ in range(a.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    med = statistics.median(times)
    tok_s = a.batch * a.ctx / (med / 1e3)
    print(f"torch {torch.__version__} {a.mode} {a.model} {a.batch}x{a.ctx}: step {med:.2f} ms "
          f"(median of {a.steps} after {a.warmup} warm-up, {warm_s:.0f} s incl. compile), "
          f"min {min(times):.2f}, max {max(times):.2f}, {tok_s:,.0f} tokens/s, "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    if a.csv:
        fresh = not os.path.exists(a.csv)
        with open(a.csv, "a", newline="") as out:
            w = csv.writer(out)
            if fresh:
                w.writerow(["time", "torch", "mode", "model", "batch", "ctx", "warmup", "steps",
                            "step_median_ms", "step_min_ms", "step_max_ms", "tokens_per_s"])
            w.writerow([int(time.time()), torch.__version__, a.mode, a.model, a.batch, a.ctx,
                        a.warmup, a.steps, f"{med:.4f}", f"{min(times):.4f}", f"{max(times):.4f}",
                        f"{tok_s:.1f}"])


if __name__ == "__main__":
    main()
