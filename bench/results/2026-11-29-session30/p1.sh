set -u; cd "$(dirname "$0")/.."; mkdir -p $OUT
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/test-cache
timeout 300 python3 .whl/p1.py 2>&1 | tee $OUT/p1.log
