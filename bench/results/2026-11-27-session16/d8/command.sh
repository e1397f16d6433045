#!/bin/bash
# session 16 d8: dH/dW in 2-CTA clusters (FLCE_CLUSTER=2) vs the default where the power cap bites:
# AUTO at 32768×4096×128256 (3 token chunks), alternated twice; the main shape once each for reference
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d8; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d8.tgz d8); }
trap pack EXIT
device_env $R/env.txt > /dev/null
cat device-commit.txt >> $R/env.txt
device_build "$R/build.log" || exit 1
export FLCE_CACHE_DIR=/tmp/flce-cache
row() { grep -E '^\| (4|0.5) \| ' $1 | cut -d'|' -f3-5,8,13- | tr -s ' ' | tr '\n' ' '; }
tl() { grep -E 'timeline [^:]*: (logits|dH|dW|all)' $1 | awk '{printf "%s=%s ", $3, $(NF-1)}'; }
for i in 1 2; do for c in -1 2; do
  FLCE_CLUSTER=$c timeout 120 ./build/flce bench --logit-std 4 --iters 5 --timeline --strategies auto --shapes 32768x4096x128256 > $R/a32-c$c-$i.log 2>&1
  echo "32768 auto FLCE_CLUSTER=$c #$i: $(row $R/a32-c$c-$i.log) | $(tl $R/a32-c$c-$i.log)"
done; done
for c in -1 2; do
  FLCE_CLUSTER=$c timeout 60 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies auto --shapes 8192x4096x128256 > $R/a8-c$c.log 2>&1
  echo "8192 auto FLCE_CLUSTER=$c: $(row $R/a8-c$c.log) | $(tl $R/a8-c$c.log)"
done
