#!/usr/bin/env bash
# session 11 d14: the 2000-case fuzz (default), 400 cases with the register dZ operand, the binding's per-step latency (issue 20)
set -u
cd "$(dirname "$0")"
R=/tmp/d14; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
pack() { (cd /tmp && tar czf $OUT/d14.tgz d14); }
cat device-commit.txt > $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default >> $R/build.log 2>&1) || { tail -30 $R/build.log; pack; exit 1; }
t0=$(date +%s); timeout 330 ./build/flce fuzz --seed 20261122 --cases 2000 --jobs 16 --time-limit 320 > $R/fuzz.log 2>&1; echo "fuzz 2000 rc=$? in $(( $(date +%s) - t0 )) s"; tail -4 $R/fuzz.log
t0=$(date +%s); FLCE_DZ_OPERAND=1 FLCE_CACHE_DIR=/tmp/fc-op timeout 120 ./build/flce fuzz --seed 20261126 --cases 400 --jobs 16 --time-limit 110 > $R/fuzz_op.log 2>&1; echo "fuzz dzop 400 rc=$? in $(( $(date +%s) - t0 )) s"; tail -4 $R/fuzz_op.log
FLCE_LIBRARY=$PWD/build/libflce.so PYTHONPATH=$PWD/python timeout 60 python3 bench/host_latency.py > $R/host_latency.log 2>&1; echo "host_latency rc=$?"; tail -3 $R/host_latency.log
timeout 60 ./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto --shapes 8192x4096x32064 > $R/bench_32064.log 2>&1; grep -E "^\| 4 \| auto|timeline auto: (all|logits|dz|dH|dW|runs)" $R/bench_32064.log | cut -c1-200
pack
