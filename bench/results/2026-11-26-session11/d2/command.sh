#!/usr/bin/env bash
# session 11 d2: v38 variants (timing only: DZOP_X 1/2 give wrong values) — where does the RS path's time go
set -u
cd "$(dirname "$0")"
R=/tmp/d2; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d2.tgz d2); }
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default >> $R/build.log 2>&1) || { tail -30 $R/build.log; pack; exit 1; }
B="./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto"
i=0
for cfg in "X=0" "FLCE_DZ_OPERAND=1" "FLCE_DZ_OPERAND=1 DZOP_X=1" "FLCE_DZ_OPERAND=1 DZOP_X=2" "FLCE_DZ_OPERAND=1 DZOP_DEPTH=2" "FLCE_DZ_OPERAND=1 DZOP_DEPTH=2 DZOP_X=1"; do for s in 8192x4096x128256 4096x2048x32000; do
  i=$((i+1)); tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg FLCE_CACHE_DIR=/tmp/fc$i timeout 90 $B --shapes $s > $R/$s-$tag.log 2>&1
  echo "$s [$cfg]: $(grep -E '^\| 4 \| auto' $R/$s-$tag.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|dz factors)' $R/$s-$tag.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done
pack
