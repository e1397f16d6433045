#!/usr/bin/env bash
# device_raster.sh — one device call: flce bench of AUTO at two shapes with FLCE_RASTER = 0, 16, 64, 8
# (the dH/dW tile order, bench/NOTES.md v10), alternating, two rounds; ncu DRAM/L2 of one dH and dW launch each.
cd "$(dirname "$0")/.."
set -u
export FLCE_CACHE_DIR=/tmp/flce-cache
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "commit $(cat .device-commit)" | tee $OUT/raster.log
S=8192x4096x128256,8192x2304x256000
./build/flce bench --shapes $S --strategies auto --iters 2 --warmup 1 --logit-std 4 > /dev/null 2>&1
for i in 1 2; do for G in 0 16 64 8; do
  echo "== FLCE_RASTER=$G round $i" | tee -a $OUT/raster.log
  FLCE_RASTER=$G ./build/flce bench --shapes $S --strategies auto --iters 5 --warmup 2 --logit-std 4 2>&1 | grep '^| 4' | tee -a $OUT/raster.log
done; done
for G in 0 64 16; do for k in dh dw; do
  echo "== ncu flce_$k FLCE_RASTER=$G" | tee -a $OUT/raster.log
  FLCE_RASTER=$G ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis -k flce_$k -c 1 ./build/flce bench --shapes 8192x4096x128256 --strategies recompute --logit-std 4 --warmup 0 --iters 1 --sets 1 2>&1 | grep -E 'Duration|DRAM Throughput|L2 Hit|Memory Throughput' | tee -a $OUT/raster.log
done; done
