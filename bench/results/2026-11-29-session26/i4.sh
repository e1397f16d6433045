# Session 26 call 4 (final): the tree in .device-commit: README commands with GPU tests required,
# then the top-k teacher bench and the distillation bench with Liger (installed by python3 -m pip).
set -u; mkdir -p $OUT/ci $OUT/b; s=$(date +%s)
rm -rf build
OUT=$OUT/ci DEVICE_CI_PARTS=readme timeout 420 bash bench/device_ci.sh > $OUT/ci/out.txt 2>&1; echo "readme rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ci/out.txt
grep -E "tests passed|tests failed|\*\*\*Failed|check failed" $OUT/ci/test.log | tail -8
export FLCE_LIBRARY=$PWD/build/libflce.so
timeout 50 python3 bench/distill_topk_compare.py --out $OUT/b > $OUT/b/topk.txt 2>&1; echo "topk rc=$? $(( $(date +%s)-s )) s"
grep -E "^\| " $OUT/b/topk.txt | tail -9
python3 -m pip install --no-deps .whl/liger_kernel-0.8.5-py3-none-any.whl > $OUT/b/pip.txt 2>&1; echo "pip rc=$?"; python3 -c "import liger_kernel; print('liger', liger_kernel.__file__)" 2>&1 | tail -1
timeout 75 python3 bench/distill_compare.py --out $OUT/b > $OUT/b/distill.txt 2>&1; echo "distill rc=$? $(( $(date +%s)-s )) s"
grep -E "^\| " $OUT/b/distill.txt | tail -18
cd $OUT && tar czf ci.tgz ci && rm -rf ci
