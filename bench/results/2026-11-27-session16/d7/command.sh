#!/bin/bash
# session 16 d7: ncu at the base clock of the logits kernel (AUTO's compact pass, 8192×4096×128256),
# in 2-CTA clusters (default) and without (FLCE_LOGITS_CLUSTER=0), and cuBLAS's logits GEMM
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d7; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d7.tgz d7); }
trap pack EXIT
device_env $R/env.txt > /dev/null
cat device-commit.txt >> $R/env.txt
device_build "$R/build.log" || exit 1
export FLCE_CACHE_DIR=/tmp/flce-cache
S=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --metrics sm__cycles_elapsed.avg.per_second,lts__t_bytes.sum,dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum)
B=(./build/flce bench --strategies auto --logit-std 4 --warmup 0 --iters 1 --sets 1 --shapes 8192x4096x128256)
"${B[@]}" > /dev/null 2>&1; FLCE_LOGITS_CLUSTER=0 "${B[@]}" > /dev/null 2>&1
keep='Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|DRAM Throughput|L2 Cache Throughput|Issue Slots|Warp Cycles Per Issued|Stall (Long|Barrier|Wait|Math|MIO|LG|Short|Not)|lts__t_bytes|dram__bytes|xbar2l1tex|cycles_elapsed'
for c in -1 0; do
  FLCE_LOGITS_CLUSTER=$c timeout 90 ncu --clock-control base "${S[@]}" -k regex:'^flce_logits$' -c 1 "${B[@]}" > $R/ncu-logits-c$c.txt 2>&1
  echo "== flce logits cluster=$c"; grep -E "$keep" $R/ncu-logits-c$c.txt | head -24
done
timeout 90 ncu --clock-control base "${S[@]}" --profile-from-start off -c 1 python3 bench/role_gemms.py 8192x4096x128256 --roles logits > $R/ncu-cublas-logits.txt 2>&1
echo "== cublas (first GEMM)"; grep -E "$keep|nvjet|sm90" $R/ncu-cublas-logits.txt | head -26
