#!/bin/bash
# x1 (session 29, nvidia-h200-x2): build, the TP tests with real NCCL on 2 GPUs (test_tp and its
# variants, incl. topk_with_the_communicator_on_2_gpus; test_distill_tp through the fake), then
# python/test_tp.py under torchrun (CE, top-k, distillation checks), then bench/distill_tp_compare.py
set -u
cd "$(dirname "$0")/.."
mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ nvidia-smi -L; nvidia-smi topo -m; date -u; cat .device-commit; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.nccl.version())"; } > $OUT/env.txt 2>&1
t0=$(date +%s)
(cmake --preset default && cmake --build --preset default -j32) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 ))s"
export FLCE_REQUIRE_GPU=1
t1=$(date +%s)
(cd build && timeout 260 ctest -R "test_tp|test_distill_tp" --output-on-failure -j1) > $OUT/ctest_tp.log 2>&1; echo "ctest tp rc=$? $(( $(date +%s) - t1 ))s"
grep -E "Test #|tests passed|FAIL" $OUT/ctest_tp.log | tail -12
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/test-cache
t1=$(date +%s)
timeout 200 torchrun --nproc_per_node=2 python/test_tp.py > $OUT/py_test_tp.log 2>&1; echo "py test_tp rc=$? $(( $(date +%s) - t1 ))s"
grep -E "FAIL|passed|failed|Error" $OUT/py_test_tp.log | tail -8; tail -3 $OUT/py_test_tp.log
t1=$(date +%s)
timeout 180 torchrun --nproc_per_node=2 bench/distill_tp_compare.py --out $OUT > $OUT/bench_tp.log 2>&1; echo "bench tp rc=$? $(( $(date +%s) - t1 ))s"
tail -12 $OUT/bench_tp.log
cd $OUT && tar czf logs.tgz *.log *.txt *.json *.md 2>/dev/null; ls
