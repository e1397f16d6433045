#!/usr/bin/env bash
# session 15 d1: where flce-main-grad's time goes (timeline auto vs auto+maingrad, env A/Bs), forward at 32768 tokens, ncu of the dW kernels
set -u
cd "$(dirname "$0")"
R=/tmp/d1; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d1
pack() { (cd /tmp && tar czf $OUT/d1.tgz d1); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
S=8192x4096x128256
sum() { echo "$1: $(grep -E '^\| 4 \| ' $2 | cut -d'|' -f3-6,12-14 | tr '\n' ' ') | $(grep -E 'timeline [^:]*: ' $2 | grep -v runs | awk '{printf "%s %s %s/%s  ", $2, $3, $(NF-1), $(NF-3)}')"; }
for i in 1 2; do for cfg in "X=1" "FLCE_RED_ACC=0" "FLCE_GRAD_STREAMS=0"; do
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 100 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies auto,auto+maingrad --shapes $S > $R/mg-$tag-$i.log 2>&1
  sum "$S [$cfg] $i" $R/mg-$tag-$i.log
done; done
timeout 120 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies forward --shapes 8192x4096x128256,32768x4096x128256 > $R/fwd.log 2>&1
grep -E '^\| 4 \| |timeline' $R/fwd.log | head -20
# ncu: dW of auto (one launch, K = 8192, bf16 out) vs auto+maingrad (chunk 2: K = 2048, fp32 += by L2 reductions)
for st in auto auto+maingrad; do
  FLCE_GRAD_STREAMS=0 timeout 200 ncu --clock-control base --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --print-details all -k regex:'^flce_dw$' -s 1 -c 1 ./build/flce bench --strategies $st --logit-std 4 --warmup 0 --iters 1 --sets 1 --shapes $S > $R/ncu-dw-$st.txt 2>&1
  echo "== ncu $st"; grep -E "Duration|SM Frequency|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|lts__" $R/ncu-dw-$st.txt | head -30
done
