#!/bin/bash
# s6 (session 32, one H200): forward KL at 8192x4096x128256 (s2.py's forward_kl step) on 432d14c (session 26,
# where distill_compare gave 53.36 ms) against the tree in .device-commit, interleaved, twice: did the 55.32 of
# s5 come from the code or from the machine?
set -u; mkdir -p $OUT; t0=$(date +%s)
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
rm -rf /tmp/to /tmp/tn; mkdir -p /tmp/to /tmp/tn
tar -xzf .whl/old26.tgz -C /tmp/to
tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/tn
for T in o n; do
  cp bench/results/2026-11-29-session32/s2.py /tmp/t$T/
  (cd /tmp/t$T && cmake --preset default > /tmp/b$T.log 2>&1 && cmake --build --preset default --target flce -j8 >> /tmp/b$T.log 2>&1; echo "build $T rc=$?") &
done
wait
for T in o n; do
  (cd /tmp/t$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 200 python3 s2.py $T warm forward_kl > /tmp/w$T.log 2>&1; echo "warm $T rc=$?") &
done
wait
echo "warmed $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for T in o n; do
    (cd /tmp/t$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 100 python3 s2.py $T x forward_kl 2>&1 | grep -v -i warn | tee -a $OUT/s6.log)
  done
done
echo "done $(( $(date +%s) - t0 ))s"
