#!/usr/bin/env bash
# Builds the byte-level "fortunes" corpus: the plain-text files of the Debian/Ubuntu package
# `fortunes` (not the .dat indexes, not the .u8 links), tokenized with vocab 256.
#
#   launch/prepare_data.sh [BUILD_DIR] [DATA_DIR]      (defaults: ./build ./data)
#
# Writes DATA_DIR/fortunes_train.npy and DATA_DIR/fortunes_val.npy (5% validation, taken from the
# end). Train on them with --vocab 256.
set -euo pipefail

BUILD_DIR="${1:-./build}"
DATA_DIR="${2:-./data}"
CORPUS_DIR="${FORTUNES_DIR:-/usr/share/games/fortunes}"
TOKENIZE="${BUILD_DIR}/launch/tokenize"

die() {
  echo "prepare_data.sh: error: $*" >&2
  exit 2
}

[[ -x "${TOKENIZE}" ]] ||
  die "${TOKENIZE} not found; build it first: cmake --build ${BUILD_DIR} --target tokenize"
[[ -d "${CORPUS_DIR}" ]] ||
  die "no corpus at ${CORPUS_DIR}; install it with: apt-get install -y fortunes"

# Regular files only (the .u8 names are symlinks to the same text), sorted for a stable order.
mapfile -t FILES < <(find "${CORPUS_DIR}" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' \
  -print | LC_ALL=C sort)
((${#FILES[@]} > 0)) ||
  die "no fortune text files under ${CORPUS_DIR}; install them with: apt-get install -y fortunes"

mkdir -p "${DATA_DIR}"
echo "prepare_data.sh: ${#FILES[@]} files from ${CORPUS_DIR} -> ${DATA_DIR}"
"${TOKENIZE}" --out-train "${DATA_DIR}/fortunes_train.npy" \
  --out-val "${DATA_DIR}/fortunes_val.npy" --val-fraction 0.05 "${FILES[@]}"
