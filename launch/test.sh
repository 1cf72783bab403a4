#!/usr/bin/env bash
# Install what is missing, build, and run the whole test suite (CPU, multi-rank under mpirun;
# GPU tests report "skipped" on machines without a GPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/launch/install_deps.sh"
BUILD_DIR=$build "$root/launch/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$build"
ctest --output-on-failure --timeout 1500 "$@"
