#!/bin/bash
# session 19 d7 (2 GPUs), after the review commit: the README command on a fresh copy
# (bench/device_ci.sh readme, FLCE_REQUIRE_GPU=1; test_tp* at tp = 2)
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d7; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d7.tgz d7); }
trap pack EXIT
device_env $R/env.txt > /dev/null; head -6 $R/env.txt
t0=$(date +%s)
export NCCL_NVLS_ENABLE=0
rm -rf /tmp/ci-tree && mkdir /tmp/ci-tree && cp -r . /tmp/ci-tree/ && rm -rf /tmp/ci-tree/build
(cd /tmp/ci-tree && DEVICE_CI_PARTS=readme OUT=$R/ci timeout 540 bash bench/device_ci.sh > $R/device_ci.log 2>&1; echo "device_ci rc=$? at $(( $(date +%s) - t0 )) s" >> $R/device_ci.log)
tail -14 $R/device_ci.log
true
