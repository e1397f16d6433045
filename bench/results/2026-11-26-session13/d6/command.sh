#!/bin/bash
# session 13 d6 (4 GPUs, final runtime): test_tp, then tp_compare at tp = 2 and 4 with --timeline (issue 20)
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d6; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d6.tgz d6); }
device_env $R/env.txt > /dev/null
t0=$(date +%s)
device_build "$R/build.log" || { echo build failed; tail -20 $R/build.log; pack; exit 1; }
export FLCE_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 FLCE_CACHE_DIR=/tmp/flce-cache
(cd build && timeout 200 ctest -R '^test_tp' --output-on-failure) > $R/test_tp.log 2>&1; grep -E "Test #|tests passed" $R/test_tp.log
echo "tests $(( $(date +%s) - t0 )) s"
L=$PWD/build/libflce.so
pack
for tp in 2 4; do
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/nccl.%p.log FLCE_LIBRARY=$L \
    timeout 170 torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$R" --tag s13 --timeline > "$R/tpc-$tp.log" 2>&1
  echo "status $?" >> "$R/tpc-$tp.log"
  rm -f /tmp/nccl.*.log
  grep -h '^| [mf]\|status\|timeline' "$R/tpc-$tp.log" | grep -v provider | cut -c1-150
  echo "t $(( $(date +%s) - t0 )) s"
  pack
done
