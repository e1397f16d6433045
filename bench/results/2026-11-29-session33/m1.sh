#!/bin/bash
# m1 (session 33, one GPU): a memory_budget given bounds the distillation's whole workspace; dWs added into the
# caller's 16-bit dW per chunk where no dWs buffer fits. The GPU tests that cover it (test_distill_gpu,
# test_distill_tp, test_options with the joinable prefetch threads), then distill_compare at 8192x4096x128256
# (forward KL) with flce at its default, 1536 and 1024 MiB against the floor and torch.compile, and the same at
# 8192x2048x151936:4096 with 1024 MiB.
set -u; mkdir -p $OUT; s=$(date +%s)
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
cmake --preset default > /tmp/b.log 2>&1 && cmake --build --preset default --target flce test_distill_gpu test_distill_tp fake_nccl test_options test_jit_parallel -j16 >> /tmp/b.log 2>&1; echo "build rc=$? $(( $(date +%s)-s )) s"; tail -3 /tmp/b.log
export FLCE_CACHE_DIR=$PWD/build/cache
(cd build && FLCE_REQUIRE_GPU=1 timeout 300 ctest -R "test_distill_gpu|test_distill_tp|test_options$|test_jit_parallel" -j4 --output-on-failure > $OUT/tests.log 2>&1; echo "tests rc=$? $(( $(date +%s)-s )) s")
grep -E "tests passed|Failed|Passed|\*\*\*" $OUT/tests.log | head -12
grep -E "per chunk|accumulator|once over" build/Testing/Temporary/LastTest.log | head -12
export FLCE_LIBRARY=$PWD/build/libflce.so
timeout 280 python3 bench/distill_compare.py --shapes 8192x4096x128256 \
  --providers cublas-floor,flce,flce@1536,flce@1024,torch-compile --out $OUT --tag m1 > $OUT/cmp_m1.log 2>&1; echo "distill rc=$? $(( $(date +%s)-s )) s"
grep "^|" $OUT/cmp_m1.log | tail -6
timeout 120 python3 bench/distill_compare.py --shapes 8192x2048x151936:4096 \
  --providers cublas-floor,flce,flce@1024 --out $OUT --tag m1b > $OUT/cmp_m1b.log 2>&1; echo "distill b rc=$? $(( $(date +%s)-s )) s"
grep "^|" $OUT/cmp_m1b.log | tail -4
ls $OUT
