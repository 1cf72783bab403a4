#!/usr/bin/env bash
# The step-time model (launch/step_model.py, docs/scaling.md): its copy of the trainer's gradient
# units agrees with the trainer's own log; it replays simple cases exactly; calibrated on the
# measured GPU rows in docs/results it predicts the others within the documented errors; and
# every command a user runs (links, validate, predict, scaling) gives its tables and plots, and
# a clear error for a bad input.
# Usage: step_model_test.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: step_model_test.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
model="python3 $root/launch/step_model.py"
source "$(dirname "$0")/script_harness.sh"

# 1. The model's units are the trainer's: the "gradient sync" line of a 2-rank CPU run.
for cfg in "bucketed 0.2" "bucketed 1" "overlap 25" "flat 25"; do
  read -r ddp mb <<<"$cfg"
  log=$(timeout 120 mpirun --oversubscribe -np 2 "$build/trainer" --device cpu --model tiny \
    --ctx 32 --batch 1 --benchmark --warmup 0 --steps 1 --ddp "$ddp" --bucket-mb "$mb" 2>&1)
  theirs=$(grep -oE "gradient sync: .*" <<<"$log" | head -1 | sed 's/.*| //')
  ours=$($model units --model tiny --ctx 32 --ddp "$ddp" --bucket-mb "$mb" --world 2)
  [[ -n $theirs && $theirs == "$ours" ]] && ok "units of --ddp $ddp --bucket-mb $mb: $ours" ||
    fail "units of --ddp $ddp $mb: trainer '$theirs', model '$ours'"
done

# 2. Cases with a known answer.
out=$(cd "$root/launch" && python3 - <<'PY' 2>&1
import step_model as sm
m = sm.Model.preset("xl")
nv = sm.Link("nv", {"all_reduce": 20.0}, {"all_reduce": 100.0}, 2.0, 0.5, 0.5)
def run(n, **kw):
    return sm.Run(m, sm.Cluster(1, n, nv), 17.0, 36.0, 17.0, **kw).simulate()
def near(a, b, what):
    assert abs(a - b) <= 1e-6 * max(1, abs(b)), f"{what}: {a} != {b}"
one = run(1)
near(one["step"], 70.0, "one GPU: forward + backward + update")
# flat: one all-reduce after backward, nothing shares the GPU
flat = run(2, strategy="flat")
t = (20 + 2 * 2) * 1e-3 + m.flat(2) * 4 / 100e6
near(flat["comm"], t, "flat: exposed = the all-reduce alone")
near(flat["step"], 70.0 + t, "flat: step")
# bucketed: while both streams run each goes at half speed, so backward is stretched by half
# the time the collectives overlapped it; the collectives' wall time holds their work twice over
# while shared.
b = run(2, strategy="bucketed", bucket_mb=25)
assert b["backward"] > 36.0 and b["comm"] < flat["comm"], b
# an accumulation of 4 micro-steps reduces once: the same collectives, 4x the compute
acc = sm.Run(m, sm.Cluster(1, 2, nv), 17.0, 36.0, 17.0, "flat", accum=4).simulate()
near(acc["comm"], t, "accumulation: one reduction")
near(acc["step"], 4 * 53.0 + 17.0 + t, "accumulation: step")
# ZeRO-1: the update is 1/n; bf16 halves the all-reduce's bytes
z = run(4, strategy="flat", shard=True, zero1="update")
assert abs(z["optimizer"] - 17.0 / 4) < 17.0 / 4 * 0.6, z
h = run(2, strategy="flat", bf16=True)
assert h["comm"] < flat["comm"] * 0.6, (h, flat)
# across hosts: a tree beats a ring on latency when many hosts carry a small message
net = sm.Link("net", {"all_reduce": 20.0}, {"all_reduce": 25.0}, 10.0)
big = sm.Cluster(128, 8, nv, net)
ring = sm.Cluster(128, 8, nv, net, tree=False)
assert big.time_ms("all_reduce", 1 << 20) < ring.time_ms("all_reduce", 1 << 20)
assert abs(big.time_ms("all_reduce", 1 << 33) - ring.time_ms("all_reduce", 1 << 33)) / \
    ring.time_ms("all_reduce", 1 << 33) < 0.15
print("known answers: ok")
PY
)
[[ $out == "known answers: ok" ]] && ok "flat, accumulation, ZeRO-1, bf16 and ring/tree cases" ||
  fail "known answers: $out"

