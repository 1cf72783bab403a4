#!/usr/bin/env bash
# Every input a user can get wrong stops the trainer with one clear message and a non-zero exit,
# on every rank, without hanging. Usage: cli_failures.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: cli_failures.sh BUILD_DIR}
trainer="$build/trainer"
tokenize="$build/launch/tokenize"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun="mpirun --oversubscribe"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0 passed=0

# A small valid corpus (vocab 256) and a model that trains on it in a blink.
head -c 20000 /dev/urandom > "$tmp/text.txt"
"$tokenize" --out-train "$tmp/train.npy" --out-val "$tmp/val.npy" "$tmp/text.txt" > /dev/null
small=(--device cpu --d-model 16 --d-ff 32 --layers 1 --heads 2 --vocab 256 --ctx 8 --batch 2)

# expect CODE PATTERN CMD...: the command exits with CODE (within 120 s) and prints PATTERN.
expect() {
  local want=$1 pattern=$2
  shift 2
  local out rc
  out=$(timeout 120 "$@" 2>&1)
  rc=$?
  if [[ $rc -eq 124 ]]; then
    echo "FAIL (hung, killed after 120 s): $*"; failures=$((failures + 1)); return
  fi
  if [[ "$want" == nonzero && $rc -ne 0 ]] || [[ "$rc" == "$want" ]]; then
    if grep -qE -- "$pattern" <<<"$out"; then
      passed=$((passed + 1)); return
    fi
  fi
  echo "FAIL (exit $rc, wanted $want, pattern '$pattern'): $*"
  echo "$out" | tail -5 | sed 's/^/    /'
  failures=$((failures + 1))
}

data=(--data "$tmp/train.npy")
touch "$tmp/afile"  # a regular file: paths below it cannot be written
expect 2 "--steps must be positive" "$trainer" "${small[@]}" "${data[@]}" --steps 0
expect 2 "--steps must be positive" "$trainer" "${small[@]}" "${data[@]}" --steps -3
expect 2 "--batch must be positive" "$trainer" "${small[@]}" "${data[@]}" --batch 0
expect 2 "--ctx must be positive" "$trainer" "${small[@]}" "${data[@]}" --ctx 0
expect 2 "--heads 3 does not divide --d-model 16" "$trainer" "${small[@]}" "${data[@]}" --heads 3
expect 2 "head dimension 5 .* is odd" "$trainer" "${small[@]}" "${data[@]}" --d-model 10 --heads 2
expect 2 "unknown model preset 'huge'" "$trainer" "${small[@]}" "${data[@]}" --model huge
expect 2 "--data is required" "$trainer" "${small[@]}"
expect 2 "no-such-file" "$trainer" "${small[@]}" --data "$tmp/no-such-file.npy"
expect 2 "unknown|not a strategy|--ddp" "$trainer" "${small[@]}" "${data[@]}" --ddp ring
expect 2 "--sampler 'foo'" "$trainer" "${small[@]}" "${data[@]}" --sampler foo
expect 2 "--precision bf16 needs --device cuda" "$trainer" "${small[@]}" "${data[@]}" --precision bf16
expect 2 "--precision fp16 needs --device cuda; the CPU backend \(--device cpu\)" "$trainer" \
  "${small[@]}" "${data[@]}" --precision fp16
expect 2 "--precision 'fp8' is not auto, fp32, tf32, bf16 or fp16" "$trainer" "${small[@]}" \
  "${data[@]}" --precision fp8
expect 2 "--recompute 'all': expected 'none', 'ffn' or 'block'" "$trainer" "${small[@]}" \
  "${data[@]}" --recompute all
expect 2 "--grad-reduce bf16 needs --device cuda" "$trainer" "${small[@]}" "${data[@]}" --grad-reduce bf16
expect 2 "--wd must be a finite number >= 0" "$trainer" "${small[@]}" "${data[@]}" --wd -0.1
expect 2 "--eps must be a finite number > 0" "$trainer" "${small[@]}" "${data[@]}" --eps 0
expect 2 "--lr must be a finite number >= 0" "$trainer" "${small[@]}" "${data[@]}" --lr nan
expect 2 "--clip must be a finite number >= 0" "$trainer" "${small[@]}" "${data[@]}" --clip -1
expect 2 "--loss-scale must be auto, none, dynamic or a finite number > 0" "$trainer" "${small[@]}" \
  "${data[@]}" --loss-scale 0
