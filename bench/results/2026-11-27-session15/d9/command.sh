#!/usr/bin/env bash
# session 15 d9: FLCE_STAGGER=1/0 (accumulating dW's CTAs at four start offsets): main-grad 8192 × 2 (and serial), 512, D = 2304; 32768 auto; test_gpu with it on
set -u
cd "$(dirname "$0")"
R=/tmp/d9; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d9
pack() { (cd /tmp && tar czf $OUT/d9.tgz d9); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
sum() { echo "$1: $(grep -E '^\| (4|0.5) \| ' $2 | cut -d'|' -f3-6,9,14 | tr '\n' ' ') | $(grep -E 'timeline [^:]*: (dW|all)' $2 | awk '{printf "%s %s/%s  ", $3, $(NF-1), $(NF-3)}')"; }
for i in 1 2; do for st in 1 0; do
  FLCE_STAGGER=$st timeout 60 ./build/flce bench --logit-std 4 --iters 10 --strategies auto+maingrad --shapes 8192x4096x128256 > $R/mg-$st-$i.log 2>&1; sum "8192 maingrad STAGGER=$st $i" $R/mg-$st-$i.log
done; done
for st in 1 0; do
  FLCE_STAGGER=$st FLCE_GRAD_STREAMS=0 timeout 60 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies auto+maingrad --shapes 8192x4096x128256 > $R/mgs-$st.log 2>&1; sum "8192 maingrad serial STAGGER=$st" $R/mgs-$st.log
  FLCE_STAGGER=$st timeout 60 ./build/flce bench --logit-std 4 --iters 20 --strategies auto+maingrad --shapes 512x4096x128256 > $R/mg512-$st.log 2>&1; sum "512 maingrad STAGGER=$st" $R/mg512-$st.log
  FLCE_STAGGER=$st timeout 80 ./build/flce bench --logit-std 4 --iters 10 --strategies auto+maingrad --shapes 8192x2304x256000 > $R/mg2304-$st.log 2>&1; sum "2304 maingrad STAGGER=$st" $R/mg2304-$st.log
done
for st in 1 0; do FLCE_STAGGER=$st timeout 150 ./build/flce bench --logit-std 4 --iters 5 --strategies auto --shapes 32768x4096x128256 > $R/a32-$st.log 2>&1; sum "32768 auto STAGGER=$st" $R/a32-$st.log; done
(cd build && FLCE_STAGGER=1 FLCE_REQUIRE_GPU=1 timeout 150 ctest -R '^test_gpu$' --output-on-failure > $R/ctest.log 2>&1; echo "ctest (STAGGER=1) rc=$?"; grep -E "tests passed|check failed" $R/ctest.log | head -5)
