# Session 28 call 4: the merged tree (commit in .device-commit) from a fresh build: the README's two
# commands with GPU tests required (device_ci.sh readme), then python test_distill.py on the GPU.
set -u; mkdir -p $OUT/ci $OUT/py; s=$(date +%s)
rm -rf build
OUT=$OUT/ci DEVICE_CI_PARTS=readme timeout 450 bash bench/device_ci.sh > $OUT/ci/out.txt 2>&1; echo "readme rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ci/out.txt
grep -E "tests passed|tests failed|\*\*\*Failed|check failed" $OUT/ci/test.log | tail -8
export FLCE_LIBRARY=$PWD/build/libflce.so
(cd python && timeout 90 python3 test_distill.py > $OUT/py/test_distill.log 2>&1; echo "py distill rc=$? $(( $(date +%s)-s )) s"; grep -E "FAIL|passed" $OUT/py/test_distill.log | tail -5)
cd $OUT && tar czf all.tgz ci py && rm -rf ci py