expect 2 "--loss-scale-window must be >= 1" "$trainer" "${small[@]}" "${data[@]}" \
  --loss-scale dynamic --loss-scale-window 0
expect 2 "--time-limit must be a finite number of minutes >= 0" "$trainer" "${small[@]}" "${data[@]}" \
  --time-limit -5
expect 2 "--comm-timeout must be positive" "$trainer" "${small[@]}" "${data[@]}" --comm-timeout 0
expect 2 "--grad-reduce 'fp16'" "$trainer" "${small[@]}" "${data[@]}" --grad-reduce fp16
expect 2 "--grad-transport ce needs --device cuda" "$trainer" "${small[@]}" "${data[@]}" --grad-transport ce
expect 2 "--grad-transport 'shm' is not nccl or ce" "$trainer" "${small[@]}" "${data[@]}" --grad-transport shm
expect 2 "cannot be combined with --shard-optim" "$trainer" "${small[@]}" "${data[@]}" --grad-transport ce --grad-reduce bf16 --shard-optim
expect 2 "--comm-sms 8 needs --device cuda" "$trainer" "${small[@]}" "${data[@]}" --comm-sms 8
expect 2 "--comm-sms must lie in \\[0, 64\\]" "$trainer" "${small[@]}" "${data[@]}" --comm-sms -1
expect 2 "--cuda-graph needs --device cuda" "$trainer" "${small[@]}" "${data[@]}" --cuda-graph
expect 2 "--adam-state 'fp16' is not fp32 or bf16" "$trainer" "${small[@]}" "${data[@]}" --adam-state fp16
expect 2 "--overlap-update 'yes' is not auto, on or off" "$trainer" "${small[@]}" "${data[@]}" --overlap-update yes
expect 2 "--overlap-update on needs --device cuda" "$trainer" "${small[@]}" "${data[@]}" --overlap-update on
expect 2 "--update-sms must be auto or a number in \\[0, 64\\] \\(got '65'\\)" "$trainer" "${small[@]}" "${data[@]}" --update-sms 65
expect 2 "--update-sms must be auto or a number in \\[0, 64\\] \\(got 'most'\\)" "$trainer" "${small[@]}" "${data[@]}" --update-sms most
expect 2 "--update-sms 8 needs the update beside forward" "$trainer" "${small[@]}" "${data[@]}" --update-sms 8
expect 2 "--gemm-tune must be auto, on or off \\(got 'fast'\\)" "$trainer" "${small[@]}" "${data[@]}" --gemm-tune fast
expect 2 "--gemm-tune on needs --device cuda" "$trainer" "${small[@]}" "${data[@]}" --gemm-tune on
expect 2 "--cuda-graph needs --device cuda \\(--device auto, which found no GPU\\)" \
  env CUDA_VISIBLE_DEVICES= "$trainer" "${small[@]:2}" "${data[@]}" --cuda-graph
expect 2 "--mode 'bogus'" "$trainer" "${small[@]}" --benchmark --mode bogus
expect 2 "--kernel-trace records --benchmark" "$trainer" "${small[@]}" "${data[@]}" --kernel-trace "$tmp/kt"
expect 2 "--kernel-trace records GPU kernels: it needs --device cuda" "$trainer" "${small[@]}" \
  --benchmark --kernel-trace "$tmp/kt"
if ! nvidia-smi -L > /dev/null 2>&1; then  # --device auto lands on the CPU: refused on every rank
  expect nonzero "rank 1.*--kernel-trace records GPU kernels, and this run is on the CPU" \
    $mpirun -np 2 "$trainer" "${small[@]:2}" --device auto --benchmark --kernel-trace "$tmp/kt"
fi
expect 2 "--floors-at-cap measures --benchmark's step" "$trainer" "${small[@]}" "${data[@]}" --floors-at-cap
expect 2 "--floors-at-cap reads the GPU's power: it needs --device cuda" "$trainer" "${small[@]}" \
  --benchmark --floors-at-cap
if ! nvidia-smi -L > /dev/null 2>&1; then
  expect nonzero "rank 1.*--floors-at-cap reads the GPU's power, and this run is on the CPU" \
    $mpirun -np 2 "$trainer" "${small[@]:2}" --device auto --benchmark --floors-at-cap
