#!/usr/bin/env bash
# session 12 d7: v39f (labels' dW term by flce_qdw after the GEMM): correctness, A/B against FLCE_QROWS=0, compare.py errors
# (run from a `git archive` of the commit in env.txt with this file as .dev/command.sh; d1-d5 ran the same
#  structure at their commits, d1/d2 without compare.py shapes 8192x2304x256000, see README.md)
set -u
cd "$(dirname "$0")"
R=/tmp/d7; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
pack() { (cd /tmp && tar czf $OUT/d7.tgz d7); }
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; pack; exit 1; }
timeout 60 ./build/flce demo > $R/demo.log 2>&1; echo "demo rc=$?"; tail -3 $R/demo.log
(cd build && FLCE_REQUIRE_GPU=1 timeout 240 ctest -R "^test_gpu$" --output-on-failure > $R/ctest_gpu.log 2>&1); echo "ctest test_gpu rc=$?"; grep -E "row-scaled|FAIL|check failed|tests passed|failed out" $R/ctest_gpu.log | head -30
B="./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto"
for i in 1 2; do for cfg in "FLCE_QROWS=0" "FLCE_QROWS=1"; do for s in 8192x4096x128256 8192x2304x256000 4096x2048x32000 512x4096x128256; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 90 $B --shapes $s > $R/$s-$tag-$i.log 2>&1
  echo "$s [$cfg] run $i: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|qref|qscale|qlist|qdw)' $R/$s-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
timeout 250 python3 bench/compare.py --shapes 8192x4096x128256,8192x2304x256000 --stds 4,0.5 --providers flce-default,torch-compile --iters 10 --out $R/cmp1 --tag q1 > $R/compare1.log 2>&1; echo "compare rc=$?"
pack
