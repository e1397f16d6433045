#!/usr/bin/env bash
# session 10 d6: 2-CTA clusters for dH/dW (FLCE_CLUSTER=2), alone and with FLCE_DZ_CONVERT=1, against the default; SM clock and power sampled
set -u
cd "$(dirname "$0")"
R=/tmp/d6; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
pack() { (cd /tmp && tar czf $OUT/d6.tgz d6); }
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default >> $R/build.log 2>&1) || { tail -30 $R/build.log; pack; exit 1; }
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 200 > $R/smi.csv &
SMI=$!
B="./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto"
for i in 1 2; do for cfg in "X=0" "FLCE_CLUSTER=2" "FLCE_CLUSTER=2 FLCE_DZ_CONVERT=1"; do for s in 8192x4096x128256 8192x2304x256000; do
  tag=$(echo "$cfg" | tr ' =' '__')
  echo "$(date -u +%T.%N) start $s $tag $i" >> $R/marks.txt
  env $cfg timeout 90 $B --shapes $s > $R/$s-$tag-$i.log 2>&1
  echo "$(date -u +%T.%N) end $s $tag $i" >> $R/marks.txt
  echo "$s [$cfg] run $i: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW) kernel' $R/$s-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
kill $SMI
pack
