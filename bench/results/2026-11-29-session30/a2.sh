#!/bin/bash
# a2 (session 30, one H200): bank-conflict-free staging stores in bulk_rows_out (Z and dW's bulk
# reductions). Build; test_gpu and test_saved (dW by bulk reductions, the Z store); p1.py timings.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); cd $REPO
mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=$PWD/build/test-cache FLCE_LIBRARY=$PWD/build/libflce.so
t1=$(date +%s)
timeout 150 python3 .whl/p1.py > $OUT/p1.log 2>&1; echo "p1 rc=$? $(( $(date +%s) - t1 ))s"; grep -v Warn $OUT/p1.log | grep -v _warn
for t in test_gpu test_saved; do
  t1=$(date +%s)
  (cd build && timeout 200 ctest -R "^$t\$" --output-on-failure) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc $(( $(date +%s) - t1 ))s"; grep -E "FAIL|check failed|tests passed" $OUT/$t.log | head -8
done
