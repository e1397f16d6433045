# Session 28 call 5: compute-sanitizer memcheck over test_distill_tp (the TP kernels: pack, merge, out,
# the top-k merge through the comm route), and python/test_distill.py on the GPU (the op's new tp argument).
set -u; mkdir -p $OUT; s=$(date +%s)
(cmake --preset default && cmake --build --preset default -j16) > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s)-s )) s"
export FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=$PWD/build/test-cache FLCE_LIBRARY=$PWD/build/libflce.so
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/test_distill_tp > $OUT/memcheck_distill_tp.log 2>&1; echo "memcheck rc=$? $(( $(date +%s)-s )) s"; tail -4 $OUT/memcheck_distill_tp.log
(cd python && timeout 200 python3 test_distill.py > $OUT/py_test_distill.log 2>&1; echo "py distill rc=$? $(( $(date +%s)-s )) s"; tail -3 $OUT/py_test_distill.log)
rm -f $OUT/build.log
