#!/usr/bin/env bash
# On a machine with 2 or more GPUs: ranks as separate hosts for NCCL (launch/as_hosts.sh), so
# their gradients cross NCCL's network transport (TCP sockets over loopback) instead of NVLink.
#   launch/gpu_multihost.sh BUILD_DIR OUT_DIR [HOSTS] [GPUS_PER_HOST]
#  1. NCCL's own log (NCCL_DEBUG=INFO) of a short run: HOSTS nodes, channels between the hosts
#     via NET/Socket.
#  2. The GPU equivalence and resume tests (test_distributed_gpu) with the ranks as those hosts.
# Logs go to OUT_DIR; prints one line per check and "N passed, N failed".
set -uo pipefail
usage="usage: gpu_multihost.sh BUILD_DIR OUT_DIR [HOSTS] [GPUS_PER_HOST]"
build=${1:?$usage}
out=${2:?$usage}
hosts=${3:-2}
per_host=${4:-1}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
source "$here/gpu_env.sh"
gpu_preflight "$build"
passed=0 failed=0
verdict() {  # verdict OK LINE
  if [[ $1 == 1 ]]; then passed=$((passed + 1)); echo "ok   $2"; else failed=$((failed + 1)); echo "FAIL $2"; fi
}
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 256, 200000).astype('<u2'))"

log=$out/nccl_info_${hosts}x${per_host}.log
NCCL_DEBUG=INFO timeout 120 "$here/as_hosts.sh" "$hosts" "$per_host" -- "$build/trainer" \
  --device cuda --d-model 64 --d-ff 128 --layers 2 --heads 2 --vocab 256 --ctx 64 --batch 4 \
  --steps 3 --log-every 1 --data /tmp/tok.npy > "$log" 2>&1
rc=$?
nodes=$(grep -oE "nNodes [0-9]+" "$log" | sort -u | xargs)
socket=$(grep -c "via NET/Socket" "$log")
other=$(grep -E "via (P2P|SHM)" "$log" | grep -c -- "->")
ok=0
[[ $rc -eq 0 && $nodes == "nNodes $hosts" && $socket -gt 0 ]] && ok=1
# With one GPU per host every channel crosses hosts: none may use NVLink (P2P) or shared memory.
[[ $per_host -eq 1 && $other -gt 0 ]] && ok=0
verdict $ok "NCCL: exit $rc, '$nodes', $socket channel line(s) via NET/Socket, $other via P2P/SHM"
grep -E "placement" "$log" | sed 's/^\[[^]]*\] //'

t0=$SECONDS
timeout 600 "$here/as_hosts.sh" "$hosts" "$per_host" --oversubscribe -- \
  "$build/tests/test_distributed_gpu" > "$out/test_distributed_gpu_${hosts}x${per_host}.log" 2>&1
rc=$?
ok=0
[[ $rc -eq 0 ]] && ok=1
verdict $ok "test_distributed_gpu as $hosts hosts x $per_host GPU(s): exit $rc, $((SECONDS - t0)) s," \
  "$(grep -E 'test cases' "$out/test_distributed_gpu_${hosts}x${per_host}.log" | tail -1)"
echo "$passed passed, $failed failed"
