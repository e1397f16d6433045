set -u; cd "$(dirname "$0")/.."; mkdir -p $OUT
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/test-cache
timeout 200 python3 .whl/p3.py 2>&1 | grep -v -i warn | tee $OUT/p3.log
