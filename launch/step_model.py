#!/usr/bin/env python3
"""A step-time model of this runtime's data-parallel training (docs/scaling.md).

From one GPU's measured phase times, the model's gradient layout, the strategy and the links'
latency and bandwidth, it replays one step as two streams, compute and communication:

  * forward, backward and the optimizer take the one-GPU times; backward is cut into the
    tensors' gradients in backward order, each in proportion to its FLOPs, and a unit (bucket,
    tensor, whole buffer) is handed to the comm stream when its last tensor is final, as
    comm/grad_sync.cpp does (naive and flat: after backward);
  * a collective costs hops * latency + bytes * f / bus bandwidth (f = 2(n-1)/n for an
    all-reduce, (n-1)/n for reduce-scatter and all-gather), as ring, or for an all-reduce across
    hosts the faster of ring and tree, with NCCL's step counts; with --grad-reduce bf16 half the
    bytes and two conversion passes over the gradients on the comm stream;
  * while both streams work, compute runs at rate r_c and the collectives at rate r_m of their
    speed alone: the sharing measured on GPUs (backward 36.6 -> 52 ms beside NCCL), fitted to
    measured rows, per kind of link;
  * ZeRO-1: reduce-scatter during backward, the update of 1/n of the parameters in parts, and
    each part's bf16 all-gather overlapping the next part and the next forward, whose blocks wait
    for the parts they read.

Subcommands (each prints Markdown tables; --out DIR also writes CSVs and PNGs there):
  units    the gradient units of a model and strategy, as the trainer logs them
  links    latency and bus bandwidth fitted to comm_bench CSVs
  validate MANIFEST [--out DIR]      calibrate on the rows it names, predict every measured row
  predict  --params P.json --compute CSV ...   large clusters: efficiency, best setting, memory
  scaling  SWEEP.csv --params P.json [--out F.png]   measured sweep points under the model's line
"""
import argparse
import csv
import json
import os
import sys

from step_sim import (  # noqa: E402  (launch/ is on sys.path when this script runs)
    OPS, MIB, die, Model, plan_units, describe_units, ring_steps, bus_factor, Link, Cluster,
    fit_latency_bandwidth, link_from_comm_bench, Run, read_csv_rows,
)

# ---------------------------------------------------------------------------------------------
# Measured rows (the trainer's benchmark CSV) and the manifest that names them

def matches(row, filters):
    for k, v in filters.items():
        if k not in row:
            die(f"filter on '{k}', which the CSV has no column of")
        if row[k] not in v.split("|"):
            return False
    return True


def model_of(row):
    return Model(row["d_model"], row["d_ff"], row["layers"], row["vocab"], row["ctx"], row["model"])


def same_shape(a, b):
    return all(a[k] == b[k] for k in ("d_model", "d_ff", "layers", "vocab", "ctx", "batch",
                                      "grad_accum"))


def describe(row):
    hosts = int(row.get("hosts") or 1)
    w = row["world"] + (f" ({hosts} hosts)" if hosts > 1 else "")
    if row["ddp"] == "none":
        c = "-"
    else:
        c = row["ddp"] + (f" {float(row['bucket_mb']):g} MiB" if row["ddp"] == "bucketed" else "")
        c += " + ZeRO-1" if row["shard_optim"] == "1" else ""
        c += ", bf16 grads" if row.get("grad_reduce") == "bf16" else ""
        c += ", NCCL over TCP (lo)" if "NCCL_P2P_DISABLE=1" in row.get("nccl_env", "") else ""
    k = int(row["grad_accum"])
    return w, c + (f", x{k} accum" if k > 1 else "")


def link_name(row):
    if int(row.get("hosts") or 1) > 1:
        return "hosts"
    return "socket" if "NCCL_P2P_DISABLE=1" in row.get("nccl_env", "") else "nvlink"


