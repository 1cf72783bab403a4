#!/usr/bin/env bash
# Multi-node tests on a real Slurm cluster of namespace hosts on this machine (launch/cluster/
# up.sh): ranks on different hosts reach each other only over TCP through the cluster's bridge.
# Every case trains the CPU backend and checks numbers, not only that it ran.
#
#   cluster_test.sh BUILD_DIR CASE
#
# CASE: up | down (the CTest fixture), train (2 hosts x 2 ranks by sbatch = 1 rank), cyclic
# (--distribution=cyclic), stop_resume (scancel, then Slurm's --signal, each resumed on another
# shape), host_failure (a host dies: the others exit within --comm-timeout, the requeued job
# resumes), srun (PMIx launch), sweep (a job-array benchmark sweep into one CSV).
# Exit 77 (skipped) with the reason where the cluster cannot run here.
set -uo pipefail
usage="usage: cluster_test.sh BUILD_DIR CASE"
build=$(cd "${1:?$usage}" && pwd)
case=${2:?$usage}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/launch/cluster/common.sh"

case $case in
  up)
    "$root/launch/cluster/up.sh" 2
    exit $?
    ;;
  down)
    "$root/launch/cluster/down.sh"
    exit $?
    ;;
esac

# Every case brings the cluster up if it is not (so that one case runs on its own too).
out=$("$root/launch/cluster/up.sh" 2 2>&1)
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "$out"
  exit "$rc"
