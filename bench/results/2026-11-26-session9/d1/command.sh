#!/usr/bin/env bash
# session 9 d1: README command at HEAD, soak, baseline timeline at the main shape
set -u
cd "$(dirname "$0")"
R=$OUT/d1; mkdir -p $R
nvidia-smi > $R/nvidia-smi.txt 2>&1
DEVICE_CI_PARTS=readme OUT=$R/ci timeout 420 bash bench/device_ci.sh > $R/ci.txt 2>&1
tail -30 $R/ci.txt
(cd $R && tar czf all.tgz ci ci.txt nvidia-smi.txt 2>/dev/null)
timeout 120 ctest --test-dir build -C Extra -L soak --output-on-failure > $R/soak.log 2>&1; tail -5 $R/soak.log
timeout 100 ./build/flce bench --shapes 8192x4096x128256 --strategies auto --iters 10 --timeline --json $R/bench.json > $R/bench.log 2>&1; tail -25 $R/bench.log
(cd $R && tar czf all.tgz ci ci.txt nvidia-smi.txt soak.log bench.log bench.json 2>/dev/null)
