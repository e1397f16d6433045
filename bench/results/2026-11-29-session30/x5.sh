#!/bin/bash
# x5 (session 30, nvidia-h200-x2): distill_tp_compare.py's Megatron-style PyTorch TP for reverse KL and
# JSD(0.5) (new: it kept forward KL only) against flce-tp, 8192x4096x128256 bf16
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); cd $REPO
mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
(cmake --preset default && cmake --build --preset default -j32) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export FLCE_CACHE_DIR=$PWD/build/test-cache FLCE_LIBRARY=$PWD/build/libflce.so
for dv in reverse_kl jsd; do
  t1=$(date +%s)
  timeout 90 torchrun --nproc_per_node=2 bench/distill_tp_compare.py --divergence $dv --beta 0.5 --providers torch-tp,flce-tp --out $OUT > $OUT/bench_tp_$dv.log 2>&1; echo "$dv rc=$? $(( $(date +%s) - t1 ))s"
  grep '^{' $OUT/bench_tp_$dv.log | sort -u
done
