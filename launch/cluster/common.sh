# Names and helpers shared by up.sh, down.sh and the cluster tests (sourced, not run).
CLUSTER_DIR=${CLUSTER_DIR:-/run/trainer-cluster}
CLUSTER_NET=${CLUSTER_NET:-10.77.0}
CLUSTER_PORT=${CLUSTER_PORT:-16817}
CLUSTER_PREFIX=trc-                   # namespaces trc-node1..., veths trc-v1..., bridge trc-br0
CLUSTER_BRIDGE=${CLUSTER_PREFIX}br0

node_name() { echo "node$1"; }
node_ns() { echo "${CLUSTER_PREFIX}node$1"; }
node_addr() { echo "$CLUSTER_NET.$((10 + $1))"; }
ctld_addr() { echo "$CLUSTER_NET.1"; }

# die CODE MESSAGE: one line on stderr, then exit CODE (77: cannot run here, tests skip).
die() {
  echo "cluster: $2" >&2
  exit "$1"
}

# wait_for SECONDS WHAT CMD...: runs CMD every 0.2 s until it succeeds; false after SECONDS.
wait_for() {
  local limit=$1 what=$2
  shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then
      echo "cluster: timed out after ${limit} s waiting for $what" >&2
      return 1
    fi
    sleep 0.2
  done
}

# The network namespaces a cluster made (ours only: the trc- prefix).
cluster_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^${CLUSTER_PREFIX}" || true; }

pid_alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }
pid_in() { [[ -s $1 ]] && cat "$1"; }

# cluster_healthy N: munged, slurmctld and N slurmds run, and Slurm sees every host up.
cluster_healthy() {
  local n=$1 i states
  [[ -s $CLUSTER_DIR/nodes && $(cat "$CLUSTER_DIR/nodes") == "$n" && -s $CLUSTER_DIR/env.sh ]] ||
    [[ ${2:-} == starting ]] || return 1
  pid_alive "$(pid_in "$CLUSTER_DIR/munge/munged.pid")" || return 1
  pid_alive "$(pid_in "$CLUSTER_DIR/slurmctld.launched")" || return 1
  for i in $(seq "$n"); do
    pid_alive "$(pid_in "$CLUSTER_DIR/slurmd.$(node_name "$i").launched")" || return 1
  done
  states=$(SLURM_CONF=$CLUSTER_DIR/etc/slurm.conf timeout 10 sinfo -h -N -o "%N %T" 2>/dev/null) ||
    return 1
  for i in $(seq "$n"); do
    grep -qE "^$(node_name "$i") (idle|mixed|allocated|completing)$" <<<"$states" || return 1
  done
}

# start_slurmd I: host I's slurmd, inside its network namespace, with the host's own hostname
# (Slurm, Open MPI and the trainer see one host per namespace), in a mount namespace of its own
# that ends with its last process. There, Slurm's node-local scratch (TmpFS, where PMIx puts its
# per-step directories, named alike on every host) is a directory of this host's own, as on a
# cluster; /tmp stays the machine's, so a checkout under /tmp is on the "shared file system" too.
# Its PID goes to $CLUSTER_DIR/slurmd.NAME.launched.
start_slurmd() {
  local name
  name=$(node_name "$1")
  mkdir -p "$CLUSTER_DIR/spool/$name" "$CLUSTER_DIR/tmp/$name" "$CLUSTER_DIR/node-tmp"
  chmod 1777 "$CLUSTER_DIR/tmp/$name"
  setsid ip netns exec "$(node_ns "$1")" unshare --uts --mount -- env -i PATH="$PATH" sh -c \
    "hostname $name && mount --bind $CLUSTER_DIR/tmp/$name $CLUSTER_DIR/node-tmp &&
     exec slurmd -D -N $name -f $CLUSTER_DIR/etc/slurm.conf" \
    > "$CLUSTER_DIR/log/slurmd.$name.out" 2>&1 < /dev/null &
  echo $! > "$CLUSTER_DIR/slurmd.$name.launched"
}
