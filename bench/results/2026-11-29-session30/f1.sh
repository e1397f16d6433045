# f1 (session 30): the final tree (commit in .device-commit) from a fresh build: the README's two commands
# with GPU tests required (device_ci.sh readme); then, on that build, bench/topk_compare.py at the large
# shape (top-k log-probs' fp32 logits pass now stores Z by bulk copies) and p2.py's step timelines.
set -u; mkdir -p $OUT/ci; s=$(date +%s)
rm -rf build
OUT=$OUT/ci DEVICE_CI_PARTS=readme timeout 480 bash bench/device_ci.sh > $OUT/ci/out.txt 2>&1; echo "readme rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ci/out.txt
grep -E "tests passed|tests failed|\*\*\*Failed|check failed" $OUT/ci/test.log | tail -8
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/test-cache
t1=$(date +%s)
timeout 60 python3 bench/topk_compare.py --shapes 8192x4096x128256 --out $OUT > $OUT/topk.log 2>&1; echo "topk rc=$? $(( $(date +%s) - t1 ))s"; grep "^|" $OUT/topk.log | tail -5
timeout 40 python3 .whl/p2.py > $OUT/p2.log 2>&1; echo "p2 rc=$?"; grep "==" $OUT/p2.log
cd $OUT && tar czf all.tgz ci && rm -rf ci; ls
