#!/usr/bin/env bash
# session 13 d3: v40b (logits epilogue against the reference) A/B against 5c0ff53 (abtree/), qrows tests, qrows fuzz
set -u
cd "$(dirname "$0")"
R=/tmp/d3; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d3
pack() { (cd /tmp && tar czf $OUT/d3.tgz d3); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
(cd abtree && cmake --preset default > $R/build-ab.log 2>&1 && cmake --build --preset default -j16 >> $R/build-ab.log 2>&1) || { tail -30 $R/build-ab.log; exit 1; }
(cd build && FLCE_REQUIRE_GPU=1 timeout 200 ctest -R "^test_gpu_qrows" --output-on-failure > $R/ctest_q.log 2>&1); echo "ctest qrows rc=$?"; grep -E "Test +#|FAIL|check failed|tests passed" $R/ctest_q.log | head -20
for i in 1 2; do for t in new old; do for s in 8192x4096x128256 8192x2304x256000; do
  B=./build/flce; [ $t = old ] && B=./abtree/build/flce
  timeout 90 $B bench --logit-std 4 --iters 20 --timeline --strategies auto --shapes $s > $R/$s-$t-$i.log 2>&1
  echo "$s [$t] run $i: $(grep -E '^\| 4 \| auto' $R/$s-$t-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|qref|qscale|qlist|qdw|qdh)' $R/$s-$t-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
t0=$(date +%s); FLCE_QROWS=1 FLCE_CACHE_DIR=/tmp/fc-q timeout 150 ./build/flce fuzz --seed 20261127 --cases 400 --jobs 16 --time-limit 135 > $R/fuzz_q.log 2>&1; echo "fuzz qrows 400 rc=$? in $(( $(date +%s) - t0 )) s"; tail -4 $R/fuzz_q.log
