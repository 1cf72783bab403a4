#!/usr/bin/env bash
# Brings up a real Slurm cluster on this one Linux machine: munged and slurmctld on the machine,
# and N hosts (default 2), each a network namespace with its own hostname (a UTS namespace), its
# own address on a veth pair to a bridge, and its own slurmd. Jobs on different hosts reach each
# other only over TCP through the bridge; the file system is shared, as on a cluster with NFS.
#
#   launch/cluster/up.sh [N]          # then: source /run/trainer-cluster/env.sh; sbatch ...
#   launch/cluster/down.sh            # everything gone again
#
# Needs root and network namespaces; installs slurm-wlm and munge when they are missing
# (apt-get). Where it cannot run it says why in one line and exits 77 (tests report "skipped").
# Idempotent: a cluster already up with N healthy hosts is left as it is; a partial one is torn
# down first. Settings (environment): CLUSTER_DIR (state, default /run/trainer-cluster),
# CLUSTER_NET (the first three octets of the bridge's /24, default 10.77.0), CLUSTER_CPUS (CPUs
# each host offers Slurm, default 4), CLUSTER_KILL_WAIT (s, default 30), CLUSTER_SLURMD_TIMEOUT
# (s, default 30), CLUSTER_CRED_EXPIRE (s, default 30: also the wait before a requeued job
# starts again), CLUSTER_PORT (slurmctld's port, slurmd's is one more; default 16817).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
nodes=${1:-${CLUSTER_NODES:-2}}
[[ $nodes =~ ^[1-9][0-9]?$ && $nodes -le 50 ]] || die 2 "the number of hosts must be 1 to 50 (got '$nodes')"

# --- can it run here? ---
[[ $(id -u) -eq 0 ]] || die 77 "needs root (network namespaces, slurmd); run it as root or with sudo"
need_cmds=(ip unshare setsid slurmctld slurmd munged mungekey sbatch squeue sinfo scontrol)
missing_cmds() { for c in "${need_cmds[@]}"; do command -v "$c" >/dev/null || echo "$c"; done; }
if [[ -n $(missing_cmds) ]]; then
  [[ ${CLUSTER_NO_INSTALL:-0} == 1 ]] &&
    die 77 "missing $(missing_cmds | xargs) (CLUSTER_NO_INSTALL=1: not installing)"
  command -v apt-get >/dev/null || die 77 "missing $(missing_cmds | xargs) and no apt-get to install them"
  echo "cluster: installing slurm-wlm, munge, iproute2, util-linux"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends slurm-wlm munge iproute2 util-linux >/dev/null; } 2>&1 | tail -3 ||
    true
  [[ -z $(missing_cmds) ]] || die 77 "could not install $(missing_cmds | xargs)"
fi
probe=${CLUSTER_PREFIX}probe$$
if ! err=$(ip netns add "$probe" 2>&1); then
  die 77 "cannot create network namespaces here ($err)"
fi
if ! err=$(ip netns exec "$probe" unshare --uts true 2>&1); then
  ip netns delete "$probe" 2>/dev/null
  die 77 "cannot create UTS namespaces here ($err)"
fi
ip netns delete "$probe"

# --- already up? ---
if cluster_healthy "$nodes"; then
  echo "cluster: already up with $nodes host(s); source $CLUSTER_DIR/env.sh"
  exit 0
fi
if [[ -e $CLUSTER_DIR ]] || [[ -n $(cluster_namespaces) ]] || ip link show "$CLUSTER_BRIDGE" &>/dev/null; then
  echo "cluster: tearing down what an earlier cluster left"
  "$here/down.sh" >/dev/null
fi
# The bridge's subnet must be free on this machine.
if [[ -n $(ip -4 addr show | grep -F " ${CLUSTER_NET}.") || -n $(ip -4 route show "${CLUSTER_NET}.0/24") ]]; then
  die 2 "${CLUSTER_NET}.0/24 is already in use on this machine; pick another with CLUSTER_NET=a.b.c"
fi

trap 'echo "cluster: bring-up failed; tearing down" >&2; "$here/down.sh" >&2' ERR
mkdir -p "$CLUSTER_DIR"/{etc,munge,log,slurmctld,spool}
chmod 700 "$CLUSTER_DIR/munge"
echo "$nodes" > "$CLUSTER_DIR/nodes"

