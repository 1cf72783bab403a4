#!/usr/bin/env bash
# launch/bench_attention.sh without a GPU, on stand-ins for tests/bench_attention and
# launch/sdpa_bench.py that log their calls and write one CSV row per (head dim, T) asked for:
# ORDER=sweeps runs each tool once over the sweep; ORDER=cells runs every cell with both tools back
# to back, the first of the two alternating, other flags passed through, one CSV header per file;
# compare.csv holds every cell, within the target (fwd+bwd at or below SDPA's) from T = 2048 on;
# a bad ORDER or range is refused.
# Usage: bench_attention_script_test.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$(dirname "$0")/script_harness.sh"

# A stand-in tool: IMPL and SCALE (of our times) fixed per file; T doubles from tmin to tmax.
# SDPA is 10% slower than our times below T = 4096 and 10% faster from there on.
make_tool() {
  cat >"$1" <<EOF
#!/usr/bin/env bash
set -eu
csv= dhs=64,128 tmin=256 tmax=16384 extra=
while [[ \$# -gt 0 ]]; do
  case \$1 in
    --csv) csv=\$2; shift 2 ;;
    --dh) dhs=\$2; shift 2 ;;
    --tmin) tmin=\$2; shift 2 ;;
    --tmax) tmax=\$2; shift 2 ;;
    *) extra="\$extra \$1"; shift ;;
  esac
done
echo "$2 dh=\$dhs T=\$tmin..\$tmax extra=\$extra" >>"$tmp/calls.log"
echo "impl,batch,heads,head_dim,seq_len,fwd_ms,bwd_ms,fwd_bwd_ms,fwd_tflops,bwd_tflops,fwd_bwd_tflops,check_rel_err" >"\$csv"
IFS=, read -r -a list <<<"\$dhs"
for dh in "\${list[@]}"; do
  for ((T = tmin; T <= tmax; T *= 2)); do
    s=1.0
    if [[ $2 == sdpa ]]; then (( T < 4096 )) && s=1.1 || s=0.9; fi
    python3 -c "import sys; T=\$T; s=\$s; print(f'$2,4,16,\$dh,\$T,{T*s/1e3},{2*T*s/1e3},{3*T*s/1e3},1,1,1,-')" >>"\$csv"
  done
done
echo "$2 done"
EOF
  chmod +x "$1"
}
mkdir -p "$tmp/build/tests"
make_tool "$tmp/build/tests/bench_attention" flash
make_tool "$tmp/sdpa" sdpa
run() { BUILD_DIR="$tmp/build" SDPA_BENCH="$tmp/sdpa" bash "$root/launch/bench_attention.sh" "$@"; }

# 1. Cells: 2 head dims x 3 T, both tools per cell, alternating who goes first.
rm -f "$tmp/calls.log"
out=$(ORDER=cells run "$tmp/c" --dh 64,128 --tmin 1024 --tmax 4096 --iters 3 2>&1)
rc=$?
[[ $rc -eq 0 ]] && ok "ORDER=cells exits 0" || fail "ORDER=cells exit $rc: $out"
want="flash dh=64 T=1024..1024 extra= --iters 3
sdpa dh=64 T=1024..1024 extra= --iters 3
sdpa dh=64 T=2048..2048 extra= --iters 3
flash dh=64 T=2048..2048 extra= --iters 3
flash dh=64 T=4096..4096 extra= --iters 3
sdpa dh=64 T=4096..4096 extra= --iters 3
sdpa dh=128 T=1024..1024 extra= --iters 3
flash dh=128 T=1024..1024 extra= --iters 3
flash dh=128 T=2048..2048 extra= --iters 3
sdpa dh=128 T=2048..2048 extra= --iters 3
sdpa dh=128 T=4096..4096 extra= --iters 3
flash dh=128 T=4096..4096 extra= --iters 3"
[[ $(cat "$tmp/calls.log") == "$want" ]] && ok "cells in order, first tool alternating" ||
  fail "calls: $(cat "$tmp/calls.log")"
for f in flash sdpa; do
  [[ $(grep -c '^impl,' "$tmp/c/$f.csv") -eq 1 && $(wc -l <"$tmp/c/$f.csv") -eq 7 ]] &&
    ok "$f.csv: one header, 6 cells" || fail "$f.csv: $(cat "$tmp/c/$f.csv")"
done
# Ours / SDPA: 1/1.1 below T = 4096, 1/0.9 from there on; the target applies from T = 2048.
python3 - "$tmp/c/compare.csv" <<'PY' && ok "compare.csv: ratios and target" || fail "compare.csv: $(cat "$tmp/c/compare.csv")"
import csv, sys
rows = {(r["head_dim"], r["seq_len"]): r for r in csv.DictReader(open(sys.argv[1]))}
assert len(rows) == 6, rows
for (dh, T), r in rows.items():
    want = 1 / 1.1 if int(T) < 4096 else 1 / 0.9
    assert abs(float(r["fwd_bwd_ratio"]) - want) < 1e-3, r
    assert r["within_target"] == ("0" if int(T) >= 4096 else "1"), r
PY

# 2. Sweeps (the default): each tool once over the whole sweep.
rm -f "$tmp/calls.log"
run "$tmp/s" --dh 64 --tmin 1024 --tmax 2048 >/dev/null 2>&1
want="flash dh=64 T=1024..2048 extra=
sdpa dh=64 T=1024..2048 extra="
[[ $(cat "$tmp/calls.log") == "$want" ]] && ok "sweeps: one call each" ||
  fail "sweeps calls: $(cat "$tmp/calls.log")"
[[ $(wc -l <"$tmp/s/compare.csv") -eq 3 ]] && ok "sweeps: compare.csv 2 cells" ||
  fail "sweeps compare: $(cat "$tmp/s/compare.csv")"

# 3. Refusals: exit 2, named, nothing run.
rm -f "$tmp/calls.log"
out=$(ORDER=fast run "$tmp/x" 2>&1)
rc=$?
[[ $rc -eq 2 && $out == *"ORDER must be sweeps or cells"* && ! -e $tmp/calls.log ]] &&
  ok "ORDER=fast refused" || fail "ORDER=fast: exit $rc: $out"
out=$(ORDER=cells run "$tmp/y" --tmin 4096 --tmax 1024 2>&1)
rc=$?
[[ $rc -eq 2 && $out == *"need 1 <= --tmin <= --tmax"* && ! -e $tmp/calls.log ]] &&
  ok "inverted range refused" || fail "inverted range: exit $rc: $out"

[[ $failures -eq 0 ]] && echo "all passed" || { echo "$failures failed"; exit 1; }
