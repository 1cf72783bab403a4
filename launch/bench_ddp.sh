#!/usr/bin/env bash
# Data-parallel benchmark on NGPU GPUs of one host (default 2): the single-GPU step, every --ddp
# strategy, ZeRO-1, and a bucket-size sweep, same per-GPU batch; one CSV row per run.
#
#   launch/bench_ddp.sh BUILD_DIR OUT.csv [MODEL] [BATCH] [CTX]
#
# Render with launch/bench_table.py; plot with launch/plot_ddp.py.
set -uo pipefail
build=${1:?usage: bench_ddp.sh BUILD_DIR OUT.csv [MODEL] [BATCH] [CTX]}
csv=${2:?usage: bench_ddp.sh BUILD_DIR OUT.csv [MODEL] [BATCH] [CTX]}
model=${3:-xl}
batch=${4:-4}
ctx=${5:-512}
ngpu=${NGPU:-2}
warmup=${WARMUP:-5}
steps=${STEPS:-15}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
common=(--benchmark --device cuda --model "$model" --batch "$batch" --ctx "$ctx" --warmup "$warmup"
        --steps "$steps" --mode train --csv "$csv" ${EXTRA_ARGS:-})
run() {  # run NP ARGS...
  local np=$1
  shift
  echo "== $np GPU(s): $*"
  mpirun --oversubscribe --bind-to none -np "$np" "$build/trainer" "${common[@]}" "$@" 2>&1 |
    grep -E "forward|backward|comm |optimizer|step +[0-9.]+ ±|error|fatal" | sed 's/^\[[^]]*\] //'
}
run 1 --ddp none
[[ -n "${SKIP_BASE:-}" ]] || run "$ngpu" --ddp bucketed --bucket-mb 25
[[ -n "${SKIP_BASE:-}" ]] || run "$ngpu" --ddp bucketed --bucket-mb 25 --shard-optim
for s in ${STRATEGIES:-naive flat overlap}; do run "$ngpu" --ddp "$s"; done
for mb in ${BUCKETS:-1 10 100 1000}; do run "$ngpu" --ddp bucketed --bucket-mb "$mb"; done
run "$ngpu" --ddp bucketed --bucket-mb 25 --grad-reduce bf16
run "$ngpu" --ddp bucketed --bucket-mb 25 --grad-reduce bf16 --shard-optim
