#!/usr/bin/env bash
# session 15 d2: v43 bulk reductions — SASS check, A/B FLCE_BULK_RED=1/0 (main-grad 8192 and 512, 32768 auto), ncu of main-grad dW, GPU tests
set -u
cd "$(dirname "$0")"
R=/tmp/d2; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d2
pack() { (cd /tmp && tar czf $OUT/d2.tgz d2); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
./build/flce gen --arch sm_90a --dtype bf16 --tokens 32768 --hidden 4096 --vocab 128256 --typical --role dw > $R/dw3.cu 2>&1
nvcc -std=c++17 -arch=sm_90a -cubin -o $R/dw3.cubin $R/dw3.cu > $R/nvcc.log 2>&1 && cuobjdump -sass $R/dw3.cubin > $R/dw3.sass 2>&1
echo "SASS: $(grep -oE 'UBLKRED[A-Z.0-9_]*|REDG[A-Z.0-9_]*|UBLKCP[A-Z.0-9_]*|SYNCS[A-Z.0-9_.]*|DEPBAR[A-Z.0-9_.]*|FENCE[A-Z.0-9_.]*' $R/dw3.sass | sort | uniq -c | tr '\n' ' ')"
sum() { echo "$1: $(grep -E '^\| (4|0.5) \| ' $2 | cut -d'|' -f3-6,9,14 | tr '\n' ' ') | $(grep -E 'timeline [^:]*: (dW|all)' $2 | awk '{printf "%s %s %s/%s  ", $2, $3, $(NF-1), $(NF-3)}')"; }
for i in 1 2; do for b in 1 0; do
  FLCE_BULK_RED=$b timeout 100 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies auto+maingrad --shapes 8192x4096x128256 > $R/mg-$b-$i.log 2>&1; sum "8192 maingrad BULK=$b $i" $R/mg-$b-$i.log
  FLCE_BULK_RED=$b timeout 60 ./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto+maingrad --shapes 512x4096x128256 > $R/mg512-$b-$i.log 2>&1; sum "512 maingrad BULK=$b $i" $R/mg512-$b-$i.log
done; done
timeout 100 ./build/flce bench --logit-std 4 --iters 10 --timeline --strategies auto --shapes 8192x4096x128256 > $R/auto.log 2>&1; sum "8192 auto" $R/auto.log
for b in 1 0; do FLCE_BULK_RED=$b timeout 150 ./build/flce bench --logit-std 4 --iters 5 --timeline --strategies auto --shapes 32768x4096x128256 > $R/a32-$b.log 2>&1; sum "32768 auto BULK=$b" $R/a32-$b.log; done
FLCE_GRAD_STREAMS=0 timeout 200 ncu --clock-control base --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --print-details all -k regex:'^flce_dw$' -s 1 -c 1 ./build/flce bench --strategies auto+maingrad --logit-std 4 --warmup 0 --iters 1 --sets 1 --shapes 8192x4096x128256 > $R/ncu-dw-mg-bulk.txt 2>&1
echo "== ncu maingrad bulk"; grep -E "Duration|SM Frequency|DRAM Throughput|L2 Cache Throughput|Compute \(SM\)|Stall (Barrier|Long|Wait|LG|MIO)" $R/ncu-dw-mg-bulk.txt | head -14
(cd build && FLCE_REQUIRE_GPU=1 timeout 240 ctest -R '^test_gpu$|test_gpu_qrows$|test_gpu_dh_splits' -j3 --output-on-failure > $R/ctest.log 2>&1; echo "ctest rc=$?"; grep -E "tests passed|Failed|check failed|FAIL" $R/ctest.log | head -10)