fi
source "$CLUSTER_DIR/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export TRAINER=$build/trainer
# On the shared file system (not /tmp: each host has its own).
work=$(mktemp -d -p "$build" "cluster_$case.XXXX")
cleanup() {
  [[ -s $work/jobs ]] && scancel $(cat "$work/jobs") 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL ($case): $*"
  for f in "$work"/*.out; do
    [[ -e $f ]] && { echo "--- $f"; tail -n 15 "$f"; }
  done
  exit 1
}

head -c 30000 /dev/urandom > "$work/text.txt"
"$build/launch/tokenize" --out-train "$work/train.npy" --out-val "$work/val.npy" "$work/text.txt" \
  > /dev/null || fail "tokenize"
model=(--device cpu --d-model 32 --d-ff 64 --layers 2 --heads 2 --vocab 256 --ctx 16
       --data "$work/train.npy")
sbatch_script=$root/launch/slurm/train.sbatch
cpu_job=(--gpus-per-node=0 --cpus-per-task=1)

# submit SBATCH_ARGS...: the job id (its output goes to $work/ID.out).
submit() {
  local id
  id=$(sbatch --parsable --chdir="$work" --output="$work/%j.out" --open-mode=append "$@") ||
    fail "sbatch $*"
  echo "$id" >> "$work/jobs"
  echo "$id"
}
job_field() { scontrol show job "$1" 2>/dev/null | grep -oE "(^| )$2=[^ ]+" | head -1 | cut -d= -f2; }
# wait_job ID SECONDS: until the job has ended (any state but pending, running, completing).
wait_job() {
  local end=$((SECONDS + $2)) state
  while :; do
    state=$(job_field "$1" JobState)
    [[ $state =~ ^(PENDING|RUNNING|CONFIGURING|COMPLETING|REQUEUED|RESIZING|SUSPENDED)$ ]] || return 0
    ((SECONDS < end)) || fail "job $1 still $state after $2 s"
    sleep 0.5
  done
}
# expect_job ID STATE EXIT_CODE: the ended job's state and exit code (ExitCode=code:signal; "*"
# for any).
expect_job() {
  local state code
  state=$(job_field "$1" JobState)
  code=$(job_field "$1" ExitCode)
  [[ $state == "$2" && ($3 == "*" || ${code%%:*} == "$3") ]] ||
    fail "job $1 ended $state with exit $code (wanted $2 and $3)"
}
# steps_logged DIR: the training steps in DIR/metrics.jsonl.
steps_logged() {
  local n
  n=$(grep -c '"step":' "$1/metrics.jsonl" 2>/dev/null)
  echo "${n:-0}"
}
# ckpt_named LOG: the checkpoint a stop message in LOG names (DIR/step_N).
ckpt_named() { grep -oE "stopped .* after step [0-9]+ .* --resume [^ ]+" "$1" | grep -oE "[^ ]+$" | tail -1; }
# same_weights REF RUN [STEPS]: SPEC's equivalence, max |delta| / max |p| <= 1e-5 per 10 steps
# run (SPEC states 1e-5 after 10 steps). Different world sizes sum the gradient in different
# orders, and fp32 rounding differences, amplified by AdamW's normalisation, grow with the steps:
# a run stopped and resumed at timing-dependent steps on 4, 2 and 1 ranks reached 2.1e-5 after
# 38 steps. A wrong step, batch or optimizer state differs by orders of magnitude more.
same_weights() {
  local out tol
  tol=$(awk -v s="${3:-10}" 'BEGIN { printf "%g", 1e-5 * (s > 10 ? (s + 9 - (s + 9) % 10) / 10 : 1) }')
  out=$("$build/launch/weights_diff" "$1" "$2" --tol "$tol" 2>&1) || fail "weights differ: $out"
  echo "  $out"
}
# placement LOG HOST: the start-up line naming HOST's ranks.
placement() { grep -oE "placement: .*\| $2: .*" "$1" | sed "s/.*| $2: //"; }
reference() {  # reference DIR STEPS [FLAGS...]: one rank, the whole global batch of 8
  local dir=$1 steps=$2
  shift 2
  "$TRAINER" "${model[@]}" --batch 8 --steps "$steps" --out "$work/$dir" --log-every 1000 "$@" \
    > "$work/$dir.log" 2>&1 || fail "reference run: $(tail -3 "$work/$dir.log")"
}
bridge_bytes() { cat "/sys/class/net/${CLUSTER_PREFIX}v$1/statistics/rx_bytes"; }

case $case in
  train | cyclic)
    # 2 hosts x 2 ranks, ZeRO-1 (train.sbatch's default) over TCP between the hosts, against one
    # rank with the same global batch; the report names each rank's host and local rank.
    reference ref 12
    dist=()
    [[ $case == cyclic ]] && dist=(--distribution=cyclic)
    before=$(bridge_bytes 2)
    id=$(submit --nodes=2 --ntasks-per-node=2 "${cpu_job[@]}" "${dist[@]}" "$sbatch_script" \
      "${model[@]}" --batch 2 --steps 12 --out "$work/job" --log-every 4)
    wait_job "$id" 120
    expect_job "$id" COMPLETED 0
    log=$work/$id.out
    if [[ $case == train ]]; then
      want1="ranks 0 (local 0), 1 (local 1)" want2="ranks 2 (local 0), 3 (local 1)"
    else
      want1="ranks 0 (local 0), 2 (local 1)" want2="ranks 1 (local 0), 3 (local 1)"
    fi
    [[ $(placement "$log" node1) == "$want1" && $(placement "$log" node2) == "$want2" ]] ||
      fail "placement: node1 '$(placement "$log" node1)' (wanted '$want1'), node2" \
        "'$(placement "$log" node2)' (wanted '$want2')"
    grep -qE "^.*info +[0-9] +node[12] " "$log" || fail "the per-rank timing table names no host"
    for r in 0 1 2 3; do
      host=node1
      [[ $case == train && $r -ge 2 || $case == cyclic && $((r % 2)) -eq 1 ]] && host=node2
      grep -qE "info +$r $host " "$log" || fail "timing table: rank $r is not on $host"
    done
    moved=$(($(bridge_bytes 2) - before))
    ((moved > 1000000)) || fail "only $moved bytes crossed node2's link"
    same_weights "$work/ref" "$work/job"
    echo "cluster $case: 4 ranks on node1 ($want1) and node2 ($want2) trained as 1 rank;" \
      "$((moved / 1000)) kB crossed node2's link"
    ;;

  stop_resume)
    # Constant learning rate, so that --steps (raised by the last job) does not change the steps
    # before it; --debug-step-ms makes each step last long enough for Slurm's signals.
    run=(--lr 1e-3 --min-lr 1e-3 --warmup 0 --out "$work/run" --resume latest --log-every 100)
    # 1. 2 hosts x 2 ranks, cancelled mid-run: SIGTERM to every process, the ranks save and exit.
    a=$(submit --nodes=2 --ntasks-per-node=2 "${cpu_job[@]}" "$sbatch_script" "${model[@]}" \
      --batch 2 --steps 100000 --debug-step-ms 300 "${run[@]}")
    end=$((SECONDS + 90))
    until (($(steps_logged "$work/run") >= 4)); do
      ((SECONDS < end)) || fail "job $a logged no steps in 90 s"
      sleep 0.3
    done
    scancel "$a"
    wait_job "$a" 60
    expect_job "$a" CANCELLED "*"
    first=$(ckpt_named "$work/$a.out")
    grep -q "stopped by SIGTERM" "$work/$a.out" && [[ -f $first/optimizer.safetensors ]] ||
      fail "scancel: no checkpoint ('$first')"
    # 2. 1 host x 2 ranks resumes; Slurm's warning 150 s before its 3-minute limit (it comes 30-60
    # s in: Slurm checks limits every 30 s) stops it with a checkpoint (or, should it come while
    # the ranks start, before their first step, naming the checkpoint they resumed from); the
    # --time-limit the script derives from squeue (1.5 min) would stop it otherwise.
    b=$(TIME_MARGIN_MIN=1.5 submit --nodes=1 --ntasks-per-node=2 "${cpu_job[@]}" --time=3 \
      --signal=B:USR1@150 "$sbatch_script" "${model[@]}" --batch 4 --steps 100000 \
      --debug-step-ms 300 "${run[@]}")
    wait_job "$b" 200
    grep -q "resumed from $first" "$work/$b.out" || fail "job $b did not resume from $first"
    grep -q "SIGUSR1 from Slurm" "$work/$b.out" || fail "job $b: Slurm's SIGUSR1 did not arrive"
    grep -q "stopped by SIGUSR1" "$work/$b.out" || fail "job $b: not stopped by SIGUSR1"
    expect_job "$b" FAILED 138
    second=$(ckpt_named "$work/$b.out")
    [[ -f $second/optimizer.safetensors ]] || fail "job $b: no checkpoint ('$second')"
    # 3. 2 hosts x 1 rank finishes: the same weights as one uninterrupted rank.
    steps=$((${second##*_} + 5))
    c=$(submit --nodes=2 --ntasks-per-node=1 "${cpu_job[@]}" "$sbatch_script" "${model[@]}" \
      --batch 4 --steps "$steps" "${run[@]}")
    wait_job "$c" 120
    expect_job "$c" COMPLETED 0
    grep -q "resumed from $second" "$work/$c.out" || fail "job $c did not resume from $second"
    reference ref "$steps" --lr 1e-3 --min-lr 1e-3 --warmup 0
    same_weights "$work/ref" "$work/run" "$steps"
    [[ $(steps_logged "$work/run") -eq $steps ]] || fail "metrics.jsonl holds $(steps_logged "$work/run") steps, not $steps"
    echo "cluster stop_resume: 2x2 cancelled at ${first##*/}, 1x2 stopped by Slurm's SIGUSR1 at" \
      "${second##*/}, 2x1 finished step $steps on the weights of 1 uninterrupted rank"
    ;;

  host_failure)
    # A host dies mid-job: its link goes down first (a dead host sends nothing, not even a TCP
    # reset), then everything on it is killed, slurmd included. The ranks on the other host must
    # exit within --comm-timeout; Slurm marks the host down and requeues the job; once the host
    # is back, the requeued job resumes from the last checkpoint and ends on the weights of an
    # uninterrupted run.
    timeout_s=10
    run=(--lr 1e-3 --min-lr 1e-3 --warmup 0 --out "$work/run" --resume latest --log-every 100
         --save-every 5 --comm-timeout "$timeout_s")
    id=$(submit --nodes=2 --ntasks-per-node=2 "${cpu_job[@]}" "$sbatch_script" "${model[@]}" \
      --batch 2 --steps 30 --debug-step-ms 200 "${run[@]}")
    end=$((SECONDS + 90))
    until [[ -f $work/run/step_10/optimizer.safetensors ]]; do
      ((SECONDS < end)) || fail "job $id wrote no step_10 in 90 s"
      sleep 0.2
    done
    ns2=$(node_ns 2)
    ip link set "${CLUSTER_PREFIX}v2" down
    t0=$SECONDS
    kill -9 $(ip netns pids "$ns2") 2>/dev/null
    survivors() { ip netns pids "$(node_ns 1)" | xargs -r ps -o comm= -p | grep -c '^trainer$'; }
    until (($(survivors) == 0)); do
      ((SECONDS - t0 <= timeout_s + 8)) || fail "node1's ranks still run $((SECONDS - t0)) s after node2 died"
      sleep 0.2
    done
    gone_after=$((SECONDS - t0))
    grep -q "has waited .* (--comm-timeout $timeout_s): a peer rank is dead" "$work/$id.out" ||
      fail "no rank named the timeout"
    last=$(ls -dv "$work"/run/step_* | grep -E '/step_[0-9]+$' | tail -1)
    "$build/launch/weights_diff" "$last" "$last" > /dev/null || fail "the last checkpoint $last is damaged"
    # Slurm finds node2 silent (SlurmdTimeout) and requeues the job; bring node2 back.
    wait_for 90 "Slurm to requeue job $id" \
      bash -c "scontrol show job $id | grep -qE 'JobState=PENDING|Restarts=[1-9]'" || fail "not requeued"
    requeued_after=$((SECONDS - t0))
    ip link set "${CLUSTER_PREFIX}v2" up
    start_slurmd 2
    wait_job "$id" 240
    expect_job "$id" COMPLETED 0
    grep -q "resumed from $last" "$work/$id.out" || fail "the requeued job did not resume from $last"
    reference ref 30 --lr 1e-3 --min-lr 1e-3 --warmup 0
    same_weights "$work/ref" "$work/run" 30
    echo "cluster host_failure: node2 died after ${last##*/}; node1's ranks exited ${gone_after} s" \
      "later (--comm-timeout $timeout_s); Slurm requeued the job, which resumed from" \
      "${last##*/} and ended on the weights of 1 uninterrupted rank (requeued ${requeued_after} s" \
      "after the failure, done $((SECONDS - t0)) s after it)"
    ;;

  srun)
    # Ranks started by Slurm itself through PMIx, no mpirun: directly, and by train.sbatch.
    if ! srun --mpi=list 2>&1 | grep -q pmix; then
      echo "skipped: this Slurm has no PMIx plugin (srun --mpi=list); launch with mpirun (train.sbatch's default)"
      exit 77
    fi
    reference ref 12
    out=$(srun --mpi=pmix --chdir="$work" --nodes=2 --ntasks-per-node=2 --distribution=cyclic \
      --cpus-per-task=1 "$TRAINER" "${model[@]}" --batch 2 --steps 12 --out "$work/direct" 2>&1) ||
      fail "srun --mpi=pmix: $out"
    [[ $(placement <(echo "$out") node1) == "ranks 0 (local 0), 2 (local 1)" ]] ||
      fail "srun placement: $(grep placement <<<"$out")"
    same_weights "$work/ref" "$work/direct"
    id=$(LAUNCHER=srun submit --nodes=2 --ntasks-per-node=2 "${cpu_job[@]}" "$sbatch_script" \
      "${model[@]}" --batch 2 --steps 12 --out "$work/job")
    wait_job "$id" 120
    expect_job "$id" COMPLETED 0
    grep -q "srun --mpi=pmix" "$work/$id.out" || fail "train.sbatch did not launch with srun"
    same_weights "$work/ref" "$work/job"
    echo "cluster srun: srun --mpi=pmix (cyclic) and LAUNCHER=srun train.sbatch, 2 hosts x 2" \
      "ranks each, trained as 1 rank"
    ;;

  sweep)
    # A job array over a plan (model x ctx x strategy); every task appends to one CSV.
    cat > "$work/plan.txt" <<'EOF'
