#!/usr/bin/env bash
# Submits a benchmark sweep as one Slurm job array: one task per run of the plan file, all
# appending to one CSV; then renders the table and plot (launch/sweep_report.py) once every task
# has ended.
#
#   launch/slurm/sweep.sh PLAN OUT.csv [SBATCH_OPTION ...] [-- TRAINER_FLAG ...]
#   launch/slurm/sweep.sh launch/plans/ddp.txt runs/ddp.csv --nodes=2 --ntasks-per-node=4 \
#       --gpus-per-node=4 -- --model xl --batch 4 --ctx 512 --warmup 5 --steps 15
#
# Prints the job id; with --wait among the sbatch options it waits for the array, then writes
# OUT.md (the table) and OUT.png (the plot) beside the CSV.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
usage="usage: sweep.sh PLAN OUT.csv [SBATCH_OPTION ...] [-- TRAINER_FLAG ...]"
plan=$(realpath "${1:?$usage}")
csv=$(realpath -m "${2:?$usage}")
shift 2
source "$root/launch/plan.sh"
[[ -r $plan ]] || { echo "sweep.sh: cannot read plan $plan" >&2; exit 2; }
runs=$(plan_runs "$plan" | wc -l)
((runs > 0)) || { echo "sweep.sh: $plan holds no runs" >&2; exit 2; }
opts=()
while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
wait=0
for o in "${opts[@]}"; do [[ $o == --wait || $o == -W ]] && wait=1; done
mkdir -p "$(dirname "$csv")"
echo "sweep.sh: $runs run(s) of $plan as array tasks 0-$((runs - 1)), rows to $csv"
rc=0
TRAINER_ROOT=$root sbatch --array="0-$((runs - 1))" --output="${csv%.csv}-%A_%a.out" \
  "${opts[@]}" "$root/launch/slurm/sweep.sbatch" "$plan" "$csv" "$@" || rc=$?
((wait)) || exit "$rc"
# With --wait sbatch exits with the highest exit code of the tasks; render what arrived anyway.
python3 "$root/launch/sweep_report.py" "$csv" || rc=$?
exit "$rc"
