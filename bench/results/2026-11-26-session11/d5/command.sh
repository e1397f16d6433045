#!/usr/bin/env bash
# session 11 d5: v38 (dZ in registers, wgmma RS, FLCE_DZ_OPERAND=1) correctness + A/B against the default
set -u
cd "$(dirname "$0")"
R=/tmp/d5; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
pack() { (cd /tmp && tar czf $OUT/d5.tgz d5); }
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default >> $R/build.log 2>&1) || { tail -30 $R/build.log; pack; exit 1; }
# SASS of the generated dH/dW kernels (spills, HGMMA issue pattern)
for k in dh_op dw_op; do nvcc -std=c++17 -arch=sm_90a -cubin -o $R/$k.cubin sass/$k.cu > $R/$k.nvcc.log 2>&1 && cuobjdump -sass $R/$k.cubin > $R/$k.sass; echo "$k: $(grep -c HGMMA $R/$k.sass) HGMMA; k-tile: $(awk "/TRYWAIT/{print NR}" $R/$k.sass | head -4 | tr "\n" " ")"; done
FLCE_DZ_OPERAND=1 timeout 60 ./build/flce demo > $R/demo_op.log 2>&1; echo "demo dzop rc=$?"; tail -5 $R/demo_op.log
(cd build && FLCE_REQUIRE_GPU=1 timeout 300 ctest -R "test_gpu_dz_operand" --output-on-failure > $R/ctest_op.log 2>&1); echo "ctest dzop rc=$?"; tail -5 $R/ctest_op.log
B="./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto"
for i in 1 2; do for cfg in "X=0" "FLCE_DZ_OPERAND=1"; do for s in 8192x4096x128256 4096x2048x32000 8192x2304x256000; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 90 $B --shapes $s > $R/$s-$tag-$i.log 2>&1
  echo "$s [$cfg] run $i: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|dz factors)' $R/$s-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
pack
