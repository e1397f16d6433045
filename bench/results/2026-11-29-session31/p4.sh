#!/bin/bash
set -u; cd "$(dirname "$0")/.."; mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; nvidia-smi -q -d POWER,CLOCK | grep -E "Power Limit|Max Clocks|SM  " | head -12; } > $OUT/env.txt 2>&1
[ -f build/libflce.so ] || (cmake --preset default > /dev/null && cmake --build --preset default --target flce -j16 > /dev/null)
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/test-cache
timeout 150 python3 .whl/p4.py 2>&1 | grep -v -i warn | tee $OUT/p4.log
cat $OUT/env.txt
