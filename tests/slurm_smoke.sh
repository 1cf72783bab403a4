#!/usr/bin/env bash
# launch/slurm/train.sbatch outside Slurm: with the allocation's variables set by hand it starts
# the ranks with mpirun and trains on the CPU backend; without them it refuses to start. SIGUSR1
# to the job (what --signal=B:USR1@120 sends) stops it with a checkpoint that --resume latest finds.
# Usage: slurm_smoke.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: slurm_smoke.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 20000 /dev/urandom > "$tmp/text.txt"
"$build/launch/tokenize" --out-train "$tmp/train.npy" --out-val "$tmp/val.npy" "$tmp/text.txt" >/dev/null
out=$(env -u SLURM_NTASKS bash "$root/launch/slurm/train.sbatch" 2>&1)
if [[ $? -eq 0 ]] || ! grep -q "not inside a Slurm allocation" <<<"$out"; then
  echo "FAIL: outside an allocation the script should refuse: $out"
  exit 1
fi
out=$(SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE="2(x1)" SLURM_CPUS_PER_TASK=1 TRAINER="$build/trainer" \
  MPIRUN_EXTRA=--oversubscribe timeout 300 bash "$root/launch/slurm/train.sbatch" --device cpu \
  --d-model 16 --d-ff 32 --layers 1 --heads 2 --vocab 256 --ctx 8 --batch 2 --steps 3 \
  --data "$tmp/train.npy" --out "$tmp/run" 2>&1)
rc=$?
if [[ $rc -ne 0 ]] || ! grep -q "2 rank(s)" <<<"$out" || [[ ! -f "$tmp/run/model.safetensors" ]]; then
  echo "FAIL (exit $rc): $out"
  exit 1
fi
# Stopping before the job's time limit, and continuing. job_stops HOW WANT_RC: the job ends with
# WANT_RC and a checkpoint that it names in $ckpt.
job=(--device cpu --d-model 16 --d-ff 32 --layers 1 --heads 2 --vocab 256 --ctx 8 --batch 2
     --data "$tmp/train.npy" --out "$tmp/long" --resume latest)
sbatch_job() {  # sbatch_job FLAGS...: train.sbatch as Slurm would start it for 2 tasks on 1 node
  SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_CPUS_PER_TASK=1 SLURM_JOB_ID=7 \
    TRAINER="$build/trainer" MPIRUN_EXTRA=--oversubscribe \
    exec bash "$root/launch/slurm/train.sbatch" "${job[@]}" "$@"
}
check_stop() {  # check_stop WHAT RC WANT_RC: the log names a complete checkpoint; sets $ckpt
  ckpt=$(grep -oE "stopped .* after step [0-9]+ .* --resume [^ ]+" "$tmp/long.log" |
    grep -oE "[^ ]+$")
  if [[ $2 -ne $3 || -z $ckpt || ! -f $ckpt/optimizer.safetensors ]]; then
    echo "FAIL: $1: exit $2 (wanted $3), checkpoint '$ckpt'"; tail -5 "$tmp/long.log"
    exit 1
  fi
}
# 1. squeue (a stand-in here) says 20 s are left; with a margin of 0.27 min the script passes
#    --time-limit 0.063 (3.8 s) and the job stops at it, exit 124.
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho " 0:20"\n' > "$tmp/bin/squeue" && chmod +x "$tmp/bin/squeue"
PATH="$tmp/bin:$PATH" TIME_MARGIN_MIN=0.27 timeout 300 bash -c \
  "$(declare -f sbatch_job); $(declare -p job build root); sbatch_job --steps 1000000" \
  > "$tmp/long.log" 2>&1
check_stop "--time-limit from squeue" $? 124
grep -q "0:20 left in the job: --time-limit 0.0633" "$tmp/long.log" ||
  { echo "FAIL: the script did not pass the time squeue reported"; exit 1; }
first=$ckpt
# 2. Slurm's warning (--signal=B:USR1@120 reaches the script, which has become mpirun): every rank
#    stops after its step with a checkpoint, exit 138. The job resumed from the first checkpoint.
sbatch_job --steps 1000000 > "$tmp/long.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q "resumed from $first" "$tmp/long.log" 2>/dev/null &&
    [[ $(grep -c '"step":' "$tmp/long/metrics.jsonl") -ge ${first##*_} ]] && break
  sleep 0.1
done
sleep 0.5
kill -USR1 $pid
for _ in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $pid 2>/dev/null; then  # seen with Open MPI 4.1.6: the ranks never got it
  echo "note: $(mpirun --version | head -1) did not forward SIGUSR1 to the ranks in 30 s;" \
    "signalling them directly"
  pkill -USR1 -f -- "--out $tmp/long --resume latest"
fi
wait $pid
check_stop "SIGUSR1 to the job" $? 138
grep -q "resumed from $first" "$tmp/long.log" || { echo "FAIL: not resumed from $first"; exit 1; }
# 3. The same command with --resume latest continues from the second checkpoint.
out=$(timeout 300 bash -c "$(declare -f sbatch_job); $(declare -p job build root); \
  sbatch_job --steps $(( ${ckpt##*_} + 2 ))" 2>&1)
if [[ $? -ne 0 ]] || ! grep -q "resumed from $ckpt" <<<"$out"; then
  echo "FAIL: resuming with --resume latest: $out"
  exit 1
fi
echo "slurm smoke: 2 ranks trained and saved; outside an allocation the script refuses; the job"
echo "  stopped at the --time-limit from squeue (${first##*/}, exit 124) and at SIGUSR1"
echo "  (${ckpt##*/}, exit 138), and --resume latest continued each time"
