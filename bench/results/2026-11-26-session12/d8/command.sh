#!/usr/bin/env bash
# session 12 d8: the README's test command on the GPU (FLCE_REQUIRE_GPU=1, fresh export of HEAD), then 400 fuzz cases with FLCE_QROWS=1
set -u
cd "$(dirname "$0")"
R=/tmp/d8; rm -rf $R; mkdir -p $R
cat device-commit.txt > $R/env.txt
DEVICE_CI_PARTS=readme OUT=$R/ci timeout 420 bash bench/device_ci.sh > $R/device_ci.log 2>&1; echo "device_ci rc=$?"
tail -22 $R/device_ci.log
t0=$(date +%s); FLCE_QROWS=1 FLCE_CACHE_DIR=/tmp/fc-q timeout 140 ./build/flce fuzz --seed 20261126 --cases 400 --jobs 16 --time-limit 125 > $R/fuzz_q.log 2>&1; echo "fuzz qrows 400 rc=$? in $(( $(date +%s) - t0 )) s"; tail -5 $R/fuzz_q.log
(cd /tmp && tar czf $OUT/d8.tgz d8)
