#!/bin/bash
# session 16 d1: logits ping-pong (FLCE_PINGPONG=1, =2 with clusters) — correctness (bench errors at
# awkward shapes, test_gpu under =2, 400-case fuzz under =1 and =2), then A/B 0/1/2 × 2 at the main shape
# (at bc64568, where FLCE_PINGPONG took 0/1/2; from b0271ce on, =2 is FLCE_PINGPONG=1 FLCE_LOGITS_CLUSTER=1)
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d1; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d1.tgz d1); }
trap pack EXIT
device_env $R/env.txt > /dev/null
cat device-commit.txt >> $R/env.txt; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt
head -4 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || { echo build failed; tail -20 $R/build.log; exit 1; }
export FLCE_CACHE_DIR=/tmp/flce-cache
row() { grep -E '^\| (4|0.5) \| ' $1 | cut -d'|' -f3-4,8,11- | tr -s ' ' | tr '\n' ' '; }
tl() { grep -E 'timeline [^:]*: (logits|logits\+dz|all)' $1 | awk '{printf "%s=%s ", $3, $(NF-1)}'; }
for v in 1 2; do
  for s in 1100x2304x50001 300x136x1001 2x4096x32000; do
    FLCE_PINGPONG=$v timeout 60 ./build/flce bench --logit-std 4 --iters 3 --strategies auto,forward,recompute --shapes $s > $R/small-$v-$s.log 2>&1
    echo "pp=$v $s rc=$?: $(row $R/small-$v-$s.log)"
  done
done
echo "t $(( $(date +%s) - t0 )) s"
(cd build && FLCE_PINGPONG=2 FLCE_REQUIRE_GPU=1 timeout 200 ctest -R '^test_gpu' -j8 --output-on-failure > $R/ctest-pp2.log 2>&1; echo "ctest pp2 rc=$?"; grep -E "tests passed|Failed|check failed|FAIL" $R/ctest-pp2.log | head -10)
echo "t $(( $(date +%s) - t0 )) s"
for v in 1 2; do FLCE_PINGPONG=$v timeout 100 ./build/flce fuzz --seed 2026112716 --cases 400 --jobs 16 --time-limit 90 > $R/fuzz-$v.log 2>&1; echo "fuzz pp=$v rc=$?: $(grep -a 'of 400' $R/fuzz-$v.log | tail -1)"; tail -2 $R/fuzz-$v.log; done
echo "t $(( $(date +%s) - t0 )) s"
for i in 1 2; do for v in 0 1 2; do
  FLCE_PINGPONG=$v timeout 100 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies auto,forward --shapes 8192x4096x128256 > $R/main-$v-$i.log 2>&1
  echo "main pp=$v #$i: $(row $R/main-$v-$i.log) | $(tl $R/main-$v-$i.log)"
done; done
echo "t $(( $(date +%s) - t0 )) s"
for v in 0 2 1; do
  FLCE_PINGPONG=$v timeout 100 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies auto,recompute --shapes 8192x2304x256000 > $R/d2304-$v.log 2>&1
  echo "2304 pp=$v: $(row $R/d2304-$v.log) | $(tl $R/d2304-$v.log)"
done
echo "t $(( $(date +%s) - t0 )) s"
