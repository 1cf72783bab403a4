#!/usr/bin/env bash
# Installs what the build needs on Debian 12 / Ubuntu 24.04, skipping what is already there.
# The CUDA toolkit is not installed here: the CUDA backend is built when one is found.
set -euo pipefail
pkgs=(build-essential cmake libopenmpi-dev openmpi-bin libspdlog-dev libfmt-dev catch2
      libcli11-dev nlohmann-json3-dev fortunes python3 python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# NumPy and safetensors for the cross-check against an independent NumPy model (the test reports
# "skipped" without them); matplotlib for the plots of benchmark sweeps (the cluster sweep test
# renders one); tokenizers for launch/prepare_text.py (BPE tokenizers and token shards; its test
# is skipped without it). From PyPI, so that all of them agree on one NumPy.
if ! python3 -c "import numpy, safetensors, matplotlib, tokenizers" 2>/dev/null; then
  py=(numpy safetensors matplotlib tokenizers)
  python3 -m pip install --quiet "${py[@]}" 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "${py[@]}" 2>/dev/null ||
    echo "note: could not pip-install ${py[*]}; the NumPy cross-check and prepare_text are" \
      "skipped, plots fail"
fi
