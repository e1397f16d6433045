#!/bin/bash
# x4 (session 30, nvidia-h200-x2): main at the start, nothing changed. python/test_tp.py under torchrun
# (its fp32 top-k teacher case and the whole_vs_shard refactor ran only on the stand-in), then
# bench/distill_tp_compare.py at the issue's two smaller shapes (forward KL) and JSD(0.5) at the large one
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); cd $REPO
mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ nvidia-smi -L; date -u; cat .device-commit; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.nccl.version())"; } > $OUT/env.txt 2>&1
t0=$(date +%s)
(cmake --preset default && cmake --build --preset default -j32) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 ))s"
export FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=$PWD/build/test-cache FLCE_LIBRARY=$PWD/build/libflce.so
t1=$(date +%s)
timeout 200 torchrun --nproc_per_node=2 python/test_tp.py > $OUT/py_test_tp.log 2>&1; echo "py test_tp rc=$? $(( $(date +%s) - t1 ))s"
grep -E "FAIL|Error|distillation|top-k|all passed" $OUT/py_test_tp.log | tail -10
t1=$(date +%s)
timeout 200 torchrun --nproc_per_node=2 bench/distill_tp_compare.py --shapes 8192x2048x151936,4096x2048x32000 --out $OUT > $OUT/bench_tp_fkl.log 2>&1; echo "bench tp fkl rc=$? $(( $(date +%s) - t1 ))s"
grep '^{' $OUT/bench_tp_fkl.log; tail -4 $OUT/bench_tp_fkl.log
t1=$(date +%s)
timeout 150 torchrun --nproc_per_node=2 bench/distill_tp_compare.py --divergence jsd --beta 0.5 --out $OUT > $OUT/bench_tp_jsd.log 2>&1; echo "bench tp jsd rc=$? $(( $(date +%s) - t1 ))s"
grep '^{' $OUT/bench_tp_jsd.log; tail -4 $OUT/bench_tp_jsd.log
cd $OUT && tar czf logs.tgz *.log *.txt *.json *.md 2>/dev/null; ls
