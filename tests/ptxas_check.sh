#!/usr/bin/env bash
# The Hopper attention kernels keep their warpgroup MMAs asynchronous: compiles every .cu file of
# model/cuda/flash for sm_90a with ptxas's report (-v) and fails on any "Potential Performance
# Loss" (C75xx: ptxas serialised the wgmma.mma_async instructions of a kernel, e.g. because
# accumulator registers of an MMA in flight are touched, which cost a pipelined backward 7-13%; see
# docs/results/log.md) and on any failed compilation. Needs no GPU.
#   tests/ptxas_check.sh NVCC SOURCE_DIR
set -uo pipefail
nvcc=${1:?usage: ptxas_check.sh NVCC SOURCE_DIR}
src=${2:?usage: ptxas_check.sh NVCC SOURCE_DIR}
failures=0
for f in "$src"/model/cuda/flash/*.cu; do
  out=$("$nvcc" -O3 -DNDEBUG -std=c++20 --expt-relaxed-constexpr --diag-suppress=20208 \
    --generate-code=arch=compute_90a,code=sm_90a -DTRAINER_SM90A=1 -DTRAINER_WITH_CUDA=1 \
    -DFMT_HEADER_ONLY=1 -DFMT_USE_CONSTEXPR=1 -DSPDLOG_FMT_EXTERNAL -I"$src" -Xptxas -v \
    -c "$f" -o /dev/null 2>&1)
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: $f did not compile (exit $rc)"
    echo "$out" | grep -v "^ptxas info" | tail -20
    failures=$((failures + 1))
  elif grep -q "Potential Performance Loss" <<<"$out"; then
    echo "FAIL: ptxas serialises warpgroup MMAs in $f:"
    grep -E "C75[0-9]{2}" <<<"$out" | sed -E 's/ in (the )?function .*//' | sort | uniq -c
    failures=$((failures + 1))
  else
    kernels=$(grep -c "Compiling entry function" <<<"$out")
    echo "ok: $f ($kernels kernels, no serialised wgmma)"
  fi
done
[[ $failures -eq 0 ]]
