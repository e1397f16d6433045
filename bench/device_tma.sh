#!/usr/bin/env bash
# device_tma.sh — one device call for the TMA wgmma path (issue 4): build, a smoke run, both GPU
# suites, the hazard filters repeated, SASS of the carried cubins, demo TMA vs cp.async, and a
# quick compare. Logs under $OUT. Usage: bash bench/device_tma.sh [compare shapes]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export FLCE_CACHE_DIR=${FLCE_CACHE_DIR:-/tmp/flce-cache}
LOG=$OUT/tma.log
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(cat .device-commit 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
} | tee "$OUT/env.txt"
step() { echo "== $1 ($(date +%T))" | tee -a "$LOG"; }
step build
(cmake --preset default && cmake --build --preset default -j16) > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
step "smoke: demo, TMA path"
timeout 120 ./build/flce demo 2>&1 | tee -a "$LOG" | tail -4 || { echo "smoke failed"; exit 1; }
step "gpu suites"
(cd build && timeout 330 ctest --output-on-failure --timeout 320 -L gpu -V -j2) > "$OUT/ctest-gpu.log" 2>&1
grep -E '^[0-9]+: (FAIL|[0-9]+ passed)|tests passed|Failed|Passed|Timeout' "$OUT/ctest-gpu.log" | tail -12 | tee -a "$LOG"
step "hazard filters x2"
for i in 1 2; do for f in recipe accumulate; do
  FLCE_TEST_FILTER=$f timeout 60 ./build/tests/test_gpu 2>&1 | grep -E 'FAIL|passed' | tail -3 | sed "s/^/$f#$i /" | tee -a "$LOG"
done; done
step sass
for c in bench/cubins/*.cubin; do
  [ -f "$c" ] || continue
  n=$(cuobjdump -sass "$c" | grep -c HGMMA); l=$(cuobjdump -sass "$c" | grep -cE '\b(LDL|STL)\b')
  echo "$(basename $c): HGMMA $n, LDL/STL $l" | tee -a "$LOG"
done
step "demo: TMA vs cp.async wgmma"
./build/flce demo 2>&1 | grep median | sed 's/^/tma     /' | tee -a "$LOG"
FLCE_TMA=0 ./build/flce demo 2>&1 | grep median | sed 's/^/cpasync /' | tee -a "$LOG"
step compare
export PYTHONUNBUFFERED=1 FLCE_LIBRARY=$PWD/build/libflce.so
SH=${1:-8192x4096x128256}
python3 bench/compare.py --shapes "$SH" --providers cublas-floor,cublas-logits,flce-chunked,flce-forward \
  --iters 5 --warmup 2 --out-dir "$OUT" --tag tma 2>&1 | tail -25 | tee -a "$LOG"
FLCE_TMA=0 python3 bench/compare.py --shapes "$SH" --providers flce-chunked,flce-forward \
  --iters 5 --warmup 2 --out-dir "$OUT" --tag cpasync 2>&1 | tail -12 | tee -a "$LOG"
step done
