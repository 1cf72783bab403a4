#!/usr/bin/env python3
"""Summarises a trainer --trace file: how much of each step's communication overlaps backward.

    launch/trace_overlap.py TRACE.json

Per rank and step (phases on track 0, collectives on track 1, as the trainer writes them):
backward's span, the gradient collectives launched, how many ended before backward did, the time
the comm stream was busy with them, and the tail: how long after backward's end the last one
finished. With ZeRO-1, a second table does the same for the parameter all-gathers against the
optimizer phase they start in, and adds how long the compute stream then waited for them (the
next forward waits for a part only when it reaches its parameters).
"""
import json
import sys
from collections import defaultdict


def main():
    events = json.load(open(sys.argv[1]))
    events = events["traceEvents"] if isinstance(events, dict) else events
    phases, colls = defaultdict(list), defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        span = (e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3, e["name"])
        if e.get("tid") == 0:
            phases[e["pid"]].append(span)
        elif e.get("tid") == 1:  # (track 2 holds an update beside forward, --overlap-update)
            colls[e["pid"]].append(span)
    grads = {r: [c for c in cs if not c[2].startswith("all_gather")] for r, cs in colls.items()}
    gathers = {r: [c for c in cs if c[2].startswith("all_gather")] for r, cs in colls.items()}
    table(phases, grads, "backward", "collectives")
    if any(gathers.values()):
        print()
        table(phases, gathers, "optimizer", "all-gathers", waits=True)


def table(phases, colls, phase, what, waits=False):
    extra = " waited for them until the next backward ms |" if waits else ""
    print(f"| rank | step | {phase} ms | {what} | ended inside {phase} | comm stream busy ms "
          f"| tail after {phase} ms |{extra}")
    print("|---|---|---|---|---|---|---|" + ("---|" if waits else ""))
    for rank in sorted(phases):
        spans = sorted(p for p in phases[rank] if p[2] == phase)
        backwards = sorted(p[0] for p in phases[rank] if p[2] == "backward")
        for step, (b0, b1, _) in enumerate(spans):
            # The collectives of this step start after its phase starts and before the next's.
            nxt = spans[step + 1][0] if step + 1 < len(spans) else float("inf")
            mine = [c for c in colls.get(rank, []) if b0 <= c[0] < nxt]
            if not mine:
                continue
            inside = sum(1 for c in mine if c[1] <= b1)
            busy = sum(c[1] - c[0] for c in mine)
            tail = max(0.0, max(c[1] for c in mine) - b1)
            row = (f"| {rank} | {step} | {b1 - b0:.2f} | {len(mine)} | {inside} | {busy:.2f} "
                   f"| {tail:.2f} |")
            if waits:
                # Exposed: the compute stream's "comm" intervals from the end of this phase to the
                # next backward (the wait after the update, or inside the next forward).
                until = next((t for t in backwards if t > b1), float("inf"))
                waited = sum(p[1] - p[0] for p in phases[rank]
                             if p[2] == "comm" and b1 <= p[0] < until)
                row += f" {waited:.2f} |"
            print(row)


if __name__ == "__main__":
    main()
