#!/bin/bash
# r1 (session 31, one H200): dWs once over all tokens (dz_all_rows, b850fc5) against f777fae (dWs accumulated
# per chunk), both with the staged Z store: q1.py's reverse KL and JSD steps, interleaved, twice; then
# bench/distill_compare.py (cuBLAS floor, flce, torch.compile) for both on the new tree.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); cd $REPO
mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
rm -rf /tmp/before /tmp/after; mkdir -p /tmp/before /tmp/after
tar xzf .whl/before.tgz -C /tmp/before
tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/after
for T in before after; do
  cp .whl/q1.py /tmp/$T/
  (cd /tmp/$T && cmake --preset default > /tmp/b$T.log 2>&1 && cmake --build --preset default --target flce -j8 >> /tmp/b$T.log 2>&1; echo "build $T rc=$?") &
done
wait
for T in before after; do
  (cd /tmp/$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 200 python3 q1.py $T warm reverse_kl,jsd > /tmp/w$T.log 2>&1; echo "warm $T rc=$?"; grep -v -i warn /tmp/w$T.log | tail -3) &
done
wait
echo "warmed $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for T in before after; do
    (cd /tmp/$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 100 python3 q1.py $T x reverse_kl,jsd 2>&1 | grep -v -i warn | tee -a $OUT/r1.log)
  done
done
echo "timed $(( $(date +%s) - t0 ))s"
cd /tmp/after
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache
for dv in reverse_kl jsd; do
  t1=$(date +%s)
  timeout 170 python3 bench/distill_compare.py --shapes 8192x4096x128256 --divergence $dv --beta 0.5 --providers cublas-floor,flce,torch-compile --tag $dv --out $OUT > $OUT/cmp_$dv.log 2>&1; echo "$dv rc=$? $(( $(date +%s) - t1 ))s"
  grep "^|" $OUT/cmp_$dv.log | tail -4
done
echo "done $(( $(date +%s) - t0 ))s"
