#!/usr/bin/env bash
# session 14 d4: GPU tests at the new defaults (dW clusters at short chunks, dH splits, qrows from 1e8); cluster A/B
set -u
cd "$(dirname "$0")"
R=/tmp/d4; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d4
pack() { (cd /tmp && tar czf $OUT/d4.tgz d4); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
(cd build && FLCE_REQUIRE_GPU=1 timeout 200 ctest -R '^test_gpu$|test_gpu_qrows$' -j2 --output-on-failure > $R/ctest.log 2>&1; echo "ctest rc=$?"; grep -E "tests passed|Failed|check failed|FAIL" $R/ctest.log | head -10)
for i in 1 2; do for s in 512x4096x128256 1024x4096x128256 256x4096x128256; do for cfg in "FLCE_CLUSTER=-1" "FLCE_CLUSTER=0"; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 60 ./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto --shapes $s > $R/$s-$tag-$i.log 2>&1
  echo "$s [$cfg] $i: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|cast|qref|qdw|all)' $R/$s-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
