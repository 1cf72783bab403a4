#!/usr/bin/env python3
"""Splits the steps of a --kernel-trace CSV into forward and backward and sums their kernels.

    launch/trace_phases.py PREFIX.csv[.gz]

The compute stream is the one that runs the token embedding's forward kernel. On it, a step's
forward runs from that kernel's start to the end of the cross-entropy kernel (which also writes
the logits' gradient), its backward from there to the end of the embedding's backward kernel.
Each phase's kernels are grouped as GEMMs (cuBLASLt: nvjet and cublasLt kernels), attention (the
flash kernels, with the backward's dO.O and dQ conversion), and elementwise (everything else on
the compute stream); "idle" is the time in the phase when no kernel of the compute stream runs.
Kernels of the other streams (the norm's sums, AdamW beside the next forward) are summed per
step by name. Prints the medians over the traced steps that hold a whole forward and backward.
"""
import csv
import gzip
import re
import statistics
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            start = float(r["start_us"])
            yield start, start + float(r["duration_us"]), int(r["stream"]), r["kernel"]


def group(name):
    if name.startswith("nvjet") or name.startswith("cublasLt") or "gemm" in name.lower():
        return "GEMMs"
    if "flash" in name:
        return "attention"
    return "elementwise"


def short(name):
    name = re.sub(r"<.*", "", name)
    return name.split("::")[-1]


def busy(intervals):
    """Length of the union of (start, end) intervals."""
    total, reach = 0.0, None
    for a, b in sorted(intervals):
        if reach is None or a > reach:
            total += b - a
            reach = b
        elif b > reach:
            total += b - reach
            reach = b
    return total


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    kernels = sorted(load(sys.argv[1]))
    compute = next((s for _, _, s, n in kernels if "embedding_forward" in n), None)
    if compute is None:
        sys.exit("trace_phases.py: no embedding forward kernel in the trace")
    main_stream = [k for k in kernels if k[2] == compute]
    starts = [i for i, k in enumerate(main_stream) if "embedding_forward" in k[3]]
    steps = []
    for a, b in zip(starts, starts[1:] + [len(main_stream)]):
        step = main_stream[a:b]
        ce = next((i for i, k in enumerate(step) if "cross_entropy" in k[3]), None)
        eb = next((i for i, k in enumerate(step) if "embedding_backward" in k[3]), None)
        if ce is None or eb is None or eb < ce:
            continue
        phases = {"forward": step[: ce + 1], "backward": step[ce + 1 : eb + 1]}
        row = {}
        for phase, ks in phases.items():
            span = ks[-1][1] - ks[0][0]
            row[(phase, "span")] = span
            row[(phase, "idle")] = span - busy([(k[0], k[1]) for k in ks])
            row[(phase, "kernels")] = len(ks)
            for k in ks:
                key = (phase, group(k[3]))
                row[key] = row.get(key, 0.0) + k[1] - k[0]
                key = (phase, group(k[3]), short(k[3]))
                row[key] = row.get(key, 0.0) + k[1] - k[0]
        t0, t1 = step[0][0], (main_stream[b][0] if b < len(main_stream) else step[-1][1])
        for k in kernels:
            if k[2] != compute and t0 <= k[0] < t1:
                key = ("beside", short(k[3]))
                row[key] = row.get(key, 0.0) + k[1] - k[0]
        steps.append(row)
    if not steps:
        sys.exit("trace_phases.py: no step with a whole forward and backward")
    keys = sorted({k for row in steps for k in row}, key=str)

    def med(key):
        return statistics.median(row.get(key, 0.0) for row in steps)

    print(f"{len(steps)} steps; medians in ms")
    for phase in ("forward", "backward"):
        print(f"{phase}: {med((phase, 'span')) / 1e3:.2f} ms, {med((phase, 'kernels')):.0f} kernels")
        for g in ("GEMMs", "attention", "elementwise"):
            parts = sorted(((med(k), k[2]) for k in keys if len(k) == 3 and k[:2] == (phase, g)),
                           reverse=True)
            detail = ", ".join(f"{n} {v / 1e3:.2f}" for v, n in parts[:5] if v >= 50)
            print(f"  {g:12s} {med((phase, g)) / 1e3:6.2f}  ({detail})")
        print(f"  {'idle':12s} {med((phase, 'idle')) / 1e3:6.2f}")
    beside = sorted(((med(k), k[1]) for k in keys if k[0] == "beside"), reverse=True)
    print("beside, on other streams: " + ", ".join(f"{n} {v / 1e3:.2f}" for v, n in beside))


if __name__ == "__main__":
    main()
