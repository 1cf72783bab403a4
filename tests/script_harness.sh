# Shared by the shell tests that check a tool's output line by line: sourced after `set -uo
# pipefail`, it gives a scratch directory $tmp (removed at exit), ok / fail that print one line
# per check and count the failures, and the environment every trainer run there needs (mpirun as
# root, one OpenMP thread, no colours).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 NO_COLOR=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok   $*"; }
