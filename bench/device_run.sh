#!/usr/bin/env bash
# device_run.sh — everything one device call does: build, every test (cpu and gpu), `flce demo`,
# logs under $OUT (default ./device-out). Usage: bash bench/device_run.sh [extra demo args]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export FLCE_CACHE_DIR=${FLCE_CACHE_DIR:-/tmp/flce-cache}
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
  nvcc --version | tail -1; cmake --version | head -1; gcc --version | head -1
} | tee "$OUT/env.txt"
step() { echo "== $1"; }
step build
(cmake --preset default && cmake --build --preset default) > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
step tests
(cd build && ctest --output-on-failure -j4 --timeout 900) 2>&1 | tee "$OUT/ctest.log" | grep -vE '^\s+(made|hit) ' | tail -60
step demo
./build/flce demo "$@" 2>&1 | tee "$OUT/demo.log"
