#!/usr/bin/env bash
# session 11 d17: the binding's eager fast path: python tests (ctest -C Extra -L python), host latency A/B against a9e53ef's binding
set -u
cd "$(dirname "$0")"
R=/tmp/d17; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
pack() { (cd /tmp && tar czf $OUT/d17.tgz d17); }
cat device-commit.txt > $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default >> $R/build.log 2>&1) || { tail -30 $R/build.log; pack; exit 1; }
L=$PWD/build/libflce.so
for rep in 1; do
  FLCE_LIBRARY=$L PYTHONPATH=$PWD/python timeout 60 python3 bench/host_latency.py > $R/host_new_$rep.log 2>&1; echo "new $rep: $(tail -2 $R/host_new_$rep.log | tr '\n' ' ')"
  FLCE_LIBRARY=$L PYTHONPATH=$PWD/abtree/python timeout 60 python3 bench/host_latency.py > $R/host_old_$rep.log 2>&1; echo "old $rep: $(tail -2 $R/host_old_$rep.log | tr '\n' ' ')"
done
pack
(cd build && timeout 420 ctest -C Extra -L python --output-on-failure > $R/python_tests.log 2>&1); echo "python tests rc=$?"; grep -E "Test #|tests passed|passed, " $R/python_tests.log | tail -8
pack
