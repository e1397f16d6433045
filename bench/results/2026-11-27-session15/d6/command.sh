#!/usr/bin/env bash
# session 15 d6: FLCE_ACC_PREFETCH=1 (warp-wide prefetch of the addend) vs 0 with bulk reductions: main-grad at three shapes, 32768 auto
set -u
cd "$(dirname "$0")"
R=/tmp/d6; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d6
pack() { (cd /tmp && tar czf $OUT/d6.tgz d6); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
sum() { echo "$1: $(grep -E '^\| (4|0.5) \| ' $2 | cut -d'|' -f3-6,9,14 | tr '\n' ' ')"; }
for i in 1 2; do for pf in 1 0; do
  FLCE_ACC_PREFETCH=$pf timeout 60 ./build/flce bench --logit-std 4 --iters 10 --strategies auto+maingrad --shapes 8192x4096x128256 > $R/mg-$pf-$i.log 2>&1; sum "8192 maingrad PF=$pf $i" $R/mg-$pf-$i.log
done; done
for pf in 1 0; do
  FLCE_ACC_PREFETCH=$pf timeout 60 ./build/flce bench --logit-std 4 --iters 20 --strategies auto+maingrad --shapes 512x4096x128256 > $R/mg512-$pf.log 2>&1; sum "512 maingrad PF=$pf" $R/mg512-$pf.log
  FLCE_ACC_PREFETCH=$pf timeout 80 ./build/flce bench --logit-std 4 --iters 10 --strategies auto+maingrad --shapes 8192x2304x256000 > $R/mg2304-$pf.log 2>&1; sum "2304 maingrad PF=$pf" $R/mg2304-$pf.log
done
for pf in 1 0; do FLCE_ACC_PREFETCH=$pf timeout 150 ./build/flce bench --logit-std 4 --iters 5 --strategies auto --shapes 32768x4096x128256 > $R/a32-$pf.log 2>&1; sum "32768 auto PF=$pf" $R/a32-$pf.log; done
