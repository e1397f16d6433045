#!/bin/bash
# session 16 d6 (2 GPUs): tp_compare at tp = 2 at the final runtime (= 75b6b8f), two runs
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d6; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d6.tgz d6); }
trap pack EXIT
device_env $R/env.txt > /dev/null
cat device-commit.txt >> $R/env.txt; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt
device_build "$R/build.log" || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 FLCE_CACHE_DIR=/tmp/flce-cache
for i in 1 2; do
  FLCE_LIBRARY=$PWD/build/libflce.so timeout 120 torchrun --nproc_per_node=2 bench/tp_compare.py --out "$R/r$i" --tag s16 > "$R/tpc-2-$i.log" 2>&1
  echo "#$i status $?"; grep -h '^| [mf]\|adds' "$R/tpc-2-$i.log" | grep -v provider | cut -c1-160
done
