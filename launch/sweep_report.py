#!/usr/bin/env python3
"""Renders a benchmark sweep's CSV (launch/slurm/sweep.sh, launch/bench_ddp.sh, trainer --csv):
the Markdown table to OUT.md and the step-time plot to OUT.png, beside the CSV unless --out
names another prefix; the table is printed too.

    launch/sweep_report.py results.csv [--out PREFIX] [--title TITLE]
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_table  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--out", help="prefix of the .md and .png files (default: the CSV's)")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    try:
        rows = list(csv.DictReader(open(a.csv)))
    except OSError as e:
        sys.exit(f"sweep_report.py: cannot read {a.csv}: {e.strerror}")
    if not rows:
        sys.exit(f"sweep_report.py: {a.csv} holds no rows")
    prefix = a.out or os.path.splitext(a.csv)[0]
    table = bench_table.render(a.csv)
    with open(prefix + ".md", "w") as f:
        f.write(table + "\n")
    print(table)
    try:
        import plot_ddp  # needs matplotlib
    except ImportError:
        sys.exit("sweep_report.py: the plot needs matplotlib (python3 -m pip install matplotlib); "
                 f"the table is in {prefix}.md")
    title = a.title or f"{os.path.basename(a.csv)}: {len(rows)} runs"
    plot_ddp.plot(plot_ddp.read_rows([a.csv]), prefix + ".png", title)
    print(f"table: {prefix}.md, plot: {prefix}.png")


if __name__ == "__main__":
    main()
