#!/bin/bash
# session 19 d6 (4 GPUs), the final runtime/templates: the README command on a fresh copy (GPUs 0, 1;
# bench/device_ci.sh readme, FLCE_REQUIRE_GPU=1) beside the 2000-case fuzz of both seeds (GPUs 2, 3)
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d6; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d6.tgz d6); }
trap pack EXIT
device_env $R/env.txt > /dev/null; head -8 $R/env.txt
t0=$(date +%s)
rm -rf /tmp/ci-tree && mkdir /tmp/ci-tree && cp -r . /tmp/ci-tree/ && rm -rf /tmp/ci-tree/build
device_build "$R/build.log" || exit 1
export NCCL_NVLS_ENABLE=0
for g in 2 3; do
  seed=$([ $g = 2 ] && echo 20261122 || echo 20261127)
  (CUDA_VISIBLE_DEVICES=$g FLCE_CACHE_DIR=/tmp/flce-cache-fuzz$g timeout 455 ./build/flce fuzz --seed $seed --cases 2000 --jobs 16 --time-limit 420 > $R/fuzz-$seed.log 2>&1; echo "fuzz rc=$? at $(( $(date +%s) - t0 )) s" >> $R/fuzz-$seed.log) &
done
(cd /tmp/ci-tree && CUDA_VISIBLE_DEVICES=0,1 DEVICE_CI_PARTS=readme OUT=$R/ci timeout 500 bash bench/device_ci.sh > $R/device_ci.log 2>&1; echo "device_ci rc=$? at $(( $(date +%s) - t0 )) s" >> $R/device_ci.log)
wait
for f in $R/fuzz-*.log; do echo "== $f"; tr '\r' '\n' < $f | grep -v "^flce fuzz: [0-9]*/" | tail -4; grep -a "FAIL" $f | cut -c1-300 | head -5; done
tail -25 $R/device_ci.log
echo "t $(( $(date +%s) - t0 )) s"
true
