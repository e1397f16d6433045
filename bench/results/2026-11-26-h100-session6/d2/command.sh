#!/usr/bin/env bash
# session 6, call 2 (commit 9cfdde7): test_concurrency x6; compare.py's flce-default at 512 tokens with FLCE_LOG=debug
cd "$(dirname "$0")"
. bench/device_lib.sh
device_build "$OUT/build.log" || exit 1
(cd build && FLCE_REQUIRE_GPU=1 ctest -R 'test_concurrency' --repeat until-fail:6 --output-on-failure) > "$OUT/conc.log" 2>&1
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=/tmp/flce-cache
FLCE_LOG=debug timeout 120 python3 bench/compare.py --shapes 512x4096x128256 --stds 4 --providers flce-default --out-dir "$OUT/c512" > "$OUT/c512.log" 2>&1
timeout 200 nsys profile ... # (nsys is not on the device's PATH: status 127)
FLCE_GRAD_STREAMS=1 ./build/flce bench --shapes 512x4096x128256 --strategies auto --iters 30
