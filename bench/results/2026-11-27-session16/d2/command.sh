#!/bin/bash
# session 16 d2: logits in 2-CTA clusters (FLCE_LOGITS_CLUSTER=1) — correctness (bench errors at awkward
# shapes, test_gpu, 200-case fuzz), then A/B 0/1 alternated at four shapes (at b0271ce: 0 = off, 1 = on)
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d2; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d2.tgz d2); }
trap pack EXIT
device_env $R/env.txt > /dev/null
cat device-commit.txt >> $R/env.txt; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt
head -4 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || { echo build failed; tail -20 $R/build.log; exit 1; }
export FLCE_CACHE_DIR=/tmp/flce-cache
row() { grep -E '^\| (4|0.5) \| ' $1 | cut -d'|' -f3-4,8,11- | tr -s ' ' | tr '\n' ' '; }
tl() { grep -E 'timeline [^:]*: (logits|logits\+dz|all)' $1 | awk '{printf "%s=%s ", $3, $(NF-1)}'; }
for s in 1100x2304x50001 300x136x1001 2x4096x32000; do
  FLCE_LOGITS_CLUSTER=1 timeout 60 ./build/flce bench --logit-std 4 --iters 3 --strategies auto,forward,recompute --shapes $s > $R/small-$s.log 2>&1
  echo "cl $s rc=$?: $(row $R/small-$s.log)"
done
(cd build && FLCE_LOGITS_CLUSTER=1 FLCE_REQUIRE_GPU=1 timeout 200 ctest -R '^test_gpu' -j8 --output-on-failure > $R/ctest-cl.log 2>&1; echo "ctest cl rc=$?"; grep -E "tests passed|Failed|check failed|FAIL" $R/ctest-cl.log | head -10)
FLCE_LOGITS_CLUSTER=1 timeout 70 ./build/flce fuzz --seed 2026112717 --cases 200 --jobs 16 --time-limit 60 > $R/fuzz-cl.log 2>&1; echo "fuzz cl rc=$?"; tail -c 300 $R/fuzz-cl.log; echo
echo "t $(( $(date +%s) - t0 )) s"
for i in 1 2 3; do for v in 0 1; do
  FLCE_LOGITS_CLUSTER=$v timeout 100 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies auto,forward --shapes 8192x4096x128256 > $R/main-$v-$i.log 2>&1
  echo "main cl=$v #$i: $(row $R/main-$v-$i.log) | $(tl $R/main-$v-$i.log)"
done; done
echo "t $(( $(date +%s) - t0 )) s"
for i in 1 2; do for v in 0 1; do
  FLCE_LOGITS_CLUSTER=$v timeout 100 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies auto,forward --shapes 8192x2304x256000 > $R/d2304-$v-$i.log 2>&1
  echo "2304 cl=$v #$i: $(row $R/d2304-$v-$i.log) | $(tl $R/d2304-$v-$i.log)"
  FLCE_LOGITS_CLUSTER=$v timeout 60 ./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto --shapes 512x4096x128256,4096x2048x32000 > $R/small2-$v-$i.log 2>&1
  echo "512/4096 cl=$v #$i: $(row $R/small2-$v-$i.log)"
done; done
echo "t $(( $(date +%s) - t0 )) s"
for v in 0 1; do
  FLCE_LOGITS_CLUSTER=$v timeout 100 ./build/flce bench --logit-std 4 --iters 5 --timeline --strategies forward --shapes 32768x4096x128256 > $R/f32k-$v.log 2>&1
  echo "32768 fwd cl=$v: $(row $R/f32k-$v.log)"
done
echo "t $(( $(date +%s) - t0 )) s"
