# Session 27 call 1: branch s26-sparse rebased on main (commit in .device-commit): README commands with
# GPU tests required, python top-k cases on the GPU, the top-k bench (merge only if faster than 40.19 ms).
set -u; mkdir -p $OUT/ci $OUT/py $OUT/b; s=$(date +%s)
rm -rf build
OUT=$OUT/ci DEVICE_CI_PARTS=readme timeout 420 bash bench/device_ci.sh > $OUT/ci/out.txt 2>&1; echo "readme rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ci/out.txt
grep -E "tests passed|tests failed|\*\*\*Failed|check failed" $OUT/ci/test.log | tail -8
export FLCE_LIBRARY=$PWD/build/libflce.so
(cd python && timeout 60 python3 test_distill.py -k topk > $OUT/py/test_distill_topk.log 2>&1; echo "py topk rc=$? $(( $(date +%s)-s )) s"; grep -E "FAIL|passed" $OUT/py/test_distill_topk.log | tail -8)
timeout 100 python3 bench/distill_topk_compare.py --out $OUT/b > $OUT/b/topk.txt 2>&1; echo "topk rc=$? $(( $(date +%s)-s )) s"
grep -E "^\| " $OUT/b/topk.txt | tail -9
cd $OUT && tar czf all.tgz ci py && rm -rf ci py
