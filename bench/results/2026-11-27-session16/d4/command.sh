#!/bin/bash
# session 16 d4 (4 GPUs, warm after d3): tp_compare at tp = 4 with the clustered logits pass
cd "$(dirname "$0")"
R=/tmp/d4; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d4.tgz d4); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || { . bench/device_lib.sh; device_build "$R/build.log" || exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 FLCE_CACHE_DIR=/tmp/flce-cache
FLCE_LIBRARY=$PWD/build/libflce.so timeout 200 torchrun --nproc_per_node=4 bench/tp_compare.py --out "$R" --tag s16 > "$R/tpc-4.log" 2>&1
echo "status $?"
grep -h '^| [mf]\|adds' "$R/tpc-4.log" | grep -v provider | cut -c1-160
