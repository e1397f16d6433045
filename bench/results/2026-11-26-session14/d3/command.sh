#!/usr/bin/env bash
# session 14 d3 (commit 3379c4e): qrows at small chunks after the qref/qdw changes; ncu stall reasons of dW and the compact logits at 512 tokens
set -u
cd "$(dirname "$0")"
R=/tmp/d3; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d3
pack() { (cd /tmp && tar czf $OUT/d3.tgz d3); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
(cd build && FLCE_REQUIRE_GPU=1 timeout 200 ctest -R 'test_gpu_qrows$' --output-on-failure > $R/ctest.log 2>&1; echo "ctest rc=$?"; grep -E "tests passed|Failed|check failed" $R/ctest.log | head -5)
for i in 1 2; do for s in 512x4096x128256 4096x2048x32000 1024x4096x128256; do for cfg in "FLCE_QROWS=1" "FLCE_QROWS=0"; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 60 ./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto --shapes $s > $R/$s-$tag-$i.log 2>&1
  echo "$s [$cfg] $i: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|cast|qref|qscale|qlist|qdw|qdh|all)' $R/$s-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
s=512x4096x128256
FLCE_GRAD_STREAMS=0 timeout 240 ncu --clock-control base --section WarpStateStats --section SourceCounters --section SpeedOfLight -k 'regex:^flce_(dw|logits)$' -c 2 ./build/flce bench --strategies auto --logit-std 4 --warmup 0 --iters 1 --sets 1 --shapes $s > $R/ncu-stalls.txt 2>&1; echo "ncu rc=$?"
grep -E "^  flce_|Duration|Stall|stall|Warp Cycles Per Issued" $R/ncu-stalls.txt | head -60