def run_of_row(row, compute, links, zero1, link=None):
    """The Run that predicts `row`, with phase times from `compute` (a one-GPU row)."""
    hosts = int(row.get("hosts") or 1)
    world = int(row["world"])
    if world % hosts:
        die(f"row with world {world} on {hosts} hosts")
    name = link or link_name(row)
    need = ["hosts", "nvlink"] if name == "hosts" else [name]
    for lk in need:
        if lk not in links:
            die(f"no link '{lk}' defined for a row of {describe(row)}")
    cl = (Cluster(hosts, world // hosts, links["nvlink"], links["hosts"]) if name == "hosts" else
          Cluster(1, world, links[name]))
    k = int(row["grad_accum"])
    return Run(model_of(row), cl, float(compute["forward_ms"]) / k,
               float(compute["backward_ms"]) / k, float(compute["optimizer_ms"]),
               row["ddp"], float(row["bucket_mb"]), row["shard_optim"] == "1",
               row.get("grad_reduce") == "bf16", k, zero1)


class Manifest:
    """Lines (# comments):
      link NAME comm_bench CSV...           latency and bandwidth from comm_bench
      link NAME rows CSV [col=v|w ...]      from trainer rows whose collectives ran alone
                                            (comm_total_ms = the sum of their collectives)
      share NAME CSV [col=v|w ...]          fit r_c, r_m of link NAME to these rows
      fit NAME PARAM CSV [col=v|w ...] [target=COL]   fit one parameter of link NAME to the
                                            rows' column COL (default step_median_ms); PARAM:
                                            busbw:OP (GB/s), base:OP (us), scale@N (bandwidth
                                            factor at N ranks)
      rows CSV [col=v|w ...] [zero1=after|update|forward]   rows to predict
    link lines take hop_us=H: the latency of one ring step (default 0; see Link); share lines
    r_c=X or r_m=X to hold one of the two fixed.
    Paths are relative to the manifest's directory's repository root (its parent's parent) or
    absolute. Link names: nvlink, socket (NCCL over TCP inside one host), hosts (between hosts)."""

    def __init__(self, path):
        self.root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(path))))
        self.rows = []
        self.steps = []  # link, share and fit lines in file order
        try:
            lines = open(path).read().splitlines()
        except OSError as e:
            die(f"cannot read manifest {path}: {e.strerror}")
        for no, line in enumerate(lines, 1):
            w = line.split("#", 1)[0].split()
            if not w:
                continue
            where = f"{path}:{no}"
            kv = {x.split("=", 1)[0]: x.split("=", 1)[1] for x in w if "=" in x}
            pos = [x for x in w if "=" not in x]
            if w[0] == "link" and len(pos) >= 4 and pos[2] in ("comm_bench", "rows"):
                self.steps.append(("link", pos[1], pos[2], [self.file(p) for p in pos[3:]], kv))
            elif w[0] == "share" and len(pos) == 3:
                z = kv.pop("zero1", "forward")
                self.steps.append(("share", pos[1], self.file(pos[2]), kv, z))
            elif w[0] == "fit" and len(pos) == 4:
                z = kv.pop("zero1", "forward")
                target = kv.pop("target", "step_median_ms")
                self.steps.append(("fit", pos[1], pos[2], self.file(pos[3]), kv, z, target))
            elif w[0] == "rows" and len(pos) == 2:
                z = kv.pop("zero1", "forward")
                if z not in ("after", "update", "forward"):
                    die(f"{where}: zero1={z}: after, update or forward")
                self.rows.append((self.file(pos[1]), kv, z))
            else:
                die(f"{where}: cannot read '{line.strip()}' (see Manifest in step_model.py)")

    def file(self, p):
        return p if os.path.isabs(p) else os.path.join(self.root, p)


def compute_row(rows, row, path):
    for r in rows:
        if r["world"] == "1" and same_shape(r, row):
            return r
    die(f"{path}: no one-GPU row of the same shape for {' '.join(describe(row))}")


