#!/bin/bash
# s5 (session 32, one H200): forward KL against the floor and torch.compile at the three shapes
# (bench/distill_compare.py, providers cublas-floor, flce, torch-compile), and the top-k call at
# 8192x4096x128256 (bench/topk_compare.py), on the tree in .device-commit.
set -u; mkdir -p $OUT; s=$(date +%s)
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
cmake --preset default > /tmp/b.log 2>&1 && cmake --build --preset default --target flce -j16 >> /tmp/b.log 2>&1; echo "build rc=$? $(( $(date +%s)-s )) s"
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache
timeout 260 python3 bench/distill_compare.py --shapes 8192x4096x128256,8192x2048x151936:4096,4096x2048x32000 \
  --providers cublas-floor,flce,torch-compile --out $OUT > $OUT/cmp_fkl.log 2>&1; echo "distill rc=$? $(( $(date +%s)-s )) s"
grep "^|" $OUT/cmp_fkl.log | tail -12
timeout 150 python3 bench/topk_compare.py --shapes 8192x4096x128256 --out $OUT > $OUT/topk.log 2>&1; echo "topk rc=$? $(( $(date +%s)-s )) s"
grep "^|" $OUT/topk.log | tail -6
ls $OUT
