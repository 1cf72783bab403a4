#!/usr/bin/env python3
"""Renders benchmark CSV rows (trainer --benchmark --csv) as a Markdown table.

    launch/bench_table.py results.csv [--anchors]

--anchors adds PyTorch eager's tokens/s from ANCHORS.md (H200, batch 4 x ctx 512 and small at
16 x 1024) and the ratio to it, for the rows that have one.
"""
import csv
import sys

# PyTorch eager on H200 (ANCHORS.md): (model, batch, ctx) -> tokens/s
EAGER = {("small", 4, 512): 42156, ("medium", 4, 512): 29184, ("large", 4, 512): 17246,
         ("xl", 4, 512): 8886, ("2.7B", 4, 512): 11550, ("small", 16, 1024): 245759}


def render(path, anchors=False):
    """The rows of the CSV at `path` as a Markdown table (a string)."""
    rows = list(csv.reader(open(path)))
    head = rows[0]
    col = {name: i for i, name in enumerate(head)}
    # Newer CSVs also record the gradient precision, --comm-sms, NCCL's environment and the time
    # the collectives ran on the comm stream (a column only when some row has several ranks).
    extra = "comm_total_ms" in col and any(r[col["world"]] != "1" for r in rows[1:] if r[0] != "oom")
    out = ["| model | world | ddp | batch×ctx | step ms (median) | mean ± std | fwd ms | bwd ms "
           "| comm ms | opt ms | tok/s | MFU | peak GiB |" + (" vs eager |" if anchors else "")
           + (" collectives ran ms |" if extra else "")]
    out.append("|" + "---|" * (13 + anchors + extra))
    # A preset name with dimensions set by hand (--d-model ...) names more than one model.
    dims = {}
    for r in rows[1:]:
        if r[0] != "oom" and "d_model" in col:
            dims.setdefault(r[col["model"]], set()).add(tuple(r[col[k]] for k in ("d_model", "layers")))
    for r in rows[1:]:
        if r[0] == "oom":
            out.append(f"| {r[1]} | 1 | | {r[8]}×{r[7]} | out of memory |"
                       + " |" * (8 + anchors + extra))
            continue
        g = lambda k: r[col[k]] if k in col else ""
        f = lambda k: float(g(k))
        ddp = g("ddp") + (" + ZeRO-1" if g("shard_optim") == "1" else "")
        if g("ddp") == "bucketed":
            ddp += f" {float(g('bucket_mb')):g} MiB"
        if extra and g("world") != "1":
            if g("grad_transport") == "ce":
                ddp += ", copy engines"
            if g("grad_reduce") == "bf16":
                ddp += ", bf16 grads"
            if g("comm_sms") not in ("", "0"):
                ddp += f", --comm-sms {g('comm_sms')}"
            if g("gather_sms") not in ("", "0"):
                ddp += f", --gather-sms {g('gather_sms')}"
            env = g("nccl_env")
            tcp = "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
            if tcp in env:  # plans/slow_net.txt: NCCL forced onto TCP sockets over loopback
                env = env.replace(tcp, "NCCL over TCP (lo)")
            if g("hosts") not in ("", "1"):  # as_hosts.sh: NCCL between hosts over TCP (lo)
                env = env.replace("NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo", "").strip()
            if env:
                ddp += ", " + env
        if g("world") == "1":
            ddp = "—"
        model = g("model")
        if len(dims.get(model, ())) > 1:
            model += f" (d {g('d_model')}, {g('layers')} layers)"
        world = g("world")
        if g("hosts") not in ("", "1"):
            world += f" ({g('hosts')} hosts)"
        shape = f"{g('batch')}×{g('ctx')}"
        if g("grad_accum") not in ("", "1"):
            shape += f" ×{g('grad_accum')} accum"
        mfu = f"{100 * f('mfu'):.1f}%" if f("mfu") > 0 else "—"  # no peak known (CPU)
        opt = f"{f('optimizer_ms'):.2f}"
        if g("overlap_update") == "1" and g("optimizer_total_ms") not in ("", "0.0000"):
            # --overlap-update: the exposed part, then the update's own time beside forward.
            opt += f" ({f('optimizer_total_ms'):.2f} beside fwd)"
            if g("update_sms") not in ("", "0"):
                opt += f", --update-sms {g('update_sms')}"
        line = (f"| {model} | {world} | {ddp} | {shape} "
                f"| {f('step_median_ms'):.2f} | {f('step_ms'):.2f} ± {f('step_std'):.2f} "
                f"| {f('forward_ms'):.2f} | {f('backward_ms'):.2f} | {f('comm_ms'):.2f} "
                f"| {opt} | {f('tokens_per_s'):,.0f} "
                f"| {mfu} "
                f"| {f('peak_mem_gib'):.1f} |")
        if anchors:
            key = (g("model"), int(g("batch")), int(g("ctx")))
            line += f" {f('tokens_per_s') / EAGER[key]:.2f}× |" if key in EAGER else " |"
        if extra:
            # Measured on the GPU's comm stream only.
            line += f" {f('comm_total_ms'):.1f} |" if g("world") != "1" and g("device") != "cpu" else " — |"
        out.append(line)
    return "\n".join(out)


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__.strip())
    print(render(sys.argv[1], "--anchors" in sys.argv))


if __name__ == "__main__":
    main()
