#!/usr/bin/env bash
# device_ab.sh — one device call comparing this tree with an older one side by side: builds both
# (the older one's source in prev/, carried beside this tree), runs both GPU suites and the hazard
# filters on this tree, then the demo and a compare of both libraries in one session.
# Usage: bash bench/device_ab.sh [shape]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export FLCE_CACHE_DIR=${FLCE_CACHE_DIR:-/tmp/flce-cache}
LOG=$OUT/ab.log
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(cat .device-commit 2>/dev/null || echo unknown); prev: $(cat prev/.device-commit 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
} | tee "$OUT/env.txt"
step() { echo "== $1 ($(date +%T))" | tee -a "$LOG"; }
step build
(cmake --preset default && cmake --build --preset default -j16) > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
(cd prev && cmake --preset default && cmake --build --preset default -j16) >> "$OUT/build.log" 2>&1 || echo "prev build failed" | tee -a "$LOG"
step "smoke: demo"
timeout 120 ./build/flce demo 2>&1 | tee -a "$LOG" | tail -3 || { echo "smoke failed"; exit 1; }
step "gpu suites"
(cd build && timeout 330 ctest --output-on-failure --timeout 320 -L gpu -V -j2) > "$OUT/ctest-gpu.log" 2>&1
grep -E '^[0-9]+: (FAIL|[0-9]+ passed)|tests passed|Failed|Passed|Timeout' "$OUT/ctest-gpu.log" | tail -12 | tee -a "$LOG"
step "hazard filters (the suites ran them once already)"
for i in 1; do for f in recipe accumulate; do
  FLCE_TEST_FILTER=$f timeout 60 ./build/tests/test_gpu 2>&1 | grep -E 'FAIL|passed' | tail -3 | sed "s/^/$f#$i /" | tee -a "$LOG"
done; done
step "demo: this tree vs prev, twice"
for i in 1 2; do
  ./build/flce demo 2>&1 | grep median | sed 's/^/new  /' | tee -a "$LOG"
  ./prev/build/flce demo 2>&1 | grep median | sed 's/^/prev /' | tee -a "$LOG"
done
step compare
export PYTHONUNBUFFERED=1
SH=${1:-8192x4096x128256}
FLCE_LIBRARY=$PWD/build/libflce.so python3 bench/compare.py --shapes "$SH" --providers cublas-floor,cublas-logits,flce-chunked,flce-forward \
  --iters 5 --warmup 2 --out-dir "$OUT" --tag new 2>&1 | grep -E '^\|' | tee -a "$LOG"
FLCE_LIBRARY=$PWD/prev/build/libflce.so python3 bench/compare.py --shapes "$SH" --providers flce-chunked,flce-forward \
  --iters 5 --warmup 2 --out-dir "$OUT" --tag prev 2>&1 | grep -E '^\|' | tee -a "$LOG"
step done
