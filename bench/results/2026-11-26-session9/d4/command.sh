#!/usr/bin/env bash
# session 9 d4: v35c (cp.async converter) A/B
set -u
cd "$(dirname "$0")"
R=$OUT/d4; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache FLCE_REQUIRE_GPU=1
pack() { (cd $R && tar czf all.tgz *.log *.json 2>/dev/null); }
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default >> $R/build.log 2>&1) || { tail -30 $R/build.log; pack; exit 1; }
FLCE_DZ_CONVERT=1 timeout 120 ./build/flce demo > $R/demo.log 2>&1; tail -1 $R/demo.log
timeout 200 ctest --test-dir build -R '^test_gpu_dz_convert$' --output-on-failure > $R/gpu.log 2>&1; grep -E "tests passed|Failed|FAIL|\*\*\*" $R/gpu.log | head -20
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active --format=csv > $R/smi.log
B="./build/flce bench --logit-std 4 --iters 10 --timeline"
for i in 1 2; do
  for c in 1 0; do
    FLCE_DZ_CONVERT=$c timeout 100 $B --shapes 8192x4096x128256 --json $R/main-$c-$i.json > $R/main-$c-$i.log 2>&1
    echo "main conv=$c run $i: $(grep -E '^\| 4 \| auto' $R/main-$c-$i.log)"; grep -E "timeline auto: (dz|dH|dz factors) kernel" $R/main-$c-$i.log | tail -3
  done
done
pack
for s in 4096x2048x32000; do
  for c in 1 0; do
    FLCE_DZ_CONVERT=$c timeout 120 $B --shapes $s > $R/s-$s-$c.log 2>&1
    echo "$s conv=$c: $(grep -E '^\| 4 \| auto' $R/s-$s-$c.log)"; grep -E "timeline auto: (dz|dH|dz factors) kernel" $R/s-$s-$c.log | tail -3
  done
done
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active --format=csv >> $R/smi.log
pack
