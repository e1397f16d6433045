#!/usr/bin/env bash
# session 13 d2: v40 (qref/qlist/qdw/qdh): the qrows GPU tests, A/B FLCE_QROWS=0 / FLCE_QDH=0 / default, compare.py errors
set -u
cd "$(dirname "$0")"
R=/tmp/d2; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d2
pack() { (cd /tmp && tar czf $OUT/d2.tgz d2); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
(cd build && FLCE_REQUIRE_GPU=1 timeout 200 ctest -R "^test_gpu_qrows" --output-on-failure > $R/ctest_q.log 2>&1); echo "ctest qrows rc=$?"; grep -E "Test +#|row-scaled|FAIL|check failed|tests passed" $R/ctest_q.log | head -20
B="./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto"
for i in 1 2; do for cfg in "FLCE_QROWS=0" "FLCE_QDH=0" "FLCE_QDH=1"; do for s in 8192x4096x128256 8192x2304x256000; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 90 $B --shapes $s > $R/$s-$tag-$i.log 2>&1
  echo "$s [$cfg] run $i: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|qref|qscale|qlist|qdw|qdh)' $R/$s-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
for cfg in "FLCE_QDH=1" "FLCE_QDH=0"; do tag=$(echo "$cfg" | tr ' =' '__')
env $cfg timeout 150 python3 bench/compare.py --shapes 8192x4096x128256 --stds 4,0.5 --providers flce-default --iters 5 --out $R/cmp-$tag --tag $tag > $R/compare-$tag.log 2>&1; echo "compare $cfg rc=$?"; grep -E "^\| flce-default" $R/cmp-$tag/*.md | head -4
done
