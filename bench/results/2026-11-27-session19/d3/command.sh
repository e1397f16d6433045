#!/bin/bash
# session 19 d3 (1 GPU): the statistics pass in persistent CTAs (FLCE_LOGITS_PERSIST, default on)
# against one item per CTA (=0), in-run kernel times at the tp = 4 / tp = 2 shards and the main
# shape, alternating three times; then the GPU tests and a 400-case fuzz with the default
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d3; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d3.tgz d3); }
trap pack EXIT
device_env $R/env.txt > /dev/null; head -6 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || exit 1
export FLCE_CACHE_DIR=/tmp/flce-cache
S=8192x4096x32064,8192x4096x64128,8192x4096x128256
./build/flce bench --shapes $S --strategies chunked --logit-std 4 --warmup 1 --iters 2 > /dev/null 2>&1 # compile
for i in 1 2 3; do for v in persist classic; do
  case $v in persist) e="NONE=1";; classic) e="FLCE_LOGITS_PERSIST=0";; esac
  env $e FLCE_LOG=debug timeout 120 ./build/flce bench --shapes $S --strategies chunked --logit-std 4 --iters 20 --timeline > $R/bench-$v-$i.md 2> $R/bench-$v-$i.full
  grep -v 'debug\]' $R/bench-$v-$i.full > $R/bench-$v-$i.log; grep -ho 'logits: .*' $R/bench-$v-$i.full | sort | uniq -c > $R/bench-$v-$i.plans; rm $R/bench-$v-$i.full
  echo "== $v $i ($e)"; grep -h '^| 4' $R/bench-$v-$i.md | cut -d'|' -f3-5,11-15
  grep -h 'logits kernel' $R/bench-$v-$i.log | head -6; cat $R/bench-$v-$i.plans
done; done
echo "bench $(( $(date +%s) - t0 )) s"
(cd build && FLCE_REQUIRE_GPU=1 timeout 200 ctest -R '^test_gpu$|^test_gpu_qrows|^test_gpu_dh_splits|^test_gpu_portable' --output-on-failure > $R/tests.log 2>&1; echo "status $?" >> $R/tests.log) &
FLCE_CACHE_DIR=/tmp/flce-cache-fuzz timeout 200 ./build/flce fuzz --seed 20261122 --cases 400 --jobs 12 --time-limit 180 > $R/fuzz.log 2>&1; echo "fuzz rc=$?" >> $R/fuzz.log
wait
grep -E "Test #|tests passed|status" $R/tests.log
tr '\r' '\n' < $R/fuzz.log | grep -v "^flce fuzz: [0-9]*/" | tail -7; grep -a "FAIL" $R/fuzz.log | cut -c1-300 | head -5
echo "t $(( $(date +%s) - t0 )) s"
true
