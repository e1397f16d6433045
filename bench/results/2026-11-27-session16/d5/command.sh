#!/bin/bash
# session 16 d5 (4 GPUs, warm): tp_compare at tp = 4, FLCE_LOGITS_CLUSTER=0 vs unset, alternated twice
cd "$(dirname "$0")"
R=/tmp/d5; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d5.tgz d5); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || { . bench/device_lib.sh; device_build "$R/build.log" || exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 FLCE_CACHE_DIR=/tmp/flce-cache
for i in 1 2; do for c in 0 -1; do
  FLCE_LOGITS_CLUSTER=$c FLCE_LIBRARY=$PWD/build/libflce.so timeout 100 torchrun --nproc_per_node=4 bench/tp_compare.py --out "$R/c$c-$i" --tag s16c$c > "$R/tpc-c$c-$i.log" 2>&1
  echo "cluster=$c #$i status $?"; grep -h '^| [mf]' "$R/tpc-c$c-$i.log" | grep -v provider | cut -c1-60
done; done
