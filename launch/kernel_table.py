#!/usr/bin/env python3
"""Groups one training step's kernels from an ncu --csv --page raw log by kernel name.

    launch/kernel_table.py PROFILE.csv

The step is the run of kernels after the first step's AdamW launches up to and including the
second step's (launch/kernel_profile.sh runs two steps; the update may come as several launches in
a row, one per chunk of parameters). Prints count, total and share per kernel, largest first,
then the sums by phase.
"""
import csv
import re
import sys


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not quoted
    reader = csv.reader(lines)
    header = next(reader)
    next(reader)  # units
    name = header.index("Kernel Name")
    dur = header.index("gpu__time_duration.sum")
    for r in reader:
        yield r[name], float(r[dur].replace(",", ""))


def short(name):
    name = re.sub(r"\(.*", "", name)  # drop the argument list
    name = re.sub(r"^void ", "", name)
    return name[:90]


def main():
    kernels = list(rows(sys.argv[1]))
    adam = [i for i, (n, _) in enumerate(kernels) if "adamw" in n]
    # Each step's update: one run of consecutive AdamW launches; keep where each run ends.
    ends = [i for j, i in enumerate(adam) if j + 1 == len(adam) or adam[j + 1] != i + 1]
    if len(ends) < 2:
        sys.exit(f"{sys.argv[1]}: fewer than two AdamW updates ({len(ends)}); raise LAUNCH_COUNT")
    step = kernels[ends[0] + 1 : ends[1] + 1]
    groups = {}
    for n, d in step:
        c, t = groups.get(short(n), (0, 0.0))
        groups[short(n)] = (c + 1, t + d)
    total = sum(d for _, d in step) / 1e6  # ns -> ms
    print(f"kernels in the step: {len(step)}, their GPU time alone: {total:.3f} ms")
    print(f"{'ms':>8} {'share':>6} {'count':>6}  kernel")
    for n, (c, t) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{t / 1e6:8.3f} {t / 1e6 / total:6.1%} {c:6d}  {n}")
    # By phase, to hold against the phase times --benchmark prints: forward ends with the
    # cross-entropy kernel, the optimizer is the AdamW launches; the gradient norm's sums run on a
    # side stream beside backward on one GPU, so they are listed apart.
    ce = [i for i, (n, _) in enumerate(step) if "cross_entropy" in n]
    if ce:
        fwd, rest = step[: ce[-1] + 1], step[ce[-1] + 1 :]
        side = [d for n, d in rest if "sum_squares" in n]
        opt = [d for n, d in rest if "adamw" in n]
        bwd = [d for n, d in rest if "sum_squares" not in n and "adamw" not in n]
        ms = lambda ds: sum(ds) / 1e6
        print(f"by phase: forward {len(fwd)} kernels {ms(d for _, d in fwd):.3f} ms | backward "
              f"{len(bwd)} kernels {ms(bwd):.3f} ms (+ {len(side)} norm sums {ms(side):.3f} ms "
              f"beside it) | optimizer {len(opt)} launches {ms(opt):.3f} ms")


if __name__ == "__main__":
    main()
