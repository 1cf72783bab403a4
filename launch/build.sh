#!/usr/bin/env bash
# Configures and builds into BUILD_DIR (default ./build). Extra arguments go to cmake.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
grep "trainer: CUDA backend" "$build/configure.log" || true
cmake --build "$build" -j "$(nproc)"
