#!/usr/bin/env python3
"""The "where the remaining time goes" tables of docs/performance.md from benchmark CSV rows
(trainer --benchmark --csv on a GPU, which measures each phase's floor).

    launch/floors_table.py results.csv          the floors in time
    launch/floors_table.py --cap results.csv    the parts in joules at the power cap
                                                (rows of runs with --floors-at-cap)

The floors: one row per run, each phase's measured mean, its floor (the step's GEMMs timed alone +
flash attention at its measured throughput + elementwise and optimizer bytes at the measured copy
bandwidth) and the ratio, and what the whole step would take at the floors.

At the cap: one row per run, the joules of each part alone at the GPU's power limit, their sum and
that sum over the limit, the step (median) with the power it drew, and the steps' joules over the
parts'.
"""
import csv
import sys


def floors(rows):
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


def at_cap(rows):
    print("| model | batch×ctx | GEMMs J (share) | attention J | elementwise J | optimizer J | "
          "the parts J | the parts at the limit ms | step ms (power) | step / parts |")
    print("|" + "---|" * 10)
    for r in rows:
        if float(r.get("cap_parts_j") or 0) <= 0:
            continue
        f = {k: float(r[k]) for k in ("cap_gemm_j", "cap_attention_j", "cap_elementwise_j",
                                      "cap_optimizer_j", "cap_parts_j", "cap_limit_w",
                                      "step_median_ms", "power_w", "step_j")}
        parts = f["cap_parts_j"]
        print(f"| {r['model']} | {r['batch']}×{r['ctx']} | "
              f"{f['cap_gemm_j']:.2f} ({100 * f['cap_gemm_j'] / parts:.0f}%) | "
              f"{f['cap_attention_j']:.2f} | {f['cap_elementwise_j']:.2f} | "
              f"{f['cap_optimizer_j']:.2f} | {parts:.2f} | "
              f"{1e3 * parts / f['cap_limit_w']:.2f} at {f['cap_limit_w']:.0f} W | "
              f"{f['step_median_ms']:.2f} ({f['power_w']:.0f} W) | "
              f"{f['step_j'] / parts:.2f}× |")


def main(argv):
    cap = "--cap" in argv
    paths = [a for a in argv if a != "--cap"]
    if len(paths) != 1:
        sys.exit("usage: floors_table.py [--cap] results.csv")
    rows = [r for r in csv.DictReader(open(paths[0])) if r.get("time") != "oom"]
    if cap:
        if rows and "cap_parts_j" not in rows[0]:
            sys.exit(f"{paths[0]} has no cap_parts_j column: written before --floors-at-cap")
        at_cap(rows)
    else:
        floors(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