fi
expect 2 "--bucket-mb must be a finite number >= 0" "$trainer" "${small[@]}" "${data[@]}" --bucket-mb -1
expect 2 "--trace .*cannot write" "$trainer" "${small[@]}" "${data[@]}" --trace "$tmp/afile/t.json"
expect 2 "--csv .*cannot write" "$trainer" "${small[@]}" --benchmark --csv "$tmp/afile/r.csv"
expect 2 "--memory-report .*cannot write" "$trainer" "${small[@]}" "${data[@]}" \
  --memory-report "$tmp/afile/m.json"
printf 'time,model,step_ms\n1,tiny,3.0\n' > "$tmp/old.csv"
expect 2 "--csv .*other columns" "$trainer" "${small[@]}" --benchmark --csv "$tmp/old.csv"
expect 2 "--frobnicate" "$trainer" "${small[@]}" "${data[@]}" --frobnicate
# Data shorter than ctx + 2 tokens.
printf 'abcde' > "$tmp/short.txt"
"$tokenize" --out-train "$tmp/short.npy" --out-val "$tmp/short_val.npy" --val-fraction 0 \
  "$tmp/short.txt" > /dev/null
expect 2 "at least" "$trainer" "${small[@]}" --data "$tmp/short.npy"
# Token ids >= vocab (byte-level data with a 100-token vocabulary).
expect 2 "vocab|>= 100" "$trainer" "${small[@]}" "${data[@]}" --vocab 100
# Unwritable --out (a path below a regular file).
expect 2 "--out" "$trainer" "${small[@]}" "${data[@]}" --steps 2 --out "$tmp/afile/sub"
# A corrupt checkpoint and a missing one.
expect 2 "no such checkpoint directory" "$trainer" "${small[@]}" "${data[@]}" --resume "$tmp/nope"
"$trainer" "${small[@]}" "${data[@]}" --steps 2 --out "$tmp/run" > /dev/null 2>&1
printf 'garbage' | dd of="$tmp/run/step_2/optimizer.safetensors" bs=1 seek=100 conv=notrunc 2>/dev/null
expect 2 "optimizer.safetensors" "$trainer" "${small[@]}" "${data[@]}" --steps 4 --resume "$tmp/run/step_2"
# Weights of another model (d_model 32 instead of 16): the message names the file and the flag.
# (Files without our config metadata are checked tensor by tensor: test_safetensors.)
"$trainer" "${small[@]}" "${data[@]}" --d-model 32 --steps 1 --out "$tmp/wide" > /dev/null 2>&1
expect 2 "wide/model.safetensors has --d-model 32 but this run has 16" "$trainer" "${small[@]}" \
  "${data[@]}" --init-from "$tmp/wide/model.safetensors"
truncate -s 50 "$tmp/run/model.safetensors"
expect 2 "model.safetensors" "$trainer" "${small[@]}" "${data[@]}" --init-from "$tmp/run/model.safetensors"
# Weights of the same shapes but another model (--heads), and a checkpoint mixing two saves.
"$trainer" "${small[@]}" "${data[@]}" --heads 4 --steps 1 --out "$tmp/h4" > /dev/null 2>&1
expect 2 "h4/model.safetensors has --heads 4 but this run has 2" "$trainer" "${small[@]}" \
  "${data[@]}" --init-from "$tmp/h4/model.safetensors"
"$trainer" "${small[@]}" "${data[@]}" --steps 3 --save-every 1 --out "$tmp/mixed" > /dev/null 2>&1
cp "$tmp/mixed/step_1/model.safetensors" "$tmp/mixed/step_2/model.safetensors"
expect 2 "mixes two saves" "$trainer" "${small[@]}" "${data[@]}" --steps 4 --resume "$tmp/mixed/step_2"
# A fresh run does not write over the run in --out; --overwrite replaces it, and says so.
expect 2 "already holds a run.*--resume .*mixed/step_3" "$trainer" "${small[@]}" "${data[@]}" \
  --steps 2 --out "$tmp/mixed"
expect 2 "--overwrite and --resume exclude each other" "$trainer" "${small[@]}" "${data[@]}" \
  --steps 4 --out "$tmp/mixed" --resume "$tmp/mixed/step_1" --overwrite
