#!/usr/bin/env bash
# session 6, call 4: compare.py on the five shapes, both logit regimes; then the binding's test suite
cd "$(dirname "$0")"
. bench/device_lib.sh
t0=$(date +%s)
device_build "$OUT/build.log" || exit 1
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=/tmp/flce-cache PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 330 python3 bench/compare.py --shapes 8192x4096x128256,8192x2304x256000,4096x2048x32000,32768x4096x128256,512x4096x128256 \
  --stds 4,0.5 --providers cublas-floor,torch-compile,flce-default,flce-main-grad --out-dir "$OUT/cmp" > "$OUT/compare.log" 2>&1
echo "compare status $? after $(( $(date +%s) - t0 ))s"
grep -A8 "^### Summary" "$OUT/compare.log"
left=$(( 560 - ($(date +%s) - t0) ))
timeout $left python3 python/test_binding.py > "$OUT/test_binding.log" 2>&1
echo "test_binding status $? (limit ${left}s)"; grep -v "^ok" "$OUT/test_binding.log" | tail -8
echo "total $(( $(date +%s) - t0 ))s"
