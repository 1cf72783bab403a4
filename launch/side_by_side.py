#!/usr/bin/env python3
"""The table of launch/side_by_side.sh: ours beside PyTorch, cell by cell, with the ratio.

    launch/side_by_side.py OUT_DIR

Reads OUT_DIR/ours_*.csv (trainer --benchmark --csv, one file per set of trainer flags, named in
the .flags file beside it) and
OUT_DIR/torch.csv (launch/torch_step_bench.py --csv). One line per (model, batch, ctx, flags):
ours' median steps in run order, each PyTorch mode measured for that model and shape, and PyTorch's
best time over ours' (above 1: ours is faster), from ours' slowest run to its fastest; then the
steps each side timed. With OUT_DIR/runs.txt and OUT_DIR/gpu_samples.csv (nvidia-smi samples,
written by side_by_side.sh), a second table gives each run's median SM clock and power over the
samples where the GPU was busy (utilization >= 50%): at a power cap, the clock shows what each
side's step costs in energy. The power column names its nvidia-smi field where
OUT_DIR/gpu_samples.power gives it: the instantaneous draw, or power.draw (on recent drivers an
average over a second, which trails the load through a short window).
"""
import csv
import glob
import os
import statistics
import sys
from datetime import datetime


def read(path):
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("time") != "oom"]


def main(out):
    ours = {}  # (model, batch, ctx, flags) -> [step ms, ...] in run order
    windows = {"ours": set(), "PyTorch": set()}  # (steps, warm-up) pairs timed
    for path in sorted(glob.glob(os.path.join(out, "ours_*.csv"))):
        fpath = path[:-len(".csv")] + ".flags"
        flags = open(fpath).read().strip() if os.path.exists(fpath) else ""
        for r in read(path):
            key = (r["model"], int(r["batch"]), int(r["ctx"]), flags)
            ours.setdefault(key, []).append(float(r["step_median_ms"]))
            windows["ours"].add((int(r["steps"]), int(r["warmup"])))
    if not ours:
        sys.exit(f"side_by_side.py: no ours_*.csv rows in {out}")
    torch = {}  # (model, batch, ctx) -> {mode: step ms}
    tpath = os.path.join(out, "torch.csv")
    if os.path.exists(tpath):
        for r in read(tpath):
            modes = torch.setdefault((r["model"], int(r["batch"]), int(r["ctx"])), {})
            modes[r["mode"]] = float(r["step_median_ms"])
            windows["PyTorch"].add((int(r["steps"]), int(r["warmup"])))
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
    timed = "; ".join(f"{side} " + ", ".join(f"{n} steps after {w}" for n, w in sorted(ws))
                      for side, ws in windows.items() if ws)
    print(f"\nMedians of {timed}.")
    gpu_table(out)


def gpu_table(out):
    runs_path = os.path.join(out, "runs.txt")
    samples_path = os.path.join(out, "gpu_samples.csv")
    if not (os.path.exists(runs_path) and os.path.exists(samples_path)):
        return
    fmt = "%Y/%m/%d %H:%M:%S.%f"
    samples = []  # (time, utilization %, SM MHz, W, °C)
    with open(samples_path) as f:
        for line in f:
            p = [x.strip() for x in line.split(",")]
            try:
                samples.append((datetime.strptime(p[0], fmt), float(p[1]), float(p[2]),
                                float(p[3]), float(p[4])))
            except (IndexError, ValueError):
                continue  # a line cut short when the sampler was stopped, or a field not supported
    rows = []
    with open(runs_path) as f:
        for line in f:
            label, start, end = line.rstrip("\n").split("\t")
            a, b = datetime.strptime(start, fmt), datetime.strptime(end, fmt)
            busy = [x for x in samples if a <= x[0] <= b and x[1] >= 50]
            rows.append((label, busy))
    if not any(busy for _, busy in rows):
        return
    # The power's nvidia-smi field, where side_by_side.sh wrote it down.
    field_path = os.path.join(out, "gpu_samples.power")
    field = open(field_path).read().strip() if os.path.exists(field_path) else ""
    power = {"power.draw.instant": "power W (instantaneous)",
             "power.draw": "power W (power.draw)"}.get(field, "power W")
    print(f"\n| run | busy samples | SM clock MHz | {power} | temperature °C |")
    print("|---|---|---|---|---|")
    for label, busy in rows:
        if not busy:
            print(f"| {label} | 0 | — | — | — |")
            continue
        med = lambda i: statistics.median(x[i] for x in busy)
        print(f"| {label} | {len(busy)} | {med(2):.0f} | {med(3):.0f} | "
              f"{min(x[4] for x in busy):.0f}–{max(x[4] for x in busy):.0f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1])
