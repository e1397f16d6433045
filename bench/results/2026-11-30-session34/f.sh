#!/bin/bash
# f.sh (written in session 34 for the next session, session 33's f2.sh): the final tree (commit in .device-commit) from a fresh build: the README's two commands with
# GPU tests required (bench/device_ci.sh readme).
set -u; mkdir -p $OUT/ci; s=$(date +%s)
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
rm -rf build
OUT=$OUT/ci DEVICE_CI_PARTS=readme timeout 540 bash bench/device_ci.sh > $OUT/ci/out.txt 2>&1; echo "readme rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ci/out.txt
grep -E "tests passed|tests failed|\*\*\*Failed|check failed" $OUT/ci/test.log | tail -8
cd $OUT && tar czf ci.tgz ci && rm -rf ci; ls
