#!/usr/bin/env python3
"""PyTorch reference for tests/bench_attention: causal bf16 attention through
torch.nn.functional.scaled_dot_product_attention(is_causal=True), layout (B, H, T, dh).

Same sweep, timing method (CUDA events, median of --iters runs after --warmup runs), FLOP
convention (causal fwd = 4*B*H*T^2*dh/2, bwd = 2.5 x fwd, fwd+bwd = 3.5 x fwd) and table/CSV
columns as the C++ benchmark. The forward runs with autograd recording (as in training); the
backward alone is torch.autograd.grad on a retained graph.

    python3 launch/sdpa_bench.py --csv sdpa.csv [--dh 64,128] [--tmin 256] [--tmax 16384]
"""
import argparse
import statistics
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--csv", default="", help="write results to this CSV file")
    p.add_argument("--dh", default="64,128", help="comma-separated head dims")
    p.add_argument("--tmin", type=int, default=256)
    p.add_argument("--tmax", type=int, default=16384)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--kernels", default="auto", help="ignored: selects our kernels in bench_attention")
    p.add_argument("--backend", default="default",
                   choices=["default", "flash", "efficient", "cudnn"],
                   help="pin an SDPA backend (default: PyTorch's own choice)")
    p.add_argument("--naive-max-t", type=int, default=0,
                   help="accepted for symmetry with bench_attention; ignored")
    a = p.parse_args()
    a.dh = [int(x) for x in a.dh.split(",") if x]
    if a.tmin < 1 or a.tmax < a.tmin:
        p.error("need 1 <= --tmin <= --tmax")
    if a.iters < 1:
        p.error("--iters must be >= 1")
    return a


def median_ms(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    a = parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        sys.exit("sdpa_bench: PyTorch is not installed")
    if not torch.cuda.is_available():
        sys.exit("sdpa_bench: no CUDA device visible")

    backend_ctx = None
    if a.backend != "default":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend_ctx = {"flash": SDPBackend.FLASH_ATTENTION,
                       "efficient": SDPBackend.EFFICIENT_ATTENTION,
                       "cudnn": SDPBackend.CUDNN_ATTENTION}[a.backend]

    B, H = a.batch, a.heads
    print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__})")
    print(f"causal attention, bf16, batch {B}, heads {H}, median of {a.iters} runs after "
          f"{a.warmup} warm-up runs, SDPA backend: {a.backend}")
    print("FLOPs: fwd = 4*B*H*T^2*dh/2 (causal), bwd = 2.5 x fwd, fwd+bwd = 3.5 x fwd "
          "(FA2 convention)\n")
    header = ("impl", "dh", "T", "fwd_ms", "bwd_ms", "fwdbwd_ms", "fwd_TF/s", "bwd_TF/s",
              "all_TF/s", "check")
    print("%-6s %4s %6s %10s %10s %10s %9s %9s %9s %9s" % header)
    rows = []
    for dh in a.dh:
        T = a.tmin
        while T <= a.tmax:
            gen = torch.Generator(device="cuda").manual_seed(T * 1000 + dh)
            shape = (B, H, T, dh)
            q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16,
                                         generator=gen) for _ in range(4))
            for t in (q, k, v):
                t.requires_grad_(True)

            def attend():
                if backend_ctx is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                from torch.nn.attention import sdpa_kernel
                with sdpa_kernel(backend_ctx):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            fwd_ms = median_ms(torch, attend, a.warmup, a.iters)
            out = attend()
            bwd_ms = median_ms(
                torch, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                a.warmup, a.iters)
            del out
            fwdbwd_ms = median_ms(
                torch, lambda: torch.autograd.grad(attend(), (q, k, v), dout), a.warmup, a.iters)
            fwd_flop = 2.0 * B * H * T * T * dh
            tf = lambda flop, ms: flop / (ms * 1e-3) / 1e12
            r = dict(impl="sdpa", batch=B, heads=H, head_dim=dh, seq_len=T, fwd_ms=fwd_ms,
                     bwd_ms=bwd_ms, fwd_bwd_ms=fwdbwd_ms, fwd_tflops=tf(fwd_flop, fwd_ms),
                     bwd_tflops=tf(2.5 * fwd_flop, bwd_ms),
                     fwd_bwd_tflops=tf(3.5 * fwd_flop, fwdbwd_ms), check_rel_err="")
            rows.append(r)
            print("%-6s %4d %6d %10.4f %10.4f %10.4f %9.1f %9.1f %9.1f %9s" % (
                "sdpa", dh, T, fwd_ms, bwd_ms, fwdbwd_ms, r["fwd_tflops"], r["bwd_tflops"],
                r["fwd_bwd_tflops"], "-"), flush=True)
            del q, k, v, dout
            torch.cuda.empty_cache()
            T *= 2

    if a.csv:
        cols = ["impl", "batch", "heads", "head_dim", "seq_len", "fwd_ms", "bwd_ms", "fwd_bwd_ms",
                "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "check_rel_err"]
        with open(a.csv, "w") as f:
            f.write(",".join(cols) + "\n")
            for r in rows:
                f.write(",".join(("%.6g" % r[c]) if isinstance(r[c], float) else str(r[c])
                                 for c in cols) + "\n")
        print(f"\nwrote {a.csv}")


if __name__ == "__main__":
    main()
