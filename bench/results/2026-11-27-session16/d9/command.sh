#!/usr/bin/env bash
# session 16 d9: the README test command on the GPU (FLCE_REQUIRE_GPU=1) at the final commit, fresh export
set -u
cd "$(dirname "$0")"
R=/tmp/d9; rm -rf $R; mkdir -p $R
cat device-commit.txt > $R/env.txt; nvidia-smi >> $R/env.txt 2>&1; date -u >> $R/env.txt
trap '(cd /tmp && tar czf $OUT/d9.tgz d9)' EXIT
DEVICE_CI_PARTS=readme OUT=$R/ci timeout 500 bash bench/device_ci.sh > $R/device_ci.log 2>&1; echo "device_ci rc=$?"
tail -12 $R/device_ci.log
