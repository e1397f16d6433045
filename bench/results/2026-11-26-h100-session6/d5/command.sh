#!/usr/bin/env bash
# session 6, call 5: README test command (GPU required) at the kernel-size commits; then flce bench
# of this tree against 132ac89 (before them), cold caches first (first call = NVRTC), then warm.
cd "$(dirname "$0")"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
DEVICE_CI_PARTS=readme bash bench/device_ci.sh > "$OUT/ci.txt" 2>&1
echo "ci status $? after $(el)s"; tail -6 "$OUT/ci.txt"
(cd abtree && cmake --preset default > /dev/null && cmake --build --preset default --target flce_tool -j16) > "$OUT/ab-build.log" 2>&1 || { echo "abtree build failed"; tail -5 "$OUT/ab-build.log"; }
echo "abtree built after $(el)s"
for i in 1 2; do for tr in new old; do
  [ "$(el)" -gt 430 ] && { echo "stopping at $(el)s"; break 2; }
  bin=./build/flce; [ $tr = old ] && bin=abtree/build/flce
  FLCE_CACHE_DIR=/tmp/fc-$tr CUDA_CACHE_PATH=/tmp/nv-$tr timeout 60 $bin bench --shapes 8192x4096x128256,8192x4096x50257 --strategies auto --logit-std 4 --iters 20 > "$OUT/ab-$i-$tr.md" 2>&1
  grep '^| [0-9]' "$OUT/ab-$i-$tr.md" | awk -F'|' -v t="$i-$tr" '{print t, "ms", $4, "min", $5, "first", $10, "errs", $11, $13, $14}'
done; done
echo "total $(el)s"
