# Session 26 call 2: branch s25-circle (432d14c): distillation bench with Liger installed, top-k bench.
set -u; mkdir -p $OUT/b; s=$(date +%s)
[ -f build/libflce.so ] || { cmake --preset default > $OUT/b/build.txt 2>&1 && cmake --build build -j16 >> $OUT/b/build.txt 2>&1; }
echo "build $(( $(date +%s)-s )) s"
pip install --no-deps .whl/liger_kernel-0.8.5-py3-none-any.whl > $OUT/b/pip.txt 2>&1; echo "pip rc=$?"
export FLCE_LIBRARY=$PWD/build/libflce.so
timeout 260 python3 bench/distill_compare.py --out $OUT/b > $OUT/b/distill.txt 2>&1; echo "distill rc=$? $(( $(date +%s)-s )) s"
tail -30 $OUT/b/distill.txt
timeout 200 python3 bench/distill_topk_compare.py --out $OUT/b > $OUT/b/topk.txt 2>&1; echo "topk rc=$? $(( $(date +%s)-s )) s"
tail -30 $OUT/b/topk.txt
