#!/usr/bin/env bash
# session 15 d8: the README test command on the GPU (FLCE_REQUIRE_GPU=1) at the final commit, fresh export
set -u
cd "$(dirname "$0")"
R=/tmp/d8; rm -rf $R; mkdir -p $R
cat device-commit.txt > $R/env.txt; nvidia-smi >> $R/env.txt 2>&1; date -u >> $R/env.txt
trap '(cd /tmp && tar czf $OUT/d8.tgz d8)' EXIT
DEVICE_CI_PARTS=readme OUT=$R/ci timeout 540 bash bench/device_ci.sh > $R/device_ci.log 2>&1; echo "device_ci rc=$?"
tail -24 $R/device_ci.log
