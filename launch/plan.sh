# Plan files of benchmark runs (sourced by launch/bench_ddp.sh and launch/slurm/sweep.sbatch).
# One run per line: "NP [VAR=value ...] [trainer flags ...]", where NP is a number of ranks or
# "N" for all of them and VAR=value sets an environment variable for that run only (e.g.
# NCCL_MAX_CTAS=8), except HOSTS=H: the ranks run as H hosts of NP/H GPUs on one machine
# (launch/as_hosts.sh; GPU benchmarks only). '#' starts a comment. Example: launch/plans/ddp.txt.

# plan_runs FILE: the plan's runs, one line each (comments and blank lines dropped).
plan_runs() { sed -e 's/#.*//' "$1" | awk 'NF'; }

# parse_run LINE ALL: sets np (N becomes ALL), hosts (1 unless HOSTS=H), envs (mpirun's
# "-x VAR=value" pairs) and args (the trainer flags) from one line of a plan.
parse_run() {
  local w words
  read -ra words <<<"$1"
  np=${words[0]}
  [[ $np == N ]] && np=$2
  hosts=1 envs=() args=()
  for w in "${words[@]:1}"; do
    if [[ $w =~ ^HOSTS=([1-9][0-9]*)$ ]]; then
      hosts=${BASH_REMATCH[1]}
    elif [[ $w =~ ^[A-Z_][A-Z0-9_]*= ]]; then
      envs+=(-x "$w")
    else
      args+=("$w")
    fi
  done
}