# ranks, then trainer flags: model x ctx x strategy
1 --ddp none --ctx 16
2 --ddp flat --ctx 16
2 --ddp bucketed --ctx 16
2 --ddp bucketed --shard-optim --ctx 16
1 --ddp none --ctx 32 --d-model 64 --d-ff 128
2 --ddp overlap --ctx 32 --d-model 64 --d-ff 128
2 --ddp bucketed --shard-optim --ctx 32 --d-model 64 --d-ff 128
2 --ddp naive --ctx 32 --d-model 64 --d-ff 128
EOF
    runs=8
    out=$("$root/launch/slurm/sweep.sh" "$work/plan.txt" "$work/sweep.csv" --wait --nodes=2 \
      --ntasks-per-node=1 "${cpu_job[@]}" -- "${model[@]}" --batch 2 --warmup 2 --steps 5 2>&1)
    rc=$?
    [[ $rc -eq 0 ]] || fail "sweep.sh exit $rc: $(tail -5 <<<"$out")"
    rows=$(($(wc -l < "$work/sweep.csv") - 1))
    [[ $rows -eq $runs ]] || fail "the CSV holds $rows rows, not $runs"
    [[ $(grep -c '^time,' "$work/sweep.csv") -eq 1 ]] || fail "the CSV header appears more than once"
    python3 - "$work/sweep.csv" <<'PY' || fail "the CSV's rows are not the plan's runs"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert all(None not in r and None not in r.values() for r in rows), "a torn row"
