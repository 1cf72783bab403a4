#!/usr/bin/env bash
# Runs the causal-attention benchmark of our FlashAttention kernels (tests/bench_attention) and the
# same sweep with PyTorch SDPA (launch/sdpa_bench.py), then prints fwd+bwd time ratios.
#
#   launch/bench_attention.sh OUT_DIR [sweep flags passed to both, e.g. --dh 64 --tmax 4096]
#   BUILD_DIR=build-release launch/bench_attention.sh results/attention
#
# Writes OUT_DIR/flash.{csv,txt}, OUT_DIR/sdpa.{csv,txt} (when PyTorch is importable) and
# OUT_DIR/compare.csv (flash / SDPA latency per head dim and T; < 1 means we are faster).
set -euo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: $0 OUT_DIR [--dh 64,128] [--tmin N] [--tmax N] [--batch B] [--heads H] [--iters N]" >&2
  exit 2
fi
out=$1
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bench=$build/tests/bench_attention
if [[ ! -x $bench ]]; then
  echo "$0: $bench not found; build it with: cmake --build $build --target bench_attention" >&2
  exit 2
fi
mkdir -p "$out"

"$bench" --csv "$out/flash.csv" "$@" | tee "$out/flash.txt"

if ! python3 -c "import torch" 2>/dev/null; then
  echo "$0: PyTorch not importable; skipping the SDPA reference" >&2
  exit 0
fi
python3 "$root/launch/sdpa_bench.py" --csv "$out/sdpa.csv" "$@" | tee "$out/sdpa.txt"

python3 - "$out" <<'EOF'
import csv, os, sys
out = sys.argv[1]
load = lambda name: {(r["head_dim"], r["seq_len"]): r
                     for r in csv.DictReader(open(os.path.join(out, name)))
                     if r["impl"] in ("flash", "sdpa")}
flash, sdpa = load("flash.csv"), load("sdpa.csv")
keys = sorted(set(flash) & set(sdpa), key=lambda k: (int(k[0]), int(k[1])))
print("\nflash / SDPA latency (target: fwd+bwd <= 1.5 for T >= 1024)")
print("%4s %6s %8s %8s %8s" % ("dh", "T", "fwd", "bwd", "fwd+bwd"))
with open(os.path.join(out, "compare.csv"), "w") as f:
    f.write("head_dim,seq_len,fwd_ratio,bwd_ratio,fwd_bwd_ratio,within_target\n")
    for k in keys:
        a, b = flash[k], sdpa[k]
        ratio = [float(a[c]) / float(b[c]) for c in ("fwd_ms", "bwd_ms", "fwd_bwd_ms")]
        ok = int(k[1]) < 1024 or ratio[2] <= 1.5
        print("%4s %6s %8.2f %8.2f %8.2f%s" % (k[0], k[1], *ratio, "" if ok else "  above target"))
        f.write("%s,%s,%.4f,%.4f,%.4f,%d\n" % (k[0], k[1], *ratio, ok))
print("wrote", os.path.join(out, "compare.csv"))
EOF
