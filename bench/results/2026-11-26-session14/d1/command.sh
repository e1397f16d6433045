#!/usr/bin/env bash
# session 14 d1: 512x4096x128256 — where the time goes (clusters, qrows, dH width; ncu limits)
set -u
cd "$(dirname "$0")"
R=/tmp/d1; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d1
pack() { (cd /tmp && tar czf $OUT/d1.tgz d1); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
s=512x4096x128256
for i in 1 2; do for cfg in "FLCE_QROWS=0" "FLCE_QROWS=1" "FLCE_CLUSTER=2" "FLCE_QROWS=1 FLCE_CLUSTER=2" "FLCE_CLUSTER=2 FLCE_DH_BN=256" "FLCE_GRAD_STREAMS=0"; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 60 ./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto --shapes $s > $R/$s-$tag-$i.log 2>&1
  echo "[$cfg] $i: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|qref|combine|qscale|qlist|qdw|qdh|all)' $R/$s-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done
SHAPE=$s OUT=$R/ncu timeout 300 bash bench/ncu_limits.sh > $R/ncu.log 2>&1; echo "ncu rc=$?"
grep -E "^## |Duration|DRAM Throughput|L2 Cache Throughput|SM Busy|Grid Size|SM Frequency" $R/ncu/ncu-limits.md | head -80
