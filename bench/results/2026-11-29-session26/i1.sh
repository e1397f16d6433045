# Session 26's first device call (written in session 25): branch s25-circle's tree (carry .whl,
# .device-commit; run from a checkout of s25-circle): the README's two commands with GPU tests
# required, python/test_distill.py on the GPU, then the distillation bench with Liger installed.
set -u; mkdir -p $OUT/ci $OUT/py $OUT/b; s=$(date +%s)
rm -rf build
OUT=$OUT/ci DEVICE_CI_PARTS=readme timeout 430 bash bench/device_ci.sh > $OUT/ci/out.txt 2>&1; echo "readme rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ci/out.txt
grep -E "tests passed|tests failed|\*\*\*Failed" $OUT/ci/test.log | tail -5
(cd python && FLCE_LIBRARY=$PWD/../build/libflce.so timeout 150 python3 test_distill.py > $OUT/py/test_distill.log 2>&1; echo "test_distill rc=$? $(( $(date +%s)-s )) s"; grep -E "FAIL|passed" $OUT/py/test_distill.log | tail -12)
cd $OUT && tar czf all.tgz ci py && rm -rf ci py
# (bench in a second call: pip install --no-deps .whl/liger_kernel-0.8.5-py3-none-any.whl, then
#  python3 bench/distill_compare.py --providers cublas-floor,flce,torch-compile,torch-eager,torch-chunked,liger-jsd)
