# n1 (session 30): ncu of the distillation step's logits passes, compact (forward KL) vs plain with the
# bulk fp32 Z store (reverse KL, one chunk), 4096x4096x128256 bf16, at base clock
set -u; cd "$(dirname "$0")/.."; mkdir -p $OUT
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/test-cache
keep='^  [a-zA-Z_]+|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|DRAM Throughput|L2 Cache Throughput|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|Stall|Grid Size|Mem Pipes Busy|SM Busy|Bank|dram__bytes'
timeout 230 ncu --clock-control base --profile-from-start off -k regex:flce_logits \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
  python3 .whl/n1.py > $OUT/n1.txt 2>&1; echo "ncu rc=$?"
grep -E "$keep" $OUT/n1.txt | grep -vE '^==PROF==|^  *-' | head -150
