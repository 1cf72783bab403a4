#!/usr/bin/env bash
# GPU failure handling on 2 GPUs (the first two of a larger machine).
# Usage: gpu_failures.sh BUILD_DIR DATA.npy
#  1. A rank that stops answering mid-run makes a watchdog of the other rank (NCCL's or MPI's) end
#     every rank, with a message naming the rank and the collective, well before the timeout of
#     this script.
#  2. 3 ranks on 2 GPUs (two ranks would share a GPU, which NCCL refuses) are refused on every rank
#     with exit code 2 and a message naming the ranks, before NCCL starts; so is a run whose
#     memory exceeds the GPUs' (xl at 256 x 1024 on 2 ranks), with the sizes, and bf16 gradient
#     copies (--grad-transport ce --grad-reduce bf16) at --precision fp32; on 2 ranks, a
#     --wgrad-stream that leaves its GEMMs fewer than 8 of the SMs backward's GEMMs use.
#  3. --time-limit, and SIGUSR1 sent to one rank, stop both ranks with a checkpoint (exits 124 and
#     138), which --resume latest finds.
#  4. With 3 GPUs or more: --grad-transport ce on 3 ranks (segments of uneven size) trains, and its
#     last loss (fp32) agrees with NCCL's within 2e-4. (Correctness of every strategy with copy engines is
#     test_distributed_gpu's job; this covers an odd rank count.)
set -uo pipefail
build=${1:?usage: gpu_failures.sh BUILD_DIR DATA.npy}
data=${2:?usage: gpu_failures.sh BUILD_DIR DATA.npy}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
tiny=(--device cuda --d-model 64 --d-ff 128 --layers 2 --heads 2 --vocab 256 --ctx 64 --batch 4
      --data "$data")
passed=0 failed=0
verdict() {  # verdict OK PASS_LINE FAIL_LINE: counts the case, prints its line (and the log on failure)
  if [[ $1 == 1 ]]; then
    echo "$2"
    passed=$((passed + 1))
  else
    echo "FAIL $3"
    echo "$out" | tail -20
    failed=$((failed + 1))
  fi
}

start=$(date +%s)
out=$(timeout 180 mpirun --oversubscribe -np 2 "$build/trainer" "${tiny[@]}" --steps 100 \
  --comm-timeout 10 --debug-stall-at-step 3 --debug-stall-rank 1 2>&1)
rc=$?
secs=$(( $(date +%s) - start ))
echo "$out" | grep -E "stops answering|has not completed|has waited|aborting" | head -5
ok=0
# NCCL's watchdog (a collective in flight) or MPI's (a wait on the host), whichever sees it first.
[[ $rc -ne 0 && $rc -ne 124 ]] &&
  grep -qE "rank 0/2: .*(has not completed after|has waited [0-9]+ s)" <<<"$out" && ok=1
verdict $ok "watchdog: every rank stopped (exit $rc) after ${secs} s" \
  "watchdog: exit $rc after ${secs} s"

# refused WHAT MESSAGE GPUS [trainer flags]: 3 ranks on the GPUs listed must each exit 2 with MESSAGE.
refused() {
  local what=$1 msg=$2 gpus=$3
  shift 3
  out=$(timeout 120 mpirun --oversubscribe --bind-to none -np 3 -x CUDA_VISIBLE_DEVICES="$gpus" \
    "$build/trainer" "${tiny[@]}" --steps 2 "$@" 2>&1)
  local rc=$? named ok=0
  named=$(grep -c -- "$msg" <<<"$out")
  grep -- "$msg" <<<"$out" | head -3
  [[ $rc -eq 2 && $named -eq 3 ]] && ok=1
  verdict $ok "$what: refused on every rank (exit 2)" "$what: exit $rc, message on $named of 3 ranks"
}

refused "3 ranks on 2 GPUs" "ranks 0 and 2 would share one GPU" 0,1
# refused_on_2 WHAT MESSAGE [trainer flags]: 2 ranks, one per GPU, must each exit 2 with MESSAGE.
refused_on_2() {
  local what=$1 msg=$2
  shift 2
  out=$(timeout 120 mpirun --oversubscribe --bind-to none -np 2 "$build/trainer" "$@" 2>&1)
  local rc=$? named ok=0
  named=$(grep -c -- "$msg" <<<"$out")
  grep -- "$msg" <<<"$out" | head -2
  [[ $rc -eq 2 && $named -eq 2 ]] && ok=1
  verdict $ok "$what: refused on both ranks (exit 2)" "$what: exit $rc, message on $named of 2 ranks"
}
# A run too big for the GPUs: both ranks refuse it with the sizes, exit 2, before any work.
refused_on_2 "a run too big for the GPU" "model does not fit: needs .* GiB free on GPU" \
  --device cuda --model xl --batch 256 --ctx 1024 --benchmark
