# Session 27 call 5: branch s27-dot (commit in .device-commit): top-k log-probs new vs main c4b5deb (tarball
# built in /tmp/m), bench/topk_compare.py, then the README commands with GPU tests required.
set -u; mkdir -p $OUT/ci $OUT/b; s=$(date +%s)
rm -rf build; (cmake --preset default > /dev/null 2>&1 && cmake --build build -j16 --target flce > /dev/null 2>&1); echo "build rc=$?"
mkdir -p /tmp/m && tar xJf .whl/main.tar.xz -C /tmp/m && (cd /tmp/m && cmake --preset default > /dev/null 2>&1 && cmake --build build -j16 --target flce > /tmp/mb.log 2>&1); echo "main build rc=$? $(( $(date +%s)-s )) s"
for S in 8192x4096x128256 4096x2048x32000; do
FLCE_LIBRARY=$PWD/build/libflce.so PYTHONPATH=$PWD/python timeout 60 python3 .whl/prof6.py $S new 2>&1 | grep -v "Warn\|warn"
FLCE_LIBRARY=/tmp/m/build/libflce.so PYTHONPATH=/tmp/m/python timeout 60 python3 .whl/prof6.py $S old 2>&1 | grep -v "Warn\|warn"
done
FLCE_LIBRARY=$PWD/build/libflce.so timeout 80 python3 bench/topk_compare.py --out $OUT/b > $OUT/b/topk.txt 2>&1; echo "topk bench rc=$? $(( $(date +%s)-s )) s"
grep -E "^\| " $OUT/b/topk.txt | tail -9
rm -rf build
OUT=$OUT/ci DEVICE_CI_PARTS=readme timeout 390 bash bench/device_ci.sh > $OUT/ci/out.txt 2>&1; echo "readme rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/ci/out.txt
grep -E "tests passed|tests failed|\*\*\*Failed|check failed|largest log-prob" $OUT/ci/test.log | tail -12
cd $OUT && tar czf ci.tgz ci && rm -rf ci
