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
# Slurm's warning before the time limit (--signal=B:USR1@120 reaches the script, which has become
# mpirun): every rank stops after its step with a checkpoint, exit 138; the same command with
# --resume latest continues from it.
job=(--device cpu --d-model 16 --d-ff 32 --layers 1 --heads 2 --vocab 256 --ctx 8 --batch 2
     --data "$tmp/train.npy" --out "$tmp/long" --resume latest)
sbatch_job() {  # sbatch_job FLAGS...: train.sbatch as Slurm would start it for 2 tasks on 1 node
  SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_CPUS_PER_TASK=1 TRAINER="$build/trainer" \
    MPIRUN_EXTRA=--oversubscribe exec bash "$root/launch/slurm/train.sbatch" "${job[@]}" "$@"
}
sbatch_job --steps 1000000 > "$tmp/long.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [[ $(wc -l 2>/dev/null < "$tmp/long/metrics.jsonl" || echo 0) -ge 3 ]] && break
  sleep 0.1
done
kill -USR1 $pid
wait $pid
rc=$?
ckpt=$(grep -oE "stopped by SIGUSR1 after step [0-9]+ .* --resume [^ ]+" "$tmp/long.log" |
  grep -oE "[^ ]+$")
if [[ $rc -ne 138 || -z $ckpt || ! -f $ckpt/optimizer.safetensors ]]; then
  echo "FAIL: SIGUSR1 to the job: exit $rc, checkpoint '$ckpt'"; tail -5 "$tmp/long.log"
  exit 1
fi
out=$(timeout 300 bash -c "$(declare -f sbatch_job); $(declare -p job build root); \
  sbatch_job --steps $(( ${ckpt##*_} + 2 ))" 2>&1)
if [[ $? -ne 0 ]] || ! grep -q "resumed from $ckpt" <<<"$out"; then
  echo "FAIL: resuming with --resume latest: $out"
  exit 1
fi
echo "slurm smoke: 2 ranks trained and saved; outside an allocation the script refuses; SIGUSR1"
echo "  stopped the job at ${ckpt##*/} (exit 138) and --resume latest continued from it"
