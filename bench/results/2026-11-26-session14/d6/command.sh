#!/bin/bash
# session 14 d6 (4 GPUs): the 2000-case fuzz on GPU 3 in the background; test_tp* (row-scaled
# logits under TP: test_tp_qrows); tp_compare at tp = 2 with and without FLCE_QROWS=0 (GPUs 0-1),
# then tp = 4 once the fuzz is done
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d6; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d6.tgz d6); }
trap pack EXIT
device_env $R/env.txt > /dev/null
cat device-commit.txt >> $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || { echo build failed; tail -20 $R/build.log; exit 1; }
export FLCE_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 FLCE_CACHE_DIR=/tmp/flce-cache
(CUDA_VISIBLE_DEVICES=3 FLCE_CACHE_DIR=/tmp/flce-cache-fuzz timeout 420 ./build/flce fuzz --seed 20261122 --cases 2000 --jobs 16 --time-limit 400 > $R/fuzz.log 2>&1; echo "fuzz rc=$? at $(( $(date +%s) - t0 )) s" >> $R/fuzz.log) &
fz=$!
(cd build && timeout 200 ctest -R '^test_tp' --output-on-failure) > $R/test_tp.log 2>&1; grep -E "Test #|tests passed|check failed" $R/test_tp.log | head -12
echo "tests $(( $(date +%s) - t0 )) s"
L=$PWD/build/libflce.so
tpc() { # tp tag [env]
  local tp=$1 tag=$2; shift 2
  env "$@" CUDA_VISIBLE_DEVICES=$([ $tp = 2 ] && echo 0,1 || echo 0,1,2,3) FLCE_LIBRARY=$L timeout 110 torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$R" --tag $tag --timeline > "$R/tpc-$tp-$tag.log" 2>&1
  echo "status $?" >> "$R/tpc-$tp-$tag.log"
  echo "== tp $tp $tag $*"; grep -h '^| [mf]\|status' "$R/tpc-$tp-$tag.log" | grep -v provider | cut -c1-160
  echo "t $(( $(date +%s) - t0 )) s"
}
tpc 2 s14 DEFAULTS=1
tpc 2 s14-noqrows FLCE_QROWS=0
wait $fz; tail -4 $R/fuzz.log | cut -c1-300
tpc 4 s14 DEFAULTS=1