def fit_link_rows(name, path, filters, links, hop=0.0):
    """Per-collective latency and bus bandwidth from rows whose collectives ran alone: their
    comm_total_ms is the sum of their collectives' times (hop: given, see Link)."""
    rows = [r for r in read_csv_rows(path) if r["world"] != "1" and matches(r, filters)]
    if not rows:
        die(f"link {name}: no rows of {path} match {filters}")
    probe = dict(links, **{name: Link(name, {"all_reduce": 0.0}, {"all_reduce": 1.0})})
    xs, ys = [], []
    for r in rows:
        run = run_of_row(r, r, probe, "forward", name)
        n, units = run.cl.n, plan_units(run.m, run.strategy, run.bucket_mb, run.cl.n)
        if run.shard or run.bf16:
            die(f"link {name}: fit to all-reduces of fp32 gradients (no --shard-optim, no bf16)")
        xs.append((len(units), sum(bus_factor("all_reduce", n) * (u[1] - u[0]) * 4
                                   for u in units)))
        ys.append(float(r["comm_total_ms"]) * 1e3 - len(units) * ring_steps("all_reduce", n) * hop)
    # y = collectives * base + bytes / bw
    base, inv = fit_latency_bandwidth([x[0] for x in xs], [x[1] for x in xs], ys)
    src = f"rows of {os.path.basename(path)} ({', '.join(describe(r)[1] for r in rows)})"
    return Link(name, {"all_reduce": base}, {"all_reduce": 1e-3 / inv}, hop, source=src)


def predict_rows(rows_by_file, links):
    out = []
    for path, rows, sel, zero1 in rows_by_file:
        for r in sel:
            comp = compute_row(rows, r, path)
            p = run_of_row(r, comp, links, zero1).simulate()
            out.append((path, r, p))
    return out


def rel(p, m):
    return (p - m) / m if m else 0.0


def fit_share(name, path, filters, zero1, links):
    rows = read_csv_rows(path)
    fixed_c, fixed_m = filters.pop("r_c", None), filters.pop("r_m", None)
    sel = [r for r in rows if r["world"] != "1" and matches(r, filters)]
    if not sel:
        die(f"share {name}: no rows of {path} match {filters}")
    lk = links[name]

    def cost(rc, rm):
        lk.r_c, lk.r_m = rc, rm
        e = 0.0
        for _, r, p in predict_rows([(path, rows, sel, zero1)], links):
            e += rel(p["step"], float(r["step_median_ms"])) ** 2
            e += rel(p["backward"], float(r["backward_ms"])) ** 2
            e += rel(p["comm_total"], float(r["comm_total_ms"])) ** 2
        return e

    cs = [float(fixed_c)] if fixed_c else [c / 20 for c in range(4, 21)]
    ms = [float(fixed_m)] if fixed_m else [m / 20 for m in range(4, 21)]
    best = min(((c, m) for c in cs for m in ms), key=lambda g: cost(*g))
    fine = [(best[0] + (0 if fixed_c else i / 100), best[1] + (0 if fixed_m else j / 100))
            for i in range(-5, 6) for j in range(-5, 6)]
    fine = [g for g in set(fine) if 0.05 <= g[0] <= 1 and 0.05 <= g[1] <= 1]
    lk.r_c, lk.r_m = min(fine, key=lambda g: cost(*g))
    lk.source += f"; sharing fitted to {os.path.basename(path)} ({len(sel)} rows)"
    return sel


def fit_param(name, param, path, filters, zero1, target, links):
    """One parameter of a link, by simulation: a scan over a wide range, then refined."""
    rows = read_csv_rows(path)
    sel = [r for r in rows if r["world"] != "1" and matches(r, filters)]
    if not sel:
        die(f"fit {name} {param}: no rows of {path} match {filters}")
    if target not in sel[0]:
        die(f"fit {name} {param}: {path} has no column {target}")
    lk = links[name]
    kind, _, arg = param.partition(":")
    if kind.startswith("scale@"):
        n = int(kind[6:])
        get, put = (lambda: lk.scale.get(n, 1.0)), (lambda v: lk.scale.__setitem__(n, v))
    elif kind in ("busbw", "base") and arg in OPS:
        d = lk.busbw if kind == "busbw" else lk.base_us
        get, put = (lambda: d[arg]), (lambda v: d.__setitem__(arg, v))
    else:
        die(f"fit {name}: parameter '{param}' is not busbw:OP, base:OP or scale@N")
    key = {"step_median_ms": "step", "comm_ms": "comm", "comm_total_ms": "comm_total",
           "backward_ms": "backward", "forward_ms": "forward", "optimizer_ms": "optimizer"}
    if target not in key:
        die(f"fit {name} {param}: target {target} is not one of {', '.join(key)}")

    def cost(v):
        put(v)
        return sum(rel(p[key[target]], float(r[target])) ** 2
                   for _, r, p in predict_rows([(path, rows, sel, zero1)], links))

    start = max(get(), 1e-3)
    lo, hi = (start / 30, start * 30) if kind != "base" else (0.01, 1000.0)
    grid = [lo * (hi / lo) ** (i / 40) for i in range(41)]
    best = min(range(41), key=lambda i: cost(grid[i]))
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, 40)]
    for _ in range(30):
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        if cost(m1) < cost(m2):
            b = m2
        else:
            a = m1
    put((a + b) / 2)
    lk.source += f"; {param} fitted to {target} of {os.path.basename(path)} ({len(sel)} rows)"
    return sel


