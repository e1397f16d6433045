#!/bin/bash
# f2 (session 31): the final tree (commit in .device-commit) from a fresh build: the README's two commands
# with GPU tests required (device_ci.sh readme); then q2.py (the fp32 logits pass's rounding against fp64,
# for the top-k log-prob target) on that build.
set -u; mkdir -p $OUT/ci; s=$(date +%s)
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
rm -rf build
OUT=$OUT/ci DEVICE_CI_PARTS=readme timeout 500 bash bench/device_ci.sh > $OUT/ci/out.txt 2>&1; echo "readme rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ci/out.txt
grep -E "tests passed|tests failed|\*\*\*Failed|check failed" $OUT/ci/test.log | tail -8
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/test-cache
timeout 70 python3 .whl/q2.py 2>&1 | grep -v -i warn > $OUT/q2.log; echo "q2 rc=$?"; cat $OUT/q2.log
cd $OUT && tar czf ci.tgz ci && rm -rf ci; ls
