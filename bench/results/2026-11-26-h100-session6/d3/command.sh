#!/usr/bin/env bash
# session 6, call 3 (commit a3bba9e): README test command (GPU required), A/B of the grad streams, compare five shapes
cd "$(dirname "$0")"
DEVICE_CI_PARTS=readme bash bench/device_ci.sh > "$OUT/ci.txt" 2>&1
for i in 1 2; do for e in 1 0; do
  FLCE_GRAD_STREAMS=$e timeout 100 ./build/flce bench --shapes 512x4096x128256,8192x2304x256000,32768x4096x128256 --strategies auto --logit-std 4 --iters 20 > "$OUT/ab-$i-gs$e.md" 2>&1
done; done
OUT=$OUT/cmp COMPARE_ARGS="--stds 4 --providers cublas-floor,torch-compile,flce-default" timeout 300 bash bench/device_session.sh compare --budget 280
