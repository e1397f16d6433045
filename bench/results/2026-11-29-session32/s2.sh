#!/bin/bash
# s2 (session 32, one H200): dHs of each token chunk on the side stream (runtime/distill.c DH_SIDE:
# 0 the caller's stream, 1 the side stream after the chunk's rows, 2 the side stream after the next
# chunk's student pass, beside its row kernel). Three trees side by side; s2.py's reverse KL and JSD
# steps at 8192x4096x128256 interleaved (0 1 2), twice.
set -u
REPO=$(pwd); mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
for V in 0 1 2; do
  rm -rf /tmp/v$V; mkdir -p /tmp/v$V
  tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/v$V
  cp bench/results/2026-11-29-session32/s2.py /tmp/v$V/
  sed -i "s/^#define DH_SIDE 0 /#define DH_SIDE $V /" /tmp/v$V/runtime/distill.c
  grep -c "^#define DH_SIDE $V " /tmp/v$V/runtime/distill.c
  (cd /tmp/v$V && cmake --preset default > /tmp/b$V.log 2>&1 && cmake --build --preset default --target flce -j5 >> /tmp/b$V.log 2>&1; echo "build $V rc=$?") &
done
wait
echo "built $(( $(date +%s) - t0 ))s"
for V in 0 1 2; do
  (cd /tmp/v$V && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 200 python3 s2.py V$V warm reverse_kl,jsd > /tmp/w$V.log 2>&1; echo "warm $V rc=$?"; grep -v -i warn /tmp/w$V.log | tail -2) &
done
wait
echo "warmed $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for V in 0 1 2; do
    (cd /tmp/v$V && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 100 python3 s2.py V$V x reverse_kl,jsd 2>&1 | grep -v -i warn | tee -a $OUT/s2.log)
  done
done
echo "done $(( $(date +%s) - t0 ))s"