# --- munge: one key, one socket for every daemon on the machine (namespaces share the file
# system, and a Unix socket is reached by its path whatever the network namespace) ---
mungekey --create --keyfile="$CLUSTER_DIR/munge/munge.key" --force >/dev/null
munged --force --socket="$CLUSTER_DIR/munge/munge.socket" --key-file="$CLUSTER_DIR/munge/munge.key" \
  --pid-file="$CLUSTER_DIR/munge/munged.pid" --log-file="$CLUSTER_DIR/log/munged.log" \
  --seed-file="$CLUSTER_DIR/munge/munged.seed"
wait_for 10 "munged's pid file" test -s "$CLUSTER_DIR/munge/munged.pid"

# --- the network: a bridge on the machine, one namespace per host on a veth pair ---
ip link add "$CLUSTER_BRIDGE" type bridge
ip addr add "$(ctld_addr)/24" dev "$CLUSTER_BRIDGE"
ip link set "$CLUSTER_BRIDGE" up
hosts="127.0.0.1 localhost
$(ctld_addr) $(hostname)"
for i in $(seq "$nodes"); do hosts+=$'\n'"$(node_addr "$i") $(node_name "$i")"; done
node_lines=""
for i in $(seq "$nodes"); do
  ns=$(node_ns "$i")
  ip netns add "$ns"
  ip link add "${CLUSTER_PREFIX}v$i" type veth peer name eth0 netns "$ns"
  ip link set "${CLUSTER_PREFIX}v$i" master "$CLUSTER_BRIDGE" up
  ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # `ip netns exec` mounts /etc/netns/NS/hosts over /etc/hosts: each host resolves the others.
  mkdir -p "/etc/netns/$ns"
  echo "$hosts" > "/etc/netns/$ns/hosts"
  echo "$(node_name "$i")" > "/etc/netns/$ns/hostname"
  node_lines+="NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=${CLUSTER_CPUS:-4} State=UNKNOWN"$'\n'
done

# --- Slurm: the configuration from the template, slurmctld on the machine, a slurmd per host ---
conf=$CLUSTER_DIR/etc/slurm.conf
sed -e "s|@CTLD_HOST@|$(hostname)|" -e "s|@CTLD_ADDR@|$(ctld_addr)|" \
  -e "s|@CTLD_PORT@|$CLUSTER_PORT|" -e "s|@SLURMD_PORT@|$((CLUSTER_PORT + 1))|" \
  -e "s|@STATE@|$CLUSTER_DIR|g" -e "s|@KILL_WAIT@|${CLUSTER_KILL_WAIT:-30}|" \
  -e "s|@SLURMD_TIMEOUT@|${CLUSTER_SLURMD_TIMEOUT:-30}|" \
  -e "s|@CRED_EXPIRE@|${CLUSTER_CRED_EXPIRE:-30}|" "$here/slurm.conf.in" |
  awk -v nodes="$node_lines" '$0 == "@NODE_LINES@" { printf "%s", nodes; next } { print }' > "$conf"
cp "$here/cgroup.conf" "$CLUSTER_DIR/etc/cgroup.conf"
setsid env -i PATH="$PATH" slurmctld -D -c -f "$conf" > "$CLUSTER_DIR/log/slurmctld.out" 2>&1 < /dev/null &
echo $! > "$CLUSTER_DIR/slurmctld.launched"
for i in $(seq "$nodes"); do start_slurmd "$i"; done
export SLURM_CONF=$conf
if ! wait_for 60 "every host idle in sinfo" cluster_healthy "$nodes" starting; then
  echo "cluster: logs:" >&2
  tail -n 5 "$CLUSTER_DIR"/log/* >&2 || true
  false
fi
trap - ERR
cat > "$CLUSTER_DIR/env.sh" <<EOF
# The test cluster's client settings (launch/cluster/up.sh): Slurm's configuration, and Open MPI
# told which network joins the hosts (the bridge; not the machine's other interfaces).
export SLURM_CONF=$conf
export OMPI_MCA_btl_tcp_if_include=${CLUSTER_NET}.0/24 OMPI_MCA_oob_tcp_if_include=${CLUSTER_NET}.0/24
EOF
echo "cluster: up with $nodes host(s) ($(for i in $(seq "$nodes"); do
  printf '%s %s, ' "$(node_name "$i")" "$(node_addr "$i")"; done)controller $(hostname) $(ctld_addr));" \
  "source $CLUSTER_DIR/env.sh"
