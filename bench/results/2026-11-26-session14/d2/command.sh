#!/usr/bin/env bash
# session 14 d2: dH split over k (FLCE_DH_SPLITS) — correctness and 512/256-token A/B
set -u
cd "$(dirname "$0")"
R=/tmp/d2; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d2
pack() { (cd /tmp && tar czf $OUT/d2.tgz d2); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
(cd build && FLCE_REQUIRE_GPU=1 timeout 300 ctest -R 'test_gpu_dh_splits' --output-on-failure > $R/ctest.log 2>&1; echo "ctest rc=$?"; grep -E "tests passed|Passed|Failed|check failed" $R/ctest.log | head -20)
FLCE_DH_SPLITS=2 timeout 200 ./build/flce fuzz --seed 20261126 --cases 300 --jobs 16 --time-limit 150 > $R/fuzz.log 2>&1; echo "fuzz rc=$?"; tail -3 $R/fuzz.log
for i in 1 2 3; do for s in 512x4096x128256 256x4096x128256; do for cfg in "FLCE_DH_SPLITS=-1" "FLCE_DH_SPLITS=0"; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 60 ./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto --shapes $s > $R/$s-$tag-$i.log 2>&1
  echo "$s [$cfg] $i: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|cast|all)' $R/$s-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
FLCE_LIBRARY=$PWD/build/libflce.so FLCE_BIN=$PWD/build/flce timeout 200 python3 bench/compare.py --shapes 512x4096x128256 --stds 0.5,4 --providers cublas-floor,flce-default,torch-compile --iters 20 --out $R/cmp --tag d2 > $R/compare.log 2>&1; echo "compare rc=$?"
grep -h -A12 '^### Summary' $R/cmp/*.md | grep -E "^\| (flce|torch|cublas)"
