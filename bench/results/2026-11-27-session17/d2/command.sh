#!/bin/bash
# session 17 d2 (4 GPUs): test_tp* incl. test_tp_register (tp 2 and 4); tp_compare tp 4 and 2 with
# flce-nccl-reg (A/B in both orders), NCCL's collective log on, timeline; the shard's step sustained
# (compare.py, 100 iters) on one GPU alone vs on all four at once
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d2; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d2.tgz d2); }
trap pack EXIT
device_env $R/env.txt > /dev/null; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt; head -9 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || exit 1
export FLCE_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FLCE_CACHE_DIR=/tmp/flce-cache
(cd build && timeout 300 ctest -R '^test_tp' --output-on-failure) > $R/test_tp.log 2>&1; grep -E "Test #|tests passed|check failed|FAIL" $R/test_tp.log | head -12
echo "tests $(( $(date +%s) - t0 )) s"
L=$PWD/build/libflce.so
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL
for tp in 4 2; do
  NCCL_DEBUG_FILE=/tmp/nccl-$tp.%p.log FLCE_LIBRARY=$L timeout 200 torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$R" --tag s17 --timeline \
     --providers megatron,flce-nccl,flce-nccl-reg,flce-local > "$R/tpc-$tp.log" 2>&1
  echo "status $?" >> "$R/tpc-$tp.log"
  grep -h '^| [mf]\|status\|adds' "$R/tpc-$tp.log" | grep -v provider | cut -c1-150
  NCCL_DEBUG_FILE=/tmp/nccl-$tp-b.%p.log FLCE_LIBRARY=$L timeout 120 torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$R" --tag s17b \
     --providers flce-nccl-reg,flce-nccl > "$R/tpc-$tp-b.log" 2>&1
  echo "status $?" >> "$R/tpc-$tp-b.log"
  grep -h '^| [mf]\|status' "$R/tpc-$tp-b.log" | grep -v provider | cut -c1-150
  echo "t $(( $(date +%s) - t0 )) s"
done
unset NCCL_DEBUG NCCL_DEBUG_SUBSYS
C="python3 bench/compare.py --shapes 8192x4096x32064 --stds 4 --providers cublas-floor,flce-default --iters 100"
mkdir -p $R/alone $R/four
CUDA_VISIBLE_DEVICES=0 FLCE_LIBRARY=$L timeout 150 $C --out-dir $R/alone --tag alone > $R/sust-alone.log 2>&1 || true
for g in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$g FLCE_LIBRARY=$L timeout 150 $C --out-dir $R/four --tag four$g > $R/sust-four$g.log 2>&1 & done; wait
grep -h "^| cublas-floor \|^| flce-default " $R/alone/*.md $R/four/*.md 2>/dev/null | cut -c1-120
echo "t $(( $(date +%s) - t0 )) s"
