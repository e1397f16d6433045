#!/bin/bash
# q1 (session 31, one H200): three trees (FLCE_ROWS_LSU 0 / 1 / 3) built side by side; caches warmed in
# parallel; then the timing runs in turn, twice (0 1 3 0 1 3).
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); cd $REPO
mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
for L in 0 1 3; do
  rm -rf /tmp/t$L; mkdir -p /tmp/t$L
  tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/t$L
  cp .whl/q1.py /tmp/t$L/
  sed -i "s/^#define FLCE_ROWS_LSU 0 /#define FLCE_ROWS_LSU $L /" /tmp/t$L/templates/gemm_wgmma_tma.cu
  grep -n "^#define FLCE_ROWS_LSU" /tmp/t$L/templates/gemm_wgmma_tma.cu
  (cd /tmp/t$L && cmake --preset default > /tmp/b$L.log 2>&1 && cmake --build --preset default --target flce -j5 >> /tmp/b$L.log 2>&1; echo "build $L rc=$?") &
done
wait
echo "built $(( $(date +%s) - t0 ))s"
for L in 0 1 3; do
  (cd /tmp/t$L && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 300 python3 q1.py L$L warm > /tmp/w$L.log 2>&1; echo "warm $L rc=$?"; tail -3 /tmp/w$L.log) &
done
wait
echo "warmed $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for L in 0 1 3; do
    (cd /tmp/t$L && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 120 python3 q1.py L$L 2>&1 | grep -v -i warn | tee -a $OUT/q1.log)
  done
done
echo "done $(( $(date +%s) - t0 ))s"
(cd /tmp/t0 && cp $REPO/.whl/q2.py . && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 150 python3 q2.py 2>&1 | grep -v -i warn | tee $OUT/q2.log)
echo "q2 done $(( $(date +%s) - t0 ))s"
