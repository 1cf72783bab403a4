#!/usr/bin/env bash
# The Hopper attention kernels keep their warpgroup MMAs asynchronous: compiles every .cu file of
# model/cuda/flash with the build's own command (from BUILD_DIR/compile_commands.json, so the
# flags are the ones the build uses) plus ptxas's report (-v), and fails on any "Potential
# Performance Loss" (C75xx: ptxas serialised the wgmma.mma_async instructions of a kernel, e.g.
# because accumulator registers of an MMA in flight are touched, which cost a pipelined backward
# 7-13%; see docs/results/log.md), on any failed compilation, and when the build lists no such
# file. Needs no GPU.
#   tests/ptxas_check.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: ptxas_check.sh BUILD_DIR}
db="$build/compile_commands.json"
[[ -f $db ]] || { echo "FAIL: no $db (configure with CMAKE_EXPORT_COMPILE_COMMANDS)"; exit 1; }
# One line per file: directory, file, and the command with its output sent to /dev/null.
mapfile -t jobs < <(python3 - "$db" <<'PY'
import json, shlex, sys
for c in json.load(open(sys.argv[1])):
    if "/model/cuda/flash/" not in c["file"] or not c["file"].endswith(".cu"):
        continue
    args = c["arguments"] if "arguments" in c else shlex.split(c["command"])
    args = [("/dev/null" if i > 0 and args[i - 1] == "-o" else a) for i, a in enumerate(args)]
    print("\t".join([c["directory"], c["file"], shlex.join(args + ["-Xptxas", "-v"])]))
PY
)
[[ ${#jobs[@]} -gt 0 ]] || { echo "FAIL: $db lists no model/cuda/flash/*.cu"; exit 1; }
failures=0
for job in "${jobs[@]}"; do
  IFS=$'\t' read -r dir f cmd <<<"$job"
  out=$(cd "$dir" && eval "$cmd" 2>&1)
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
