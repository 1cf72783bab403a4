#!/usr/bin/env bash
# The main job: install what is missing, build, tokenize a text corpus (the `fortunes` package,
# byte-level, vocab 256) and train the tiny model on it -- on the GPU when there is one, else on
# the CPU backend. The loss falls from about 5.9 to about 2. A second run replaces runs/demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/launch/install_deps.sh"
BUILD_DIR=$build "$root/launch/build.sh"
"$root/launch/prepare_data.sh" "$build" "$root/data"
out=${OUT_DIR:-$root/runs/demo}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "$build/trainer" --model tiny --vocab 256 --ctx 128 --batch 8 --steps 300 --lr 2e-3 \
  --warmup 20 --data "$root/data/fortunes_train.npy" --val-data "$root/data/fortunes_val.npy" \
  --eval-every 100 --log-every 20 --out "$out" --overwrite "$@"
