#!/usr/bin/env bash
# Runs the causal-attention benchmark of our FlashAttention kernels (tests/bench_attention) and the
# same sweep with PyTorch SDPA (launch/sdpa_bench.py), then prints fwd+bwd time ratios.
#
#   launch/bench_attention.sh OUT_DIR [sweep flags passed to both, e.g. --dh 64 --tmax 4096]
#   BUILD_DIR=build-release launch/bench_attention.sh results/attention
#   ORDER=cells launch/bench_attention.sh out --dh 64,80,128 --tmin 1024 --iters 20
#
# ORDER=sweeps (default): our whole sweep, then SDPA's. ORDER=cells: one (head dim, T) cell at a
# time, ours and SDPA's back to back, the one to go first alternating from cell to cell. Under these
# kernels a GPU runs at its power limit and its clock drifts with how long it has been busy
# (docs/results/h100_attention_power.txt), so cells measured minutes apart compare less well than
# cells measured seconds apart. SDPA_BENCH replaces the SDPA command (tests).
#
# Writes OUT_DIR/flash.{csv,txt}, OUT_DIR/sdpa.{csv,txt} (when PyTorch is importable) and
# OUT_DIR/compare.csv (flash / SDPA latency per head dim and T; < 1 means we are faster;
# within_target: fwd+bwd at or below SDPA's time, required for T >= 2048).
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
order=${ORDER:-sweeps}
if [[ $order != sweeps && $order != cells ]]; then
  echo "$0: ORDER must be sweeps or cells (got '$order')" >&2
  exit 2
fi
if [[ -n ${SDPA_BENCH:-} ]]; then
  read -r -a sdpa <<<"$SDPA_BENCH"
elif python3 -c "import torch" 2>/dev/null; then
  sdpa=(python3 "$root/launch/sdpa_bench.py")
else
  sdpa=()
  echo "$0: PyTorch not importable; skipping the SDPA reference" >&2
fi
mkdir -p "$out"

if [[ $order == sweeps ]]; then
  "$bench" --csv "$out/flash.csv" "$@" | tee "$out/flash.txt"
  [[ ${#sdpa[@]} -gt 0 ]] || exit 0
  "${sdpa[@]}" --csv "$out/sdpa.csv" "$@" | tee "$out/sdpa.txt"
else
  # The cells of the sweep: --dh, --tmin and --tmax as both tools read them (T doubling from
  # tmin); every other flag goes to both unchanged.
  dhs=64,128 tmin=256 tmax=16384 rest=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      --dh | --tmin | --tmax)
        [[ $# -ge 2 ]] || { echo "$0: $1 needs a value" >&2; exit 2; }
        case $1 in --dh) dhs=$2 ;; --tmin) tmin=$2 ;; --tmax) tmax=$2 ;; esac
        shift 2 ;;
      *) rest+=("$1"); shift ;;
    esac
  done
  if ! [[ $tmin =~ ^[0-9]+$ && $tmax =~ ^[0-9]+$ && $tmin -ge 1 && $tmax -ge $tmin ]]; then
    echo "$0: need 1 <= --tmin <= --tmax (got $tmin, $tmax)" >&2
    exit 2
  fi
  rm -f "$out/flash.csv" "$out/sdpa.csv" "$out/flash.txt" "$out/sdpa.txt"
  # Runs one tool on one cell and appends its rows (one header per file) and its output.
  cell() {
    local name=$1 dh=$2 T=$3
    shift 3
    local part="$out/.$name.cell.csv"
    "$@" --csv "$part" --dh "$dh" --tmin "$T" --tmax "$T" ${rest[@]+"${rest[@]}"} >>"$out/$name.txt"
    if [[ -s $out/$name.csv ]]; then tail -n +2 "$part" >>"$out/$name.csv"; else cp "$part" "$out/$name.csv"; fi
    rm -f "$part"
  }
  n=0
  IFS=, read -r -a dh_list <<<"$dhs"
  for dh in "${dh_list[@]}"; do
    for ((T = tmin; T <= tmax; T *= 2)); do
      if [[ ${#sdpa[@]} -gt 0 && $((n % 2)) -eq 1 ]]; then
        cell sdpa "$dh" "$T" "${sdpa[@]}"
        cell flash "$dh" "$T" "$bench"
      else
        cell flash "$dh" "$T" "$bench"
        [[ ${#sdpa[@]} -eq 0 ]] || cell sdpa "$dh" "$T" "${sdpa[@]}"
      fi
      echo "cell dh $dh T $T done"
      n=$((n + 1))
    done
  done
  [[ ${#sdpa[@]} -gt 0 ]] || exit 0
fi

python3 - "$out" <<'EOF'
import csv, os, sys
out = sys.argv[1]
load = lambda name: {(r["head_dim"], r["seq_len"]): r
                     for r in csv.DictReader(open(os.path.join(out, name)))
                     if r["impl"] in ("flash", "sdpa")}
flash, sdpa = load("flash.csv"), load("sdpa.csv")
keys = sorted(set(flash) & set(sdpa), key=lambda k: (int(k[0]), int(k[1])))
print("\nflash / SDPA latency (target: fwd+bwd <= 1.0 for T >= 2048)")
print("%4s %6s %8s %8s %8s" % ("dh", "T", "fwd", "bwd", "fwd+bwd"))
with open(os.path.join(out, "compare.csv"), "w") as f:
    f.write("head_dim,seq_len,fwd_ratio,bwd_ratio,fwd_bwd_ratio,within_target\n")
    for k in keys:
        a, b = flash[k], sdpa[k]
        ratio = [float(a[c]) / float(b[c]) for c in ("fwd_ms", "bwd_ms", "fwd_bwd_ms")]
        ok = int(k[1]) < 2048 or ratio[2] <= 1.0
        print("%4s %6s %8.2f %8.2f %8.2f%s" % (k[0], k[1], *ratio, "" if ok else "  above target"))
        f.write("%s,%s,%.4f,%.4f,%.4f,%d\n" % (k[0], k[1], *ratio, ok))
print("wrote", os.path.join(out, "compare.csv"))
EOF
