#!/usr/bin/env bash
# session 10 d7: v37 (portable logits: the next tile's prologue before the epilogue) A/B against c4122ee
# (abtree/), test_gpu_portable, then the 2000-case fuzz on this tree
set -u
cd "$(dirname "$0")"
R=/tmp/d7; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
pack() { (cd /tmp && tar czf $OUT/d7.tgz d7); }
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt
( (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j 8 >> $R/build.log 2>&1) || echo "new build failed" ) &
( cd abtree && (cmake --preset default > $R/build-prev.log 2>&1 && cmake --build --preset default -j 8 >> $R/build-prev.log 2>&1) || echo "prev build failed" ) &
wait
[ -x build/flce ] && [ -x abtree/build/flce ] || { tail -20 $R/build.log $R/build-prev.log; pack; exit 1; }
FLCE_REQUIRE_GPU=1 timeout 150 ctest --test-dir build -R '^test_gpu_portable$' --output-on-failure > $R/gpu-portable.log 2>&1; grep -E "tests passed|Failed|FAIL" $R/gpu-portable.log | head -5
pack
for i in 1 2; do for side in new old; do
  tree=.; [ $side = old ] && tree=abtree
  (cd $tree && FLCE_PORTABLE=1 timeout 100 ./build/flce bench --logit-std 4 --iters 10 --strategies auto,forward --shapes 8192x2304x256000,8192x4096x128256) > $R/bf16-$side-$i.log 2>&1
  (cd $tree && FLCE_PORTABLE=1 timeout 60 ./build/flce bench --logit-std 4 --iters 10 --dtype f32 --strategies auto,forward --shapes 4096x2048x32000) > $R/f32-$side-$i.log 2>&1
  echo "$side $i: $(grep -hE '^\| 4 \| (auto|forward)' $R/bf16-$side-$i.log $R/f32-$side-$i.log | cut -d'|' -f3-4,7,12-14 | tr '\n' ' ')"
done; done
pack
timeout 230 ./build/flce fuzz --seed 20261122 --cases 2000 --jobs 16 --time-limit 220 > $R/fuzz.log 2>&1; echo "fuzz status $?" >> $R/fuzz.log
grep -v '^ok ' $R/fuzz.log | tail -12
pack
