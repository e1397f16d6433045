#!/usr/bin/env bash
# session 13 d7 (final code c61b902 + results): the README's test command on the GPU (FLCE_REQUIRE_GPU=1, fresh export of HEAD); the build kept in /tmp/b13 for d2's fuzz
set -u
cd "$(dirname "$0")"
R=/tmp/d7; rm -rf $R; mkdir -p $R
cat device-commit.txt > $R/env.txt; nvidia-smi >> $R/env.txt 2>&1; date -u >> $R/env.txt
trap '(cd /tmp && tar czf $OUT/d7.tgz d7)' EXIT
DEVICE_CI_PARTS=readme OUT=$R/ci timeout 540 bash bench/device_ci.sh > $R/device_ci.log 2>&1; echo "device_ci rc=$?"
tail -24 $R/device_ci.log
rm -rf /tmp/b13; cp -a build /tmp/b13 && echo "build kept in /tmp/b13"
