#!/usr/bin/env bash
# session 9 d6: compare.py over the five shapes, both stds, with the portable and role rows (issues 13, 14, 19)
set -u
cd "$(dirname "$0")"
R=$OUT/d6; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
[ -x build/flce ] || (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default >> $R/build.log 2>&1)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active --format=csv > $R/smi.log
FLCE_LIBRARY=$PWD/build/libflce.so FLCE_BIN=$PWD/build/flce timeout 560 python3 bench/compare.py --out-dir $R --portable --roles --tag s9 > $R/compare.log 2>&1
echo "status $?" >> $R/compare.log
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active --format=csv >> $R/smi.log
grep -h '^|' $R/compare.log | head -120
(cd $R && tar czf all.tgz *.log *.json *.md 2>/dev/null)
