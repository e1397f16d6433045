#!/bin/bash
# s4 (session 32, one H200): the compact path's p̃ / dZs of every token kept, dWs once (compact_dz_all_rows)
# against HEAD before it (.whl/before.tgz): s4.py (forward KL at 8192x2048x151936, teacher 4096) interleaved,
# twice; test_distill_gpu on the new tree.
set -u
REPO=$(pwd); mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
rm -rf /tmp/tb /tmp/tn; mkdir -p /tmp/tb /tmp/tn
tar -xzf .whl/before.tgz -C /tmp/tb
tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/tn
for T in b n; do
  cp bench/results/2026-11-29-session32/s4.py /tmp/t$T/
  TG=flce; [ $T = n ] && TG="flce test_distill_gpu"
  (cd /tmp/t$T && cmake --preset default > /tmp/b$T.log 2>&1 && cmake --build --preset default --target $TG -j7 >> /tmp/b$T.log 2>&1; echo "build $T rc=$?") &
done
wait
echo "built $(( $(date +%s) - t0 ))s"
for T in b n; do
  (cd /tmp/t$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 200 python3 s4.py $T warm > /tmp/w$T.log 2>&1; echo "warm $T rc=$?"; grep -v -i warn /tmp/w$T.log | tail -2) &
done
wait
echo "warmed $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for T in b n; do
    (cd /tmp/t$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 100 python3 s4.py $T 2>&1 | grep -v -i warn | tee -a $OUT/s4.log)
  done
done
echo "timed $(( $(date +%s) - t0 ))s"
(cd /tmp/tn && FLCE_CACHE_DIR=/tmp/tn/build/cache timeout 300 ./build/tests/test_distill_gpu > $OUT/test_distill_n.log 2>&1; echo "test rc=$?"; grep -E "dWs once|FAIL|passed|failed" $OUT/test_distill_n.log | head -20)
echo "done $(( $(date +%s) - t0 ))s"
