#!/usr/bin/env bash
# session 15 d5: compare.py, all providers and roles, five shapes, both regimes (issue 13's table) at v43; then main-grad FLCE_CLUSTER A/B
set -u
cd "$(dirname "$0")"
R=/tmp/d5; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d5
pack() { (cd /tmp && tar czf $OUT/d5.tgz d5); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
FLCE_LIBRARY=$PWD/build/libflce.so FLCE_BIN=$PWD/build/flce timeout 400 python3 bench/compare.py --out-dir $R --roles --tag s15 > $R/compare.log 2>&1; echo "compare rc=$?"
grep -h -A14 '^### Summary' $R/*.md | head -40
sum() { echo "$1: $(grep -E '^\| (4|0.5) \| ' $2 | cut -d'|' -f3-6,9,14 | tr '\n' ' ')"; }
for i in 1 2; do for c in -1 2; do
  FLCE_CLUSTER=$c timeout 60 ./build/flce bench --logit-std 4 --iters 10 --strategies auto+maingrad --shapes 8192x4096x128256 > $R/mg-c$c-$i.log 2>&1; sum "8192 maingrad CLUSTER=$c $i" $R/mg-c$c-$i.log
done; done
