#!/usr/bin/env bash
# Install what is missing, build, and run the whole test suite (CPU, multi-rank under mpirun, the
# multi-node tests on a Slurm cluster of namespace hosts that the suite brings up and takes down;
# GPU tests report "skipped" on machines without a GPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/launch/install_deps.sh"
BUILD_DIR=$build "$root/launch/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$build"
rc=0
ctest --output-on-failure --timeout 1500 "$@" | tee "$build/ctest.log" || rc=$?
# CTest shows no output of a skipped test: print why each was skipped (its last line).
for t in $(grep -oE "Test +#[0-9]+: [^ ]+ \.+ *\*\*\*Skipped" "$build/ctest.log" | awk '{print $3}'); do
  why=$(awk -v t="$t" '$0 == "Test: " t || $0 ~ "/[0-9]+ Test: " t "$" { on = 1; next }
                       on && /^<end of output>/ { print last; exit } on { last = $0 }' \
          "$build/Testing/Temporary/LastTest.log")
  echo "skipped $t: ${why:-no reason given}"
done
exit "$rc"
