#!/usr/bin/env bash
# Data-parallel benchmark on NGPU GPUs of one host (default 2), same per-GPU batch in every run;
# one CSV row per run (launch/bench_table.py renders them, launch/plot_ddp.py plots them).
#
#   launch/bench_ddp.sh BUILD_DIR OUT.csv [MODEL] [BATCH] [CTX]
#
# What runs is a plan (launch/plan.sh: one run per line, "NP [VAR=value ...] [trainer flags ...]",
# NP a number of GPUs or "N" for NGPU). PLAN=FILE picks one (default: launch/plans/ddp.txt, the
# 1-GPU step, every --ddp strategy, ZeRO-1 and a bucket-size sweep).
set -uo pipefail
build=${1:?usage: bench_ddp.sh BUILD_DIR OUT.csv [MODEL] [BATCH] [CTX]}
csv=${2:?usage: bench_ddp.sh BUILD_DIR OUT.csv [MODEL] [BATCH] [CTX]}
model=${3:-xl}
batch=${4:-4}
ctx=${5:-512}
ngpu=${NGPU:-2}
warmup=${WARMUP:-5}
steps=${STEPS:-15}
plan=${PLAN:-$(dirname "$0")/plans/ddp.txt}
[[ -r "$plan" ]] || { echo "bench_ddp.sh: cannot read plan $plan" >&2; exit 2; }
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/plan.sh"
common=(--benchmark --device cuda --model "$model" --batch "$batch" --ctx "$ctx" --warmup "$warmup"
        --steps "$steps" --mode train --csv "$csv" ${EXTRA_ARGS:-})
while read -r line; do
  parse_run "$line" "$ngpu"
  echo "== $np GPU(s): ${line#* }"
  if ((hosts > 1)); then
    launcher=("$(dirname "$0")/as_hosts.sh" "$hosts" $((np / hosts)) --oversubscribe "${envs[@]}" --)
  else
    launcher=(mpirun --oversubscribe --bind-to none -np "$np" "${envs[@]}")
  fi
  "${launcher[@]}" "$build/trainer" "${common[@]}" "${args[@]}" 2>&1 </dev/null |
    grep -E "forward|backward|comm |optimizer|step +[0-9.]+ ±|error|fatal" | sed 's/^\[[^]]*\] //'
done < <(plan_runs "$plan")
