#!/usr/bin/env bash
# session 15 d11: the tp = 4 shard's shape on one GPU: flce bench (C API) timeline, host_latency.py, step_gaps.py (queued Python step under the profiler)
set -u
cd "$(dirname "$0")"
R=/tmp/d11; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d11
pack() { (cd /tmp && tar czf $OUT/d11.tgz d11); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
timeout 60 ./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto --shapes 8192x4096x32064 > $R/bench.log 2>&1
grep -E '^\| 4 \| |timeline auto: ' $R/bench.log | grep -v runs | cut -c1-120
export FLCE_LIBRARY=$PWD/build/libflce.so PYTHONPATH=$PWD/python
timeout 120 python3 bench/host_latency.py > $R/host_latency.log 2>&1; tail -3 $R/host_latency.log
timeout 120 python3 bench/step_gaps.py 8192x4096x32064 4 > $R/step_gaps.log 2>&1; echo "rc=$?"; grep -E "idle before +[0-9]{3,}" $R/step_gaps.log | head -20; tail -2 $R/step_gaps.log
