#!/bin/bash
# m2 (session 33, one GPU): where the budgeted schedule's time goes: m2.py (step, memory, kernels by name) for
# forward KL at 8192x4096x128256 (default, 2048, 1024 MiB) and 8192x2048x151936:4096 (default, 1024 MiB).
set -u; mkdir -p $OUT; s=$(date +%s)
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
cmake --preset default > /tmp/b.log 2>&1 && cmake --build --preset default --target flce -j16 >> /tmp/b.log 2>&1; echo "build rc=$? $(( $(date +%s)-s )) s"
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache
for cfg in "8192 4096 4096 128256 0" "8192 4096 4096 128256 2048" "8192 4096 4096 128256 1024" "8192 2048 4096 151936 0" "8192 2048 4096 151936 1024"; do
  timeout 120 python3 bench/results/2026-11-29-session33/m2.py $cfg 2>&1 | grep -v -i warn | tee -a $OUT/m2.log
done
echo "done $(( $(date +%s)-s )) s"
