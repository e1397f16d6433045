#!/bin/bash
# m3 (session 33, one GPU): staged_add_rows (dW added into the 16-bit dW through shared memory) against the
# tree before it (.whl/before.tgz: the fragments' half-sector loads and stores), interleaved, twice: m2.py at
# 8192x4096x128256 and 8192x2048x151936:4096, forward KL, memory_budget 1024 MiB; then test_distill_gpu on the
# new tree.
set -u; mkdir -p $OUT; s=$(date +%s)
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
rm -rf /tmp/tb /tmp/tn; mkdir -p /tmp/tb /tmp/tn
tar -xzf .whl/before.tgz -C /tmp/tb
tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/tn
for T in b n; do
  cp bench/results/2026-11-29-session33/m2.py /tmp/t$T/
  TG=flce; [ $T = n ] && TG="flce test_distill_gpu"
  (cd /tmp/t$T && cmake --preset default > /tmp/b$T.log 2>&1 && cmake --build --preset default --target $TG -j8 >> /tmp/b$T.log 2>&1; echo "build $T rc=$?") &
done
wait
echo "built $(( $(date +%s)-s )) s"
for round in 1 2; do
  for cfg in "8192 4096 4096 128256 1024" "8192 2048 4096 151936 1024"; do
    for T in b n; do
      (cd /tmp/t$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 120 python3 m2.py $cfg 2>&1 | grep -v -i warn | sed "s/^/$T /" | tee -a $OUT/m3.log)
    done
  done
  echo "round $round $(( $(date +%s)-s )) s"
done
(cd /tmp/tn && FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=/tmp/tn/build/cache timeout 200 ./build/tests/test_distill_gpu > $OUT/test_distill_n.log 2>&1; echo "test rc=$?"; grep -E "per chunk|FAIL|passed|failed" $OUT/test_distill_n.log | head -12)
echo "done $(( $(date +%s)-s )) s"
