#!/bin/bash
set -u; cd "$(dirname "$0")/.."; mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
[ -f build/libflce.so ] || (cmake --preset default > /dev/null && cmake --build --preset default --target flce -j16 > /dev/null)
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/test-cache
timeout 200 python3 .whl/q5.py 2>&1 | grep -v -i warn | tee $OUT/q5.log
