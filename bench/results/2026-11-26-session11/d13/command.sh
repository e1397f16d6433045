#!/usr/bin/env bash
# session 11 d13: the README's test command on the GPU (FLCE_REQUIRE_GPU=1, fresh export of HEAD)
set -u
cd "$(dirname "$0")"
R=/tmp/d13; rm -rf $R; mkdir -p $R
cat device-commit.txt > $R/env.txt
DEVICE_CI_PARTS=readme OUT=$R/ci timeout 540 bash bench/device_ci.sh > $R/device_ci.log 2>&1; echo "device_ci rc=$?"
tail -25 $R/device_ci.log
(cd /tmp && tar czf $OUT/d13.tgz d13)
