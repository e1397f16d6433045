#!/bin/bash
# session 17 d3 (4 GPUs), final commit: test_tp* (tp 2, 4); tp_compare tp 4 and 2 with the new
# timeline (last of 3 queued steps); then the README test command on a fresh copy (GPUs 0,1) with
# the 2000-case fuzz on GPU 3 beside it
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d3; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d3.tgz d3); }
trap pack EXIT
device_env $R/env.txt > /dev/null; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt; head -9 $R/env.txt
t0=$(date +%s)
rm -rf /tmp/ci-tree && mkdir /tmp/ci-tree && cp -r . /tmp/ci-tree/ && rm -rf /tmp/ci-tree/build
device_build "$R/build.log" || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
(cd build && FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=/tmp/flce-cache timeout 300 ctest -R '^test_tp' --output-on-failure) > $R/test_tp.log 2>&1; grep -E "Test #|tests passed|check failed|FAIL" $R/test_tp.log | head -12
echo "tests $(( $(date +%s) - t0 )) s"
L=$PWD/build/libflce.so
for tp in 4 2; do
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/nccl-$tp.%p.log FLCE_CACHE_DIR=/tmp/flce-cache FLCE_LIBRARY=$L timeout 200 \
    torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$R" --tag s17c --timeline --providers megatron,flce-nccl,flce-split,flce-local > "$R/tpc-$tp.log" 2>&1
  echo "status $?" >> "$R/tpc-$tp.log"
  grep -h '^| [mf]\|status\|adds' "$R/tpc-$tp.log" | grep -v provider | cut -c1-150
  grep -h -A6 '^| rank | starts' $R/tp-timeline-*x$tp-*.md
  echo "t $(( $(date +%s) - t0 )) s"
done
(CUDA_VISIBLE_DEVICES=3 FLCE_CACHE_DIR=/tmp/flce-cache-fuzz timeout 330 ./build/flce fuzz --seed 20261127 --cases 2000 --jobs 16 --time-limit 310 > $R/fuzz.log 2>&1; echo "fuzz rc=$? at $(( $(date +%s) - t0 )) s" >> $R/fuzz.log) &
fz=$!
(cd /tmp/ci-tree && CUDA_VISIBLE_DEVICES=0,1 DEVICE_CI_PARTS=readme OUT=$R/ci timeout 400 bash bench/device_ci.sh > $R/device_ci.log 2>&1; echo "device_ci rc=$? at $(( $(date +%s) - t0 )) s" >> $R/device_ci.log)
wait $fz; grep -a "of 2000\|cases" $R/fuzz.log | tail -2; tail -c 300 $R/fuzz.log; echo
tail -25 $R/device_ci.log
echo "t $(( $(date +%s) - t0 )) s"
