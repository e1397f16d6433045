# Session 29: the final runtime/templates tree (commit in .device-commit) from a fresh build: the
# README's two commands with GPU tests required (device_ci.sh readme), then test_distill_tp's log.
set -u; mkdir -p $OUT/ci; s=$(date +%s)
rm -rf build
OUT=$OUT/ci DEVICE_CI_PARTS=readme timeout 520 bash bench/device_ci.sh > $OUT/ci/out.txt 2>&1; echo "readme rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ci/out.txt
grep -E "tests passed|tests failed|\*\*\*Failed|check failed" $OUT/ci/test.log | tail -8
grep -E "test_distill_tp|test_distill_gpu|test_topk_gpu" $OUT/ci/test.log | tail -4
grep -E "top-k (bf16|fp32) rank|reverse KL|JSD" $OUT/ci/test.log | head -8
cd $OUT && tar czf all.tgz ci && rm -rf ci
