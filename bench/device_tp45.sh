#!/usr/bin/env bash
# device_tp45.sh — issue 45's device runs on a 2-GPU machine: build, the C TP tests (test_tp and its
# qrows/overlap variant), then, by STAGES, the Python TP suite (torchrun) and bench/tp_compare.py;
# also the session's other GPU checks: "binding" (python/test_binding.py on the GPU), "fuzz"
# (python/fuzz_binding.py, FUZZ_CASES cases in FUZZ_JOBS processes, JSON record, FUZZ_WARM seconds of a
# cache-filling pass first; "fuzz-bg" the same in
# the background while the next stages run), "san" (tests/sanitize.sh with
# SANITIZE_CASES / SANITIZE_TOOLS). Logs tarred into $OUT. STAGES: space-separated, default "ctest".
source "$(dirname "$0")/device_lib.sh"
device_begin out
STAGES=${STAGES:-ctest}
device_env "$OUT/env.txt" "stages: $STAGES" "commit (real): ${REAL_COMMIT:-unknown}"
t0=$(date +%s)
device_build "$OUT/build.log" || { echo "build failed"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
export FLCE_CACHE_DIR=$PWD/build/kcache
rc=0
for s in $STAGES; do
  case $s in
    ctest)
      ( cd build && timeout ${CTEST_TIMEOUT:-420} ctest -R "${CTEST_RE:-^test_tp$}" --output-on-failure -V ) > "$OUT/ctest.log" 2>&1 || rc=1
      grep -E "tp=2|FAIL|passed|failed|rank" "$OUT/ctest.log" | tail -60 ;;
    py)
      FLCE_LIBRARY=$PWD/build/libflce.so timeout ${PY_TIMEOUT:-300} torchrun --nproc_per_node=2 python/test_tp.py > "$OUT/py_tp.log" 2>&1 || rc=1
      tail -50 "$OUT/py_tp.log" ;;
    binding)
      ( cd python && FLCE_LIBRARY=$PWD/../build/libflce.so timeout ${BINDING_TIMEOUT:-300} python3 test_binding.py ) > "$OUT/binding.log" 2>&1 || rc=1
      tail -5 "$OUT/binding.log" ;;
    fuzz)
      # FUZZ_WARM=S: a first pass of the same cases for S seconds, no record, that fills the kernel
      # cache (a case's time on the GPU is mostly NVRTC: ~3.3 s per new shape per process), so the
      # recorded pass that follows fits the call's limit
      if [ -n "${FUZZ_WARM:-}" ]; then
        ( cd python && FLCE_LIBRARY=$PWD/../build/libflce.so timeout $((FUZZ_WARM + 30)) python3 fuzz_binding.py \
          --cases ${FUZZ_CASES:-1000} --seed ${FUZZ_SEED:-21} --jobs ${FUZZ_JOBS:-1} --deadline $FUZZ_WARM ) \
          > "$OUT/fuzz-warm.log" 2>&1
        tail -3 "$OUT/fuzz-warm.log"
      fi
      ( cd python && FLCE_LIBRARY=$PWD/../build/libflce.so timeout ${FUZZ_TIMEOUT:-300} python3 fuzz_binding.py --cases ${FUZZ_CASES:-1000} \
        --seed ${FUZZ_SEED:-21} --jobs ${FUZZ_JOBS:-1} ${REAL_COMMIT:+--commit "$REAL_COMMIT"} --json "$OUT/fuzz.json" ) > "$OUT/fuzz.log" 2>&1 || rc=1
      tail -5 "$OUT/fuzz.log" ;;
    fuzz-bg)  # the fuzzer in the background while the next stages run (waited for at the end)
      ( cd python && FLCE_LIBRARY=$PWD/../build/libflce.so timeout ${FUZZ_TIMEOUT:-300} python3 fuzz_binding.py --cases ${FUZZ_CASES:-1000} \
        --seed ${FUZZ_SEED:-21} --jobs ${FUZZ_JOBS:-1} ${REAL_COMMIT:+--commit "$REAL_COMMIT"} --log-dir "$OUT/fuzzlogs" --json "$OUT/fuzz.json" ) > "$OUT/fuzz.log" 2>&1 &
      fuzz_pid=$! ;;
    san)
      SANITIZE_LOG_DIR=$OUT/sanitize timeout ${SAN_TIMEOUT:-300} bash tests/sanitize.sh --log "$OUT/sanitize.log" build/flce build/tests/gpu_probe \
        > "$OUT/san.out" 2>&1 || rc=1
      tail -15 "$OUT/san.out" ;;
    bench)
      NCCL_NVLS_ENABLE=0 FLCE_LIBRARY=$PWD/build/libflce.so timeout ${BENCH_TIMEOUT:-400} torchrun --nproc_per_node=2 bench/tp_compare.py \
        --out "$OUT/bench" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1 || rc=1
      tail -40 "$OUT/bench.log"; cat "$OUT"/bench/*.md 2>/dev/null | tail -30 ;;
  esac
done
if [ -n "${fuzz_pid:-}" ]; then wait $fuzz_pid || rc=1; tail -5 "$OUT/fuzz.log"; fi
echo "total $(( $(date +%s) - t0 )) s, rc $rc"
tar czf "$OUT/logs.tgz" -C "$OUT" --exclude logs.tgz . 2>/dev/null
exit $rc