expect 0 "--overwrite: deleting the run" "$trainer" "${small[@]}" "${data[@]}" --steps 2 \
  --out "$tmp/mixed" --overwrite
if [[ -d "$tmp/mixed/step_2" && ! -d "$tmp/mixed/step_3" ]]; then passed=$((passed + 1)); else
  echo "FAIL: --overwrite left the old run's step_3 (or wrote no step_2)"; failures=$((failures + 1)); fi
# A checkpoint write that fails (a file-size limit stands in for a full disk): every rank prints
# the writer's error, exit 2, and no partial directory is left. ZeRO-1, so that the tensor sources
# are collectives the writer must keep serving; TCP, so that the limit spares MPI's shared memory.
out=$(timeout 120 $mpirun --mca btl self,tcp -np 2 bash -c 'ulimit -f 20; trap "" XFSZ; exec "$@"' \
  _ "$trainer" "${small[@]}" "${data[@]}" --d-model 64 --d-ff 128 --steps 2 --shard-optim \
  --out "$tmp/full" 2>&1)
rc=$?
if [[ $rc -eq 2 && $(grep -c "File too large" <<<"$out") -ge 2 ]] &&
  ! compgen -G "$tmp/full/step_2*" > /dev/null; then passed=$((passed + 1)); else
  echo "FAIL: a failed checkpoint write (exit $rc):"; echo "$out" | tail -5 | sed 's/^/    /'
  ls "$tmp/full" | sed 's/^/    /'; failures=$((failures + 1)); fi
# metrics.jsonl that cannot be written mid-run (the same limit, 4 KiB: a few steps' lines): every
# rank stops with rank 0's message, exit 2, instead of rank 0 alone aborting the others.
out=$(timeout 120 $mpirun --mca btl self,tcp -np 2 bash -c 'ulimit -f 4; trap "" XFSZ; exec "$@"' \
  _ "$trainer" "${small[@]}" "${data[@]}" --steps 500 --out "$tmp/metrics_full" 2>&1)
rc=$?
if [[ $rc -eq 2 && $(grep -c "metrics.jsonl: writing failed" <<<"$out") -ge 2 ]]; then
  passed=$((passed + 1)); else
  echo "FAIL: a failed metrics write mid-run (exit $rc):"; echo "$out" | tail -5 | sed 's/^/    /'
  failures=$((failures + 1)); fi
# A run resumed from step 3 of a 6-step run that went on to step 6: metrics.jsonl holds steps 1-6
# once each; the interrupted run's lines for steps 4-6 (3 steps, 2 validations) and a line torn by
# the interruption are kept in metrics_superseded.jsonl.
expect 0 "step +6/6" "$trainer" "${small[@]}" "${data[@]}" --steps 6 --save-every 3 \
  --val-data "$tmp/val.npy" --eval-every 2 --eval-batches 1 --out "$tmp/resumed"
printf '{"step":7,"lo' >> "$tmp/resumed/metrics.jsonl"
expect 0 "6 line\(s\) of metrics.jsonl written after step 3 .* moved to" "$trainer" "${small[@]}" \
  "${data[@]}" --steps 6 --val-data "$tmp/val.npy" --eval-every 2 --eval-batches 1 \
  --out "$tmp/resumed" --resume "$tmp/resumed/step_3"
if python3 -c "
import json, sys
steps = lambda f: [json.loads(l)['step'] for l in open(f) if 'loss' in json.loads(l)]
aside = open(sys.argv[2]).read().splitlines()
sys.exit(0 if steps(sys.argv[1]) == [1, 2, 3, 4, 5, 6] and aside[-1] == '{\"step\":7,\"lo' and
         [json.loads(l)['step'] for l in aside[:-1] if 'loss' in json.loads(l)] == [4, 5, 6] else 1)
" "$tmp/resumed/metrics.jsonl" "$tmp/resumed/metrics_superseded.jsonl"; then passed=$((passed + 1))
else echo "FAIL: the resumed run's metrics.jsonl does not hold steps 1-6 once each"
  failures=$((failures + 1)); fi
