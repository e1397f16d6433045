#!/bin/bash
# m4 (session 33, one GPU): distill_compare on the final tree: forward KL at 8192x4096x128256 with flce at its
# default, 1536 and 1024 MiB against the floor and torch.compile; reverse KL there with flce default and
# 1536 MiB against torch.compile.
set -u; mkdir -p $OUT; s=$(date +%s)
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
cmake --preset default > /tmp/b.log 2>&1 && cmake --build --preset default --target flce -j16 >> /tmp/b.log 2>&1; echo "build rc=$? $(( $(date +%s)-s )) s"
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache
timeout 260 python3 bench/distill_compare.py --shapes 8192x4096x128256 \
  --providers cublas-floor,flce,flce@1536,flce@1024,torch-compile --out $OUT --tag m4 > $OUT/cmp_m4.log 2>&1; echo "distill rc=$? $(( $(date +%s)-s )) s"
grep "^|" $OUT/cmp_m4.log | tail -6
timeout 200 python3 bench/distill_compare.py --shapes 8192x4096x128256 --divergence reverse_kl \
  --providers flce,flce@1536,torch-compile --out $OUT --tag m4rkl > $OUT/cmp_m4rkl.log 2>&1; echo "rkl rc=$? $(( $(date +%s)-s )) s"
grep "^|" $OUT/cmp_m4rkl.log | tail -4
