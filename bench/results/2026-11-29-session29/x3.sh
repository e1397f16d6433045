#!/bin/bash
# x3 (session 29, nvidia-h200-x2): the teacher as top-k on fp32 inputs under TP: test_distill_tp
# (fake NCCL; its top-k case now in bf16 and fp32), python/test_tp.py under torchrun (real NCCL)
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); cd $REPO
mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
t0=$(date +%s)
(cmake --preset default && cmake --build --preset default -j32) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 ))s"
export FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=$PWD/build/test-cache
t1=$(date +%s)
timeout 200 build/tests/test_distill_tp > $OUT/test_distill_tp.log 2>&1; echo "test_distill_tp rc=$? $(( $(date +%s) - t1 ))s"
grep -E "FAIL|check failed|passed|failed|top-k" $OUT/test_distill_tp.log | head -12
export FLCE_LIBRARY=$PWD/build/libflce.so
t1=$(date +%s)
timeout 200 torchrun --nproc_per_node=2 python/test_tp.py > $OUT/py_test_tp.log 2>&1; echo "py test_tp rc=$? $(( $(date +%s) - t1 ))s"
grep -E "FAIL|Error|distillation|all passed" $OUT/py_test_tp.log | tail -6
