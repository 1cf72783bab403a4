#!/usr/bin/env bash
# Takes down what launch/cluster/up.sh brought up: every process inside the hosts' namespaces
# (slurmd, and any job still running there), slurmctld and munged by their PIDs, the namespaces,
# the bridge, /etc/netns/<host>/ and the state directory. Safe to run when nothing is up.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
[[ $(id -u) -eq 0 ]] || die 77 "needs root"

# kill_and_wait SIGNAL PID...: sends SIGNAL and waits up to 10 s for each to exit.
kill_and_wait() {
  local sig=$1 pid
  shift
  for pid in "$@"; do kill "-$sig" "$pid" 2>/dev/null; done
  for pid in "$@"; do
    for _ in $(seq 50); do pid_alive "$pid" || break; sleep 0.2; done
  done
}

# 1. The hosts: slurmd first (TERM, so it leaves cleanly), then whatever still runs there (jobs).
pids=()
for f in "$CLUSTER_DIR"/slurmd.*.launched; do
  [[ -e $f ]] && pids+=("$(cat "$f")")
done
((${#pids[@]})) && kill_and_wait TERM "${pids[@]}"
for ns in $(cluster_namespaces); do
  left=$(ip netns pids "$ns" 2>/dev/null | xargs)
  [[ -n $left ]] && kill_and_wait KILL $left
done
# 2. The controller and munge, by the PIDs they were started with.
pid=$(pid_in "$CLUSTER_DIR/slurmctld.launched")
pid_alive "$pid" && kill_and_wait TERM "$pid" && pid_alive "$pid" && kill_and_wait KILL "$pid"
pid=$(pid_in "$CLUSTER_DIR/munge/munged.pid")
pid_alive "$pid" && kill_and_wait TERM "$pid"
# 3. The network and the files.
for ns in $(cluster_namespaces); do
  ip netns delete "$ns"
  rm -rf "/etc/netns/$ns"
done
rmdir /etc/netns 2>/dev/null
ip link show "$CLUSTER_BRIDGE" &>/dev/null && ip link delete "$CLUSTER_BRIDGE"
rm -rf "$CLUSTER_DIR"

left=()
[[ -n $(cluster_namespaces) ]] && left+=("namespaces: $(cluster_namespaces | xargs)")
ip link show "$CLUSTER_BRIDGE" &>/dev/null && left+=("bridge $CLUSTER_BRIDGE")
[[ -e $CLUSTER_DIR ]] && left+=("$CLUSTER_DIR")
if ((${#left[@]})); then
  echo "cluster: could not remove ${left[*]}" >&2
  exit 1
fi
echo "cluster: down (no namespace, bridge, daemon or state left)"
