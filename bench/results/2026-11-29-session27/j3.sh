set -u; s=$(date +%s)
[ -f build/libflce.so ] || (cmake --preset default >/dev/null && cmake --build build -j16 --target flce > /dev/null 2>&1)
FLCE_LIBRARY=$PWD/build/libflce.so PYTHONPATH=$PWD/python timeout 120 python3 .whl/prof5.py 8192x4096x128256 2>&1 | grep -v "Warn\|warn" > $OUT/p5.txt; echo "rc=$? $(( $(date +%s)-s )) s"
head -c 11000 $OUT/p5.txt
