#!/bin/bash
# x2 (session 29, nvidia-h200-x2): the fp32-logits path under TP: build, test_distill_tp (fake NCCL,
# new fp32-path cases), test_distill_gpu and test_topk_gpu (the row kernel changed), python/test_tp.py
# under torchrun with real NCCL (its new reverse KL / JSD / fp32 distillation checks), then a bench
# of the fp32 path under TP (reverse KL) against the one-GPU shard
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); cd $REPO
mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
(cmake --preset default && cmake --build --preset default -j32) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 ))s"
export FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=$PWD/build/test-cache
for t in test_distill_tp test_distill_gpu test_topk_gpu; do
  t1=$(date +%s)
  timeout 300 build/tests/$t > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc $(( $(date +%s) - t1 ))s"; grep -E "FAIL|check failed|passed|failed|  " $OUT/$t.log | head -24
done
export FLCE_LIBRARY=$PWD/build/libflce.so
t1=$(date +%s)
timeout 200 torchrun --nproc_per_node=2 python/test_tp.py > $OUT/py_test_tp.log 2>&1; echo "py test_tp rc=$? $(( $(date +%s) - t1 ))s"
grep -E "FAIL|Error|distillation|all passed" $OUT/py_test_tp.log | tail -6
t1=$(date +%s)
timeout 150 torchrun --nproc_per_node=2 bench/distill_tp_compare.py --divergence reverse_kl --out $OUT > $OUT/bench_tp_rkl.log 2>&1; echo "bench tp reverse_kl rc=$? $(( $(date +%s) - t1 ))s"
grep '^{' $OUT/bench_tp_rkl.log
cd $OUT && tar czf logs.tgz *.log *.txt *.json *.md 2>/dev/null; ls