# signal_target PATTERN PID: the process whose command line matches PATTERN and is not PID (a rank
# that PID, mpirun, started), else PID itself.
signal_target() {
  local t
  t=$(pgrep -f -- "$1" | grep -v "^$2\$" | tail -1)
  echo "${t:-$2}"
}
# A stop signal mid-run: the ranks finish the step, write a checkpoint, and exit 128 + the signal;
# the checkpoint resumes. One process with SIGTERM (Slurm's time limit), then 2 ranks of which
# one alone gets SIGUSR1 (the ranks agree to stop). Each waits until the run has logged a few
# steps. (Through mpirun's forwarding and with --time-limit: tests/slurm_smoke.sh.)
# stop_run SIGNAL WANT_RC OUT CMD...: runs CMD in the background, signals the process that has
# "--out OUT" in its command line and is not CMD's own (a rank under mpirun; else CMD itself),
# checks the exit code, the message and the checkpoint it names, and sets $ckpt to that checkpoint.
stop_run() {
  local sig=$1 want=$2 dir=$3
  shift 3
  "$@" > "$tmp/stop.log" 2>&1 &
  local pid=$! waited=0
  until [[ $(wc -l 2>/dev/null < "$dir/metrics.jsonl" || echo 0) -ge 3 || $waited -ge 600 ]]; do
    sleep 0.1; waited=$((waited + 1)); done
  kill -"$sig" "$(signal_target "--out $dir\$" $pid)"
  wait $pid
  local rc=$?
  ckpt=$(grep -oE "stopped by SIG$sig after step [0-9]+ of [0-9]+: continue with --resume [^ ]+" \
    "$tmp/stop.log" | grep -oE "[^ ]+$")
  if [[ $rc -eq $want && -n $ckpt && -f $ckpt/optimizer.safetensors ]]; then
    passed=$((passed + 1)); else
    echo "FAIL: $sig mid-run: exit $rc (wanted $want), checkpoint '$ckpt'"; ckpt=
    tail -5 "$tmp/stop.log" | sed 's/^/    /'; failures=$((failures + 1)); fi
}
stop_run TERM 143 "$tmp/stopped" "$trainer" "${small[@]}" "${data[@]}" --steps 1000000 \
  --out "$tmp/stopped"
