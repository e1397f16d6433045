#!/usr/bin/env bash
# device_ci.sh — the README's two commands, verbatim, on a fresh GPU machine, with
# FLCE_REQUIRE_GPU=1 so that a GPU test which cannot find a working GPU fails instead of skipping
# (tests/gpu_ready.h): what CI cannot check without a GPU. Every log goes to $OUT (default
# ./device-ci-out), with env.txt saying device, date and commit; a summary ends the output, and
# the exit status is nonzero when any step failed. Usage, from anywhere: bash bench/device_ci.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-ci-out}
mkdir -p "$OUT"
export FLCE_REQUIRE_GPU=1

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # A device's copy of the tree may have no .git: bench/stamp-commit.sh writes .device-commit.
  echo "commit: $(git describe --always --dirty 2>/dev/null || cat .device-commit 2>/dev/null || echo unknown)"
  echo "device:"
  nvidia-smi -L 2>&1 | sed 's/^/  /'
  echo "FLCE_REQUIRE_GPU=$FLCE_REQUIRE_GPU"
} | tee "$OUT/env.txt"

failed=0
summary=""
# step NAME LOG COMMAND [MUST_SAY]: runs COMMAND in bash, its output shown and kept in $OUT/LOG;
# it fails on a nonzero status, or when its output lacks the line MUST_SAY.
step() {
  local name=$1 log=$OUT/$2 cmd=$3 must=${4:-} t0 rc verdict=ok
  echo "== $name: $cmd"
  t0=$(date +%s)
  bash -c "$cmd" 2>&1 | tee "$log"
  rc=$?
  [ "$rc" -eq 0 ] || verdict="FAIL (exit $rc)"
  [ "$rc" -ne 0 ] || [ -z "$must" ] || grep -qx "$must" "$log" || verdict="FAIL (no '$must')"
  [ "$verdict" = ok ] || failed=1
  summary+="$(printf '%-6s %4ss  %s: %s' "$name" "$(( $(date +%s) - t0 ))" "$2" "$verdict")"$'\n'
}

# flce demo exits 0 without a GPU ("no GPU found", kernels compiled only): here it must run them.
step demo demo.log 'cmake --preset default && cmake --build --preset default && ./build/flce demo' \
  'flce demo: all checks passed'
step tests test.log 'cmake --workflow --preset test'

echo
echo "== summary ($OUT)"
printf '%s' "$summary"
# CTest's verdict, then the tests it names as failed or not run (skips would be listed there).
grep -E 'tests passed|Total Test time' "$OUT/test.log" | sed 's/^/  /'
sed -n '/^The following tests/,/^Errors while running/p' "$OUT/test.log" | sed 's/^/  /'
[ "$failed" -eq 0 ] && echo "device CI: passed" || echo "device CI: FAILED"
exit "$failed"
