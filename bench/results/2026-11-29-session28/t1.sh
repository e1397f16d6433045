#!/bin/bash
# t1: build, then the distillation GPU tests (TP on one GPU through the fake NCCL; the dense and top-k
# ones for regressions), logs into $OUT
set -u
cd "$(dirname "$0")/.."
mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 ))s"
export FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=$PWD/build/test-cache
for t in ${TESTS:-test_distill_tp test_distill_gpu test_topk_gpu}; do
  t1=$(date +%s)
  timeout 400 build/tests/$t > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc $(( $(date +%s) - t1 ))s"; grep -E "FAIL|check failed|passed|failed" $OUT/$t.log | head -20
done
