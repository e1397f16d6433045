#!/bin/bash
# session 19 d2 (1 GPU): the logits pass's extra CTAs (FLCE_LOGITS_EXTRAS) and forced split counts
# (FLCE_LOGITS_SPLITS): in-run kernel times at the tp = 4 / tp = 2 shards and the main shape, the
# planner's splits vs 2 splits with extras vs 2 splits without, alternating twice; then the GPU
# tests and a 400-case fuzz with FLCE_LOGITS_SPLITS=2 (extras nearly everywhere)
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d2; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d2.tgz d2); }
trap pack EXIT
device_env $R/env.txt > /dev/null; head -6 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || exit 1
export FLCE_CACHE_DIR=/tmp/flce-cache
S=8192x4096x32064,8192x4096x64128,8192x4096x128256
./build/flce bench --shapes $S --strategies chunked --logit-std 4 --warmup 1 --iters 2 > /dev/null 2>&1 # compile
for i in 1 2; do for v in auto x2 x2noext; do
  case $v in auto) e="NONE=1";; x2) e="FLCE_LOGITS_SPLITS=2";; x2noext) e="FLCE_LOGITS_SPLITS=2 FLCE_LOGITS_EXTRAS=0";; esac
  env $e FLCE_LOG=debug timeout 120 ./build/flce bench --shapes $S --strategies chunked --logit-std 4 --iters 20 --timeline > $R/bench-$v-$i.md 2> $R/bench-$v-$i.log
  echo "== $v $i ($e)"; grep -h '^| 4' $R/bench-$v-$i.md | cut -d'|' -f3-5,11-15
  grep -h 'logits kernel' $R/bench-$v-$i.log | head -6; grep -ho 'logits: .*' $R/bench-$v-$i.log | sort | uniq -c
done; done
echo "bench $(( $(date +%s) - t0 )) s"
(cd build && FLCE_REQUIRE_GPU=1 FLCE_LOGITS_SPLITS=2 timeout 200 ctest -R '^test_gpu$|^test_gpu_qrows' --output-on-failure > $R/tests-x2.log 2>&1; echo "status $?" >> $R/tests-x2.log) &
FLCE_LOGITS_SPLITS=2 FLCE_CACHE_DIR=/tmp/flce-cache-fuzz timeout 200 ./build/flce fuzz --seed 20261127 --cases 400 --jobs 12 --time-limit 180 > $R/fuzz-x2.log 2>&1; echo "fuzz rc=$?" >> $R/fuzz-x2.log
wait
(cd build && FLCE_REQUIRE_GPU=1 timeout 100 ctest -R '^test_gpu_qrows|^test_gpu_dh_splits' --output-on-failure > $R/tests-default.log 2>&1; echo "status $?" >> $R/tests-default.log)
grep -E "Test #|tests passed|status" $R/tests-x2.log $R/tests-default.log
tr '\r' '\n' < $R/fuzz-x2.log | grep -v "^flce fuzz: [0-9]*/" | tail -4; grep -a "FAIL" $R/fuzz-x2.log | cut -c1-300 | head -5
echo "t $(( $(date +%s) - t0 )) s"
true
