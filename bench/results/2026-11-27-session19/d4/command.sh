#!/bin/bash
# session 19 d4 (1 GPU): the logits items' order, FLCE_LOGITS_GROUP = 8 (default) / 16 / 32 / 64
# row blocks per group, in-run kernel times at the tp = 4 / tp = 2 shards and the main shape,
# alternating twice; test_gpu_qrows with group 32
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d4; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d4.tgz d4); }
trap pack EXIT
device_env $R/env.txt > /dev/null; head -6 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || exit 1
export FLCE_CACHE_DIR=/tmp/flce-cache
S=8192x4096x32064,8192x4096x64128,8192x4096x128256
./build/flce bench --shapes $S --strategies chunked --logit-std 4 --warmup 1 --iters 2 > /dev/null 2>&1 # compile
for i in 1 2; do for g in 8 16 32 64; do
  FLCE_LOGITS_GROUP=$g timeout 120 ./build/flce bench --shapes $S --strategies chunked --logit-std 4 --iters 20 --timeline > $R/bench-g$g-$i.md 2> $R/bench-g$g-$i.log
  echo "== group $g, $i"; grep -h '^| 4' $R/bench-g$g-$i.md | cut -d'|' -f3-5,11-15
  grep -h 'logits kernel' $R/bench-g$g-$i.log | head -6
done; done
echo "bench $(( $(date +%s) - t0 )) s"
(cd build && FLCE_LOGITS_GROUP=32 FLCE_REQUIRE_GPU=1 timeout 100 ctest -R '^test_gpu_qrows' --output-on-failure > $R/tests-g32.log 2>&1; echo "status $?" >> $R/tests-g32.log)
grep -E "Test #|tests passed|status" $R/tests-g32.log
echo "t $(( $(date +%s) - t0 )) s"
true
