#!/usr/bin/env python3
"""The "where the remaining time goes" table of docs/performance.md from benchmark CSV rows
(trainer --benchmark --csv on a GPU, which measures each phase's floor).

    launch/floors_table.py results.csv

One row per run: each phase's measured mean, its floor (the step's GEMMs timed alone + flash
attention at its measured throughput + elementwise and optimizer bytes at the measured copy
bandwidth) and the ratio, and what the whole step would take at the floors.
"""
import csv
import sys


def main(path):
    rows = [r for r in csv.DictReader(open(path)) if r.get("time") != "oom"]
    print("| model | batch×ctx | forward ms (floor, ×) | backward ms (floor, ×) | optimizer ms "
          "(floor, ×) | GEMMs alone fwd / bwd ms | step ms | step at the floors ms | copy GB/s |")
    print("|" + "---|" * 9)
    for r in rows:
        if not r.get("forward_floor_ms"):
            continue
        f = {k: float(r[k]) for k in ("forward_ms", "backward_ms", "optimizer_ms",
                                      "forward_floor_ms", "backward_floor_ms",
                                      "optimizer_floor_ms", "gemm_forward_ms", "gemm_backward_ms",
                                      "step_median_ms", "copy_gb_s")}

        def cell(ms, floor):
            return f"{ms:.2f} ({floor:.2f}, {ms / floor:.2f}×)" if floor > 0 else f"{ms:.2f}"

        floor = f["forward_floor_ms"] + f["backward_floor_ms"] + f["optimizer_floor_ms"]
        print(f"| {r['model']} | {r['batch']}×{r['ctx']} | "
              f"{cell(f['forward_ms'], f['forward_floor_ms'])} | "
              f"{cell(f['backward_ms'], f['backward_floor_ms'])} | "
              f"{cell(f['optimizer_ms'], f['optimizer_floor_ms'])} | "
              f"{f['gemm_forward_ms']:.2f} / {f['gemm_backward_ms']:.2f} | "
              f"{f['step_median_ms']:.2f} | {floor:.2f} | {f['copy_gb_s']:.0f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: floors_table.py results.csv")
    main(sys.argv[1])
