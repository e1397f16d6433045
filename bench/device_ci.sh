#!/usr/bin/env bash
# device_ci.sh — the README's two commands, verbatim, on a fresh GPU machine, with
# FLCE_REQUIRE_GPU=1 so that a GPU test which cannot find a working GPU fails instead of skipping
# (tests/gpu_ready.h): what CI cannot check without a GPU. Then the GPU extras: the tests too long
# for the README's run (CTest runs them only for the configuration Extra: test_large, test_soak,
# and sanitize: compute-sanitizer's four tools over every kernel path, strategy and awkward shape,
# tests/sanitize.sh, its per-run logs and summary.txt in $OUT/sanitize). Every log goes to $OUT (default
# ./device-ci-out), with env.txt saying device, date and commit; a summary with each step's time and
# verdict ends the output.
#
# The exit status is the README part's alone (nonzero when the demo or the tests failed); the
# extras say their own verdicts in the summary and on a last line, and change it only under
# DEVICE_CI_STRICT=1. DEVICE_CI_PARTS picks what runs (default "readme extras"): "readme" is the
# README part only; "extras" builds (cmake --preset default, as the README does) and runs the
# extras only, for a second device call when both do not fit in one. The sanitize test's own
# settings pass through (tests/sanitize.sh): SANITIZE_TOOLS and SANITIZE_CASES split it over device
# calls, SANITIZE_JOBS, SANITIZE_TIMEOUT.
# Usage, from anywhere: bash bench/device_ci.sh
set -uo pipefail
. "$(dirname "$0")/device_lib.sh"
device_begin device-ci-out
PARTS=${DEVICE_CI_PARTS:-readme extras}
export FLCE_REQUIRE_GPU=1
export SANITIZE_LOG_DIR=${SANITIZE_LOG_DIR:-$(cd "$OUT" && pwd)/sanitize} # CTest runs it in build/tests
device_env "$OUT/env.txt" "FLCE_REQUIRE_GPU=$FLCE_REQUIRE_GPU" "parts: $PARTS"

failed=0
extras_failed=0
summary=""
# run_step NAME LOG COMMAND [MUST_SAY]: runs COMMAND in bash, its output shown and kept in
# $OUT/LOG; sets $verdict: a failure on a nonzero status (124: the step's own timeout), or when the
# output lacks the line MUST_SAY. Adds the step's summary line.
run_step() {
  local name=$1 log=$OUT/$2 cmd=$3 must=${4:-} t0 rc
  verdict=ok
  echo "== $name: $cmd"
  t0=$(date +%s)
  bash -c "$cmd" 2>&1 | tee "$log"
  rc=$?
  [ "$rc" -eq 0 ] || verdict="FAIL (exit $rc)"
  [ "$rc" -ne 124 ] || verdict="FAIL (timed out)"
  [ "$rc" -ne 0 ] || [ -z "$must" ] || grep -qx "$must" "$log" || verdict="FAIL (no '$must')"
  summary+="$(printf '%-28s %4ss  %s: %s' "$name" "$(( $(date +%s) - t0 ))" "$2" "$verdict")"$'\n'
}
# step: a step of the README part, whose failure is the script's.
step() {
  run_step "$@"
  [ "$verdict" = ok ] || failed=1
}
# extra: a step of the extras, whose failure is reported but (without DEVICE_CI_STRICT=1) not the
# script's exit status.
extra() {
  run_step "$@"
  [ "$verdict" = ok ] || extras_failed=1
}
has_part() { [[ " $PARTS " == *" $1 "* ]]; }

if has_part readme; then
  # flce demo exits 0 without a GPU ("no GPU found", kernels compiled only): here it must run them.
  step demo demo.log 'cmake --preset default && cmake --build --preset default && ./build/flce demo' \
    'flce demo: all checks passed'
  step tests test.log 'cmake --workflow --preset test'
else
  step build build.log 'cmake --preset default && cmake --build --preset default'
fi

if has_part extras; then
  # The long GPU tests: registered for the configuration Extra only (tests/CMakeLists.txt).
  extra test_large large.log 'ctest --test-dir build -C Extra -L large --output-on-failure'
  extra test_soak soak.log 'ctest --test-dir build -C Extra -L soak --output-on-failure'
  # compute-sanitizer over every variant: the CTest sanitize (a failure, not a skip, without
  # compute-sanitizer under FLCE_REQUIRE_GPU=1); one line per run in $SANITIZE_LOG_DIR/summary.txt,
  # and in sanitize.log with the failures when it fails.
  extra sanitize sanitize.log 'ctest --test-dir build -C Extra -L sanitize --output-on-failure --no-tests=error'
fi

echo
echo "== summary ($OUT)"
printf '%s' "$summary"
if has_part readme; then
  # CTest's verdict, then the tests it names as failed or not run (skips would be listed there).
  grep -E 'tests passed|Total Test time' "$OUT/test.log" | sed 's/^/  /'
  sed -n '/^The following tests/,/^Errors while running/p' "$OUT/test.log" | sed 's/^/  /'
  [ "$failed" -eq 0 ] && echo "device CI: passed" || echo "device CI: FAILED"
else
  [ "$failed" -eq 0 ] && echo "device CI: build passed (README part not run)" || echo "device CI: build FAILED"
fi
if has_part extras; then
  [ "$extras_failed" -eq 0 ] && echo "device CI extras: passed" || echo "device CI extras: FAILED"
  [ "${DEVICE_CI_STRICT:-0}" = 1 ] && [ "$extras_failed" -ne 0 ] && failed=1
fi
exit "$failed"