# 3. Validation on the measured rows: the numbers docs/scaling.md states.
out=$($model validate "$root/launch/model/validation.txt" --out "$tmp/val" 2>&1)
summary=$(tail -2 <<<"$out" | head -1)
if [[ $summary =~ ^([0-9]+)\ of\ ([0-9]+)\ .*largest\ error\ ([0-9.]+)% ]]; then
  within=${BASH_REMATCH[1]} rows=${BASH_REMATCH[2]} worst=${BASH_REMATCH[3]}
  ((rows >= 40 && rows - within <= 1)) && awk -v w="$worst" 'BEGIN { exit !(w < 13) }' &&
    ok "validation: $summary" || fail "validation drifted: $summary"
else
  fail "validate printed no summary: $(tail -3 <<<"$out")"
fi
[[ -s $tmp/val/params.json && $(wc -l <"$tmp/val/validation.csv") -ge 50 ]] &&
  ok "validate --out: params.json and validation.csv" || fail "validate --out files"

# 4. links from comm_bench CSVs (MPI on host buffers here; the same columns on GPUs).
if timeout 120 mpirun --oversubscribe -np 2 "$build/comm_bench" --device cpu --sizes 64K,256K,1M \
  --warmup 1 --iters 3 --csv "$tmp/cb.csv" >/dev/null 2>&1; then
  out=$($model links "$tmp/cb.csv" 2>&1)
  ops="(all_reduce|reduce_scatter|all_gather|broadcast)"
  n=$(grep -cE "^\| cb.csv \| $ops \| [0-9.]+ \| [0-9.]+ \|$" <<<"$out")
  [[ $n -eq 4 ]] && ok "links: latency and bandwidth of 4 ops from comm_bench" ||
    fail "links: $out"
else
  fail "comm_bench for the links check did not run"
fi

# 5. predict and scaling: tables, CSV and plots.
out=$($model predict --params "$tmp/val/params.json" \
  --compute "$root/docs/results/h200_sizes_512_wgmma.csv" --models xl --gpus 8,16,64 \
  --gbps 200 --out "$tmp/pred" 2>&1)
rows=$(($(wc -l <"$tmp/pred/predictions.csv" 2>/dev/null || echo 1) - 1))
[[ $rows -eq 36 && -s $tmp/pred/scaling_xl.png ]] && grep -q "^| xl --shard-optim |" <<<"$out" &&
  ok "predict: 36 rows, plot, memory table" || fail "predict: $rows rows; $(tail -3 <<<"$out")"
out=$($model scaling "$root/docs/results/h200x4_scaling.csv" --params "$tmp/val/params.json" \
  --out "$tmp/sweep.png" 2>&1)
[[ -s $tmp/sweep.png ]] && [[ $(grep -c "^| xl | [24] |" <<<"$out") -eq 9 ]] &&
  ok "scaling: measured sweep under the model's line" || fail "scaling: $out"

# 6. Bad inputs: one line naming the problem, exit 2.
# refuses WHAT NEEDLE CMD...: CMD exits 2 and its output matches the glob NEEDLE.
refuses() {
  local what=$1 needle=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  [[ $rc -eq 2 && $out == $needle ]] && ok "$what: exit 2, named" || fail "$what: rc $rc: $out"
}
printf 'link nvlink rows nowhere.csv ddp=flat\n' >"$tmp/missing.txt"
refuses "a missing CSV" "*cannot read*nowhere.csv*" $model validate "$tmp/missing.txt"
printf 'bogus line\n' >"$tmp/bad.txt"
refuses "a bad manifest line" "*bad.txt:1*" $model validate "$tmp/bad.txt"
refuses "links of a missing CSV" "*cannot read*nowhere.csv*" $model links "$tmp/nowhere.csv"
printf 'time,op\n' >"$tmp/notcb.csv"
refuses "links of another CSV" "*notcb.csv is not a comm_bench CSV*" $model links "$tmp/notcb.csv"
refuses "missing parameters" "*none.json*" $model predict --params "$tmp/none.json" --compute x.csv

((failures == 0)) && echo "step_model: all checks passed" || echo "step_model: $failures failed"
exit $((failures > 0))
