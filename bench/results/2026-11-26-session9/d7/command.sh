#!/usr/bin/env bash
# session 9 d7: the README command at the review commit (FLCE_REQUIRE_GPU=1, fresh export), then test_gpu_dz_convert
set -u
cd "$(dirname "$0")"
R=$OUT/d7; mkdir -p $R
DEVICE_CI_PARTS=readme OUT=$R/ci timeout 450 bash bench/device_ci.sh > $R/ci.txt 2>&1
tail -10 $R/ci.txt
FLCE_REQUIRE_GPU=1 timeout 100 ctest --test-dir build -R '^test_gpu_dz_convert$' --output-on-failure > $R/dzconv.log 2>&1; grep -E "tests passed|Failed" $R/dzconv.log
(cd $R && tar czf all.tgz ci ci.txt dzconv.log 2>/dev/null)
