#!/usr/bin/env python3
"""The table of launch/side_by_side.sh: ours beside PyTorch, cell by cell, with the ratio.

    launch/side_by_side.py OUT_DIR

Reads OUT_DIR/ours_*.csv (trainer --benchmark --csv, one file per set of trainer flags, named in
the .flags file beside it) and
OUT_DIR/torch.csv (launch/torch_step_bench.py --csv). One line per (model, batch, ctx, flags):
ours' median steps in run order, each PyTorch mode measured for that model and shape, and PyTorch's
best time over ours' (above 1: ours is faster), from ours' slowest run to its fastest.
"""
import csv
import glob
import os
import sys


def read(path):
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("time") != "oom"]


def main(out):
    ours = {}  # (model, batch, ctx, flags) -> [step ms, ...] in run order
    for path in sorted(glob.glob(os.path.join(out, "ours_*.csv"))):
        fpath = path[:-len(".csv")] + ".flags"
        flags = open(fpath).read().strip() if os.path.exists(fpath) else ""
        for r in read(path):
            key = (r["model"], int(r["batch"]), int(r["ctx"]), flags)
            ours.setdefault(key, []).append(float(r["step_median_ms"]))
    if not ours:
        sys.exit(f"side_by_side.py: no ours_*.csv rows in {out}")
    torch = {}  # (model, batch, ctx) -> {mode: step ms}
    tpath = os.path.join(out, "torch.csv")
    if os.path.exists(tpath):
        for r in read(tpath):
            modes = torch.setdefault((r["model"], int(r["batch"]), int(r["ctx"])), {})
            modes[r["mode"]] = float(r["step_median_ms"])
    print("| model | batch×ctx | ours flags | ours ms | PyTorch ms | best PyTorch / ours |")
    print("|---|---|---|---|---|---|")
    for (model, batch, ctx, flags), runs in ours.items():
        modes = torch.get((model, batch, ctx), {})
        theirs = ", ".join(f"{ms:.2f} (`{m}`)" for m, ms in sorted(modes.items()))
        if modes:
            best = min(modes.values())
            lo, hi = best / max(runs), best / min(runs)
            ratio = f"{lo:.2f}×" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}×"
        else:
            ratio = "—"
        print(f"| {model} | {batch}×{ctx} | {f'`{flags}`' if flags else ''} | {', '.join(f'{x:.2f}' for x in runs)} | "
              f"{theirs or '—'} | {ratio} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1])
