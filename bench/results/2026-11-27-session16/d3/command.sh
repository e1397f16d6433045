#!/bin/bash
# session 16 d3 (4 GPUs), final runtime/templates: the README test command on a fresh copy (GPUs 0,1:
# test_tp at tp = 2), the 2000-case fuzz (GPU 3) and compare.py --roles (GPU 2), all at once
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d3; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d3.tgz d3); }
trap pack EXIT
device_env $R/env.txt > /dev/null
cat device-commit.txt >> $R/env.txt; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt
head -9 $R/env.txt
t0=$(date +%s)
rm -rf /tmp/ci-tree && mkdir /tmp/ci-tree && cp -r . /tmp/ci-tree/ && rm -rf /tmp/ci-tree/build
(cd /tmp/ci-tree && CUDA_VISIBLE_DEVICES=0,1 DEVICE_CI_PARTS=readme OUT=$R/ci timeout 560 bash bench/device_ci.sh > $R/device_ci.log 2>&1; echo "device_ci rc=$? at $(( $(date +%s) - t0 )) s" >> $R/device_ci.log) &
ci=$!
device_build "$R/build.log" || { echo build failed; tail -20 $R/build.log; exit 1; }
echo "built at $(( $(date +%s) - t0 )) s"
(CUDA_VISIBLE_DEVICES=3 FLCE_CACHE_DIR=/tmp/flce-cache-fuzz timeout 480 ./build/flce fuzz --seed 20261122 --cases 2000 --jobs 16 --time-limit 460 > $R/fuzz.log 2>&1; echo "fuzz rc=$? at $(( $(date +%s) - t0 )) s" >> $R/fuzz.log) &
fz=$!
CUDA_VISIBLE_DEVICES=2 FLCE_CACHE_DIR=/tmp/flce-cache-cmp FLCE_LIBRARY=$PWD/build/libflce.so FLCE_BIN=$PWD/build/flce timeout 460 python3 bench/compare.py --out-dir $R --roles --tag s16 > $R/compare.log 2>&1; echo "compare rc=$? at $(( $(date +%s) - t0 )) s"
grep -h -A16 '^### Summary' $R/*.md | head -40
wait $fz; grep -a "of 2000" $R/fuzz.log | tail -1; tail -c 400 $R/fuzz.log; echo
wait $ci; tail -30 $R/device_ci.log
echo "t $(( $(date +%s) - t0 )) s"
