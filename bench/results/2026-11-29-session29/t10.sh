#!/bin/bash
# t10 (session 29): the fp32-logits path's speed for the divergences users pick besides forward KL:
# JSD(0.5) (LigerFusedLinearJSD's default) and reverse KL, against the floor, torch.compile and Liger
set -u
cd "$(dirname "$0")/.."
mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
pip install --no-deps --no-index .whl/liger_kernel-0.8.5-py3-none-any.whl > $OUT/pip.log 2>&1; echo "liger pip rc=$?"
t0=$(date +%s)
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 ))s"
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/test-cache
P=cublas-floor,flce,torch-compile,liger-jsd
t1=$(date +%s)
timeout 200 python3 bench/distill_compare.py --shapes 8192x4096x128256,4096x2048x32000 --divergence jsd --beta 0.5 --providers $P --tag jsd05 --out $OUT > $OUT/jsd.log 2>&1; echo "jsd rc=$? $(( $(date +%s) - t1 ))s"
grep "^|" $OUT/jsd.log | tail -9
t1=$(date +%s)
timeout 150 python3 bench/distill_compare.py --shapes 8192x4096x128256 --divergence reverse_kl --providers $P --tag rkl --out $OUT > $OUT/rkl.log 2>&1; echo "rkl rc=$? $(( $(date +%s) - t1 ))s"
grep "^|" $OUT/rkl.log | tail -5
