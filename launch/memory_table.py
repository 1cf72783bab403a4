#!/usr/bin/env python3
"""The memory table of docs/performance.md from trainer --memory-report files.

    launch/memory_table.py REPORT.json ...

One row per report: the plan's categories grouped (weights, gradients, optimizer state,
activations, other), what a forward needs of them (working weights, the activations and logits it
writes, the workspaces; the gradients and the optimizer state it does not touch), the plan's total
and the memory the GPU had in use after the first step (GiB, 2^30 bytes).
"""
import json
import sys

GIB = 1 << 30


def group(category):
    """The column a plan line adds to."""
    if category.startswith("working weights"):
        return "weights"
    if category.startswith("gradients") or category.startswith("embedding gradient"):
        return "gradients"
    if category.startswith("fp32 master") or category.startswith("AdamW"):
        return "optimizer"
    if category.startswith("activations") or category.startswith("final norm, logits"):
        return "activations"
    return "other"


def row(report):
    cols = {"weights": 0, "gradients": 0, "optimizer": 0, "activations": 0, "other": 0}
    forward = 0
    for line in report["plan"]:
        g = group(line["category"])
        cols[g] += line["bytes"]
        if g in ("weights", "activations") or "workspace" in line["category"]:
            forward += line["bytes"]
    c = report["config"]
    cells = [report["model"], f"{report['batch']}×{c['ctx']}", report["precision"]]
    cells += [f"{cols[k] / GIB:.2f}" for k in ("weights", "gradients", "optimizer", "activations",
                                                 "other")]
    cells += [f"{forward / GIB:.2f}", f"{report['plan_total_bytes'] / GIB:.2f}",
              f"{report['measured']['in_use_bytes'] / GIB:.2f}"]
    return "| " + " | ".join(cells) + " |"


def main(paths):
    if not paths:
        sys.exit("usage: memory_table.py REPORT.json ...")
    print("| model | batch×ctx | precision | weights | gradients | optimizer state | activations "
          "| other | a forward needs | plan total | in use after step 1 |")
    print("|" + "---|" * 11)
    for p in paths:
        with open(p) as f:
            print(row(json.load(f)))


if __name__ == "__main__":
    main(sys.argv[1:])