def calibrate(man):
    links, calib = {}, set()
    for st in man.steps:
        if st[0] == "link":
            _, name, kind, paths, kv = st
            min_mib = float(kv.pop("min_mib", 0))
            hop = float(kv.pop("hop_us", 0))
            links[name] = (
                link_from_comm_bench(name, paths, kv.pop("dtype", "fp32"), min_mib * MIB, hop)
                if kind == "comm_bench" else fit_link_rows(name, paths[0], kv, links, hop))
            continue
        if st[1] not in links:
            die(f"{st[0]} {st[1]}: no link {st[1]} defined before it")
        sel = fit_share(*st[1:], links) if st[0] == "share" else fit_param(*st[1:], links)
        calib.update((st[3] if st[0] == "fit" else st[2], r["time"]) for r in sel)
    return links, calib


def write_csv(path, dicts):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=list(dicts[0]))
        wr.writeheader()
        wr.writerows(dicts)


def fmt_ms(x):
    return f"{x:,.1f}" if x >= 100 else f"{x:.2f}"


def cmd_validate(a):
    man = Manifest(a.manifest)
    links, calib = calibrate(man)
    sets = []
    for path, kv, z in man.rows:
        rows = read_csv_rows(path)
        sel = [r for r in rows if matches(r, kv)]
        if not sel:
            die(f"rows {path}: no row matches {kv}")
        sets.append((path, rows, sel, z))
    print("## Links\n")
    print("| link | latency us: base + hop per ring step | bus bandwidth GB/s: all-reduce, "
          "reduce, broadcast | scale | r_c | r_m | from |\n|---|---|---|---|---|---|---|")
    for name, lk in links.items():
        bw = ", ".join(f"{lk.busbw[o]:.1f}" for o in ("all_reduce", "reduce", "broadcast"))
        sc = ", ".join(f"x{v:.2f} at {k}" for k, v in lk.scale.items()) or "-"
        print(f"| {name} | {lk.base_us['all_reduce']:.1f} + {lk.hop:g} | {bw} | {sc} | "
              f"{lk.r_c:.2f} | {lk.r_m:.2f} | {lk.source} |")
    print("\n## Predicted against measured (ms per step; p = predicted, m = measured)\n")
    print("| file | world | configuration | step m | step p | error | bwd m | bwd p | exposed m | "
          "exposed p | collectives m | collectives p | role |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    table, worst = [], 0.0
    for path, r, p in predict_rows(sets, links):
        m = float(r["step_median_ms"])
        err = rel(p["step"], m)
        role = "fit" if (path, r["time"]) in calib else "check"
        if role == "check" and r["world"] != "1":
            worst = max(worst, abs(err))
        w, c = describe(r)
        print(f"| {os.path.basename(path)} | {w} | {c} | {fmt_ms(m)} | {fmt_ms(p['step'])} | "
              f"{100 * err:+.1f}% | {fmt_ms(float(r['backward_ms']))} | {fmt_ms(p['backward'])} | "
              f"{fmt_ms(float(r['comm_ms']))} | {fmt_ms(p['comm'])} | "
              f"{fmt_ms(float(r['comm_total_ms']))} | {fmt_ms(p['comm_total'])} | {role} |")
        table.append({"file": os.path.basename(path), "world": w, "configuration": c,
                      "step_ms": m, "step_pred_ms": p["step"], "error": err,
                      "backward_ms": float(r["backward_ms"]), "backward_pred_ms": p["backward"],
                      "comm_ms": float(r["comm_ms"]), "comm_pred_ms": p["comm"],
                      "comm_total_ms": float(r["comm_total_ms"]),
                      "comm_total_pred_ms": p["comm_total"], "role": role})
    checks = [t for t in table if t["role"] == "check" and not t["world"].startswith("1")]
    within = sum(abs(t["error"]) <= 0.10 for t in checks)
    print(f"\n{within} of {len(checks)} multi-GPU rows not used in the fit within 10% of the "
          f"measured step; largest error {100 * worst:.1f}%")
    if a.out:
        write_csv(os.path.join(a.out, "validation.csv"), table)
        with open(os.path.join(a.out, "params.json"), "w") as fh:
            json.dump({k: v.to_json() for k, v in links.items()}, fh, indent=1)
        print(f"wrote {a.out}/validation.csv and {a.out}/params.json")
    return 0


def load_params(path):
    try:
        j = json.load(open(path))
    except (OSError, ValueError) as e:
        die(f"cannot read model parameters {path}: {e} (write them with validate --out DIR)")
    links = {k: Link.from_json(k, v) for k, v in j.items()}
    if "nvlink" not in links:
        die(f"{path} has no nvlink link")
    return links


def network(links, gbps, efficiency, hop_us):
    """The link between hosts at `gbps` per GPU: bus bandwidth per GPU = line rate x efficiency,
    the measured hosts link's sharing (NCCL's network transport), NVLink's base latency."""
    nv, h = links["nvlink"], links.get("hosts")
    return Link(f"{gbps:g} Gb/s", {o: nv.base_us[o] for o in OPS},
                {o: gbps / 8 * efficiency for o in OPS}, hop_us, h.r_c if h else 1.0, 1.0,
                f"{gbps:g} Gb/s per GPU x {efficiency}")


def one_gpu(path, model, ctx, batch):
    for r in read_csv_rows(path):
        if r["model"] == model and r["world"] == "1" and int(r["ctx"]) == ctx and \
                int(r["batch"]) == batch and r["grad_accum"] == "1":
            return r
    die(f"{path}: no one-GPU row of {model} at batch {batch} x ctx {ctx}")


SETTINGS = [(b, sh, bf) for sh in (False, True) for bf in (False, True) for b in (25, 100, 1000)]


def setting_name(b, sh, bf):
    return f"bucketed {b} MiB" + (" + ZeRO-1" if sh else "") + (", bf16 grads" if bf else "")


def memory_gib(row, model, n, shard):
    """Measured one-GPU peak, less the optimizer state ZeRO-1 moves off (12 B per parameter of
    the other ranks' shards); NCCL's own buffers (about 0.8 GiB measured on 2 GPUs) are not in."""
    peak = float(row["peak_mem_gib"])
    return peak - (12.0 * model.flat(n) * (1 - 1 / n) / 2 ** 30 if shard and n > 1 else 0.0)


def cmd_predict(a):
    links = load_params(a.params)
    nv = links["nvlink"]
    gpus = [int(x) for x in a.gpus.split(",")]
    rows = []
    comps = {name: one_gpu(a.compute, name, a.ctx, a.batch) for name in a.models.split(",")}
    for name, comp in comps.items():
        m = model_of(comp)
        f, b, o = (float(comp[k]) for k in ("forward_ms", "backward_ms", "optimizer_ms"))
        t1 = f + b + o
        for gbps in (float(x) for x in a.gbps.split(",")):
            net = network(links, gbps, a.efficiency, a.net_hop_us)
            for n in gpus:
                G = min(n, a.per_host)
                if n % G:
                    die(f"{n} GPUs do not fill hosts of {a.per_host}")
                intra = Link("nvlink", nv.base_us, nv.busbw, nv.hop, nv.r_c, nv.r_m, "",
                             {G: nv.scale.get(G, max(nv.scale.values(), default=1.0))})
                cl = Cluster(n // G, G, intra, net)
                for bk, sh, bf in SETTINGS:
                    p = Run(m, cl, f, b, o, "bucketed", bk, sh, bf).simulate()
                    rows.append({"model": name, "gbps": gbps, "gpus": n, "hosts": n // G,
                                 "setting": setting_name(bk, sh, bf), "step_ms": p["step"],
                                 "exposed_ms": p["comm"], "backward_ms": p["backward"],
                                 "efficiency": t1 / p["step"],
                                 "mem_gib": memory_gib(comp, m, n, sh)})
    best = {}
    for r in rows:
        k = (r["model"], r["gbps"], r["gpus"])
        if k not in best or r["step_ms"] < best[k]["step_ms"]:
            best[k] = r
    print(f"## Predicted weak scaling: {a.models} at batch {a.batch} x ctx {a.ctx} per GPU, "
          f"{a.per_host} GPUs per host (one-GPU phases: {os.path.basename(a.compute)})\n")
    print("| model | Gb/s per GPU | GPUs | best setting | step ms | exposed ms | efficiency | "
          "fp32 bucketed 25 MiB efficiency | GiB per GPU (best) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, gbps, n), r in best.items():
        ref = next(x for x in rows if x["model"] == name and x["gbps"] == gbps and
                   x["gpus"] == n and x["setting"] == setting_name(25, False, False))
        print(f"| {name} | {gbps:g} | {n} | {r['setting']} | {r['step_ms']:.1f} | "
              f"{r['exposed_ms']:.1f} | {100 * r['efficiency']:.1f}% | "
              f"{100 * ref['efficiency']:.1f}% | {r['mem_gib']:.1f} |")
    print("\n## Memory per GPU, GiB (measured one-GPU peak; ZeRO-1 less 12 B x the other "
          "ranks' parameters)\n")
    print("| model | " + " | ".join(f"{n} GPUs" for n in gpus) + " |")
    print("|---|" + "---|" * len(gpus))
    for name, comp in comps.items():
        m = model_of(comp)
        for sh in (False, True):
            print(f"| {name}{' --shard-optim' if sh else ''} | " +
                  " | ".join(f"{memory_gib(comp, m, n, sh):.1f}" for n in gpus) + " |")
    if a.out:
        write_csv(os.path.join(a.out, "predictions.csv"), rows)
        plot_predictions(rows, a.out)
        print(f"\nwrote {a.out}/predictions.csv and {a.out}/scaling_<model>.png")
    return 0


def plot_predictions(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for name in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == name]
        bws = list(dict.fromkeys(r["gbps"] for r in rs))
        fig, axes = plt.subplots(1, len(bws), figsize=(5 * len(bws), 4.2), sharey=True,
                                 squeeze=False)
        for ax, gbps in zip(axes[0], bws):
            for st in dict.fromkeys(r["setting"] for r in rs):
                pts = sorted((r["gpus"], r["efficiency"]) for r in rs
                             if r["gbps"] == gbps and r["setting"] == st)
                ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker=".",
                        label=st, lw=1.2, ls="--" if "bf16" in st else "-")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{name}: {gbps:g} Gb/s per GPU between hosts")
            ax.set_xlabel("GPUs (8 per host)")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("weak-scaling efficiency, % of one GPU")
        axes[0][-1].legend(fontsize=7, loc="lower left")
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"scaling_{name}.png"), dpi=110)
        plt.close(fig)


