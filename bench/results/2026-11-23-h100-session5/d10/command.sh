#!/usr/bin/env bash
# session-5 final 2: the README's two commands at c9d4690+ (v23), then A/B FLCE_GRAD_STREAMS=0
cd "$(dirname "$0")"
t0=$(date +%s)
DEVICE_CI_PARTS=readme bash bench/device_ci.sh > "$OUT/ci.txt" 2>&1
echo "ci status $? after $(( $(date +%s) - t0 ))s"; tail -9 "$OUT/ci.txt"
for i in 1 2; do for e in 1 0; do
  FLCE_GRAD_STREAMS=$e timeout 60 ./build/flce bench --shapes 8192x4096x128256,8192x2304x256000 --strategies auto,chunked --logit-std 4 --iters 20 > "$OUT/ab-$i-gs$e.md" 2>&1
  grep '^| 4' "$OUT/ab-$i-gs$e.md" | sed "s/^/gs=$e /"
done; done
echo "total $(( $(date +%s) - t0 ))s"
