#!/usr/bin/env bash
# session 10 d10: the fuzz checker's compact allowance: case 1122, then the 2000-case fuzz
set -u
cd "$(dirname "$0")"
R=/tmp/d10; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
pack() { (cd /tmp && tar czf $OUT/d10.tgz d10); }
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j 16 >> $R/build.log 2>&1) || { tail -20 $R/build.log; pack; exit 1; }
timeout 60 ./build/flce fuzz --seed 20261122 --case 1122 > $R/case-1122.log 2>&1; echo "case 1122 status $?"; grep -E '^ *(dH|dW|db) ' $R/case-1122.log
FLCE_COMPACT=0 timeout 60 ./build/flce fuzz --seed 20261122 --case 1122 > $R/case-1122-compact0.log 2>&1; echo "compact0 status $?"
pack
timeout 400 ./build/flce fuzz --seed 20261122 --cases 2000 --jobs 16 --time-limit 390 > $R/fuzz.log 2>&1; echo "fuzz status $?" >> $R/fuzz.log
grep -v '^ok ' $R/fuzz.log | tr '\r' '\n' | grep -vE "^flce fuzz: [0-9]+/2000" | tail -12
pack