def cmd_scaling(a):
    """Measured sweep rows (the trainer's CSV) against the model's line, per setting."""
    links = load_params(a.params)
    rows = [r for r in read_csv_rows(a.csv)]
    if not rows:
        die(f"{a.csv} holds no rows")
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["ctx"], r["batch"], r["grad_accum"]), []).append(r)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    print("| model | GPUs | hosts | configuration | step ms measured | predicted | efficiency "
          "measured | predicted |\n|---|---|---|---|---|---|---|---|")
    for key, rs in groups.items():
        base = [r for r in rs if r["world"] == "1"]
        if not base:
            print(f"(no one-GPU row for {key[0]} batch {key[2]} x ctx {key[1]}: skipped)")
            continue
        b = base[0]
        t1 = float(b["step_median_ms"])
        series = {}
        for r in rs:
            if r["world"] == "1":
                continue
            run = run_of_row(r, b, links, a.zero1)
            p = run.simulate()
            cfg = describe(r)[1]
            eff_m, eff_p = t1 / float(r["step_median_ms"]), t1 / p["step"]
            series.setdefault(cfg, []).append((int(r["world"]), eff_m, eff_p))
            print(f"| {r['model']} | {r['world']} | {r.get('hosts') or 1} | {cfg} | "
                  f"{float(r['step_median_ms']):.1f} | {p['step']:.1f} | {100 * eff_m:.1f}% | "
                  f"{100 * eff_p:.1f}% |")
        for cfg, pts in series.items():
            pts.sort()
            line, = ax.plot([1] + [p[0] for p in pts], [100] + [100 * p[2] for p in pts],
                            lw=1.2, label=f"{key[0]} {cfg}: model")
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "o",
                    color=line.get_color(), label=f"{key[0]} {cfg}: measured")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs (ranks)")
    ax.set_ylabel("weak-scaling efficiency, % of one rank")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = a.out or os.path.splitext(a.csv)[0] + "_scaling.png"
    fig.savefig(out, dpi=110)
    print(f"\nwrote {out}")
    return 0