got = sorted((r["world"], r["ddp"], r["shard_optim"], r["ctx"], r["d_model"], r["hosts"]) for r in rows)
want = sorted([("1", "none", "0", "16", "32", "1"), ("2", "flat", "0", "16", "32", "2"),
               ("2", "bucketed", "0", "16", "32", "2"), ("2", "bucketed", "1", "16", "32", "2"),
               ("1", "none", "0", "32", "64", "1"), ("2", "overlap", "0", "32", "64", "2"),
               ("2", "bucketed", "1", "32", "64", "2"), ("2", "naive", "0", "32", "64", "2")])
assert got == want, f"{got} != {want}"
PY
    [[ -s $work/sweep.md && $(grep -c '^| ' "$work/sweep.md") -eq $((runs + 1)) ]] ||
      fail "sweep_report.py wrote no table: $(tail -3 <<<"$out")"
    [[ -s $work/sweep.png ]] || fail "sweep_report.py wrote no plot: $(tail -3 <<<"$out")"
    # Many runs finishing at once on one CSV: 8 appends started together, none lost or torn.
    for i in $(seq 8); do
      { "$TRAINER" "${model[@]}" --benchmark --batch 1 --warmup 0 --steps 1 --csv "$work/burst.csv" \
          > "$work/burst.$i.log" 2>&1; echo "exit $?" >> "$work/burst.$i.log"; } &
    done
    wait
    burst_failed=$(grep -L '^exit 0$' "$work"/burst.*.log)
    [[ -z $burst_failed ]] ||
      fail "8 simultaneous appends: a run failed: $(tail -n 8 $burst_failed)"
    [[ $(wc -l < "$work/burst.csv") -eq 9 && $(grep -c '^time,' "$work/burst.csv") -eq 1 &&
       $(awk -F, '{print NF}' "$work/burst.csv" | sort -u | wc -l) -eq 1 ]] ||
      fail "8 simultaneous appends: $(wc -l < "$work/burst.csv") lines"
    echo "cluster sweep: $runs array tasks on 2 hosts appended $rows rows to one CSV; table and plot" \
      "rendered; 8 simultaneous appends kept"
    ;;

  *)
    echo "$usage (unknown case '$case')"
    exit 2
    ;;
esac