# Whole bf16 gradient copies need bf16 parameters.
refused_on_2 "bf16 gradient copies at fp32" \
  "--grad-transport ce --grad-reduce bf16 keeps bf16 gradients, which needs --precision bf16" \
  "${tiny[@]}" --steps 2 --grad-transport ce --grad-reduce bf16 --precision fp32
# Backward's GEMMs on 132 - 64 SMs beside the collectives would leave the weight-gradient stream
# 4 of them: both ranks refuse it, naming the SMs.
refused_on_2 "--wgrad-stream leaving fewer than 8 SMs" \
  "--wgrad-stream 64 leaves the weight-gradient GEMMs [0-9]* of the [0-9]* SMs backward's GEMMs use" \
  "${tiny[@]}" --steps 2 --ddp bucketed --comm-sms 64 --wgrad-stream 64
# Stopping with a checkpoint on GPUs: at --time-limit (exit 124); then, resumed with --resume
# latest, by SIGUSR1 sent to one rank only (exit 138: the ranks agree to stop); then --resume
# latest continues from that checkpoint.
rm -rf /tmp/gpu_stop
stop_ok=0 ckpt= ckpt2=
out=$(timeout 120 mpirun --oversubscribe --bind-to none -np 2 "$build/trainer" "${tiny[@]}" \
  --steps 1000000 --shard-optim --out /tmp/gpu_stop --resume latest --time-limit 0.15 2>&1)
rc1=$?
ckpt=$(grep -oE "stopped at --time-limit .* --resume [^ ]+" <<<"$out" | grep -oE "[^ ]+$")
if [[ $rc1 -eq 124 && -n $ckpt ]]; then
  mpirun --oversubscribe --bind-to none -np 2 "$build/trainer" "${tiny[@]}" --steps 1000000 \
    --shard-optim --out /tmp/gpu_stop --resume latest > /tmp/gpu_stop.log 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    grep -q "resumed from $ckpt" /tmp/gpu_stop.log && break
    sleep 0.1
  done
  sleep 2
  kill -USR1 "$(pgrep -f -- "--out /tmp/gpu_stop" | grep -v "^$pid$" | tail -1)"
  wait $pid
  rc2=$?
  ckpt2=$(grep -oE "stopped by SIGUSR1 .* --resume [^ ]+" /tmp/gpu_stop.log | grep -oE "[^ ]+$")
  if [[ $rc2 -eq 138 && -n $ckpt2 ]]; then
    out=$(timeout 120 mpirun --oversubscribe --bind-to none -np 2 "$build/trainer" "${tiny[@]}" \
      --steps $(( ${ckpt2##*_} + 3 )) --shard-optim --out /tmp/gpu_stop --resume latest 2>&1) &&
      grep -q "resumed from $ckpt2" <<<"$out" && stop_ok=1
  fi
fi
out=$(cat /tmp/gpu_stop.log 2>/dev/null)
verdict $stop_ok "stops: --time-limit at ${ckpt##*/} (exit 124), SIGUSR1 to one rank at \
${ckpt2##*/} (exit ${rc2:-}), --resume latest continued" \
  "stops: time limit exit $rc1 '${ckpt}', SIGUSR1 exit ${rc2:-} '${ckpt2}'"

# last_loss TRANSPORT: the loss of the last step of a 3-rank run on GPUs 0-2 ("" if it failed).
last_loss() {
  out=$(timeout 120 mpirun --oversubscribe --bind-to none -np 3 -x CUDA_VISIBLE_DEVICES=0,1,2 \
    "$build/trainer" "${tiny[@]}" --steps 6 --precision fp32 --grad-transport "$1" 2>&1) || return
  grep -oE "step +6/6 \| loss [0-9.]+" <<<"$out" | grep -oE "[0-9.]+$"
}
if [[ $(nvidia-smi -L | wc -l) -ge 3 ]]; then
  nccl=$(last_loss nccl)
  ce=$(last_loss ce)
  ok=0
  [[ -n $ce && -n $nccl ]] && awk -v a="$ce" -v b="$nccl" 'BEGIN { exit !(a - b < 2e-4 && b - a < 2e-4) }' &&
    ok=1
  verdict $ok "--grad-transport ce on 3 ranks: last loss $ce (nccl: $nccl)" \
    "--grad-transport ce on 3 ranks: last loss '$ce', nccl '$nccl'"
else
  echo "--grad-transport ce on 3 ranks: skipped (fewer than 3 GPUs)"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
