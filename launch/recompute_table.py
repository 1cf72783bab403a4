#!/usr/bin/env python3
"""The recompute table of docs/performance.md from launch/bench_recompute.sh's CSVs.

    launch/recompute_table.py none=recompute_none.csv ffn=recompute_ffn.csv block=...

One row per (model, batch, ctx); for each --recompute mode the median step time and the GPU
memory in use (GiB, what the benchmark logs as peak memory), or "OOM" where the cell did not fit,
and for each mode after the first the step time relative to the first mode's.
"""
import csv
import sys


def load(path):
    """{(model, batch, ctx): (step_ms, gib) or None for out of memory}, in file order."""
    cells = {}
    with open(path) as f:
        rows = list(csv.reader(f))
    if not rows:
        return cells
    col = {name: i for i, name in enumerate(rows[0])}
    for r in rows[1:]:
        if r and r[0] == "oom":
            cells[(r[1], int(r[8]), int(r[7]))] = None
        elif r:
            key = (r[col["model"]], int(r[col["batch"]]), int(r[col["ctx"]]))
            cells[key] = (float(r[col["step_median_ms"]]), float(r[col["peak_mem_gib"]]))
    return cells


def render(modes):
    """Markdown for [(mode, cells)]."""
    keys = []
    for _, cells in modes:
        keys += [k for k in cells if k not in keys]
    head = "| model | batch×ctx |"
    for i, (mode, _) in enumerate(modes):
        head += f" {mode}: step ms | {mode}: GiB |" + (f" {mode} vs {modes[0][0]} |" if i else "")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for k in keys:
        line = f"| {k[0]} | {k[1]}×{k[2]} |"
        base = modes[0][1].get(k)
        for i, (_, cells) in enumerate(modes):
            v = cells.get(k, "missing")
            if v == "missing":
                line += " — | — |"
            elif v is None:
                line += " OOM | — |"
            else:
                line += f" {v[0]:.2f} | {v[1]:.1f} |"
            if i:
                ok = isinstance(v, tuple) and isinstance(base, tuple)
                line += f" {v[0] / base[0]:.2f}× |" if ok else " — |"
        lines.append(line)
    return "\n".join(lines)


def main(argv):
    if not argv or any("=" not in a for a in argv):
        sys.exit("usage: recompute_table.py MODE=FILE.csv ...")
    print(render([(a.split("=", 1)[0], load(a.split("=", 1)[1])) for a in argv]))


if __name__ == "__main__":
    main(sys.argv[1:])
