#!/bin/bash
# s3 (session 32, one H200): reverse KL and JSD rows by clusters of CTAs (flce_distill_row_cl, the second
# read from L2) against one CTA a row (flce_distill_row). runtime/distill.c ROW_CL_SLICE / ROW_CL_SMEM:
# X0 0/0 (off), X1 64K/0 (16 CTAs a row at V = 128256), X3 64K/48K (at most 4 CTAs an SM),
# X4 64K/100K (2 an SM). test_distill_gpu on X1; s3.py's steps at 8192x4096x128256 interleaved, twice.
set -u
REPO=$(pwd); mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
declare -A SL=([0]=0 [1]="(64 * 1024)" [3]="(64 * 1024)" [4]="(64 * 1024)") SM=([0]=0 [1]=0 [3]="(48 * 1024)" [4]="(100 * 1024)")
for X in 0 1 3 4; do
  rm -rf /tmp/x$X; mkdir -p /tmp/x$X
  tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/x$X
  cp bench/results/2026-11-29-session32/s3.py /tmp/x$X/
  sed -i "s/^#define ROW_CL_SLICE (64 \* 1024) /#define ROW_CL_SLICE ${SL[$X]} /; s/^#define ROW_CL_SMEM 0 /#define ROW_CL_SMEM ${SM[$X]} /" /tmp/x$X/runtime/distill.c
  grep "^#define ROW_CL_S" /tmp/x$X/runtime/distill.c | tr '\n' ' '; echo
  T=flce; [ $X = 1 ] && T="flce test_distill_gpu"
  (cd /tmp/x$X && cmake --preset default > /tmp/b$X.log 2>&1 && cmake --build --preset default --target $T -j4 >> /tmp/b$X.log 2>&1; echo "build $X rc=$?") &
done
wait
echo "built $(( $(date +%s) - t0 ))s"
(cd /tmp/x1 && FLCE_CACHE_DIR=/tmp/x1/build/cache timeout 300 ./build/tests/test_distill_gpu > $OUT/test_distill_x1.log 2>&1; echo "test x1 rc=$?"; grep -E "CTAs a row|FAIL|passed|failed" $OUT/test_distill_x1.log | head) &
for X in 0 1 3 4; do
  (cd /tmp/x$X && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 200 python3 s3.py X$X warm reverse_kl,jsd > /tmp/w$X.log 2>&1; echo "warm $X rc=$?"; grep -v -i warn /tmp/w$X.log | tail -2) &
done
wait
echo "warmed $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for X in 0 1 3 4; do
    (cd /tmp/x$X && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 100 python3 s3.py X$X x reverse_kl,jsd 2>&1 | grep -v -i warn | tee -a $OUT/s3.log)
  done
done
echo "done $(( $(date +%s) - t0 ))s"
