#!/bin/bash
# s1 (session 32, one H200): the top-k lse bias term, A/B. Trees: /tmp/tb (HEAD before, with the new
# test_topk_gpu.c copied in: it must fail at logit std 4) and /tmp/tn (the working tree). Both build
# libflce and test_topk_gpu; the test runs on both; then s1.py (timing + fp64 errors at 8192x4096x128256)
# on both, interleaved twice.
set -u
REPO=$(pwd); mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
rm -rf /tmp/tb /tmp/tn; mkdir -p /tmp/tb /tmp/tn
tar -xzf .whl/before.tgz -C /tmp/tb
cp tests/test_topk_gpu.c /tmp/tb/tests/
tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/tn
for T in b n; do
  cp bench/results/2026-11-29-session32/s1.py /tmp/t$T/
  (cd /tmp/t$T && cmake --preset default > /tmp/b$T.log 2>&1 && cmake --build --preset default --target flce test_topk_gpu -j7 >> /tmp/b$T.log 2>&1; echo "build $T rc=$?"; tail -2 /tmp/b$T.log) &
done
wait
echo "built $(( $(date +%s) - t0 ))s"
for T in b n; do
  (cd /tmp/t$T && FLCE_CACHE_DIR=/tmp/t$T/build/cache timeout 250 ./build/tests/test_topk_gpu > $OUT/test_topk_$T.log 2>&1; echo "test $T rc=$?"; grep -E "std 4|FAIL|passed|failed" $OUT/test_topk_$T.log | head -20) &
  (cd /tmp/t$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 250 python3 s1.py $T warm > /tmp/w$T.log 2>&1; echo "warm $T rc=$?"; tail -2 /tmp/w$T.log) &
done
wait
echo "tested $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for T in b n; do
    (cd /tmp/t$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 100 python3 s1.py $T 2>&1 | grep -v -i warn | tee -a $OUT/s1.log)
  done
done
echo "done $(( $(date +%s) - t0 ))s"
