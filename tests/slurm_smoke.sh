#!/usr/bin/env bash
# launch/slurm/train.sbatch outside Slurm: with the allocation's variables set by hand it starts
# the ranks with mpirun and trains on the CPU backend; without them it refuses to start.
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
echo "slurm smoke: 2 ranks trained and saved; outside an allocation the script refuses"