# --resume latest finds that checkpoint; run again, the same command has nothing left to do.
if [[ -n $ckpt ]]; then
  more=(--steps $(( ${ckpt##*_} + 2 )) --out "$tmp/stopped" --resume latest)
  expect 0 "resumed from $ckpt at step" "$trainer" "${small[@]}" "${data[@]}" "${more[@]}"
  expect 0 "--resume latest: .*step_$(( ${ckpt##*_} + 2 )) is at --steps .* nothing left" \
    "$trainer" "${small[@]}" "${data[@]}" "${more[@]}"
fi
expect 2 "--resume latest needs --out" "$trainer" "${small[@]}" "${data[@]}" --resume latest
# --keep-last 2 leaves the two newest checkpoints; resuming from the older one warns that a newer
# one exists.
expect 0 "--keep-last 2: deleted .*keep/step_4" "$trainer" "${small[@]}" "${data[@]}" --steps 6 \
  --save-every 1 --keep-last 2 --out "$tmp/keep"
if [[ "$(cd "$tmp/keep" && echo step_*)" == "step_5 step_6" ]]; then passed=$((passed + 1)); else
  echo "FAIL: --keep-last 2 left $(cd "$tmp/keep" && echo step_*)"; failures=$((failures + 1)); fi
expect 0 "holds checkpoints newer than the one resumed from .*keep/step_6" "$trainer" \
  "${small[@]}" "${data[@]}" --steps 7 --out "$tmp/keep" --resume "$tmp/keep/step_5"
mkdir "$tmp/keep/step_8.tmp-4242"  # what a save killed mid-write leaves
expect 0 "holds what interrupted saves left \\(step_8.tmp-4242\\)" "$trainer" "${small[@]}" \
  "${data[@]}" --steps 8 --out "$tmp/keep" --resume latest
expect 2 "--save-every, --eval-every and --keep-last must not be negative" "$trainer" \
  "${small[@]}" "${data[@]}" --keep-last -1
# A requeued fine-tune: --init-from gives the first start its weights, later starts resume.
tune=(--d-model 32 --out "$tmp/tune" --resume latest --init-from "$tmp/wide/model.safetensors")
expect 0 "initial weights from .*wide/model.safetensors" "$trainer" "${small[@]}" "${data[@]}" \
  "${tune[@]}" --steps 2
expect 0 "resumed from .*tune/step_2 at step 2" "$trainer" "${small[@]}" "${data[@]}" \
  "${tune[@]}" --steps 3
expect 2 "--init-from and --resume DIR exclude each other" "$trainer" "${small[@]}" "${data[@]}" \
  --d-model 32 --resume "$tmp/tune/step_3" --init-from "$tmp/wide/model.safetensors"
# An --out with metrics but no checkpoint yet (stopped before its first save): latest starts afresh.
mkdir -p "$tmp/early" && echo '{"step":1,"loss":5}' > "$tmp/early/metrics.jsonl"
expect 0 "starting afresh \(no checkpoint yet\): 1 line" "$trainer" "${small[@]}" "${data[@]}" \
  --steps 2 --out "$tmp/early" --resume latest
stop_run USR1 138 "$tmp/stopped2" $mpirun -np 2 "$trainer" "${small[@]}" "${data[@]}" \
  --steps 1000000 --shard-optim --out "$tmp/stopped2"
[[ -n $ckpt ]] && expect 0 "resumed from .*stopped2/step_" $mpirun -np 2 "$trainer" "${small[@]}" \
  "${data[@]}" --steps $(( ${ckpt##*_} + 2 )) --shard-optim --out "$tmp/stopped2" --resume "$ckpt"
# A stop signal during start-up (here a --debug-start-ms wait, standing for a large checkpoint being
# read): the run stops before its first step with 128 + the signal and writes nothing; resumed, it
# names the checkpoint it came from. The rank is signalled once every rank has logged that wait
# (its handlers are in place then; earlier, another library's handler may take the signal, as
# Open MPI 4.1.6's was seen to); with 2 ranks (under mpirun, which does not pass SIGUSR1 on) one
# rank alone gets it. stop_at_start WANT_RC RANKS PATTERN OUT CMD...
stop_at_start() {
  local want=$1 ranks=$2 pattern=$3 dir=$4
  shift 4
  local before
  before=$(ls "$dir" 2>/dev/null; cat "$dir/metrics.jsonl" 2>/dev/null)
  # Emptied here, not only by the background command's redirection: on a loaded machine the wait
  # below could otherwise read the previous call's "waiting" lines and signal a process that has
  # not installed its handlers yet (seen in CI: the run died of SIGUSR1).
  : > "$tmp/start.log"
  "$@" > "$tmp/start.log" 2>&1 &
  local pid=$! waited=0
  until [[ $(grep -c -- "--debug-start-ms 2000: waiting" "$tmp/start.log") -ge $ranks ||
    $waited -ge 600 ]]; do
    sleep 0.05
    waited=$((waited + 1))
  done
  kill -USR1 "$(signal_target "--out $dir --debug-start-ms" $pid)"
  wait $pid
  local rc=$?
  if [[ $rc -eq $want ]] && grep -qE -- "$pattern" "$tmp/start.log" &&
    [[ "$(ls "$dir" 2>/dev/null; cat "$dir/metrics.jsonl" 2>/dev/null)" == "$before" ]]; then
    passed=$((passed + 1)); else
    echo "FAIL: SIGUSR1 during start-up: exit $rc (wanted $want), '$pattern', $dir changed?"
    tail -5 "$tmp/start.log" | sed 's/^/    /'; failures=$((failures + 1)); fi
}
stop_at_start 138 2 "stopped by SIGUSR1 during start-up, before the first step: nothing trained" \
  "$tmp/fresh_stop" $mpirun -np 2 "$trainer" "${small[@]}" "${data[@]}" --steps 100 \
  --out "$tmp/fresh_stop" --debug-start-ms 2000
if [[ -n $ckpt ]]; then
  last=$(( ${ckpt##*_} + 2 ))  # the run just above went on to there
  # --steps beyond it, whatever step the signal above stopped at (a fast machine passed 1000).
  steps=$(( last + 1000 ))
  stop_at_start 138 1 "stopped by SIGUSR1 after step $last of $steps, during start-up, before \
training a step: continue with --resume .*stopped2/step_$last\$" "$tmp/stopped2" "$trainer" \
    "${small[@]}" "${data[@]}" --steps $steps --out "$tmp/stopped2" --debug-start-ms 2000 \
    --resume latest
fi
# An llm.c token shard (1 KiB header, then uint16 tokens) trains exactly like the same tokens raw.
"$tokenize" --out-train "$tmp/raw.bin" --out-val "$tmp/raw_val.bin" "$tmp/text.txt" > /dev/null
python3 -c "
import struct, sys
body = open(sys.argv[1], 'rb').read()
header = struct.pack('<256i', *([20240520, 1, len(body) // 2] + [0] * 253))
open(sys.argv[2], 'wb').write(header + body)" "$tmp/raw.bin" "$tmp/llmc.bin"
loss3() {  # loss3 DATA: the log's loss after 3 steps on DATA
  "$trainer" "${small[@]}" --data "$1" --steps 3 --log-every 1 2>&1 |
    grep -oE "step +3/3 \| loss [0-9.]+"
}
raw=$(loss3 "$tmp/raw.bin")
llmc=$(loss3 "$tmp/llmc.bin")
if [[ -n $raw && $raw == "$llmc" ]]; then passed=$((passed + 1)); else
  echo "FAIL: the llm.c shard trained differently: '$llmc' vs raw '$raw'"; failures=$((failures + 1)); fi
# The same tokens in two llm.c shards, given as a glob: the same training again.
python3 -c "
import struct, sys
body = open(sys.argv[1], 'rb').read()
cut = len(body) // 4 * 2  # a token boundary near the middle
for name, part in ((sys.argv[2], body[:cut]), (sys.argv[3], body[cut:])):
    open(name, 'wb').write(struct.pack('<256i', *([20240520, 1, len(part) // 2] + [0] * 253)) + part)
" "$tmp/raw.bin" "$tmp/shard_a.bin" "$tmp/shard_b.bin"
shards=$(loss3 "$tmp/shard_*.bin")
if [[ -n $raw && $raw == "$shards" ]]; then passed=$((passed + 1)); else
  echo "FAIL: two shards trained differently: '$shards' vs raw '$raw'"; failures=$((failures + 1)); fi
expect 2 "the pattern '.*nothing_\\*.bin' matches no file" "$trainer" "${small[@]}" \
  --data "$tmp/nothing_*.bin"
# Values out of range that the flags' types accept.
expect 2 "--min-lr must be a finite number in \\[0, --lr" "$trainer" "${small[@]}" "${data[@]}" --min-lr 1
expect 2 "--peak-tflops must be a finite number >= 0" "$trainer" "${small[@]}" "${data[@]}" \
  --peak-tflops -5
expect 2 "--batch 2305843009213693952, .* must each be at most" "$trainer" "${small[@]}" \
  "${data[@]}" --batch 2305843009213693952
expect 2 "micro-batch of --batch 65536 x --ctx 65536" "$trainer" "${small[@]}" "${data[@]}" \
  --batch 65536 --ctx 65536
expect 2 "--layers 100000000 exceed the limits" "$trainer" "${small[@]}" "${data[@]}" --layers 100000000
expect 2 "need at least .* GiB of host memory" "$trainer" "${small[@]}" "${data[@]}" --layers 1000 \
  --d-model 4096 --d-ff 16384 --heads 32
# A trace that cannot be written at the end (a full device) is an error, not "trace written".
expect 2 "--trace /dev/full: writing failed" "$trainer" "${small[@]}" "${data[@]}" --steps 2 \
  --trace /dev/full
# So is a memory report that cannot be written after the first step, on both ranks, and the
# run stops there instead of hanging.
expect 2 "--memory-report /dev/full: writing failed" $mpirun -np 2 "$trainer" "${small[@]}" \
  "${data[@]}" --batch 1 --steps 2 --memory-report /dev/full
# An absurd OpenMP thread count is capped to the cores instead of crashing.
expect 0 "OMP_NUM_THREADS asks for 100000 threads" env OMP_NUM_THREADS=100000 "$trainer" \
  "${small[@]}" "${data[@]}" --steps 2
expect 2 "--seed '-1' is not an integer from 0 to 2\\^64-1" "$trainer" "${small[@]}" "${data[@]}" --seed -1
expect 2 "--seed '99999999999999999999' is not" "$trainer" "${small[@]}" "${data[@]}" \
  --seed 99999999999999999999
# --help under mpirun: printed once, every rank exits 0.
out=$(timeout 120 $mpirun -np 2 "$trainer" --help 2>&1)
rc=$?
if [[ $rc -eq 0 && $(grep -c "^Usage" <<<"$out") -eq 1 ]]; then passed=$((passed + 1)); else
  echo "FAIL: --help under mpirun (exit $rc)"; failures=$((failures + 1)); fi
# Multi-rank: refused strategies and settings that differ between ranks, on every rank.
expect 2 "--ddp none needs a single rank" $mpirun -np 2 "$trainer" "${small[@]}" "${data[@]}" --ddp none
expect 2 "settings differ from rank 0's: first difference --lr" \
  $mpirun -np 1 "$trainer" "${small[@]}" "${data[@]}" --lr 1e-3 : -np 1 "$trainer" "${small[@]}" "${data[@]}" --lr 2e-3
# Ranks that read different token files under one name (here: each its own working directory, as
# on nodes without a shared file system) are refused on every rank.
mkdir -p "$tmp/wdA" "$tmp/wdB"
cp "$tmp/raw.bin" "$tmp/wdA/tok.bin"
head -c 1000 "$tmp/raw.bin" > "$tmp/wdB/tok.bin"
abs_trainer=$(realpath "$trainer")
out=$(timeout 120 $mpirun -np 1 --wdir "$tmp/wdA" "$abs_trainer" "${small[@]}" --data tok.bin : \
  -np 1 --wdir "$tmp/wdB" "$abs_trainer" "${small[@]}" --data tok.bin 2>&1)
rc=$?
if [[ $rc -eq 2 && $(grep -c "tok.bin' holds .* but 500 on another rank" <<<"$out") -eq 2 ]]; then
  passed=$((passed + 1)); else
  echo "FAIL: ranks with different token files (exit $rc)"; echo "$out" | tail -3 | sed 's/^/    /'
  failures=$((failures + 1)); fi
# A bad file seen by every rank: each rank prints the error.
out=$(timeout 120 $mpirun -np 2 "$trainer" "${small[@]}" --data "$tmp/missing.npy" 2>&1)
if [[ $(grep -c "missing.npy" <<<"$out") -ge 2 ]]; then passed=$((passed + 1)); else
  echo "FAIL: the missing-file error was not printed by both ranks"; failures=$((failures + 1)); fi
# A rank that dies mid-run: every rank stops, non-zero, well within the timeout.
expect nonzero "exits abruptly" $mpirun -np 2 "$trainer" "${small[@]}" "${data[@]}" --steps 1000 \
  --debug-die-at-step 3 --debug-die-rank 1
# A rank that stops answering (alive, but never reaches the next collective): the others' MPI
# wait stops every rank after --comm-timeout, naming the call, instead of hanging.
start=$SECONDS
expect nonzero "rank 0/3: MPI_[A-Za-z]+ has waited [0-9]+ s for the other ranks \(--comm-timeout 3\)" \
  $mpirun -np 3 "$trainer" "${small[@]}" "${data[@]}" --steps 1000 --comm-timeout 3 \
  --debug-stall-at-step 4 --debug-stall-rank 2
if ((SECONDS - start > 30)); then
  echo "FAIL: the stalled run took $((SECONDS - start)) s to stop (--comm-timeout 3)"
  failures=$((failures + 1)); fi
# And a healthy 2-rank run for contrast, with a trace that holds both ranks' phases.
expect 0 "step +2/2" $mpirun -np 2 "$trainer" "${small[@]}" "${data[@]}" --steps 2 --log-every 1 \
  --trace "$tmp/trace.json"
if python3 -c "
import json, sys
ev = json.load(open(sys.argv[1]))['traceEvents']
ranks = {e['pid'] for e in ev if e['ph'] == 'X' and e['name'] == 'backward'}
sys.exit(0 if ranks == {0, 1} else 1)" "$tmp/trace.json"; then passed=$((passed + 1)); else
  echo "FAIL: --trace did not record both ranks' phases"; failures=$((failures + 1)); fi

echo "$passed passed, $failures failed"
[[ $failures -eq 0 ]]
