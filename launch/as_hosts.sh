#!/usr/bin/env bash
# Runs PROGRAM as H hosts x G ranks per host on this one machine, as far as NCCL can tell: the
# ranks of each "host" get their own NCCL_HOSTID, so NCCL joins ranks of different hosts through
# its network transport (TCP sockets over loopback; no NVLink, P2P or shared memory between
# them) and ranks of one host as usual (NVLink). Ranks are numbered host by host; each still takes
# the GPU of its place among the machine's ranks, so H x G GPUs must be visible.
#
#   launch/as_hosts.sh H G [MPIRUN_OPTION ...] -- PROGRAM [ARGS ...]
#   launch/as_hosts.sh 2 1 -- build/trainer --model xl --batch 4 --ctx 512 --benchmark
#
# NCCL_SOCKET_IFNAME (default lo) picks the interface and NCCL_IB_DISABLE=1 keeps InfiniBand
# out; NCCL_DEBUG=INFO shows "nNodes H" and the "via NET/Socket" channels. The machine's MPI
# still sees one host (its shared memory carries MPI's messages).
set -euo pipefail
usage="usage: as_hosts.sh HOSTS GPUS_PER_HOST [MPIRUN_OPTION ...] -- PROGRAM [ARGS ...]"
hosts=${1:?$usage}
per_host=${2:?$usage}
shift 2
[[ $hosts =~ ^[1-9][0-9]*$ && $per_host =~ ^[1-9][0-9]*$ ]] ||
  { echo "as_hosts.sh: HOSTS and GPUS_PER_HOST must be positive integers; $usage" >&2; exit 2; }
opts=()
while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1"); shift; done
[[ $# -gt 1 ]] || { echo "as_hosts.sh: no PROGRAM after --; $usage" >&2; exit 2; }
shift
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=1
contexts=()
for h in $(seq 0 $((hosts - 1))); do
  ((h > 0)) && contexts+=(:)
  contexts+=(-np "$per_host" -x "NCCL_HOSTID=host$h" "$@")
done
exec mpirun --bind-to none -x NCCL_SOCKET_IFNAME -x NCCL_IB_DISABLE "${opts[@]}" "${contexts[@]}"
