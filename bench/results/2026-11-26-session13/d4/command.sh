#!/usr/bin/env bash
# session 13 d4: compare.py, five shapes × both logit stds, every default provider + GEMM roles (issue 13)
set -u
cd "$(dirname "$0")"
R=/tmp/d4; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d4.tgz d4); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
FLCE_LIBRARY=$PWD/build/libflce.so FLCE_BIN=$PWD/build/flce timeout 540 python3 bench/compare.py --out-dir $R --roles --tag s13 > $R/compare.log 2>&1
echo "compare status $?"
grep -h -A16 '^### Summary' $R/*.md | head -40
