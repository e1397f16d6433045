#!/usr/bin/env bash
# session 15 d10: FLCE_LOGITS_LAG = 0 / 700 / 1400 / 2100 ns (second consumer warpgroup of the logits pass out of phase): forward and auto at 8192 tokens × 2, forward at 32768
set -u
cd "$(dirname "$0")"
R=/tmp/d10; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d10
pack() { (cd /tmp && tar czf $OUT/d10.tgz d10); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
sum() { echo "$1: $(grep -E '^\| (4|0.5) \| ' $2 | cut -d'|' -f3-5,14 | tr '\n' ' ') | $(grep -E 'timeline [^:]*: (logits|all)' $2 | awk '{printf "%s %s %s  ", $2, $3, $(NF-1)}')"; }
for i in 1 2; do for lag in 0 700 1400 2100; do
  FLCE_LOGITS_LAG=$lag timeout 60 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies forward,auto --shapes 8192x4096x128256 > $R/lag-$lag-$i.log 2>&1; sum "8192 LAG=$lag $i" $R/lag-$lag-$i.log
done; done
for lag in 0 1400; do
  FLCE_LOGITS_LAG=$lag timeout 90 ./build/flce bench --logit-std 4 --iters 5 --strategies forward --shapes 32768x4096x128256 > $R/lag32-$lag.log 2>&1; sum "32768 fwd LAG=$lag" $R/lag32-$lag.log
done
