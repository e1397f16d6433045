#!/bin/bash
# t3: the merged tree (distillation TP + top-k TP): build, the GPU tests of both on one GPU, python
# top-k on the GPU, then benches at the large shapes for regressions (dense distill, top-k teacher, top-k)
set -u
cd "$(dirname "$0")/.."
mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; python3 -c "import torch; print('torch', torch.__version__)"; } > $OUT/env.txt 2>&1
t0=$(date +%s)
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 ))s"
export FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=$PWD/build/test-cache
for t in test_distill_tp test_topk_gpu test_distill_gpu; do
  t1=$(date +%s)
  timeout 300 build/tests/$t > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc $(( $(date +%s) - t1 ))s"; grep -E "FAIL|check failed|passed|failed" $OUT/$t.log | head -12
done
t1=$(date +%s)
(cd python && FLCE_LIBRARY=$PWD/../build/libflce.so timeout 200 python3 test_topk.py) > $OUT/py_topk.log 2>&1; echo "py test_topk rc=$? $(( $(date +%s) - t1 ))s"; tail -2 $OUT/py_topk.log
export FLCE_LIBRARY=$PWD/build/libflce.so
t1=$(date +%s)
timeout 240 python3 bench/distill_compare.py --shapes 8192x4096x128256 --providers cublas-floor,flce,torch-compile --out $OUT > $OUT/bench_distill.log 2>&1; echo "bench distill rc=$? $(( $(date +%s) - t1 ))s"; tail -8 $OUT/bench_distill.log
t1=$(date +%s)
timeout 200 python3 bench/topk_compare.py --shapes 8192x4096x128256 --out $OUT > $OUT/bench_topk.log 2>&1; echo "bench topk rc=$? $(( $(date +%s) - t1 ))s"; tail -8 $OUT/bench_topk.log
cd $OUT && tar czf benches.tgz *.json *.md 2>/dev/null; rm -f *.json *.md; ls
