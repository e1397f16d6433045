#!/usr/bin/env bash
# session 6, call 6: per-kernel in-run times (flce bench --timeline, FLCE_GRAD_STREAMS=0) of this tree vs 132ac89 at 8192x4096x128256
cd "$(dirname "$0")"
t0=$(date +%s)
( cmake --preset default > /dev/null && cmake --build --preset default --target flce_tool -j8 ) > "$OUT/build.log" 2>&1 &
( cd abtree && cmake --preset default > /dev/null && cmake --build --preset default --target flce_tool -j8 ) > "$OUT/ab-build.log" 2>&1 &
wait
echo "built after $(( $(date +%s) - t0 ))s"
for i in 1 2; do for tr in new old; do
  bin=./build/flce; [ $tr = old ] && bin=abtree/build/flce
  FLCE_GRAD_STREAMS=0 FLCE_CACHE_DIR=/tmp/fc-$tr timeout 50 $bin bench --shapes 8192x4096x128256 --strategies auto --logit-std 4 --iters 15 --timeline > "$OUT/tl-$i-$tr.md" 2>&1
  grep -h '^|' "$OUT/tl-$i-$tr.md" | tail -3 | sed "s/^/$i-$tr /" | cut -c1-400
done; done
echo "total $(( $(date +%s) - t0 ))s"
