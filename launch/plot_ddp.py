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


def label(r):
    if r["world"] == "1":
        return "1 GPU"
    s = f"{r['world']} GPUs\n{r['ddp']}"
    if r["ddp"] == "bucketed":
        s += f"\n{float(r['bucket_mb']):g} MiB"
    if r["shard_optim"] == "1":
        s += "\n+ZeRO-1"
    if r.get("grad_transport") == "ce":
        s += "\ncopy eng."
    if r.get("grad_reduce") == "bf16":
        s += "\nbf16 grads"
    return s


def main():
    out, title = sys.argv[1], sys.argv[2]
    rows, seen = [], set()
    for path in sys.argv[3:]:
        for r in csv.DictReader(open(path)):
            if r.get("time") != "oom" and label(r) not in seen:
                seen.add(label(r))
                rows.append(r)
    names = [label(r) for r in rows]
    step = [float(r["step_median_ms"]) for r in rows]
    comm = [float(r["comm_ms"]) for r in rows]
    compute = [s - c for s, c in zip(step, comm)]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4.5))
    ax.bar(names, compute, label="step minus exposed communication", color="#4c72b0")
    ax.bar(names, comm, bottom=compute, label="exposed communication", color="#dd8452")
    single = [s for r, s in zip(rows, step) if r["world"] == "1"]
    if single:
        ax.axhline(single[0], color="black", lw=1, ls="--", label="1-GPU step")
    for i, s in enumerate(step):
        ax.text(i, s, f"{s:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per step (median)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    plt.xticks(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