def cmd_units(a):
    m = Model.preset(a.model, a.vocab, a.ctx)
    print(describe_units(plan_units(m, a.ddp, a.bucket_mb, a.world)))
    return 0


def cmd_links(a):
    for i, p in enumerate(a.csv):
        lk = link_from_comm_bench(os.path.basename(p), [p], a.dtype, a.min_mib * MIB)
        if i == 0:
            print("| CSV | op | latency us | bus bandwidth GB/s |\n|---|---|---|---|")
        for op in OPS[:4]:
            print(f"| {os.path.basename(p)} | {op} | {lk.base_us[op]:.2f} | {lk.busbw[op]:.2f} |")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("units", help="the gradient units of a preset and strategy")
    u.add_argument("--model", default="xl")
    u.add_argument("--vocab", type=int, default=10000)
    u.add_argument("--ctx", type=int, default=512)
    u.add_argument("--ddp", default="bucketed")
    u.add_argument("--bucket-mb", type=float, default=25)
    u.add_argument("--world", type=int, default=2)
    lk = sub.add_parser("links", help="latency and bus bandwidth fitted to comm_bench CSVs")
    lk.add_argument("csv", nargs="+")
    lk.add_argument("--dtype", default="fp32")
    lk.add_argument("--min-mib", type=float, default=0)
    v = sub.add_parser("validate", help="calibrate, then predict every row a manifest names")
    v.add_argument("manifest")
    v.add_argument("--out")
    pr = sub.add_parser("predict", help="weak scaling on clusters of hosts of GPUs")
    pr.add_argument("--params", required=True, help="params.json written by validate --out")
    pr.add_argument("--compute", required=True, help="benchmark CSV with the one-GPU rows")
    pr.add_argument("--models", default="xl,2.7B")
    pr.add_argument("--ctx", type=int, default=512)
    pr.add_argument("--batch", type=int, default=4)
    pr.add_argument("--gpus", default="8,16,32,64,128,256,512,1024")
    pr.add_argument("--per-host", type=int, default=8)
    pr.add_argument("--gbps", default="100,200,400", help="network line rate per GPU, Gb/s")
    pr.add_argument("--efficiency", type=float, default=0.9,
                    help="bus bandwidth per GPU / line rate (default 0.9)")
    pr.add_argument("--net-hop-us", type=float, default=9.6,
                    help="latency of one ring step between hosts (default 9.6 us)")
    pr.add_argument("--out")
    sc = sub.add_parser("scaling", help="a measured sweep against the model, as a plot")
    sc.add_argument("csv")
    sc.add_argument("--params", required=True)
    sc.add_argument("--zero1", default="forward", choices=("after", "update", "forward"),
                    help="ZeRO-1 all-gather schedule of the binary that measured the sweep")
    sc.add_argument("--out")
    a = ap.parse_args(argv)
    return {"units": cmd_units, "links": cmd_links, "validate": cmd_validate,
            "predict": cmd_predict, "scaling": cmd_scaling}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
