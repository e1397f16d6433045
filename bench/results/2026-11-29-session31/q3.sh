#!/bin/bash
# q3 (session 31, one H200): flce_distill_row_cl (one read of each reverse KL / JSD row in a cluster's
# shared memory) against flce_distill_row's two reads, all with the LSU row stores (FLCE_ROWS_LSU 3):
#   A: row_cl off (ROW_CL_MAX 0)   B: row_cl, 72 KB slabs (16 CTAs a row at V=128256)   C: 200 KB slabs, 8 a row
# Then tree B's GPU tests of the distillation, the Z store and dW's reductions.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); cd $REPO
mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
mk() { # name ROW_CL_MAX ROW_CL_SLAB
  rm -rf /tmp/$1; mkdir -p /tmp/$1
  tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/$1
  cp .whl/q1.py /tmp/$1/
  sed -i "s/^#define FLCE_ROWS_LSU 0 /#define FLCE_ROWS_LSU 3 /" /tmp/$1/templates/gemm_wgmma_tma.cu
  sed -i "s/ROW_CL_SLAB = 72 \* 1024, ROW_CL_SLAB_MAX = 200 \* 1024, ROW_CL_MAX = 16/ROW_CL_SLAB = $3, ROW_CL_SLAB_MAX = 200 * 1024, ROW_CL_MAX = $2/" /tmp/$1/runtime/distill.c
  grep -n "^#define FLCE_ROWS_LSU\|ROW_CL_MAX = " /tmp/$1/templates/gemm_wgmma_tma.cu /tmp/$1/runtime/distill.c | sed "s/^/$1 /"
}
mk tA 0 73728; mk tB 16 73728; mk tC 16 131072
for T in tA tB tC; do
  (cd /tmp/$T && cmake --preset default > /tmp/b$T.log 2>&1 && cmake --build --preset default --target flce -j5 >> /tmp/b$T.log 2>&1; echo "build $T rc=$?"; tail -3 /tmp/b$T.log | grep -i error) &
done
wait
echo "built $(( $(date +%s) - t0 ))s"
for T in tA tB tC; do
  (cd /tmp/$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 200 python3 q1.py $T warm reverse_kl,jsd > /tmp/w$T.log 2>&1; echo "warm $T rc=$?"; grep -v -i warn /tmp/w$T.log | tail -3) &
done
wait
echo "warmed $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for T in tA tB tC; do
    (cd /tmp/$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 100 python3 q1.py $T x reverse_kl,jsd 2>&1 | grep -v -i warn | tee -a $OUT/q3.log)
  done
done
echo "timed $(( $(date +%s) - t0 ))s"
cd /tmp/tB && cmake --build --preset default -j16 > /tmp/bBall.log 2>&1; echo "full build B rc=$?"
export FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=/tmp/tB/build/test-cache FLCE_LIBRARY=/tmp/tB/build/libflce.so
for t in test_distill_gpu test_gpu test_saved; do
  t1=$(date +%s)
  (cd /tmp/tB/build && timeout 200 ctest -R "^$t\$" --output-on-failure) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc $(( $(date +%s) - t1 ))s"; grep -E "FAIL|check failed|tests passed|Error" $OUT/$t.log | head -8
done
echo "done $(( $(date +%s) - t0 ))s"
