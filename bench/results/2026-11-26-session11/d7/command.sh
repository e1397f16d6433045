#!/usr/bin/env bash
# session 11 d7: dZ operand formed one k-tile ahead (DZOP_AHEAD=1, spills ~180 B) vs v38d's order (DZOP_AHEAD=0) vs default
set -u
cd "$(dirname "$0")"
R=/tmp/d7; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d7.tgz d7); }
cat device-commit.txt > $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default >> $R/build.log 2>&1) || { tail -30 $R/build.log; pack; exit 1; }
FLCE_DZ_OPERAND=1 FLCE_CACHE_DIR=/tmp/fcA timeout 60 ./build/flce demo > $R/demo_ahead.log 2>&1; echo "demo ahead rc=$?"; grep -E "rel L2|passed|FAIL" $R/demo_ahead.log
(cd build && FLCE_CACHE_DIR=/tmp/fcA FLCE_REQUIRE_GPU=1 timeout 300 ctest -R "test_gpu_dz_operand" --output-on-failure > $R/ctest_op.log 2>&1); echo "ctest dzop(ahead) rc=$?"
B="./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto"
i=0
for rep in 1 2; do for cfg in "X=0" "FLCE_DZ_OPERAND=1 DZOP_AHEAD=0" "FLCE_DZ_OPERAND=1 DZOP_AHEAD=1"; do for s in 8192x4096x128256 8192x2304x256000; do
  i=$((i+1)); tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg FLCE_CACHE_DIR=/tmp/fc$(echo $tag | md5sum | cut -c1-6) timeout 90 $B --shapes $s > $R/$s-$tag-$rep.log 2>&1
  echo "$s [$cfg] $rep: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$rep.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|dz factors)' $R/$s-$tag-$rep.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
pack
