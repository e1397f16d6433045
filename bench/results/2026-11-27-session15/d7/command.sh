#!/bin/bash
# session 15 d7 (4 GPUs), final runtime/templates: test_tp*, the 2000-case fuzz on GPU 3 (background);
# tp_compare at tp = 4 and 2: free-running, aligned and queued step times
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d7; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d7.tgz d7); }
trap pack EXIT
device_env $R/env.txt > /dev/null
cat device-commit.txt >> $R/env.txt; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt
head -9 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || { echo build failed; tail -20 $R/build.log; exit 1; }
export FLCE_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 FLCE_CACHE_DIR=/tmp/flce-cache
(CUDA_VISIBLE_DEVICES=3 FLCE_CACHE_DIR=/tmp/flce-cache-fuzz timeout 420 ./build/flce fuzz --seed 20261122 --cases 2000 --jobs 16 --time-limit 400 > $R/fuzz.log 2>&1; echo "fuzz rc=$? at $(( $(date +%s) - t0 )) s" >> $R/fuzz.log) &
fz=$!
(cd build && timeout 200 ctest -R '^test_tp' --output-on-failure) > $R/test_tp.log 2>&1; grep -E "Test #|tests passed|check failed" $R/test_tp.log | head -12
echo "tests $(( $(date +%s) - t0 )) s"
wait $fz; grep -a "of 2000" $R/fuzz.log | tail -1; tail -1 $R/fuzz.log
L=$PWD/build/libflce.so
for tp in 4 2; do
  FLCE_LIBRARY=$L timeout 150 torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$R" --tag s15b > "$R/tpc-$tp.log" 2>&1
  echo "status $?" >> "$R/tpc-$tp.log"
  grep -h '^| [mf]\|status\|adds' "$R/tpc-$tp.log" | grep -v provider | cut -c1-150
  echo "t $(( $(date +%s) - t0 )) s"
done
