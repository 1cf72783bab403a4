#!/usr/bin/env bash
# comm_bench on host buffers (MPI) with 2, 3 and 4 ranks: every collective's checked run gives the
# exact sums or copies, and the CSV holds one complete, consistent row per op x dtype x size. Not
# timings: those are measured on the machines docs/scaling.md names.
# Usage: comm_bench_test.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: comm_bench_test.sh BUILD_DIR}
bench=$build/comm_bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

sizes=4K,100K,1M  # 100K: not a multiple of 3 or 4 ranks' segments, rounded up
for np in 2 3 4; do
  csv=$tmp/np$np.csv
  out=$(timeout 120 mpirun --oversubscribe -np "$np" "$bench" --device cpu --sizes "$sizes" \
    --warmup 1 --iters 3 --csv "$csv" 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] || { fail "np $np: exit $rc"; echo "$out" | tail -5; continue; }
  # 4 ops x 2 dtypes x 3 sizes, after the header; every row complete and self-consistent.
  rows=$(($(wc -l < "$csv") - 1))
  [[ $rows -eq 24 ]] || fail "np $np: $rows rows in the CSV, wanted 24"
  bad=$(awk -F, -v np="$np" '
    NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; cols = NF; next }
    {
      op = $c["op"]; n = $c["world"]
      f = op == "all_reduce" ? 2 * (n - 1) / n : op == "broadcast" ? 1 : (n - 1) / n
      esize = $c["dtype"] == "fp32" ? 4 : 2
      if (NF != cols) { print "row " NR ": " NF " fields"; next }
      if (n != np || $c["hosts"] != 1 || $c["backend"] != "mpi") { print "row " NR ": world/hosts/backend"; next }
      if ($c["count"] % n != 0 || $c["bytes"] != $c["count"] * esize) { print "row " NR ": count/bytes"; next }
      if (!($c["min_us"] > 0 && $c["min_us"] <= $c["median_us"] && $c["median_us"] <= $c["max_us"])) { print "row " NR ": times"; next }
      alg = $c["bytes"] / ($c["median_us"] * 1e-6) / 1e9
      if (alg / $c["algbw_gbps"] < 0.99 || alg / $c["algbw_gbps"] > 1.01) { print "row " NR ": algbw"; next }
      if ($c["busbw_gbps"] / ($c["algbw_gbps"] * f) < 0.99 || $c["busbw_gbps"] / ($c["algbw_gbps"] * f) > 1.01) print "row " NR ": busbw"
      seen[op "," $c["dtype"] "," $c["bytes"]]++
    }
    END { for (k in seen) if (seen[k] != 1) print "duplicate " k }' "$csv")
  [[ -z $bad ]] || fail "np $np: $bad"
  [[ $bad == "" && $rows -eq 24 ]] && echo "ok   np $np: 24 checked collectives, CSV complete"
done

# The check can fail: a wrong element on one rank stops every rank with exit 1, naming it.
out=$(timeout 60 mpirun --oversubscribe -np 3 "$bench" --device cpu --sizes 64K --iters 1 \
  --ops reduce_scatter --dtypes fp32 --debug-corrupt-rank 1 2>&1)
rc=$?
n=$(grep -c "rank 1: reduce_scatter of .* expected" <<<"$out")
[[ $rc -eq 1 && $n -eq 3 ]] && echo "ok   a wrong sum on rank 1: exit 1 on every rank" ||
  fail "a wrong sum: exit $rc, $n of 3 ranks named it"
# Wrong input: one line on every rank, exit 2.
for bad_args in "--ops all_reduce,bogus" "--sizes 12Q" "--iters 0" "--dtypes fp16"; do
  out=$(timeout 60 mpirun --oversubscribe -np 2 "$bench" --device cpu $bad_args 2>&1)
  rc=$?
  n=$(grep -c "error" <<<"$out")
  [[ $rc -eq 2 && $n -ge 2 ]] && echo "ok   $bad_args: exit 2 on every rank" ||
    fail "$bad_args: exit $rc, $n error lines"
done
echo "x,y" > "$tmp/other.csv"
out=$(timeout 60 mpirun --oversubscribe -np 2 "$bench" --device cpu --csv "$tmp/other.csv" 2>&1)
[[ $? -eq 2 ]] && grep -q "other columns" <<<"$out" && echo "ok   a CSV of other columns refused" ||
  fail "a CSV of other columns: $(tail -2 <<<"$out")"
exit $((failures > 0))
