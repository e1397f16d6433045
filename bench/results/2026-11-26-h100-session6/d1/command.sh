#!/usr/bin/env bash
# session 6, call 1 (commit 13335e8): README test command (GPU required), compare five shapes, A/B grad streams
cd "$(dirname "$0")"
t0=$(date +%s)
DEVICE_CI_PARTS=readme bash bench/device_ci.sh > "$OUT/ci.txt" 2>&1
echo "ci status $? after $(( $(date +%s) - t0 ))s"; tail -9 "$OUT/ci.txt"
mkdir -p "$OUT/cmp"
OUT=$OUT/cmp COMPARE_ARGS="--stds 4 --providers cublas-floor,torch-compile,flce-default" timeout 300 bash bench/device_session.sh compare --budget 280 > /dev/null 2>&1
grep -E "^###|cublas-floor|torch-compile|flce-default" "$OUT/cmp/session.log"
for i in 1 2; do for e in 1 0; do
  FLCE_GRAD_STREAMS=$e timeout 90 ./build/flce bench --shapes 8192x2304x256000,512x4096x128256,4096x2048x32000 --strategies auto --logit-std 4 --iters 20 > "$OUT/ab-$i-gs$e.md" 2>&1
  grep '^| [0-9]' "$OUT/ab-$i-gs$e.md" | sed "s/^/gs=$e /"
done; done
