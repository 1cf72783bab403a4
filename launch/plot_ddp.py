#!/usr/bin/env python3
"""Plots data-parallel benchmark CSVs (launch/bench_ddp.sh) as a PNG: per configuration, the
median step time split into compute and exposed communication, with the 1-GPU step as a line.
Configurations already taken from an earlier CSV are not repeated from a later one.

    launch/plot_ddp.py out.png "title" ddp.csv [more.csv ...]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(r, with_config=False):
    unit = "GPU" if r.get("device", "cuda") == "cuda" else "rank"
    if r["world"] == "1":
        s = f"1 {unit}"
    else:
        s = f"{r['world']} {unit}s"
        if r.get("hosts", "1") not in ("", "1"):
            s += f", {r['hosts']} hosts"
        s += f"\n{r['ddp']}"
        if r["ddp"] == "bucketed":
            s += f"\n{float(r['bucket_mb']):g} MiB"
        if r["shard_optim"] == "1":
            s += "\n+ZeRO-1"
        if r.get("grad_transport") == "ce":
            s += "\ncopy eng."
        if r.get("grad_reduce") == "bf16":
            s += "\nbf16 grads"
    if with_config:  # rows of several models or contexts in one plot
        s = f"{config(r)}\n{s}"
    return s


def config(r):
    return f"{r['model']} d{r['d_model']}×{r['layers']}\nctx {r['ctx']}"


def read_rows(paths):
    """Benchmark rows of the CSVs, a configuration taken from an earlier CSV not repeated."""
    rows, seen = [], set()
    for path in paths:
        for r in csv.DictReader(open(path)):
            if r.get("time") != "oom" and label(r, True) not in seen:
                seen.add(label(r, True))
                rows.append(r)
    return rows


def plot(rows, out, title):
    """Median step time per row, split into compute and exposed communication (a PNG at out)."""
    several = len({config(r) for r in rows}) > 1
    names = [label(r, several) for r in rows]
    step = [float(r["step_median_ms"]) for r in rows]
    comm = [float(r["comm_ms"]) for r in rows]
    compute = [s - c for s, c in zip(step, comm)]
    fig, ax = plt.subplots(figsize=(max(6, (1.1 + 0.2 * several) * len(rows)), 4.5 + 0.5 * several))
    ax.bar(names, compute, label="step minus exposed communication", color="#4c72b0")
    ax.bar(names, comm, bottom=compute, label="exposed communication", color="#dd8452")
    single = [s for r, s in zip(rows, step) if r["world"] == "1"]
    if single and not several:
        ax.axhline(single[0], color="black", lw=1, ls="--", label="1-GPU step")
    for i, s in enumerate(step):
        ax.text(i, s, f"{s:.0f}" if s >= 10 else f"{s:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per step (median)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    plt.xticks(fontsize=7 if several else 8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    out, title = sys.argv[1], sys.argv[2]
    plot(read_rows(sys.argv[3:]), out, title)


if __name__ == "__main__":
    main()
