#!/bin/bash
# a1 (session 30, one H200): the fp32 Z store by bulk copies (FLCE_Z_BULK) and JSD's log-ratios from
# δ = lq − lp. Build; the GPU tests that run the plain logits pass's Z store and the distillation row
# kernels; p1.py (kernel times per step: fkl, rkl, jsd); distill_compare for reverse KL and JSD(0.5)
# against the cuBLAS floor and torch.compile.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); cd $REPO
mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 ))s"
export FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=$PWD/build/test-cache FLCE_LIBRARY=$PWD/build/libflce.so
for t in test_distill_gpu test_topk_gpu test_gpu test_saved; do
  t1=$(date +%s)
  (cd build && timeout 200 ctest -R "^$t\$" --output-on-failure) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc $(( $(date +%s) - t1 ))s"; grep -E "FAIL|check failed|tests passed" $OUT/$t.log | head -8
done
t1=$(date +%s)
timeout 150 python3 .whl/p1.py > $OUT/p1.log 2>&1; echo "p1 rc=$? $(( $(date +%s) - t1 ))s"; grep -v Warn $OUT/p1.log | grep -v _warn
P=cublas-floor,flce,torch-compile
for dv in reverse_kl jsd; do
  t1=$(date +%s)
  timeout 150 python3 bench/distill_compare.py --shapes 8192x4096x128256 --divergence $dv --beta 0.5 --providers $P --tag $dv --out $OUT > $OUT/cmp_$dv.log 2>&1; echo "$dv rc=$? $(( $(date +%s) - t1 ))s"
  grep "^|" $OUT/cmp_$dv.log | tail -4
done
cd $OUT && tar czf logs.tgz *.log *.txt 2>/dev/null; ls
