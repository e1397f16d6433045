#!/usr/bin/env bash
# session 15 d3: FLCE_ACC_PREFETCH (L2 prefetch of the fp32 addend by the producer) with bulk reductions: main-grad 8192/512, 32768 auto
set -u
cd "$(dirname "$0")"
R=/tmp/d3; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d2
pack() { (cd /tmp && tar czf $OUT/d3.tgz d3); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
sum() { echo "$1: $(grep -E '^\| (4|0.5) \| ' $2 | cut -d'|' -f3-6,9,14 | tr '\n' ' ')"; }
for i in 1 2; do for cfg in "FLCE_ACC_PREFETCH=0" "FLCE_ACC_PREFETCH=1" "FLCE_ACC_PREFETCH=1 FLCE_BULK_RED=0"; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 100 ./build/flce bench --logit-std 4 --iters 10 --strategies auto+maingrad --shapes 8192x4096x128256 > $R/mg-$tag-$i.log 2>&1; sum "8192 maingrad [$cfg] $i" $R/mg-$tag-$i.log
done; done
for cfg in "FLCE_ACC_PREFETCH=0" "FLCE_ACC_PREFETCH=1"; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 60 ./build/flce bench --logit-std 4 --iters 20 --strategies auto+maingrad --shapes 512x4096x128256 > $R/mg512-$tag.log 2>&1; sum "512 maingrad [$cfg]" $R/mg512-$tag.log
  env $cfg timeout 150 ./build/flce bench --logit-std 4 --iters 5 --strategies auto --shapes 32768x4096x128256 > $R/a32-$tag.log 2>&1; sum "32768 auto [$cfg]" $R/a32-$tag.log
done
FLCE_ACC_PREFETCH=1 FLCE_GRAD_STREAMS=0 timeout 200 ncu --clock-control base --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --print-details all -k regex:'^flce_dw$' -s 1 -c 1 ./build/flce bench --strategies auto+maingrad --logit-std 4 --warmup 0 --iters 1 --sets 1 --shapes 8192x4096x128256 > $R/ncu-dw-mg-bulk-pf.txt 2>&1
echo "== ncu maingrad bulk + prefetch"; grep -E "Duration|SM Frequency|DRAM Throughput|L2 Cache Throughput|Compute \(SM\)|Stall (Barrier|Long|Wait|LG|MIO)" $R/ncu-dw-mg-bulk-pf.txt | head -14
